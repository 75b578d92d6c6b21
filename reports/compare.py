"""Two runs side by side: per-edge estimates with their intervals, stability against k, faithfulness and
claims verdicts, joined on the keys the tables share (``circuitstat compare RUN_A RUN_B`` and the service's
``GET /api/v1/jobs/{a}/compare/{b}`` both return this).

It computes no statistic: rows are joined (edges on method and edge name, stability and faithfulness on
method and k, claims on the claim's name) and differences are taken (B minus A). Whether two intervals
overlap is read off their ends; non-overlap is a flag for a reader to look at, not a test (two 95%
intervals that overlap can still differ at the 5% level, and many edges are flagged by chance alone).
Every interval keeps the estimand its run names (``edge_stats.estimand``, the schema's data-level
stability and selection-aware faithfulness), and runs whose estimands differ say so in a note.

Runs of different models or graphs are refused unless their edge sets intersect; then only the shared
edges are comparable and a note says how many edges each run alone has.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from circuitstat.core.errors import InputError
from circuitstat.core.schema_core import DATA_JACCARD, HALF_JACCARD, MC_JACCARD, SELECTED_F

__all__ = ["RunInfo", "RunComparison", "compare_tables", "compare_runs", "read_run", "COMPARED_TABLES"]

COMPARED_TABLES = ("edges", "edge_stats", "stability_vs_k", "faithfulness_vs_k", "claims")
EDGE_VALUES = ("estimate", "ci_low", "ci_high", "q", "no_tail_seen", "estimand")
# the primary data-level stability first (J_{N/2}, exactly estimable), then J_N (extrapolated) and the MC point
STABILITY_VALUES = ("jaccard_half", "jaccard_half_ci_low", "jaccard_half_ci_high", "jaccard_data",
                    "jaccard_data_ci_low", "jaccard_data_ci_high", "jaccard_mean")
# (the column compared, its interval's ends, its estimand): J_{N/2}, else (a run written before it) J_N
STABILITY_LEADS = (("jaccard_half", "jaccard_half_ci_low", "jaccard_half_ci_high", HALF_JACCARD),
                   ("jaccard_data", "jaccard_data_ci_low", "jaccard_data_ci_high", DATA_JACCARD))
FAITH_VALUES = ("f_selected", "f_selected_ci_low", "f_selected_ci_high", "f_ratio", "f_ci_low", "f_ci_high", "cpr")


@dataclass(frozen=True)
class RunInfo:
    """What a comparison says about one run: its label (a path or a job id), models, methods and edge count."""

    label: str
    models: tuple[str, ...]
    methods: tuple[str, ...]
    n_edges: int
    confidence_level: float | None = None
    weight_hash: str | None = None  # the first model's, from the manifest's provenance: same weights, same model
    spec: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)  # its differences become a note


def _num(v: Any) -> float:
    """``v`` as a float (None and non-numbers -> NaN)."""
    if isinstance(v, bool) or v is None:
        return math.nan if v is None else float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def overlap(lo_a: float, hi_a: float, lo_b: float, hi_b: float) -> bool | None:
    """Whether [lo_a, hi_a] and [lo_b, hi_b] share a point; None when an end is missing (NaN)."""
    ends = [_num(x) for x in (lo_a, hi_a, lo_b, hi_b)]
    if any(math.isnan(x) for x in ends):
        return None
    return not (ends[1] < ends[2] or ends[3] < ends[0])


def _side_table(t: pa.Table | None, keys: Sequence[str], values: Sequence[str], suffix: str) -> pa.Table | None:
    """``t``'s key columns and the ``values`` it has (renamed ``<value>_<suffix>``) plus ``in_<suffix>``; None
    without the table or a key column."""
    if t is None or any(k not in t.column_names for k in keys):
        return None
    have = [c for c in values if c in t.column_names]
    out = t.select([*keys, *have]).rename_columns([*keys, *(f"{c}_{suffix}" for c in have)])
    return out.append_column(f"in_{suffix}", pa.array(np.ones(t.num_rows, dtype=bool)))


def _floats(t: pa.Table, col: str) -> np.ndarray:
    """Column ``col`` of ``t`` as float64 (nulls, absent columns and non-numbers -> NaN)."""
    if col not in t.column_names or not (pa.types.is_floating(t.column(col).type)
                                         or pa.types.is_integer(t.column(col).type)):
        return np.full(t.num_rows, np.nan)
    return t.column(col).cast(pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64)


def _optional(values: np.ndarray, defined: np.ndarray) -> list:
    """``values`` as Python values, None where not ``defined``."""
    return [v if d else None for v, d in zip(values.tolist(), defined.tolist())]


def _join(ta: pa.Table | None, tb: pa.Table | None, keys: Sequence[str], values: Sequence[str],
          lo: str | None, hi: str | None, estimate: str | None) -> list[dict]:
    """Full outer join of two tables on ``keys`` (pyarrow's hash join; a key repeated in a table gives a row per
    pair, nothing is dropped): both sides' ``values``, B - A of ``estimate`` and whether the intervals
    ``lo``..``hi`` overlap (None unless both ends of both are there); sorted by the keys."""
    a, b = _side_table(ta, keys, values, "a"), _side_table(tb, keys, values, "b")
    if a is None and b is None:
        return []
    if a is None or b is None:
        j = a if b is None else b
    else:
        j = a.join(b, keys=list(keys), join_type="full outer", coalesce_keys=True)
    j = j.sort_by([(k, "ascending") for k in keys])
    in_a = np.asarray(j.column("in_a").fill_null(False)) if "in_a" in j.column_names else np.zeros(j.num_rows, bool)
    in_b = np.asarray(j.column("in_b").fill_null(False)) if "in_b" in j.column_names else np.zeros(j.num_rows, bool)
    rows = j.drop_columns([c for c in ("in_a", "in_b") if c in j.column_names]).to_pylist()
    extra: dict[str, list] = {"in_a": in_a.tolist(), "in_b": in_b.tolist()}
    if estimate is not None:
        d = _floats(j, f"{estimate}_b") - _floats(j, f"{estimate}_a")
        extra["difference"] = _optional(d, np.isfinite(d))
    if lo is not None and hi is not None:
        la, ha, lb, hb = (_floats(j, f"{c}_{s}") for s, c in (("a", lo), ("a", hi), ("b", lo), ("b", hi)))
        defined = in_a & in_b & np.isfinite(la) & np.isfinite(ha) & np.isfinite(lb) & np.isfinite(hb)
        extra["overlap"] = _optional(~((ha < lb) | (hb < la)), defined)
    names = [*keys, "in_a", "in_b", *(f"{c}_{s}" for s in "ab" for c in values), *(k for k in extra if k not in ("in_a", "in_b"))]
    return [{n: (extra[n][i] if n in extra else r.get(n)) for n in names} for i, r in enumerate(rows)]


def _edge_names(tables: Mapping[str, pa.Table | None]) -> set[str]:
    """The run's edge names: its edge index, else the names its edge_stats holds."""
    for name in ("edges", "edge_stats"):
        t = tables.get(name)
        if t is not None and "name" in t.column_names:
            return set(t.column("name").to_pylist())
    return set()


def _check_comparable(ta: Mapping, tb: Mapping, a: RunInfo, b: RunInfo) -> tuple[set[str], list[str]]:
    """(shared edge names, notes); InputError when a run has no per-edge table or the edge sets are disjoint."""
    for tables, info in ((ta, a), (tb, b)):
        if tables.get("edge_stats") is None:
            raise InputError(f"run {info.label} has no edge_stats table; compare two audit runs (the --out "
                             "directories of `circuitstat audit`)")
    ea, eb = _edge_names(ta), _edge_names(tb)
    shared = ea & eb
    if not shared:
        models = f"{', '.join(a.models) or '?'} and {', '.join(b.models) or '?'}"
        raise InputError(f"runs {a.label} and {b.label} share no edge ({len(ea)} and {len(eb)} edges; models "
                         f"{models}): they are runs of different models or graphs, whose edges cannot be compared; "
                         "compare two runs of the same model (or of models with the same graph)")
    notes = []
    if a.models != b.models:
        notes.append(_model_note(a, b))
    if ea != eb:
        notes.append(f"the edge sets differ: {len(shared)} shared, {len(ea - eb)} only in A, {len(eb - ea)} only "
                     "in B; an edge in one run only has no difference")
    return shared, notes


def _model_note(a: RunInfo, b: RunInfo) -> str:
    """What differently named models are: the same weights (equal weight hashes), different ones, or unknown."""
    names = f"{', '.join(a.models) or '?'} vs {', '.join(b.models) or '?'}"
    if a.weight_hash and a.weight_hash == b.weight_hash:
        return (f"the runs name their model differently ({names}) but its weights are the same (weight hash "
                f"{a.weight_hash[:12]}): the same model")
    if a.weight_hash and b.weight_hash:
        return (f"the runs are of different models ({names}; weight hashes {a.weight_hash[:12]} and "
                f"{b.weight_hash[:12]}); edges are joined by name")
    return f"the runs name different models ({names}; no weight hash recorded to tell); edges are joined by name"


#: spec keys whose difference between the runs is no explanation of their numbers (where outputs go, workers)
_SPEC_IGNORED = ("models", "model", "n_jobs", "scheduler", "device")
SPEC_SHOWN = 8


def _flat(doc: Any, prefix: str = "") -> dict[str, Any]:
    """``doc`` flattened to {"a.b": value} (lists kept whole)."""
    if not isinstance(doc, Mapping):
        return {prefix: doc}
    out: dict[str, Any] = {}
    for k, v in doc.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, Mapping) else {f"{prefix}{k}": v})
    return out


def spec_difference(spec_a: Mapping[str, Any] | None, spec_b: Mapping[str, Any] | None) -> list[str]:
    """The spec keys whose values differ between two runs, as 'key (A: x, B: y)' (models, workers left out)."""
    if not spec_a or not spec_b:
        return []
    fa, fb = _flat(spec_a), _flat(spec_b)
    keys = sorted(k for k in set(fa) | set(fb) if k.split(".")[0] not in _SPEC_IGNORED and fa.get(k) != fb.get(k))
    return [f"{k} (A: {fa.get(k, '-')}, B: {fb.get(k, '-')})" for k in keys]


def _spec_note(a: RunInfo, b: RunInfo) -> list[str]:
    diff = spec_difference(a.spec, b.spec)
    if not diff:
        return []
    more = f", and {len(diff) - SPEC_SHOWN} more" if len(diff) > SPEC_SHOWN else ""
    return [f"the specs differ in {'; '.join(diff[:SPEC_SHOWN])}{more}: what changes the intervals (e.g. "
            "bootstrap.scheme: clusters resample whole templates) is among these"]


def _estimand_notes(edges: list[dict]) -> list[str]:
    differ = sum(1 for r in edges if r["in_a"] and r["in_b"] and r["estimand_a"] != r["estimand_b"])
    if not differ:
        return []
    return [f"{differ} edge rows have intervals for different estimands in A and B (columns estimand_a, "
            "estimand_b): their overlap flag compares different quantities"]


@dataclass
class RunComparison:
    """Two runs side by side (B minus A); ``summary()`` prints it, ``to_dict()`` is its JSON."""

    a: RunInfo
    b: RunInfo
    edges: list[dict]
    stability: list[dict]
    faithfulness: list[dict]
    claims: list[dict] | None
    notes: list[str] = field(default_factory=list)
    estimands: dict[str, str] = field(default_factory=dict)

    @property
    def flagged_edges(self) -> list[dict]:
        """Edge rows in both runs whose intervals do not overlap."""
        return [r for r in self.edges if r["overlap"] is False]

    def counts(self) -> dict[str, int]:
        """Edge rows in both runs, in A only, in B only, and those flagged (intervals apart)."""
        return {"edges_both": sum(r["in_a"] and r["in_b"] for r in self.edges),
                "edges_only_a": sum(r["in_a"] and not r["in_b"] for r in self.edges),
                "edges_only_b": sum(r["in_b"] and not r["in_a"] for r in self.edges),
                "edges_flagged": len(self.flagged_edges),
                "stability_flagged": sum(r["overlap"] is False for r in self.stability),
                "faithfulness_flagged": sum(r["overlap"] is False for r in self.faithfulness),
                "claims_changed": sum(bool(r["changed"]) for r in self.claims or [])}

    def to_dict(self) -> dict[str, Any]:
        """Return the comparison as plain JSON (NaN as null): runs, counts, notes, estimands and every row."""
        from circuitstat.core.query import json_rows

        info = {k: {"label": r.label, "models": list(r.models), "methods": list(r.methods), "n_edges": r.n_edges,
                    "confidence_level": r.confidence_level, "weight_hash": r.weight_hash}
                for k, r in (("a", self.a), ("b", self.b))}
        return json_rows({"runs": info, "counts": self.counts(), "notes": list(self.notes),
                          "estimands": dict(self.estimands), "edges": self.edges, "stability": self.stability,
                          "faithfulness": self.faithfulness, "claims": self.claims})

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> RunComparison:
        """Return the comparison that :meth:`to_dict` gave ``doc`` (the server's JSON), for its summary and page."""
        runs = {k: RunInfo(str(r["label"]), tuple(r["models"]), tuple(r["methods"]), int(r["n_edges"]),
                           r.get("confidence_level"), r.get("weight_hash")) for k, r in doc["runs"].items()}
        return cls(runs["a"], runs["b"], list(doc["edges"]), list(doc["stability"]), list(doc["faithfulness"]),
                   None if doc.get("claims") is None else list(doc["claims"]), list(doc.get("notes", [])),
                   dict(doc.get("estimands", {})))

    def summary(self, top: int = 20) -> str:
        """Return the comparison as text: the runs, counts and notes, then the edges whose intervals do not
        overlap and the ``top`` largest differences, stability and faithfulness against k, and claims."""
        from circuitstat.reports.compare_text import summary_text

        return summary_text(self, top)


def compare_tables(tables_a: Mapping[str, pa.Table | None], tables_b: Mapping[str, pa.Table | None],
                   a: RunInfo, b: RunInfo) -> RunComparison:
    """Return the comparison of two runs' tables ({name: table or None}, names of COMPARED_TABLES);
    InputError when they cannot be compared (no edge_stats, or no shared edge)."""
    _, notes = _check_comparable(tables_a, tables_b, a, b)
    edges = _join(tables_a.get("edge_stats"), tables_b.get("edge_stats"), ("method", "name"), EDGE_VALUES,
                  "ci_low", "ci_high", "estimate")
    lead, lo, hi, lead_estimand, lead_note = _stability_lead(tables_a, tables_b, a, b)
    stability = _join(tables_a.get("stability_vs_k"), tables_b.get("stability_vs_k"), ("method", "k"),
                      STABILITY_VALUES, lo, hi, lead)
    notes += lead_note
    faith = _join(tables_a.get("faithfulness_vs_k"), tables_b.get("faithfulness_vs_k"), ("method", "k"),
                  FAITH_VALUES, "f_selected_ci_low", "f_selected_ci_high", "f_selected")
    claims = None
    if tables_a.get("claims") is not None and tables_b.get("claims") is not None:
        claims = _join(tables_a["claims"], tables_b["claims"], ("name",), ("kind", "status", "observed"),
                       None, None, None)
        for r in claims:
            r["changed"] = r["in_a"] and r["in_b"] and r["status_a"] != r["status_b"]
    else:
        missing = [i.label for t, i in ((tables_a, a), (tables_b, b)) if t.get("claims") is None]
        notes.append(f"no claims verdicts compared: no claims table in {' nor '.join(missing)} (run "
                     "`circuitstat check CLAIMS --run RUN` on both)")
    notes += _spec_note(a, b)
    if a.confidence_level != b.confidence_level:
        notes.append(f"the runs' intervals have different levels ({a.confidence_level} vs {b.confidence_level})")
    notes += _estimand_notes(edges)
    estimands = {"edges": "each run's edge_stats.estimand (columns estimand_a, estimand_b)",
                 "stability": f"{lead}: {lead_estimand}; "
                              + ("" if lead == "jaccard_data" else f"jaccard_data: {DATA_JACCARD} (extrapolated); ")
                              + f"jaccard_mean: point estimate only ({MC_JACCARD})",
                 "faithfulness": f"f_selected: {SELECTED_F}; f_ratio with f_ci: the fixed circuit (selection not "
                                 "included)"}
    return RunComparison(a, b, edges, stability, faith, claims, notes, estimands)


def _stability_lead(ta: Mapping, tb: Mapping, a: RunInfo, b: RunInfo) -> tuple[str, str, str, str, list[str]]:
    """(column, interval ends, estimand, notes) the stability rows are compared on: J_{N/2} when both runs have it,
    else J_N (extrapolated), with a note naming the run that lacks J_{N/2} (one written before it existed)."""
    lacking = [i.label for t, i in ((ta, a), (tb, b)) if t.get("stability_vs_k") is not None
               and not _has_values(t["stability_vs_k"], STABILITY_LEADS[0][0])]
    if not lacking:
        return (*STABILITY_LEADS[0], [])
    return (*STABILITY_LEADS[1], [f"stability compared on J_N (jaccard_data, extrapolated), not J_{{N/2}}: "
                                  f"{' nor '.join(lacking)} has no jaccard_half (written before J_{{N/2}} existed, or "
                                  "without data-level intervals); rerun it to compare the primary quantity"])


def _has_values(t: pa.Table, col: str) -> bool:
    """Whether table ``t`` has column ``col`` with at least one finite value."""
    return bool(np.isfinite(_floats(t, col)).any())


def _info(label: str, manifest: dict, tables: Mapping[str, pa.Table | None], models: Sequence[str] | None) -> RunInfo:
    spec = manifest.get("spec") if isinstance(manifest.get("spec"), dict) else {}
    if models is None:
        found = spec.get("models") if isinstance(spec.get("models"), list) else [spec.get("model")]
        models = [str(m) for m in found if m is not None]
    t = tables.get("edge_stats")
    methods = list(dict.fromkeys(t.column("method").to_pylist())) if t is not None and "method" in t.column_names else []
    boot = spec.get("bootstrap") if isinstance(spec.get("bootstrap"), dict) else {}
    level = boot.get("confidence_level", 0.95 if spec else None)
    prov = manifest.get("provenance") if isinstance(manifest.get("provenance"), dict) else {}
    model = prov.get("model") if isinstance(prov.get("model"), dict) else {}
    digest = model.get("weight_hash")
    return RunInfo(label, tuple(models), tuple(methods), len(_edge_names(tables)),
                   float(level) if isinstance(level, (int, float)) else None,
                   digest if isinstance(digest, str) and digest else None, spec or None)


def read_run(path: str | os.PathLike[str], label: str | None = None,
             models: Sequence[str] | None = None, *,
             trust_unrecorded: bool = False) -> tuple[dict[str, pa.Table | None], RunInfo]:
    """Return ({table name: table or None}, RunInfo) of the run directory ``path``, after checking its tables
    are the ones it wrote (IntegrityError otherwise; circuitstat.core.run_check); ``label`` and ``models``
    override what is shown."""
    from circuitstat.core.rundir import RunDir, RunDirError
    from circuitstat.core.run_check import verify_outputs
    from circuitstat.core.tables import read_table

    run = Path(path)
    label = str(path) if label is None else label
    if not run.is_dir():
        raise InputError(f"run directory {label} does not exist; give the --out directory of an audit")
    verify_outputs(run, trust_unrecorded=trust_unrecorded)
    tables = {n: (read_table(run / f"{n}.parquet") if (run / f"{n}.parquet").is_file() else None)
              for n in COMPARED_TABLES}
    try:
        manifest = RunDir.read_manifest(run)
    except RunDirError:
        manifest = {}
    return tables, _info(label, manifest, tables, models)


def compare_runs(run_a: str | os.PathLike[str], run_b: str | os.PathLike[str], *,
                 labels: Sequence[str] | None = None,
                 models: Sequence[Sequence[str] | None] = (None, None),
                 trust_unrecorded: bool = False) -> RunComparison:
    """Return the comparison of run directories ``run_a`` and ``run_b`` (B minus A); ``labels`` name them
    in the output (default: the paths as given), ``models`` override the models the manifests name."""
    la, lb = labels if labels is not None else (str(run_a), str(run_b))
    ta, ia = read_run(run_a, la, models[0], trust_unrecorded=trust_unrecorded)
    tb, ib = read_run(run_b, lb, models[1], trust_unrecorded=trust_unrecorded)
    return compare_tables(ta, tb, ia, ib)
