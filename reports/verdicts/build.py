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
from circuitstat.reports.ci import Ci, covers, fmt
from circuitstat.reports.tableset import Tables, ints, methods_in, num, order_methods, rows, where
from circuitstat.reports.verdicts.model import (APPROX_RULES, BAR, CLAIM_SECTIONS, MIN_EXCESS, MIN_EXCESS_BOUNDS, NEEDS_SEEDS,
                                    SIGNIFICANT_Q, TOP_EDGES, Line, Name, Part, Quote, Verdict, against_bar, run_spec)

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
    searched = sum(1 for r in f.values() if r.get("k_source") == "search")
    for col, what in (("f_selected_ci_low", "selection-aware"), ("f_ci_low", "fixed-circuit")):
        low = {k: math.nan if r.get(col) is None else float(r[col]) for k, r in f.items()
               if r.get("k_source") != "search"}  # which column: the one the grid has, as the search chose it
        if all(math.isnan(v) for v in low.values()):  # an infinite end (Fieller's unbounded set) was measured
            continue
        low = {k: math.nan if r.get(col) is None else float(r[col]) for k, r in f.items()}
        grid = sorted(low, reverse=True)
        if searched:  # the search tested every k down from the grid's largest: walk them without skipping one
            grid = [k for k in range(grid[0], 0, -1) if k in low]
            grid = grid[:next((i for i, (a, b) in enumerate(zip(grid, grid[1:])) if a - b != 1), len(grid) - 1) + 1]
        chosen = None
        for k in grid:  # fixed sequence: stop at the first k that fails
            if not low[k] >= BAR:
                break
            chosen = k
        how = (f"fixed-sequence test down every k from k = {grid[0]}, {searched} of them evaluated beyond the k grid"
               if searched else f"fixed-sequence test down from k = {grid[0]}")
        if chosen is not None:
            return chosen, (f"the smallest k whose {what} faithfulness lower bound, like every larger k's, is ≥ {BAR} "
                            f"({how})")
        return grid[0], (f"no k reaches a {what} faithfulness lower bound of {BAR}, so the circuit shown is the largest "
                         f"k of the grid; no circuit of the grid is shown to be faithful")
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
    min_excess: float = MIN_EXCESS  # a head's excess interval must lie above it


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


def _robust_lines(r: _Run) -> list[Line]:
    """Where a few prompts carry a circuit edge's mean (no_tail_seen = false), say so and show its median and
    trimmed mean with their own intervals (edge_stats' median_ci_* / trimmed_mean_ci_*, the columns claims read)."""
    if r.method is None or r.k is None or not r.T.has("edge_stats"):
        return []
    edges = circuit_edges(r.T, r.method, r.k, r.ranking)
    fragile = [e for e in edges if e.get("no_tail_seen") is False and e.get("median") is not None
               and math.isfinite(e["median"])]
    if not fragile:
        return []
    parts: list[Part] = []
    for i, e in enumerate(fragile[:TOP_EDGES]):
        parts += ["; " if i else "", Name(e["name"]), " mean ",
                  Ci.of("edge_stats", e, ("method", "edge"), est="estimate"), ", median ",
                  Ci.of("edge_stats", e, ("method", "edge"), "median_ci", est="median", flag="",
                        estimand=covers("edge_stats", "median_ci_low")), ", trimmed mean ",
                  Ci.of("edge_stats", e, ("method", "edge"), "trimmed_mean_ci", est="trimmed_mean", flag="",
                        estimand=covers("edge_stats", "trimmed_mean_ci_low"))]
    parts.append(f" ({min(TOP_EDGES, len(fragile))} of {len(fragile)} shown). A few prompts carry these means, and "
                 "prompts rarer than 1 in N that carry a mean are invisible in any sample: the median and trimmed mean "
                 "are the effect on a typical prompt, each with its own interval.")
    return [Line("fragile means", f"{len(fragile)} of {len(edges)} circuit edges", "unsure", tuple(parts), "forest")]


def _stability_line(r: _Run) -> list[Line]:
    """Data-level stability of the top-k circuit (jaccard_half_ci_*, J_{N/2}; jaccard_data_ci_* in runs before it)
    against the bar, with chance beside it."""
    found = rows(r.T.get("stability_vs_k"), method=r.method, k=r.k) if r.k is not None else []
    at = ""
    if not found and r.k is not None:  # a k of the circuit choice's search: stability is measured on the grid only
        grid = rows(r.T.get("stability_vs_k"), method=r.method)
        above = [x for x in grid if x["k"] > r.k]
        found = [min(above, key=lambda x: x["k"])] if above else sorted(grid, key=lambda x: -x["k"])[:1]
        if found:
            at = (f"measured on the k grid, so at k = {found[0]['k']}, the grid's nearest k "
                  f"{'above' if above else 'below'} the chosen {r.k}: ")
    if not found:
        return []
    row = found[0]
    k = row["k"]
    if "jaccard_data_ci_low" not in row:
        return [Line("stability", "no data-level interval", "unsure",
                     ("this run predates data-level stability intervals; rerun the audit to get them",), "stability")]
    note = str(row.get("data_level_note") or "")  # why the stage computed no data-level interval, as it said
    # the primary data-level interval: J_{N/2} from disjoint halves (exactly estimable); runs before it: J_N
    half = isinstance(row.get("jaccard_half_ci_low"), (int, float)) and not math.isnan(row["jaccard_half_ci_low"])
    prefix, est = ("jaccard_half_ci", "jaccard_half") if half else ("jaccard_data_ci", "jaccard_data")
    ci = Ci.of("stability_vs_k", row, ("method", "k"), prefix, est=est,
               unavailable="not computed" if note else "undefined in stability_vs_k")
    chance = row.get("jaccard_chance")
    verdict, tone = against_bar(ci, "stable", "unstable")
    if tone == "good" and chance is not None and not ci.lo > chance:
        verdict, tone = "no better than chance", "bad"
    why = f": {note}" if note and not ci.defined else ""
    sets = (f"two independent halves of {_prompts(r)} (J_N/2; J_N for the full size is at least as large where more "
            "prompts give more agreement)" if half else f"two independent sets of {_prompts(r)}")
    parts = (f"{at}expected Jaccard between the top-{k} circuits of {sets} ", ci,
             f"{why}; bar {BAR}, chance {fmt(chance)}")
    return [Line("stability", verdict, tone, parts, "stability")]


def _faithfulness_line(r: _Run) -> list[Line]:
    """Selection-aware faithfulness (f_selected_ci_*) of the circuit at k; the fixed circuit's only without it."""
    found = rows(r.T.get("faithfulness_vs_k"), method=r.method, k=r.k) if r.k is not None else []
    if not found:
        return []
    row = found[0]
    ci = Ci.of("faithfulness_vs_k", row, ("method", "k"), "f_selected_ci", est="f_selected", decimals=3)
    cond = Ci.of("faithfulness_vs_k", row, ("method", "k"), "f_conditional_ci", est="f_conditional", decimals=3)
    parts: tuple[Part, ...]
    if cond.defined:  # a mask-learned method: the reported circuit's own interval leads, the procedure's beside it
        parts = (f"faithfulness of the reported top-{r.k} circuit (fitted on half of {_prompts(r)}, evaluated on the "
                 "other half) ", cond, f"; bar {BAR}; the procedure-level interval (averaged over refits) ", ci)
        verdict, tone = against_bar(cond, "faithful", "not faithful")
        return [Line("faithfulness", verdict, tone, parts, "faithfulness")]
    if ci.defined:
        parts = (f"faithfulness of selecting the top-{r.k} circuit from {_prompts(r)}, averaged over refits ", ci,
                 f"; bar {BAR}") + _smaller_k(r)
    else:
        ci = Ci.of("faithfulness_vs_k", row, ("method", "k"), "f_ci", est="f_ratio", decimals=3)
        why = row.get("f_selected_note") or "not computed"
        head = f"no selection-aware interval ({why}); this fixed top-{r.k} circuit "
        if row.get("f_ci_note"):  # Fieller's set is no bounded interval: the words the table, page and claims quote
            quote = Quote("faithfulness_vs_k", (("method", r.method), ("k", int(row["k"]))), "f_ci_note",
                          str(row["f_ci_note"]))
            parts = (head, f"{row['f_ratio']:.3f}, but ", quote)
            return [Line("faithfulness", "no interval", "unsure", parts, "faithfulness")]
        parts = (head, ci, f"; bar {BAR}")
    verdict, tone = against_bar(ci, "faithful", "not faithful")
    return [Line("faithfulness", verdict, tone, parts, "faithfulness")]


def _smaller_k(r: _Run) -> tuple[Part, ...]:
    """The next smaller k of the grid with its selection-aware interval: why the chosen k is not smaller."""
    below = [x for x in rows(r.T.get("faithfulness_vs_k"), method=r.method) if r.k is not None and x["k"] < r.k]
    if not below:
        return ()
    row = max(below, key=lambda x: x["k"])
    why = " (no path from input to logits: it computes what the empty circuit does)" if row.get("connected") is False else ""
    return (f"; at k = {row['k']}: ", Ci.of("faithfulness_vs_k", row, ("method", "k"), "f_selected_ci", est="f_selected",
                                             decimals=3), why)


def _approx_verdict(ci: Ci, rho: float) -> tuple[str, str]:
    """Return (verdict, tone) of the Spearman interval against the APPROX_RULES bars (its point estimate in a run
    that predates the interval)."""
    if not ci.defined:
        return next(((v, t) for bar, v, t in APPROX_RULES if rho >= bar), ("no agreement measured", "unsure"))
    if ci.lo >= APPROX_RULES[0][0]:
        return APPROX_RULES[0][1:]
    if ci.lo >= APPROX_RULES[1][0]:
        return APPROX_RULES[1][1:]
    if ci.hi < APPROX_RULES[1][0]:
        return APPROX_RULES[2][1:]
    return "inconclusive: a rough guide or worse", "unsure"


def _approximation_lines(r: _Run) -> list[Line]:
    """Each approximate method's rank agreement with exact (approximation_summary), read from its interval."""
    out = []
    by_method: dict[str, dict[str, Any]] = {}
    for row in rows(r.T.get("approximation_summary")):  # one row per method (older runs: one per k; the chosen k's)
        if row["method"] not in by_method or row.get("k") == r.k:
            by_method[row["method"]] = row
    for row in by_method.values():
        rho = row.get("spearman")
        rho = math.nan if rho is None else float(rho)
        old = "predates the interval: rerun the audit"
        sp = Ci.of("approximation_summary", row, ("method", "k"), "spearman_ci", est="spearman", unavailable=old)
        r2 = Ci.of("approximation_summary", row, ("method", "k"), "r2_ci", est="r2", unavailable=old)
        verdict, tone = _approx_verdict(sp, rho)
        parts = (f"{row['method']} vs exact: Spearman of mean scores ", sp, f", Kendall {fmt(row.get('kendall'))}, "
                 f"top-{row.get('k')} overlap {fmt(row.get('top_k_overlap'))}, pooled per-example R² ", r2)
        out.append(Line("approximation", f"{row['method']}: {verdict}", tone, parts, "approximation"))
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
    d = r.min_excess
    above = sum(1 for h in hs if h.get("excess_ci_low") is not None and h["excess_ci_low"] > d)
    verdict = NEEDS_SEEDS if few else f"{above} of {len(hs)} heads above their null by more than {d:g}"
    parts = (f"{n_refits} seeds; largest excess over the shuffled null: ", Name(f"a{best['layer']}.h{best['head']}"), " ", ci,
             f" (stability {fmt(best['stability'])}, null {fmt(best.get('null_mean'))}); a head counts when its own "
             f"interval's lower end exceeds the minimum excess {d:g} (heads.min_excess), not adjusted over the "
             f"{len(hs)} heads")
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


def resampling_notes(es: pa.Table | None) -> tuple[str, ...]:
    """What the resampling behind edge_stats' intervals and q-values cannot show (one method's rows): the
    templates a cluster bootstrap resampled whole (n says prompts) and why its interval method is what it is; the
    edges whose p-value sits at the resampling floor 1/(B+1), whose q-values the resample count sets."""
    if es is None or not es.num_rows:
        return ()
    out = []
    cols, E = es.column_names, es.num_rows
    n = int(np.nanmax(num(es, "n"))) if "n" in cols else None
    units = int(np.nanmax(num(es, "n_clusters"))) if "n_clusters" in cols else None
    method = str(es.column("ci_method")[0].as_py()) if "ci_method" in cols else "?"
    note = str(es.column("ci_method_note")[0].as_py() or "") if "ci_method_note" in cols else ""
    clustered = bool(n and units and 0 < units < n)
    wild = method in ("wild_cluster_t", "cr2_t", "wcr")  # CR2-studentized: the note says what G allows (stats.intervals.wild)
    distinct = math.comb(2 * units - 1, units) if clustered and not wild else 0
    if clustered and wild:
        out.append(f"Edges: the {units} templates, not the {n} prompts, are the independent units (n = {n}, {units} "
                   f"independent units); interval {method}" + (f": {note}" if note else "."))
    elif clustered:
        out.append(f"Edges: a cluster bootstrap resampled the {units} templates whole, not the {n} prompts (n = {n}, "
                   f"{units} independent units; at most {distinct:,} distinct resamples); interval {method}"
                   + (f": {note}." if note else "."))
    if "p_floor" in cols and "p" in cols:
        floor, p, q = num(es, "p_floor"), num(es, "p"), num(es, "q")
        at = (floor > 0) & np.isfinite(p) & (p <= floor * (1 + 1e-9))
        if at.any():
            f = float(np.nanmax(floor[at]))
            b = int(round(1 / f)) - 1
            qs = q[at & np.isfinite(q)]
            qtext = f"q = {fmt(float(qs.min()), 2)}" if qs.size and qs.min() == qs.max() else (
                f"q {fmt(float(qs.min()), 2)} to {fmt(float(qs.max()), 2)}" if qs.size else "q undefined")
            if clustered and wild and "all enumerated" in note:  # every wild weight pattern was used
                fix = (f"More resamples cannot resolve them: {units} templates allow no more weight patterns than "
                       "the wild bootstrap used; add templates (groups).")
            elif clustered and not wild and distinct <= b:  # the resampled means take at most `distinct` values
                fix = (f"More resamples cannot resolve them: {units} templates allow at most {distinct:,} distinct "
                       "resamples; add templates (groups).")
            else:
                fix = "More resamples (bootstrap.n_resamples) resolve them" + (
                    "." if clustered else "; or bootstrap.ci_method: t gives analytic Student-t p-values (no floor).")
            out.append(f"p-values: {int(at.sum()):,} of {E:,} edges sit at the resampling floor 1/(B+1) = 1/{b + 1:,} "
                       f"({qtext}): their p-values are at most that, so their q-values are set by B = {b:,} resamples, "
                       f"not by the data, and cannot order those edges; an edge alone at the floor would get "
                       f"q = {fmt(min(1.0, E * f), 2)}. {fix}")
    return tuple(out)


def _rules(lines: list[Line], level: float, n_edges: int | None, min_excess: float = MIN_EXCESS) -> tuple[str, ...]:
    """The rules of the verdicts present, multiplicity included."""
    have = {ln.label for ln in lines}
    if not lines:
        return ()
    out = [f"Intervals are {level:.0%} intervals of the column the claims check reads; each verdict reads one, "
           "not adjusted across the lines."]
    if "circuit" in have:
        out.append(f"k: fixed-sequence test down the k grid, or down every k from its largest where the run searched "
                   f"(family-wise {1 - level:.0%} over the k tested, no adjustment needed).")
    if {"stability", "faithfulness"} & have:
        out.append(f"Stability and faithfulness: above the bar {BAR} → stable / faithful, below → unstable / "
                   "not faithful, across → inconclusive.")
    if "top edges" in have:
        out.append(f"Edges: Benjamini–Hochberg q ≤ {SIGNIFICANT_Q} over all {f'{n_edges:,}' if n_edges else 'the'} edges; ! = the "
                   "interval rests on a few prompts (no_tail_seen = false); no ! does not mean it covers: a prompt rarer than "
                   "1 in N that carries a mean is invisible in the sample.")
    if "fragile means" in have:
        out.append(f"Fragile means: circuit edges whose mean rests on a few prompts (no_tail_seen = false) also show "
                   f"their median (order-statistic interval) and 20%-trimmed mean (Tukey–McLaughlin), each {level:.0%}, "
                   "not adjusted across edges.")
    if "approximation" in have:
        out.append("Approximation: the Spearman interval's lower end ≥ 0.9 ranks like exact, ≥ 0.5 a rough guide; "
                   "its upper end below 0.5 does not; across 0.5 inconclusive.")
    if "verified" in have:
        out.append(f"Verified: intervals for the mean exact effect (PPI++, exact on a random subset of prompts); "
                   f"edges: BH q ≤ {SIGNIFICANT_Q} over the verified edges; missed edges: a one-sided bound at the "
                   "level stated.")
    if "heads" in have:
        out.append(f"Heads: above the null when a head's own interval over training seeds lies above the minimum "
                   f"excess {min_excess:g} (heads.min_excess / --min-excess); not adjusted over heads.")
    return tuple(out)


def _min_excess(spec: dict, asked: float | None) -> float:
    """Return the heads' minimum excess: `asked`, else the run spec's heads.min_excess, else MIN_EXCESS."""
    if asked is None:
        heads = spec.get("heads") if isinstance(spec.get("heads"), dict) else {}
        asked = heads.get("min_excess", MIN_EXCESS)
    try:
        d = float(asked)
    except (TypeError, ValueError):
        d = math.nan
    lo, hi = MIN_EXCESS_BOUNDS
    if not lo <= d <= hi:
        from circuitstat.core.errors import InputError

        raise InputError(f"min_excess must lie in [{lo:g}, {hi:g}], got {asked!r}: pass a value in that range")
    return d


def verdict(run_dir: str | Path, min_excess: float | None = None) -> Verdict:
    """Return the one-screen verdict of the run directory `run_dir` (lines for what its tables hold); `min_excess`
    overrides the run spec's heads.min_excess."""
    T = Tables(Path(run_dir))
    spec = run_spec(T.dir)
    method = primary_method(T)
    k, why = choose_k(T, method) if method else (None, "")
    boot = spec.get("bootstrap") if isinstance(spec.get("bootstrap"), dict) else {}
    level = float(boot.get("confidence_level") or 0.95)
    es = T.get("edge_stats")
    n = int(np.nanmax(num(es, "n"))) if es is not None and es.num_rows and np.isfinite(num(es, "n")).any() else None
    d = _min_excess(spec, min_excess)
    r = _Run(T, method, k, why, str(spec.get("ranking") or "absolute"), n, d)
    from circuitstat.reports.verdicts.published import published_lines

    from circuitstat.reports.verdicts.circuit_tests import circuit_test_lines

    lines: list[Line] = published_lines(T, method)  # what was asked first: the published circuit, when given
    lines += circuit_test_lines(T)  # and its hypothesis tests, one line per test
    for build in (_circuit_lines, _robust_lines, _stability_line, _faithfulness_line, _approximation_lines, _verified_lines,
                  _heads_line, _claim_lines):
        lines += build(r)
    n_edges = where(es, method=method).num_rows if method and es is not None else None
    rules = _rules(lines, level, n_edges, d)
    if any(ln.label == "top edges" for ln in lines):
        rules += resampling_notes(where(es, method=method))
    return Verdict(T.dir, method, k, tuple(lines), tuple(missing(T)), rules, level)
