"""The heads section: head stability across seeds ranked by excess over the null, layers, residual CKA, summary.

A stability claim is a claim about excess over its null (docs/results.md, "Head stability across seeds"):
heads are ranked by their excess over the shuffled-prompt null, with the interval over training seeds (every
refit an anchor: excess_ci_*, refit_ci_*), the one the claims check reads. Runs written before those columns
show the anchor-fixed interval, labelled as such.
"""

from __future__ import annotations

import math

import numpy as np

from circuitstat.reports.ci import Ci
from circuitstat.reports.html.common import MAX_ROWS, Tables, ci_attrs, figure, html_table, ints, num, shown, strs
from circuitstat.reports.html.summary import summary_items_part
from circuitstat.reports.html.svg import (FONT, PALETTE, VIRIDIS, Plot, colour_legend, data_range, esc, fmt, nice_domain, padded, ramp,
                              svg_open, text_colour)
from circuitstat.reports.tableset import rows
from circuitstat.reports.verdicts.model import NEEDS_SEEDS

__all__ = ["heatmap", "heads_part", "layers_part", "residual_part", "head_summary_part"]


def heatmap(values: np.ndarray, tips: list[list[str]], label: str, lo: float, hi: float,
            cis: list[list[Ci | None]] | None = None) -> str:
    """Return a [layers x heads] heatmap (layer 0 at the bottom) with a colour bar from lo to hi."""
    n_layers, n_heads = values.shape
    c = max(8.0, min(40.0, 520 / max(n_heads, 1), 520 / max(n_layers, 1)))
    left, top, bottom = 48, 44, 40
    width = max(left + n_heads * c + 20, 260)
    height = top + n_layers * c + bottom
    parts = [svg_open(width, height, label)]
    for li in range(n_layers):
        y = top + (n_layers - 1 - li) * c
        for h in range(n_heads):
            v = values[li, h]
            fill = "#eeeeee" if not math.isfinite(v) else ramp(VIRIDIS, (v - lo) / (hi - lo) if hi > lo else 0.5)
            x = left + h * c
            txt = ""
            if c >= 26 and math.isfinite(v):
                txt = (f'<text x="{x + c / 2:.1f}" y="{y + c / 2 + 3.5:.1f}" font-size="{FONT - 2}" text-anchor="middle" '
                       f'fill="{text_colour(fill)}">{esc(fmt(v, 2))}</text>')
            ci = cis[li][h] if cis else None
            attrs = ci_attrs(ci) if ci is not None else ""
            parts.append(f'<g{attrs}><rect x="{x:.1f}" y="{y:.1f}" width="{c:.1f}" height="{c:.1f}" fill="{fill}" '
                         f'stroke="#fff" stroke-width="0.5"/>{txt}<title>{esc(tips[li][h])}</title></g>')
        if n_layers <= 40 or li % 2 == 0:
            parts.append(f'<text x="{left - 5}" y="{y + c / 2 + 3.5:.1f}" font-size="{FONT - 1}" text-anchor="end">{li}</text>')
    step = 1 if c >= 14 else (2 if c >= 8 else 4)
    for h in range(0, n_heads, step):
        parts.append(f'<text x="{left + h * c + c / 2:.1f}" y="{top + n_layers * c + 13:.1f}" font-size="{FONT - 1}" '
                     f'text-anchor="middle">{h}</text>')
    parts.append(f'<text x="{left + n_heads * c / 2:.1f}" y="{height - 6:.1f}" font-size="{FONT}" text-anchor="middle">head</text>')
    parts.append(f'<text transform="translate(13,{top + n_layers * c / 2:.1f}) rotate(-90)" font-size="{FONT}" '
                 'text-anchor="middle">layer</text>')
    parts.append(colour_legend(left, 18, VIRIDIS, lo, hi, label, width=min(160, width - left - 10)))
    parts.append("</svg>")
    return "".join(parts)


def _head_cis(t, hs: list[dict]) -> tuple[list[Ci], list[Ci], bool]:
    """Return per head (excess interval, stability interval) and whether they are over training seeds."""
    key = tuple(c for c in ("layer", "head", "match", "pairs") if c in t.column_names)
    if "excess_ci_low" in t.column_names and np.isfinite(num(t, "excess")).any():
        few = [0 < (h.get("n_refits") or 0) < 3 for h in hs]
        exc = [Ci.of("heads", h, key, "excess_ci", est="excess", unavailable=NEEDS_SEEDS if f else "") for h, f in zip(hs, few)]
        stab = [Ci.of("heads", h, key, "refit_ci", est="stability", unavailable=NEEDS_SEEDS if f else "")
                for h, f in zip(hs, few)]
        return exc, stab, True
    anchor = [Ci.of("heads", h, key, "ci", est="stability") for h in hs]  # an older run: labelled anchor-fixed
    return anchor, anchor, False


def _grid(L: np.ndarray, H: np.ndarray, values: np.ndarray) -> np.ndarray:
    grid = np.full((int(L.max()) + 1, int(H.max()) + 1), np.nan)
    for i, (li, h) in enumerate(zip(L, H)):
        if li >= 0 and h >= 0:
            grid[li, h] = values[i]
    return grid


def heads_part(T: Tables) -> str:
    """Return the heads ranked by excess over their null (heatmaps and table) with intervals over seeds."""
    t = T.need("heads", ["layer", "head", "stability"])
    hs = rows(t)
    L, H = ints(t, "layer"), ints(t, "head")
    exc, stab, seeds = _head_cis(t, hs)
    excess = num(t, "excess") if seeds else num(t, "stability") - num(t, "null_mean")
    figs = []
    for vals, lab in ((excess, "excess over the shuffled null"), (num(t, "stability"), "head stability"),
                      (num(t, "importance"), "importance (Δ perplexity)")):
        if not np.isfinite(vals).any():
            continue
        grid = _grid(L, H, vals)
        tips = [[f"a{li}.h{h}: no value" for h in range(grid.shape[1])] for li in range(grid.shape[0])]
        cis: list[list[Ci | None]] = [[None] * grid.shape[1] for _ in range(grid.shape[0])]
        for i, (li, h) in enumerate(zip(L, H)):
            tips[li][h] = f"a{li}.h{h} {lab} {fmt(vals[i])}\nexcess {exc[i].text()}, stability {fmt(hs[i]['stability'])}"
            cis[li][h] = exc[i]
        lo, hi = data_range(vals)
        if lab == "head stability" and lo >= 0 and hi <= 1:
            lo, hi = 0.0, 1.0
        figs.append(f'<figure class="hm">{heatmap(grid, tips, lab, lo, hi, cis)}<figcaption>{esc(lab[:1].upper() + lab[1:])} per head '
                    "(layer 0 at the bottom); hover for the interval.</figcaption></figure>")
    o = sorted(range(len(hs)), key=lambda i: -excess[i] if math.isfinite(excess[i]) else math.inf)
    body = [[f"a{L[i]}.h{H[i]}", exc[i], stab[i], hs[i].get("null_mean"), hs[i].get("distinctness"),
             hs[i].get("importance"), hs[i].get("n_refits") if seeds and (hs[i].get("n_refits") or 0) > 0 else None]
            for i in o[:MAX_ROWS]]
    cols = [("head", "text"), ("excess over null [95% CI]", "ci"), ("stability [95% CI]", "ci"), ("null", "num"),
            ("distinctness", "num"), ("importance", "num"), ("seeds", "int")]
    tbl = html_table(cols, body, shown_note=shown(len(body), len(hs), "heads", "largest excess over the null first"))
    est = exc[0].estimand if exc else ""
    cap = (f"Heads ranked by excess of their cross-seed stability over the shuffled-prompt null. Intervals cover {est}"
           + ("" if seeds else " (this older run has no interval over training seeds)") + ".")
    return f'<h3>Heads</h3><p class="caption">{esc(cap)}</p><div class="row">{"".join(figs)}<div class="tablebox">{tbl}</div></div>'


def _layer_cis(t, rs: list[dict]) -> tuple[list[Ci], list[Ci], bool]:
    """Return per layer (excess interval, stability interval) and whether they are over training seeds."""
    if "refit_ci_low" in t.column_names and np.isfinite(num(t, "stability_all_anchors")).any():
        few = [0 < (r.get("n_refits") or 0) < 3 for r in rs]
        un = [NEEDS_SEEDS if f else "" for f in few]
        return ([Ci.of("layers", r, ("layer",), "excess_ci", est="excess", unavailable=u) for r, u in zip(rs, un)],
                [Ci.of("layers", r, ("layer",), "refit_ci", est="stability_all_anchors", unavailable=u)
                 for r, u in zip(rs, un)], True)
    anchor = [Ci.of("layers", r, ("layer",), "ci", est="stability") for r in rs]
    return anchor, anchor, False


def layers_part(T: Tables) -> str:
    """Return layer stability (every refit an anchor) with its interval over seeds against its null, and the table."""
    t = T.need("layers", ["layer", "stability"])
    rs = sorted(rows(t), key=lambda r: r["layer"])
    exc, stab, seeds = _layer_cis(t, rs)
    L = np.array([r["layer"] for r in rs], dtype=float)
    y = np.array([c.value for c in stab], dtype=float)
    null = np.array([np.nan if r.get("null_mean") is None else r["null_mean"] for r in rs], dtype=float)
    lo, hi = data_range(y, [c.lo for c in stab], [c.hi for c in stab], null)
    yd = nice_domain(*padded(lo, hi, 0.08))
    p = Plot(520, 320, (L.min() - 0.6, L.max() + 0.6), yd, label="layer stability vs null")
    col = PALETTE[0]
    for x, c in zip(L, stab):
        p.vbar(x, c.lo, c.hi, col)
    p.line(L, null, "#777", width=1.2, dash="4,3", title="null")
    p.points(L, null, "#777", r=3.5, shape="x", titles=[f"layer {int(a)} null {fmt(b)}" for a, b in zip(L, null)])
    p.points(L, y, col, r=3.5, titles=[f"layer {int(a)}: stability {c.text()}" for a, c in zip(L, stab)],
             attrs=[ci_attrs(c) for c in stab])
    p.legend("layer stability " + ("(every refit an anchor) with CI over seeds" if seeds else "(anchor refit)"), col, "point")
    p.legend("shuffled-prompt null", "#777", "x")
    xt = L.tolist() if L.size <= 24 else L[:: max(1, L.size // 12)].tolist()
    p.axes("layer", "stability", xticks=xt, xtick_labels=[str(int(x)) for x in xt])
    gap = float(np.nanmax(y) - np.nanmin(y)) if np.isfinite(y).any() else math.nan
    body = [[int(r["layer"]), e, s, r.get("null_mean"), r.get("n_refits") if seeds and (r.get("n_refits") or 0) > 0 else None]
            for r, e, s in zip(rs, exc, stab)]
    tbl = html_table([("layer", "int"), ("excess over null [95% CI]", "ci"), ("stability [95% CI]", "ci"),
                      ("null", "num"), ("seeds", "int")], body[:MAX_ROWS])
    cap = (f"Layer stability (mean over its heads) with its interval against the shuffled-prompt null (×, dashed). Gap "
           f"(max − min) = {fmt(gap)}. Intervals cover {stab[0].estimand if stab else ''}.")
    return "<h3>Layers</h3>" + figure(p.svg(), cap, tbl)


def residual_part(T: Tables) -> str:
    """Return the residual-stream CKA between seeds per layer, kind and hook, with CI bands and reliability."""
    t = T.need("residual", ["layer", "cka"])
    rs = rows(t)
    for r in rs:  # runs written before the column existed: only the debiased kind's intervals cover
        if r.get("interval_reliable") is None:
            r["interval_reliable"] = r.get("kind") == "debiased"
    key = tuple(c for c in ("layer", "hook", "kind") if c in t.column_names)
    cis = [Ci.of("residual", r, key, "ci", est="cka") for r in rs]
    series = list(dict.fromkeys((r.get("kind") or "", r.get("hook") or "") for r in rs))
    kinds = list(dict.fromkeys(k for k, _ in series))
    hooks = list(dict.fromkeys(h for _, h in series))
    lo, hi = data_range([c.value for c in cis], [c.lo for c in cis], [c.hi for c in cis])
    L = [float(r["layer"]) for r in rs]
    p = Plot(520, 320, (min(L) - 0.4, max(L) + 0.4), nice_domain(*padded(lo, hi, 0.08)), label="residual CKA per layer")
    for kd, hk in series:
        idx = sorted((i for i, r in enumerate(rs) if (r.get("kind") or "", r.get("hook") or "") == (kd, hk)), key=lambda i: L[i])
        c = PALETTE[kinds.index(kd) % len(PALETTE)]
        dash = None if hooks.index(hk) == 0 else "5,3"
        x = [L[i] for i in idx]
        p.band(x, [cis[i].lo for i in idx], [cis[i].hi for i in idx], c, opacity=0.12)
        p.line(x, [cis[i].value for i in idx], c, dash=dash, title=f"{kd} CKA at {hk}")
        p.points(x, [cis[i].value for i in idx], c, r=2.6, titles=[f"layer {int(L[i])} {kd} CKA at {hk}: {cis[i].text()}"
                                                                   for i in idx], attrs=[ci_attrs(cis[i]) for i in idx])
        p.legend(f"{kd} @ {hk}" if hk else kd, c, "line" if dash is None else "dash")
    xt = sorted(set(L))
    xt = xt if len(xt) <= 24 else xt[:: max(1, len(xt) // 12)]
    p.axes("layer", "CKA across seeds", xticks=xt, xtick_labels=[str(int(x)) for x in xt])
    body = [[int(r["layer"]), r.get("hook"), r.get("kind"), ci] for r, ci in zip(rs, cis)]
    tbl = html_table([("layer", "int"), ("hook", "text"), ("kind", "text"), ("CKA [95% CI]", "ci")], body[:MAX_ROWS],
                     shown_note=shown(min(len(body), MAX_ROWS), len(body), "rows", "first rows"))
    cap = (f"Residual-stream CKA between seeds per layer with CI bands (colour: CKA kind; dashed: second hook); the "
           f"intervals cover {cis[0].estimand if cis else ''}. Only the debiased kind's intervals cover the population "
           "CKA; linear and RBF CKA are biased in finite samples, so their intervals are flagged '! biased kind'.")
    return "<h3>Residual stream</h3>" + figure(p.svg(), cap, tbl)


def head_summary_part(T: Tables) -> str:
    """Return the head-stability run's summary items (the audit's heads stage or the head study writes them)."""
    return summary_items_part(T, "Head-stability summary")
