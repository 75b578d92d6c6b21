"""The tokens section (``circuitstat tokens``): attention sinks, token-importance drops and their differences,
token-weight heatmaps, and, for a cross-seed run, sinks and important tokens across seeds."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reports.html.common import (MAX_ROWS, Missing, Tables, colours, figure, first, flag, html_table, ints, k_ticks, num, part,
                                 shown, strs, x_domain_k)
from reports.html.svg import FONT, PALETTE, Plot, data_range, esc, finite, fmt, nice_domain, padded, ramp, svg_open


TOKEN_TABLES = ("token_weights", "token_importance", "token_importance_diffs", "sink_heads", "sink_fit")
SEED_TABLES = ("token_stability", "sink_stability", "sink_matching")
HEATMAP_PROMPTS = 3  # prompts drawn as contribution-vs-attention heatmaps (the rest are in token_weights)
DIVERGING = ("#2166ac", "#67a9cf", "#d1e5f0", "#f7f7f7", "#fddbc7", "#ef8a62", "#b2182b")
_MODEL_DIR = re.compile(r"^model-(\d+)$")


def token_model_dirs(run_dir: Path) -> list[Path]:
    """Return the model-<i>/ parts of a cross-seed tokens run that hold a tokens table, in model order."""
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := _MODEL_DIR.match(p.name))]
    return [p for _, p in sorted(found) if any((p / f"{t}.parquet").exists() for t in TOKEN_TABLES)]


def has_tokens(T: Tables) -> bool:
    """Return whether the run holds tables of ``circuitstat tokens`` (at its top or under model-<i>/)."""
    return any(T.path(t).exists() for t in TOKEN_TABLES + SEED_TABLES) or bool(token_model_dirs(T.dir))


def tokens_section(T: Tables, sources: Sequence[str] = ()) -> str:
    """The tokens section: per model, sinks (scatter with the fit), drops, differences, heatmaps; then across seeds.

    `sources` names the models of a cross-seed run (model-<i> is sources[i]); a sub-part whose
    tables are missing is a note (common.part)."""
    out = []
    if any(T.path(t).exists() for t in TOKEN_TABLES):
        out.append(_token_model_parts(T, heatmaps=True))
    for j, d in enumerate(token_model_dirs(T.dir)):
        i = int(_MODEL_DIR.match(d.name).group(1))
        src = f": {sources[i]}" if i < len(sources) else ""
        # the refits share the task's prompts: one model's heatmaps show them (the file stays small)
        out.append(f"<h3>{esc(d.name + src)}</h3>" + _token_model_parts(Tables(d), heatmaps=j == 0))
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
    L, H, nodes = ints(t, "layer"), ints(t, "head"), strs(t, "node")
    nodes = [n or f"a{a}.h{b}" for n, a, b in zip(nodes, L, H)]
    c = {k: num(t, k) for k in ("sink_rate", "ci_low", "ci_high", "output_norm", "norm_ci_low", "norm_ci_high",
                                "confidence_gap", "threshold", "n", "interval_reliable")}
    x, y = c["sink_rate"], c["output_norm"]
    if not finite(x, y).any():
        raise Missing("sink_heads.parquet has no head with a finite sink rate and output norm, so the scatter is omitted.")
    fit = _fit_rows(T)
    b = [fit.get(term, {}).get("estimate", math.nan) for term in ("intercept", "slope", "curvature")]
    xs = np.linspace(*data_range(x), 60)
    curve = b[0] + b[1] * xs + b[2] * xs ** 2 if all(v is not None and math.isfinite(v) for v in b) else None
    lo, hi = data_range(x, c["ci_low"], c["ci_high"], [0.0])
    xd = (lo - 0.03 * (hi - lo), nice_domain(lo, hi)[1])  # rates are shares: no negative ticks
    yd = nice_domain(*padded(*data_range(y, c["norm_ci_low"], c["norm_ci_high"], [] if curve is None else curve), 0.06))
    p = Plot(520, 360, xd, yd, label="sink rate vs output norm per head")
    if curve is not None:
        p.line(xs, curve, "#555", width=1.4, dash="6,3", title="least-squares quadratic")
        p.legend("quadratic fit", "#555", "dash")
    layers = sorted(set(L.tolist()))
    for li in layers:
        m = L == li
        col = PALETTE[layers.index(li) % len(PALETTE)]
        for i in np.flatnonzero(m):
            p.hbar(y[i], c["ci_low"][i], c["ci_high"][i], col, width=1.0)
            p.vbar(x[i], c["norm_ci_low"][i], c["norm_ci_high"][i], col, width=1.0)
        p.points(x[m], y[m], col, r=3.5, titles=[f"{nodes[i]}: sink rate {fmt(x[i])} [{fmt(c['ci_low'][i])}, "
                                                 f"{fmt(c['ci_high'][i])}], output norm {fmt(y[i])} "
                                                 f"[{fmt(c['norm_ci_low'][i])}, {fmt(c['norm_ci_high'][i])}]"
                                                 for i in np.flatnonzero(m)])
        p.legend(f"layer {li}", col, "point")
    p.axes("sink rate (share of positions attending to the sink above the threshold)", "mean head output norm")
    o = np.lexsort((H, L))
    rows = [[nodes[i], x[i], c["ci_low"][i], c["ci_high"][i], y[i], c["norm_ci_low"][i], c["norm_ci_high"][i],
             c["confidence_gap"][i], flag(c["interval_reliable"][i])]
            for i in o[:MAX_ROWS]]
    tbl = html_table([("head", "text"), ("sink rate", "num"), ("CI low", "num"), ("CI high", "num"), ("output norm", "num"),
                      ("norm CI low", "num"), ("norm CI high", "num"), ("confidence gap", "num"),
                      ("interval reliable", "bool")], rows, shown_note=shown(len(rows), t.num_rows, "heads", "by layer, head"))
    thr, n = c["threshold"], c["n"]
    cap = (f"Each head's sink rate (threshold {fmt(thr[0]) if thr.size else '—'} on the attention to the sink token) "
           f"against its mean output norm, means over {int(n[0]) if n.size and n[0] >= 0 else '—'} prompts with their intervals "
           "(both cover the head's mean over the prompt distribution).")
    cap += " " + _fit_caption(fit)
    return "<h4>Attention sinks: sink rate vs output norm</h4>" + figure(p.svg(), cap, tbl)


def _fit_caption(fit: dict[str, dict[str, Any]]) -> str:
    """The fitted relation in words: curvature and Spearman with their intervals, verdicts and rules."""
    if not fit:
        return "sink_fit.parquet is missing, so no fit is drawn."
    parts = []
    for term, what in (("curvature", "curvature b2 of the quadratic norm = b0 + b1 s + b2 s²"), ("spearman", "Spearman ρ")):
        r = fit.get(term)
        if r is None:
            continue
        parts.append(f"{what} = {fmt(r.get('estimate'))} [{fmt(r.get('ci_low'))}, {fmt(r.get('ci_high'))}] "
                     f"({r.get('interval') or 'interval'}): {r.get('verdict') or 'no verdict'}")
    first = next(iter(fit.values()))
    est = (fit.get("curvature") or first).get("estimand") or ""
    rule = first.get("multiplicity") or ""
    return "Dashed: the least-squares quadratic across heads; " + "; ".join(parts) + (
        f". The curvature interval covers {est}" if est else "") + (f". Verdicts: {rule}." if rule else ".")


def token_drops_part(T: Tables) -> str:
    """Mean metric drop per measure and k with intervals (random = the null)."""
    t = T.need("token_importance", ["measure", "k", "mean_drop", "ci_low", "ci_high"])
    ms, k = strs(t, "measure"), num(t, "k")
    v, lo, hi = num(t, "mean_drop"), num(t, "ci_low"), num(t, "ci_high")
    ok = num(t, "interval_reliable")
    measures = list(dict.fromkeys(ms))
    col = colours(measures)
    ks = np.unique(k[np.isfinite(k)])
    pos = {kk: i for i, kk in enumerate(ks.tolist())}
    w = min(0.7, 0.16 * len(measures))
    off = {m: (j - (len(measures) - 1) / 2) * (w / max(len(measures) - 1, 1)) for j, m in enumerate(measures)}
    yd = nice_domain(*padded(*data_range(v, lo, hi, [0.0]), 0.04))
    p = Plot(560, 340, (-0.6, len(ks) - 0.4), yd, label="mean metric drop per measure and k")
    p.hline(0.0, "#999", dash=None)
    for m in measures:
        idx = [i for i, s in enumerate(ms) if s == m and np.isfinite(k[i])]
        xs = np.array([pos[k[i]] + off[m] for i in idx])
        for xx, i in zip(xs, idx):
            p.vbar(xx, lo[i], hi[i], col[m])
        p.points(xs, v[idx], col[m], r=3.4, titles=[f"{m} k={fmt(k[i])}: mean drop {fmt(v[i])} [{fmt(lo[i])}, {fmt(hi[i])}]"
                                                   for i in idx])
        p.legend(m + (" (null)" if m == "random" else ""), col[m], "point")
    p.axes("k (top tokens ablated)", "mean metric drop", xticks=list(range(len(ks))),
           xtick_labels=[str(int(kk)) for kk in ks])
    rows = [[ms[i], k[i], v[i], lo[i], hi[i], num(t, "n")[i], flag(ok[i])]
            for i in range(t.num_rows)]
    tbl = html_table([("measure", "text"), ("k", "int"), ("mean drop", "num"), ("CI low", "num"), ("CI high", "num"),
                      ("n", "int"), ("interval reliable", "bool")], rows[:MAX_ROWS])
    est = first(t, "estimand")
    how = first(t, "interval")
    cap = (f"Metric drop when each measure's top-k tokens are ablated (random: the null), mean over prompts with its "
           f"interval ({how or 'interval over prompts'}; covers {est or 'the mean drop over the prompt distribution'}).")
    return "<h4>Token-importance faithfulness: mean drop per measure and k</h4>" + figure(p.svg(), cap, tbl)


def token_diffs_part(T: Tables) -> str:
    """The paired differences of drops between measures with their Holm verdicts."""
    t = T.need("token_importance_diffs", ["measure_a", "measure_b", "k", "difference", "verdict"])
    a, b, verdict = strs(t, "measure_a"), strs(t, "measure_b"), strs(t, "verdict")
    cols = {c: num(t, c) for c in ("k", "difference", "ci_low", "ci_high", "pvalue", "pvalue_holm", "interval_reliable")}
    rows = [[a[i], b[i], cols["k"][i], cols["difference"][i], cols["ci_low"][i], cols["ci_high"][i], cols["pvalue"][i],
             cols["pvalue_holm"][i], verdict[i],
             flag(cols["interval_reliable"][i])]
            for i in range(t.num_rows)]
    tbl = html_table([("measure a", "text"), ("measure b", "text"), ("k", "int"), ("drop a − b", "num"), ("CI low", "num"),
                      ("CI high", "num"), ("p", "p"), ("p (Holm)", "p"), ("verdict", "text"), ("interval reliable", "bool")],
                     rows[:MAX_ROWS], shown_note=shown(min(len(rows), MAX_ROWS), len(rows), "differences", "first rows"))
    n_sig = sum(v != "inconclusive" for v in verdict)
    rule = first(t, "multiplicity")
    est = first(t, "estimand")
    cap = (f"Paired differences of the metric drop between measures (same prompts), {n_sig} of {t.num_rows} decided. "
           f"Verdicts: {rule or 'Holm over the family'}. Intervals cover {est or 'the mean paired difference'}; a "
           "difference flagged not reliable rests on a few prompts.")
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


def sink_stability_part(T: Tables) -> str:
    """Sink heads and the sink-norm relation across seeds (rank-matched per layer)."""
    t = T.need("sink_stability", ["layer", "item", "value", "ci_low", "ci_high"])
    L, items = ints(t, "layer"), strs(t, "item")
    cols = {c: num(t, c) for c in ("value", "ci_low", "ci_high", "sd", "min", "max", "n_refits")}
    rows = [["model" if L[i] < 0 else str(L[i]), items[i], *(cols[c][i] for c in cols)] for i in range(t.num_rows)]
    tbl = html_table([("layer", "text"), ("item", "text"), ("mean over seeds", "num"), ("CI low", "num"), ("CI high", "num"),
                      ("SD", "num"), ("min", "num"), ("max", "num"), ("seeds", "int")], rows[:MAX_ROWS])
    est = first(t, "estimand")
    cap = (f"Are the sink heads the same across seeds? Sink rates matched by rank within each layer, the number of sink "
           f"heads, and the sink-norm relation per seed; intervals cover {est or 'the mean over training seeds'}.")
    return f"<h4>Attention sinks across seeds</h4><p>{esc(cap)}</p>" + f'<div class="tablebox">{tbl}</div>'


def sink_matching_part(T: Tables) -> str:
    """Sink-head agreement across seeds with heads matched by attention pattern, against a random matching."""
    t = T.need("sink_matching", ["layer", "item", "value", "ci_low", "ci_high", "null", "excess", "verdict"])
    L, items, verdicts = ints(t, "layer"), strs(t, "item"), strs(t, "verdict")
    cols = {c: num(t, c) for c in ("value", "ci_low", "ci_high", "null", "excess", "excess_ci_low", "excess_ci_high",
                                   "n_pairs", "n_pairs_undefined")}
    rows = [["all" if L[i] < 0 else str(L[i]), items[i], *(cols[c][i] for c in list(cols)[:7]), verdicts[i],
             cols["n_pairs"][i], cols["n_pairs_undefined"][i]] for i in range(t.num_rows)]
    tbl = html_table([("layer", "text"), ("item", "text"), ("mean over seed pairs", "num"), ("CI low", "num"),
                      ("CI high", "num"), ("random matching", "num"), ("excess", "num"), ("excess CI low", "num"),
                      ("excess CI high", "num"), ("verdict", "text"), ("pairs", "int"), ("pairs undefined", "int")],
                     rows[:MAX_ROWS])
    bar = num(t, "sink_bar")
    cap = (f"Are the sink heads the same heads across seeds? Heads are matched within each layer by attention pattern "
           f"({first(t, 'matching')}); a sink head has sink rate >= {fmt(bar[0]) if bar.size else '—'}. Each item is "
           "compared with its exact expectation under a random one-to-one matching; excess > 0 means more alike than "
           "chance (for the rate difference: smaller than chance). Pairs where no seed has a sink head are undefined and "
           f"counted, not dropped. Intervals: {first(t, 'estimand') or 'the mean over training seeds'}.")
    return f"<h4>Sink heads across seeds, matched by attention pattern</h4><p>{esc(cap)}</p>" + \
        f'<div class="tablebox">{tbl}</div>'


def token_stability_part(T: Tables) -> str:
    """Top-k token agreement between seeds per measure and k, against chance."""
    t = T.need("token_stability", ["measure", "k", "jaccard", "chance"])
    ms, k = strs(t, "measure"), num(t, "k")
    v = {c: num(t, c) for c in ("jaccard", "ci_low", "ci_high", "chance", "excess", "excess_ci_low", "excess_ci_high")}
    measures = list(dict.fromkeys(ms))
    col = colours(measures)
    xd, xlog = x_domain_k(k)
    p = Plot(520, 320, xd, (0.0, 1.0), xlog=xlog, label="top-k token Jaccard between seeds")
    for m in measures:
        idx = np.array([i for i, s in enumerate(ms) if s == m], dtype=int)
        idx = idx[np.argsort(k[idx], kind="stable")]
        p.band(k[idx], v["ci_low"][idx], v["ci_high"][idx], col[m])
        p.line(k[idx], v["jaccard"][idx], col[m], title=m)
        p.line(k[idx], v["chance"][idx], col[m], width=1.0, dash="1.5,2.5", title=f"{m}: chance")
        p.points(k[idx], v["jaccard"][idx], col[m], r=2.6, titles=[f"{m} k={fmt(k[i])}: {fmt(v['jaccard'][i])} "
                                                                   f"[{fmt(v['ci_low'][i])}, {fmt(v['ci_high'][i])}], "
                                                                   f"chance {fmt(v['chance'][i])}" for i in idx])
        p.legend(m, col[m])
    p.legend("chance", "#555", "dot")
    p.axes("k (top tokens)", "Jaccard between seeds", xticks=k_ticks(k, p), yticks=[0, 0.2, 0.4, 0.6, 0.8, 1.0])
    rows = [[ms[i], k[i], *(v[c][i] for c in v)] for i in range(t.num_rows)]
    tbl = html_table([("measure", "text"), ("k", "int"), ("Jaccard", "num"), ("CI low", "num"), ("CI high", "num"),
                      ("chance", "num"), ("excess", "num"), ("excess CI low", "num"), ("excess CI high", "num")],
                     rows[:MAX_ROWS])
    est = first(t, "estimand")
    cap = (f"Do the seeds pick the same top-k tokens? Mean top-k token Jaccard between seeds per measure with its "
           f"interval (covers {est or 'the expected Jaccard between two seeds'}); dotted: chance.")
    return "<h4>Important tokens across seeds</h4>" + figure(p.svg(), cap, tbl)
