"""The active design's per-edge results as a VerifiedResult: the same ``verified`` table as the uniform design's.

circuitstat.stats.verified.active computes the estimate, interval, SE and λ (Zrnic & Candès 2024, "Active
statistical inference", arXiv 2403.03208); this module adds what the verified table carries beside them:

* the p-value inverting that interval (Student-t with sampled cells − 2 df; 1 where an edge has ≤ 2 cells and its
  interval is unbounded), and BH (or BY) q-values over edges. λ is fitted on the sampled cells, as in the interval
  (the uniform design's p-values use a cross-fitted λ; no cross-fitting of the active design is built), and the
  params say so;
* ``no_tail_seen`` is null: **not assessed**. The uniform design's flag (circuitstat.stats.verified.reliability) reads
  the rectifier over a uniformly random set of labelled prompts, the approximation's tail over the unlabelled
  ones and a yardstick of exact on the labelled prompts; under the active design an edge's exact cells are a
  Horvitz–Thompson-weighted Poisson sample, no prompt set is labelled for every edge, and no rule for it has been
  measured, so the flag neither passes nor fails an edge. The other flag inputs (rectifier_share,
  approx_tail_share) are NaN for the same reason;
* ``n_labelled`` is per edge: the cells sampled on that edge (the uniform design's n prompts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy import special

from circuitstat.core.results import ConfidenceInterval

from .active import ACTIVE_MIX, active_means
from .result import VerifiedResult

__all__ = ["ActiveVerifiedResult", "active_verified_means", "active_estimand", "ACTIVE_LABEL"]

#: the method label of the active design (every table and report names it)
ACTIVE_LABEL = f"PPI++ active sampling (Zrnic & Candès 2024), defensive mixture {ACTIVE_MIX:g}"


def active_estimand(budget: float, N: int) -> str:
    """Return the words every interval of the active design carries: what it covers, its budget and N."""
    return f"mean exact effect, verified on {budget:g} expected exact cells per edge of {N} prompts (active sampling)"


@dataclass(repr=False)
class ActiveVerifiedResult(VerifiedResult):
    """Per-edge active-design estimates of the mean exact effect: the verified table, tail flag not assessed."""

    cells: np.ndarray | None = None  # [E] exact cells sampled per edge
    budget: float = 0.0

    @property
    def estimand(self) -> str:
        """Return what the intervals cover, with the budget and N."""
        return active_estimand(self.budget, self.n_prompts)

    def _tables(self) -> dict[str, dict[str, Any]]:
        cols = super()._tables()["verified"]
        E = self.estimate.size
        cols["no_tail_seen"] = np.full(E, None, dtype=object)  # not assessed (module docstring)
        cols["n_labelled"] = np.asarray(self.cells, dtype=np.int64)
        for optional in ("width_vs_exact_on_labelled", "estimate_crossfit"):  # the uniform design's own
            del cols[optional]
        return {"verified": cols}

    def _summary_items(self) -> list[tuple[str, Any]]:
        items = [(k, v) for k, v in super()._summary_items() if not k.startswith("no tail seen")]
        return items + [("no tail seen", "not assessed (active design)"),
                        ("exact cells per edge (median)", float(np.median(self.cells)))]


def active_pvalues(estimate: np.ndarray, se: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """Return two-sided p-values of mean 0 inverting active_means' interval (t, cells − 2 df; 1 with ≤ 2 cells)."""
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
    A = np.asarray(approx, np.float64)
    N, E = A.shape
    p = active_pvalues(r["estimate"], r["se"], r["cells"])
    _, q = adjust_pvalues(p, correction, 1 - confidence_level)
    nan = np.full(E, np.nan)
    params = {"estimator": "active_verified_means", "method": ACTIVE_LABEL, "design": "active",
              "interval": "t (sampled cells - 2 df)", "tuning": "Horvitz-Thompson-weighted slope, clipped to [0, 1]",
              "confidence_level": confidence_level, "correction": correction,
              "pvalues": "inverting the interval (λ fitted on the sampled cells)", "budget": float(budget),
              "no_tail_seen": "not assessed (active design)", "n_prompts": N,
              "estimand": active_estimand(budget, N)}
    return ActiveVerifiedResult(r["estimate"], r["se"], ConfidenceInterval(r["low"], r["high"]),
                                np.maximum(r["cells"] - 2, 0).astype(np.float64), r["lam"], p, q, A.mean(0), nan, nan,
                                nan, nan, np.zeros(E, bool), int(np.median(r["cells"])), N, float(confidence_level),
                                params["interval"], params["tuning"], correction, edge_names, params,
                                cells=np.asarray(r["cells"], np.int64), budget=float(budget))
