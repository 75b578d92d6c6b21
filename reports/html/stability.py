"""The circuit stability section: the data-level Jaccard of top-k circuits vs k, against chance and the bar.

The interval drawn is the primary data-level one the verdict reads (jaccard_half_ci_*: J_{N/2}, the expected
Jaccard between the top-k circuits of two independent datasets of N/2 prompts, exactly estimable from disjoint
halves); the table shows it beside J_N (jaccard_data_ci_*, extrapolated: bracketed double bootstrap). Runs
from before J_{N/2} draw J_N. Never the Monte Carlo spread of one dataset's resample circuits (jaccard_ci_*),
which is left out of the page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from circuitstat.reports.ci import Ci
from circuitstat.reports.html.common import (BAR, MAX_ROWS, Tables, ci_attrs, colours, figure, html_table, k_ticks, methods_in, shown,
                                 x_domain_k)
from circuitstat.reports.html.svg import Plot, data_range, fmt, nice_domain, padded
from circuitstat.reports.tableset import rows

__all__ = ["stability_section"]

STAB_COLS = [("method", "text"), ("k", "int"), ("J_N/2, halves [95% CI]", "ci"),
             ("J_N (extrapolated, bracketed) [95% CI]", "ci"), ("chance", "num"),
             ("Jaccard to population [95% CI]", "ci"), ("Φ, data level [95% CI]", "ci"), ("consensus size", "int"),
             ("resample mean J (Monte Carlo)", "num")]


def _row_cis(r: dict) -> tuple[Ci, Ci, Ci, Ci, Ci]:
    """Return the row's (primary, J_{N/2}, J_N, to population, Phi) intervals; primary is J_{N/2}, J_N in older runs."""
    key = ("method", "k")
    v = r.get("jaccard_half_ci_low")
    has_half = isinstance(v, (int, float)) and not math.isnan(v)  # NaN: a run from before J_{N/2} (schema-filled)
    data = Ci.of("stability_vs_k", r, key, "jaccard_data_ci", est="jaccard_data")
    half = Ci.of("stability_vs_k", r, key, "jaccard_half_ci", est="jaccard_half",
                 unavailable="" if has_half else "not in this run (rerun the audit)")
    return (half if has_half else data, half, data, Ci.of("stability_vs_k", r, key, "jaccard_pop_ci", est="jaccard_pop"),
            Ci.of("stability_vs_k", r, key, "phi_data_ci", est="phi_data"))


def stability_section(T: Tables, methods: Sequence[str]) -> str:
    """Return the data-level Jaccard vs k per method with its band, chance and the bar, and its table."""
    t = T.need("stability_vs_k", ["method", "k", "jaccard_mean"])
    data_level = "jaccard_data_ci_low" in t.column_names
    meth = [m for m in methods if m in methods_in(t)]
    col = colours(methods)
    per = {m: sorted(rows(t, method=m), key=lambda r: r["k"]) for m in meth}
    cis = {m: [_row_cis(r) for r in per[m]] for m in meth}
    ks = np.array([r["k"] for m in meth for r in per[m]], dtype=float)
    ys = [c[0] for m in meth for c in cis[m]]
    chance = [r.get("jaccard_chance") for m in meth for r in per[m]]
    lo, hi = data_range([c.lo for c in ys], [c.hi for c in ys], [c.value for c in ys],
                        np.array(chance, dtype=float), [BAR])
    lo, hi = nice_domain(*padded(lo, hi, 0.06))
    xd, xlog = x_domain_k(ks)
    p = Plot(600, 360, xd, (max(lo, 0.0), min(hi, 1.0)), xlog=xlog, label="data-level Jaccard vs k")
    table = []
    for m in meth:
        k = np.array([r["k"] for r in per[m]], dtype=float)
        jd = [c[0] for c in cis[m]]
        p.band(k, [c.lo for c in jd], [c.hi for c in jd], col[m])
        p.line(k, [r.get("jaccard_chance") for r in per[m]], col[m], width=1.2, dash="1.5,2.5", title=f"{m}: chance")
        p.line(k, [c.value for c in jd], col[m], title=f"{m}: data-level Jaccard")
        p.points(k, [c.value for c in jd], col[m], r=3.0, attrs=[ci_attrs(c) for c in jd],
                 titles=[f"{m} k={int(a)}: {c.text()}, chance {fmt(r.get('jaccard_chance'))}"
                         for a, c, r in zip(k, jd, per[m])])
        p.legend(f"{m}: data-level Jaccard + 95% CI", col[m])
        table += [[m, r["k"], h, d, r.get("jaccard_chance"), pop, phi, r.get("consensus_size"),
                   r.get("jaccard_mean")] for r, (_, h, d, pop, phi) in zip(per[m], cis[m])]
    p.legend("chance (two random k-subsets)", "#555", "dot")
    p.legend(f"bar {BAR}", "#b00", "dash")
    p.hline(BAR, "#b00", dash="6,4")
    p.axes("circuit size k (edges)" + (", log scale" if xlog else ""), "Jaccard between two datasets' circuits",
           xticks=k_ticks(ks, p))
    tbl = html_table(STAB_COLS, table[:MAX_ROWS], shown_note=shown(min(len(table), MAX_ROWS), len(table), "rows",
                                                                    "first rows"))
    est = ys[0].estimand if ys else ""
    halves = any(c[1] is c[0] for m in meth for c in cis[m])  # the curve is J_{N/2} (else an older run's J_N)
    what = ("J_N/2, the expected Jaccard between the top-k circuits of two independent sets of N/2 prompts (exactly "
            "estimable from disjoint halves; J_N/2 <= J_N where more prompts give more agreement)" if halves else
            "the expected Jaccard between the top-k circuits of two independent sets of N prompts")
    cap = (f"Data-level stability: {what}, "
           f"with its 95% interval (it covers {est}); dotted: chance; dashed red: the {BAR} bar the verdict reads. "
           "Table: also J_N for sets of N prompts (an extrapolation: bracketed double bootstrap), "
           "the Jaccard of this dataset's circuit to the population's and Nogueira's Φ, each with its "
           "data-level interval. The Monte Carlo spread of one dataset's resample circuits is not an interval for "
           "the data and is left out; stability_vs_k records no per-row reliability flag.")
    notes = sorted({str(r.get("data_level_note") or "") for m in meth for r in per[m]} - {""})
    if notes:  # why the data-level columns are NaN, as the stage recorded it (the verdict says the same)
        cap = "No data-level interval: " + "; ".join(notes) + ". " + cap
    if not data_level:
        cap = ("This run predates the data-level stability intervals (rerun the audit): the curve is the data-level "
               "estimate where present, and no interval is drawn. " + cap)
    return figure(p.svg(), cap, tbl, below=True)
