"""The tokens section (``circuitstat tokens``): attention sinks, token-importance drops and their differences,
token-weight heatmaps, and, for a cross-seed run, sinks and important tokens across seeds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from circuitstat.reports.analyses import SEED_TABLES, TOKEN_TABLES, token_model_dirs
from circuitstat.reports.ci import Ci
from circuitstat.reports.html.common import (MAX_ROWS, Missing, Tables, ci_attrs, ci_html, colours, figure, first, html_table, ints,
                                 k_ticks, num, part, shown, strs, x_domain_k)
from circuitstat.reports.html.svg import FONT, PALETTE, Plot, data_range, esc, finite, fmt, nice_domain, padded, ramp, svg_open
from circuitstat.reports.html.tokens_seeds import sink_matching_part, sink_stability_part, token_stability_part
from circuitstat.reports.tableset import rows

__all__ = ["tokens_section"]

HEATMAP_PROMPTS = 3  # prompts drawn as contribution-vs-attention heatmaps (the rest are in token_weights)
DIVERGING = ("#2166ac", "#67a9cf", "#d1e5f0", "#f7f7f7", "#fddbc7", "#ef8a62", "#b2182b")


def tokens_section(T: Tables, sources: Sequence[str] = ()) -> str:
    """The tokens section: per model, sinks (scatter with the fit), drops, differences, heatmaps; then across seeds.

    `sources` names the models of a cross-seed run (model-<i> is sources[i]); a sub-part whose
    tables are missing is a note (common.part)."""
    out = []
    if any(T.path(t).exists() for t in TOKEN_TABLES):
        out.append(_token_model_parts(T, heatmaps=True))
    for j, d in enumerate(token_model_dirs(T.dir)):
        i = int(d.name.split("-", 1)[1])
        src = f": {sources[i]}" if i < len(sources) else ""
        # the refits share the task's prompts: one model's heatmaps show them (the file stays small)
        out.append(f"<h3>{esc(d.name + src)}</h3>" + _token_model_parts(Tables(d, prefix=f"{d.name}/"), heatmaps=j == 0))
    if any(T.path(t).exists() for t in SEED_TABLES):
        out.append("<h3>Across seeds</h3>" + part(lambda: sink_stability_part(T)) + part(lambda: sink_matching_part(T))
                   + part(lambda: token_stability_part(T)))
    if not out:
        raise Missing("No tables of `circuitstat tokens` are in this run directory, so this section is omitted.")
    return "".join(out)


def _token_model_parts(T: Tables, heatmaps: bool) -> str:
    """Return one model's parts: sinks, drops, differences and (when `heatmaps`) the token-weight heatmaps."""
    parts = [lambda: sinks_part(T), lambda: token_drops_part(T), lambda: token_diffs_part(T)]
    return "".join(part(f) for f in parts + ([lambda: token_heatmaps_part(T)] if heatmaps else []))


def _fit_rows(T: Tables) -> dict[str, dict[str, Any]]:
    """Return sink_fit's rows by term ({} without the table)."""
    t = T.get("sink_fit")
    if t is None or "term" not in t.column_names:
        return {}
    return {r["term"]: r for r in t.to_pylist()}


def sinks_part(T: Tables) -> str:
    """Sink rate vs output norm per head, with CIs, the fitted quadratic and its curvature interval."""
    t = T.need("sink_heads", ["layer", "head", "sink_rate", "output_norm"])
    hs = rows(t)
    name = T.name("sink_heads")
    rate = [Ci.of(name, h, ("layer", "head"), "ci", est="sink_rate") for h in hs]
    norm = [Ci.of(name, h, ("layer", "head"), "norm_ci", est="output_norm", flag="") for h in hs]
    nodes = [h.get("node") or f"a{h['layer']}.h{h['head']}" for h in hs]
    x, y = np.array([c.value for c in rate]), np.array([c.value for c in norm])
    if not finite(x, y).any():
        raise Missing("sink_heads.parquet has no head with a finite sink rate and output norm, so the scatter is omitted.")
    fit = _fit_rows(T)
    b = [fit.get(term, {}).get("estimate", math.nan) for term in ("intercept", "slope", "curvature")]
    xs = np.linspace(*data_range(x), 60)
    curve = b[0] + b[1] * xs + b[2] * xs ** 2 if all(v is not None and math.isfinite(v) for v in b) else None
    lo, hi = data_range(x, [c.lo for c in rate], [c.hi for c in rate], [0.0])
    xd = (lo - 0.03 * (hi - lo), nice_domain(lo, hi)[1])  # rates are shares: no negative ticks
    yd = nice_domain(*padded(*data_range(y, [c.lo for c in norm], [c.hi for c in norm], [] if curve is None else curve), 0.06))
    p = Plot(520, 360, xd, yd, label="sink rate vs output norm per head")
    if curve is not None:
        p.line(xs, curve, "#555", width=1.4, dash="6,3", title="least-squares quadratic")
        p.legend("quadratic fit", "#555", "dash")
    layers = sorted({h["layer"] for h in hs})
    for li in layers:
        idx = [i for i, h in enumerate(hs) if h["layer"] == li]
        col = PALETTE[layers.index(li) % len(PALETTE)]
        for i in idx:
            p.hbar(y[i], rate[i].lo, rate[i].hi, col, width=1.0)
            p.vbar(x[i], norm[i].lo, norm[i].hi, col, width=1.0)
        p.points(x[idx], y[idx], col, r=3.5, attrs=[ci_attrs(rate[i]) for i in idx],
                 titles=[f"{nodes[i]}: sink rate {rate[i].text()}, output norm {fmt(y[i])}" for i in idx])
        p.legend(f"layer {li}", col, "point")
    p.axes("sink rate (share of positions attending to the sink above the threshold)", "mean head output norm")
    o = sorted(range(len(hs)), key=lambda i: (hs[i]["layer"], hs[i]["head"]))
    body = [[nodes[i], rate[i], norm[i], hs[i].get("confidence_gap")] for i in o[:MAX_ROWS]]
    tbl = html_table([("head", "text"), ("sink rate [95% CI]", "ci"), ("output norm [95% CI]", "ci"),
                      ("confidence gap", "num")], body, shown_note=shown(len(body), len(hs), "heads", "by layer, head"))
    thr, n = num(t, "threshold"), num(t, "n")
    cap = (f"Each head's sink rate (threshold {fmt(thr[0]) if thr.size else '—'} on the attention to the sink token) "
           f"against its mean output norm, means over {int(n[0]) if n.size and n[0] >= 0 else '—'} prompts with their intervals "
           "(both cover the head's mean over the prompt distribution; '! few prompts' marks a sink rate a few prompts carry). ")
    return "<h4>Attention sinks: sink rate vs output norm</h4>" + figure(p.svg(), esc(cap) + _fit_caption(T, fit), tbl,
                                                                         html=True)


def _fit_caption(T: Tables, fit: dict[str, dict[str, Any]]) -> str:
    """The fitted relation in words (HTML): curvature and Spearman with their intervals, verdicts and rules."""
    if not fit:
        return esc("sink_fit.parquet is missing, so no fit is drawn.")
    parts = []
    for term, what in (("curvature", "curvature b2 of the quadratic norm = b0 + b1 s + b2 s²"), ("spearman", "Spearman ρ")):
        r = fit.get(term)
        if r is None:
            continue
        ci = Ci.of(T.name("sink_fit"), r, ("term",), "ci", est="estimate", flag="")
        parts.append(f"{esc(what)} = {ci_html(ci)} ({esc(r.get('interval') or 'interval')}): "
                     f"{esc(r.get('verdict') or 'no verdict')}")
    first_row = next(iter(fit.values()))
    est = (fit.get("curvature") or first_row).get("estimand") or ""
    rule = first_row.get("multiplicity") or ""
    return ("Dashed: the least-squares quadratic across heads; " + "; ".join(parts)
            + (esc(f". The curvature interval covers {est}") if est else "") + (esc(f". Verdicts: {rule}.") if rule else "."))


def token_drops_part(T: Tables) -> str:
    """Mean metric drop per measure and k with intervals (random = the null)."""
    t = T.need("token_importance", ["measure", "k", "mean_drop", "ci_low", "ci_high"])
    rs = [r for r in rows(t) if r.get("k") is not None]
    cis = [Ci.of(T.name("token_importance"), r, ("measure", "k"), est="mean_drop") for r in rs]
    measures = list(dict.fromkeys(r["measure"] for r in rs))
    col = colours(measures)
    ks = sorted({r["k"] for r in rs})
    pos = {kk: i for i, kk in enumerate(ks)}
    w = min(0.7, 0.16 * len(measures))
    off = {m: (j - (len(measures) - 1) / 2) * (w / max(len(measures) - 1, 1)) for j, m in enumerate(measures)}
    yd = nice_domain(*padded(*data_range([c.value for c in cis], [c.lo for c in cis], [c.hi for c in cis], [0.0]), 0.04))
    p = Plot(560, 340, (-0.6, len(ks) - 0.4), yd, label="mean metric drop per measure and k")
    p.hline(0.0, "#999", dash=None)
    for m in measures:
        idx = [i for i, r in enumerate(rs) if r["measure"] == m]
        xs = np.array([pos[rs[i]["k"]] + off[m] for i in idx])
        for xx, i in zip(xs, idx):
            p.vbar(xx, cis[i].lo, cis[i].hi, col[m])
        p.points(xs, [cis[i].value for i in idx], col[m], r=3.4, attrs=[ci_attrs(cis[i]) for i in idx],
                 titles=[f"{m} k={rs[i]['k']}: mean drop {cis[i].text()}" for i in idx])
        p.legend(m + (" (null)" if m == "random" else ""), col[m], "point")
    p.axes("k (top tokens ablated)", "mean metric drop", xticks=list(range(len(ks))), xtick_labels=[str(k) for k in ks])
    body = [[r["measure"], r["k"], c, r.get("n")] for r, c in zip(rs, cis)]
    tbl = html_table([("measure", "text"), ("k", "int"), ("mean drop [95% CI]", "ci"), ("n", "int")], body[:MAX_ROWS])
    est, how = first(t, "estimand"), first(t, "interval")
    cap = (f"Metric drop when each measure's top-k tokens are ablated (random: the null), mean over prompts with its "
           f"interval ({how or 'interval over prompts'}; covers {est or 'the mean drop over the prompt distribution'}); "
           "'! few prompts' marks a mean a few prompts carry.")
    return "<h4>Token-importance faithfulness: mean drop per measure and k</h4>" + figure(p.svg(), cap, tbl)


def token_diffs_part(T: Tables) -> str:
    """The paired differences of drops between measures with their Holm verdicts."""
    t = T.need("token_importance_diffs", ["measure_a", "measure_b", "k", "difference", "verdict"])
    rs = rows(t)
    body = [[r["measure_a"], r["measure_b"], r["k"],
             Ci.of(T.name("token_importance_diffs"), r, ("measure_a", "measure_b", "k"), est="difference"),
             r.get("pvalue"), r.get("pvalue_holm"), r.get("verdict")] for r in rs]
    tbl = html_table([("measure a", "text"), ("measure b", "text"), ("k", "int"), ("drop a − b [95% CI]", "ci"),
                      ("p", "p"), ("p (Holm)", "p"), ("verdict", "text")], body[:MAX_ROWS],
                     shown_note=shown(min(len(body), MAX_ROWS), len(body), "differences", "first rows"))
    n_sig = sum(r.get("verdict") != "inconclusive" for r in rs)
    rule, est = first(t, "multiplicity"), first(t, "estimand")
    cap = (f"Paired differences of the metric drop between measures (same prompts), {n_sig} of {t.num_rows} decided. "
           f"Verdicts: {rule or 'Holm over the family'}. Intervals cover {est or 'the mean paired difference'}; a "
           "difference flagged '! few prompts' rests on a few prompts.")
    return f"<h4>Which measure finds the tokens that matter?</h4><p>{esc(cap)}</p>" + f'<div class="tablebox">{tbl}</div>'


def token_heatmaps_part(T: Tables) -> str:
    """Per-token weights of every measure for the first prompts (rows: measures; columns: positions)."""
    t = T.need("token_weights", ["prompt", "position", "token"])
    measures = [m for m in ("attention", "value_norm", "contribution", "grad_input") if m in t.column_names]
    if not measures:
        raise Missing("token_weights.parquet has no measure columns, so the heatmaps are omitted.")
    prompt, position, token = ints(t, "prompt"), ints(t, "position"), ints(t, "token")
    readout = num(t, "is_readout")
    shown_prompts = sorted(set(prompt.tolist()))[:HEATMAP_PROMPTS]
    figs = []
    for n in shown_prompts:
        m = prompt == n
        o = np.argsort(position[m], kind="stable")
        pos, tok, ro = position[m][o], token[m][o], readout[m][o]
        vals = np.stack([num(t, c)[m][o] for c in measures])
        figs.append(f"<figure>{_token_heatmap(vals, measures, pos, tok, ro, n)}<figcaption>Prompt {n}: each measure's "
                    "weight per token at the read-out position (outlined), scaled by the row's largest |weight| "
                    "(red positive, blue negative); hover for values.</figcaption></figure>")
    n_prompts = len(set(prompt.tolist()))
    cap = (f"Contribution vs attention on {len(shown_prompts)} of {n_prompts} prompts (every prompt's weights are in "
           "token_weights.parquet).")
    return f'<h4>Token weights per measure</h4><p>{esc(cap)}</p><div class="row">{"".join(figs)}</div>'


def _token_heatmap(vals: np.ndarray, measures: Sequence[str], pos: np.ndarray, tok: np.ndarray, readout: np.ndarray,
                   prompt: int) -> str:
    """One prompt's [measures x positions] heatmap, each row scaled by its largest |weight|."""
    n_rows, n_cols = vals.shape
    c = max(6.0, min(22.0, 640 / max(n_cols, 1)))
    left, top, bottom = 92, 10, 30
    width, height = left + n_cols * c + 12, top + n_rows * c + bottom
    parts = [svg_open(width, height, f"token weights of prompt {prompt}")]
    for r, name in enumerate(measures):
        scale = np.nanmax(np.abs(vals[r])) if np.isfinite(vals[r]).any() else math.nan
        y = top + r * c
        parts.append(f'<text x="{left - 5}" y="{y + c / 2 + 3.5:.1f}" font-size="{FONT - 1}" text-anchor="end">{esc(name)}</text>')
        for j in range(n_cols):
            v = vals[r, j]
            fill = "#eeeeee" if not (math.isfinite(v) and scale > 0) else ramp(DIVERGING, 0.5 + 0.5 * v / scale)
            x = left + j * c
            edge = ' stroke="#000" stroke-width="1.2"' if readout[j] == 1 else ' stroke="#fff" stroke-width="0.5"'
            tip = f"{name}, position {pos[j]} (token {tok[j]}): {fmt(v)}" + (" — read-out" if readout[j] == 1 else "")
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{c:.1f}" height="{c:.1f}" fill="{fill}"{edge}>'
                         f"<title>{esc(tip)}</title></rect>")
    step = max(1, int(math.ceil(24 / c)))
    for j in range(0, n_cols, step):
        parts.append(f'<text x="{left + j * c + c / 2:.1f}" y="{top + n_rows * c + 12:.1f}" font-size="{FONT - 2}" '
                     f'text-anchor="middle">{pos[j]}</text>')
    parts.append(f'<text x="{left + n_cols * c / 2:.1f}" y="{height - 4:.1f}" font-size="{FONT - 1}" '
                 'text-anchor="middle">position</text></svg>')
    return "".join(parts)


