"""The faithfulness section: faithfulness of the top-k circuit vs k, with CPR and CMD."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from reports.html.common import (MAX_ROWS, Tables, colours, figure, html_table, k_ticks, methods_in, num, shown, strs,
                                 sub, x_domain_k)
from reports.html.svg import Plot, data_range, fmt, nice_domain, padded


def faithfulness_section(T: Tables, methods: Sequence[str]) -> str:
    """Return the faithfulness-vs-k plot per method (mean f with its CI, ratio of means) and its table."""
    t = T.need("faithfulness_vs_k", ["method", "k", "f_mean"])
    meth = [m for m in methods if m in methods_in(t)]
    col = colours(methods)
    ms = np.array(strs(t, "method"))
    ks = num(t, "k")
    xd, xlog = x_domain_k(ks)
    lo, hi = data_range(num(t, "f_ci_low"), num(t, "f_ci_high"), num(t, "f_mean"), num(t, "f_ratio"), [0.0, 1.0])
    yd = nice_domain(*padded(lo, hi, 0.03))
    p = Plot(600, 360, xd, yd, xlog=xlog, label="faithfulness vs k")
    p.hline(1.0, "#555", dash="2,3", label="full model")
    p.hline(0.0, "#999", dash=None)
    rows, caps = [], []
    for m in meth:
        s = sub(t, ms == m)
        o = np.argsort(num(s, "k"), kind="stable")
        k = num(s, "k")[o]
        v = {c: num(s, c)[o] for c in ("edge_fraction", "f_ratio", "f_mean", "f_ci_low", "f_ci_high", "cpr", "cmd")}
        p.band(k, v["f_ci_low"], v["f_ci_high"], col[m])
        p.line(k, v["f_ratio"], col[m], width=1.3, dash="6,3", title=f"{m}: ratio of means")
        p.line(k, v["f_mean"], col[m], title=f"{m}: mean per-example faithfulness")
        p.points(k, v["f_mean"], col[m], r=2.6, titles=[f"{m} k={fmt(a)}: f {fmt(b)} [{fmt(c)}, {fmt(d)}], ratio {fmt(e)}"
                                                         for a, b, c, d, e in zip(k, v["f_mean"], v["f_ci_low"], v["f_ci_high"], v["f_ratio"])])
        p.legend(f"{m}: mean f + CI", col[m])
        p.legend(f"{m}: ratio of means", col[m], "dash")
        cpr, cmd = v["cpr"][0] if len(k) else math.nan, v["cmd"][0] if len(k) else math.nan
        caps.append(f"{m}: CPR {fmt(cpr)}, CMD {fmt(cmd)}")
        rows += [[m, k[i], v["edge_fraction"][i], v["f_ratio"][i], v["f_mean"][i], v["f_ci_low"][i], v["f_ci_high"][i]] for i in range(len(k))]
    p.axes("circuit size k (edges)" + (", log scale" if xlog else ""), "faithfulness f", xticks=k_ticks(ks, p))
    cols = [("method", "text"), ("k", "int"), ("edge fraction", "num"), ("f (ratio of means)", "num"), ("f mean", "num"), ("CI low", "num"), ("CI high", "num")]
    tbl = html_table(cols, rows[:MAX_ROWS], shown_note=shown(min(len(rows), MAX_ROWS), len(rows), "rows", "first rows"))
    cap = ("Faithfulness of the top-k circuit: mean per-example f with its CI band (solid) and the ratio of means (dashed). "
           + "; ".join(caps) + " (CPR: area under f, higher is better; CMD: area under |1 − f|, lower is better).")
    return figure(p.svg(), cap, tbl)

