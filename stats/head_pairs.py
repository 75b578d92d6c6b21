"""Pair-level statistics of the head-stability estimator: pattern similarities of every ordered
pair of refits, their nulls and the residual stream's CKA per layer.

Array code only (attention patterns and residual rows in, similarities and intervals out); the
read-outs that produce the arrays are in circuitstat.circuits.readouts, the estimator that orchestrates
both is circuitstat.pipelines.runs.heads.stability.HeadStability. Moved here from pipelines/runs/heads/stability.py unchanged in its
numbers (same seeds, same order of operations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from circuitstat.core.seeds import spawn_seeds

from .head_stability import (CKA_INTERVAL_RELIABLE, cka_half_sample_replicates, leave_one_refit_out, matched_similarity,
                             ordered_pair_mean, percentile_interval, prompt_resampled_similarity, quiet_nanmean,
                             refit_jackknife, weighted_pair_mean)
from .resampling import ResamplingPlan
from .similarity import head_matching, per_prompt_cosine

__all__ = ["PairSimilarities", "pair_similarities", "per_layer_cosine", "prompt_shuffle_null",
           "untrained_null_scores", "null_means", "quiet_nanmean", "residual_cka"]  # quiet_nanmean: from head_stability


@dataclass
class PairSimilarities:
    """Per-prompt cosines of every ordered pair of refits, and their prompt-resampled means."""

    pairs: list[tuple[int, int]]  # ordered pairs (a, b), a != b
    cosines: np.ndarray  # [P, n_pairs, L, H, H]
    point: np.ndarray  # [n_pairs, L, H, H] mean over prompts
    replicates: np.ndarray  # [R, n_pairs, L, H, H]
    anchor_cross: dict[int, np.ndarray]  # b -> [P, L*H, L*H] anchor against refit b, every layer
    anchor_self: np.ndarray  # [P, L, H, H] anchor against itself

    def index(self, a: int, b: int) -> int:
        """Return the position of the ordered pair (a, b)."""
        return self.pairs.index((a, b))


def per_layer_cosine(first: np.ndarray, second: np.ndarray, drop_bos: bool) -> np.ndarray:
    """Return per-prompt cosines of same-layer heads ``[P, L, H, H]`` of two pattern arrays ``[L, H, P, T, T]``."""
    return np.stack([per_prompt_cosine(first[layer], second[layer], drop_bos=drop_bos)
                     for layer in range(first.shape[0])], axis=1)


def pair_similarities(patterns: list[np.ndarray], anchor: int, drop_bos: bool, prompt_plan: ResamplingPlan | None,
                      n_resamples: int) -> PairSimilarities:
    """Return the cosines of every ordered pair of refits and their (resampled) means over prompts."""
    n_layers, n_heads, n_prompts, length = patterns[0].shape[:4]
    flat = [p.reshape(n_layers * n_heads, n_prompts, length, length) for p in patterns]
    blocks: dict[tuple[int, int], np.ndarray] = {}
    anchor_cross = {}
    for b in range(len(patterns)):
        if b == anchor:
            continue
        full = per_prompt_cosine(flat[anchor], flat[b], drop_bos=drop_bos)  # [P, LH, LH]
        anchor_cross[b] = full
        by_layer = full.reshape(n_prompts, n_layers, n_heads, n_layers, n_heads)
        blocks[(anchor, b)] = np.stack([by_layer[:, layer, :, layer, :] for layer in range(n_layers)], axis=1)
        blocks[(b, anchor)] = blocks[(anchor, b)].transpose(0, 1, 3, 2)
    others = [k for k in range(len(patterns)) if k != anchor]
    for a, b in zip(*np.triu_indices(len(others), 1)):
        a, b = others[a], others[b]
        blocks[(a, b)] = per_layer_cosine(patterns[a], patterns[b], drop_bos)
        blocks[(b, a)] = blocks[(a, b)].transpose(0, 1, 3, 2)
    pairs = sorted(blocks)
    cosines = np.stack([blocks[p] for p in pairs], axis=1)
    point = prompt_resampled_similarity(cosines, None)[0]
    if prompt_plan is None:
        replicates = np.broadcast_to(point, (n_resamples,) + point.shape)
    else:
        replicates = prompt_resampled_similarity(cosines, prompt_plan)
    anchor_self = per_layer_cosine(patterns[anchor], patterns[anchor], drop_bos)
    return PairSimilarities(pairs, cosines, point, replicates, anchor_cross, anchor_self)


def prompt_shuffle_null(patterns: list[np.ndarray], pairs: list[tuple[int, int]], match: str, drop_bos: bool,
                        n_null: int, seed: np.random.SeedSequence, n_jobs: int) -> np.ndarray:
    """Return the null matched score ``[n_pairs, L, H]`` of every ordered pair: prompts of refit b shuffled."""
    n_layers = patterns[0].shape[0]
    seeds = spawn_seeds(seed, len(pairs) * n_layers)
    return np.stack([np.stack([
        head_matching(patterns[a][layer], patterns[b][layer], method=match, drop_bos=drop_bos, n_permutations=n_null,
                      n_resamples=0, seed=seeds[i * n_layers + layer], n_jobs=n_jobs).null_head_mean
        for layer in range(n_layers)]) for i, (a, b) in enumerate(pairs)])


def untrained_null_scores(refit_patterns: list[np.ndarray], untrained_patterns: list[np.ndarray], match: str,
                          drop_bos: bool) -> np.ndarray:
    """Return each refit's matched score ``[K, L, H]`` against untrained models (mean over them)."""
    per_refit: list[list[np.ndarray]] = [[] for _ in refit_patterns]
    for untrained in untrained_patterns:
        for a, patterns in enumerate(refit_patterns):
            similarity = prompt_resampled_similarity(per_layer_cosine(patterns, untrained, drop_bos), None)[0]
            per_refit[a].append(matched_similarity(similarity, match))
    return np.stack([np.mean(scores, axis=0) for scores in per_refit])


def null_means(pairs: np.ndarray, anchor: int, targets: list[int], sources: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Return the null's head score (anchor against its targets) ``[L, H]`` and layer score ``[L]``.

    ``pairs`` ``[K, K, L, H]`` holds the null matched score of every ordered pair; the layer score
    averages the heads of each pair whose first refit is in ``sources``.
    """
    n_refits = pairs.shape[0]
    head = np.mean([pairs[anchor, b] for b in targets], axis=0)
    layer = np.mean([quiet_nanmean(pairs[a, b], axis=-1) for a in sources for b in range(n_refits) if b != a],
                    axis=0)
    return head, layer


def residual_cka(reprs_by_layer: list[dict[int, np.ndarray]], point_pairs: list[tuple[int, int]], kind: str,
                 n_positions: int, plan: ResamplingPlan | None, n_half: int, pair_weights: np.ndarray,
                 confidence_level: float) -> dict[str, Any]:
    """Return one hook and CKA kind's per-layer CKA: point, half-sample interval and refit-level jackknife.

    ``reprs_by_layer[layer][refit]`` are the residual rows of each refit at that layer. Keys:
    ``point`` [L, n_pairs], ``replicates`` [n_half, L] (pair-weighted), ``estimate`` and
    ``leave_one_out`` (mean over every ordered pair, with one refit left out), ``low``/``high``
    (refit jackknife per layer), ``mean_interval`` (jackknife of the mean over layers) and
    ``boot_low``/``boot_high`` (percentile interval of the half-sample replicates) and
    ``interval_reliable`` (False for the biased kinds, linear and RBF: CKA_INTERVAL_RELIABLE).
    """
    n_layers, n_refits = len(reprs_by_layer), len(reprs_by_layer[0])
    every_pair = [(int(a), int(b)) for a, b in zip(*np.triu_indices(n_refits, 1))]
    point = np.zeros((n_layers, len(point_pairs)))
    reps = np.zeros((n_half, n_layers, len(point_pairs)))
    every = np.full((n_refits, n_refits, n_layers), np.nan)
    for layer, reprs in enumerate(reprs_by_layer):
        point[layer], layer_reps = cka_half_sample_replicates(reprs, point_pairs, kind, n_positions, plan)
        reps[:, layer] = point[layer] if layer_reps is None else layer_reps
        values, _ = cka_half_sample_replicates(reprs, every_pair, kind, n_positions, None)
        for (a, b), value in zip(every_pair, values):
            every[a, b, layer] = every[b, a, layer] = value
    replicates = weighted_pair_mean(reps, pair_weights)
    estimate = ordered_pair_mean(every)
    leave_one_out = leave_one_refit_out(every)
    low, high, _ = refit_jackknife(estimate, leave_one_out, confidence_level)
    mean_low, mean_high, _ = refit_jackknife(estimate.mean(), leave_one_out.mean(-1), confidence_level)
    boot_low, boot_high = percentile_interval(replicates, confidence_level)
    return {"point": point, "replicates": replicates, "estimate": estimate, "leave_one_out": leave_one_out,
            "low": low, "high": high, "mean_interval": (mean_low, mean_high), "boot_low": boot_low,
            "boot_high": boot_high, "interval_reliable": CKA_INTERVAL_RELIABLE[kind]}
