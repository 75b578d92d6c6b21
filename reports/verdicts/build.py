"""Building the verdict from a run's tables: the chosen k, the circuit's edges and one line per finding.

Each builder reads exactly the columns the claims check reads by default for its kind (pipelines/
claims/evaluators.py reads ``c.statistic`` of the kind's table; core/schema.py marks which are
claimable and what each interval covers) and returns its `Line` (or none when the run lacks the table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from circuitstat.reports.analyses import missing
from circuitstat.reports.ci import Ci, fmt
from circuitstat.reports.tableset import Tables, ints, methods_in, num, order_methods, rows, where
from circuitstat.reports.verdicts.model import (APPROX_RULES, BAR, CLAIM_SECTIONS, NEEDS_SEEDS, SIGNIFICANT_Q, TOP_EDGES, Line, Name,
                                    Part, Quote, Verdict, against_bar, run_spec)

__all__ = ["choose_k", "circuit_edges", "primary_method", "verdict"]


def _ks(T: Tables, method: str) -> list[int]:
    """Return the run's k grid for `method` (from stability_vs_k, faithfulness_vs_k or inclusion)."""
    for name in ("stability_vs_k", "faithfulness_vs_k", "inclusion"):
        ks = sorted({int(r["k"]) for r in rows(T.get(name), method=method) if r.get("k") is not None})
        if ks:
            return ks
    return []


def choose_k(T: Tables, method: str) -> tuple[int | None, str]:
    """Return (k, why): the circuit size the verdict and the graph show (the rule of circuitstat.reports.verdicts)."""
    ks = _ks(T, method)
    if not ks:
        return None, "the run has no k grid"
    f = {int(r["k"]): r for r in rows(T.get("faithfulness_vs_k"), method=method)}
    for col, what in (("f_selected_ci_low", "selection-aware"), ("f_ci_low", "fixed-circuit")):
        low = {k: math.nan if r.get(col) is None else float(r[col]) for k, r in f.items()}
        if not any(math.isfinite(v) for v in low.values()):
            continue
        grid = sorted(low, reverse=True)
        chosen = None
        for k in grid:  # fixed sequence: stop at the first k that fails
            if not low[k] >= BAR:
                break
            chosen = k
        if chosen is not None:
            return chosen, (f"the smallest k whose {what} faithfulness lower bound, like every larger k's, is ≥ {BAR} "
                            f"(fixed-sequence test down from k = {grid[0]})")
        return grid[0], f"no k reaches a {what} faithfulness lower bound of {BAR}, so the largest k"
    return ks[0], "faithfulness was not run, so the smallest k of the grid"


def circuit_edges(T: Tables, method: str, k: int, ranking: str) -> list[dict[str, Any]]:
    """Return the edge_stats rows of the top-k circuit of `method`'s mean scores, in rank order (ties: lower edge)."""
    es = where(T.get("edge_stats"), method=method)
    if es is None or not es.num_rows:
        return []
    est = num(es, "estimate")
    key = np.abs(est) if ranking == "absolute" else est
    key = np.where(np.isfinite(key), key, -np.inf)
    order = np.lexsort((ints(es, "edge"), -key))[:k]
    return es.take(pa.array(order)).to_pylist()


def primary_method(T: Tables) -> str | None:
    """Return the method the verdict is about: exact when the run has it, else the first method."""
    found: list[str] = []
    for name in ("edge_stats", "stability_vs_k", "faithfulness_vs_k", "inclusion"):
        found += methods_in(T.get(name))
    methods = order_methods(found)
    return methods[0] if methods else None


@dataclass(frozen=True)
class _Run:
    """What every line builder reads: the tables, the method and k, and the spec's settings."""

    T: Tables
    method: str | None
    k: int | None
    why_k: str
    ranking: str
    n: int | None  # prompts


def _prompts(r: _Run) -> str:
    return f"{r.n} prompts" if r.n else "N prompts"


def _circuit_lines(r: _Run) -> list[Line]:
    """The circuit at the chosen k and its top edges with their intervals and BH q-values."""
    if r.method is None or r.k is None or not r.T.has("edge_stats"):
        return []
    n_edges = where(r.T.get("edge_stats"), method=r.method).num_rows
    edges = circuit_edges(r.T, r.method, r.k, r.ranking)
    rank = "|effect|" if r.ranking == "absolute" else "signed effect"
    circuit = Line("circuit", f"top {r.k} of {n_edges:,} edges", "info",
                   (f"{r.method} effects ranked by {rank}; k = {r.k}: {r.why_k}",), "graph")
    parts: list[Part] = []
    for i, e in enumerate(edges[:TOP_EDGES]):
        parts += ["; " if i else "", Name(e["name"]), " ", Ci.of("edge_stats", e, ("method", "edge"), est="estimate"),
                  f" q = {fmt(e.get('q'), 2)}"]
    n_sig = sum(1 for e in edges if e.get("q") is not None and e["q"] <= SIGNIFICANT_Q)
    shown = min(TOP_EDGES, len(edges))
    parts.append(f" ({shown} of {len(edges)} shown)")
    top = Line("top edges", f"{n_sig} of {len(edges)} significant", "info", tuple(parts), "forest")
    return [circuit, top]


def _stability_line(r: _Run) -> list[Line]:
    """Data-level stability of the top-k circuit (jaccard_data_ci_*) against the bar, with chance beside it."""
    found = rows(r.T.get("stability_vs_k"), method=r.method, k=r.k) if r.k is not None else []
    if not found:
        return []
    row = found[0]
    if "jaccard_data_ci_low" not in row:
        return [Line("stability", "no data-level interval", "unsure",
                     ("this run predates data-level stability intervals; rerun the audit to get them",), "stability")]
    ci = Ci.of("stability_vs_k", row, ("method", "k"), "jaccard_data_ci", est="jaccard_data",
               unavailable="undefined in stability_vs_k")
    chance = row.get("jaccard_chance")
    verdict, tone = against_bar(ci, "stable", "unstable")
    if tone == "good" and chance is not None and not ci.lo > chance:
        verdict, tone = "no better than chance", "bad"
    parts = (f"expected Jaccard between the top-{r.k} circuits of two independent sets of {_prompts(r)} ", ci,
             f"; bar {BAR}, chance {fmt(chance)}")
    return [Line("stability", verdict, tone, parts, "stability")]


def _faithfulness_line(r: _Run) -> list[Line]:
    """Selection-aware faithfulness (f_selected_ci_*) of the circuit at k; the fixed circuit's only without it."""
    found = rows(r.T.get("faithfulness_vs_k"), method=r.method, k=r.k) if r.k is not None else []
    if not found:
        return []
    row = found[0]
    ci = Ci.of("faithfulness_vs_k", row, ("method", "k"), "f_selected_ci", est="f_selected", decimals=3)
    parts: tuple[Part, ...]
    if ci.defined:
        parts = (f"faithfulness of the top-{r.k} circuit selected from {_prompts(r)}, selection included ", ci,
                 f"; bar {BAR}") + _smaller_k(r)
    else:
        ci = Ci.of("faithfulness_vs_k", row, ("method", "k"), "f_ci", est="f_ratio", decimals=3)
        why = row.get("f_selected_note") or "not computed"
        parts = (f"no selection-aware interval ({why}); this fixed top-{r.k} circuit ", ci, f"; bar {BAR}")
    verdict, tone = against_bar(ci, "faithful", "not faithful")
    return [Line("faithfulness", verdict, tone, parts, "faithfulness")]


def _smaller_k(r: _Run) -> tuple[Part, ...]:
    """The next smaller k of the grid with its selection-aware interval: why the chosen k is not smaller."""
    below = [x for x in rows(r.T.get("faithfulness_vs_k"), method=r.method) if r.k is not None and x["k"] < r.k]
    if not below:
        return ()
    row = max(below, key=lambda x: x["k"])
    return (f"; at k = {row['k']}: ", Ci.of("faithfulness_vs_k", row, ("method", "k"), "f_selected_ci", est="f_selected", decimals=3))


def _approximation_lines(r: _Run) -> list[Line]:
    """Each approximate method's rank agreement with exact (approximation_summary; no interval there)."""
    out = []
    by_method: dict[str, dict[str, Any]] = {}
    for row in rows(r.T.get("approximation_summary")):  # one row per method (older runs: one per k; the chosen k's)
        if row["method"] not in by_method or row.get("k") == r.k:
            by_method[row["method"]] = row
    for row in by_method.values():
        rho = row.get("spearman")
        rho = math.nan if rho is None else float(rho)
        verdict, tone = next(((v, t) for bar, v, t in APPROX_RULES if rho >= bar), ("no agreement measured", "unsure"))
        text = (f"{row['method']} vs exact: Spearman {fmt(rho)}, Kendall {fmt(row.get('kendall'))}, "
                f"top-{row.get('k')} overlap {fmt(row.get('top_k_overlap'))}, R² {fmt(row.get('r2'))}")
        out.append(Line("approximation", f"{row['method']}: {verdict}", tone, (text,), "approximation"))
    return out


def _verified_lines(r: _Run) -> list[Line]:
    """Each approximate method's verified line (circuitstat.reports.verdicts.verified: verified and missed_edges)."""
    from circuitstat.reports.verdicts.verified import verified_edge_lines

    return verified_edge_lines(r.T)


def _heads_line(r: _Run) -> list[Line]:
    """The head with the largest excess over its shuffled null, its interval over seeds, and the count above 0."""
    t = r.T.get("heads")
    if t is None or not t.num_rows or "excess" not in t.column_names:
        return []
    hs = t.to_pylist()
    n_refits = int(np.nanmax(num(t, "n_refits"))) if np.isfinite(num(t, "n_refits")).any() else 0
    if n_refits <= 0 and not np.isfinite(num(t, "excess")).any():
        return []  # a run written before the across-seed intervals: its heads section shows what it has
    best = max(hs, key=lambda h: -math.inf if h["excess"] is None or math.isnan(h["excess"]) else h["excess"])
    key = tuple(c for c in ("layer", "head", "match", "pairs") if c in t.column_names)
    few = 0 < n_refits < 3
    ci = Ci.of("heads", best, key, "excess_ci", est="excess", unavailable=NEEDS_SEEDS if few else "")
    above = sum(1 for h in hs if h.get("excess_ci_low") is not None and h["excess_ci_low"] > 0)
    verdict = NEEDS_SEEDS if few else f"{above} of {len(hs)} heads above their null"
    parts = (f"{n_refits} seeds; largest excess over the shuffled null: ", Name(f"a{best['layer']}.h{best['head']}"), " ", ci,
             f" (stability {fmt(best['stability'])}, null {fmt(best.get('null_mean'))})")
    return [Line("heads", verdict, "unsure" if few else "info", parts, "heads")]


def _claim_lines(r: _Run) -> list[Line]:
    """One line per claim of the claims table `circuitstat check` left in the run."""
    words = {"pass": ("holds", "good"), "fail": ("fails", "bad"), "error": ("cannot be evaluated", "unsure")}
    out = []
    for c in rows(r.T.get("claims")):
        verdict, tone = words.get(c.get("status") or "", (c.get("status") or "?", "unsure"))
        # the reason is quoted as the check recorded it (its numbers are what the check read then)
        reason = Quote("claims", (("index", c.get("index")),), "reason", str(c.get("reason") or ""))
        out.append(Line("claim", verdict, tone, (f"{c.get('name')}: ", reason),
                        CLAIM_SECTIONS.get(c.get("kind") or "", "tokens")))
    return out


def _rules(lines: list[Line], level: float, n_edges: int | None) -> tuple[str, ...]:
    """The rules of the verdicts present, multiplicity included."""
    have = {ln.label for ln in lines}
    if not lines:
        return ()
    out = [f"Intervals are {level:.0%} intervals of the column the claims check reads; each verdict reads one, "
           "not adjusted across the lines."]
    if "circuit" in have:
        out.append(f"k: fixed-sequence test down the k grid (family-wise {1 - level:.0%} over the grid, no "
                   "adjustment needed).")
    if {"stability", "faithfulness"} & have:
        out.append(f"Stability and faithfulness: above the bar {BAR} → stable / faithful, below → unstable / "
                   "not faithful, across → inconclusive.")
    if "top edges" in have:
        out.append(f"Edges: Benjamini–Hochberg q ≤ {SIGNIFICANT_Q} over all {f'{n_edges:,}' if n_edges else 'the'} edges; ! = the "
                   "interval rests on a few prompts (interval_reliable = false).")
    if "approximation" in have:
        out.append("Approximation: Spearman ≥ 0.9 ranks like exact, ≥ 0.5 a rough guide, below that does not.")
    if "verified" in have:
        out.append(f"Verified: intervals for the mean exact effect (PPI++, exact on a random subset of prompts); "
                   f"edges: BH q ≤ {SIGNIFICANT_Q} over the verified edges; missed edges: a one-sided bound at the "
                   "level stated.")
    if "heads" in have:
        out.append("Heads: each head's own interval over training seeds, not adjusted over heads.")
    return tuple(out)


def verdict(run_dir: str | Path) -> Verdict:
    """Return the one-screen verdict of the run directory `run_dir` (lines for what its tables hold)."""
    T = Tables(Path(run_dir))
    spec = run_spec(T.dir)
    method = primary_method(T)
    k, why = choose_k(T, method) if method else (None, "")
    boot = spec.get("bootstrap") if isinstance(spec.get("bootstrap"), dict) else {}
    level = float(boot.get("confidence_level") or 0.95)
    es = T.get("edge_stats")
    n = int(np.nanmax(num(es, "n"))) if es is not None and es.num_rows and np.isfinite(num(es, "n")).any() else None
    r = _Run(T, method, k, why, str(spec.get("ranking") or "absolute"), n)
    lines: list[Line] = []
    for build in (_circuit_lines, _stability_line, _faithfulness_line, _approximation_lines, _verified_lines,
                  _heads_line, _claim_lines):
        lines += build(r)
    n_edges = where(es, method=method).num_rows if method and es is not None else None
    return Verdict(T.dir, method, k, tuple(lines), tuple(missing(T)), _rules(lines, level, n_edges), level)
