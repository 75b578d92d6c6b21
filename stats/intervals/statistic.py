"""Bootstrap intervals of any statistic, and intervals from a given bootstrap distribution."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from scipy.special import ndtri

from circuitstat.core.results import ConfidenceInterval

from ..resampling import ResamplingPlan, is_vectorized, resample_statistic
from .bounds import frac_below, intervals_sorted
from .jackknife import acceleration_from_jackknife, jackknife_statistic
from .methods import RESAMPLING_ONLY, check_methods, plan_for, tail_levels
from .pvalues import boot_pvalue
from .result import BootstrapResult


def intervals_from_distribution(theta_b: np.ndarray, theta_hat: np.ndarray, *,
                                method: str = "percentile", methods: Sequence[str] | None = None,
                                confidence_level: float = 0.95, alternative: str = "two-sided",
                                acceleration: np.ndarray | None = None
                                ) -> dict[str, ConfidenceInterval]:
    """Return {method: ConfidenceInterval} from a bootstrap distribution (resamples last)."""
    todo = check_methods(method, methods, RESAMPLING_ONLY)
    alpha = tail_levels(confidence_level, alternative)
    theta_b = np.asarray(theta_b, dtype=np.float64)
    shape = theta_b.shape[:-1]
    r = theta_b.reshape(-1, theta_b.shape[-1])
    th = np.broadcast_to(np.asarray(theta_hat, dtype=np.float64), shape).reshape(-1)
    frac = accel = None
    if "bca" in todo:
        if acceleration is None:
            raise ValueError("BCa needs the acceleration (jackknife); pass acceleration=")
        frac = frac_below(r, th)
        accel = np.broadcast_to(np.asarray(acceleration, dtype=np.float64), shape).reshape(-1)
    xs = np.sort(r, axis=1)
    out = intervals_sorted(xs, th, frac, accel, todo, alpha, alternative)
    return {m: ConfidenceInterval(lo.reshape(shape)[()], hi.reshape(shape)[()])
            for m, (lo, hi) in out.items()}


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
    plan = plan_for(n_obs, plan, n_resamples, seed)
    todo = check_methods(method, methods, RESAMPLING_ONLY)
    vec = is_vectorized(statistic, vectorized)
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
    z0 = ndtri(frac_below(r, th)).reshape(shape)[()] if "bca" in todo else None
    params = {"estimator": "bootstrap_statistic", "statistic": getattr(statistic, "__name__",
              repr(statistic)), "plan": plan.describe(), "method": method, "methods": todo,
              "confidence_level": confidence_level, "alternative": alternative, "n_obs": n_obs}
    return BootstrapResult(
        estimate=theta_hat[()], confidence_interval=ivs[method],
        standard_error=np.std(theta_b, axis=-1, ddof=1)[()],
        bias=(theta_b.mean(axis=-1) - theta_hat)[()],
        pvalue=boot_pvalue(r, alternative).reshape(shape)[()], intervals=ivs, method=method,
        confidence_level=confidence_level, alternative=alternative, n_obs=n_obs,
        n_resamples=plan.n_resamples, z0=z0, acceleration=accel,
        bootstrap_distribution=theta_b if keep_distribution else None, params=params)
