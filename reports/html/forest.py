"""The edge effects section: a forest plot of the top edges with each method's interval, flag and q-value.

The interval is edge_stats' ci_low / ci_high, the one the edge_effect claim reads (it covers the mean
effect over the task's prompt distribution); an edge a few prompts carry is marked visibly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from circuitstat.reports.ci import Ci, covers
from circuitstat.reports.html.common import (TOP_FOREST, Tables, ci_attrs, colours, figure, html_table, ints, methods_in, num, shown,
                                 strs, sub)
from circuitstat.reports.html.svg import FONT, Plot, data_range, esc, fmt_p, nice_domain, padded

__all__ = ["forest_section"]


def _top_edges(t, ref: str) -> tuple[np.ndarray, int]:
    """Return (the TOP_FOREST edges by |estimate| of method `ref`, how many edges it has with an estimate)."""
    r = sub(t, np.array(strs(t, "method")) == ref)
    est = num(r, "estimate")
    ok = np.isfinite(est)
    order = np.argsort(-np.abs(np.where(ok, est, 0)), kind="stable")[: min(TOP_FOREST, int(ok.sum()))]
    return ints(r, "edge")[order], int(ok.sum())


def _robust_cis(row: dict) -> list[Ci]:
    """The edge's median and trimmed-mean intervals (edge_stats' median_ci_* / trimmed_mean_ci_*, as claims read
    them; '—' for a run from before them or a cluster bootstrap's, whose robust_note says why)."""
    why = "not computed: prompts share templates" if row.get("robust_note") else ""
    return [Ci.of("edge_stats", row, ("method", "edge"), f"{p}_ci", est=p, flag="",
                  estimand=covers("edge_stats", f"{p}_ci_low"), unavailable=why) for p in ("median", "trimmed_mean")]


def forest_section(T: Tables, methods: Sequence[str]) -> str:
    """Return the forest plot of the top edges by |estimate| with each method's interval and q-value."""
    t = T.need("edge_stats", ["method", "edge", "estimate", "ci_low", "ci_high"])
    meth = [m for m in methods if m in methods_in(t)]
    ref = meth[0]
    top, n_edges = _top_edges(t, ref)
    chosen = sub(t, np.isin(ints(t, "edge"), top)).to_pylist()
    per = {m: {int(r["edge"]): r for r in chosen if r["method"] == m} for m in meth}
    cis = {m: {e: Ci.of("edge_stats", r, ("method", "edge"), est="estimate") for e, r in per[m].items()} for m in meth}
    name_of = {int(r["edge"]): str(r.get("name") or r["edge"]) for r in chosen}
    n, nm, col = len(top), len(meth), colours(methods)
    band = min(0.7, 0.22 * nm)
    offs = [(j - (nm - 1) / 2) * (band / max(nm - 1, 1)) if nm > 1 else 0.0 for j in range(nm)]
    every = [c for m in meth for c in cis[m].values()]
    lo, hi = data_range([c.lo for c in every], [c.hi for c in every], [c.value for c in every], [0.0])
    p = Plot(680, 60 + n * max(18, 9 * nm + 8), nice_domain(*padded(lo, hi, 0.03)), (-0.6, n - 0.4),
             margin=(14, 110, 42, 210), label="forest plot of top edges")
    p.vline(0.0, "#777", dash=None)
    table = []
    for j, m in enumerate(meth):
        for i, e in enumerate(top.tolist()):
            c = cis[m].get(e)
            if c is None:
                continue
            y = n - 1 - i - offs[j]  # the first method on top
            bad = c.reliable is False
            p.hbar(y, c.lo, c.hi, col[m], width=1.5)
            p.points([c.value], [y], "#ffffff" if bad else col[m], r=3.4, attrs=[ci_attrs(c)],
                     titles=[f"{name_of[e]} ({m}): {c.text()}, q = {fmt_p(per[m][e].get('q'))}"])
            if bad:  # hollow point and a visible mark: a few prompts carry it
                p.raw(f'<circle cx="{p.x(c.value):.1f}" cy="{p.y(y):.1f}" r="3.4" fill="none" stroke="{col[m]}" stroke-width="1.5"/>')
            p.raw(f'<text x="{p.right + 6:.1f}" y="{p.y(y) + 3:.1f}" font-size="{FONT - 2}" fill="{col[m]}">'
                  f'q={esc(fmt_p(per[m][e].get("q")))}{" ! few prompts" if bad else ""}</text>')
            r = per[m][e]
            units = r.get("n_clusters")  # absent (older runs) or unset: the prompts were the units
            table.append([name_of[e], m, c, r.get("se"), r.get("p"), r.get("q"), r.get("n"),
                          units if units is not None and units > 0 else r.get("n"), *_robust_cis(r)])
        p.legend(m, col[m], "point")
    labels = [name_of.get(e, str(e)) for e in top.tolist()]
    p.axes("mean effect with 95% CI", "", yticks=[n - 1 - i for i in range(n)],
           ytick_labels=[s if len(s) <= 32 else s[:31] + "…" for s in labels])
    table.sort(key=lambda row: (labels.index(row[0]), meth.index(row[1])))
    cols = [("edge", "text"), ("method", "text"), ("estimate [95% CI]", "ci"), ("SE", "num"), ("p", "p"),
            ("q (BH)", "p"), ("n", "int"), ("units resampled", "int"), ("median [95% CI]", "ci"),
            ("20%-trimmed mean [95% CI]", "ci")]
    tbl = html_table(cols, table, shown_note=shown(n, n_edges, "edges", f"top by |estimate| of {ref}",
                                                     "edge_stats"))
    est = every[0].estimand if every else ""
    cap = (f"Top {n} edges by |estimate| of {ref}, each with its 95% interval per method (it covers {est}); q = "
           "Benjamini–Hochberg adjusted p-value over all edges; a hollow point and '! few prompts' mark an interval "
           "a few prompts carry (no_tail_seen = false), which cannot back a claim; no mark does not mean the interval "
           "covers (a prompt rarer than 1 in N is invisible). The median and 20%-trimmed mean are the effect on a "
           "typical prompt, each with its own interval, which a few prompts cannot move. The vertical line is zero.")
    from circuitstat.reports.verdicts.build import resampling_notes

    notes = resampling_notes(sub(t, np.array(strs(t, "method")) == ref))
    cap += "".join(f" {n}" for n in notes)  # cluster resampling and the p-value floor, as the verdict says them
    return figure(p.svg(), cap, tbl, below=True)
