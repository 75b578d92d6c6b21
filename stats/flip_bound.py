"""A sampling-aware lower bound on the expected Jaccard of two independent datasets' top-k circuits.

Where every split or resample of one dataset gives the same top-k circuit, a resampling interval has zero
width, yet a finite dataset only resolves a flip at the cut-off down to its own sampling error. The bound here
comes from the observed gaps at the cut-off rather than from counting resamples (the Monte Carlo
Clopper-Pearson floor it replaces, circuitstat.stats.stability_data.resolution_floor, only resolved a flip
chance down to about 3 / R for R resamples, however large the gaps were).

Let M be the full data's top-k and D a dataset of m prompts drawn independently of it. A pair (t in M,
u not in M) is flipped in D when u's key exceeds t's. If D's top-k differs from M in s edges, the s edges
that entered beat the s that left, so at least s pairs are flipped, and the Jaccard distance is
2 s / (k + s) <= 2 s / (k + 1). Hence E[d(D, M)] <= 2 / (k + 1) * sum over pairs of P(pair flipped in D),
and by the triangle inequality for the Jaccard distance (a metric), E[1 - J(D1, D2)] <= 2 E[d(D, M)].
P(pair flipped) is approximated by the normal tail Phi(-gap_low / se_m) with se_m the standard error of the
key difference on m prompts (per-example covariance of the two edges) and gap_low a one-sided lower
confidence bound of the population gap from the N prompts at hand (gap - z_{1-alpha} se_N). Under
ranking "absolute" the key difference is |mean_t| - |mean_u|, linearised with the signs of the full means.
Approximate (normal tails, no multiplicity over pairs), and meant only where the resampling spread cannot
resolve the flips; a floor is never raised above the estimate it bounds.
"""

from __future__ import annotations

import numpy as np
from scipy.special import log_ndtr, ndtri

from circuitstat.core.score_columns import column_blocks

__all__ = ["flip_pair_sums", "jaccard_gap_floor", "unit_means_order"]


def _unit_block(block, unit: np.ndarray | None, n_units: int) -> np.ndarray:
    """Return a C-contiguous float64 block [units, c]: the rows themselves, or each unit's mean row."""
    b = np.ascontiguousarray(np.asarray(block, dtype=np.float64))
    if unit is None:
        return b
    out = np.zeros((n_units, b.shape[1]))
    np.add.at(out, unit, b)
    return out / np.bincount(unit, minlength=n_units)[:, None]


def unit_means_order(S, ranking: str, unit: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Return (mean per edge over units, the edges in ranking order, best first) of S [N, E] read block by block.

    unit [N] (labels 0..U-1, e.g. a cluster plan's templates): means of unit means. Axis-0 reductions of
    C-contiguous blocks only, so the result has the same bits however S is split into column blocks.
    """
    n_units = S.shape[0] if unit is None else int(unit.max()) + 1
    mean = np.concatenate([_unit_block(b, unit, n_units).mean(axis=0) for _, b in column_blocks(S)])
    key = np.abs(mean) if ranking == "absolute" else mean
    return mean, np.argsort(-key, kind="stable")


def flip_pair_sums(S, order: np.ndarray, ks: np.ndarray, m: int, ranking: str, confidence_level: float,
                   unit: np.ndarray | None = None) -> np.ndarray:
    """Return, per k, the sum over (top-k, non-top-k) edge pairs of the approximate chance the pair flips on m units.

    S [N, E] are per-example scores (an array or column blocks), order [>= max(ks)] the full data's ranking
    (best first; its first k are M), m the size of the hypothetical datasets in units, ranking "signed" or
    "absolute", unit [N] optional unit labels (scores averaged per unit first). Each term is
    Phi(-(gap - z se_U) / se_m), z the one-sided normal quantile at confidence_level, se_n = sd(x_t - x_u) /
    sqrt(n) for the (sign-aligned) difference over the U units. Elementwise, block by block (no matrix product):
    the same bits however S is split into column blocks.
    """
    n_units = S.shape[0] if unit is None else int(unit.max()) + 1
    n_edges = S.shape[1]
    mean, _ = unit_means_order(S, ranking, unit)
    # under "absolute" the key |mean| moves with the sign-aligned scores to first order
    sign = np.where(mean < 0, -1.0, 1.0) if ranking == "absolute" else np.ones(n_edges)
    key = mean * sign
    ks = np.asarray(ks, dtype=np.int64)
    K = int(ks.max())
    top = np.asarray(order[:K], dtype=np.int64)
    rank = np.full(n_edges, n_edges, dtype=np.int64)
    rank[top] = np.arange(K)
    C_top = np.empty((n_units, K))
    for sl, b in column_blocks(S):  # the top edges' centred, sign-aligned unit scores
        inside = (top >= sl.start) & (top < sl.stop)
        C_top[:, inside] = (_unit_block(b, unit, n_units)[:, top[inside] - sl.start] - mean[top[inside]]) * sign[top[inside]]
    z = float(ndtri(confidence_level))
    per_col = np.zeros((ks.size, n_edges))
    for sl, b in column_blocks(S):
        C = (_unit_block(b, unit, n_units) - mean[sl]) * sign[sl]
        for j in range(K):
            d = C_top[:, j:j + 1] - C
            sd = np.sqrt(((d - d.mean(axis=0)) ** 2).sum(axis=0) / max(n_units - 1, 1))
            gap = key[top[j]] - key[sl]
            with np.errstate(divide="ignore", invalid="ignore"):
                t = np.where(sd > 0, (gap - z * sd / np.sqrt(n_units)) / (sd / np.sqrt(m)),
                             np.where(gap > 0, np.inf, -np.inf))
            p = np.exp(log_ndtr(-t))
            for i, k in enumerate(ks):
                if j < k:  # pairs (t among the first k, u outside them)
                    per_col[i, sl] += np.where(rank[sl] >= k, p, 0.0)
    return per_col.sum(axis=1)


def jaccard_gap_floor(S, order: np.ndarray, ks: np.ndarray, m: int, ranking: str,
                      confidence_level: float, unit: np.ndarray | None = None) -> np.ndarray:
    """Return, per k, the lower bound 1 - 4 / (k + 1) * sum of pair flip chances on J_m (floored at 0).

    A flip chance below float64's resolution is reported as machine epsilon, so the bound is always below 1:
    an interval floored by it never has zero width.
    """
    ks = np.asarray(ks, dtype=np.int64)
    q = np.maximum(flip_pair_sums(S, order, ks, m, ranking, confidence_level, unit), np.finfo(np.float64).eps)
    return np.clip(1.0 - 4.0 / (ks + 1) * q, 0.0, 1.0 - np.finfo(np.float64).eps)
