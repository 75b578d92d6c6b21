"""One pydantic model per claim kind (the ``Claim`` union and ``ClaimsFile`` are in claimsfile.py, built from the
registry of kinds, circuitstat.pipelines.claims.kinds).

Every model is strict (no unknown keys) and frozen. Each names the run table(s) its kind is answered from once, as
``TABLES``; the statistics it accepts are the columns core/schema.py marks claimable in them
(:func:`claimable_in`). Class names end in ``Claim`` so none shares a name with an estimator
(``HeadStabilityClaim`` is a claim about circuitstat.pipelines.runs.heads.stability.HeadStability's tables).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import AfterValidator, Field, field_validator, model_validator

from circuitstat.core.schema import claimable

from ..spec import METHOD, StrictSpec  # the one spec base: strict, frozen, no unknown keys

__all__ = ["ClaimBase", "BoundedClaim", "EdgeInCircuitClaim", "CircuitStabilityClaim", "FaithfulnessClaim",
           "EdgeEffectClaim", "HeadStabilityClaim", "LayerStabilityClaim", "ApproximationClaim", "VerifiedEdgeClaim",
           "MissedEdgesClaim", "PublishedCircuitClaim", "SinkClaim", "CircuitEquivalentClaim",
           "CircuitEquivalentTostClaim", "CircuitIndependentClaim", "CircuitMinimalClaim", "CircuitSufficientClaim", "CircuitPartiallyNecessaryClaim",
           "TokenImportanceClaim", "TokenDropClaim", "SinkStabilityClaim", "TokenStabilityClaim", "EdgeName", "claimable_in",
           "model_label", "normalise_edge"]

APPROX_METHOD = Literal[tuple(m for m in get_args(METHOD) if m != "exact")]
#: circuits: a method's own, or those selected from an approximation's verified estimates ("eap+verified")
CIRCUIT_METHOD = Literal[get_args(METHOD) + tuple(f"{m}+verified" for m in get_args(APPROX_METHOD))]


def _verified_method(v: str) -> str:
    """The name of a verified method: an approximate method, or several joined by "+" (verify.combine's rows,
    circuitstat.pipelines.verify.combined_method); ValueError naming both forms otherwise."""
    approx = get_args(APPROX_METHOD)
    parts = v.split("+")
    if v in approx or (len(parts) >= 2 and len(set(parts)) == len(parts) and all(p in approx for p in parts)):
        return v
    raise ValueError(f"method {v!r} is neither an approximate method ({', '.join(approx)}) nor a verify.combine of "
                     "several joined by '+' (e.g. eap+atp-qkfix)")


#: a verified_edge claim's method: an approximation verified on its own, or several together (verify.combine)
VERIFIED_METHOD = Annotated[str, AfterValidator(_verified_method)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Unit = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


def claimable_in(tables: tuple[str, ...]) -> tuple[str, ...]:
    """Return the claimable columns of ``tables`` (core/schema.py), in schema order, each once."""
    return tuple(dict.fromkeys(c for t in tables for c in claimable(t)))


class ClaimBase(StrictSpec):
    """What every claim has: an optional name and description, its kind, and the run table(s) of that kind."""

    name: str | None = Field(None, min_length=1, max_length=200)
    description: str | None = None

    #: the run tables a claim of this kind is answered from, declared once per kind here; its ``statistic`` (when it
    #: has one) is a claimable column of one of them (core/schema.py)
    TABLES: ClassVar[tuple[str, ...]]

    @property
    def tables(self) -> tuple[str, ...]:
        """Return the run tables this claim is answered from (its kind's ``TABLES``)."""
        return self.TABLES

    @property
    def table(self) -> str:
        """Return the run table this claim is answered from (the first of ``tables``)."""
        return self.TABLES[0]

    def label(self, index: int) -> str:
        return self.name or f"#{index + 1} {self.kind} {self._auto_label()}".strip()

    def _auto_label(self) -> str:  # pragma: no cover - overridden
        return ""


class BoundedClaim(ClaimBase):
    """A claim on one number: ``min`` and/or ``max``, both inclusive."""

    min: Finite | None = None
    max: Finite | None = None

    @model_validator(mode="after")
    def _bounds(self):
        if self.min is None and self.max is None:
            raise ValueError("give a bound: 'min' and/or 'max'")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"'min' ({self.min}) is greater than 'max' ({self.max})")
        return self


def normalise_edge(v: str) -> str:
    """Return an edge name without spaces, with "→" written "->" (claims may spell edges either way)."""
    return re.sub(r"\s+", "", v.replace("→", "->"))


#: an edge as a claim names it: not empty, normalised by normalise_edge (spaces dropped, "→" read as "->")
EdgeName = Annotated[str, Field(min_length=1), AfterValidator(normalise_edge)]


class EdgeInCircuitClaim(ClaimBase):
    """The edge is in the top-k circuit with inclusion frequency >= min_inclusion."""

    kind: Literal["edge_in_circuit"]
    TABLES: ClassVar[tuple[str, ...]] = ("inclusion",)
    edge: EdgeName
    method: CIRCUIT_METHOD
    k: int = Field(ge=1)
    min_inclusion: Unit

    def _auto_label(self) -> str:
        return f"{self.edge} {self.method} k={self.k}"


class CircuitStabilityClaim(BoundedClaim):
    """A stability statistic of the top-k circuit under resampling."""

    kind: Literal["circuit_stability"]
    TABLES: ClassVar[tuple[str, ...]] = ("stability_vs_k",)
    method: CIRCUIT_METHOD
    k: int = Field(ge=1)
    # *_ci_low of the Monte Carlo spread over resamples are not claimable: a claim about stability is about
    # data, so bounds come from the data-level intervals (expected Jaccard / Phi of two size-N datasets).
    statistic: Literal[claimable_in(TABLES)]

    def _auto_label(self) -> str:
        return f"{self.statistic} {self.method} k={self.k}"


class FaithfulnessClaim(BoundedClaim):
    """Faithfulness of the top-k circuit (f_*), or the area-under-curve scores cpr/cmd."""

    kind: Literal["faithfulness"]
    TABLES: ClassVar[tuple[str, ...]] = ("faithfulness_vs_k",)
    method: CIRCUIT_METHOD
    k: int | None = Field(None, ge=1)
    # f_ci_*: this fixed circuit (selection not included); f_selected*: the circuit selected from N prompts
    statistic: Literal[claimable_in(TABLES)]

    @model_validator(mode="after")
    def _needs_k(self):
        if self.statistic.startswith("f_") and self.k is None:
            raise ValueError(f"statistic {self.statistic!r} is per circuit size: give 'k'")
        if not self.statistic.startswith("f_") and self.k is not None:
            raise ValueError(f"statistic {self.statistic!r} integrates over every k; remove 'k'")
        return self

    def _auto_label(self) -> str:
        return f"{self.statistic} {self.method}" + (f" k={self.k}" if self.k is not None else "")


class EdgeEffectClaim(ClaimBase):
    """The edge's effect has the given sign and is significant after BH (q <= max_q): its mean effect, or with
    ``estimand: median`` / ``trimmed_mean`` the robust effect on a typical prompt (edge_stats' median* /
    trimmed_mean* columns: its own interval and the BH q-value of the p-value that inverts it)."""

    kind: Literal["edge_effect"]
    TABLES: ClassVar[tuple[str, ...]] = ("edge_stats",)
    edge: EdgeName
    method: METHOD
    sign: Literal["positive", "negative", "nonzero"]
    max_q: float = Field(gt=0.0, le=1.0, allow_inf_nan=False)
    estimand: Literal["mean", "median", "trimmed_mean"] = "mean"
    # an effect size (issue 47: sign and q alone passed on random weights): |effect| >= min_abs, read on the
    # interval's inner end (the end nearer 0, by default) or on the estimate
    min_abs: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    min_abs_of: Literal["interval", "estimate"] = "interval"

    def _auto_label(self) -> str:
        return f"{self.edge} {self.method} {self.sign}" + ("" if self.estimand == "mean" else f" {self.estimand}")


_HEAD_RE = re.compile(r"^\s*(?:a?(\d+)\s*\.\s*h?(\d+))\s*$")


class _HeadRef(BoundedClaim):
    """A claim about one attention head: ``head: a1.h5`` (the graph's node name, printed everywhere), or
    ``head: "1.5"`` (accepted too), or ``layer`` and ``head``."""

    layer: int | None = Field(None, ge=0)
    head: int | str

    @field_validator("head", mode="before")
    @classmethod
    def _no_float_head(cls, v: Any) -> Any:
        if isinstance(v, float):
            raise ValueError(
                f"head {v!r} is a number; write layer 1 head 5 as head: a1.h5, as head: \"1.5\" (quoted) or as "
                "layer: 1 and head: 5"
            )
        if isinstance(v, bool):
            raise ValueError("head must be an integer or a head name such as a1.h5 (or \"1.5\")")
        return v

    @model_validator(mode="after")
    def _resolve_head(self):
        if isinstance(self.head, str):
            m = _HEAD_RE.match(self.head)
            if not m:
                raise ValueError(f"head {self.head!r} is not a head name such as a1.h5 (or \"1.5\")")
            layer, head = int(m.group(1)), int(m.group(2))
            if self.layer is not None and self.layer != layer:
                raise ValueError(f"head {self.head!r} is in layer {layer} but 'layer' is {self.layer}")
            object.__setattr__(self, "layer", layer)
            object.__setattr__(self, "head", head)
        else:
            if self.head < 0:
                raise ValueError("head must be >= 0")
            if self.layer is None:
                raise ValueError(f"give 'layer' with head {self.head}, or write head: aLAYER.h{self.head}")
        return self


class HeadStabilityClaim(_HeadRef):
    """Stability of one attention head across independently trained seeds."""

    kind: Literal["head_stability"]
    TABLES: ClassVar[tuple[str, ...]] = ("heads",)
    # excess*: stability above its shuffled-prompt null; refit_*: every refit an anchor (seed-level interval)
    statistic: Literal[claimable_in(TABLES)]
    match: Literal["max", "hungarian"] | None = None
    pairs: Literal["anchor", "all"] | None = None

    def _auto_label(self) -> str:
        return f"a{self.layer}.h{self.head} {self.statistic}"


class LayerStabilityClaim(BoundedClaim):
    """Mean stability of a layer's heads across seeds."""

    kind: Literal["layer_stability"]
    TABLES: ClassVar[tuple[str, ...]] = ("layers",)
    layer: int = Field(ge=0)
    statistic: Literal[claimable_in(TABLES)]

    def _auto_label(self) -> str:
        return f"layer {self.layer} {self.statistic}"


class ApproximationClaim(BoundedClaim):
    """Agreement of an approximate method's scores with exact activation patching."""

    kind: Literal["approximation"]
    TABLES: ClassVar[tuple[str, ...]] = ("approximation_summary",)
    method: APPROX_METHOD
    statistic: Literal[claimable_in(TABLES)]
    k: int | None = Field(None, ge=1)

    def _auto_label(self) -> str:
        return f"{self.method} {self.statistic}" + (f" k={self.k}" if self.k is not None else "")


class VerifiedEdgeClaim(BoundedClaim):
    """A bound on an edge's verified statistic: its mean exact effect (estimate, ci_low, ci_high) or its q-value,
    from a verified run of ``method`` (spec key ``verify``; "eap+atp-qkfix": the rows of verify.combine)."""

    kind: Literal["verified_edge"]
    TABLES: ClassVar[tuple[str, ...]] = ("verified",)
    edge: EdgeName
    method: VERIFIED_METHOD
    statistic: Literal[claimable_in(TABLES)]

    def _auto_label(self) -> str:
        return f"{self.edge} {self.method} {self.statistic}"


class MissedEdgesClaim(BoundedClaim):
    """A bound on the missed-edges count of a verified run of ``method`` with an edge subset: by default the upper
    end of its one-sided bound (missed_high), e.g. ``max: 5``."""

    kind: Literal["missed_edges"]
    TABLES: ClassVar[tuple[str, ...]] = ("missed_edges",)
    method: APPROX_METHOD
    statistic: Literal[claimable_in(TABLES)] = "missed_high"

    def _auto_label(self) -> str:
        return f"{self.method} {self.statistic}"


class PublishedCircuitClaim(BoundedClaim):
    """A bound on a statistic of the published circuit the audit checked (spec key ``circuit``): its
    faithfulness (f_ratio, f_ci_low, ...), CPR/CMD, edges unsupported at q, inclusion or overlap with the
    run's top-k circuit, for ``method``'s scores (faithfulness and CPR/CMD do not depend on the method)."""

    kind: Literal["published_circuit"]
    TABLES: ClassVar[tuple[str, ...]] = ("published_circuit",)
    method: METHOD
    statistic: Literal[claimable_in(TABLES)]

    def _auto_label(self) -> str:
        return f"published circuit {self.statistic} ({self.method})"


class _CircuitTestClaim(ClaimBase):
    """A hypothesis test of the audit's tested circuit (spec key ``tests``) at level ``alpha``.

    Equivalence, independence and minimality hold when their null is *not* rejected (their null is the
    circuit hypothesis, as in Shi et al. 2024: a pass is no evidence against it, and its power depends on
    N); sufficiency and partial necessity hold when their null (no better than random circuits) is rejected."""

    TABLES: ClassVar[tuple[str, ...]] = ("circuit_tests",)
    #: the test's row in circuit_tests, and whether the claim holds when its null is rejected
    TEST: ClassVar[str]
    WANT_REJECT: ClassVar[bool]
    method: METHOD | Literal["given"] | None = None  # None: the run's one tested circuit
    alpha: float = Field(0.05, gt=0.0, lt=1.0, allow_inf_nan=False)

    def _auto_label(self) -> str:
        return f"{self.method + ' ' if self.method else ''}alpha={self.alpha:g}"


class CircuitEquivalentClaim(_CircuitTestClaim):
    """The circuit and the model perform alike up to the run's margin: equivalence not rejected at alpha."""

    kind: Literal["circuit_equivalent"]
    TEST: ClassVar[str] = "equivalence"
    WANT_REJECT: ClassVar[bool] = False


class CircuitEquivalentTostClaim(_CircuitTestClaim):
    """Equivalence affirmed: the TOST rejects non-equivalence (|P(circuit > model) − 1/2| >= margin) at alpha."""

    kind: Literal["circuit_equivalent_tost"]
    TEST: ClassVar[str] = "equivalence_tost"
    WANT_REJECT: ClassVar[bool] = True


class CircuitIndependentClaim(_CircuitTestClaim):
    """The complement's output carries no detectable information about the model's: HSIC not rejected at alpha."""

    kind: Literal["circuit_independent"]
    TEST: ClassVar[str] = "independence"
    WANT_REJECT: ClassVar[bool] = False


class CircuitMinimalClaim(_CircuitTestClaim):
    """No edge of the circuit is redundant: no adjusted per-edge minimality p-value <= alpha."""

    kind: Literal["circuit_minimal"]
    TEST: ClassVar[str] = "minimality"
    WANT_REJECT: ClassVar[bool] = False
    TABLES: ClassVar[tuple[str, ...]] = ("circuit_tests", "circuit_minimality")


class CircuitSufficientClaim(_CircuitTestClaim):
    """The circuit is more faithful than random circuits of its size: sufficiency p <= alpha."""

    kind: Literal["circuit_sufficient"]
    TEST: ClassVar[str] = "sufficiency"
    WANT_REJECT: ClassVar[bool] = True


class CircuitPartiallyNecessaryClaim(_CircuitTestClaim):
    """Ablating the circuit hurts more than ablating random circuits of its size: p <= alpha."""

    kind: Literal["circuit_partially_necessary"]
    TEST: ClassVar[str] = "partial_necessity"
    WANT_REJECT: ClassVar[bool] = True


# Token contributions and attention sinks (``circuitstat tokens``; circuitstat.pipelines.runs.tokens.run). A
# cross-seed run keeps each model's tables under model-<i>/: ``model: i`` picks one.
Model = Annotated[int | None, Field(None, ge=0)]


class SinkClaim(_HeadRef):
    """One head is an attention sink: a bound on its sink rate, by default on its interval's lower end."""

    kind: Literal["sink"]
    TABLES: ClassVar[tuple[str, ...]] = ("sink_heads",)
    # ci_low (the default): "a sink with rate >= min" holds only when the whole interval is above min
    statistic: Literal[claimable_in(TABLES)] = "ci_low"
    model: Model

    def _auto_label(self) -> str:
        return f"a{self.layer}.h{self.head} {self.statistic}" + model_label(self.model)


class TokenImportanceClaim(ClaimBase):
    """Ablating measure_a's top-k tokens drops the metric more than measure_b's (the Holm verdict says a > b)."""

    kind: Literal["token_importance"]
    TABLES: ClassVar[tuple[str, ...]] = ("token_importance_diffs",)
    measure_a: str = Field(min_length=1, max_length=100)
    measure_b: str = Field(min_length=1, max_length=100)
    k: int = Field(ge=1)
    model: Model

    @model_validator(mode="after")
    def _two_measures(self):
        if self.measure_a == self.measure_b:
            raise ValueError(f"measure_a and measure_b are both {self.measure_a!r}; compare two different measures")
        return self

    def _auto_label(self) -> str:
        return f"{self.measure_a} > {self.measure_b} k={self.k}" + model_label(self.model)


class TokenDropClaim(BoundedClaim):
    """The mean metric drop when a measure's top-k tokens are ablated, by default its interval's lower end."""

    kind: Literal["token_drop"]
    TABLES: ClassVar[tuple[str, ...]] = ("token_importance",)
    measure: str = Field(min_length=1, max_length=100)
    k: int = Field(ge=1)
    statistic: Literal[claimable_in(TABLES)] = "ci_low"
    model: Model

    def _auto_label(self) -> str:
        return f"{self.measure} k={self.k} {self.statistic}" + model_label(self.model)


class SinkStabilityClaim(BoundedClaim):
    """Sinks across the seeds of a cross-seed run: an item of sink_stability or sink_matching, by default its
    interval's lower end."""

    kind: Literal["sink_stability"]
    TABLES: ClassVar[tuple[str, ...]] = ("sink_stability", "sink_matching")
    layer: int = Field(ge=-1)  # -1: the whole model (the sink-norm relation per seed; sink_matching: layers pooled)
    item: str = Field(min_length=1, max_length=200)  # e.g. "rank 1 sink rate", "sink-head Jaccard"
    statistic: Literal[claimable_in(TABLES)] = "ci_low"

    def _auto_label(self) -> str:
        return f"layer {self.layer} {self.item} {self.statistic}"


class TokenStabilityClaim(BoundedClaim):
    """Do the seeds pick the same top-k tokens? By default the lower end of the excess over chance."""

    kind: Literal["token_stability"]
    TABLES: ClassVar[tuple[str, ...]] = ("token_stability",)
    measure: str = Field(min_length=1, max_length=100)
    k: int = Field(ge=1)
    # excess*: agreement above the hypergeometric chance of two random k-subsets (a stability claim is about excess)
    statistic: Literal[claimable_in(TABLES)] = "excess_ci_low"

    def _auto_label(self) -> str:
        return f"{self.measure} k={self.k} {self.statistic}"


def model_label(model: int | None) -> str:
    """Return " (model i)" for a claim about model i of a cross-seed run, "" for a single-model run."""
    return "" if model is None else f" (model {model})"
