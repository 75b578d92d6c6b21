"""Robust per-edge estimands beside the mean: the median and the trimmed mean, each with its own interval.

Per-example attribution scores are heavy-tailed: on some edges one prompt in thousands carries most of the
mean, and no interval for the mean built from a sample that missed that prompt can cover it. The median and
the trimmed mean answer a different question -- the effect on a typical prompt -- that a few prompts cannot
move, so their intervals stay calibrated where the mean's cannot (docs/calibration.md, "Robust estimands").

* `median_interval`: the distribution-free order-statistic interval [X_(l), X_(n+1-l)] with l the largest
  rank whose binomial tail P(Bin(n, 1/2) <= l - 1) is at most alpha/2. Its coverage of the population median
  is at least the achieved level 1 - 2 P(Bin(n, 1/2) <= l - 1) for every distribution (exactly that level
  for a continuous one; ties only raise it), reported in `achieved_level` (Hollander, Wolfe & Chicken,
  Nonparametric Statistical Methods, 3rd ed., sec. 3.6; scipy.stats.quantile_test is the oracle in tests).
  Below n = 6 no pair of order statistics reaches 95%: the bounds are then -inf / inf (never a false width).
* `trimmed_mean_interval`: the Tukey-McLaughlin interval (Tukey & McLaughlin 1963; Wilcox, Introduction to
  Robust Estimation, 4th ed., sec. 4.4): trimmed mean +- t_{n - 2g - 1} s_w / ((1 - 2 gamma) sqrt(n)), g =
  floor(gamma n) trimmed from each end, s_w the standard deviation (ddof 1) of the gamma-winsorized sample:
  scipy.stats.mstats.trimmed_mean_ci's conventions (the oracle in tests).

Arrays hold examples along `axis` (default [N, E]); every edge is computed at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import binom, t as student_t

from circuitstat.core.schema_core import MEDIAN_ESTIMAND, TRIMMED_ESTIMAND

__all__ = ["ESTIMANDS", "DEFAULT_TRIM", "RobustInterval", "median_ranks", "median_interval",
           "trimmed_mean_interval"]

#: share trimmed from each end by default (Wilcox's recommended 20%)
DEFAULT_TRIM = 0.2
#: what each robust interval covers
ESTIMANDS = {"median": MEDIAN_ESTIMAND, "trimmed_mean": TRIMMED_ESTIMAND}


@dataclass
class RobustInterval:
    """Per-edge robust estimates with their interval, the estimand, and the level each interval reaches."""

    estimate: np.ndarray
    low: np.ndarray
    high: np.ndarray
    statistic: str  # "median" or "trimmed_mean"
    estimand: str
    confidence_level: float
    n_obs: int
    achieved_level: float  # the exact level of the median's interval; nominal for the trimmed mean
    pvalue: np.ndarray  # two-sided p-value of a zero effect that inverts the interval (see each function)
    params: dict = field(default_factory=dict)

    def conf_int(self) -> tuple[np.ndarray, np.ndarray]:
        """Return (low, high) per edge."""
        return self.low, self.high


def _check(S: np.ndarray, confidence_level: float, axis: int) -> np.ndarray:
    """Return S as float64 with examples on the last axis; raise ValueError for bad input."""
    x = np.moveaxis(np.asarray(S, dtype=np.float64), axis, -1)
    if x.shape[-1] < 2:
        raise ValueError(f"a robust interval needs at least 2 examples, got N = {x.shape[-1]}")
    if not np.isfinite(x).all():
        raise ValueError("scores contain NaN or inf: drop or fix those examples before computing intervals")
    if not 0.0 < confidence_level < 1.0:
        raise ValueError(f"confidence_level must lie in (0, 1), got {confidence_level}")
    return x


def median_ranks(n_obs: int, confidence_level: float = 0.95) -> tuple[int, int, float]:
    """Return (l, u, achieved level): the 1-based order statistics of the median's interval, (0, n+1) if none."""
    alpha = 1.0 - confidence_level
    # largest l with P(Bin(n, 1/2) <= l - 1) <= alpha / 2; the interval is symmetric, u = n + 1 - l
    cdf = binom.cdf(np.arange(n_obs // 2 + 1), n_obs, 0.5)
    ok = np.flatnonzero(cdf <= alpha / 2 * (1 + 1e-12))
    if ok.size == 0:
        return 0, n_obs + 1, 1.0
    lo = int(ok[-1]) + 1
    return lo, n_obs + 1 - lo, float(1.0 - 2.0 * cdf[lo - 1])


def median_interval(S: np.ndarray, confidence_level: float = 0.95, axis: int = 0) -> RobustInterval:
    """Return per-edge sample medians with the distribution-free order-statistic interval."""
    x = np.sort(_check(S, confidence_level, axis), axis=-1)
    n = x.shape[-1]
    lo, hi, achieved = median_ranks(n, confidence_level)
    low = x[..., lo - 1] if lo >= 1 else np.full(x.shape[:-1], -np.inf)
    high = x[..., hi - 1] if hi <= n else np.full(x.shape[:-1], np.inf)
    # the sign test, zeros counted on both sides: p <= 1 - confidence_level exactly when the interval
    # excludes 0 (X_(l) > 0 iff at most l - 1 examples are <= 0, and l - 1 is the largest count whose
    # binomial tail is <= alpha / 2)
    count = np.minimum((x <= 0).sum(axis=-1), (x >= 0).sum(axis=-1))
    pvalue = np.minimum(1.0, 2.0 * binom.cdf(count, n, 0.5))
    return RobustInterval(np.median(x, axis=-1), low, high, "median", ESTIMANDS["median"], confidence_level, n,
                          achieved, pvalue, {"method": "order statistics (binomial); p: sign test", "ranks": (lo, hi)})


def trimmed_mean_interval(S: np.ndarray, trim: float = DEFAULT_TRIM, confidence_level: float = 0.95,
                          axis: int = 0) -> RobustInterval:
    """Return per-edge trimmed means with the Tukey-McLaughlin (winsorized-variance t) interval."""
    if not 0.0 <= trim < 0.5:
        raise ValueError(f"trim is the share cut from each end and must lie in [0, 0.5), got {trim}")
    x = np.sort(_check(S, confidence_level, axis), axis=-1)
    n = x.shape[-1]
    g = int(math.floor(trim * n))
    if n - 2 * g < 2:
        raise ValueError(f"trimming {g} of N = {n} from each end leaves fewer than 2 examples; lower trim")
    est = x[..., g:n - g].mean(axis=-1)
    wins = np.concatenate([np.repeat(x[..., g:g + 1], g, axis=-1), x[..., g:n - g],
                           np.repeat(x[..., n - g - 1:n - g], g, axis=-1)], axis=-1)
    se = wins.std(axis=-1, ddof=1) / ((1.0 - 2.0 * trim) * math.sqrt(n))
    q = float(student_t.ppf(0.5 + confidence_level / 2, n - 2 * g - 1))
    # Yuen's one-sample trimmed t test: p < 1 - confidence_level exactly when the interval excludes 0
    with np.errstate(divide="ignore", invalid="ignore"):
        tstat = np.where(se > 0, np.abs(est) / np.where(se > 0, se, 1.0), np.where(est == 0, 0.0, np.inf))
    pvalue = 2.0 * student_t.sf(tstat, n - 2 * g - 1)
    estimand = ESTIMANDS["trimmed_mean"] if trim == DEFAULT_TRIM else (
        f"the {trim:.0%}-trimmed mean effect over the task's prompt distribution")
    return RobustInterval(est, est - q * se, est + q * se, "trimmed_mean", estimand, confidence_level, n,
                          confidence_level, pvalue, {"method": "Tukey-McLaughlin (winsorized variance, t)", "trim": trim,
                                             "n_trimmed_each_end": g, "df": n - 2 * g - 1})
