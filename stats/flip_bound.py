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

__all__ = ["flip_pair_sums", "jaccard_gap_floor"]

#: edge columns per block of the [K, block] pair matrices (bounded memory at 32k edges)
_BLOCK = 4096


def flip_pair_sums(S: np.ndarray, order: np.ndarray, ks: np.ndarray, m: int, ranking: str,
                   confidence_level: float) -> np.ndarray:
    """Return, per k, the sum over (top-k, non-top-k) edge pairs of the approximate chance the pair flips on m prompts.

    S [N, E] are per-example scores, order [>= max(ks)] the full data's ranking (best first; its first k are
    M), m the size of the hypothetical datasets, ranking "signed" or "absolute". Each term is Phi(-(gap - z se_N) / se_m), z the one-sided
    normal quantile at confidence_level, se_n = sd(x_t - x_u) / sqrt(n) for the (sign-aligned) difference.
    """
    S = np.asarray(S, dtype=np.float64)
    n_obs, n_edges = S.shape
    mean = S.mean(axis=0)
    # under "absolute" the key |mean| moves with the sign-aligned scores to first order
    sign = np.where(mean < 0, -1.0, 1.0) if ranking == "absolute" else np.ones(n_edges)
    C = (S - mean) * sign
    key = mean * sign
    K = int(np.max(ks))
    top = np.asarray(order[:K], dtype=np.int64)
    z = float(ndtri(confidence_level))
    var = np.einsum("ne,ne->e", C, C) / max(n_obs - 1, 1)
    out = np.zeros(len(ks))
    rank = np.full(n_edges, n_edges, dtype=np.int64)
    rank[top] = np.arange(K)
    for start in range(0, n_edges, _BLOCK):
        cols = np.arange(start, min(start + _BLOCK, n_edges))
        cov = C[:, top].T @ C[:, cols] / max(n_obs - 1, 1)  # [K, block]
        var_d = np.maximum(var[top][:, None] + var[cols][None, :] - 2 * cov, 0.0)
        sd = np.sqrt(var_d)
        gap = key[top][:, None] - key[cols][None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(sd > 0, (gap - z * sd / np.sqrt(n_obs)) / (sd / np.sqrt(m)),
                         np.where(gap > 0, np.inf, -np.inf))
        p = np.exp(log_ndtr(-t))
        for i, k in enumerate(np.asarray(ks, dtype=np.int64)):
            # pairs (t among the first k, u outside them)
            pk = p[:k][:, rank[cols] >= k]
            out[i] += pk.sum()
    return out


def jaccard_gap_floor(S: np.ndarray, order: np.ndarray, ks: np.ndarray, m: int, ranking: str,
                      confidence_level: float) -> np.ndarray:
    """Return, per k, the lower bound 1 - 4 / (k + 1) * sum of pair flip chances on J_m (floored at 0).

    A flip chance below float64's resolution is reported as machine epsilon, so the bound is always below 1:
    an interval floored by it never has zero width.
    """
    ks = np.asarray(ks, dtype=np.int64)
    q = np.maximum(flip_pair_sums(S, order, ks, m, ranking, confidence_level), np.finfo(np.float64).eps)
    return np.clip(1.0 - 4.0 / (ks + 1) * q, 0.0, 1.0 - np.finfo(np.float64).eps)
