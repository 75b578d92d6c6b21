"""Refit-level uncertainty (every refit an anchor): ordered-pair means, the leave-one-refit-out jackknife
with its t interval on K − 1 df, per-head t intervals over comparison refits, and the layer-level summaries."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from .layers import layer_statistics
from .quiet import quiet_nanmean


#: the jackknife over refits leaves one out and still needs a pair of refits
MIN_REFITS_FOR_INTERVAL = 3


def seeds_interval_text(value: float, low: float, high: float, n_seeds: int, digits: int = 3) -> str:
    """Return "value [low, high]" of an across-seed interval, or the value and "needs >= 3 seeds, have K"."""
    from ..intervals import interval_text, needs_more

    few = needs_more("seeds", MIN_REFITS_FOR_INTERVAL, int(n_seeds)) if n_seeds < MIN_REFITS_FOR_INTERVAL else None
    return interval_text(value, low, high, digits=digits, missing=few)


def _off_diagonal(n_refits: int) -> np.ndarray:
    return ~np.eye(n_refits, dtype=bool)


def ordered_pair_mean(pair_values: np.ndarray) -> np.ndarray:
    """Return the mean over ordered pairs a != b of ``pair_values [K, K, ...]`` (the diagonal is ignored)."""
    pair_values = np.asarray(pair_values, dtype=np.float64)
    return quiet_nanmean(pair_values[_off_diagonal(pair_values.shape[0])], axis=0)


def leave_one_refit_out(pair_values: np.ndarray) -> np.ndarray:
    """Return ``[K, ...]``: the ordered-pair mean over the refits other than refit i, for each i."""
    pair_values = np.asarray(pair_values, dtype=np.float64)
    n_refits = pair_values.shape[0]
    out = []
    for left_out in range(n_refits):
        kept = np.delete(np.arange(n_refits), left_out)
        out.append(ordered_pair_mean(pair_values[np.ix_(kept, kept)]))
    return np.stack(out)


def refit_jackknife(estimate: np.ndarray, leave_one_out: np.ndarray, confidence_level: float
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (low, high, standard error) of a jackknife-over-refits t interval.

    ``leave_one_out [K, ...]`` holds the statistic recomputed without each refit (any function
    of ordered-pair means, e.g. a layer's stability, the gap, an excess over the null). The
    jackknife variance (K − 1)/K Σ (θ₍₋ᵢ₎ − θ̄)² is that of a U-statistic in the refits; the
    quantile is t with K − 1 degrees of freedom. Fewer than 3 refits: NaN (no interval).
    """
    estimate = np.asarray(estimate, dtype=np.float64)
    leave_one_out = np.asarray(leave_one_out, dtype=np.float64)
    n_refits = leave_one_out.shape[0]
    if n_refits < MIN_REFITS_FOR_INTERVAL:
        nan = np.full(estimate.shape, np.nan)
        return nan, nan, nan
    centred = leave_one_out - leave_one_out.mean(axis=0)
    standard_error = np.sqrt((n_refits - 1) / n_refits * (centred ** 2).sum(axis=0))
    half_width = sps.t.ppf(0.5 + confidence_level / 2, n_refits - 1) * standard_error
    return estimate - half_width, estimate + half_width, standard_error


def comparison_t_interval(comparisons: np.ndarray, confidence_level: float
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (mean, low, high) over the anchor's comparison refits (first axis), t on n − 1 df.

    The estimand is conditional on the anchor: a head of the anchor refit against a new
    training seed. Needs at least 2 comparisons (3 refits); otherwise the interval is NaN.
    """
    comparisons = np.asarray(comparisons, dtype=np.float64)
    n_comparisons = comparisons.shape[0]
    mean = comparisons.mean(axis=0)
    if n_comparisons < MIN_REFITS_FOR_INTERVAL - 1:
        nan = np.full(mean.shape, np.nan)
        return mean, nan, nan
    standard_error = comparisons.std(axis=0, ddof=1) / math.sqrt(n_comparisons)
    half_width = sps.t.ppf(0.5 + confidence_level / 2, n_comparisons - 1) * standard_error
    return mean, mean - half_width, mean + half_width


@dataclass
class RefitLevel:
    """Refit-level estimates, leave-one-refit-out values and t intervals of the layer-level numbers."""

    n_refits: int
    estimates: dict[str, np.ndarray]  # name -> estimate ([L] for layers, scalar for summaries)
    leave_one_out: dict[str, np.ndarray]  # name -> [K, ...]
    intervals: dict[str, tuple[np.ndarray, np.ndarray]]


def refit_level_summaries(matched_pairs: np.ndarray, excess_pairs: np.ndarray | None, confidence_level: float) -> RefitLevel:
    """Return the all-anchors layer stability, excess and their summaries with jackknife-over-refits intervals.

    Keys of ``estimates`` / ``leave_one_out`` / ``intervals``: ``layer`` and ``excess`` ([L]),
    the :func:`layer_statistics` of the layer stabilities, and ``excess_mean``.

    ``matched_pairs`` and ``excess_pairs`` are ``[K, K, L, H]`` (NaN diagonal).
    """
    n_refits = matched_pairs.shape[0]
    sources = {"layer": quiet_nanmean(matched_pairs, axis=-1)}
    if excess_pairs is not None:
        sources["excess"] = quiet_nanmean(excess_pairs, axis=-1)
    estimates, leave_one_out = {}, {}
    for name, pair_values in sources.items():
        estimates[name] = ordered_pair_mean(pair_values)
        leave_one_out[name] = leave_one_refit_out(pair_values)
    for key, value in layer_statistics(estimates["layer"]).items():
        estimates[key] = value
        leave_one_out[key] = layer_statistics(leave_one_out["layer"])[key]
    if excess_pairs is not None:
        estimates["excess_mean"] = quiet_nanmean(estimates["excess"])
        leave_one_out["excess_mean"] = quiet_nanmean(leave_one_out["excess"], axis=-1)
    intervals = {}
    for name in estimates:
        low, high, _ = refit_jackknife(estimates[name], leave_one_out[name], confidence_level)
        intervals[name] = (low, high)
    return RefitLevel(n_refits, estimates, leave_one_out, intervals)


def jackknife_summary(estimate: float, leave_one_out: np.ndarray, confidence_level: float = 0.95
                      ) -> tuple[float, float, float]:
    """Return (low, high, standard error) of the jackknife-over-refits t interval of a scalar statistic."""
    low, high, standard_error = refit_jackknife(np.asarray(estimate, dtype=np.float64),
                                                np.asarray(leave_one_out, dtype=np.float64), confidence_level)
    return float(low), float(high), float(standard_error)
