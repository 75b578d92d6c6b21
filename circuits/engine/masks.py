"""Attention masks: which keys each query may attend to.

One mask serves every forward path (full run, patched suffix windows, fused checks); a rule that
restricts attention further (a sliding window, per layer) belongs in :func:`allowed_keys`.
"""

from __future__ import annotations

import torch


def allowed_keys(attention_mask: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """[B, 1, P, P] causal attention over real keys; each position may see itself (no NaN rows).

    ``window``: a sliding window of that many keys, the query's own included: key j is visible to
    query i when i - window < j <= i, on sequence indices as in transformers'
    ``masking_utils.sliding_window_overlay`` (``kv_idx > q_idx - sliding_window``).

    A masked position (padding, or a key removed by token mask ablation) keeps its diagonal:
    its own row is still computed from the real keys before it and itself, where HF hides a
    masked key from its own query too. No other query reads a masked key, so the outputs at
    unmasked positions are the same under either choice.
    """
    P = attention_mask.shape[1]
    idx = torch.arange(P, device=attention_mask.device)
    causal = idx[None, :] <= idx[:, None]
    if window is not None:
        causal = causal & (idx[None, :] > idx[:, None] - window)
    allowed = causal[None, None] & attention_mask.bool()[:, None, None, :]
    return allowed | torch.eye(P, dtype=torch.bool, device=attention_mask.device)


def layer_masks(cfg, attention_mask: torch.Tensor) -> dict[bool, torch.Tensor]:
    """``allowed_keys`` keyed by whether a layer is a sliding one (one tensor when no layer is)."""
    full = allowed_keys(attention_mask)
    if cfg.sliding_window is None or not any(cfg.is_sliding(i) for i in range(cfg.n_layers)):
        return {False: full, True: full}
    return {False: full, True: allowed_keys(attention_mask, cfg.sliding_window)}
