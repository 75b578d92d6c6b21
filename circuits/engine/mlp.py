"""The MLP sender: its input norm, the (gated) hidden layer, the output projection and any post-norm."""

from __future__ import annotations

import torch

from .config import ACTIVATIONS, ModelConfig
from .moe import moe_block
from .norms import mlp_input_norm, post_norm


def mlp(cfg: ModelConfig, blk, x: torch.Tensor) -> torch.Tensor:
    """The MLP's output (a sender) for receiver input x: what the layer adds to the residual.

    With a post-norm (Gemma's post_feedforward_layernorm, OLMo 2) the norm is part of the sender:
    the MLP is one node, so its write stays additive."""
    h = mlp_input_norm(cfg, blk, x)
    act = ACTIVATIONS[cfg.act]
    if hasattr(blk, "W_router"):  # a mixture-of-experts layer: router and experts inside the node
        out = moe_block(cfg, blk, h, act)
        return post_norm(cfg, blk.ln2_post_w, out) if cfg.post_norm else out
    if cfg.mlp == "gated":
        pre = act(h @ blk.W_gate) * (h @ blk.W_in + blk.b_in)
    else:
        pre = act(h @ blk.W_in + blk.b_in)
    out = pre @ blk.W_out + blk.b_out
    return post_norm(cfg, blk.ln2_post_w, out) if cfg.post_norm else out


def mlp_parts(cfg: ModelConfig, blk, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the MoE layer's output [B, P, D] as :func:`mlp` gives it, each expert's write [B, X (+1), P, D]) for
    receiver input x (experts as nodes; no post-norm: circuitstat.circuits.moe_nodes refuses it)."""
    out, each = moe_block(cfg, blk, mlp_input_norm(cfg, blk, x), ACTIVATIONS[cfg.act], parts=True)
    return out, each.movedim(-2, 1)
