"""The jackknife: leave-one-out values of a statistic and the BCa acceleration (from them, or for the
mean in closed form)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..resampling import is_vectorized


def mean_acceleration(x: np.ndarray, axis: int = 0) -> np.ndarray:
    """Return the BCa acceleration of the mean in closed form, sum U^3 / (6 (sum U^2)^1.5)."""
    x = np.asarray(x, dtype=np.float64)
    u = x - x.mean(axis=axis, keepdims=True)
    num = (u**3).sum(axis=axis)
    den = 6.0 * (u**2).sum(axis=axis) ** 1.5
    # a constant sample has no skewness: a = 0 keeps BCa at the (degenerate) percentile interval
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


def acceleration_from_jackknife(theta_jack: np.ndarray) -> np.ndarray:
    """Return the BCa acceleration from leave-one-out statistics (jackknife on the last axis)."""
    t = np.asarray(theta_jack, dtype=np.float64)
    d = t.mean(axis=-1, keepdims=True) - t
    num = (d**3).sum(axis=-1)
    den = 6.0 * (d**2).sum(axis=-1) ** 1.5
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


def jackknife_statistic(data: np.ndarray, statistic: Callable[..., Any], *, axis: int = 0,
                        vectorized: bool | None = None, batch: int | None = None) -> np.ndarray:
    """Return the N leave-one-out values of `statistic`, jackknife index on the last axis."""
    data = np.moveaxis(np.asarray(data), axis, 0)
    n = data.shape[0]
    if n < 2:
        raise ValueError("the jackknife needs at least 2 observations")
    vec = is_vectorized(statistic, vectorized)
    if batch is None:
        per = max(1, (n - 1) * int(np.prod(data.shape[1:], dtype=np.int64)) * data.itemsize)
        batch = max(1, (64 * 2**20) // per)
    out = []
    for k in range(0, n, batch):
        rows = np.arange(k, min(k + batch, n))
        keep = np.ones((rows.size, n), dtype=bool)
        keep[np.arange(rows.size), rows] = False
        idx = np.broadcast_to(np.arange(n), keep.shape)[keep].reshape(rows.size, n - 1)
        if vec:
            out.append(np.asarray(statistic(data[idx], axis=1)))
        else:
            out.append(np.stack([np.asarray(statistic(data[i])) for i in idx]))
    return np.moveaxis(np.concatenate(out, axis=0), 0, -1)

