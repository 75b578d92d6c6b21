"""Normalisations: the forward of each kind ``ModelConfig.norm`` allows, its VJP and (for post-norms) its JVP.

Every norm of the forward pass goes through :func:`apply_norm`: before attention and the MLP
(:func:`attn_input_norm`, :func:`mlp_input_norm`, identities without pre-norms: OLMo 2), on the
attention and MLP outputs (:func:`post_norm`: Gemma's sandwich, OLMo 2), on queries and keys
(circuitstat.circuits.engine.attention.qk_normalize) and before the unembedding.  The per-head receiver
gradients go through :func:`norm_vjp_heads` and :func:`norm_vjp`; the linearised writes of heads
through a post-norm through :func:`norm_jvp`.  A new kind of norm extends these, here.

RMSNorm variants (transformers 5): Llama/Qwen/Mistral/Phi-3 normalise in float32, cast, then
scale (``LlamaRMSNorm``: ``weight * hidden.to(input_dtype)``); OLMo 2 scales in float32 and then
casts (``Olmo2RMSNorm``: ``(weight * hidden).to(input_dtype)``); Gemma 2/3 scale by ``1 + weight``
in float32 (``Gemma2RMSNorm``: ``(norm(x.float()) * (1.0 + weight.float())).type_as(x)``).

"float32" above means float32 *at least* (:func:`compute_dtype`): a float64 model normalises in float64.  HF's
classes cast a float64 input down to float32 (``hidden_states.to(torch.float32)``), so HF in float64 is not float64;
the float64 rows of tests/circuits/test_families.py compare with HF run under a mode that keeps float64 tensors
float64 (tests/families.py ``KeepFloat64``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import RMS_NORMS, ModelConfig, compute_dtype


def apply_norm(cfg: ModelConfig, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
               kind: str | None = None) -> torch.Tensor:
    """``x`` normalised as ``kind`` (default ``cfg.norm``) says (in float32, or float64 for float64 ``x``; cast
    back), scaled by ``w`` (+ ``b``)."""
    kind, eps = kind or cfg.norm, cfg.norm_eps
    if kind == "none":
        return x
    dtype = x.dtype
    ct = compute_dtype(dtype)
    h = x.to(ct)
    if kind == "layernorm":
        h = F.layer_norm(h, h.shape[-1:], None, None, eps)
        return (h.to(dtype) * w + b) if dtype != ct else h * w + b
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if kind == "rmsnorm_1p":
        return (h * (1.0 + w.to(ct))).to(dtype)
    if kind == "rmsnorm_f32w":
        return (w * h).to(dtype)
    return w * h.to(dtype)  # Llama: normalise in float32, cast, then scale


def input_norm_kind(cfg: ModelConfig) -> str:
    """The kind of the norms before attention and the MLP ('none' without pre-norms)."""
    return cfg.norm if cfg.pre_norm else "none"


def attn_input_norm(cfg: ModelConfig, blk, x: torch.Tensor) -> torch.Tensor:
    """What attention projects: the pre-attention norm of ``x`` (``x`` itself without pre-norms)."""
    return apply_norm(cfg, x, blk.ln1_w, blk.ln1_b) if cfg.pre_norm else x


def mlp_input_norm(cfg: ModelConfig, blk, x: torch.Tensor) -> torch.Tensor:
    """What the MLP reads: the pre-MLP norm of ``x`` (``x`` itself without pre-norms)."""
    return apply_norm(cfg, x, blk.ln2_w, blk.ln2_b) if cfg.pre_norm else x


def post_norm(cfg: ModelConfig, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The norm on an attention or MLP output before the residual add (weight ``w``)."""
    return apply_norm(cfg, x, w)


def norm_scale(cfg: ModelConfig, w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The effective per-feature scale of a norm with weight ``w`` (1 + w for Gemma), in ``dtype``."""
    w = w.to(dtype)
    return 1.0 + w if cfg.norm == "rmsnorm_1p" else w


def norm_jvp(cfg: ModelConfig, x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """J_norm(x) v (float32 at least): the first-order change of an RMS norm's output when x moves by v.

    With r = rsqrt(mean x² + eps) and x̂ = r x: J v = s ⊙ r (v - x̂ mean(x̂ v)), s the scale."""
    if cfg.norm not in RMS_NORMS:
        raise ValueError(f"norm_jvp is implemented for RMS norms, not {cfg.norm!r}")
    ct = compute_dtype(v.dtype)
    xf, vf = x.to(ct), v.to(ct)
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + cfg.norm_eps)
    xh = xf * r
    return norm_scale(cfg, w, ct) * r * (vf - xh * (xh * vf).mean(-1, keepdim=True))


def norm_vjp(cfg: ModelConfig, kind: str, x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """J_norm(x)ᵀ g (float32 at least) for a norm of ``kind`` with weight ``w`` at inputs x [..., n]."""
    ct = compute_dtype(g.dtype)
    if kind == "none":
        return g.to(ct)
    gs = g.to(ct) * (norm_scale(cfg, w, ct) if kind in RMS_NORMS else w.to(ct))
    xf = x.detach().to(ct)
    if kind == "layernorm":
        xf = xf - xf.mean(-1, keepdim=True)
        gs = gs - gs.mean(-1, keepdim=True)
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + cfg.norm_eps)
    xh = xf * r
    return r * (gs - xh * (xh * gs).mean(-1, keepdim=True))


def norm_vjp_heads(cfg: ModelConfig, x: torch.Tensor, w: torch.Tensor, gp: torch.Tensor,
                   W: torch.Tensor) -> torch.Tensor:
    """[R, B*P, D]: for each head-kind r, the input norm's VJP at input x [B, P, D] of gp[r] @ W[r]ᵀ.

    The norm's backward, rstd (g - mean g - x̂ mean(g x̂)) with g = (gp Wᵀ) ⊙ s, is assembled so
    that its row means come from d_head-wide products: besides one bmm only two passes touch
    the [R, B*P, D] result.
    """
    kind = input_norm_kind(cfg)
    ct = compute_dtype(gp.dtype)  # float32 at least (float64 models stay so)
    Wt = W.transpose(1, 2).to(ct)  # [R, E, D]
    if kind == "none":
        return torch.bmm(gp.to(ct), Wt)
    Wt = Wt * (norm_scale(cfg, w, ct) if kind in RMS_NORMS else w.to(ct))
    D = x.shape[-1]
    xf = x.detach().to(ct).reshape(-1, D)  # [B*P, D]
    if kind == "layernorm":
        xf = xf - xf.mean(-1, keepdim=True)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + cfg.norm_eps)  # [B*P, 1]
    xh = xf * rstd
    gps = gp.to(ct) * rstd  # rstd folded into the narrow side
    out = torch.bmm(gps, Wt)  # rstd * g
    mean_gxh = (gps * torch.matmul(Wt, xh.T).transpose(1, 2)).sum(-1, keepdim=True) / D  # rstd * mean(g x̂)
    if kind == "layernorm":
        out -= torch.bmm(gps, Wt.mean(-1, keepdim=True))  # rstd * mean(g)
    return out.addcmul_(mean_gxh, xh, value=-1)
