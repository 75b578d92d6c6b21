"""Functional importance of heads: the rise in perplexity when a head is zero-ablated."""

from __future__ import annotations

import numpy as np

from ..resampling import ResamplingPlan, resampled_means


def perplexity_rise(clean_loss: np.ndarray, ablated_loss: np.ndarray, plan: ResamplingPlan | None = None
                    ) -> np.ndarray:
    """Return exp(mean ablated loss) − exp(mean clean loss) per head, ``[L, H]`` or ``[B, L, H]``.

    ``clean_loss [N]`` and ``ablated_loss [L, H, N]`` are per-prompt mean next-token losses;
    with a ``plan`` the means are the engine's resampled means (one importance per resample).
    """
    n_layers, n_heads, n_prompts = ablated_loss.shape
    scores = np.column_stack([clean_loss, ablated_loss.reshape(-1, n_prompts).T])  # [N, 1 + L*H]
    if plan is None:
        means = scores.mean(axis=0)[:, None]
    else:
        means = resampled_means(scores, plan)  # [1 + L*H, B]
    rise = np.exp(means[1:]) - np.exp(means[0])
    out = rise.T.reshape(-1, n_layers, n_heads)
    return out[0] if plan is None else out
