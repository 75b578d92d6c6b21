"""The edge effects section: a forest plot of the top edges with their intervals per method."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reports.html.common import (TOP_FOREST, Tables, colours, figure, html_table, ints, methods_in, num, shown, strs,
                                 sub)
from reports.html.svg import FONT, Plot, data_range, esc, fmt, fmt_p, nice_domain, padded


def forest_section(T: Tables, methods: Sequence[str]) -> str:
    """Return the forest plot of the top edges by |estimate| with each method's interval and q-value."""
    t = T.need("edge_stats", ["method", "edge", "estimate", "ci_low", "ci_high"])
    meth = [m for m in methods if m in methods_in(t)]
    ref = meth[0]
    ms = np.array(strs(t, "method"))
    r = sub(t, ms == ref)
    est = num(r, "estimate")
    ok = np.isfinite(est)
    n_edges = int(ok.sum())
    order = np.argsort(-np.abs(np.where(ok, est, 0)), kind="stable")[: min(TOP_FOREST, n_edges)]
    redge = ints(r, "edge")
    top = redge[order]
    rnames = strs(r, "name")
    name_of = {int(redge[i]): (rnames[i] or str(int(redge[i]))) for i in order}
    per: dict[str, dict[int, tuple[float, ...]]] = {}
    for m in meth:
        s = sub(t, (ms == m) & np.isin(ints(t, "edge"), top))
        cols_ = [num(s, c) for c in ("estimate", "se", "ci_low", "ci_high", "p", "q", "n")]
        per[m] = {int(e): tuple(float(c[i]) for c in cols_) for i, e in enumerate(ints(s, "edge"))}
    n = len(top)
    col = colours(methods)
    nm = len(meth)
    band = min(0.7, 0.22 * nm)
    offs = [(j - (nm - 1) / 2) * (band / max(nm - 1, 1)) if nm > 1 else 0.0 for j in range(nm)]
    lo, hi = data_range(*[[v[2] for v in per[m].values()] + [v[3] for v in per[m].values()] + [v[0] for v in per[m].values()] for m in meth], [0.0])
    xd = nice_domain(*padded(lo, hi, 0.03))
    height = 60 + n * max(16, 9 * nm + 6)
    p = Plot(640, height, xd, (-0.6, n - 0.4), margin=(14, 74, 42, 200), label="forest plot of top edges")
    p.vline(0.0, "#777", dash=None)
    rows = []
    for j, m in enumerate(meth):
        for i, e in enumerate(top.tolist()):
            v = per[m].get(e)
            if v is None:
                continue
            y = n - 1 - i - offs[j]  # first method on top
            estv, se, cl, ch, pv, qv, nn = v
            p.hbar(y, cl, ch, col[m])
            p.points([estv], [y], col[m], r=3.2, titles=[f"{name_of.get(e, e)} ({m}): {fmt(estv)} [{fmt(cl)}, {fmt(ch)}], q = {fmt_p(qv)}"])
            p.raw(f'<text x="{p.right + 6:.1f}" y="{p.y(y) + 3:.1f}" font-size="{FONT - 2}" fill="{col[m]}">q={esc(fmt_p(qv))}</text>')
            rows.append([name_of.get(e, str(e)), m, estv, se, cl, ch, pv, qv, nn])
        p.legend(m, col[m], "point")
    labels = [name_of.get(e, str(e)) for e in top.tolist()]
    short = [s if len(s) <= 30 else s[:29] + "…" for s in labels]
    p.axes("estimate with CI", "", yticks=[n - 1 - i for i in range(n)], ytick_labels=short)
    rows.sort(key=lambda r: (labels.index(r[0]) if r[0] in labels else 0, meth.index(r[1])))
    cols = [("edge", "text"), ("method", "text"), ("estimate", "num"), ("SE", "num"), ("CI low", "num"), ("CI high", "num"), ("p", "p"), ("q (BH)", "p"), ("n", "int")]
    tbl = html_table(cols, rows, shown_note=shown(n, n_edges, "edges", f"top by |estimate| of {ref}"))
    cap = (f"Top {n} edges by |estimate| of {ref}, each with its CI per method; q = Benjamini–Hochberg adjusted p-value. "
           "The vertical line marks zero effect.")
    return figure(p.svg(), cap, tbl)

