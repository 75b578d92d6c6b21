"""Interval bounds from sorted resampled statistics: type-7 quantiles, every method's (low, high), the
percentile interval of replicate sets with undefined replicates (verdicts about 0: circuitstat.core.interval_words)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.special import ndtr, ndtri, stdtrit


def quantile_sorted(xs: np.ndarray, p: np.ndarray | float) -> np.ndarray:
    """Return type-7 (linear) quantiles of each row of sorted `xs` [c, B] at probability p [c]."""
    c, b = xs.shape
    p = np.broadcast_to(np.asarray(p, dtype=np.float64), (c,))
    bad = ~np.isfinite(p)
    h = (b - 1) * np.where(bad, 0.0, p)
    lo = np.clip(np.floor(h).astype(np.int64), 0, b - 1)
    hi = np.minimum(lo + 1, b - 1)
    t = h - lo
    rows = np.arange(c)
    a, bb = xs[rows, lo], xs[rows, hi]
    with np.errstate(invalid="ignore"):
        out = a + t * (bb - a)
    # bootstrap-t statistics can be +-inf (resamples with zero spread): interpolating towards an
    # infinite neighbour is that infinity, and a point exactly on a sorted value is that value
    out = np.where(np.isneginf(a) & (t < 1), -np.inf, out)
    out = np.where(np.isposinf(bb) & (t > 0), np.inf, out)
    out = np.where(t == 0, a, out)
    out[bad] = np.nan
    return out


def frac_below(r: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Return the share of resampled values below theta per row, ties counted one half."""
    t = theta[:, None]
    b = r.shape[1]
    return ((r < t).sum(axis=1) + (r <= t).sum(axis=1)) / (2.0 * b)


def intervals_sorted(xs: np.ndarray, theta: np.ndarray, frac_below: np.ndarray | None,
                      accel: np.ndarray | None, methods: Sequence[str], alpha: float,
                      alternative: str, *, ts: np.ndarray | None = None,
                      abs_ts: np.ndarray | None = None, se: np.ndarray | None = None,
                      df: float | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return {method: (low, high)} from sorted resampled statistics xs [c, B].

    `ts` / `abs_ts` are the sorted bootstrap-t statistics [c, B] and their sorted absolute
    values (studentized methods), `se` the sample standard error [c] and `df` the t degrees of
    freedom (t).
    """
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if "percentile" in methods or "basic" in methods:
        ql, qh = quantile_sorted(xs, alpha), quantile_sorted(xs, 1 - alpha)
        if "percentile" in methods:
            out["percentile"] = (ql, qh)
        if "basic" in methods:
            out["basic"] = (2 * theta - qh, 2 * theta - ql)
    if "bca" in methods:
        z0 = ndtri(frac_below)
        za = ndtri(alpha)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            n1, n2 = z0 + za, z0 - za
            a1 = ndtr(z0 + n1 / (1 - accel * n1))
            a2 = ndtr(z0 + n2 / (1 - accel * n2))
        out["bca"] = (quantile_sorted(xs, a1), quantile_sorted(xs, a2))
    if "t" in methods:
        half = stdtrit(df, 1 - alpha) * se
        out["t"] = (theta - half, theta + half)
    if "studentized" in methods or "studentized_symmetric" in methods:
        tl, th = quantile_sorted(ts, alpha), quantile_sorted(ts, 1 - alpha)
        out["studentized"] = (theta - th * se, theta - tl * se)
        if "studentized_symmetric" in methods:
            # two-sided: quantile of |t*| at the confidence level (Hall's symmetric bootstrap-t);
            # one-sided bounds are the equal-tailed bootstrap-t's
            if alternative == "two-sided":
                half = quantile_sorted(abs_ts, 1 - 2 * alpha) * se
                out["studentized_symmetric"] = (theta - half, theta + half)
            else:
                out["studentized_symmetric"] = out["studentized"]
        if "studentized" not in methods:
            del out["studentized"]
    for m, (lo, hi) in out.items():
        if alternative == "less":
            lo = np.full_like(lo, -np.inf)
        elif alternative == "greater":
            hi = np.full_like(hi, np.inf)
        out[m] = (lo, hi)
    return out


def percentile_interval(replicates: np.ndarray, confidence_level: float, *,
                        discrete: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Return the (low, high) percentile interval over the first axis, ignoring NaN replicates.

    The one percentile interval for replicate sets in which some replicates are undefined (a
    refit pair without matched heads): `intervals_from_distribution` serves complete bootstrap
    distributions and every other method. discrete: the replicates take a few values (a layer
    index): the ends are replicate values (inverted-CDF quantiles), never an interpolation."""
    import warnings

    alpha = (1 - confidence_level) / 2
    with warnings.catch_warnings():  # all-NaN columns give NaN ends, kept and documented
        warnings.simplefilter("ignore", RuntimeWarning)
        low, high = np.nanquantile(np.asarray(replicates, dtype=np.float64), [alpha, 1 - alpha], axis=0,
                                   method="inverted_cdf" if discrete else "linear")
    return low, high

