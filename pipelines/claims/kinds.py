"""The registry of claim kinds: each kind declared once, as one :class:`ClaimKind` entry in :data:`KINDS`.

A kind's entry carries everything every entry point needs to know about it: its pydantic model (the model's
``kind`` literal is the kind's name, its ``TABLES`` the run tables that answer it, and the statistics it may
bound are the columns core/schema.py marks claimable in those tables), its evaluator, what the run must have
computed to answer it (``requires(claim, spec)``, the preflight of ``check --run-audit`` and ``check-circuit``),
the hint a run lacking its table gets and the text of its bound in the results. The claims file's ``Claim`` union
(claimsfile.py), the evaluation (evaluation.py), the preflight (checking.py), the reader's hints and the bound
texts are all read from here, so a new kind is one module (its model and evaluator, e.g. kind_published_edge.py)
and one entry below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from . import bounds as b
from . import evaluators as ev
from . import kind_published_edge as pe
from . import models as m
from . import requirements as req

__all__ = ["ClaimKind", "KINDS", "CLAIM_KINDS", "TOKEN_KINDS", "CIRCUIT_TESTS", "TABLE_HINTS", "bound_text", "statistics"]

#: (holds, observed values, reason) of one claim on one run; an evaluator raises ClaimError when it cannot answer
Evaluator = Callable[[Any, Any], tuple[bool, dict, str]]
#: None when the audit of the spec answers the claim, else why not and the fix
Requirement = Callable[[Any, Any], "str | None"]


@dataclass(frozen=True)
class ClaimKind:
    """One kind of claim: its model, its evaluator, what an audit must compute to answer it and the hint for a run
    that lacks its table(s)."""

    #: the pydantic model of one claim of this kind (a subclass of models.ClaimBase)
    model: type
    #: (claim, RunReader) -> (holds, observed, reason)
    evaluate: Evaluator
    #: (claim, audit spec) -> None when the audit answers the claim, else the reason and the fix
    requires: Requirement
    #: what makes the kind's table (one text), or each of its tables (one text per table, in ``tables`` order)
    hint: str | tuple[str, ...]
    #: "audit" (``circuitstat audit`` / ``check`` with a spec) or "tokens" (``circuitstat tokens``)
    answered_by: Literal["audit", "tokens"] = "audit"
    #: claim -> its bound as the results print it (default: the statistic against min/max)
    bound: Callable[[Any], str] = b.statistic_bound
    #: whether a claim's ``k`` is a circuit size the audit's k grid must hold (approximation's is top_k_overlap's)
    k_is_circuit_size: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.hint, tuple) and len(self.hint) != len(self.tables):
            raise ValueError(f"claim kind {self.name}: {len(self.hint)} hints for {len(self.tables)} tables")

    @property
    def name(self) -> str:
        """Return the kind's name in a claims file (its model's ``kind`` literal)."""
        return self.model.model_fields["kind"].annotation.__args__[0]

    @property
    def tables(self) -> tuple[str, ...]:
        """Return the run tables the kind is answered from (its model's ``TABLES``)."""
        return self.model.TABLES

    @property
    def table(self) -> str:
        """Return the kind's own table (the first of ``tables``)."""
        return self.tables[0]

    @property
    def statistics(self) -> tuple[str, ...]:
        """Return the claimable columns of the kind's tables, in schema order, each once."""
        return m.claimable_in(self.tables)

    @property
    def hints(self) -> dict[str, str]:
        """Return {table: what makes it} for the kind's tables."""
        texts = self.hint if isinstance(self.hint, tuple) else (self.hint,) * len(self.tables)
        return dict(zip(self.tables, texts))


_TOKENS_RUN = "token and sink claims need a `circuitstat tokens --out DIR` run; pass --run DIR"
_SEEDS_RUN = "claims across seeds need a cross-seed run: `circuitstat tokens` with two or more --model refits"
_TESTS_STAGE = ("circuit test claims need the audit's tests stage: add tests: {k: K} (or tests: {edges: [...]}) "
                "to the spec")
_SEVERAL_SEEDS = "stability needs several seeds: list two or more models under 'models:' in the spec"

KINDS: dict[str, ClaimKind] = {k.name: k for k in (
    ClaimKind(m.EdgeInCircuitClaim, ev.evaluate_edge_in_circuit, req.method_and_k,
              "inclusion frequencies come from the audit's circuit-stability stage", bound=b.inclusion_bound),
    ClaimKind(m.CircuitStabilityClaim, ev.evaluate_circuit_stability, req.method_and_k,
              "circuit stability comes from the audit's circuit-stability stage"),
    ClaimKind(m.FaithfulnessClaim, ev.evaluate_faithfulness, req.faithfulness, "set 'faithfulness: true' in the spec"),
    ClaimKind(m.EdgeEffectClaim, ev.evaluate_edge_effect, req.method_and_k,
              "edge estimates, CIs and q-values come from the audit's resampling stage", bound=b.effect_bound),
    ClaimKind(m.HeadStabilityClaim, ev.evaluate_head_stability, req.head_stability, f"head {_SEVERAL_SEEDS}"),
    ClaimKind(m.LayerStabilityClaim, ev.evaluate_layer_stability, req.several_seeds, f"layer {_SEVERAL_SEEDS}"),
    ClaimKind(m.ApproximationClaim, ev.evaluate_approximation, req.approximation,
              "approximation error needs 'exact' and the approximate method in the spec's methods",
              k_is_circuit_size=False),
    # verified runs (spec key verify; docs/verified.md): the mean exact effect of an edge, and the missed-edges bound
    ClaimKind(m.VerifiedEdgeClaim, ev.evaluate_verified_edge, req.verified_edge,
              "verified claims need a verified run: 'verify: {n: ...}' in the audit spec, or attribute --verify N"),
    ClaimKind(m.MissedEdgesClaim, ev.evaluate_missed_edges, req.missed_edges,
              "a missed-edges bound needs a verified run of some edges: 'verify: {edges: {top, random}, tau}'"),
    # a published circuit audited on this run (spec key circuit; docs/mib.md)
    ClaimKind(m.PublishedCircuitClaim, ev.evaluate_published_circuit, req.published_circuit, req.PUBLISHED_HINT),
    ClaimKind(pe.PublishedEdgeClaim, pe.evaluate_published_edge, req.published_circuit, req.PUBLISHED_HINT),
    # hypothesis tests of a circuit (spec key tests; docs/hypothesis-tests.md), one kind per test
    ClaimKind(m.CircuitEquivalentClaim, ev.evaluate_circuit_test, req.tests_stage, _TESTS_STAGE, bound=b.circuit_test_bound),
    ClaimKind(m.CircuitEquivalentTostClaim, ev.evaluate_circuit_test, req.tests_stage, _TESTS_STAGE, bound=b.circuit_test_bound),
    ClaimKind(m.CircuitIndependentClaim, ev.evaluate_circuit_test, req.tests_stage, _TESTS_STAGE, bound=b.circuit_test_bound),
    ClaimKind(m.CircuitMinimalClaim, ev.evaluate_circuit_test, req.tests_stage,
              (_TESTS_STAGE, "minimality claims need the audit's tests stage: add tests: {k: K} to the spec"),
              bound=b.circuit_test_bound),
    ClaimKind(m.CircuitSufficientClaim, ev.evaluate_circuit_test, req.tests_stage, _TESTS_STAGE, bound=b.circuit_test_bound),
    ClaimKind(m.CircuitPartiallyNecessaryClaim, ev.evaluate_circuit_test, req.tests_stage, _TESTS_STAGE, bound=b.circuit_test_bound),
    ClaimKind(m.SinkClaim, ev.evaluate_sink, req.tokens_run, _TOKENS_RUN, "tokens"),
    ClaimKind(m.TokenImportanceClaim, ev.evaluate_token_importance, req.tokens_run, _TOKENS_RUN, "tokens",
              bound=b.verdict_bound),
    ClaimKind(m.TokenDropClaim, ev.evaluate_token_drop, req.tokens_run, _TOKENS_RUN, "tokens"),
    # an item of sink_stability, or of sink_matching (sink heads matched across seeds): either table's columns
    ClaimKind(m.SinkStabilityClaim, ev.evaluate_sink_stability, req.tokens_run,
              (_SEEDS_RUN, f"{_SEEDS_RUN} (a cross-seed run made before sink_matching existed: run it again on the "
                           "same --out to add it; finished stages resume)"), "tokens"),
    ClaimKind(m.TokenStabilityClaim, ev.evaluate_token_stability, req.tokens_run, _SEEDS_RUN, "tokens"),
)}
CLAIM_KINDS: tuple[str, ...] = tuple(KINDS)
#: kinds answered by a ``circuitstat tokens`` run, not by the audit
TOKEN_KINDS: tuple[str, ...] = tuple(k.name for k in KINDS.values() if k.answered_by == "tokens")
#: circuit-test claim kind -> (the test's row in circuit_tests, whether the claim holds when the null is rejected)
CIRCUIT_TESTS: dict[str, tuple[str, bool]] = {k.name: (k.model.TEST, k.model.WANT_REJECT) for k in KINDS.values()
                                              if hasattr(k.model, "TEST")}


def _table_hints() -> dict[str, str]:
    """{table: what makes it} over every kind's tables and the edge list; ValueError when two kinds answered from
    one table disagree on its hint (a run lacking it would get a different fix depending on the claim)."""
    out = {"edges": "the edge list comes from the attribution stage"}
    for kind in KINDS.values():
        for table, text in kind.hints.items():
            if out.setdefault(table, text) != text:
                raise ValueError(f"claim kind {kind.name} gives table {table} a hint other kinds do not")
    return out


#: what makes each table a claim reads, for the error of a run that lacks it (circuitstat.pipelines.claims.reader)
TABLE_HINTS: dict[str, str] = _table_hints()


def bound_text(claim: Any) -> str:
    """Return the claim's bound as the results table prints it (its kind's ``bound``)."""
    return KINDS[claim.kind].bound(claim)


def statistics(kind: str) -> tuple[str, ...]:
    """Return the statistics a claim of ``kind`` may bound (the claimable columns of its tables)."""
    return KINDS[kind].statistics
