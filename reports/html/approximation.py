"""The approximation error section: each approximate method against exact, edge by edge."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from reports.html.common import Tables, colours, html_table, methods_in, note, num, order_methods, strs, sub
from reports.html.svg import Plot, data_range, esc, finite, fmt, nice_domain, padded, ramp


MAX_SCATTER_POINTS = 2000  # more edges than this are drawn as a density


def approximation_section(T: Tables, methods: Sequence[str]) -> str:
    """Return each approximate method's scatter against exact, its rank agreement and the edges with the largest bias."""
    t = T.need("approximation", ["method", "exact_mean", "approx_mean"])
    summ = T.get("approximation_summary")
    sm: dict[str, dict[str, float]] = {}
    if summ is not None and "method" in summ.column_names:
        for i, m in enumerate(strs(summ, "method")):
            sm[m] = {c: float(num(summ, c)[i]) for c in ("spearman", "kendall", "slope", "r2", "bias_mean", "top_k_overlap", "k")}
    meth = order_methods([m for m in methods if m in methods_in(t)] + methods_in(t))
    col = colours(methods)
    ms = np.array(strs(t, "method"))
    figs, srows, erows = [], [], []
    for m in meth:
        s = sub(t, ms == m)
        x, y = num(s, "exact_mean"), num(s, "approx_mean")
        names = strs(s, "name")
        ok = finite(x, y)
        lo, hi = data_range(x[ok], y[ok])
        d = nice_domain(*padded(lo, hi, 0.04))
        p = Plot(340, 340, d, d, margin=(14, 14, 42, 58), label=f"exact vs {m}")
        p.line(list(d), list(d), "#999", width=1.0, dash="4,3", title="y = x")
        n_ok = int(ok.sum())
        if n_ok > MAX_SCATTER_POINTS:
            bins = 48
            h, xe, ye = np.histogram2d(x[ok], y[ok], bins=bins, range=[d, d])
            hmax = np.log1p(h.max())
            for i, j in zip(*np.nonzero(h)):
                c = ramp(("#dfe7f2", col[m]), float(np.log1p(h[i, j]) / hmax))
                x0, x1, y0, y1 = p.x(xe[i]), p.x(xe[i + 1]), p.y(ye[j + 1]), p.y(ye[j])
                p.raw(f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0 + 0.3:.1f}" height="{y1 - y0 + 0.3:.1f}" fill="{c}"/>')
            top = np.flatnonzero(ok)[np.argsort(-np.abs(x[ok]))[:150]]
            p.points(x[top], y[top], col[m], r=2.4, titles=[f"{names[i]}: exact {fmt(x[i])}, {m} {fmt(y[i])}" for i in top])
            drawn = f"{n_ok:,} edges as a density (darker = more) plus the 150 largest |exact| as points"
        else:
            if n_ok <= 400:
                p.points(x, y, col[m], r=2.6, opacity=0.75, titles=[f"{nme}: exact {fmt(a)}, {m} {fmt(b)}" for nme, a, b in zip(names, x, y)])
            else:
                p.points(x, y, col[m], r=2.2, opacity=0.6)
            drawn = f"{n_ok:,} edges"
        st = sm.get(m, {})
        slope, r2 = st.get("slope", math.nan), st.get("r2", math.nan)
        src = "approximation_summary"
        if not math.isfinite(slope) and n_ok >= 2:
            slope, intercept = np.polyfit(x[ok], y[ok], 1)
            r2 = float(np.corrcoef(x[ok], y[ok])[0, 1] ** 2)
            src = "least squares here (approximation_summary is missing)"
        if math.isfinite(slope) and n_ok:
            intercept = float(np.mean(y[ok]) - slope * np.mean(x[ok]))
            p.line(list(d), [intercept + slope * d[0], intercept + slope * d[1]], col[m], width=1.2, title=f"fit: slope {fmt(slope)}")
        p.axes("exact (mean over examples)", f"{m} (mean over examples)")
        cap = (f"{m} vs exact: {drawn}; dashed: y = x; solid: fit. Slope {fmt(slope)}, R² {fmt(r2)}"
               + (f", Spearman {fmt(st['spearman'])}, Kendall {fmt(st['kendall'])}" if st else "") + f" (from {src}).")
        figs.append(f'<figure>{p.svg()}<figcaption>{esc(cap)}</figcaption></figure>')
        if st:
            srows.append([m, st["spearman"], st["kendall"], st["slope"], st["r2"], st["bias_mean"], st["top_k_overlap"], st["k"]])
        bias = num(s, "bias")
        if not np.isfinite(bias).any():
            bias = y - x
        o = np.argsort(-np.abs(np.where(np.isfinite(bias), bias, 0)), kind="stable")[:10]
        for i in o:
            erows.append([m, names[i], x[i], y[i], bias[i], num(s, "error_sd")[i], num(s, "slope")[i], num(s, "r2")[i]])
    tables = []
    if srows:
        tables.append(html_table([("method", "text"), ("Spearman", "num"), ("Kendall", "num"), ("slope", "num"), ("R²", "num"),
                                  ("mean bias", "num"), ("top-k overlap", "num"), ("k", "int")], srows))
    else:
        tables.append(note("approximation_summary.parquet is missing: no rank agreement summary."))
    tables.append(html_table([("method", "text"), ("edge", "text"), ("exact", "num"), ("approx", "num"), ("bias", "num"),
                              ("error SD", "num"), ("per-input slope", "num"), ("per-input R²", "num")], erows,
                             shown_note="per method, the 10 edges with the largest |bias| (approx − exact)"))
    return f'<div class="row">{"".join(figs)}<div class="tablebox">{"".join(tables)}</div></div>'

