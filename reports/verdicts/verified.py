"""The verdict's verified lines: per approximate method, how many edges' mean *exact* effect excludes 0 and, with an
edge subset, the bound on missed edges above τ.

Every number is read from the row the claims check reads: the ``verified`` table's ``qvalue`` (claim kind
``verified_edge``, statistic qvalue), its ``n_labelled``/``n_prompts``/``estimand``, and the ``missed_edges``
table's ``missed_high``, ``tau`` and ``level`` (claim kind ``missed_edges``, statistic missed_high).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from circuitstat.reports.ci import Ci, fmt
from circuitstat.reports.tableset import Tables, methods_in, num, rows, where
from circuitstat.reports.verdicts.model import SIGNIFICANT_Q, Line, Name, Part

__all__ = ["verified_edge_lines", "verified_lines", "significant_verified", "flag_range_note", "active_budget",
           "FLAG_MEASURED_MAX_PROMPTS_PER_LABELLED", "FLAG_MEASURED_MAX_PROMPTS_PER_CELL"]


def significant_verified(T: Tables, method: str, max_q: float = SIGNIFICANT_Q) -> tuple[int, int]:
    """Return (edges of ``method`` with q ≤ ``max_q`` and no tail seen: the verified_edge claims on the q-value
    that hold, those with q ≤ ``max_q`` a few prompts carry (no_tail_seen false): claims refuse them)."""
    t = where(T.get("verified"), method=method)
    if t is None or not t.num_rows:
        return 0, 0
    q = num(t, "qvalue")
    sig = np.isfinite(q) & (q <= max_q)
    no_tail = np.array([r is not False for r in t.column("no_tail_seen").to_pylist()])
    return int(np.sum(sig & no_tail)), int(np.sum(sig & ~no_tail))


def _missed_parts(T: Tables, method: str) -> tuple[Part, ...]:
    found = rows(T.get("missed_edges"), method=method)
    if not found:
        return ("; every edge verified",)
    m = found[0]
    # the missed-mass bound (issue 48 item 5) is absent from older runs
    mass = (f"; their summed |mean exact effect| ≤ {fmt(m['mass_high'])} at level {fmt(m['mass_level'])} "
            "(approximate)"
            if m.get("mass_high") is not None else "")
    return (f"; missed edges (unverified, |mean exact effect| > τ = {fmt(m['tau'])}) ≤ {int(m['missed_high'])} of "
            f"{int(m['n_unverified'])} at level {fmt(m['level'])} (top {int(m['n_top'])} + {int(m['n_sampled'])} "
            f"random edges verified){mass}",)


#: how the active design's estimand ends (circuitstat.stats.verified.active_result.active_estimand writes it)
ACTIVE_ESTIMAND_SUFFIX = "(active sampling)"


def is_active_design(estimand: object) -> bool:
    """Return True when a verified row's estimand is the active design's (cells sampled per edge, not n prompts)."""
    return str(estimand or "").endswith(ACTIVE_ESTIMAND_SUFFIX)


def flag_yardstick(active: bool) -> str:
    """Return what the tail flag's width rule compares an interval with, in words, for the design."""
    return "exact on as many prompts as the edge's exact cells" if active else "exact on the verified prompts"


#: the multiple of exact on all N prompts the flag's second width rule caps an interval at
#: (circuitstat.stats.verified.reliability.RELIABLE_MAX_EXACT_ALL_RATIO; reports reads tables only, so the number is
#: repeated here), and the certain bound (width_vs_exact_on_all_max) is read against
EXACT_ALL_CAP = 20.0
#: that rule in words; runs made before it lack the column width_vs_exact_on_all
FLAG_CAP_WORDS = f"{EXACT_ALL_CAP:g}× exact on all N prompts (estimated)"


#: the largest N / n at which the uniform design's tail flag was measured per edge (N = 512 and 2048 with n = 16 and
#: 32, docs/verified.md "The tail rule at N = 2048"): beyond it the verdict says so (reports reads tables only, so the
#: range is stated here, beside the docs that measured it)
FLAG_MEASURED_MAX_PROMPTS_PER_LABELLED = 128

#: the largest N / B at which the active design's tail flag was measured per edge, B the expected exact cells per edge
#: (N = 512 with B = 16, 32 and 51, N = 2048 with B = 16 and 32: docs/verified.md "The active design's flag at
#: N = 2048"); the ratio is N over the budget, not over an edge's realised cells (the run's n_labelled)
FLAG_MEASURED_MAX_PROMPTS_PER_CELL = 128

#: per design (active?): (the largest ratio measured, the ratio's name, where it was measured, what to raise)
_FLAG_RANGE = {False: (FLAG_MEASURED_MAX_PROMPTS_PER_LABELLED, "N/n", "N = 512 and 2048, n = 16 and 32",
                       "verify more prompts"),
               True: (FLAG_MEASURED_MAX_PROMPTS_PER_CELL, "N/B", "N = 512 with B = 16, 32 and 51 and N = 2048 with "
                      "B = 16 and 32, B the expected exact cells per edge", "raise the budget")}


def flag_range_note(per_edge: float, n_prompts: int, active: bool = False) -> str:
    """Return the verdict's note when a run's N / n (uniform design: n verified prompts) or N / B (active design: B
    expected exact cells per edge) lies beyond the range the tail flag was measured at per edge, else ''."""
    top, name, where_, fix = _FLAG_RANGE[bool(active)]
    ratio = n_prompts / max(per_edge, 1)
    if ratio <= top:
        return ""
    return (f"; the tail flag's per-edge coverage was measured only up to {name} = {top} ({where_}); this run's "
            f"{name} = {ratio:.0f} is beyond it: {fix} to stay inside it")


def active_budget(T: Tables, method: str, n_labelled: list[int]) -> float:
    """Return an active-design method's budget B: the ``budget`` its verified_cells rows record (the one record of
    it); for a run without that table, the mean of the edges' sampled cells (n_labelled), whose expectation B is."""
    cells = where(T.get("verified_cells"), method=method)
    if cells is not None and cells.num_rows and "budget" in cells.column_names:
        return float(cells.column("budget")[0].as_py())
    return float(np.mean(n_labelled))


def flag_capped(t) -> bool:
    """Return whether a verified table's flag also applied the cap (it has the column width_vs_exact_on_all)."""
    return t is not None and "width_vs_exact_on_all" in t.column_names


def certain_note(vrows: list[dict]) -> str:
    """Return the verdict's count of flagged intervals certainly within 20× exact on all N (the column
    width_vs_exact_on_all_max, a bound that assumes nothing of the unverified prompts), or '' without the column."""
    flagged = [r for r in vrows if r.get("no_tail_seen") is True]
    bounds = [r.get("width_vs_exact_on_all_max") for r in flagged]
    if not flagged or any(b is None for b in bounds):
        return ""
    ok = sum(1 for b in bounds if b <= EXACT_ALL_CAP)
    return (f"; {ok} of {len(flagged)} with no tail seen are certainly within {EXACT_ALL_CAP:g}× exact on all N "
            f"prompts, the rest only by estimate")


def _method_line(T: Tables, method: str) -> Line | None:
    t = where(T.get("verified"), method=method)
    if t is None or not t.num_rows:
        return None
    vrows = t.to_pylist()
    first = vrows[0]
    n, N = int(first["n_labelled"]), int(first["n_prompts"])
    # all null: an active-design run made before its flag was built (not assessed)
    assessed = any(r.get("no_tail_seen") is not None for r in vrows)
    active = is_active_design(first.get("estimand"))
    k, shaky = significant_verified(T, method)
    est = num(t, "estimate")
    best = vrows[int(np.nanargmax(np.where(np.isfinite(est), np.abs(est), -math.inf)))]
    head = f"{method} {first['estimand']}" if active else f"{method} verified on {n} of {N} prompts"
    parts: list[Part] = [f"{head}: {k} of {len(vrows)} edges' mean exact effect "
                         f"excludes 0 (BH q ≤ {SIGNIFICANT_Q}, "
                         + ("no tail seen" if assessed else "tail flag not assessed")
                         + (f"; {shaky} more a few prompts carry" if shaky else "") + "); largest ", Name(str(best.get("edge_name") or best["edge"])),
                         " ", Ci.of("verified", best, ("method", "edge"), est="estimate"),
                         f" q = {fmt(best.get('qvalue'), 2)}", *_missed_parts(T, method)]
    per_edge = active_budget(T, method, [int(r["n_labelled"]) for r in vrows]) if active else n
    note = flag_range_note(per_edge, N, active) if assessed else ""
    if note:
        parts.append(note)
    certain = certain_note(vrows)
    if certain:
        parts.append(certain)
    tails = sum(1 for r in vrows if r.get("no_tail_seen") is False)
    if tails:
        cap = f" or {FLAG_CAP_WORDS}" if flag_capped(t) else ""
        parts.append(f"; {tails} intervals rest on a few prompts or are wider than 2× {flag_yardstick(active)}{cap} (!)")
    from circuitstat.core.words import counted

    return Line("verified", f"{method}: {counted(k, 'edge')} ≠ 0", "info", tuple(parts), "verified")


def verified_edge_lines(T: Tables) -> list[Line]:
    """Return one verified line per approximate method of the run's ``verified`` table (none without it)."""
    return [ln for ln in (_method_line(T, m) for m in methods_in(T.get("verified"))) if ln is not None]


def verified_lines(run_dir: str | Path) -> list[str]:
    """Return the verified lines of a run directory as plain text (``circuitstat attribute --verify`` prints them)."""
    return [f"{ln.label}: {ln.text()}" for ln in verified_edge_lines(Tables(Path(run_dir)))]
