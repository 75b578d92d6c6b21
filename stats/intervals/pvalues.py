"""P-values that invert the intervals: the smallest tail level at which each method's interval excludes
the null value (module docstring of circuitstat.stats.intervals), and the percentile-bootstrap p-value."""

from __future__ import annotations

import numpy as np
from scipy.special import ndtr, ndtri, stdtr

from ..testing import resampling_pvalue
from .methods import METHODS, STUDENTIZED


# q(p) is the type-7 quantile function of a sorted row: continuous and non-decreasing in p. An
# interval bound q(a(alpha)) lies strictly above v exactly when a(alpha) > G(v), and strictly
# below v exactly when a(alpha) < H(v), with G and H below; solving a(alpha) = G or H for alpha
# gives the smallest tail level at which the interval excludes v, i.e. the p-value.
def _level_at_most(xs: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Return G(v) = sup{p : q(p) <= v} per row of sorted xs [c, B] (0 if v < min, 1 if >= max)."""
    c, b = xs.shape
    j = (xs <= v[:, None]).sum(axis=1)
    return _interp_level(xs, v, j, b)


def level_at_least(xs: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Return H(v) = inf{p : q(p) >= v} per row of sorted xs [c, B] (0 if v <= min, 1 if > max)."""
    c, b = xs.shape
    j = (xs < v[:, None]).sum(axis=1)
    return _interp_level(xs, v, j, b)


def _interp_level(xs: np.ndarray, v: np.ndarray, j: np.ndarray, b: int) -> np.ndarray:
    """Return the probability p with q(p) = v between sorted points j-1 and j (0 or 1 outside)."""
    rows = np.arange(xs.shape[0])
    inner = (j > 0) & (j < b)
    lo = xs[rows, np.clip(j - 1, 0, b - 1)]
    hi = xs[rows, np.clip(j, 0, b - 1)]
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(hi > lo, (v - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0)
    # q(p) is -inf up to an infinite lower neighbour's end and +inf past an infinite upper one's
    frac = np.where(np.isneginf(lo), 1.0, np.where(np.isposinf(hi), 0.0, frac))
    h = (j - 1) + frac
    return np.where(inner, h / (b - 1), np.where(j >= b, 1.0, 0.0))


def _bca_level(g: np.ndarray, z0: np.ndarray, accel: np.ndarray, upper: bool) -> np.ndarray:
    """Return the tail level alpha at which a BCa bound's quantile level equals g."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        w = ndtri(g) - z0
        den = 1 + accel * w
        u = w / den
        level = ndtr(z0 - u) if upper else ndtr(u - z0)
    # beyond the range of BCa's level map (1 + a w <= 0) the target level is never reached: a
    # target below the map's infimum means the bound is always on the far side of the null
    # (lower bound: excluded at every alpha, level 0; upper bound: never excluded, level 1)
    level = np.where(den > 0, level, np.where(w < 0, float(upper), 1.0 - float(upper)))
    level = np.where(g <= 0, 0.0 if not upper else 1.0, level)
    return np.where(g >= 1, 1.0 if not upper else 0.0, level)


def pvalues_sorted(method: str, xs: np.ndarray, theta: np.ndarray, null: float,
                    frac_below: np.ndarray | None, accel: np.ndarray | None, alternative: str,
                    *, ts: np.ndarray | None = None, abs_ts: np.ndarray | None = None,
                    se: np.ndarray | None = None, df: float | None = None) -> np.ndarray:
    """Return the p-value inverting `method`'s interval at `null` (see module docstring).

    Two-sided p = 2 * min(lower-side level, upper-side level), capped at 1. Resampling p-values
    are never below 1/(B+1); the caller makes sure 1/(B+1) < 1 - confidence_level.
    """
    v = np.full(theta.shape, float(null))
    if method == "t":
        t0 = t_statistic(theta, se, null)
        lo_side, hi_side = _t_cdf(df, -t0), _t_cdf(df, t0)
    elif method == "percentile":
        lo_side, hi_side = _level_at_most(xs, v), 1 - level_at_least(xs, v)
    elif method == "basic":
        w = 2 * theta - null
        lo_side, hi_side = 1 - level_at_least(xs, w), _level_at_most(xs, w)
    elif method == "studentized_symmetric" and alternative == "two-sided":
        # |T0| > q_c(|t*|) exactly when c < H(|T0|): p = 1 - H(|T0|)
        t0 = np.abs(t_statistic(theta, se, null))
        p = 1 - level_at_least(abs_ts, t0)
        b = abs_ts.shape[1]
        return np.where(np.isnan(p), p, np.maximum(p, 1.0 / (b + 1.0)))
    elif method in STUDENTIZED:
        t0 = t_statistic(theta, se, null)
        lo_side, hi_side = 1 - level_at_least(ts, t0), _level_at_most(ts, t0)
    elif method == "bca":
        z0 = ndtri(frac_below)
        lo_side = _bca_level(_level_at_most(xs, v), z0, accel, upper=False)
        hi_side = _bca_level(level_at_least(xs, v), z0, accel, upper=True)
    else:
        raise ValueError(f"unknown interval method {method!r}; choose from {METHODS}")
    if alternative == "greater":
        p = lo_side
    elif alternative == "less":
        p = hi_side
    else:
        p = np.minimum(1.0, 2.0 * np.minimum(lo_side, hi_side))
    if method != "t":
        b = (ts if method in STUDENTIZED else xs).shape[1]
        p = np.where(np.isnan(p), p, np.maximum(p, 1.0 / (b + 1.0)))
    return p


def t_statistic(theta: np.ndarray, se: np.ndarray, null: float) -> np.ndarray:
    """Return (theta - null) / se; where se = 0, +-inf by the sign of theta - null (0 if equal)."""
    diff = theta - null
    with np.errstate(divide="ignore", invalid="ignore"):
        inf = np.sign(diff) * np.where(diff != 0, np.inf, 0.0)
        return np.where(se > 0, diff / np.where(se > 0, se, 1.0), inf)


def _t_cdf(df: float, t: np.ndarray) -> np.ndarray:
    """Return the Student-t cdf P(T_df <= t)."""
    return stdtr(df, t)


# The percentile bootstrap's evidence against H0: statistic = null in favour of `alternative` is
# the share of resampled values at or beyond null on the other side: null's resampling p-value in
# the opposite tail of the bootstrap distribution.
_OPPOSITE_TAIL = {"greater": "less", "less": "greater", "two-sided": "two-sided"}


def boot_pvalue(r: np.ndarray, alternative: str, null: float = 0.0) -> np.ndarray:
    """Return the percentile-bootstrap p-value per row of r [c, B] for H0: statistic = null, never below 1/(B+1)."""
    return resampling_pvalue(r, null, _OPPOSITE_TAIL.get(alternative, alternative))
