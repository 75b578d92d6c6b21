"""The approximation error section: each approximate method against exact, edge by edge, and its agreement."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from circuitstat.reports.html.common import Tables, colours, html_table, methods_in, note, num, order_methods, strs, sub
from circuitstat.reports.html.svg import Plot, data_range, esc, finite, fmt, nice_domain, padded, ramp

__all__ = ["approximation_section"]

MAX_SCATTER_POINTS = 2000  # more edges than this are drawn as a density
SUMMARY = ("spearman", "kendall", "slope", "r2", "bias_mean", "top_k_overlap", "k")


def _summary(T: Tables) -> dict[str, dict[str, float]]:
    """Return approximation_summary by method ({} without it)."""
    summ = T.get("approximation_summary")
    if summ is None or "method" not in summ.column_names:
        return {}
    return {m: {c: float(num(summ, c)[i]) for c in SUMMARY} for i, m in enumerate(strs(summ, "method"))}


def _density(p: Plot, x: np.ndarray, y: np.ndarray, d: tuple[float, float], colour: str) -> None:
    """Draw many points as a 2-D histogram (darker = more edges)."""
    h, xe, ye = np.histogram2d(x, y, bins=48, range=[d, d])
    hmax = np.log1p(h.max())
    for i, j in zip(*np.nonzero(h)):
        c = ramp(("#dfe7f2", colour), float(np.log1p(h[i, j]) / hmax))
        x0, x1, y0, y1 = p.x(xe[i]), p.x(xe[i + 1]), p.y(ye[j + 1]), p.y(ye[j])
        p.raw(f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0 + 0.3:.1f}" height="{y1 - y0 + 0.3:.1f}" fill="{c}"/>')


def _scatter(s, m: str, colour: str, st: dict[str, float]) -> str:
    """Return one method's exact-vs-approximate scatter with y = x and its fit, captioned."""
    x, y, names = num(s, "exact_mean"), num(s, "approx_mean"), strs(s, "name")
    ok = finite(x, y)
    d = nice_domain(*padded(*data_range(x[ok], y[ok]), 0.04))
    p = Plot(340, 340, d, d, margin=(14, 14, 42, 58), label=f"exact vs {m}")
    p.line(list(d), list(d), "#999", width=1.0, dash="4,3", title="y = x")
    n_ok = int(ok.sum())
    if n_ok > MAX_SCATTER_POINTS:
        _density(p, x[ok], y[ok], d, colour)
        top = np.flatnonzero(ok)[np.argsort(-np.abs(x[ok]))[:150]]
        p.points(x[top], y[top], colour, r=2.4, titles=[f"{names[i]}: exact {fmt(x[i])}, {m} {fmt(y[i])}" for i in top])
        drawn = f"{n_ok:,} edges as a density (darker = more) plus the 150 largest |exact| as points"
    else:
        titles = [f"{a}: exact {fmt(b)}, {m} {fmt(c)}" for a, b, c in zip(names, x, y)] if n_ok <= 400 else None
        p.points(x, y, colour, r=2.6 if titles else 2.2, opacity=0.75, titles=titles)
        drawn = f"{n_ok:,} edges"
    slope, r2, src = st.get("slope", math.nan), st.get("r2", math.nan), "approximation_summary"
    if not math.isfinite(slope) and n_ok >= 2:
        slope, _ = np.polyfit(x[ok], y[ok], 1)
        r2, src = float(np.corrcoef(x[ok], y[ok])[0, 1] ** 2), "least squares here (approximation_summary is missing)"
    if math.isfinite(slope) and n_ok:
        intercept = float(np.mean(y[ok]) - slope * np.mean(x[ok]))
        p.line(list(d), [intercept + slope * d[0], intercept + slope * d[1]], colour, width=1.2, title=f"fit: slope {fmt(slope)}")
    p.axes("exact (mean over examples)", f"{m} (mean over examples)")
    cap = (f"{m} vs exact: {drawn}; dashed: y = x; solid: fit. Slope {fmt(slope)}, R² {fmt(r2)}"
           + (f", Spearman {fmt(st['spearman'])}, Kendall {fmt(st['kendall'])}" if st else "") + f" (from {src}).")
    return f"<figure>{p.svg()}<figcaption>{esc(cap)}</figcaption></figure>"


def _worst(s, m: str) -> list[list]:
    """Return the method's 10 edges with the largest |bias| as table rows."""
    x, y, bias = num(s, "exact_mean"), num(s, "approx_mean"), num(s, "bias")
    if not np.isfinite(bias).any():
        bias = y - x
    o = np.argsort(-np.abs(np.where(np.isfinite(bias), bias, 0)), kind="stable")[:10]
    names = strs(s, "name")
    return [[m, names[i], x[i], y[i], bias[i], num(s, "error_sd")[i], num(s, "slope")[i], num(s, "r2")[i]] for i in o]


def approximation_section(T: Tables, methods: Sequence[str]) -> str:
    """Return each approximate method's scatter against exact, its rank agreement and the edges with the largest bias."""
    sm = _summary(T)
    t = T.get("approximation")
    per_edge = t is not None and {"method", "exact_mean", "approx_mean"} <= set(t.column_names) and t.num_rows > 0
    meth = order_methods([m for m in methods if m in methods_in(t) or m in sm] + (methods_in(t) if per_edge else []) + list(sm))
    col = colours(methods)
    figs, erows = [], []
    if per_edge:
        ms = np.array(strs(t, "method"))
        for m in meth:
            s = sub(t, ms == m)
            if s.num_rows:
                figs.append(_scatter(s, m, col.get(m, "#555"), sm.get(m, {})))
                erows += _worst(s, m)
    tables = []
    if sm:
        tables.append(html_table([("method", "text"), ("Spearman", "num"), ("Kendall", "num"), ("slope", "num"), ("R²", "num"),
                                  ("mean bias", "num"), ("top-k overlap", "num"), ("k", "int")],
                                 [[m, *(sm[m][c] for c in SUMMARY)] for m in meth if m in sm]))
    else:
        tables.append(note("approximation_summary.parquet is missing: no rank agreement summary."))
    if per_edge:
        tables.append(html_table([("method", "text"), ("edge", "text"), ("exact", "num"), ("approx", "num"), ("bias", "num"),
                                  ("error SD", "num"), ("per-input slope", "num"), ("per-input R²", "num")], erows,
                                 shown_note="per method, the 10 edges with the largest |bias| (approx − exact)"))
    else:
        tables.append(note("approximation.parquet (the per-edge errors) is not in this run directory: no scatter."))
    return f'<div class="row">{"".join(figs)}<div class="tablebox">{"".join(tables)}</div></div>'
