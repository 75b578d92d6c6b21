"""The tokens section's cross-seed parts: sink heads and important tokens across independently trained seeds."""

from __future__ import annotations

import numpy as np

from circuitstat.reports.ci import Ci
from circuitstat.reports.html.common import MAX_ROWS, Tables, ci_attrs, colours, figure, first, html_table, k_ticks, num, x_domain_k
from circuitstat.reports.html.svg import Plot, esc, fmt
from circuitstat.reports.tableset import rows

__all__ = ["sink_stability_part", "sink_matching_part", "token_stability_part"]


def _where(layer: int, whole: str) -> str:
    return whole if layer < 0 else str(layer)


def sink_stability_part(T: Tables) -> str:
    """Sink heads and the sink-norm relation across seeds (rank-matched per layer)."""
    t = T.need("sink_stability", ["layer", "item", "value", "ci_low", "ci_high"])
    body = [[_where(r["layer"], "model"), r["item"], Ci.of(T.name("sink_stability"), r, ("layer", "item"), est="value"),
             r.get("sd"), r.get("min"), r.get("max"), r.get("n_refits")] for r in rows(t)]
    tbl = html_table([("layer", "text"), ("item", "text"), ("mean over seeds [95% CI]", "ci"), ("SD", "num"),
                      ("min", "num"), ("max", "num"), ("seeds", "int")], body[:MAX_ROWS])
    est = first(t, "estimand")
    cap = (f"Are the sink heads the same across seeds? Sink rates matched by rank within each layer, the number of sink "
           f"heads, and the sink-norm relation per seed; intervals cover {est or 'the mean over training seeds'}.")
    return f"<h4>Attention sinks across seeds</h4><p>{esc(cap)}</p>" + f'<div class="tablebox">{tbl}</div>'


def sink_matching_part(T: Tables) -> str:
    """Sink-head agreement across seeds with heads matched by attention pattern, against a random matching."""
    t = T.need("sink_matching", ["layer", "item", "value", "ci_low", "ci_high", "null", "excess", "verdict"])
    name = T.name("sink_matching")
    body = [[_where(r["layer"], "all"), r["item"], Ci.of(name, r, ("layer", "item"), est="value"), r.get("null"),
             Ci.of(name, r, ("layer", "item"), "excess_ci", est="excess"), r.get("verdict"), r.get("n_pairs"),
             r.get("n_pairs_undefined")] for r in rows(t)]
    tbl = html_table([("layer", "text"), ("item", "text"), ("mean over seed pairs [95% CI]", "ci"),
                      ("random matching", "num"), ("excess [95% CI]", "ci"), ("verdict", "text"), ("pairs", "int"),
                      ("pairs undefined", "int")], body[:MAX_ROWS])
    bar = num(t, "sink_bar")
    cap = (f"Are the sink heads the same heads across seeds? Heads are matched within each layer by attention pattern "
           f"({first(t, 'matching')}); a sink head has sink rate >= {fmt(bar[0]) if bar.size else '—'}. Each item is "
           "compared with its exact expectation under a random one-to-one matching; excess > 0 means more alike than "
           "chance (for the rate difference: smaller than chance). Pairs where no seed has a sink head are undefined and "
           f"counted, not dropped. Intervals: {first(t, 'estimand') or 'the mean over training seeds'}.")
    return (f"<h4>Sink heads across seeds, matched by attention pattern</h4><p>{esc(cap)}</p>"
            f'<div class="tablebox">{tbl}</div>')


def token_stability_part(T: Tables) -> str:
    """Top-k token agreement between seeds per measure and k, against chance."""
    t = T.need("token_stability", ["measure", "k", "jaccard", "chance"])
    rs = rows(t)
    name = T.name("token_stability")
    jac = [Ci.of(name, r, ("measure", "k"), est="jaccard") for r in rs]
    exc = [Ci.of(name, r, ("measure", "k"), "excess_ci", est="excess") for r in rs]
    measures = list(dict.fromkeys(r["measure"] for r in rs))
    col = colours(measures)
    k = np.array([r["k"] for r in rs], dtype=float)
    xd, xlog = x_domain_k(k)
    p = Plot(520, 320, xd, (0.0, 1.0), xlog=xlog, label="top-k token Jaccard between seeds")
    for m in measures:
        idx = sorted((i for i, r in enumerate(rs) if r["measure"] == m), key=lambda i: k[i])
        p.band(k[idx], [jac[i].lo for i in idx], [jac[i].hi for i in idx], col[m])
        p.line(k[idx], [jac[i].value for i in idx], col[m], title=m)
        p.line(k[idx], [rs[i].get("chance") for i in idx], col[m], width=1.0, dash="1.5,2.5", title=f"{m}: chance")
        p.points(k[idx], [jac[i].value for i in idx], col[m], r=2.6, attrs=[ci_attrs(jac[i]) for i in idx],
                 titles=[f"{m} k={int(k[i])}: {jac[i].text()}, chance {fmt(rs[i].get('chance'))}" for i in idx])
        p.legend(m, col[m])
    p.legend("chance", "#555", "dot")
    p.axes("k (top tokens)", "Jaccard between seeds", xticks=k_ticks(k, p), yticks=[0, 0.2, 0.4, 0.6, 0.8, 1.0])
    body = [[r["measure"], r["k"], j, r.get("chance"), e] for r, j, e in zip(rs, jac, exc)]
    tbl = html_table([("measure", "text"), ("k", "int"), ("Jaccard [95% CI]", "ci"), ("chance", "num"),
                      ("excess [95% CI]", "ci")], body[:MAX_ROWS])
    est = first(t, "estimand")
    cap = (f"Do the seeds pick the same top-k tokens? Mean top-k token Jaccard between seeds per measure with its "
           f"interval (covers {est or 'the expected Jaccard between two seeds'}); dotted: chance.")
    return "<h4>Important tokens across seeds</h4>" + figure(p.svg(), cap, tbl)
