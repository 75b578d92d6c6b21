"""Intrinsic variation of per-input scores per edge (the variance study's ``intrinsic`` table).

Per edge: mean, SD, coefficient of variation, sign consistency, SNR (|mean| / SD), excess
kurtosis and the share of the sum of squared deviations carried by the top 5 % of inputs, with
its 99th percentile for Gaussian scores of the same N (``heavy_tailed`` = above it: a 1 %-level
test of tail concentration).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["top_share", "gaussian_top_share_q99", "intrinsic_table", "intrinsic_medians"]


def top_share(S: np.ndarray) -> np.ndarray:
    """Return per column the share of sum_n (s_n - mean)^2 carried by the ceil(5 %) largest deviations."""
    N = S.shape[0]
    dev2 = (S - S.mean(0)) ** 2
    m = max(1, int(np.ceil(0.05 * N)))
    top = -np.partition(-dev2, m - 1, axis=0)[:m] if m < N else dev2
    tot = dev2.sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(tot > 0, top.sum(0) / tot, np.nan)


def gaussian_top_share_q99(n: int, reps: int = 4000) -> float:
    """Return the 99th percentile of the top-5 % share for n Gaussian inputs (Monte Carlo, fixed seed)."""
    z = np.random.default_rng(20260).standard_normal((n, reps))
    return float(np.quantile(top_share(z), 0.99))


def intrinsic_table(S: np.ndarray, names: Sequence[str]) -> dict:
    """Return the per-edge variation columns of per-input scores S [N, E] (see the module doc)."""
    from scipy import stats as sps

    S = np.asarray(S, dtype=np.float64)
    N, E = S.shape
    mean = S.sum(0) / N
    dev = S - mean
    sd = np.sqrt((dev**2).sum(0) / (N - 1)) if N > 1 else np.full(E, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        cv = np.where(mean != 0, sd / np.abs(mean), np.nan)
        snr = np.where(sd > 0, np.abs(mean) / sd, np.where(mean != 0, np.inf, np.nan))
        kurt = sps.kurtosis(S, axis=0, fisher=True, bias=False) if N >= 4 else np.full(E, np.nan)
    top5 = top_share(S)
    q99 = gaussian_top_share_q99(N) if N >= 3 else np.nan
    sign = np.sign(mean)
    consistency = np.where(sign != 0, (np.sign(S) == sign).sum(0) / N, np.nan)
    return {"edge": np.arange(E, dtype=np.int64), "name": list(names), "mean": mean, "sd": sd, "cv": cv,
            "sign_consistency": consistency, "snr": snr, "excess_kurtosis": np.asarray(kurt, dtype=np.float64),
            "top5_share": top5, "top5_share_gaussian_q99": np.full(E, q99),
            "heavy_tailed": np.asarray(top5 > q99, dtype=bool),
            "n": np.full(E, N, dtype=np.int64)}


def intrinsic_medians(S: np.ndarray, counts: np.ndarray) -> dict[str, np.ndarray]:
    """Return per resample row of counts [B, N]: the median over S's columns of CV, sign consistency, SNR."""
    S = np.asarray(S, dtype=np.float64)
    W = np.asarray(counts, dtype=np.float64)
    n = W.sum(1, keepdims=True)
    m1 = W @ S / n
    m2 = W @ S**2 / n
    sd = np.sqrt(np.maximum(m2 - m1**2, 0) * n / np.maximum(n - 1, 1))
    pos, neg = W @ (S > 0) / n, W @ (S < 0) / n
    with np.errstate(divide="ignore", invalid="ignore"):
        cv = np.where(m1 != 0, sd / np.abs(m1), np.nan)
        snr = np.where(sd > 0, np.abs(m1) / sd, np.nan)
    cons = np.where(m1 > 0, pos, np.where(m1 < 0, neg, np.nan))
    return {"cv": np.nanmedian(cv, 1), "sign_consistency": np.nanmedian(cons, 1), "snr": np.nanmedian(snr, 1)}
