"""Normalisations: the forward of each kind ``ModelConfig.norm`` allows, and its vector-Jacobian product.

Every norm of the forward pass (before attention, before the MLP, before the unembedding) goes
through :func:`apply_norm`; the per-head receiver gradients go through :func:`norm_vjp_heads`.  A
new kind of norm extends both, here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import ModelConfig


def apply_norm(cfg: ModelConfig, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``x`` normalised as ``cfg.norm`` says (in float32, cast back) and scaled by ``w`` (+ ``b``)."""
    kind, eps = cfg.norm, cfg.norm_eps
    if kind == "none":
        return x
    dtype = x.dtype
    h = x.float()
    if kind == "layernorm":
        h = F.layer_norm(h, h.shape[-1:], None, None, eps)
        return (h.to(dtype) * w + b) if dtype != torch.float32 else h * w + b
    # RMSNorm as in Llama/Qwen2: normalise in float32, cast, then scale.
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(dtype)


def norm_vjp_heads(cfg: ModelConfig, x: torch.Tensor, w: torch.Tensor, gp: torch.Tensor,
                   W: torch.Tensor) -> torch.Tensor:
    """[R, B*P, D]: for each head-kind r, the norm's VJP at input x [B, P, D] of gp[r] @ W[r]ᵀ.

    The norm's backward, rstd (g - mean g - x̂ mean(g x̂)) with g = (gp Wᵀ) ⊙ w, is assembled so
    that its row means come from d_head-wide products: besides one bmm only two passes touch
    the [R, B*P, D] result.
    """
    ct = torch.promote_types(gp.dtype, torch.float32)  # float32 at least (float64 models stay so)
    Wt = W.transpose(1, 2).to(ct)  # [R, E, D]
    if cfg.norm == "none":
        return torch.bmm(gp.to(ct), Wt)
    Wt = Wt * w.to(ct)
    D = x.shape[-1]
    xf = x.detach().to(ct).reshape(-1, D)  # [B*P, D]
    if cfg.norm == "layernorm":
        xf = xf - xf.mean(-1, keepdim=True)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + cfg.norm_eps)  # [B*P, 1]
    xh = xf * rstd
    gps = gp.to(ct) * rstd  # rstd folded into the narrow side
    out = torch.bmm(gps, Wt)  # rstd * g
    mean_gxh = (gps * torch.matmul(Wt, xh.T).transpose(1, 2)).sum(-1, keepdim=True) / D  # rstd * mean(g x̂)
    if cfg.norm == "layernorm":
        out -= torch.bmm(gps, Wt.mean(-1, keepdim=True))  # rstd * mean(g)
    return out.addcmul_(mean_gxh, xh, value=-1)
