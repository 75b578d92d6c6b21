"""The sample-size plot: predicted data-level Jaccard and interval width against N (circuitstat sample-size)."""

from __future__ import annotations

import re
from typing import Mapping

import numpy as np

from ..sample_size_bound import bound_rows
from ..sample_size_means import tied_label
from .svg import PALETTE, Plot, data_range, esc, nice_domain, padded

__all__ = ["sample_size_svg"]


def _jaccard_plot(stab: Mapping[str, np.ndarray], target: float, level: float) -> Plot:
    """J_{N/2} (the primary: what an audit of N prompts reports as jaccard_half) against N per k, with its
    prediction interval as a band and the target as a line."""
    n = np.asarray(stab["n"], dtype=float)
    p = Plot(460, 330, (n.min(), n.max()) if n.max() > n.min() else (n.min() / 2, n.max() * 2), (0.0, 1.0),
             xlog=True, label="predicted data-level Jaccard vs N")
    for i, k in enumerate(np.unique(stab["k"])):
        sel = np.asarray(stab["k"]) == k
        x = n[sel]
        col = PALETTE[i % len(PALETTE)]
        p.band(x, np.asarray(stab["jaccard_half_pi_low"])[sel], np.asarray(stab["jaccard_half_pi_high"])[sel], col)
        p.line(x, np.asarray(stab["jaccard_half"])[sel], col, title=f"k={int(k)}")
        p.points(x, np.asarray(stab["jaccard_half"])[sel], col)
        p.legend(f"k={int(k)}: predicted J_N/2 (two disjoint halves of N), {level:.0%} prediction interval", col)
    if label := tied_label(stab):  # the terminal's line begins with it (circuitstat.reports.sample_size_means)
        p.legend(label, "#b00", "x")
    p.hline(float(target), "#b00", dash="6,4")
    p.legend(f"target {target:g}", "#b00", "dash")
    p.axes("prompts N (log scale)", "expected Jaccard of two halves' top-k", xticks=sorted(set(n)))
    return p


def _width_plot(widths: Mapping[str, np.ndarray], level: float) -> Plot:
    """The median over edges of the predicted width (and of its prediction interval's ends) against N, and per N
    the edges whose upper bound is not below the pilot's own width (bound_rows: the terminal's numbers)."""
    n_all = np.asarray(widths["n"])
    ns = np.unique(n_all)
    med = {c: np.array([np.median(np.asarray(widths[c])[n_all == n]) for n in ns])
           for c in ("width", "width_pi_low", "width_pi_high")}
    lo, hi = data_range(med["width_pi_low"], med["width_pi_high"])
    lo, hi = nice_domain(*padded(max(lo, 0.0), hi, 0.06))
    x = ns.astype(float)
    p = Plot(460, 330, (x.min(), x.max()) if x.max() > x.min() else (x.min() / 2, x.max() * 2), (max(lo, 0.0), hi),
             xlog=True, label="predicted interval width vs N")
    p.band(x, med["width_pi_low"], med["width_pi_high"], PALETTE[0])
    p.line(x, med["width"], PALETTE[0])
    p.points(x, med["width"], PALETTE[0])
    p.legend(f"median over edges: predicted width, {level:.0%} prediction interval", PALETTE[0])
    for row in bound_rows(widths):
        if row["uninformative"] is None:
            p.legend(f"N = {row['n']}: upper bound vs the pilot's width not assessed (older run)", "#b00", "x")
        elif row["uninformative"]:
            p.legend(f"N = {row['n']}: upper bound above the pilot's width for {row['uninformative']} of "
                     f"{row['edges']} edges", "#b00", "x")
    p.axes("prompts N (log scale)", "per-edge interval width", xticks=list(x))
    return p


def sample_size_svg(stab: Mapping[str, np.ndarray], widths: Mapping[str, np.ndarray], *, target: float,
                    level: float) -> str:
    """Return one SVG document: the predicted Jaccard panel beside the predicted width panel."""
    a, b = _jaccard_plot(stab, target, level).svg(), _width_plot(widths, level).svg()
    # each panel's height includes its legend's rows (the width panel's grows with the N whose bounds plan nothing)
    height = max([420] + [int(re.search(r'height="(\d+)"', x).group(1)) + 10 for x in (a, b)])
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="940" height="{height}" role="img" '
            f'aria-label="{esc("sample size: predicted Jaccard and width against N")}">'
            f'<g>{a}</g><g transform="translate(470,0)">{b}</g></svg>')
