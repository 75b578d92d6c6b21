"""How heavy each edge's tail is in a finite population of per-example scores [P, E].

Per-example attribution scores are heavy-tailed: on small trained models a few prompts carry most of an
edge's mean (docs/calibration.md, heavy tails). Three numbers per edge describe it for a calibration study,
which reports coverage against them (the worst edge's rank and kurtosis, coverage by kurtosis decile):

* ``abs_mean_rank``: 1 for the edge with the largest |population mean|, ties broken by column order;
* ``excess_kurtosis``: the population's own fourth standardised moment minus 3 (the finite population
  *is* the distribution, so the moment estimator without small-sample correction, scipy.stats.kurtosis
  with ``bias=True``, is its exact value); NaN for a constant column;
* ``top_prompt_share``: the largest share of the edge's total effect Σ_n x_n carried by one prompt,
  max_n x_n sign(Σ x) / |Σ x| (the issue-34 figure: one prompt in 2,048 carrying 0.91 of an edge's mean).
  It exceeds 1 when the other prompts cancel part of that prompt's effect, and is NaN when Σ x = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["EdgeTails", "edge_tails", "kurtosis_deciles"]


@dataclass(frozen=True)
class EdgeTails:
    """Per-edge tail descriptors of a population [E] each (see the module docstring)."""

    mean: np.ndarray
    abs_mean_rank: np.ndarray
    excess_kurtosis: np.ndarray
    top_prompt_share: np.ndarray

    def unit_info(self) -> dict[str, np.ndarray]:
        """The columns a calibration study's per-unit table carries for each edge."""
        return {"abs_mean_rank": self.abs_mean_rank, "excess_kurtosis": self.excess_kurtosis,
                "top_prompt_share": self.top_prompt_share}


def edge_tails(population: np.ndarray) -> EdgeTails:
    """Return the EdgeTails of ``population`` [P, E] (float64 arithmetic)."""
    x = np.asarray(population, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"the population must be a [P, E] matrix with P >= 2 rows, got shape {x.shape}")
    mean = x.mean(0)
    centred = x - mean
    m2 = np.mean(centred ** 2, axis=0)
    m4 = np.mean(centred ** 4, axis=0)
    # a column constant up to rounding has no defined kurtosis (0/0): NaN, not a huge number from noise
    flat = m2 <= (1e-12 * np.maximum(np.abs(mean), np.max(np.abs(x), axis=0))) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        kurt = np.where(flat, np.nan, m4 / np.where(flat, 1.0, m2) ** 2 - 3.0)
        total = x.sum(0)
        share = np.where(total == 0, np.nan, np.max(x * np.sign(total), axis=0) / np.abs(total))
    rank = np.empty(x.shape[1], dtype=np.int64)
    rank[np.argsort(-np.abs(mean), kind="stable")] = np.arange(1, x.shape[1] + 1)
    return EdgeTails(mean=mean, abs_mean_rank=rank, excess_kurtosis=kurt, top_prompt_share=share)


def kurtosis_deciles(kurtosis: np.ndarray, n_bins: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Return (bin of each unit in 0..n_bins-1, or -1 where its kurtosis is NaN; the bins' edges [n_bins + 1]).

    Bins are the empirical quantiles of the finite kurtoses (deciles by default); with fewer distinct
    values than bins, repeated edges leave some bins empty rather than splitting equal values."""
    k = np.asarray(kurtosis, dtype=np.float64)
    finite = np.isfinite(k)
    if not finite.any():
        return np.full(k.shape, -1, dtype=np.int64), np.full(n_bins + 1, np.nan)
    edges = np.quantile(k[finite], np.linspace(0.0, 1.0, n_bins + 1))
    bins = np.full(k.shape, -1, dtype=np.int64)
    # right-closed bins (q_{i-1}, q_i], the first also holding the minimum
    bins[finite] = np.clip(np.searchsorted(edges, k[finite], side="left") - 1, 0, n_bins - 1)
    return bins, edges
