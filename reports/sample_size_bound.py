"""The planning bound per N as a reader sees it: the terminal of ``circuitstat sample-size`` and its figure both read
these rows from the widths table's columns, so they cannot disagree.

A bound above the width the pilot already shows (``width_upper_below_pilot`` false,
circuitstat.stats.sample_size.predict_widths) is still an upper bound, but it cannot plan N: a median over edges
that mixes such bounds in silently would read as a plan. So each N states how many edges' bounds are informative
beside the all-edge median, and a line names the fix. The median is not restricted to the informative edges:
those are the edges whose pilot drew no spike, and on a spiky population their bounds held less often than all
edges' did (docs/sample-size.md, "When the bound plans nothing").
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

__all__ = ["bound_rows", "bound_notes"]


def bound_rows(widths: Mapping[str, Any]) -> list[dict]:
    """Return per N (ascending) a dict: n, edges, median_upper (over all edges), median_pilot_width and
    uninformative (edges whose bound is not below the pilot's own width; None where the table predates the column)."""
    n = np.asarray(widths["n"])
    flag = widths.get("width_upper_below_pilot")
    rows = []
    for v in np.unique(n):
        sel = n == v
        rows.append({"n": int(v), "edges": int(sel.sum()),
                     "median_upper": float(np.median(np.asarray(widths["width_upper"], dtype=float)[sel])),
                     "median_pilot_width": float(np.median(np.asarray(widths["pilot_width"], dtype=float)[sel])),
                     "uninformative": None if flag is None else int((~np.asarray(flag, dtype=bool)[sel]).sum())})
    return rows


def bound_notes(rows: list[dict], n_pilot: int) -> list[str]:
    """Return the lines naming what the uninformative bounds mean and the fix ([] when every bound is informative)."""
    if any(r["uninformative"] is None for r in rows):
        return ["whether each upper bound is below the pilot's own width was not assessed (a run made before "
                "width_upper_below_pilot): compare width_upper with pilot_width per edge, or rerun sample-size"]
    out = []
    above = [r for r in rows if r["uninformative"] and r["n"] > n_pilot]
    if above:
        at = ", ".join(f"{r['uninformative']} of {r['edges']} at N = {r['n']}" for r in above)
        out.append(f"take a larger pilot: edges' upper bounds exceed the pilot's own width ({at}), so they plan "
                   f"nothing; their scores are too heavy-tailed (or N too close to {n_pilot}) for {n_pilot} prompts "
                   "to bound")
    below = [r for r in rows if r["uninformative"] and r["n"] <= n_pilot]
    if below:
        at = ", ".join(f"{r['uninformative']} of {r['edges']} at N = {r['n']}" for r in below)
        out.append(f"at N <= the pilot's {n_pilot} prompts the upper bounds exceed the pilot's own width ({at}): "
                   "a run no larger than the pilot does not narrow its interval")
    return out
