"""Nulls, permutation tests and refit-level contrasts of cross-seed head stability (numpy only).

The pieces of :class:`circuitstat.pipelines.runs.heads.stability.HeadStability` that are statistics rather than
orchestration: the prompt-shuffle and untrained-model nulls as ordered-pair matrices
``[K, K, L, H]``, the layer summaries with the gap a layer-structure-free model would show (head
stabilities shuffled across layers), the permutation correlation of stability and importance per
layer and over the deep layers, and the jackknife over refits of residual CKA minus head stability.
Each takes arrays and seeds and returns arrays; nothing here reads a model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from circuitstat.core.seeds import spawn_seeds

from .head_pairs import prompt_shuffle_null, quiet_nanmean
from .head_stability import layer_statistics, pair_matrix, permutation_correlation, refit_jackknife, shuffled_layer_gap

__all__ = ["GAP_SHUFFLES", "prompt_null_pairs", "untrained_null_pairs", "layer_summaries_with_shuffled_gap",
           "importance_correlations", "residual_minus_head_jackknife"]

GAP_SHUFFLES = 50
"""Shuffles of the head stabilities across layers behind the expected gap without layer structure."""


def prompt_null_pairs(patterns: list[np.ndarray], anchor: int, pairs: list[tuple[int, int]], match: str,
                      drop_bos: bool, n_null: int, seed: np.random.SeedSequence, n_jobs: int = 1) -> np.ndarray:
    """Return the prompt-shuffle null matched scores of every ordered pair of refits ``[K, K, L, H]``.

    The anchor's pairs come first, so their seeds do not depend on how many other pairs follow.
    """
    n_refits = len(patterns)
    order = ([(anchor, b) for b in range(n_refits) if b != anchor]
             + [p for p in pairs if p[0] != anchor])
    null = prompt_shuffle_null(patterns, order, match, drop_bos, n_null, seed, n_jobs)
    return pair_matrix(null, order, n_refits)


def untrained_null_pairs(per_refit: np.ndarray) -> np.ndarray:
    """Return the untrained null ``[K, L, H]`` of each refit as an ordered-pair matrix ``[K, K, L, H]``.

    A refit's null does not depend on the other refit of the pair: row ``a`` repeats refit a's
    null, and the diagonal (a refit against itself) is NaN.
    """
    n_refits = per_refit.shape[0]
    out = np.broadcast_to(per_refit[:, None], (n_refits,) + per_refit.shape).copy()
    out[np.arange(n_refits), np.arange(n_refits)] = np.nan
    return out


def layer_summaries_with_shuffled_gap(layers: np.ndarray, layer_replicates: np.ndarray, heads: np.ndarray,
                                      head_replicates: np.ndarray, seed: np.random.SeedSequence
                                      ) -> tuple[dict, dict]:
    """Return the layer summaries (mean, gap, argmin, ...) at the point and per bootstrap replicate,
    each with ``gap_shuffled`` and ``gap_excess`` (gap minus it).

    ``gap_shuffled`` is the gap a layer-structure-free model would show: the anchor's head
    stabilities ``[L, H]`` shuffled across layers (a max − min over more layers grows with L even
    without any layer effect); the same :data:`GAP_SHUFFLES` permutations serve point and replicates.
    """
    point, replicates = layer_statistics(layers), layer_statistics(layer_replicates)
    n_cells = heads.shape[-2] * heads.shape[-1]
    permutations = np.argsort(np.random.default_rng(seed).random((GAP_SHUFFLES, n_cells)), axis=1)
    for derived, values in ((point, heads), (replicates, head_replicates)):
        derived["gap_shuffled"] = shuffled_layer_gap(values, permutations)
        derived["gap_excess"] = derived["gap"] - derived["gap_shuffled"]
    return point, replicates


def importance_correlations(matched_pairs: np.ndarray, importance: dict[int, np.ndarray], *, method: str,
                            n_permutations: int, seed: np.random.SeedSequence, confidence_level: float
                            ) -> list[dict[str, Any]]:
    """Return the correlation rows of head stability and importance, per layer and over the deep layers.

    ``importance``: refit index -> ``[L, H]`` importance of its heads (the refits whose heads are
    correlated); a head's stability is its mean matched score ``matched_pairs[a]`` over the other
    refits. Heads are centred within refit (``permutation_correlation`` groups: one per refit and
    layer). Row keys: scope ('layer' or 'deep'), layer (-1 for deep), r, ci_low, ci_high, pvalue,
    n, n_eff, refits, method. Layer l's permutations use child l of ``seed``, the deep row child L.
    """
    sources = list(importance)
    n_layers, n_heads = matched_pairs.shape[-2:]
    stability_by_source = {a: quiet_nanmean(matched_pairs[a], axis=0) for a in sources}  # [L, H]
    seeds = spawn_seeds(seed, n_layers + 1)
    deep = list(range(n_layers // 2, n_layers)) if n_layers > 1 else [0]
    scopes = [("layer", [layer], seeds[layer]) for layer in range(n_layers)] + [("deep", deep, seeds[-1])]
    rows = []
    for scope, layers, scope_seed in scopes:
        cells = [(a, layer) for a in sources for layer in layers]
        stability = np.concatenate([stability_by_source[a][layer] for a, layer in cells])
        values = np.concatenate([importance[a][layer] for a, layer in cells])
        groups = np.repeat(np.arange(len(cells)), n_heads)
        res = permutation_correlation(stability, values, groups, method=method, n_permutations=n_permutations,
                                      seed=scope_seed, confidence_level=confidence_level)
        rows.append({"scope": scope, "layer": layers[0] if scope == "layer" else -1,
                     **{k: res[k] for k in ("r", "ci_low", "ci_high", "pvalue", "n", "n_eff")},
                     "refits": len(sources), "method": method})
    return rows


def residual_minus_head_jackknife(residual_estimate: np.ndarray, residual_leave_one_out: np.ndarray,
                                  head_estimate: float, head_leave_one_out: np.ndarray, confidence_level: float
                                  ) -> tuple[float, float, float]:
    """Return mean residual CKA minus mean head stability (all-pairs estimates) and its jackknife
    interval over refits: (difference, low, high).

    ``residual_estimate`` ``[L]`` and ``residual_leave_one_out`` ``[K, L]`` are per layer (their mean
    over layers is taken); the head side is already the mean: a scalar and ``[K]``.
    """
    difference = residual_estimate.mean() - head_estimate
    leave_one_out = residual_leave_one_out.mean(-1) - head_leave_one_out
    low, high, _ = refit_jackknife(difference, leave_one_out, confidence_level)
    return difference, low, high
