"""The fused training forward: the same function as a run, with torch's scaled-dot-product attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .mlp import mlp
from .norms import apply_norm
from .rotary import apply_rotary, model_inv_freq, rotary_tables


class FusedForward:
    """``fused_logits`` for training (mixed into CircuitModel, whose run gives ``_unembed``)."""

    cfg: ModelConfig
    blocks: nn.ModuleList

    @property
    def has_fused_forward(self) -> bool:
        """Whether :meth:`fused_logits` has its own fused path for this configuration."""
        cfg = self.cfg
        # torch's attention has no soft-capping, windows per layer or other scale here, and the loop
        # below no q/k or post-norms, embedding scale, scaled rotary tables or missing pre-norms
        newer = (cfg.attn_scalar, cfg.attn_softcap, cfg.logit_softcap, cfg.embed_scale, cfg.sliding_window,
                 cfg.rope, cfg.rope_local, cfg.attn_multiplier, cfg.embed_multiplier, cfg.logits_scaling,
                 cfg.rope_layers, cfg.clip_qkv, cfg.logit_scale, cfg.moe or None, cfg.attn_sinks or None)
        return (not cfg.parallel and not cfg.rotary_interleaved and cfg.positional in ("learned", "rotary", "none")
                and cfg.n_kv_heads in (None, cfg.n_heads) and all(v is None for v in newer)
                and cfg.pre_norm and not cfg.post_norm and cfg.qk_norm == "none")

    def fused_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, P, V] of full causal sequences without padding (training).

        The same function as ``self(ids)`` (checked to float rounding in tests) but with fused
        scaled-dot-product attention, about 1.5x faster on CPU for the zoo's models; falls back to
        ``self(ids)`` for configurations it does not cover.
        """
        cfg = self.cfg
        if not self.has_fused_forward:
            return self(ids)
        B, P = ids.shape
        x = self.W_E[ids]
        if cfg.positional == "learned":
            x = x + self.W_pos[:P]
        rot = None
        if cfg.positional == "rotary":
            rot = rotary_tables(model_inv_freq(self), torch.arange(P, device=ids.device).expand(B, P))
        H, E = cfg.n_heads, cfg.d_head
        for blk in self.blocks:
            h = apply_norm(cfg, x, blk.ln1_w, blk.ln1_b)
            W = torch.stack((blk.W_Q, blk.W_K, blk.W_V)).permute(2, 0, 1, 3).reshape(cfg.d_model, 3 * H * E)
            b = torch.stack((blk.b_Q, blk.b_K, blk.b_V)).reshape(3 * H * E)
            q, k, v = (h @ W + b).view(B, P, 3, H, E).permute(2, 0, 3, 1, 4)
            if rot is not None:
                q, k = apply_rotary(cfg, q, *rot), apply_rotary(cfg, k, *rot)
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, P, E]
            x = x + z.transpose(1, 2).reshape(B, P, H * E) @ blk.W_O.reshape(H * E, cfg.d_model) + blk.b_O
            if cfg.has_mlp:
                x = x + mlp(cfg, blk, x)
        return self._unembed(x)
