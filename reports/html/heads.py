"""The heads section: head stability across seeds (heatmaps), layer stability against its null, residual CKA."""

from __future__ import annotations

import math

import numpy as np

from reports.html.common import MAX_ROWS, Tables, figure, html_table, ints, num, shown, strs
from reports.html.svg import (FONT, PALETTE, VIRIDIS, Plot, colour_legend, data_range, esc, fmt, nice_domain, padded, ramp,
                              svg_open, text_colour)


def heatmap(values: np.ndarray, tips: list[list[str]], label: str, lo: float, hi: float) -> str:
    """Return a [layers x heads] heatmap (layer 0 at the bottom) with a colour bar from lo to hi."""
    n_layers, n_heads = values.shape
    c = max(8.0, min(34.0, 520 / max(n_heads, 1), 520 / max(n_layers, 1)))
    left, top, bottom = 48, 40, 40
    width = left + n_heads * c + 20
    width = max(width, 260)
    height = top + n_layers * c + bottom
    parts = [svg_open(width, height, label)]
    for li in range(n_layers):
        y = top + (n_layers - 1 - li) * c
        for h in range(n_heads):
            v = values[li, h]
            if not math.isfinite(v):
                fill = "#eeeeee"
            else:
                fill = ramp(VIRIDIS, (v - lo) / (hi - lo) if hi > lo else 0.5)
            x = left + h * c
            txt = ""
            if c >= 26 and math.isfinite(v):
                txt = f'<text x="{x + c / 2:.1f}" y="{y + c / 2 + 3.5:.1f}" font-size="{FONT - 2}" text-anchor="middle" fill="{text_colour(fill)}">{esc(fmt(v, 2))}</text>'
            parts.append(f'<g><rect x="{x:.1f}" y="{y:.1f}" width="{c:.1f}" height="{c:.1f}" fill="{fill}" stroke="#fff" stroke-width="0.5"/>{txt}<title>{esc(tips[li][h])}</title></g>')
        if n_layers <= 40 or li % 2 == 0:
            parts.append(f'<text x="{left - 5}" y="{y + c / 2 + 3.5:.1f}" font-size="{FONT - 1}" text-anchor="end">{li}</text>')
    step = 1 if c >= 14 else (2 if c >= 8 else 4)
    for h in range(0, n_heads, step):
        parts.append(f'<text x="{left + h * c + c / 2:.1f}" y="{top + n_layers * c + 13:.1f}" font-size="{FONT - 1}" text-anchor="middle">{h}</text>')
    parts.append(f'<text x="{left + n_heads * c / 2:.1f}" y="{height - 6:.1f}" font-size="{FONT}" text-anchor="middle">head</text>')
    parts.append(f'<text transform="translate(13,{top + n_layers * c / 2:.1f}) rotate(-90)" font-size="{FONT}" text-anchor="middle">layer</text>')
    parts.append(colour_legend(left, 16, VIRIDIS, lo, hi, label, width=min(160, width - left - 10)))
    parts.append("</svg>")
    return "".join(parts)


def heads_part(T: Tables) -> str:
    """Return the per-head heatmaps (stability, distinctness, importance) and the heads table."""
    t = T.need("heads", ["layer", "head", "stability"])
    L, H = ints(t, "layer"), ints(t, "head")
    n_layers, n_heads = int(L.max()) + 1, int(H.max()) + 1
    cols = {c: num(t, c) for c in ("stability", "ci_low", "ci_high", "null_mean", "distinctness", "importance")}
    match, pairs = strs(t, "match"), strs(t, "pairs")
    figs = []
    for c, lab in (("stability", "head stability"), ("distinctness", "distinctness"), ("importance", "importance (Δ perplexity)")):
        v = cols[c]
        if not np.isfinite(v).any():
            continue
        grid = np.full((n_layers, n_heads), np.nan)
        tips = [[f"L{li}.H{h}: no value" for h in range(n_heads)] for li in range(n_layers)]
        for i, (li, h) in enumerate(zip(L, H)):
            if li < 0 or h < 0:
                continue
            grid[li, h] = v[i]
            tips[li][h] = (f"L{li}.H{h} {lab} {fmt(v[i])}"
                           + (f"\nstability {fmt(cols['stability'][i])} [{fmt(cols['ci_low'][i])}, {fmt(cols['ci_high'][i])}], null {fmt(cols['null_mean'][i])}")
                           + (f"\nmatch {match[i]}" if match[i] else ""))
        lo, hi = data_range(v)
        if c == "stability" and lo >= 0 and hi <= 1:
            lo, hi = 0.0, 1.0
        figs.append(f'<figure>{heatmap(grid, tips, lab, lo, hi)}<figcaption>{esc(lab[:1].upper() + lab[1:])} per head (layer 0 at the bottom); hover for the CI and the null.</figcaption></figure>')
    o = np.lexsort((H, L))
    rows = [[int(L[i]), int(H[i]), cols["stability"][i], cols["ci_low"][i], cols["ci_high"][i], cols["null_mean"][i],
             cols["distinctness"][i], cols["importance"][i], match[i], pairs[i]] for i in o[:MAX_ROWS]]
    tcols = [("layer", "int"), ("head", "int"), ("stability", "num"), ("CI low", "num"), ("CI high", "num"), ("null", "num"),
             ("distinctness", "num"), ("importance", "num"), ("match", "text"), ("pairs", "text")]
    tbl = html_table(tcols, rows, shown_note=shown(len(rows), t.num_rows, "heads", "by layer, head"))
    return f'<h3>Heads</h3><div class="row">{"".join(figs)}<div class="tablebox">{tbl}</div></div>'


def layers_part(T: Tables) -> str:
    """Return layer stability with its CIs against its null, and the layers table."""
    t = T.need("layers", ["layer", "stability"])
    o = np.argsort(ints(t, "layer"), kind="stable")
    L = ints(t, "layer")[o].astype(float)
    v = {c: num(t, c)[o] for c in ("stability", "ci_low", "ci_high", "null_mean")}
    lo, hi = data_range(*v.values(), [0.0])
    yd = (0.0, 1.0) if lo >= 0 and hi <= 1 else nice_domain(*padded(lo, hi))
    p = Plot(520, 320, (L.min() - 0.6, L.max() + 0.6), yd, label="layer stability vs null")
    col = PALETTE[0]
    for x, a, b in zip(L, v["ci_low"], v["ci_high"]):
        p.vbar(x, a, b, col)
    p.line(L, v["null_mean"], "#777", width=1.2, dash="4,3", title="null")
    p.points(L, v["null_mean"], "#777", r=3.5, shape="x", titles=[f"layer {int(a)} null {fmt(b)}" for a, b in zip(L, v["null_mean"])])
    p.points(L, v["stability"], col, r=3.5, titles=[f"layer {int(a)}: {fmt(b)} [{fmt(c)}, {fmt(d)}]" for a, b, c, d in zip(L, v["stability"], v["ci_low"], v["ci_high"])])
    p.legend("layer stability (CI)", col, "point")
    p.legend("null", "#777", "x")
    xt = L.tolist() if L.size <= 24 else L[:: max(1, L.size // 12)].tolist()
    p.axes("layer", "stability", xticks=xt, xtick_labels=[str(int(x)) for x in xt])
    s = v["stability"]
    gap = float(np.nanmax(s) - np.nanmin(s)) if np.isfinite(s).any() else math.nan
    rows = [[int(L[i]), s[i], v["ci_low"][i], v["ci_high"][i], v["null_mean"][i], s[i] - v["null_mean"][i]] for i in range(len(L))]
    tbl = html_table([("layer", "int"), ("stability", "num"), ("CI low", "num"), ("CI high", "num"), ("null", "num"), ("above null", "num")], rows[:MAX_ROWS])
    cap = f"Layer stability (mean over heads) with CIs against its null (×, dashed). Gap (max − min) = {fmt(gap)}."
    return "<h3>Layers</h3>" + figure(p.svg(), cap, tbl)


def residual_part(T: Tables) -> str:
    """Return the residual-stream CKA between seeds per layer, kind and hook, with CI bands."""
    t = T.need("residual", ["layer", "cka"])
    L = ints(t, "layer").astype(float)
    hooks, kinds = strs(t, "hook"), strs(t, "kind")
    series = list(dict.fromkeys(zip(kinds, hooks)))
    kind_list = list(dict.fromkeys(kinds))
    hook_list = list(dict.fromkeys(hooks))
    cka, cl, ch = num(t, "cka"), num(t, "ci_low"), num(t, "ci_high")
    lo, hi = data_range(cka, cl, ch)
    yd = (0.0, 1.0) if lo >= 0 and hi <= 1 else nice_domain(*padded(lo, hi))
    p = Plot(520, 320, (L.min() - 0.4, L.max() + 0.4), yd, label="residual CKA per layer")
    rows = []
    for kd, hk in series:
        mask = np.array([(a == kd and b == hk) for a, b in zip(kinds, hooks)])
        o = np.argsort(L[mask], kind="stable")
        x, y, a, b = L[mask][o], cka[mask][o], cl[mask][o], ch[mask][o]
        c = PALETTE[kind_list.index(kd) % len(PALETTE)]
        dash = None if hook_list.index(hk) == 0 else "5,3"
        p.band(x, a, b, c, opacity=0.12)
        p.line(x, y, c, dash=dash, title=f"{kd} CKA at {hk}")
        p.points(x, y, c, r=2.6, titles=[f"layer {int(u)} {kd} CKA at {hk}: {fmt(w)} [{fmt(q)}, {fmt(z)}]" for u, w, q, z in zip(x, y, a, b)])
        p.legend(f"{kd} @ {hk}" if hk else kd, c, "line" if dash is None else "dash")
        # runs written before the column existed: the flag follows from the kind
        flag = np.array(strs(t, "interval_reliable"))[mask][o]
        trusted = [{"True": "yes", "False": "no (biased kind)"}.get(
            v, "yes" if kd == "debiased" else "no (biased kind)") for v in flag]
        rows += [[int(x[i]), hk, kd, y[i], a[i], b[i], trusted[i]] for i in range(len(x))]
    xt = sorted(set(L.tolist()))
    xt = xt if len(xt) <= 24 else xt[:: max(1, len(xt) // 12)]
    p.axes("layer", "CKA across seeds", xticks=xt, xtick_labels=[str(int(x)) for x in xt])
    tbl = html_table([("layer", "int"), ("hook", "text"), ("kind", "text"), ("CKA", "num"), ("CI low", "num"), ("CI high", "num"),
                      ("interval trusted", "text")], rows[:MAX_ROWS],
                     shown_note=shown(min(len(rows), MAX_ROWS), len(rows), "rows", "first rows"))
    return "<h3>Residual stream</h3>" + figure(p.svg(), "Residual-stream CKA between seeds per layer, with CI bands (colour: CKA kind; dashed: second hook). "
                  "Only the debiased kind's intervals cover the population CKA; linear and RBF CKA are biased in "
                  "finite samples (interval trusted: no).", tbl)

