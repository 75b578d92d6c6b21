"""The circuit stability section: mean pairwise Jaccard of top-k circuits vs k, with chance and Φ."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reports.html.common import (BAR, MAX_ROWS, Tables, colours, figure, html_table, k_ticks, methods_in, num, shown, strs,
                                 sub, x_domain_k)
from reports.html.svg import Plot, fmt


STAB_COLS = [
    ("method", "text"), ("k", "int"), ("mean J", "num"), ("SD", "num"), ("CI low", "num"), ("CI high", "num"),
    ("chance", "num"), ("corrected", "num"), ("Φ", "num"), ("Φ CI low", "num"), ("Φ CI high", "num"),
    ("consensus size", "int"), ("consensus mean J", "num"),
]
STAB_SRC = ["jaccard_mean", "jaccard_sd", "jaccard_ci_low", "jaccard_ci_high", "jaccard_chance", "jaccard_corrected",
            "phi", "phi_ci_low", "phi_ci_high", "consensus_size", "consensus_jaccard_mean"]


def stability_section(T: Tables, methods: Sequence[str]) -> str:
    """Return the mean pairwise Jaccard vs k per method with its band, chance and the bar, and its table."""
    t = T.need("stability_vs_k", ["method", "k", "jaccard_mean"])
    meth = [m for m in methods if m in methods_in(t)]
    col = colours(methods)
    ms = np.array(strs(t, "method"))
    ks = num(t, "k")
    xd, xlog = x_domain_k(ks)
    p = Plot(600, 360, xd, (0, 1.0), xlog=xlog, label="mean pairwise Jaccard vs k")
    rows = []
    for m in meth:
        mask = ms == m
        s = sub(t, mask)
        o = np.argsort(num(s, "k"), kind="stable")
        k = num(s, "k")[o]
        v = {c: num(s, c)[o] for c in STAB_SRC}
        p.band(k, v["jaccard_ci_low"], v["jaccard_ci_high"], col[m])
        p.line(k, v["jaccard_chance"], col[m], width=1.2, dash="1.5,2.5", title=f"{m}: chance")
        p.line(k, v["jaccard_mean"], col[m], title=f"{m}: mean Jaccard")
        p.points(k, v["jaccard_mean"], col[m], r=2.8,
                 titles=[f"{m} k={fmt(a)}: mean J {fmt(b)} [{fmt(c)}, {fmt(d)}], chance {fmt(e)}"
                         for a, b, c, d, e in zip(k, v["jaccard_mean"], v["jaccard_ci_low"], v["jaccard_ci_high"], v["jaccard_chance"])])
        p.legend(f"{m}: mean Jaccard + CI", col[m])
        rows += [[m, a, *(v[c][i] for c in STAB_SRC)] for i, a in enumerate(k)]
    p.legend("chance (hypergeometric)", "#555", "dot")
    p.legend(f"bar: {BAR}", "#b00", "dash")
    p.hline(BAR, "#b00", dash="6,4")
    p.axes("circuit size k (edges)" + (", log scale" if xlog else ""), "mean pairwise Jaccard", xticks=k_ticks(ks, p), yticks=[0, 0.2, 0.4, 0.6, 0.8, 1.0])
    tbl = html_table(STAB_COLS, rows[:MAX_ROWS], shown_note=shown(min(len(rows), MAX_ROWS), len(rows), "rows", "first rows"))
    cap = (f"Mean pairwise Jaccard of the top-k circuits across resamples, per method, with its CI band; dotted: the "
           f"chance level; dashed red: the {BAR} bar. Table: also the chance-corrected Jaccard, Nogueira's Φ and the consensus size.")
    return figure(p.svg(), cap, tbl)

