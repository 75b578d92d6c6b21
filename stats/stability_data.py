"""Data-level circuit stability: intervals for the estimands a reader has in mind.

The mean pairwise Jaccard over bootstrap resamples (Méloux et al.) is the bootstrap plug-in
estimate of J_N = E[Jaccard(top-k of D1, top-k of D2)] for two independent datasets D1, D2 of N
prompts from the task's prompt distribution; the mean Jaccard of each resample's circuit to the
full data's is the plug-in estimate of E[Jaccard(top-k of a size-N sample, top-k of the
population)]; Nogueira's Phi over resamples is the plug-in estimate of the same Phi for size-N
datasets (for equal set sizes, the expected Kuncheva index of two independent datasets). The
spread of those statistics over resamples of one dataset is Monte Carlo error: it says nothing
about how the statistic varies from dataset to dataset, so its "CI" covered J_N in 19-26% of
datasets (issue 13).

Here the sampling distribution of each plug-in statistic comes from a double bootstrap: outer
resamples D*_o of the data, and for each, inner resamples of D*_o (stats.resampling.
nested_bootstrap; one chunked pass of the engine over all rows). For each outer o the same
statistic T*_o is computed from its inner resamples. Then

* se   = sqrt(var_o(T*_o) - mean_o(mc_o^2) + mc^2), where mc_o is the jackknife Monte Carlo
  error of T*_o over its n_inner resamples and mc that of the estimate itself (the raw
  variance is kept when the Monte Carlo share would remove more than half of it);
* bias = mean_o(T*_o) - T, the double-bootstrap estimate of the plug-in's bias;
* interval (method "bias_bounded", the default) = [min(T, T - bias) - z se,
  max(T, T - bias) + z se]: the plug-in and the bias-corrected value, each with its normal
  interval, joined. Top-k is not a smooth functional (edges nearly tied at the cut-off), so the
  bootstrap estimates the plug-in's bias with an error of its own order: on heavy-tailed
  populations the plug-in interval undercovers where the bias is large and the bias-corrected
  one where the correction overshoots; their union covered in every setting measured
  (see tests/stats/test_stability_coverage.py and the coverage table in the commit log).

Methods "plugin" (T +- z se) and "bias_corrected" (T - bias +- z se) are kept for comparison.
Jaccard bounds are clipped to [0, 1], Phi bounds to [-1, 1] (the ranges of the statistics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy.special import ndtri

from circuits.errors import InputError

from .resampling import (DEFAULT_MAX_BYTES, ResamplingPlan, as_seed_sequence, nested_bootstrap,
                         spawn_seeds)
from .topk import row_seeds, streaming_topk

__all__ = ["MIN_OBS", "MIN_OUTER", "MIN_INNER", "METHODS", "ESTIMANDS", "DataLevelEstimates",
           "check_data_level", "data_level_stability"]

#: fewest examples for a data-level interval (coverage was measured from N = 32 up)
MIN_OBS = 20
#: fewest outer resamples: the standard error and bias come from their spread and mean
MIN_OUTER = 50
#: fewest inner resamples per outer: pairwise Jaccard needs pairs, the jackknife needs >= 3
MIN_INNER = 10
METHODS = ("bias_bounded", "plugin", "bias_corrected")

#: what each interval column covers, written into the table metadata of StabilityResult
ESTIMANDS = {
    "jaccard_ci": "Monte Carlo error of jaccard_mean over these resamples of one dataset "
                  "(jackknife over resamples); NOT an interval for a data-level quantity",
    "jaccard_data_ci": "E[Jaccard(top-k of D1, top-k of D2)] for two independent datasets of "
                       "N prompts from the prompt distribution (double bootstrap)",
    "jaccard_pop_ci": "E[Jaccard(top-k of a dataset of N prompts, top-k of the population "
                      "mean scores)] (double bootstrap)",
    "phi_ci": "Monte Carlo error of Phi over these resamples (Nogueira et al. 2018 asymptotic "
              "variance); NOT an interval for a data-level quantity",
    "phi_data_ci": "Phi (Nogueira) of the top-k circuits of independent datasets of N prompts, "
                   "i.e. their expected Kuncheva index (double bootstrap)",
}


@dataclass
class DataLevelEstimates:
    """Plug-in statistics per k from the main resamples, with their Monte Carlo errors."""

    jaccard: np.ndarray
    jaccard_mc: np.ndarray
    jaccard_pop: np.ndarray
    jaccard_pop_mc: np.ndarray
    phi: np.ndarray
    phi_mc: np.ndarray


def check_data_level(n_obs: int, plan_kind: str, n_outer: int, n_inner: int) -> str | None:
    """Return why a data-level interval cannot be computed here (None when it can)."""
    if plan_kind != "bootstrap":
        return (f"data-level intervals need an ordinary bootstrap plan (the plug-in estimate of "
                f"J_N is over size-N bootstrap resamples), got {plan_kind!r}")
    if n_obs < MIN_OBS:
        return (f"data-level intervals need at least {MIN_OBS} examples, got N = {n_obs}; "
                "attribute more prompts")
    return None


def _check_counts(n_outer: int, n_inner: int, confidence_level: float, method: str) -> None:
    """Raise InputError for resample counts or options the method cannot work with."""
    if int(n_outer) < MIN_OUTER:
        raise InputError(f"n_outer = {n_outer} is too few for a data-level interval; use at "
                         f"least {MIN_OUTER} outer resamples")
    if int(n_inner) < MIN_INNER:
        raise InputError(f"n_inner = {n_inner} is too few for a data-level interval; use at "
                         f"least {MIN_INNER} inner resamples per outer resample")
    if not 0 < confidence_level < 1:
        raise InputError(f"confidence_level must lie in (0, 1), got {confidence_level}")
    if method not in METHODS:
        raise InputError(f"unknown data-level method {method!r}; use one of {METHODS}")


def _intersections(tops: np.ndarray) -> np.ndarray:
    """Return the [m, m] intersection sizes of equal-size edge sets tops [m, k]."""
    m, k = tops.shape
    union, inv = np.unique(tops, return_inverse=True)
    Z = np.zeros((m, union.size))
    Z[np.repeat(np.arange(m), k), inv.ravel()] = 1.0
    return Z @ Z.T


def _u_mean_and_mc(pair: np.ndarray) -> tuple[float, float]:
    """Return the mean of a symmetric pair statistic over i != j and its jackknife error."""
    m = pair.shape[0]
    off = pair - np.diag(np.diag(pair))
    row = off.sum(axis=1)
    total = row.sum() / 2
    n_pairs = m * (m - 1) / 2
    loo = (total - row) / ((m - 1) * (m - 2) / 2)  # leave one resample out, closed form
    return total / n_pairs, float(np.sqrt((m - 1) / m * np.sum((loo - loo.mean()) ** 2)))


def _outer_statistics(idx: np.ndarray, n_outer: int, n_inner: int, k: int,
                      n_edges: int) -> np.ndarray:
    """Return [n_outer, 6]: (J*, mc, Jpop*, mc, Phi*, mc) of each outer's inner resamples."""
    out = np.empty((n_outer, 6))
    denom_phi = k * (n_edges - k)
    for o in range(n_outer):
        inner = idx[n_outer + o * n_inner:n_outer + (o + 1) * n_inner, :k]
        rows = np.vstack([inner, idx[o:o + 1, :k]])  # the outer's own circuit last
        inter = _intersections(rows)
        ii = inter[:n_inner, :n_inner]
        out[o, 0:2] = _u_mean_and_mc(ii / (2 * k - ii))
        out[o, 4:6] = _u_mean_and_mc((ii * n_edges - k * k) / denom_phi)  # Kuncheva = Phi
        to_outer = inter[:n_inner, n_inner]
        jp = to_outer / (2 * k - to_outer)
        out[o, 2] = jp.mean()
        out[o, 3] = jp.std(ddof=1) / np.sqrt(n_inner)
    return out


def _interval(est: np.ndarray, mc: np.ndarray, star: np.ndarray, star_mc: np.ndarray,
              z: float, method: str, lo_bound: float) -> dict[str, np.ndarray]:
    """Return se, bias, low, high per k from outer statistics star [len(ks), n_outer]."""
    raw = star.var(axis=1, ddof=1)
    # the outer spread includes each T*_o's own Monte Carlo error; remove it, but never more
    # than half the raw variance (a noisy Monte Carlo estimate must not make the interval 0)
    var = np.maximum(raw - np.mean(star_mc**2, axis=1), raw / 2)
    se = np.sqrt(var + mc**2)
    bias = star.mean(axis=1) - est
    corrected = est - bias
    if method == "plugin":
        lo, hi = est, est
    elif method == "bias_corrected":
        lo, hi = corrected, corrected
    else:
        lo, hi = np.minimum(est, corrected), np.maximum(est, corrected)
    return {"se": se, "bias": bias, "ci_low": np.clip(lo - z * se, lo_bound, 1.0),
            "ci_high": np.clip(hi + z * se, lo_bound, 1.0)}


def data_level_stability(S: np.ndarray, ks: Sequence[int], estimates: DataLevelEstimates, *,
                         ranking: str, seed: Any, n_outer: int = 100, n_inner: int = 20,
                         confidence_level: float = 0.95, method: str = "bias_bounded",
                         chunk_size: int | None = None, n_jobs: int = 1,
                         max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, np.ndarray]:
    """Return per-k data-level estimates and intervals (jaccard_data*, jaccard_pop*, phi_data*).

    S [N, E] is the score matrix, `estimates` the plug-in statistics of circuit_stability's
    resamples for the same ks; seed (SeedSequence/int) fixes the nested resamples and ties.
    """
    _check_counts(n_outer, n_inner, confidence_level, method)
    n_obs, n_edges = S.shape
    why = check_data_level(n_obs, "bootstrap", n_outer, n_inner)
    if why:
        raise InputError(why)
    ks_arr = np.asarray(ks, dtype=np.int64)
    outer, inner = nested_bootstrap(n_obs, n_outer, n_inner, seed)
    plan = ResamplingPlan.from_counts(np.vstack([outer.counts, inner.counts]))
    seeds = row_seeds(_tie_rng(seed), plan.n_resamples)
    state, _ = streaming_topk(S, plan, int(ks_arr.max()), ranking, seeds, chunk_size=chunk_size,
                              n_jobs=n_jobs, max_bytes=max_bytes)
    star = np.stack([_outer_statistics(state.idx, n_outer, n_inner, int(k), n_edges)
                     for k in ks_arr])  # [len(ks), n_outer, 6]
    z = float(ndtri(0.5 + confidence_level / 2))
    cols: dict[str, np.ndarray] = {}
    for name, est, mc, j, lo_bound in (
            ("jaccard_data", estimates.jaccard, estimates.jaccard_mc, 0, 0.0),
            ("jaccard_pop", estimates.jaccard_pop, estimates.jaccard_pop_mc, 2, 0.0),
            ("phi_data", estimates.phi, estimates.phi_mc, 4, -1.0)):
        iv = _interval(np.asarray(est, dtype=np.float64), np.asarray(mc, dtype=np.float64),
                       star[:, :, j], star[:, :, j + 1], z, method, lo_bound)
        cols[name] = np.asarray(est, dtype=np.float64)
        for part, v in iv.items():
            cols[f"{name}_{part}"] = v
    return cols


def _tie_rng(seed: Any) -> np.random.Generator:
    """Return the Generator for the nested resamples' tie-breaking (child 2 of seed)."""
    return np.random.default_rng(spawn_seeds(as_seed_sequence(seed), 3)[2])
