"""The variance study section: variance components per edge, pooled shares, per-factor circuit stability."""

from __future__ import annotations

import numpy as np

from circuitstat.reports.ci import Ci
from circuitstat.reports.html.common import (BAR, MAX_ROWS, TOP_FOREST, Tables, ci_attrs, edge_lookup, figure, first, flag, html_table,
                                 ints, methods_in, num, order_methods, shown, strs)
from circuitstat.reports.html.summary import summary_items_part
from circuitstat.reports.html.svg import PALETTE, Plot, esc, fmt
from circuitstat.reports.tableset import rows


def variance_part(T: Tables) -> str:
    """Return the stacked variance shares of the top edges by source, and the pooled shares."""
    t = T.need("variance_components", ["edge", "source", "share"])
    e, srcs = ints(t, "edge"), strs(t, "source")
    share, var = num(t, "share"), num(t, "variance")
    names = strs(t, "name")
    sources = list(dict.fromkeys(srcs))
    si = {s: j for j, s in enumerate(sources)}
    edge_ids, first, inv = np.unique(e, return_index=True, return_inverse=True)
    sidx = np.fromiter((si[x] for x in srcs), dtype=np.int64, count=len(srcs))
    S = np.zeros((edge_ids.size, len(sources)))
    np.add.at(S, (inv, sidx), np.where(np.isfinite(share), share, 0.0))
    V = np.bincount(inv, weights=np.where(np.isfinite(var), var, 0.0), minlength=edge_ids.size)
    nm = [names[i] or str(int(e[i])) for i in first]
    look = edge_lookup(T, (order_methods(methods_in(T.get("edge_stats"))) or [None])[0])
    if look and any(int(x) in look for x in edge_ids):
        key = np.array([abs(look.get(int(x), (0.0,))[0]) for x in edge_ids])
        key = np.where(np.isfinite(key), key, 0)
        by = "largest |estimate|"
    else:
        key, by = V, "largest total variance"
    top = np.argsort(-key, kind="stable")[:TOP_FOREST]
    n = top.size
    row_h = 18
    height = 70 + n * row_h
    xmax = max(1.0, float(np.nanmax(S[top].sum(1))) if n else 1.0)
    p = Plot(640, height, (0, xmax), (-0.6, n - 0.4), margin=(14, 16, 42, 200), label="variance shares of top edges")
    for i, r in enumerate(top):
        y = n - 1 - i
        x0 = 0.0
        for j, s in enumerate(sources):
            w = S[r, j]
            if w <= 0:
                continue
            a, b = p.x(x0), p.x(x0 + w)
            yy = p.y(y + 0.36)
            c = PALETTE[j % len(PALETTE)]
            p.raw(f'<rect x="{a:.1f}" y="{yy:.1f}" width="{max(b - a, 0.3):.1f}" height="{p.y(y - 0.36) - yy:.1f}" fill="{c}"><title>{esc(nm[r])}: {esc(s)} {esc(fmt(w))}</title></rect>')
            x0 += w
    for j, s in enumerate(sources):  # the legend flows in rows below the axis: every source's name fits
        p.legend(s, PALETTE[j % len(PALETTE)], "box")
    short = [nm[r] if len(nm[r]) <= 30 else nm[r][:29] + "…" for r in top]
    p.axes("share of variance", "", yticks=[n - 1 - i for i in range(n)], ytick_labels=short, grid=False)
    cols = [("edge", "text"), ("total variance", "num")] + [(s, "num") for s in sources]
    rows = [[nm[r], V[r], *S[r].tolist()] for r in top]
    tbl = html_table(cols, rows, shown_note=shown(n, edge_ids.size, "edges", by, "variance_components"))
    cap = f"Share of each edge's score variance by source (crossed random-effects design), for the {n} edges with the {by}."
    return "<h3>Variance components</h3>" + figure(p.svg(), cap, tbl, below=True) + _pooled_shares_table(T)


def _pooled_shares_table(T: Tables) -> str:
    """The pooled variance shares with their intervals and visible reliability flags ('' for older runs)."""
    t = T.get("variance_shares")
    if t is None or "interval_reliable" not in t.column_names:
        return ""
    body = [[r["source"], Ci.of("variance_shares", r, ("source",), "ci", est="share"), r.get("interval")]
            for r in rows(t)]
    cols = [("source", "text"), ("share [95% CI]", "ci"), ("interval", "text")]
    n_edges = int(num(t, "n_edges")[0]) if t.num_rows else 0
    cap = (f"Variance shares pooled over the top {n_edges} edges. Estimand: {first(t, 'estimand')}. "
           "Rows with the examples: bootstrap over prompts (robust to heavy-tailed effects); rows without them rest on the few "
           "levels of their factors (normal-theory pivot) and are flagged '! few levels'.")
    return f"<p>{esc(cap)}</p>" + html_table(cols, body[:MAX_ROWS])


def variance_summary_part(T: Tables) -> str:
    """Return the Jaccard to the reference circuit per factor with its interval and verdict against the bar."""
    t = T.need("variance_summary", ["factor", "jaccard_to_reference"])
    rs = rows(t)
    key = tuple(c for c in ("factor", "level") if c in t.column_names)
    cis = [Ci.of("variance_summary", r, key, "ci", est="jaccard_to_reference") for r in rs]
    n = len(rs)
    new = "bar" in t.column_names  # the bar is recorded in the table and verdicts read the interval
    # runs written before that carry meets_0_8 (the point estimate against 0.8)
    bar = (float(num(t, "bar")[0]) if n else BAR) if new else BAR
    meets = num(t, "meets_bar" if new else "meets_0_8")
    names = [str(r["factor"]) for r in rs]
    p = Plot(560, 70 + 22 * n, (0, 1), (-0.6, n - 0.4), margin=(14, 16, 42, 150), label="Jaccard to the reference circuit by factor")
    p.vline(bar, "#b00", dash="6,4")
    for i, c in enumerate(cis):
        y = n - 1 - i
        p.hbar(y, c.lo, c.hi, PALETTE[0])
        p.points([c.value], [y], PALETTE[0], r=3.5, attrs=[ci_attrs(c)],
                 titles=[f"{names[i]}: {c.text()} at k = {fmt(rs[i].get('k'))}"])
    p.axes("Jaccard to the reference circuit", "", yticks=[n - 1 - i for i in range(n)],
           ytick_labels=[s if len(s) <= 22 else s[:21] + "…" for s in names], xticks=[0, 0.2, 0.4, 0.6, 0.8, 1.0])
    cols = [("factor", "text"), ("Jaccard [95% CI]", "ci"), (f"meets {bar:g}", "bool"), ("k", "int")]
    body = [[names[i], cis[i], flag(meets[i]), rs[i].get("k")] for i in range(n)]
    if new:
        cols += [("verdict", "text"), ("interval covers", "text")]
        body = [b + [r.get("verdict"), r.get("estimand")] for b, r in zip(body, rs)]
    tbl = html_table(cols, body[:MAX_ROWS])
    cap = ((f"How much each factor moves the circuit: Jaccard of the circuit under the factor to the reference circuit, with its interval "
           f"(each covers the estimand in its row: paired levels, the expected Jaccard over datasets of N prompts with the level fixed; "
           f"fresh draws, the expected Jaccard between independent datasets); dashed: the {bar:g} bar (from the table). ")
           + ("Verdict: met when the interval lies above the bar, not met below it, inconclusive across it." if new else
              "Older run: meets compares the point estimate with the bar."))
    return "<h3>Per-factor circuit stability</h3>" + figure(p.svg(), cap, tbl, below=True) + _summary_items(T)


def _summary_items(T: Tables) -> str:
    """The variance study's summary items (summary.parquet), when the run has them."""
    return summary_items_part(T, "Variance-study summary") if T.has("summary") else ""
