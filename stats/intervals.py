"""Confidence intervals for per-edge mean effects: bootstrap (percentile, basic, BCa,
studentized) and Student t, each with the p-value that inverts it, and standard errors.

Estimand: the mean effect over the task's prompt distribution (`ESTIMAND`). The default interval
is the symmetric studentized bootstrap (Hall's symmetric bootstrap-t: mean +- q * SE, q the
confidence-level quantile of |t*|, t* = (mean* - mean) / SE*), chosen by simulated coverage on
heavy-tailed finite populations (tests/stats/test_edge_coverage.py; README). 95% intervals at
N = 64 on real exact zoo scores covered: symmetric studentized 0.947, t 0.931, basic 0.929,
percentile 0.904, equal-tailed studentized 0.900, BCa 0.880. Cluster plans default to BCa (the
studentized methods need the i.i.d. standard error).

Every method's p-value inverts its own interval: the interval excludes the null value exactly
when p < 1 - confidence_level (before any multiplicity adjustment), so BH q-values built from
these p-values never disagree with the interval about zero at the unadjusted level.

Conventions follow scipy.stats.bootstrap so results can be checked against it: quantiles are
linear interpolation (type 7), the standard error has ddof=1, BCa's bias correction counts ties
at the estimate as one half (scipy's `_percentile_of_score`), and its acceleration is the
jackknife skewness a = sum(d^3) / (6 sum(d^2)^1.5), which for the mean is the closed form
a = sum(U^3) / (6 (sum U^2)^1.5), U = x - mean(x): no N leave-one-out passes are needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from scipy.special import ndtr, ndtri, stdtrit

from .reliability import RELIABLE_MAX_TAIL_SHARE, tail_share
from .resampling import (DEFAULT_MAX_BYTES, ResamplingPlan, _is_vectorized, _resolve_jobs,
                         check_score_matrix, default_chunk_size, map_edge_chunks, plan_weights,
                         resample_statistic, studentized_resamples)
from .results import ConfidenceInterval, Result

__all__ = [
    "percentile_interval",
    "BootstrapResult",
    "bootstrap_edges",
    "bootstrap_statistic",
    "intervals_from_distribution",
    "jackknife_statistic",
    "acceleration_from_jackknife",
    "mean_acceleration",
    "interval_verdict",
    "DEFAULT_METHOD",
    "ESTIMAND",
    "METHODS",
]

METHODS = ("percentile", "basic", "bca", "t", "studentized", "studentized_symmetric")
#: methods whose interval rests on the resampled means (need enough resamples)
RESAMPLING_METHODS = ("percentile", "basic", "bca", "studentized", "studentized_symmetric")
#: methods that studentize with the i.i.d. standard error (not valid for cluster plans)
IID_METHODS = ("t", "studentized", "studentized_symmetric")
STUDENTIZED = ("studentized", "studentized_symmetric")
#: methods available for a general statistic's bootstrap distribution (no per-example SE)
RESAMPLING_ONLY = ("percentile", "basic", "bca")
DEFAULT_METHOD = "studentized_symmetric"
ESTIMAND = "mean effect over the task's prompt distribution"
ALTERNATIVES = ("two-sided", "less", "greater")


def interval_verdict(low: float, high: float, above: str, below: str, undefined: str = "inconclusive") -> str:
    """Return ``above`` when the interval lies above 0, ``below`` when below, ``undefined`` when an end is
    missing (NaN), else "inconclusive"."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return undefined
    if low > 0:
        return above
    if high < 0:
        return below
    return "inconclusive"


# --- building blocks -----------------------------------------------------------------------
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
    vec = _is_vectorized(statistic, vectorized)
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


def _quantile_sorted(xs: np.ndarray, p: np.ndarray | float) -> np.ndarray:
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


def _tail_levels(confidence_level: float, alternative: str) -> float:
    """Return the lower tail probability alpha used for the two quantiles (scipy's rule)."""
    if not 0 < confidence_level < 1:
        raise ValueError("confidence_level must lie strictly between 0 and 1")
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")
    return (1 - confidence_level) / 2 if alternative == "two-sided" else 1 - confidence_level


def _check_methods(method: str, methods: Sequence[str] | None,
                   allowed: Sequence[str] = METHODS) -> list[str]:
    """Return the list of interval methods to compute, primary first."""
    out = [method] + [m for m in (methods or []) if m != method]
    for m in out:
        if m not in allowed:
            hint = ("; 't' and 'studentized' need the per-example data of a mean: use "
                    "bootstrap_edges" if m in IID_METHODS else "")
            raise ValueError(f"unknown interval method {m!r} here; choose from {tuple(allowed)}"
                             + hint)
    return out


def _intervals_sorted(xs: np.ndarray, theta: np.ndarray, frac_below: np.ndarray | None,
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
        ql, qh = _quantile_sorted(xs, alpha), _quantile_sorted(xs, 1 - alpha)
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
        out["bca"] = (_quantile_sorted(xs, a1), _quantile_sorted(xs, a2))
    if "t" in methods:
        half = stdtrit(df, 1 - alpha) * se
        out["t"] = (theta - half, theta + half)
    if "studentized" in methods or "studentized_symmetric" in methods:
        tl, th = _quantile_sorted(ts, alpha), _quantile_sorted(ts, 1 - alpha)
        out["studentized"] = (theta - th * se, theta - tl * se)
        if "studentized_symmetric" in methods:
            # two-sided: quantile of |t*| at the confidence level (Hall's symmetric bootstrap-t);
            # one-sided bounds are the equal-tailed bootstrap-t's
            if alternative == "two-sided":
                half = _quantile_sorted(abs_ts, 1 - 2 * alpha) * se
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


# --- p-values that invert the intervals ----------------------------------------------------
# q(p) is the type-7 quantile function of a sorted row: continuous and non-decreasing in p. An
# interval bound q(a(alpha)) lies strictly above v exactly when a(alpha) > G(v), and strictly
# below v exactly when a(alpha) < H(v), with G and H below; solving a(alpha) = G or H for alpha
# gives the smallest tail level at which the interval excludes v, i.e. the p-value.
def _level_at_most(xs: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Return G(v) = sup{p : q(p) <= v} per row of sorted xs [c, B] (0 if v < min, 1 if >= max)."""
    c, b = xs.shape
    j = (xs <= v[:, None]).sum(axis=1)
    return _interp_level(xs, v, j, b)


def _level_at_least(xs: np.ndarray, v: np.ndarray) -> np.ndarray:
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


def _pvalues_sorted(method: str, xs: np.ndarray, theta: np.ndarray, null: float,
                    frac_below: np.ndarray | None, accel: np.ndarray | None, alternative: str,
                    *, ts: np.ndarray | None = None, abs_ts: np.ndarray | None = None,
                    se: np.ndarray | None = None, df: float | None = None) -> np.ndarray:
    """Return the p-value inverting `method`'s interval at `null` (see module docstring).

    Two-sided p = 2 * min(lower-side level, upper-side level), capped at 1. Resampling p-values
    are never below 1/(B+1); the caller makes sure 1/(B+1) < 1 - confidence_level.
    """
    v = np.full(theta.shape, float(null))
    if method == "t":
        t0 = _t_statistic(theta, se, null)
        lo_side, hi_side = _t_cdf(df, -t0), _t_cdf(df, t0)
    elif method == "percentile":
        lo_side, hi_side = _level_at_most(xs, v), 1 - _level_at_least(xs, v)
    elif method == "basic":
        w = 2 * theta - null
        lo_side, hi_side = 1 - _level_at_least(xs, w), _level_at_most(xs, w)
    elif method == "studentized_symmetric" and alternative == "two-sided":
        # |T0| > q_c(|t*|) exactly when c < H(|T0|): p = 1 - H(|T0|)
        t0 = np.abs(_t_statistic(theta, se, null))
        p = 1 - _level_at_least(abs_ts, t0)
        b = abs_ts.shape[1]
        return np.where(np.isnan(p), p, np.maximum(p, 1.0 / (b + 1.0)))
    elif method in STUDENTIZED:
        t0 = _t_statistic(theta, se, null)
        lo_side, hi_side = 1 - _level_at_least(ts, t0), _level_at_most(ts, t0)
    elif method == "bca":
        z0 = ndtri(frac_below)
        lo_side = _bca_level(_level_at_most(xs, v), z0, accel, upper=False)
        hi_side = _bca_level(_level_at_least(xs, v), z0, accel, upper=True)
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


def _t_statistic(theta: np.ndarray, se: np.ndarray, null: float) -> np.ndarray:
    """Return (theta - null) / se; where se = 0, +-inf by the sign of theta - null (0 if equal)."""
    diff = theta - null
    with np.errstate(divide="ignore", invalid="ignore"):
        inf = np.sign(diff) * np.where(diff != 0, np.inf, 0.0)
        return np.where(se > 0, diff / np.where(se > 0, se, 1.0), inf)


def _t_cdf(df: float, t: np.ndarray) -> np.ndarray:
    """Return the Student-t cdf P(T_df <= t)."""
    from scipy.special import stdtr

    return stdtr(df, t)


def _frac_below(r: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Return the share of resampled values below theta per row, ties counted one half."""
    t = theta[:, None]
    b = r.shape[1]
    return ((r < t).sum(axis=1) + (r <= t).sum(axis=1)) / (2.0 * b)


def _boot_pvalue(r: np.ndarray, alternative: str, null: float = 0.0) -> np.ndarray:
    """Return the percentile-bootstrap p-value for H0: statistic = null, never below 1/(B+1)."""
    b = r.shape[1]
    le = (r <= null).sum(axis=1)
    ge = (r >= null).sum(axis=1)
    if alternative == "greater":
        return (1.0 + le) / (b + 1.0)
    if alternative == "less":
        return (1.0 + ge) / (b + 1.0)
    return np.minimum(1.0, 2.0 * (1.0 + np.minimum(le, ge)) / (b + 1.0))


# --- result --------------------------------------------------------------------------------
@dataclass(repr=False)
class BootstrapResult(Result):
    """Per-edge interval result: scipy-style attributes plus conf_int(), summary(), to_table().

    `pvalue` inverts the primary interval (`method`): the interval excludes 0 exactly when
    pvalue < 1 - confidence_level; `pvalues` holds the same for every computed method and
    `qvalue` the Benjamini-Hochberg adjustment of `pvalue`. `tail_share` / `reliable` flag
    edges whose mean rests on a few examples (stats.reliability).
    """

    estimate: np.ndarray
    confidence_interval: ConfidenceInterval
    standard_error: np.ndarray
    bias: np.ndarray
    pvalue: np.ndarray
    intervals: dict[str, ConfidenceInterval]
    method: str
    confidence_level: float
    alternative: str
    n_obs: int
    n_resamples: int
    z0: np.ndarray | None = None
    acceleration: np.ndarray | None = None
    bootstrap_distribution: np.ndarray | None = None
    edge_names: Sequence[str] | None = None
    params: dict = field(default_factory=dict)
    pvalues: dict[str, np.ndarray] = field(default_factory=dict)
    qvalue: np.ndarray | None = None
    tail_share: np.ndarray | None = None
    reliable: np.ndarray | None = None
    estimand: str = ESTIMAND

    def conf_int(self, method: str | None = None) -> np.ndarray:
        """Return the intervals as an [E, 2] array (statsmodels style) for `method`."""
        ci = self.intervals[method or self.method]
        return np.stack([ci.low, ci.high], axis=-1)

    @property
    def degenerate(self) -> np.ndarray:
        """Return True where the primary interval could not be computed (NaN bounds)."""
        ci = self.confidence_interval
        return np.isnan(ci.low) | np.isnan(ci.high)

    def _tables(self) -> dict[str, dict[str, Any]]:
        est = np.atleast_1d(self.estimate)
        cols: dict[str, Any] = {"edge": np.arange(est.size, dtype=np.int64)}
        if self.edge_names is not None:
            cols["edge_name"] = np.asarray(self.edge_names, dtype=str)
        cols.update(estimate=est, standard_error=np.atleast_1d(self.standard_error),
                    bias=np.atleast_1d(self.bias),
                    ci_low=np.atleast_1d(self.confidence_interval.low),
                    ci_high=np.atleast_1d(self.confidence_interval.high),
                    pvalue=np.atleast_1d(self.pvalue))
        if self.qvalue is not None:
            cols["qvalue"] = np.atleast_1d(self.qvalue)
        if self.reliable is not None:
            cols["tail_share"] = np.atleast_1d(self.tail_share)
            cols["interval_reliable"] = np.atleast_1d(self.reliable)
        for m, ci in self.intervals.items():
            if m != self.method:
                cols[f"ci_low_{m}"] = np.atleast_1d(ci.low)
                cols[f"ci_high_{m}"] = np.atleast_1d(ci.high)
                if m in self.pvalues:
                    cols[f"pvalue_{m}"] = np.atleast_1d(self.pvalues[m])
        if self.z0 is not None:
            cols["bca_z0"] = np.atleast_1d(self.z0)
            cols["bca_acceleration"] = np.atleast_1d(self.acceleration)
        cols["degenerate"] = np.atleast_1d(self.degenerate)
        return {"main": cols}

    def _summary_items(self) -> list[tuple[str, Any]]:
        lo = np.atleast_1d(self.confidence_interval.low)
        hi = np.atleast_1d(self.confidence_interval.high)
        excl = int(np.sum((lo > 0) | (hi < 0)))
        items = [("estimand", self.estimand), ("edges", np.atleast_1d(self.estimate).size),
                 ("examples (N)", self.n_obs), ("resamples (B)", self.n_resamples),
                 ("plan", self.params.get("plan", {}).get("kind")), ("method", self.method),
                 ("confidence level", self.confidence_level), ("alternative", self.alternative),
                 ("CIs excluding 0", excl),
                 ("degenerate intervals", int(np.sum(self.degenerate))),
                 ("median standard error", float(np.nanmedian(self.standard_error)))]
        if self.reliable is not None:
            items.append(("intervals flagged unreliable", int(np.sum(~np.asarray(self.reliable)))))
        items += [("measured coverage", COVERAGE_NOTE), ("note", RELIABILITY_NOTE)]
        return items


#: what the coverage simulation measured (README table; tests/stats/test_edge_coverage.py)
COVERAGE_NOTE = ("95% coverage at N=64 on zoo scores: studentized_symmetric 0.947, t 0.931, "
                 "percentile 0.904, bca 0.880")
RELIABILITY_NOTE = ("interval_reliable=False: a few prompts carry the mean; spikes absent from "
                    "the sample are not detectable")


# --- estimators ----------------------------------------------------------------------------
def _plan_for(n_obs: int, plan: ResamplingPlan | None, n_resamples: int,
              seed: Any) -> ResamplingPlan:
    """Return `plan`, or a fresh bootstrap plan; refuse subsample plans for intervals."""
    if plan is None:
        return ResamplingPlan.bootstrap(n_obs, n_resamples, seed)
    if seed is not None:
        raise ValueError("pass either a plan or a seed, not both: the plan already fixes the draw")
    if plan.is_half_subsample:
        raise ValueError(
            f"confidence intervals need size-N bootstrap resamples, but this plan is "
            f"{plan.kind!r} (half-size subsamples overstate the spread by about sqrt(2)); use "
            "ResamplingPlan.bootstrap, .cluster or .poisson; keep subsamples for stability selection"
        )
    return plan


def _check_plan_for_methods(plan: ResamplingPlan, todo: Sequence[str],
                            confidence_level: float) -> None:
    """Raise InputError when the plan cannot support a requested method."""
    from circuits.errors import InputError

    bad = [m for m in todo if m in IID_METHODS]
    if plan.kind == "cluster" and bad:
        raise InputError(f"interval method(s) {bad} use the independent-example standard error, "
                         "which is wrong under the cluster bootstrap; use method 'percentile', "
                         "'basic' or 'bca' with a cluster plan")
    if any(m in RESAMPLING_METHODS for m in todo):
        # the smallest p-value, 1/(B+1), must lie below 1 - level (a margin absorbs the
        # rounding of 1 - 0.95), else an interval could exclude 0 while p >= 1 - level
        tail = (1.0 - confidence_level) * (1 - 1e-9)
        b_min = max(1, int(np.floor(1.0 / tail)) - 1)
        while 1.0 / (b_min + 1.0) >= tail:
            b_min += 1
        if plan.n_resamples < b_min:
            raise InputError(f"{plan.n_resamples} resamples are too few for a "
                             f"{confidence_level:.3g} interval and its p-value; use at least "
                             f"n_resamples = {b_min} (1000 or more for stable bounds)")


def bootstrap_edges(S: np.ndarray, plan: ResamplingPlan | None = None, *,
                    n_resamples: int = 2000, seed: Any = None, method: str | None = None,
                    methods: Sequence[str] | None = None, confidence_level: float = 0.95,
                    alternative: str = "two-sided", keep_distribution: bool = False,
                    chunk_size: int | None = None, n_jobs: int = 1,
                    max_bytes: int = DEFAULT_MAX_BYTES,
                    edge_names: Sequence[str] | None = None,
                    reliable_max_tail_share: float = RELIABLE_MAX_TAIL_SHARE) -> BootstrapResult:
    """Return per-edge CIs, SEs and interval-inverting p-values of the mean of S [N, E].

    Estimand: the mean effect over the task's prompt distribution. `method` gives
    `confidence_interval` and `pvalue` (default None: the symmetric studentized bootstrap,
    chosen by simulated coverage; BCa for cluster plans, where the i.i.d. standard error that
    studentizes does not hold); `methods` adds more interval types. The estimate is the plain
    mean for every plan; for cluster/Poisson plans the resampled mean is the weighted mean
    sum(w s) / sum(w).
    The interval is computed in edge chunks (one or, for the studentized bootstrap, three
    matrix products per chunk).
    """
    from .testing import bh_adjust

    S = check_score_matrix(S)
    n_obs, n_edges = S.shape
    plan = _plan_for(n_obs, plan, n_resamples, seed)
    if plan.n_obs != n_obs:
        check_score_matrix(S, plan)  # raises with the fix named
    if n_obs < 2:
        raise ValueError("the bootstrap needs at least 2 examples (N >= 2)")
    if method is None:
        method = "bca" if plan.kind == "cluster" else DEFAULT_METHOD
    if not 0.0 <= reliable_max_tail_share <= 1.0:
        raise ValueError(f"reliable_max_tail_share is a share of the total deviation and must "
                         f"lie in [0, 1], got {reliable_max_tail_share}")
    todo = _check_methods(method, methods)
    alpha = _tail_levels(confidence_level, alternative)
    _check_plan_for_methods(plan, todo, confidence_level)
    b = plan.n_resamples
    if keep_distribution and 8 * n_edges * b > max(max_bytes, 4 * 2**30):
        raise MemoryError(
            f"keeping the [E={n_edges}, B={b}] bootstrap distribution needs "
            f"{8 * n_edges * b / 2**30:.2f} GiB; pass fewer edges (S[:, subset]) or raise max_bytes"
        )
    cluster_info = None
    if "bca" in todo and plan.kind == "cluster":
        order = np.argsort(plan.groups, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(plan.groups[order]) != 0])
        sizes = np.diff(np.r_[starts, n_obs]).astype(np.float64)
        cluster_info = (order, starts, sizes)
    weights = None
    if set(todo) & set(STUDENTIZED):
        weights = plan_weights(plan)
        if chunk_size is None:
            # t*, |t*| and the centred and squared resampled sums: about three times the
            # per-edge workspace default_chunk_size budgets for
            chunk_size = default_chunk_size(n_obs, b, _resolve_jobs(n_jobs), max_bytes // 3)
    df = float(n_obs - 1)

    def reduce(r: np.ndarray, sc: np.ndarray, sl: slice) -> dict[str, Any]:
        theta = sc.mean(axis=1)  # sc is [c, N]
        out: dict[str, Any] = {"theta": theta, "se": r.std(axis=1, ddof=1),
                               "boot_mean": r.mean(axis=1), "tail": tail_share(sc, axis=1)}
        if keep_distribution:
            out["dist"] = r.copy()
        se = sc.std(axis=1, ddof=1) / np.sqrt(n_obs) if set(todo) & set(IID_METHODS) else None
        ts = abs_ts = None
        if set(todo) & set(STUDENTIZED):
            ts = studentized_resamples(sc, theta, weights, plan.totals)
            if "studentized_symmetric" in todo:
                abs_ts = np.sort(np.abs(ts), axis=1)
            ts.sort(axis=1)
        accel = None
        if "bca" in todo:
            out["frac"] = _frac_below(r, theta)
            if cluster_info is None:
                accel = mean_acceleration(sc, axis=1)
            else:
                # leave-one-cluster-out means: templates are the independent units
                order, starts, sizes = cluster_info
                gsum = np.add.reduceat(sc[:, order], starts, axis=1)  # [c, G]
                jack = (sc.sum(axis=1)[:, None] - gsum) / (n_obs - sizes)[None, :]
                accel = acceleration_from_jackknife(jack)
            out["accel"] = accel
        r.sort(axis=1)
        out["ci"] = _intervals_sorted(r, theta, out.get("frac"), accel, todo, alpha, alternative,
                                      ts=ts, abs_ts=abs_ts, se=se, df=df)
        out["p"] = {m: _pvalues_sorted(m, r, theta, 0.0, out.get("frac"), accel, alternative,
                                       ts=ts, abs_ts=abs_ts, se=se, df=df) for m in todo}
        return out

    parts = list(map_edge_chunks(S, plan, reduce, chunk_size=chunk_size, n_jobs=n_jobs,
                                 max_bytes=max_bytes, check=False))

    def cat(key: str) -> np.ndarray:
        return np.concatenate([p[key] for p in parts])

    theta = cat("theta")
    intervals = {m: ConfidenceInterval(np.concatenate([p["ci"][m][0] for p in parts]),
                                       np.concatenate([p["ci"][m][1] for p in parts]))
                 for m in todo}
    pvalues = {m: np.concatenate([p["p"][m] for p in parts]) for m in todo}
    tail = cat("tail")
    params = {"estimator": "bootstrap_edges", "statistic": "mean", "estimand": ESTIMAND,
              "plan": plan.describe(), "method": method, "methods": todo,
              "confidence_level": confidence_level, "alternative": alternative,
              "n_obs": n_obs, "n_edges": n_edges,
              "pvalue": f"inverts the {method} interval; qvalue = Benjamini-Hochberg",
              "reliable_max_tail_share": reliable_max_tail_share}
    return BootstrapResult(
        estimate=theta, confidence_interval=intervals[method], standard_error=cat("se"),
        bias=cat("boot_mean") - theta, pvalue=pvalues[method], intervals=intervals,
        method=method, confidence_level=confidence_level, alternative=alternative,
        n_obs=n_obs, n_resamples=b,
        z0=ndtri(cat("frac")) if "bca" in todo else None,
        acceleration=cat("accel") if "bca" in todo else None,
        bootstrap_distribution=cat("dist") if keep_distribution else None,
        edge_names=edge_names, params=params, pvalues=pvalues, qvalue=bh_adjust(pvalues[method]),
        tail_share=tail, reliable=tail <= reliable_max_tail_share)


def intervals_from_distribution(theta_b: np.ndarray, theta_hat: np.ndarray, *,
                                method: str = "percentile", methods: Sequence[str] | None = None,
                                confidence_level: float = 0.95, alternative: str = "two-sided",
                                acceleration: np.ndarray | None = None
                                ) -> dict[str, ConfidenceInterval]:
    """Return {method: ConfidenceInterval} from a bootstrap distribution (resamples last)."""
    todo = _check_methods(method, methods, RESAMPLING_ONLY)
    alpha = _tail_levels(confidence_level, alternative)
    theta_b = np.asarray(theta_b, dtype=np.float64)
    shape = theta_b.shape[:-1]
    r = theta_b.reshape(-1, theta_b.shape[-1])
    th = np.broadcast_to(np.asarray(theta_hat, dtype=np.float64), shape).reshape(-1)
    frac = accel = None
    if "bca" in todo:
        if acceleration is None:
            raise ValueError("BCa needs the acceleration (jackknife); pass acceleration=")
        frac = _frac_below(r, th)
        accel = np.broadcast_to(np.asarray(acceleration, dtype=np.float64), shape).reshape(-1)
    xs = np.sort(r, axis=1)
    out = _intervals_sorted(xs, th, frac, accel, todo, alpha, alternative)
    return {m: ConfidenceInterval(lo.reshape(shape)[()], hi.reshape(shape)[()])
            for m, (lo, hi) in out.items()}


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


def bootstrap_statistic(data: np.ndarray, statistic: Callable[..., Any],
                        plan: ResamplingPlan | None = None, *, n_resamples: int = 2000,
                        seed: Any = None, method: str = "bca",
                        methods: Sequence[str] | None = None, confidence_level: float = 0.95,
                        alternative: str = "two-sided", axis: int = 0,
                        vectorized: bool | None = None, batch: int | None = None,
                        n_jobs: int = 1, keep_distribution: bool = True) -> BootstrapResult:
    """Return bootstrap CIs for any symmetric statistic (median, trimmed mean, ...) of data."""
    data = np.asarray(data)
    n_obs = data.shape[axis]
    plan = _plan_for(n_obs, plan, n_resamples, seed)
    todo = _check_methods(method, methods, RESAMPLING_ONLY)
    vec = _is_vectorized(statistic, vectorized)
    theta_hat = np.asarray(statistic(data, axis=axis) if vec else statistic(data), dtype=np.float64)
    theta_b = resample_statistic(data, statistic, plan, axis=axis, vectorized=vec, batch=batch,
                                 n_jobs=n_jobs).astype(np.float64)
    accel = None
    if "bca" in todo:
        if plan.kind == "cluster":
            # The jackknife acceleration would have to leave out whole clusters of a general
            # statistic; only the mean has that (bootstrap_edges). Refuse rather than mis-state.
            raise ValueError("BCa for a general statistic under the cluster bootstrap is not available "
                             "(its acceleration needs a leave-one-cluster-out jackknife); use "
                             "method='percentile' or 'basic', or bootstrap_edges for the mean")
        accel = acceleration_from_jackknife(
            jackknife_statistic(data, statistic, axis=axis, vectorized=vec, batch=batch))
    ivs = intervals_from_distribution(theta_b, theta_hat, method=method, methods=todo,
                                      confidence_level=confidence_level, alternative=alternative,
                                      acceleration=accel)
    r = theta_b.reshape(-1, theta_b.shape[-1])
    th = np.broadcast_to(theta_hat, theta_b.shape[:-1]).reshape(-1)
    shape = theta_b.shape[:-1]
    z0 = ndtri(_frac_below(r, th)).reshape(shape)[()] if "bca" in todo else None
    params = {"estimator": "bootstrap_statistic", "statistic": getattr(statistic, "__name__",
              repr(statistic)), "plan": plan.describe(), "method": method, "methods": todo,
              "confidence_level": confidence_level, "alternative": alternative, "n_obs": n_obs}
    return BootstrapResult(
        estimate=theta_hat[()], confidence_interval=ivs[method],
        standard_error=np.std(theta_b, axis=-1, ddof=1)[()],
        bias=(theta_b.mean(axis=-1) - theta_hat)[()],
        pvalue=_boot_pvalue(r, alternative).reshape(shape)[()], intervals=ivs, method=method,
        confidence_level=confidence_level, alternative=alternative, n_obs=n_obs,
        n_resamples=plan.n_resamples, z0=z0, acceleration=accel,
        bootstrap_distribution=theta_b if keep_distribution else None, params=params)
