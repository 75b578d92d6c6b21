"""Layer-level derived numbers: mean, gap, least stable layer and shape of layer stabilities, and the gap
expected with heads shuffled across layers."""

from __future__ import annotations

import numpy as np

from .quiet import quiet, quiet_nanmean


def layer_statistics(layer_stability: np.ndarray) -> dict[str, np.ndarray]:
    """Return the summaries of layer stabilities ``[..., L]``: mean, gap, least stable layer, ...

    Keys: ``mean``, ``gap`` (max − min), ``argmin``, ``argmin_rel`` (argmin / (L − 1)) and, with
    at least 3 layers, ``ends_minus_middle`` and ``middle_min`` (1 when the least stable layer
    is neither the first nor the last).
    """
    layer_stability = np.asarray(layer_stability, dtype=np.float64)
    n_layers = layer_stability.shape[-1]
    with quiet():
        argmin = np.nanargmin(np.where(np.isnan(layer_stability), np.inf, layer_stability), axis=-1).astype(float)
        out = {"mean": np.nanmean(layer_stability, axis=-1),
               "gap": np.nanmax(layer_stability, axis=-1) - np.nanmin(layer_stability, axis=-1),
               "argmin": argmin,
               "argmin_rel": argmin / (n_layers - 1) if n_layers > 1 else argmin * np.nan}
        if n_layers >= 3:
            ends = (layer_stability[..., 0] + layer_stability[..., -1]) / 2
            out["ends_minus_middle"] = ends - np.nanmean(layer_stability[..., 1:-1], axis=-1)
            out["middle_min"] = ((argmin > 0) & (argmin < n_layers - 1)).astype(float)
    return out


def shuffled_layer_gap(head_stability: np.ndarray, permutations: np.ndarray) -> np.ndarray:
    """Return the mean gap with heads shuffled across layers: ``[..., L, H] -> [...]``.

    ``permutations [S, L*H]`` reorder the flattened heads; a max − min over more layers grows
    with L even without any layer effect, and this is that expectation.
    """
    head_stability = np.asarray(head_stability, dtype=np.float64)
    n_layers, n_heads = head_stability.shape[-2:]
    batch = head_stability.shape[:-2]
    flat = head_stability.reshape(batch + (n_layers * n_heads,))
    shuffled = flat[..., permutations].reshape(batch + (len(permutations), n_layers, n_heads))
    layer_means = quiet_nanmean(shuffled, axis=-1)
    with quiet():
        return np.nanmean(np.nanmax(layer_means, axis=-1) - np.nanmin(layer_means, axis=-1), axis=-1)
