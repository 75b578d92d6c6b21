"""The paper's bootstrap over refits (the anchor fixed) and prompts: pair layouts, refit counts and pair
weights, the weighted means they give, and the percentile summary of bootstrap replicates."""

from __future__ import annotations

import math

import numpy as np

from ..intervals import percentile_interval
from .quiet import quiet_nanmean


def pair_matrix(values: np.ndarray, pairs: list[tuple[int, int]], n_refits: int) -> np.ndarray:
    """Return ``[K, K, ...]`` from per-ordered-pair values ``[n_pairs, ...]`` (NaN on the diagonal)."""
    out = np.full((n_refits, n_refits) + values.shape[1:], np.nan)
    for i, (a, b) in enumerate(pairs):
        out[a, b] = values[i]
    return out


def refit_bootstrap_counts(rng: np.random.Generator, n_refits: int, anchor: int, n_resamples: int, resample: bool
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Return bootstrap counts of the anchor's comparison refits and of all refits, ``[R, K]`` each."""
    targets = np.array([b for b in range(n_refits) if b != anchor])
    if resample:
        draw_targets = rng.choice(targets, size=(n_resamples, targets.size), replace=True)
        draw_all = rng.integers(0, n_refits, size=(n_resamples, n_refits))
    else:
        draw_targets = np.tile(targets, (n_resamples, 1))
        draw_all = np.tile(np.arange(n_refits), (n_resamples, 1))
    target_counts = np.stack([np.bincount(d, minlength=n_refits) for d in draw_targets]).astype(np.float64)
    refit_counts = np.stack([np.bincount(d, minlength=n_refits) for d in draw_all]).astype(np.float64)
    return target_counts, refit_counts


def anchor_head_stability(matched: np.ndarray, target_counts: np.ndarray, anchor_rows: np.ndarray,
                           targets: list[int]) -> np.ndarray:
    """Return the anchor's head stability ``[..., L, H]``: comparison-refit weighted mean of matched scores."""
    weights = target_counts[..., targets]
    total = np.einsum("...t,...tlh->...lh", weights, matched[..., anchor_rows, :, :])
    return total / weights.sum(-1)[..., None, None]


def all_pairs_layer_stability(matched: np.ndarray, refit_counts: np.ndarray, pairs: list[tuple[int, int]]
                               ) -> np.ndarray:
    """Return layer stability ``[..., L]`` over every ordered pair, pairs weighted by refit counts."""
    first = np.array([p[0] for p in pairs])
    second = np.array([p[1] for p in pairs])
    weights = refit_counts[..., first] * refit_counts[..., second]
    layer_means = quiet_nanmean(matched, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.einsum("...p,...pl->...l", weights, layer_means) / weights.sum(-1)[..., None]


def refit_pair_weights(counts: np.ndarray, pairs: list[tuple[int, int]], both_sides: bool) -> np.ndarray:
    """Return bootstrap weights of refit pairs ``[R, n_pairs]``: c_a * c_b (both_sides) or c_b (anchor fixed)."""
    if both_sides:
        return np.stack([counts[:, a] * counts[:, b] for a, b in pairs], axis=1)
    return np.stack([counts[:, b] for _, b in pairs], axis=1)


def weighted_pair_mean(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Return the weighted mean over pairs: values ``[R, L, n_pairs]``, weights ``[R, n_pairs]`` -> ``[R, L]``.

    A replicate whose weights are all zero (one refit drawn every time: no pair) is NaN.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.einsum("rlj,rj->rl", values, weights) / weights.sum(1)[:, None]


def bootstrap_z_summary(replicates: np.ndarray, confidence_level: float = 0.95) -> tuple[float, float, float]:
    """Return (low, high, standard error) of a percentile interval from finite bootstrap replicates."""
    replicates = np.asarray(replicates, dtype=np.float64)
    replicates = replicates[np.isfinite(replicates)]
    if replicates.size < 2:
        return (math.nan, math.nan, math.nan)
    low, high = percentile_interval(replicates, confidence_level)
    return float(low), float(high), float(replicates.std(ddof=1))
