"""The faithfulness section: selection-aware faithfulness vs k first, the fixed circuit's interval labelled.

The interval that covers what a reader takes faithfulness to mean is f_selected_ci_* (the circuit a
user would select from N prompts, selection included by cross-fitting); the bootstrap interval of
the one fixed circuit (f_ci_*, Fieller's set around the ratio of means f_ratio; its note says when the set is
unbounded) is drawn dashed and labelled.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from circuitstat.reports.ci import Ci
from circuitstat.reports.html.common import (BAR, MAX_ROWS, Tables, ci_attrs, colours, figure, html_table, k_ticks, methods_in, shown,
                                 x_domain_k)
from circuitstat.reports.html.svg import Plot, data_range, fmt, nice_domain, padded
from circuitstat.reports.tableset import rows

__all__ = ["faithfulness_section"]

COLS = [("method", "text"), ("k", "int"), ("edge fraction", "num"),
        ("selection-aware f, procedure-level (averaged over refits) [95% CI]", "ci"),
        ("fixed circuit f (ratio of means, Fieller) [95% CI]", "ci"),
        ("reported circuit f (mask fit on half, Fieller on the other half) [95% CI]", "ci"),
        ("mean per-example f", "num"), ("fold Jaccard", "num"), ("note", "text")]


def _share(v: float | None) -> float | None:
    """Return a faithfulness to the 3 decimals it is read at (a share of the model's effect: -2e-08 is 0)."""
    return None if v is None else round(float(v), 3) + 0.0


def _cis(r: dict) -> tuple[Ci, Ci]:
    key = ("method", "k")
    return (Ci.of("faithfulness_vs_k", r, key, "f_selected_ci", est="f_selected", decimals=3),
            Ci.of("faithfulness_vs_k", r, key, "f_ci", est="f_ratio", decimals=3))


def _conditional(r: dict) -> Ci:
    """The reported circuit's conditional interval (f_conditional_ci_*; a mask-learned method's rows only)."""
    return Ci.of("faithfulness_vs_k", r, ("method", "k"), "f_conditional_ci", est="f_conditional", decimals=3,
                 unavailable="not a mask-learned method" if not r.get("f_conditional_shape") else "")


def _fixed_note(r: dict) -> str:
    """The fixed circuit's Fieller caveat ('' when its set is a bounded interval): why its ends are infinite."""
    return f"fixed circuit: {r['f_ci_note']}" if r.get("f_ci_note") else ""


def _conditional_note(r: dict) -> str:
    """The f_conditional note of a mask-learned method's row ('' for the others: their f_ci is the reported one)."""
    return str(r.get("f_conditional_note") or "") if r.get("f_conditional_shape") else ""


def faithfulness_section(T: Tables, methods: Sequence[str]) -> str:
    """Return faithfulness vs k per method (selection-aware with its band; fixed circuit dashed) and its table."""
    t = T.need("faithfulness_vs_k", ["method", "k", "f_ratio"])
    meth = [m for m in methods if m in methods_in(t)]
    col = colours(methods)
    per = {m: sorted(rows(t, method=m), key=lambda r: r["k"]) for m in meth}
    cis = {m: [_cis(r) for r in per[m]] for m in meth}
    ks = np.array([r["k"] for m in meth for r in per[m]], dtype=float)
    every = [c for m in meth for pair in cis[m] for c in pair]
    lo, hi = data_range([c.lo for c in every], [c.hi for c in every], [c.value for c in every], [BAR, 1.0])
    xd, xlog = x_domain_k(ks)
    p = Plot(600, 360, xd, nice_domain(*padded(lo, hi, 0.05)), xlog=xlog, label="faithfulness vs k")
    p.hline(1.0, "#555", dash="2,3", label="full model")
    p.hline(BAR, "#b00", dash="6,4")
    p.hline(0.0, "#999", dash=None)
    table, areas = [], []
    for m in meth:
        k = np.array([r["k"] for r in per[m]], dtype=float)
        sel, fixed = [c[0] for c in cis[m]], [c[1] for c in cis[m]]
        p.band(k, [c.lo for c in sel], [c.hi for c in sel], col[m])
        p.line(k, [c.value for c in sel], col[m], title=f"{m}: selection-aware faithfulness")
        p.points(k, [c.value for c in sel], col[m], r=3.0, attrs=[ci_attrs(c) for c in sel],
                 titles=[f"{m} k={int(a)}: selection-aware f {c.text()}" for a, c in zip(k, sel)])
        p.line(k, [c.value for c in fixed], col[m], width=1.2, dash="6,3", title=f"{m}: fixed circuit")
        for a, c in zip(k, fixed):
            p.vbar(a, c.lo, c.hi, col[m], width=1.0)
        p.points(k, [c.value for c in fixed], col[m], r=2.2, attrs=[ci_attrs(c) for c in fixed],
                 titles=[f"{m} k={int(a)}: fixed circuit f {c.text()} ({c.role}){_fixed_note(r) and '; '}"
                         f"{_fixed_note(r)}" for a, c, r in zip(k, fixed, per[m])])
        p.legend(f"{m}: selection-aware f + 95% CI", col[m])
        p.legend(f"{m}: fixed circuit (selection not included)", col[m], "dash")
        first = per[m][0] if per[m] else {}
        areas.append(f"{m}: CPR {fmt(first.get('cpr'))}, CMD {fmt(first.get('cmd'))}")
        table += [[m, r["k"], r.get("edge_fraction"), s, f, _conditional(r), _share(r.get("f_mean")),
                   r.get("fold_circuit_jaccard"),
                   "; ".join(x for x in (r.get("circuit_note"), _fixed_note(r), r.get("f_selected_note"),
                                         _conditional_note(r),
                                         "a k of the circuit choice's search" if r.get("k_source") == "search" else "")
                             if x)] for r, (s, f) in zip(per[m], cis[m])]
    p.legend(f"bar {BAR}", "#b00", "dash")
    p.axes("circuit size k (edges)" + (", log scale" if xlog else ""), "faithfulness f", xticks=k_ticks(ks, p))
    tbl = html_table(COLS, table[:MAX_ROWS], shown_note=shown(min(len(table), MAX_ROWS), len(table), "rows", "first rows"))
    est = next((c[0].estimand for m in meth for c in cis[m] if c[0].estimand), "")
    fixed_est = next((c[1].estimand for m in meth for c in cis[m] if c[1].estimand), "")
    no_sel = all(not c[0].defined for m in meth for c in cis[m])
    cap = (f"Selection-aware faithfulness of the top-k circuit (solid, with its 95% band): it covers {est} — a "
           "procedure-level estimand, the average over refits, not the one circuit reported. For a mask-learned "
           "method the table's 'reported circuit' column is that circuit's own interval: the mask fitted on half the "
           "prompts, its Fieller interval on the other half. Dashed "
           f"with bars: the fixed circuit's ratio of means and its interval, which covers {fixed_est} — labelled, "
           f"since it leaves out the selection. Red: the {BAR} bar the verdict reads. " + "; ".join(areas)
           + " (CPR: area under f, higher is better; CMD: area under |1 − f|, lower is better). faithfulness_vs_k "
           "records no per-row reliability flag.")
    if no_sel:
        cap = "This run has no selection-aware interval (see the note column), so only the fixed circuit is shown. " + cap
    return figure(p.svg(), cap, tbl, below=True)
