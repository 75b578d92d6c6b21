"""The circuit choice's fine search over k: faithfulness at extra k values below the spec's grid, so the verdict
can name the smallest circuit that meets the bar instead of the nearest grid value above it.

The rule (circuitstat.reports.verdicts.build.choose_k reads it back) is a fixed-sequence test down every integer k from the
grid's largest: k passes when its faithfulness lower bound (selection-aware when the run has it, else the fixed
circuit's) is at least the bar, and the chosen k is the smallest k such that it and every larger k pass. Testing
a pre-set sequence in order and stopping at the first failure controls the family-wise error over all the k it
tests without adjustment, however many. The grid's own values are reused; every other k costs one faithfulness
evaluation (the fixed circuit and its cross-fitted folds), at most ``k_search`` of them (the spec key). The
extra rows are faithfulness_vs_k rows with ``k_source = "search"``; the stability curves keep the grid.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["lower_bound_column", "search_k"]


def lower_bound_column(table: dict) -> str:
    """Return the lower-bound column the choice reads: f_selected_ci_low when any grid row has it, else f_ci_low."""
    sel = np.asarray(table["f_selected_ci_low"], dtype=np.float64)
    return "f_selected_ci_low" if np.isfinite(sel).any() else "f_ci_low"


def search_k(evaluate, grid: dict, budget: int, bar: float) -> tuple[list[dict], str]:
    """Return (extra rows, why the search stopped) of the fixed-sequence search below the grid's largest k.

    ``grid``: the grid's faithfulness_vs_k columns for one method; ``evaluate(k)`` returns the columns of one
    extra k (the same builder as the grid's); ``budget``: the most extra evaluations."""
    col = lower_bound_column(grid)
    low = {int(k): float(v) for k, v in zip(grid["k"], grid[col])}
    top = max(low)
    if not low[top] >= bar:
        return [], f"k = {top}, the grid's largest, does not reach the bar: nothing below it is tested"
    extra: list[dict] = []
    k = top - 1
    while k >= 1:
        if k not in low:
            if len(extra) >= budget:
                return extra, f"the search stopped at its budget of {budget} extra evaluations (spec key k_search)"
            row = evaluate(k)
            extra.append(row)
            v = float(row[col][0])
            low[k] = v if math.isfinite(v) else math.nan
        if not low[k] >= bar:
            return extra, f"k = {k} fails the bar"
        k -= 1
    return extra, "every k down to 1 passes"
