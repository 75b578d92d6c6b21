"""Attention masks: which keys each query may attend to.

One mask serves every forward path (full run, patched suffix windows, fused checks); a rule that
restricts attention further (a sliding window, per layer) belongs in :func:`allowed_keys`.
"""

from __future__ import annotations

import torch


def allowed_keys(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, 1, P, P] causal attention over real keys; each position may see itself (no NaN rows).

    A masked position (padding, or a key removed by token mask ablation) keeps its diagonal:
    its own row is still computed from the real keys before it and itself, where HF hides a
    masked key from its own query too. No other query reads a masked key, so the outputs at
    unmasked positions are the same under either choice.
    """
    P = attention_mask.shape[1]
    idx = torch.arange(P, device=attention_mask.device)
    allowed = (idx[None, :] <= idx[:, None])[None, None] & attention_mask.bool()[:, None, None, :]
    return allowed | torch.eye(P, dtype=torch.bool, device=attention_mask.device)
