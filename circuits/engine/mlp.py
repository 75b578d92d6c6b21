"""The MLP sender: its norm, the (gated) hidden layer and the output projection."""

from __future__ import annotations

import torch

from .config import ACTIVATIONS, ModelConfig
from .norms import apply_norm


def mlp(cfg: ModelConfig, blk, x: torch.Tensor) -> torch.Tensor:
    """The MLP's output (a sender) for receiver input x."""
    h = apply_norm(cfg, x, blk.ln2_w, blk.ln2_b)
    act = ACTIVATIONS[cfg.act]
    if cfg.mlp == "gated":
        pre = act(h @ blk.W_gate) * (h @ blk.W_in + blk.b_in)
    else:
        pre = act(h @ blk.W_in + blk.b_in)
    return pre @ blk.W_out + blk.b_out
