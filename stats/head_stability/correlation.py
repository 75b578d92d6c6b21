"""Correlations: Fisher-z intervals and p-values, correlations pooled in Fisher z, and permutation tests
within groups (e.g. refits)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
from scipy import stats as sps

from circuitstat.core.seeds import as_seed_sequence


def fisher_interval(r: float, n_eff: float, confidence_level: float = 0.95) -> tuple[float, float]:
    """Return the Fisher-z interval of a correlation from ``n_eff`` pairs; (−1, 1) if n_eff <= 3."""
    if not np.isfinite(r):
        return (math.nan, math.nan)
    if n_eff <= 3:
        return (-1.0, 1.0)
    z = math.atanh(float(np.clip(r, -1 + 1e-12, 1 - 1e-12)))
    q = sps.norm.ppf(0.5 + confidence_level / 2) / math.sqrt(n_eff - 3)
    return (math.tanh(z - q), math.tanh(z + q))


def _centre_within(values: np.ndarray, group_index: list[np.ndarray]) -> np.ndarray:
    centred = values.astype(float).copy()
    for members in group_index:
        centred[members] -= centred[members].mean()
    return centred


def _permutation_count(x_centred: np.ndarray, y_centred: np.ndarray, group_index: list[np.ndarray], r: float,
                       n_permutations: int, seed: Any) -> int:
    """Return how many within-group permutations of y give |r| at least the observed one."""
    n = x_centred.size
    scale = math.sqrt(float(x_centred @ x_centred) * float(y_centred @ y_centred))
    tolerance = 1e-12 * max(1.0, abs(r))
    rng = np.random.default_rng(as_seed_sequence(seed))
    count = 0
    for start in range(0, n_permutations, 1000):
        batch = min(1000, n_permutations - start)
        order = np.tile(np.arange(n), (batch, 1))
        for members in group_index:
            order[:, members] = members[np.argsort(rng.random((batch, members.size)), axis=1)]
        count += int(np.sum(np.abs(y_centred[order] @ x_centred / scale) >= abs(r) - tolerance))
    return count


def permutation_correlation(x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None, *,
                            method: str = "pearson", n_permutations: int = 9999, seed: Any = 0,
                            confidence_level: float = 0.95) -> dict:
    """Return the correlation of x and y within groups, its Fisher-z CI and a permutation p-value.

    With one group this is the ordinary correlation (n_eff = n); with G groups (e.g. refits),
    x and y are centred within each group first and n_eff = n − (G − 1). The permutation null
    shuffles y within each group; with one group of at most 8 elements every permutation is
    enumerated (exact p-value). Keys: r, ci_low, ci_high, pvalue, n, n_eff, permutations, exact.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    groups = np.zeros(x.size, dtype=np.int64) if groups is None else np.asarray(groups)
    finite = np.isfinite(x) & np.isfinite(y)
    x, y, groups = x[finite], y[finite], groups[finite]
    if method == "spearman":
        x, y = sps.rankdata(x), sps.rankdata(y)
    elif method != "pearson":
        raise ValueError(f"unknown correlation {method!r}; use pearson or spearman")
    n = x.size
    group_index = [np.flatnonzero(groups == g) for g in np.unique(groups)]
    n_eff = n - (len(group_index) - 1)
    # centring within groups commutes with permuting within groups: permute the centred values
    x_centred, y_centred = _centre_within(x, group_index), _centre_within(y, group_index)
    scale = math.sqrt(float(x_centred @ x_centred) * float(y_centred @ y_centred))
    r = float(x_centred @ y_centred) / scale if n >= 3 and scale > 0 else math.nan
    low, high = fisher_interval(r, n_eff, confidence_level)
    out = {"r": r, "ci_low": low, "ci_high": high, "n": int(n), "n_eff": int(n_eff)}
    if not np.isfinite(r):
        return {**out, "pvalue": math.nan, "permutations": 0, "exact": False}
    if len(group_index) == 1 and n <= 8:
        every = np.array(list(itertools.permutations(range(n))))
        null = y_centred[every] @ x_centred / scale
        pvalue = float(np.mean(np.abs(null) >= abs(r) - 1e-12 * max(1.0, abs(r))))
        return {**out, "pvalue": pvalue, "permutations": len(every), "exact": True}
    count = _permutation_count(x_centred, y_centred, group_index, r, n_permutations, seed)
    return {**out, "pvalue": (1 + count) / (1 + n_permutations), "permutations": n_permutations, "exact": False}


def pooled_fisher_z(correlations: np.ndarray, n_effective: np.ndarray, confidence_level: float = 0.95
                    ) -> tuple[float, float, float, float]:
    """Return (r, low, high, two-sided p) of correlations pooled in Fisher z with weights n_eff − 3.

    Correlations with n_eff <= 3 or NaN are left out; with none left every value is NaN.
    """
    r = np.asarray(correlations, dtype=np.float64)
    n = np.asarray(n_effective, dtype=np.float64)
    keep = np.isfinite(r) & (n > 3)
    if not keep.any():
        return (math.nan, math.nan, math.nan, math.nan)
    z = np.arctanh(np.clip(r[keep], -1 + 1e-12, 1 - 1e-12))
    weights = n[keep] - 3
    z_mean = float(z @ weights / weights.sum())
    standard_error = 1 / math.sqrt(weights.sum())
    q = sps.norm.ppf(0.5 + confidence_level / 2) * standard_error
    pvalue = float(2 * sps.norm.sf(abs(z_mean) / standard_error))
    return math.tanh(z_mean), math.tanh(z_mean - q), math.tanh(z_mean + q), pvalue


def fisher_pvalue(r: float, n_eff: float) -> float:
    """Return the two-sided p-value of r = 0 from Fisher's z with n_eff pairs (NaN if n_eff <= 3)."""
    if not np.isfinite(r) or n_eff <= 3:
        return math.nan
    z = math.atanh(float(np.clip(r, -1 + 1e-12, 1 - 1e-12))) * math.sqrt(n_eff - 3)
    return float(2 * sps.norm.sf(abs(z)))
