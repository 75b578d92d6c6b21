"""Claims checks: published findings stated as testable bounds, checked against an audit's run.

A claims file (YAML)::

    run: runs/zoo              # optional: a finished audit's run directory (relative to this file)
    spec: audit-zoo.yaml       # optional: the audit spec; used to run the audit when the run is missing
    claims:
      - kind: circuit_stability
        name: stable-top-20
        description: mean pairwise Jaccard of the top-20 circuit under resampling is at least 0.8
        method: exact
        k: 20
        statistic: jaccard_mean
        min: 0.8

Claim kinds (every one takes an optional ``name`` and ``description``; bounds are ``min`` and/or
``max``, both inclusive). The statistics a kind accepts are the columns its table marks claimable
in reports/schema.py, the one schema of run tables:

* ``edge_in_circuit``: ``edge``, ``method``, ``k``, ``min_inclusion`` — the edge's inclusion
  frequency in the top-k circuit over resamples (0 when it never entered it).
* ``circuit_stability``: ``method``, ``k``, ``statistic`` (jaccard_mean, jaccard_corrected, phi,
  consensus_jaccard_mean, or the data-level jaccard_data[_ci_low/_ci_high], jaccard_pop[_ci_low/_ci_high],
  phi_data[_ci_low/_ci_high]), bounds. The Monte Carlo jaccard_ci_low / phi_ci_low are not claimable.
* ``faithfulness``: ``method``, ``k``, ``statistic`` (f_ratio, f_mean, f_ci_low, f_ci_high of the
  fixed circuit; f_selected[_ci_low/_ci_high] with selection included (cross-fitted); or
  cpr, cmd, which need no ``k``), bounds.
* ``edge_effect``: ``edge``, ``method``, ``sign`` (positive, negative, nonzero), ``max_q``
  (Benjamini-Hochberg q-value of the edge's effect).
* ``head_stability``: ``layer`` and ``head`` (or ``head: "1.5"``), ``statistic`` (stability,
  ci_low, ci_high, distinctness, excess[_ci_low/_ci_high] over the null, refit_ci_low/high), bounds;
  optional ``match``/``pairs`` when the run has several.
* ``layer_stability``: ``layer``, ``statistic`` (stability, ci_low, ci_high, stability_all_anchors,
  excess[_ci_low/_ci_high], refit_ci_low/high), bounds.
* ``approximation``: ``method`` (an approximation of exact), ``statistic`` (spearman, kendall,
  r2, slope, top_k_overlap, bias_mean), bounds; optional ``k`` (the top-k of top_k_overlap).

Kinds answered by a ``circuitstat tokens`` run (token contributions and attention sinks); in a
cross-seed run (several ``--model``) each model's tables sit under ``model-<i>/`` and the claim
names it with ``model: i``:

* ``sink``: ``head`` (``a1.h3``, ``"1.3"`` or ``layer`` and ``head``), ``statistic`` (default
  ``ci_low``: "a sink with rate >= min" holds only when the interval's lower end does; or sink_rate,
  ci_high, output_norm, norm_ci_low/high), bounds.
* ``token_importance``: ``measure_a``, ``measure_b``, ``k`` — holds when the Holm verdict of the
  paired drop difference says ``measure_a > measure_b`` (read from either orientation of the pair).
* ``token_drop``: ``measure``, ``k``, ``statistic`` (default ``ci_low``; mean_drop, ci_high), bounds.
* ``sink_stability`` (cross-seed run, no ``model``): ``layer`` (-1: the whole model), ``item`` as
  the table names it (e.g. ``rank 1 sink rate``, ``heads with sink rate >= 0.3``), ``statistic``
  (default ``ci_low``; value, ci_high), bounds. Intervals cover the mean over training seeds. An item
  of ``sink_matching`` (sink heads matched across seeds by attention pattern, e.g. ``sink-head
  Jaccard``; layer -1: all layers pooled) is claimed the same way, also on ``excess`` and
  ``excess_ci_low/high`` (above a random matching: a stability claim is about excess).
* ``token_stability`` (cross-seed run): ``measure``, ``k``, ``statistic`` (default
  ``excess_ci_low``, agreement above chance; jaccard[_ci_low/_ci_high], excess[_ci_high]), bounds.

A bound on an interval (``ci_low``/``ci_high``), or a verdict, whose row is flagged
``interval_reliable = false`` (a few prompts carry the estimate) is refused with an error: the
interval cannot back the claim.

:func:`check` evaluates every claim against the run (running the audit via
:func:`pipelines.audit.run_audit` when the run is missing or lacks what the claims need and a spec
is given) and returns a :class:`CheckReport`: per claim a status (pass, fail, error), the observed
value(s), the bound and a reason. Exit codes of ``circuitstat check``: 0 all hold, 1 any fails,
2 an error (bad file, no run, a claim the run cannot answer: the reason names what the audit must
include).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from circuits.errors import InputError

from reports.schema import claimable

from .spec import METHOD, _Strict  # the one spec base: strict, frozen, no unknown keys
from .yamlio import read_yaml_strict, redacted_failure, redacted_validation_message, resolve_inside

__all__ = [
    "CLAIM_KINDS",
    "TOKEN_KINDS",
    "CheckReport",
    "Claim",
    "ClaimResult",
    "ClaimsFile",
    "check",
    "evaluate_claims",
    "format_results",
    "junit_xml",
    "load_claims",
    "parse_claims",
    "read_yaml_strict",
    "write_junit",
]

APPROX_METHOD = Literal[tuple(m for m in get_args(METHOD) if m != "exact")]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Unit = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


# ----------------------------------------------------------------------------------------------
# The claims file
# ----------------------------------------------------------------------------------------------
class _ClaimBase(_Strict):
    name: str | None = Field(None, min_length=1, max_length=200)
    description: str | None = None

    def label(self, index: int) -> str:
        return self.name or f"#{index + 1} {self.kind} {self._auto_label()}".strip()

    def _auto_label(self) -> str:  # pragma: no cover - overridden
        return ""


class _Bounded(_ClaimBase):
    min: Finite | None = None
    max: Finite | None = None

    @model_validator(mode="after")
    def _bounds(self):
        if self.min is None and self.max is None:
            raise ValueError("give a bound: 'min' and/or 'max'")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"'min' ({self.min}) is greater than 'max' ({self.max})")
        return self


def _normalise_edge(v: str) -> str:
    return re.sub(r"\s+", "", v.replace("→", "->"))


class EdgeInCircuit(_ClaimBase):
    """The edge is in the top-k circuit with inclusion frequency >= min_inclusion."""

    kind: Literal["edge_in_circuit"]
    edge: str = Field(min_length=1)
    method: METHOD
    k: int = Field(ge=1)
    min_inclusion: Unit

    @field_validator("edge")
    @classmethod
    def _edge(cls, v: str) -> str:
        return _normalise_edge(v)

    def _auto_label(self) -> str:
        return f"{self.edge} {self.method} k={self.k}"


class CircuitStability(_Bounded):
    """A stability statistic of the top-k circuit under resampling."""

    kind: Literal["circuit_stability"]
    method: METHOD
    k: int = Field(ge=1)
    # *_ci_low of the Monte Carlo spread over resamples are not claimable: a claim about stability is about
    # data, so bounds come from the data-level intervals (expected Jaccard / Phi of two size-N datasets).
    statistic: Literal[claimable("stability_vs_k")]

    def _auto_label(self) -> str:
        return f"{self.statistic} {self.method} k={self.k}"


class Faithfulness(_Bounded):
    """Faithfulness of the top-k circuit (f_*), or the area-under-curve scores cpr/cmd."""

    kind: Literal["faithfulness"]
    method: METHOD
    k: int | None = Field(None, ge=1)
    # f_ci_*: this fixed circuit (selection not included); f_selected*: the circuit selected from N prompts
    statistic: Literal[claimable("faithfulness_vs_k")]

    @model_validator(mode="after")
    def _needs_k(self):
        if self.statistic.startswith("f_") and self.k is None:
            raise ValueError(f"statistic {self.statistic!r} is per circuit size: give 'k'")
        if not self.statistic.startswith("f_") and self.k is not None:
            raise ValueError(f"statistic {self.statistic!r} integrates over every k; remove 'k'")
        return self

    def _auto_label(self) -> str:
        return f"{self.statistic} {self.method}" + (f" k={self.k}" if self.k is not None else "")


class EdgeEffect(_ClaimBase):
    """The edge's mean effect has the given sign and is significant after BH (q <= max_q)."""

    kind: Literal["edge_effect"]
    edge: str = Field(min_length=1)
    method: METHOD
    sign: Literal["positive", "negative", "nonzero"]
    max_q: float = Field(gt=0.0, le=1.0, allow_inf_nan=False)

    @field_validator("edge")
    @classmethod
    def _edge(cls, v: str) -> str:
        return _normalise_edge(v)

    def _auto_label(self) -> str:
        return f"{self.edge} {self.method} {self.sign}"


_HEAD_RE = re.compile(r"^\s*(?:a?(\d+)\s*\.\s*h?(\d+))\s*$")


class _HeadRef(_Bounded):
    """A claim about one attention head: ``layer`` and ``head``, or ``head: "1.5"`` / ``head: a1.h5``."""

    layer: int | None = Field(None, ge=0)
    head: int | str

    @field_validator("head", mode="before")
    @classmethod
    def _no_float_head(cls, v: Any) -> Any:
        if isinstance(v, float):
            raise ValueError(
                f"head {v!r} is a number; write layer 1 head 5 as head: \"1.5\" (quoted) or as layer: 1 and head: 5"
            )
        if isinstance(v, bool):
            raise ValueError("head must be an integer or a \"layer.head\" string such as \"1.5\"")
        return v

    @model_validator(mode="after")
    def _resolve_head(self):
        if isinstance(self.head, str):
            m = _HEAD_RE.match(self.head)
            if not m:
                raise ValueError(f"head {self.head!r} is not 'LAYER.HEAD' (such as \"1.5\" or \"a1.h5\")")
            layer, head = int(m.group(1)), int(m.group(2))
            if self.layer is not None and self.layer != layer:
                raise ValueError(f"head {self.head!r} is in layer {layer} but 'layer' is {self.layer}")
            object.__setattr__(self, "layer", layer)
            object.__setattr__(self, "head", head)
        else:
            if self.head < 0:
                raise ValueError("head must be >= 0")
            if self.layer is None:
                raise ValueError(f"give 'layer' with head {self.head}, or write head: \"LAYER.{self.head}\"")
        return self


class HeadStability(_HeadRef):
    """Stability of one attention head across independently trained seeds."""

    kind: Literal["head_stability"]
    # excess*: stability above its shuffled-prompt null; refit_*: every refit an anchor (seed-level interval)
    statistic: Literal[claimable("heads")]
    match: Literal["max", "hungarian"] | None = None
    pairs: Literal["anchor", "all"] | None = None

    def _auto_label(self) -> str:
        return f"{self.layer}.{self.head} {self.statistic}"


class LayerStability(_Bounded):
    """Mean stability of a layer's heads across seeds."""

    kind: Literal["layer_stability"]
    layer: int = Field(ge=0)
    statistic: Literal[claimable("layers")]

    def _auto_label(self) -> str:
        return f"layer {self.layer} {self.statistic}"


class Approximation(_Bounded):
    """Agreement of an approximate method's scores with exact activation patching."""

    kind: Literal["approximation"]
    method: APPROX_METHOD
    statistic: Literal[claimable("approximation_summary")]
    k: int | None = Field(None, ge=1)

    def _auto_label(self) -> str:
        return f"{self.method} {self.statistic}" + (f" k={self.k}" if self.k is not None else "")


# Token contributions and attention sinks (``circuitstat tokens``; pipelines.contributions). A
# cross-seed run keeps each model's tables under model-<i>/: ``model: i`` picks one.
Model = Annotated[int | None, Field(None, ge=0)]


class Sink(_HeadRef):
    """One head is an attention sink: a bound on its sink rate, by default on its interval's lower end."""

    kind: Literal["sink"]
    # ci_low (the default): "a sink with rate >= min" holds only when the whole interval is above min
    statistic: Literal[claimable("sink_heads")] = "ci_low"
    model: Model

    def _auto_label(self) -> str:
        return f"a{self.layer}.h{self.head} {self.statistic}" + _model_label(self.model)


class TokenImportance(_ClaimBase):
    """Ablating measure_a's top-k tokens drops the metric more than measure_b's (the Holm verdict says a > b)."""

    kind: Literal["token_importance"]
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
        return f"{self.measure_a} > {self.measure_b} k={self.k}" + _model_label(self.model)


class TokenDrop(_Bounded):
    """The mean metric drop when a measure's top-k tokens are ablated, by default its interval's lower end."""

    kind: Literal["token_drop"]
    measure: str = Field(min_length=1, max_length=100)
    k: int = Field(ge=1)
    statistic: Literal[claimable("token_importance")] = "ci_low"
    model: Model

    def _auto_label(self) -> str:
        return f"{self.measure} k={self.k} {self.statistic}" + _model_label(self.model)


class SinkStability(_Bounded):
    """Sinks across the seeds of a cross-seed run: an item of sink_stability or sink_matching, by default its
    interval's lower end."""

    kind: Literal["sink_stability"]
    layer: int = Field(ge=-1)  # -1: the whole model (the sink-norm relation per seed; sink_matching: layers pooled)
    item: str = Field(min_length=1, max_length=200)  # e.g. "rank 1 sink rate", "sink-head Jaccard"
    statistic: Literal[tuple(dict.fromkeys(claimable("sink_stability") + claimable("sink_matching")))] = "ci_low"

    def _auto_label(self) -> str:
        return f"layer {self.layer} {self.item} {self.statistic}"


class TokenStability(_Bounded):
    """Do the seeds pick the same top-k tokens? By default the lower end of the excess over chance."""

    kind: Literal["token_stability"]
    measure: str = Field(min_length=1, max_length=100)
    k: int = Field(ge=1)
    # excess*: agreement above the hypergeometric chance of two random k-subsets (a stability claim is about excess)
    statistic: Literal[claimable("token_stability")] = "excess_ci_low"

    def _auto_label(self) -> str:
        return f"{self.measure} k={self.k} {self.statistic}"


def _model_label(model: int | None) -> str:
    return "" if model is None else f" (model {model})"


_CLAIM_MODELS = (EdgeInCircuit, CircuitStability, Faithfulness, EdgeEffect, HeadStability, LayerStability,
                 Approximation, Sink, TokenImportance, TokenDrop, SinkStability, TokenStability)
Claim = Annotated[
    Union[_CLAIM_MODELS],
    Field(discriminator="kind"),
]
_KIND_MODELS: dict[str, type[_ClaimBase]] = {
    m.model_fields["kind"].annotation.__args__[0]: m  # type: ignore[union-attr]
    for m in _CLAIM_MODELS
}
CLAIM_KINDS: tuple[str, ...] = tuple(_KIND_MODELS)
#: kinds answered by a ``circuitstat tokens`` run, not by the audit
TOKEN_KINDS: tuple[str, ...] = ("sink", "token_importance", "token_drop", "sink_stability", "token_stability")


class ClaimsFile(_Strict):
    """A claims file: where the run is (or the spec to make it) and the claims."""

    run: str | None = Field(None, min_length=1)
    spec: str | None = Field(None, min_length=1)
    claims: list[Claim] = Field(min_length=1)
    _source: str | None = PrivateAttr(None)  # the file it came from (set by parse_claims)

    @property
    def source(self) -> str | None:
        return self._source

    @property
    def base(self) -> Path:
        """The directory relative paths in the file are relative to."""
        return Path(self.source).parent if self.source else Path(".")

    def run_path(self, allow_outside: bool = False) -> Path | None:
        """``run:`` relative to this file, confined to its directory tree unless `allow_outside`."""
        return None if self.run is None else self._inside(self.run, "run", allow_outside)

    def spec_path(self, allow_outside: bool = False) -> Path | None:
        """``spec:`` relative to this file, confined to its directory tree unless `allow_outside`."""
        return None if self.spec is None else self._inside(self.spec, "spec", allow_outside)

    def _inside(self, value: str, key: str, allow_outside: bool) -> Path:
        # A claims file may come from someone else (a CI job checks published findings): it must
        # not make check read or write outside the tree it was placed in (see resolve_inside).
        return resolve_inside(self.source or Path(".") / "<claims>", value, key=key, allow_outside=allow_outside)


# ----------------------------------------------------------------------------------------------
# Validation errors
# ----------------------------------------------------------------------------------------------
def _loc(loc: tuple) -> tuple[str, str | None]:
    """(readable location, claim kind in it) of a pydantic error location."""
    out, kind = "", None
    parts = list(loc)
    i = 0
    while i < len(parts):
        p = parts[i]
        if isinstance(p, int):
            out += f"[{p}]"
            # the discriminated union adds the tag after the index: claims[0].circuit_stability.min
            if i + 1 < len(parts) and parts[i + 1] in _KIND_MODELS:
                kind = parts[i + 1]
                i += 1
        else:
            # a key from the file: quoted when it has spaces or control characters, so the
            # message stays one line and cannot carry terminal escapes
            text = str(p)
            out += ("." if out else "") + (text if text.isprintable() and text.split() == [text] else _short(text))
        i += 1
    return out or "(top level)", kind


def _format_validation(exc: ValidationError, source: str, data: Any) -> str:
    parts = []
    errors = exc.errors(include_url=False)
    for err in errors[:6]:
        where, kind = _loc(tuple(err["loc"]))
        t, msg = err["type"], err["msg"]
        if t == "extra_forbidden":
            fields = list(_KIND_MODELS[kind].model_fields if kind else ClaimsFile.model_fields)
            fields.sort(key=lambda f: f != "kind")
            msg = f"unknown key; allowed keys: {', '.join(fields)}"
        elif t == "missing":
            msg = "required key is missing"
        elif t == "invalid_key":
            where, msg = f"key {_short(err['loc'][-1])}", "keys must be strings (names such as 'claims')"
        elif t == "too_short" and where == "claims":
            msg = "list at least one claim"
        elif t == "union_tag_not_found":
            msg = f"every claim needs a 'kind'; kinds: {', '.join(CLAIM_KINDS)}"
        elif t == "union_tag_invalid":
            msg = f"unknown kind {err['input'].get('kind')!r}; kinds: {', '.join(CLAIM_KINDS)}" if isinstance(err.get("input"), dict) else msg
        elif t in ("model_attributes_type", "model_type", "dict_type") and where.startswith("claims["):
            msg = "each claim must be a mapping of keys (kind, method, ...), not " + type(err.get("input")).__name__
        elif t == "literal_error":
            msg = msg.replace("Input should be", "must be")
            if kind == "approximation" and where.endswith(".method"):
                msg += " (approximation compares an approximate method against exact)"
        elif t == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif t in ("int_type", "float_type", "string_type", "bool_type", "list_type"):
            msg = f"{msg.replace('Input should be', 'must be')} (got {type(err.get('input')).__name__} {_short(err.get('input'))})"
        m = re.match(r"claims\[(\d+)\]", where)
        if m and isinstance(data, dict) and isinstance(data.get("claims"), list):
            i = int(m.group(1))
            c = data["claims"][i] if i < len(data["claims"]) else None
            if isinstance(c, dict) and isinstance(c.get("name"), str):
                where += f" ({c['name'][:60]!r})"
        parts.append(f"{where}: {msg}")
    more = f" (and {len(errors) - 6} more)" if len(errors) > 6 else ""
    return f"invalid claims file {source}: " + "; ".join(parts) + more


def _short(v: Any, n: int = 40) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def parse_claims(data: Any, source: str = "<claims>") -> ClaimsFile:
    """A ClaimsFile from parsed YAML, or InputError naming each bad key and the allowed values."""
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__}"
        raise InputError(
            f"invalid claims file {source}: the top level is {what}; it must be a mapping with "
            "'claims:' (a list of claims) and optionally 'run:' and 'spec:'"
        )
    try:
        cf = ClaimsFile.model_validate(data)
    except ValidationError as exc:
        raise InputError(_format_validation(exc, source, data)) from None
    except RecursionError:
        raise InputError(f"invalid claims file {source}: nested too deeply") from None
    cf._source = source
    return cf


def load_claims(path: str | os.PathLike[str]) -> ClaimsFile:
    """The validated claims file at `path` (InputError on any problem, naming the key and the fix)."""
    return parse_claims(read_yaml_strict(path), str(path))


def _load_spec(path: Path, *, redact: bool = True, allow_outside: bool = False):
    """The audit spec at `path` through the strict YAML reader, validated as pipelines.spec does.

    With `redact` (the spec was named by a claims file, which may come from someone else) errors
    never quote the spec's text, keys or values: ``spec: /etc/shadow`` must not print the shadow
    file. See pipelines.yamlio for the rule.
    """
    from pydantic import ValidationError

    from pipelines.spec import AuditSpec, parse_spec

    from pipelines.spec import confine_paths

    data = read_yaml_strict(path, quote=not redact)
    if not redact:
        return confine_paths(parse_spec(data, str(path)), path, allow_outside=allow_outside)
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__}"
        raise InputError(f"invalid spec {path}: the top level is {what}; it must be a mapping of keys "
                         "(model, task, methods, ...)")
    try:
        spec = AuditSpec.model_validate(data)
    except ValidationError as exc:
        raise InputError(redacted_validation_message(exc, data, AuditSpec, f"invalid spec {path}")) from None
    except RecursionError:
        raise InputError(f"invalid spec {path}: nested too deeply") from None
    return confine_paths(spec, path, allow_outside=allow_outside)


# ----------------------------------------------------------------------------------------------
# Reading the run
# ----------------------------------------------------------------------------------------------
_TABLE_HINT = {
    "edges": "the edge list comes from the attribution stage",
    "edge_stats": "edge estimates, CIs and q-values come from the audit's resampling stage",
    "inclusion": "inclusion frequencies come from the audit's circuit-stability stage",
    "stability_vs_k": "circuit stability comes from the audit's circuit-stability stage",
    "faithfulness_vs_k": "set 'faithfulness: true' in the spec",
    "approximation_summary": "approximation error needs 'exact' and the approximate method in the spec's methods",
    "heads": "head stability needs several seeds: list two or more models under 'models:' in the spec",
    "layers": "layer stability needs several seeds: list two or more models under 'models:' in the spec",
    **{t: "token and sink claims need a `circuitstat tokens --out DIR` run; pass --run DIR"
       for t in ("sink_heads", "token_importance", "token_importance_diffs")},
    **{t: "claims across seeds need a cross-seed run: `circuitstat tokens` with two or more --model refits"
       for t in ("sink_stability", "token_stability")},
    "sink_matching": "claims across seeds need a cross-seed run: `circuitstat tokens` with two or more --model refits "
                     "(a cross-seed run made before sink_matching existed: run it again on the same --out to add it; "
                     "finished stages resume)",
}


class _ClaimError(Exception):
    """A claim cannot be evaluated; `missing` when running (or re-running) the audit could fix it."""

    def __init__(self, reason: str, missing: bool = False, observed: dict | None = None):
        super().__init__(reason)
        self.reason, self.missing, self.observed = reason, missing, observed or {}


class _Run:
    """Lazy, cached access to a run directory's tables."""

    def __init__(self, path: Path):
        self.path = path
        self._tables: dict[str, Any] = {}
        self._parts: dict[int, _Run] = {}  # model-<i>/ of a cross-seed tokens run
        self._index: dict[tuple, dict] = {}  # (table, key columns) -> key values -> rows (see rows)
        self._columns: dict[str, frozenset] = {}  # table -> its column names (asked once per claim)
        self.manifest: dict | None = None
        self.unfinished: list[str] = []
        mpath = path / "manifest.json"
        if mpath.exists():
            from reports.rundir import RunDir

            self.manifest = RunDir.read_manifest(path)  # RunDirError on a corrupt manifest
            stages = self.manifest.get("stages", {})
            self.unfinished = sorted(n for n, s in stages.items() if isinstance(s, dict) and s.get("status") != "done")

    def table(self, name: str, columns: list[str], /):
        if name not in self._tables:
            p = self.path / f"{name}.parquet"
            if not p.is_file():
                note = ""
                if self.unfinished:
                    note = f" (the run is incomplete: stage(s) {', '.join(self.unfinished)} did not finish; resume the audit)"
                raise _ClaimError(f"the run {self.path} has no {name}.parquet; {_TABLE_HINT.get(name, 'run the audit')}{note}",
                                  missing=True)
            try:
                from reports.tables import read_table

                self._tables[name] = read_table(p)
            except Exception as e:  # corrupt file: pyarrow raises its own error types
                raise _ClaimError(f"{p} cannot be read ({type(e).__name__}: {str(e)[:200]}); re-run the audit into a new directory",
                                  missing=True) from None
        t = self._tables[name]
        names = self._columns.get(name) or self._columns.setdefault(name, frozenset(t.column_names))
        lacking = [c for c in columns if c not in names]
        if lacking:
            raise _ClaimError(f"{name}.parquet in {self.path} has no column(s) {lacking} (columns: {t.column_names}); "
                              "it was written by another version: re-run the audit", missing=True)
        return t

    def rows(self, name: str, columns: list[str], /, **eq: Any) -> list[dict]:
        # One index per (table, key columns), built once: a file of 60,000 claims must not filter the
        # table 60,000 times. Null never equals anything (as in SQL and pyarrow.compute.equal).
        want = columns + list(eq)
        self.table(name, want)
        keys = tuple(sorted(eq))
        index = self._index.get((name, keys))
        if index is None:
            index = self._index[(name, keys)] = {}
            for r in self._tables[name].to_pylist():
                index.setdefault(tuple(r[k] for k in keys), []).append(r)
        if any(v is None for v in eq.values()):
            return []
        return [{c: r[c] for c in want} for r in index.get(tuple(eq[k] for k in keys), [])]

    def distinct(self, name: str, column: str, /, **eq: Any) -> list:
        vals = {r[column] for r in self.rows(name, [column], **eq)}
        return sorted(v for v in vals if v is not None)

    def models(self) -> list[int]:
        """Indices i of the model-<i>/ parts of a cross-seed run ([] for a single-model run)."""
        found = (re.fullmatch(r"model-(\d+)", p.name) for p in self.path.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    def part(self, model: int | None, table: str) -> "_Run":
        """This run, or model-<model>/ of a cross-seed run, as the run that holds `table`."""
        models = self.models()
        if model is None:
            if models and not (self.path / f"{table}.parquet").is_file():
                raise _ClaimError(f"the run {self.path} is a cross-seed run of {len(models)} models with {table} per "
                                  f"model; give 'model:' (one of {models}) to say which model the claim is about")
            return self
        if model not in models:
            where = f"its models are {models}" if models else "it holds one model: remove 'model:'"
            raise _ClaimError(f"model {model} is not in the run {self.path} ({where})")
        if model not in self._parts:
            self._parts[model] = _Run(self.path / f"model-{model}")
        return self._parts[model]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.4g}"
    return str(v)


def _cmp_text(value: float, bound: float, op: str) -> str:
    a, b = _fmt(value), _fmt(bound)
    if a == b:
        a = f"{value:.10g}"
    return f"{a} {op} {b}"


def _need(run: _Run, table: str, column: str, value: Any, fix: str, **eq: Any) -> None:
    """Raise the 'add it to the spec' error if `value` is not among `column`'s values (given eq)."""
    have = run.distinct(table, column, **eq)
    if value not in have:
        where = f" for {', '.join(f'{v}' for v in eq.values())}" if eq else ""
        if column == "k":
            msg = f"k={value} is not in the run's k grid {have}{where}; add it to the spec's k"
        elif column == "method":
            msg = f"method {value!r} is not in the run's {table} (methods: {have}); {fix}"
        else:
            msg = f"{column}={value!r} is not in the run's {table} (values: {have}){where}; {fix}"
        raise _ClaimError(msg, missing=True)


def _edge_known(run: _Run, edge: str) -> None:
    """Raise a clear error if `edge` is not an edge name of the run's graph."""
    names: list[str] = []
    for table in ("edges", "edge_stats"):
        try:
            names = run.distinct(table, "name")
            break
        except _ClaimError:
            continue
    if not names:
        return  # cannot tell; the claim's own table decides
    if edge not in names:
        close = difflib.get_close_matches(edge, names, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; edges are named like {names[0]!r}"
        raise _ClaimError(f"edge {edge!r} is not an edge of the run's model{hint}")


def _scalar(run: _Run, table: str, stat: str, what: str, **eq: Any) -> float:
    rows = run.rows(table, [stat], **eq)
    vals = [r[stat] for r in rows]
    if not vals:
        raise _ClaimError(f"no row for {what} in {table}.parquet; re-run the audit", missing=True)
    distinct = {("nan" if isinstance(v, float) and math.isnan(v) else v) for v in vals}
    if len(distinct) > 1:
        raise _ClaimError(f"{table}.parquet has {len(vals)} different values of {stat} for {what}; "
                          "narrow the claim (e.g. give k, match or pairs)")
    v = vals[0]
    if v is None or (isinstance(v, float) and math.isnan(v)):
        raise _ClaimError(f"{stat} for {what} is undefined (NaN) in the run; it cannot be checked "
                          "(too few resamples or a degenerate statistic)", observed={stat: v})
    return float(v)


def _bounded(value: float, claim: _Bounded, label: str) -> tuple[bool, str]:
    if claim.min is not None and value < claim.min:
        return False, f"{label} is {_cmp_text(value, claim.min, '<')}"
    if claim.max is not None and value > claim.max:
        return False, f"{label} is {_cmp_text(value, claim.max, '>')}"
    parts = []
    if claim.min is not None:
        parts.append(_cmp_text(value, claim.min, ">="))
    if claim.max is not None:
        parts.append(f"<= {_fmt(claim.max)}" if parts else _cmp_text(value, claim.max, "<="))
    return True, f"{label} is {' and '.join(parts)}"


def _bound_text(claim: Any) -> str:
    if isinstance(claim, EdgeInCircuit):
        return f"inclusion >= {_fmt(claim.min_inclusion)}"
    if isinstance(claim, EdgeEffect):
        s = {"positive": "estimate > 0", "negative": "estimate < 0", "nonzero": "estimate != 0"}[claim.sign]
        return f"{s}, q <= {_fmt(claim.max_q)}"
    if isinstance(claim, TokenImportance):
        return f"Holm verdict {claim.measure_a} > {claim.measure_b}"
    stat = getattr(claim, "statistic", "")
    parts = []
    if claim.min is not None:
        parts.append(f">= {_fmt(claim.min)}")
    if claim.max is not None:
        parts.append(f"<= {_fmt(claim.max)}")
    return f"{stat} " + " and ".join(parts)


_FIX_METHOD = "add it to the spec's methods"


def _eval_edge_in_circuit(c: EdgeInCircuit, run: _Run) -> tuple[bool, dict, str]:
    _need(run, "inclusion", "method", c.method, _FIX_METHOD)
    _need(run, "inclusion", "k", c.k, "", method=c.method)
    _edge_known(run, c.edge)
    rows = run.rows("inclusion", ["frequency"], method=c.method, k=c.k, name=c.edge)
    freq = float(rows[0]["frequency"]) if rows else 0.0  # no row: never in the top-k circuit
    if math.isnan(freq):
        raise _ClaimError(f"inclusion of {c.edge} at k={c.k} for {c.method} is NaN in the run")
    label = f"inclusion of {c.edge} in the top-{c.k} circuit for {c.method}"
    if not rows:
        label += " (never selected)"
    ok = freq >= c.min_inclusion
    return ok, {"inclusion": freq}, f"{label} is {_cmp_text(freq, c.min_inclusion, '>=' if ok else '<')}"


def _eval_circuit_stability(c: CircuitStability, run: _Run) -> tuple[bool, dict, str]:
    _need(run, "stability_vs_k", "method", c.method, _FIX_METHOD)
    _need(run, "stability_vs_k", "k", c.k, "", method=c.method)
    v = _scalar(run, "stability_vs_k", c.statistic, f"{c.method} k={c.k}", method=c.method, k=c.k)
    ok, reason = _bounded(v, c, f"{c.statistic} at k={c.k} for {c.method}")
    return ok, {c.statistic: v}, reason


def _eval_faithfulness(c: Faithfulness, run: _Run) -> tuple[bool, dict, str]:
    _need(run, "faithfulness_vs_k", "method", c.method, _FIX_METHOD)
    eq: dict[str, Any] = {"method": c.method}
    if c.k is not None:
        _need(run, "faithfulness_vs_k", "k", c.k, "", method=c.method)
        eq["k"] = c.k
    v = _scalar(run, "faithfulness_vs_k", c.statistic, " ".join(f"{a}={b}" for a, b in eq.items()), **eq)
    where = f" at k={c.k}" if c.k is not None else ""
    ok, reason = _bounded(v, c, f"{c.statistic}{where} for {c.method}")
    return ok, {c.statistic: v}, reason


def _eval_edge_effect(c: EdgeEffect, run: _Run) -> tuple[bool, dict, str]:
    _need(run, "edge_stats", "method", c.method, _FIX_METHOD)
    _edge_known(run, c.edge)
    rows = run.rows("edge_stats", ["estimate", "ci_low", "ci_high", "q"], method=c.method, name=c.edge)
    if not rows:
        raise _ClaimError(f"edge {c.edge!r} has no row in edge_stats.parquet for {c.method}; re-run the audit", missing=True)
    # the q-value inverts the interval: an interval flagged unreliable cannot back a significance claim
    _require_reliable(run, "edge_stats", "ci_low", f"{c.edge} ({c.method})", method=c.method, name=c.edge)
    r = rows[0]
    est, q = r["estimate"], r["q"]
    obs = {"estimate": est, "q": q, "ci_low": r["ci_low"], "ci_high": r["ci_high"]}
    if est is None or q is None or math.isnan(est) or math.isnan(q):
        raise _ClaimError(f"the estimate or q-value of {c.edge} for {c.method} is undefined (NaN) in the run", observed=obs)
    sign_ok = {"positive": est > 0, "negative": est < 0, "nonzero": est != 0}[c.sign]
    label = f"{c.edge} ({c.method}): estimate {_fmt(est)} [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]"
    if not sign_ok:
        return False, obs, f"{label} is not {c.sign}"
    if q > c.max_q:
        return False, obs, f"{label}, q = {_cmp_text(q, c.max_q, '>')}: not significant after BH"
    return True, obs, f"{label} is {c.sign}, q = {_cmp_text(q, c.max_q, '<=')}"


def _eval_head_stability(c: HeadStability, run: _Run) -> tuple[bool, dict, str]:
    cols = [c.statistic]
    if not run.rows("heads", cols, layer=c.layer, head=c.head):
        layers = run.distinct("heads", "layer")
        heads = run.distinct("heads", "head")
        raise _ClaimError(f"head {c.layer}.{c.head} is not in the run's heads table "
                          f"(layers {layers}, heads {heads}); check the claim's layer and head")
    eq: dict[str, Any] = {"layer": c.layer, "head": c.head}
    for key in ("match", "pairs"):
        val = getattr(c, key)
        if val is not None:
            _need(run, "heads", key, val, f"set heads.{key}: {val} in the spec")
            eq[key] = val
    v = _scalar(run, "heads", c.statistic, f"head {c.layer}.{c.head}", **eq)
    ok, reason = _bounded(v, c, f"{c.statistic} of head {c.layer}.{c.head}")
    return ok, {c.statistic: v}, reason


def _eval_layer_stability(c: LayerStability, run: _Run) -> tuple[bool, dict, str]:
    if not run.rows("layers", [c.statistic], layer=c.layer):
        raise _ClaimError(f"layer {c.layer} is not in the run's layers table (layers {run.distinct('layers', 'layer')}); "
                          "check the claim's layer")
    v = _scalar(run, "layers", c.statistic, f"layer {c.layer}", layer=c.layer)
    ok, reason = _bounded(v, c, f"{c.statistic} of layer {c.layer}")
    return ok, {c.statistic: v}, reason


def _eval_approximation(c: Approximation, run: _Run) -> tuple[bool, dict, str]:
    _need(run, "approximation_summary", "method", c.method, "add it and 'exact' to the spec's methods")
    eq: dict[str, Any] = {"method": c.method}
    if c.k is not None:
        _need(run, "approximation_summary", "k", c.k, "", method=c.method)
        eq["k"] = c.k
    try:
        v = _scalar(run, "approximation_summary", c.statistic, f"{c.method}", **eq)
    except _ClaimError as e:
        if "different values" in e.reason:
            ks = run.distinct("approximation_summary", "k", method=c.method)
            raise _ClaimError(f"{c.statistic} of {c.method} differs by k; give 'k' (one of {ks})") from None
        raise
    where = f" (top-{c.k})" if c.k is not None else ""
    ok, reason = _bounded(v, c, f"{c.statistic}{where} of {c.method} against exact")
    return ok, {c.statistic: v}, reason


def _require_reliable(run: _Run, table: str, stat: str, what: str, **eq: Any) -> None:
    """Refuse a bound on ci_low/ci_high of a row whose table flags its interval unreliable."""
    if stat not in ("ci_low", "ci_high"):
        return
    if any(r["interval_reliable"] is False for r in run.rows(table, ["interval_reliable"], **eq)):
        raise _ClaimError(f"the interval of {what} is flagged unreliable in {table} (interval_reliable = false: a few "
                          "prompts carry the estimate), so it cannot back this claim; rerun with more prompts (--n)")


def _token_run(run: _Run, model: int | None, table: str, k: int, measures: list[str]) -> _Run:
    """The run (or model part) holding `table`; a _ClaimError naming the fix when k or a measure is not in it."""
    part = run.part(model, table)
    cols = ("measure_a", "measure_b") if table == "token_importance_diffs" else ("measure",)
    names = sorted({v for c in cols for v in part.distinct(table, c)})
    for m in measures:
        if m not in names:
            raise _ClaimError(f"measure {m!r} is not in the run's {table} (measures: {names}); "
                              "check the spelling, or rerun `circuitstat tokens` with it in --measures")
    ks = part.distinct(table, "k")
    if k not in ks:
        raise _ClaimError(f"k={k} is not in the run's k grid {ks} ({table}); rerun `circuitstat tokens` with it in --k")
    return part


def _eval_sink(c: Sink, run: _Run) -> tuple[bool, dict, str]:
    part = run.part(c.model, "sink_heads")
    node = f"a{c.layer}.h{c.head}"
    if not part.rows("sink_heads", ["node"], layer=c.layer, head=c.head):
        nodes = part.distinct("sink_heads", "node")
        close = difflib.get_close_matches(node, nodes, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "check the claim's head"
        raise _ClaimError(f"head {node} is not in the run's sink_heads (layers {part.distinct('sink_heads', 'layer')}, "
                          f"heads {part.distinct('sink_heads', 'head')}); {hint}")
    where = node + _model_label(c.model)
    v = _scalar(part, "sink_heads", c.statistic, where, layer=c.layer, head=c.head)
    _require_reliable(part, "sink_heads", c.statistic, f"the sink rate of {where}", layer=c.layer, head=c.head)
    (r,) = part.rows("sink_heads", ["sink_rate", "ci_low", "ci_high", "threshold"], layer=c.layer, head=c.head)
    ok, reason = _bounded(v, c, f"{c.statistic} of {where}")
    rate = f"sink rate {_fmt(r['sink_rate'])} [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}] above {_fmt(r['threshold'])}"
    return ok, {c.statistic: v}, f"{reason} ({rate})"


def _eval_token_drop(c: TokenDrop, run: _Run) -> tuple[bool, dict, str]:
    part = _token_run(run, c.model, "token_importance", c.k, [c.measure])
    where = f"the metric drop from ablating {c.measure}'s top-{c.k} tokens" + _model_label(c.model)
    v = _scalar(part, "token_importance", c.statistic, where, measure=c.measure, k=c.k)
    _require_reliable(part, "token_importance", c.statistic, where, measure=c.measure, k=c.k)
    ok, reason = _bounded(v, c, f"{c.statistic} of {where}")
    return ok, {c.statistic: v}, reason


def _eval_token_importance(c: TokenImportance, run: _Run) -> tuple[bool, dict, str]:
    a, b = c.measure_a, c.measure_b
    part = _token_run(run, c.model, "token_importance_diffs", c.k, [a, b])
    cols = ["difference", "ci_low", "ci_high", "pvalue_holm", "verdict", "interval_reliable", "multiplicity"]
    sign, rows = 1.0, part.rows("token_importance_diffs", cols, measure_a=a, measure_b=b, k=c.k)
    if not rows:  # the run tested b - a: the same verdict, read the other way round
        sign, rows = -1.0, part.rows("token_importance_diffs", cols, measure_a=b, measure_b=a, k=c.k)
    if not rows:
        raise _ClaimError(f"the run did not test {a} against {b} (its --pairs left them out); "
                          f"rerun `circuitstat tokens` with --pairs including {a}:{b}")
    r = rows[0]
    d, lo, hi = (sign * r["difference"], *sorted((sign * r["ci_low"], sign * r["ci_high"])))
    obs = {"difference": d, "ci_low": lo, "ci_high": hi, "pvalue_holm": r["pvalue_holm"]}
    what = f"drop {a} - {b} at k={c.k}{_model_label(c.model)}"
    if r["interval_reliable"] is False:
        raise _ClaimError(f"the interval of {what} is flagged unreliable in token_importance_diffs (a few prompts "
                          "carry the difference), so its verdict cannot back this claim; rerun with more prompts (--n)",
                          observed=obs)
    verdict = r["verdict"]
    if sign < 0 and verdict != "inconclusive":  # the row's 'b < a' is the claim's 'a > b'
        verdict = f"{a} > {b}" if verdict == f"{b} < {a}" else f"{a} < {b}"
    holds = verdict == f"{a} > {b}"
    text = (f"{what}: {_fmt(d)} [{_fmt(lo)}, {_fmt(hi)}], Holm p = {_fmt(r['pvalue_holm'])}: verdict "
            f"{verdict!r} ({r['multiplicity']})")
    return holds, obs, text if holds else f"{text}, not '{a} > {b}'"


def _eval_sink_stability(c: SinkStability, run: _Run) -> tuple[bool, dict, str]:
    from stats.sink_matching import ITEMS as MATCHED_ITEMS

    table = "sink_matching" if c.item in MATCHED_ITEMS else "sink_stability"
    items = run.distinct(table, "item", layer=c.layer)
    if not items:
        raise _ClaimError(f"layer {c.layer} is not in the run's {table} (layers "
                          f"{run.distinct(table, 'layer')}; -1 is the whole model)")
    if c.item not in items:
        also = f"; or one of {list(MATCHED_ITEMS)} (sink_matching)" if table == "sink_stability" else ""
        raise _ClaimError(f"item {c.item!r} is not in the run's {table} for layer {c.layer} (items: {items}{also})")
    if c.statistic not in claimable(table):
        raise _ClaimError(f"{c.statistic} is not a column of {table} (claimable: {', '.join(claimable(table))})")
    where = f"{c.item} of layer {c.layer}" if c.layer >= 0 else c.item
    v = _scalar(run, table, c.statistic, where, layer=c.layer, item=c.item)
    (r,) = run.rows(table, ["value", "ci_low", "ci_high", "n_refits"], layer=c.layer, item=c.item)
    ok, reason = _bounded(v, c, f"{c.statistic} of {where}")
    detail = f"mean over {r['n_refits']} seeds {_fmt(r['value'])} [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]"
    if table == "sink_matching":
        (m,) = run.rows(table, ["null", "verdict", "matching"], layer=c.layer, item=c.item)
        detail = (f"mean over ordered pairs of {r['n_refits']} seeds {_fmt(r['value'])} [{_fmt(r['ci_low'])}, "
                  f"{_fmt(r['ci_high'])}], random matching {_fmt(m['null'])}, verdict {m['verdict']!r}; heads matched "
                  f"by {m['matching']}")
    return ok, {c.statistic: v}, f"{reason} ({detail})"


def _eval_token_stability(c: TokenStability, run: _Run) -> tuple[bool, dict, str]:
    part = _token_run(run, None, "token_stability", c.k, [c.measure])
    where = f"the top-{c.k} {c.measure} token Jaccard between seeds"
    v = _scalar(part, "token_stability", c.statistic, where, measure=c.measure, k=c.k)
    (r,) = part.rows("token_stability", ["jaccard", "chance"], measure=c.measure, k=c.k)
    ok, reason = _bounded(v, c, f"{c.statistic} of {where}")
    return ok, {c.statistic: v}, f"{reason} (Jaccard {_fmt(r['jaccard'])}, chance {_fmt(r['chance'])})"


_EVAL = {
    "edge_in_circuit": _eval_edge_in_circuit,
    "circuit_stability": _eval_circuit_stability,
    "faithfulness": _eval_faithfulness,
    "edge_effect": _eval_edge_effect,
    "head_stability": _eval_head_stability,
    "layer_stability": _eval_layer_stability,
    "approximation": _eval_approximation,
    "sink": _eval_sink,
    "token_importance": _eval_token_importance,
    "token_drop": _eval_token_drop,
    "sink_stability": _eval_sink_stability,
    "token_stability": _eval_token_stability,
}


@dataclass
class ClaimResult:
    """The outcome of one claim."""

    index: int
    claim: Any
    name: str
    status: Literal["pass", "fail", "error"]
    observed: dict[str, Any]
    bound: str
    reason: str
    missing: bool = False  # an error that running the audit (with a suitable spec) could fix
    seconds: float = 0.0

    @property
    def observed_text(self) -> str:
        if not self.observed:
            return "-"
        if len(self.observed) == 1:
            return _fmt(next(iter(self.observed.values())))
        return ", ".join(f"{k}={_fmt(v)}" for k, v in self.observed.items())

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.claim.kind, "status": self.status, "observed": self.observed,
                "bound": self.bound, "reason": self.reason,
                "description": getattr(self.claim, "description", None)}


def evaluate_claims(claims: ClaimsFile | list, run_dir: str | os.PathLike[str]) -> list[ClaimResult]:
    """Evaluate every claim against the run directory `run_dir`; never raises for a single claim.

    Raises InputError only when `run_dir` is not a readable run directory.
    """
    from reports.rundir import RunDirError

    items = claims.claims if isinstance(claims, ClaimsFile) else list(claims)
    path = Path(run_dir)
    if not path.is_dir():
        raise InputError(f"run directory {path} does not exist")
    try:
        run = _Run(path)
    except RunDirError as e:
        raise InputError(str(e)) from None
    if run.manifest is None and not any(path.glob("*.parquet")):
        raise InputError(f"{path} is not a run directory (no manifest.json and no Parquet tables)")
    results = []
    for i, c in enumerate(items):
        t0 = time.perf_counter()
        try:
            ok, obs, reason = _EVAL[c.kind](c, run)
            status, missing = ("pass" if ok else "fail"), False
        except _ClaimError as e:
            status, obs, reason, missing = "error", e.observed, e.reason, e.missing
        except Exception as e:  # a table of unexpected shape or type: report it on this claim only
            status, obs, missing = "error", {}, False
            reason = f"cannot be evaluated on this run ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
        results.append(ClaimResult(i, c, c.label(i), status, obs, _bound_text(c), reason, missing,
                                   time.perf_counter() - t0))
    return results


# ----------------------------------------------------------------------------------------------
# What the audit must include (checked against a spec before running it)
# ----------------------------------------------------------------------------------------------
def spec_problem(claim: Any, spec: Any) -> str | None:
    """Why running the audit of `spec` cannot answer `claim` (None when it can)."""
    methods = list(spec.methods)
    kind = claim.kind
    if kind in TOKEN_KINDS:
        return (f"{kind} claims are answered by `circuitstat tokens`, which the audit does not run; "
                "pass --run DIR of a tokens run")
    method = getattr(claim, "method", None)
    if method is not None and method not in methods:
        extra = " and 'exact'" if kind == "approximation" and "exact" not in methods else ""
        return f"method {method!r} is not in the spec's methods {methods}; add it{extra}"
    if kind == "approximation" and "exact" not in methods:
        return f"approximation is measured against 'exact', which is not in the spec's methods {methods}; add it"
    k = getattr(claim, "k", None)
    if k is not None and kind != "approximation" and k not in spec.k:
        return f"k={k} is not in the spec's k {list(spec.k)}; add it to the spec's k"
    if kind == "faithfulness" and not spec.faithfulness:
        return "the spec has 'faithfulness: false'; set it to true"
    if kind in ("head_stability", "layer_stability") and len(spec.sources) < 2:
        return "head stability needs several seeds; list two or more models under 'models:' in the spec"
    if kind == "head_stability":
        for key in ("match", "pairs"):
            want = getattr(claim, key)
            if want is not None and getattr(spec.heads, key) != want:
                return f"the claim asks for {key}={want!r} but the spec has heads.{key}: {getattr(spec.heads, key)}"
    return None


# ----------------------------------------------------------------------------------------------
# The check: claims file -> (maybe audit) -> results
# ----------------------------------------------------------------------------------------------
@dataclass
class CheckReport:
    """Results of a check, where they came from and the exit code they imply."""

    results: list[ClaimResult]
    run_dir: Path
    source: str
    ran_audit: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in ("pass", "fail", "error")}

    @property
    def exit_code(self) -> int:
        c = self.counts
        return 2 if c["error"] else (1 if c["fail"] else 0)


def _cache_dir() -> Path:
    from circuits.cache import cache_dir  # torch-free: check stays fast

    return cache_dir()


def default_run_dir(spec: Any, spec_path: Path) -> Path:
    """Where check puts the audit of `spec` when no run directory is given (content-addressed)."""
    doc = json.dumps(spec.model_dump(mode="json"), sort_keys=True)
    key = hashlib.sha256(doc.encode()).hexdigest()[:16]
    return _cache_dir() / "runs" / f"{spec_path.stem}-{key}"


def _is_complete(run_dir: Path) -> bool:
    if not (run_dir / "manifest.json").is_file():
        return False
    try:
        return not _Run(run_dir).unfinished
    except Exception:
        return False


def check(claims: str | os.PathLike[str] | ClaimsFile, run: str | os.PathLike[str] | None = None,
          *, echo=None, allow_outside: bool = False) -> CheckReport:
    """Load the claims (InputError if malformed), find or make the run, evaluate every claim.

    `run` overrides the file's ``run:``. The audit (pipelines.audit.run_audit) runs only when a spec
    is given and the run is missing, unfinished or lacks what a claim needs, and only after the spec
    was checked to contain everything the claims need. The file's ``run:`` and ``spec:`` must stay
    inside its directory tree unless `allow_outside` (``--allow-outside``).
    """
    cf = claims if isinstance(claims, ClaimsFile) else load_claims(claims)
    source = cf.source or "<claims>"
    say = echo or (lambda msg: None)
    spec_path = cf.spec_path(allow_outside)
    file_run = cf.run_path(allow_outside)  # checked even when --run overrides it: a bad file is bad
    spec = None
    if spec_path is not None:
        try:
            spec = _load_spec(spec_path, allow_outside=allow_outside)
        except InputError as e:
            raise InputError(f"{e} (the spec named by 'spec:' in {source})") from None
    run_dir = Path(run) if run is not None else file_run
    if run_dir is None:
        if spec is None:
            raise InputError(f"no run to check: pass --run DIR (a finished audit's run directory), "
                             f"or set 'run:' or 'spec:' in {source}")
        run_dir = default_run_dir(spec, spec_path)
    if run_dir.exists() and not run_dir.is_dir():
        raise InputError(f"run directory {run_dir} is a file; pass the run directory")

    report = CheckReport([], run_dir, source)
    have_run = run_dir.is_dir() and ((run_dir / "manifest.json").exists() or any(run_dir.glob("*.parquet")))
    if have_run:
        report.results = evaluate_claims(cf, run_dir)
        needs_audit = any(r.missing for r in report.results) or not _is_complete(run_dir)
        if not needs_audit or spec is None:
            if spec is None and any(r.missing and r.claim.kind not in TOKEN_KINDS for r in report.results):
                report.notes.append(f"give 'spec:' in {source} to let check run the audit these claims need")
            return report
    elif spec is None:
        raise InputError(f"run directory {run_dir} {'has no run' if run_dir.is_dir() else 'does not exist'}; "
                         f"pass --run DIR of a finished audit, or give 'spec:' in {source} so check can run the audit")

    # Run (or resume) the audit, but only if it can answer every claim.
    problems = [(i, spec_problem(c, spec)) for i, c in enumerate(cf.claims)]
    problems = [(i, p) for i, p in problems if p]
    if problems:
        results = report.results or [
            ClaimResult(i, c, c.label(i), "pass", {}, _bound_text(c), "", False) for i, c in enumerate(cf.claims)
        ]
        bad = dict(problems)
        out = []
        for r in results:
            if r.index in bad:
                out.append(ClaimResult(r.index, r.claim, r.name, "error", r.observed, r.bound,
                                       f"the audit of {spec_path} cannot answer this claim: {bad[r.index]}", True))
            elif not report.results or r.missing:
                out.append(ClaimResult(r.index, r.claim, r.name, "error", r.observed, r.bound,
                                       (r.reason + "; " if r.reason else "") + "not evaluated: the audit was not run "
                                       "because the spec cannot answer other claims", True))
            else:
                out.append(r)
        report.results = out
        return report

    from pipelines.audit import run_audit  # heavy (torch); only when an audit is needed

    say(f"running the audit of {spec_path} into {run_dir} ...")
    try:
        run_audit(spec, run_dir)
    except Exception as e:  # noqa: BLE001 - errors from building its model or task may quote the spec's values
        message = redacted_failure(e, f"the spec named by 'spec:' in {source}", f"circuitstat audit {spec_path} --out DIR")
        if message is None:
            raise
        raise InputError(message) from None
    report.ran_audit = True
    report.results = evaluate_claims(cf, run_dir)
    return report


# ----------------------------------------------------------------------------------------------
# Output: a table and JUnit XML
# ----------------------------------------------------------------------------------------------
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(s: Any) -> str:
    return _XML_BAD.sub("\ufffd", str(s))


def _one_line(s: str) -> str:
    return " ".join(str(s).split())


def format_results(results: list[ClaimResult], width: int = 48) -> str:
    """The results as an aligned text table: claim, status, observed, bound, reason."""
    head = ("claim", "status", "observed", "bound", "reason")
    rows = []
    for r in results:
        name = _one_line(r.name)
        if len(name) > width:
            name = name[: width - 3] + "..."
        rows.append((name, r.status.upper() if r.status != "pass" else "pass", _one_line(r.observed_text),
                     _one_line(r.bound), _one_line(r.reason)))
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(4)]
    lines = []
    for row in [head, *rows]:
        lines.append("  ".join(row[i].ljust(widths[i]) for i in range(4)) + "  " + row[4])
    return "\n".join(line.rstrip() for line in lines)


def junit_xml(results: list[ClaimResult], suite: str = "circuitstat check", seconds: float | None = None) -> bytes:
    """JUnit XML: one testcase per claim, with a <failure> or <error> element when it does not hold."""
    counts = {s: sum(r.status == s for r in results) for s in ("pass", "fail", "error")}
    total = seconds if seconds is not None else sum(r.seconds for r in results)
    attrs = {"name": _xml_text(suite), "tests": str(len(results)), "failures": str(counts["fail"]),
             "errors": str(counts["error"]), "skipped": "0", "time": f"{total:.3f}"}
    root = ET.Element("testsuites", attrs)
    ts = ET.SubElement(root, "testsuite", {**attrs, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S")})
    for r in results:
        tc = ET.SubElement(ts, "testcase", {"classname": f"circuitstat.claims.{r.claim.kind}",
                                            "name": _xml_text(r.name), "time": f"{r.seconds:.3f}"})
        details = f"bound: {r.bound}\nobserved: {r.observed_text}\nreason: {r.reason}"
        desc = getattr(r.claim, "description", None)
        if desc:
            details = f"claim: {desc}\n" + details
        if r.status == "fail":
            ET.SubElement(tc, "failure", {"message": _xml_text(r.reason), "type": "ClaimFailed"}).text = _xml_text(details)
        elif r.status == "error":
            ET.SubElement(tc, "error", {"message": _xml_text(r.reason), "type": "ClaimError"}).text = _xml_text(details)
        ET.SubElement(tc, "system-out").text = _xml_text(details)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def write_junit(results: list[ClaimResult], path: str | os.PathLike[str], suite: str = "circuitstat check") -> Path:
    """Write JUnit XML for `results` to `path` atomically and return the path."""
    from reports.atomic import atomic_write_bytes

    return atomic_write_bytes(path, junit_xml(results, suite))


# ----------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------


