"""The calibration section: empirical coverage of each interval vs N (`circuitstat study calibration`)."""

from __future__ import annotations

import numpy as np

from circuitstat.reports.html.common import MAX_ROWS, Tables, colours, figure, html_table, k_ticks, num, shown, strs, sub, x_domain_k
from circuitstat.reports.html.svg import Plot, data_range, fmt, nice_domain, padded


CAL_COLS = [("interval", "text"), ("N", "int"), ("coverage", "num"), ("± MC", "num"), ("worst unit", "num"),
            ("reliable: coverage", "num"), ("reliable share", "num"), ("mean width", "num")]
CAL_SRC = ("coverage", "coverage_mc_se", "worst_unit_coverage", "coverage_reliable", "share_reliable", "mean_width")


CAL_FAMILY_STYLE = {"edge": ("line", None), "stability": ("dash", "5,3"), "faithfulness": ("dot", "1.5,2.5")}


def calibration_part(T: Tables) -> str:
    """Coverage vs N per interval kind (from `circuitstat study calibration`), with the nominal level."""
    t = T.need("coverage", ["kind", "n", "coverage", "coverage_mc_se"])
    kinds = list(dict.fromkeys(strs(t, "kind")))
    # colour by method within a family, line style by family: 12 kinds stay distinguishable with 8 colours
    col = {k: c for fam in dict.fromkeys(k.split("/")[0] for k in kinds)
           for k, c in colours([k for k in kinds if k.split("/")[0] == fam]).items()}
    style = {k: CAL_FAMILY_STYLE.get(k.split("/")[0], ("line", None)) for k in kinds}
    ks, ns = np.array(strs(t, "kind")), num(t, "n")
    nominal = float(num(t, "confidence_level")[0]) if "confidence_level" in t.column_names else 0.95
    xd, xlog = x_domain_k(ns)
    cov, se = num(t, "coverage"), num(t, "coverage_mc_se")
    # the axis spans what the data and their ±2 SE bands reach, with the nominal level, padded: ten lines
    # near 0.9 get the height of the plot rather than a sliver of a 0.5-1 axis
    lo_y, hi_y = nice_domain(*padded(*data_range(cov - 2 * np.nan_to_num(se), cov + 2 * np.nan_to_num(se), [nominal]), 0.08))
    p = Plot(640, 380, xd, (max(lo_y, 0.0), min(hi_y, 1.0)), xlog=xlog, label="coverage vs N")
    rows = []
    for kind in kinds:
        s = sub(t, ks == kind)
        o = np.argsort(num(s, "n"), kind="stable")
        n, c, se = num(s, "n")[o], num(s, "coverage")[o], num(s, "coverage_mc_se")[o]
        p.band(n, c - 2 * se, c + 2 * se, col[kind])
        p.line(n, c, col[kind], title=kind, dash=style[kind][1])
        p.points(n, c, col[kind], r=2.8, titles=[f"{kind} N={fmt(a)}: coverage {fmt(b)} ± {fmt(2 * e)}"
                                                for a, b, e in zip(n, c, se)])
        p.legend(kind, col[kind], style[kind][0])
        rows += [[kind, a, *(num(s, k)[o][i] for k in CAL_SRC)] for i, a in enumerate(n)]
    p.hline(nominal, "#b00", dash="6,4")
    p.legend(f"nominal {nominal:g}", "#b00", "dash")
    p.axes("dataset size N (prompts)" + (", log scale" if xlog else ""), "empirical coverage", xticks=k_ticks(ns, p))
    tbl = html_table(CAL_COLS, rows[:MAX_ROWS], shown_note=shown(min(len(rows), MAX_ROWS), len(rows), "rows", "first rows"))
    by_estimand: dict[str, list[str]] = {}
    for kind, est in dict(zip(strs(t, "kind"), strs(t, "estimand"))).items():
        by_estimand.setdefault(est, []).append(kind)
    estimands = "; ".join(f"{', '.join(kinds) if len(by_estimand) > 1 else 'every interval'}: {est}"
                          for est, kinds in by_estimand.items())
    cap = (f"Empirical coverage of each interval over datasets of N prompts drawn from the population (band: ±2 Monte "
           f"Carlo SE, each dataset one unit: the edges of one dataset are not independent); dashed red: the nominal "
           f"{nominal:g}; solid lines: per-edge intervals, dashed: circuit stability, dotted: faithfulness. "
           f"Estimands — {estimands}.")
    return figure(p.svg(), cap, tbl, below=True)

