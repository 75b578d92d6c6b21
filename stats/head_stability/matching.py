"""Matching heads between refits: matched similarities (max or Hungarian), their means over resampled
prompts, head distinctness, and the best match in any layer."""

from __future__ import annotations

import numpy as np

from ..resampling import ResamplingPlan, resampled_means
from ..similarity import match_heads


def matched_similarity(similarity: np.ndarray, method: str) -> np.ndarray:
    """Return the matched similarity of every source head: ``[..., H1, H2] -> [..., H1]``.

    ``max``: the best column per row (several heads may match one); ``hungarian``: the
    one-to-one assignment maximising the total similarity (scipy's linear_sum_assignment).
    """
    similarity = np.asarray(similarity, dtype=np.float64)
    if method == "max":
        best = np.where(np.isnan(similarity), -np.inf, similarity).max(axis=-1)
        return np.where(np.isneginf(best), np.nan, best)
    flat = similarity.reshape(-1, *similarity.shape[-2:])
    scores = np.stack([match_heads(matrix, "hungarian")[1] for matrix in flat])
    return scores.reshape(similarity.shape[:-1])


def prompt_resampled_similarity(cosines: np.ndarray, plan: ResamplingPlan | None) -> np.ndarray:
    """Return the mean over prompts of per-prompt cosines ``[P, ...]``, per resample ``[B, ...]``.

    NaN cosines (an all-zero pattern) are left out of each mean, so a resampled mean is the
    ratio of two resampled means (cosines with NaN as 0, and the indicator of a valid cosine),
    both from the engine's ``resampled_means``. ``plan=None`` gives the full-sample mean ``[1, ...]``.
    """
    cosines = np.asarray(cosines, dtype=np.float64)
    n_prompts, shape = cosines.shape[0], cosines.shape[1:]
    valid = (~np.isnan(cosines)).reshape(n_prompts, -1).astype(np.float64)
    filled = np.nan_to_num(cosines, nan=0.0).reshape(n_prompts, -1)
    if plan is None:
        plan = ResamplingPlan.from_counts(np.ones((1, n_prompts), dtype=np.int64))
    with np.errstate(invalid="ignore", divide="ignore"):
        means = resampled_means(filled, plan) / resampled_means(valid, plan)  # [E, B]
    return means.T.reshape((plan.n_resamples,) + shape)


def head_distinctness_from_similarity(similarity: np.ndarray) -> np.ndarray:
    """Return 1 − mean similarity to the other heads of the layer: ``[..., H, H] -> [..., H]``."""
    n_heads = similarity.shape[-1]
    off_diagonal = ~np.eye(n_heads, dtype=bool)
    return 1.0 - np.where(off_diagonal, similarity, 0.0).sum(-1) / (n_heads - 1)


def cross_layer_best_match(point: dict[int, np.ndarray], replicates: dict[int, np.ndarray], target_counts: np.ndarray,
                           n_layers: int, n_heads: int) -> dict[str, np.ndarray]:
    """Return the anchor heads' best match in any layer of the comparison refits.

    ``point[b]`` is the anchor-vs-refit-b similarity ``[L*H, L*H]``, ``replicates[b]`` its
    bootstrap replicates ``[R, L*H, L*H]`` (or ``[1, ...]`` when prompts are not resampled),
    ``target_counts [R, K]`` the bootstrap draws of comparison refits. Keys: ``cross_layer``
    (mean best similarity), ``cross_layer_reps``, ``same_layer_share`` (share of refits whose
    best match is in the head's own layer) and ``modal_layer``.
    """
    layer_of = np.repeat(np.arange(n_layers), n_heads)
    targets = sorted(point)
    best_point = [matched_similarity(point[b], "max") for b in targets]
    best_layer = np.stack([layer_of[np.where(np.isnan(point[b]), -np.inf, point[b]).argmax(-1)] for b in targets])
    best_reps = sum(target_counts[:, [b]] * matched_similarity(replicates[b], "max") for b in targets)
    best_reps = best_reps / target_counts[:, targets].sum(1, keepdims=True)
    modal = np.array([np.bincount(best_layer[:, i], minlength=n_layers).argmax() for i in range(best_layer.shape[1])])
    return {"cross_layer": np.mean(best_point, axis=0), "cross_layer_reps": best_reps,
            "same_layer_share": (best_layer == layer_of[None]).mean(0), "modal_layer": modal}
