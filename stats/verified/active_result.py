"""The active design's per-edge results as a VerifiedResult: the same ``verified`` table as the uniform design's.

circuitstat.stats.verified.active computes the estimate, interval, SE and λ (Zrnic & Candès 2024, "Active
statistical inference", arXiv 2403.03208); this module adds what the verified table carries beside them:

* the p-value of mean 0: the interval's form (Student-t with sampled cells − 2 df; 1 where an edge has ≤ 2 cells)
  applied to the **cross-fitted** estimate and its SE (circuitstat.stats.verified.active.active_crossfit: 2-fold, λ
  for each fold's cells fitted on the other fold's, exactly unbiased given the prompts), and BH (or BY) q-values
  over edges. The interval and ``estimate`` keep λ fitted on all sampled cells (narrower; the params say so), as the
  uniform design does; ``estimate_crossfit`` is the p-value's estimate;
* ``no_tail_seen`` true/false: circuitstat.stats.verified.active_flag's flag (enough cells, the Horvitz–Thompson
  residual share as ``rectifier_share``, the approximation's tail over the unsampled cells as
  ``approx_tail_share``, the width over exact on as many prompts as the edge has cells as
  ``width_vs_exact_on_labelled`` and over exact on all N's estimated width as ``width_vs_exact_on_all``), measured in docs/verified.md ("Active verification");
* ``n_labelled`` is per edge: the cells sampled on that edge (the uniform design's n prompts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy import special

from circuitstat.core.results import ConfidenceInterval

from .active import ACTIVE_MIX, active_crossfit, active_means
from .active_flag import active_reliability
from .result import VerifiedResult

__all__ = ["ActiveVerifiedResult", "active_verified_means", "active_estimand", "ACTIVE_LABEL"]

#: the method label of the active design (every table and report names it)
ACTIVE_LABEL = f"PPI++ active sampling (Zrnic & Candès 2024), defensive mixture {ACTIVE_MIX:g}"


def active_estimand(budget: float, N: int) -> str:
    """Return the words every interval of the active design carries: what it covers, its budget and N."""
    return f"mean exact effect, verified on {budget:g} expected exact cells per edge of {N} prompts (active sampling)"


@dataclass(repr=False)
class ActiveVerifiedResult(VerifiedResult):
    """Per-edge active-design estimates of the mean exact effect: the verified table with the active design's flag."""

    cells: np.ndarray | None = None  # [E] exact cells sampled per edge
    budget: float = 0.0

    @property
    def estimand(self) -> str:
        """Return what the intervals cover, with the budget and N."""
        return active_estimand(self.budget, self.n_prompts)

    def _tables(self) -> dict[str, dict[str, Any]]:
        cols = super()._tables()["verified"]
        cols["n_labelled"] = np.asarray(self.cells, dtype=np.int64)
        return {"verified": cols}

    def _summary_items(self) -> list[tuple[str, Any]]:
        return super()._summary_items() + [("exact cells per edge (median)", float(np.median(self.cells)))]


def active_pvalues(estimate: np.ndarray, se: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """Return two-sided p-values of mean 0 for ``estimate`` and ``se`` in active_means' interval form (t, cells − 2 df;
    1 with ≤ 2 cells): the cross-fitted estimate's in active_verified_means."""
    df = np.maximum(cells - 2, 1).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(estimate) / se
    p = np.where(se > 0, 2.0 * special.stdtr(df, -np.where(se > 0, t, 0.0)), np.where(estimate != 0, 0.0, 1.0))
    return np.where(cells > 2, p, 1.0)


def active_verified_means(approx: np.ndarray, exact: np.ndarray, sampled: np.ndarray, probs: np.ndarray, *,
                          budget: float, confidence_level: float = 0.95, correction: str = "bh",
                          edge_names: Sequence[str] | None = None) -> ActiveVerifiedResult:
    """Return the active design's per-edge results (an ActiveVerifiedResult) from active_means on these cells."""
    from circuitstat.stats.testing import adjust_pvalues

    r = active_means(approx, exact, sampled, probs, confidence_level)
    cf = active_crossfit(approx, exact, sampled, probs)
    rel = active_reliability(approx, exact, sampled, probs, r["lam"], r["high"] - r["low"], confidence_level)
    A = np.asarray(approx, np.float64)
    N, E = A.shape
    p = active_pvalues(cf["estimate"], cf["se"], r["cells"])
    _, q = adjust_pvalues(p, correction, 1 - confidence_level)
    params = {"estimator": "active_verified_means", "method": ACTIVE_LABEL, "design": "active",
              "interval": "t (sampled cells - 2 df)", "tuning": "Horvitz-Thompson-weighted slope, clipped to [0, 1]",
              "confidence_level": confidence_level, "correction": correction,
              "pvalues": "cross-fitted λ (2 folds of prompts; the interval keeps λ fitted on all sampled cells)",
              "budget": float(budget),
              "no_tail_seen": "active design: >= 16 cells, HT residual share <= 0.5, approximation tail share over "
                              "the unsampled cells <= 0.6, width <= 2x exact on as many prompts as cells and <= 20x "
                              "exact on all N (estimated)",
              "n_prompts": N, "estimand": active_estimand(budget, N)}
    return ActiveVerifiedResult(r["estimate"], r["se"], ConfidenceInterval(r["low"], r["high"]),
                                np.maximum(r["cells"] - 2, 0).astype(np.float64), r["lam"], p, q, A.mean(0),
                                rel["residual_share"], rel["approx_tail_share"], rel["width_ratio"], cf["estimate"],
                                rel["reliable"], int(np.median(r["cells"])), N, float(confidence_level),
                                params["interval"], params["tuning"], correction, edge_names, params,
                                width_vs_exact_all=rel["width_vs_exact_all"],
                                width_vs_exact_all_max=rel["width_vs_exact_all_max"], cells=np.asarray(r["cells"], np.int64),
                                budget=float(budget))
