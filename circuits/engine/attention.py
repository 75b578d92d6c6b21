"""Attention: q/k/v projections, the attention scores and mixing, and one layer's attention.

:func:`attend` is the one place where scores become a pattern (scaling, masking, softmax); the
full run, the patched suffixes and the gradient runs all call it.  :func:`attention_block` is one
layer's attention in a full run: the receivers' inputs (shared, per head, or with one head's
input patched), their norm, the projections, rotary embeddings, the pattern and the head outputs.
"""

from __future__ import annotations

import math

import torch

from .config import ModelConfig
from .norms import apply_norm
from .rotary import apply_rotary


def per_head_bmm(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """[B, H, P, K] @ [H, K, N] -> [B, H, P, N] as one bmm over heads (torch.matmul would
    broadcast W to B copies, and copy it again for the backward)."""
    B, H, P, K = x.shape
    y = torch.bmm(x.transpose(0, 1).reshape(H, B * P, K), W)
    return y.view(H, B, P, W.shape[-1]).transpose(0, 1)


def fused_qkv(blk) -> tuple[torch.Tensor, torch.Tensor]:
    """[D, 3 H E] weights and bias; cached while the weights are frozen and unchanged."""
    params = (blk.W_Q, blk.W_K, blk.W_V, blk.b_Q, blk.b_K, blk.b_V)
    if any(p.requires_grad for p in params) and torch.is_grad_enabled():
        W = torch.stack((blk.W_Q, blk.W_K, blk.W_V)).permute(2, 0, 1, 3).flatten(1)
        return W, torch.stack((blk.b_Q, blk.b_K, blk.b_V)).flatten()
    key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
    cached = getattr(blk, "_fused_cache", None)
    if cached is None or cached[0] != key:
        with torch.no_grad():
            W = torch.stack((blk.W_Q, blk.W_K, blk.W_V)).permute(2, 0, 1, 3).flatten(1).contiguous()
            b = torch.stack((blk.b_Q, blk.b_K, blk.b_V)).flatten().contiguous()
        cached = (key, W, b)
        object.__setattr__(blk, "_fused_cache", cached)
    return cached[1], cached[2]


def project_shared(cfg: ModelConfig, blk, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [B, H, P, E] for one shared normalised input, as one fused matmul."""
    H, E = cfg.n_heads, cfg.d_head
    W, b = fused_qkv(blk)
    B, P, _ = x.shape
    qkv = (x @ W + b).view(B, P, 3, H, E).permute(2, 0, 3, 1, 4)
    return qkv[0], qkv[1], qkv[2]


def attend(cfg: ModelConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention pattern (float32) and the heads' mixed values [B, H, Pq, E]."""
    scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(cfg.d_head)
    scores = scores.masked_fill(~allowed, float("-inf"))
    pattern = scores.softmax(-1)
    return pattern, pattern.to(v.dtype) @ v


def attention_block(cfg: ModelConfig, blk, resid, dense, sparse, allowed, rot, per_head, q_at=None, keep=None,
                    probes=None):
    """Head outputs [B, H, P, D] (or None), the attention output [B, P, D] and the pattern.

    ``dense`` [B, 3, H, P, D]: per-receiver additions to the residual (each head's q, k, v input
    normalised on its own); ``sparse`` (kind, head, delta): one receiver's addition.
    ``q_at`` [B]: compute queries (and everything after) only at that position per row,
    returning [B, 1, ...] tensors; keys and values still span every position.
    ``keep``: a list the rotated q, k, v are appended to; ``probes``: gradient probes added to
    the projections (before rotary).
    """
    norm = lambda x: apply_norm(cfg, x, blk.ln1_w, blk.ln1_b)  # noqa: E731
    if dense is None:
        q, k_, v = project_shared(cfg, blk, norm(resid))
    else:
        # unbind, not dense[:, i]: each indexing's backward would zero-fill a full [B, 3, H, P, D]
        q, k_, v = (per_head_bmm(norm(resid[:, None] + d), W) + b[None, :, None, :]
                    for d, (W, b) in zip(dense.unbind(1), ((blk.W_Q, blk.b_Q), (blk.W_K, blk.b_K),
                                                           (blk.W_V, blk.b_V))))
    if sparse is not None:
        kind, h, delta = sparse
        W, b = ((blk.W_Q, blk.b_Q), (blk.W_K, blk.b_K), (blk.W_V, blk.b_V))[kind]
        x = resid + delta if dense is None else resid + dense[:, kind, h] + delta
        one = (norm(x) @ W[h] + b[h])[:, None]
        parts = [q, k_, v]
        t = parts[kind]
        parts[kind] = torch.cat((t[:, :h], one, t[:, h + 1 :]), dim=1)
        q, k_, v = parts
    if probes is not None:  # gradient probes on the projections (before rotary)
        q, k_, v = q + probes[0], k_ + probes[1], v + probes[2]
    if rot is not None:
        q, k_ = apply_rotary(cfg, q, *rot), apply_rotary(cfg, k_, *rot)
    if keep is not None:
        keep.append((q, k_, v))
    if q_at is not None:
        ar = torch.arange(q.shape[0], device=q.device)
        q = q[ar, :, q_at][:, :, None]  # [B, H, 1, E]
        allowed = allowed[ar, :, q_at][:, :, None]
    pattern, zc = attend(cfg, q, k_, v, allowed)
    if per_head:
        return per_head_bmm(zc, blk.W_O), None, pattern
    B, H, Pq, E = zc.shape
    return None, zc.transpose(1, 2).reshape(B, Pq, H * E) @ blk.W_O.reshape(H * E, -1) + blk.b_O, pattern
