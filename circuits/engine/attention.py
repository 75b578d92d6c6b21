"""Attention: q/k/v projections, q/k norms, the attention scores and mixing, and one layer's attention.

:func:`attend` is the one place where scores become a pattern (scaling, soft-capping, masking,
softmax); the full run, the patched suffixes and the gradient runs all call it.  Queries and keys
are normalised (Qwen 3 / Gemma 3 per head, OLMo 2 over the whole projection) by
:func:`qk_normalize` for a shared input, by :func:`project_heads` for per-head receiver inputs and by
:func:`project_rows` for the rows of a patched suffix, always before rotary embeddings (as HF).
:func:`attention_block` is one layer's attention in a full run: the receivers' inputs (shared, per
head, or with one head's input patched), their norm, the projections, q/k norms, rotary
embeddings, the pattern and the head outputs.

OLMo 2's norm over the whole projection couples the heads: head h's query is slice h of
norm(x W_Q) over all heads' pre-norm queries.  A receiver ``a{L}.h{h}<q>`` with its own input x_h
therefore gets slice h of norm(x_h W_Q) (every head projected from x_h, only slice h kept), and
``<k>`` slice group(h) of norm(x_h W_K) over the K/V heads (grouped, as HF normalises them).
"""

from __future__ import annotations

import math

import torch

from .config import ModelConfig, compute_dtype
from .norms import apply_norm, attn_input_norm
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
    """q, k, v [B, H, P, E] for one shared normalised input, as one fused matmul (before q/k norms)."""
    H, E = cfg.n_heads, cfg.d_head
    W, b = fused_qkv(blk)
    B, P, _ = x.shape
    qkv = (x @ W + b).view(B, P, 3, H, E).permute(2, 0, 3, 1, 4)
    return qkv[0], qkv[1], qkv[2]


def kind_weights(blk, kind: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(W [H, D, E], b [H, E]) of queries (kind 0), keys (1) or values (2), ungrouped."""
    return ((blk.W_Q, blk.b_Q), (blk.W_K, blk.b_K), (blk.W_V, blk.b_V))[kind]


def full_projection(cfg: ModelConfig, blk, kind: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(W [D, n], b [n], group) of the whole q (kind 0) or k (kind 1) projection as HF normalises it:
    n = H E for queries, n = H_kv E for keys (one copy per K/V group), ``group`` query heads per column block."""
    W, b = kind_weights(blk, kind)
    group = 1 if kind == 0 else cfg.n_heads // cfg.kv_heads
    W, b = W[::group], b[::group]
    return W.permute(1, 0, 2).reshape(W.shape[1], -1), b.reshape(-1), group


def qk_norm_params(cfg: ModelConfig, blk, kind: int, heads: torch.Tensor | None = None):
    """(weight, bias or None) of the q (kind 0) or k (1) norm; for ``each_head`` shaped to broadcast over
    [B, H, P, E] (or, given ``heads`` [R], over rows [R, T, E] of those heads)."""
    w = blk.lnq_w if kind == 0 else blk.lnk_w
    b = getattr(blk, "lnq_b" if kind == 0 else "lnk_b", None)
    if cfg.qk_norm == "each_head":
        pick = (lambda t: t[:, None]) if heads is None else (lambda t: t[heads][:, None])  # noqa: E731
        w, b = pick(w), None if b is None else pick(b)
    return w, b


def qk_normalize(cfg: ModelConfig, blk, t: torch.Tensor, kind: int) -> torch.Tensor:
    """Queries (kind 0), keys (1) or values (2) [B, H, P, E] of a shared input after the model's clip_qkv clamp
    and q/k norm.

    OLMo 1's clamp (OlmoAttention: ``query_states.clamp_(-clip_qkv, clip_qkv)``, likewise keys and values) acts
    on each head's projection alone, so it belongs to that head's q, k or v receiver, elementwise, like a per-head
    q/k norm; gradient probes sit before it, so receiver gradients pass through it exactly (zero where clamped)."""
    t = clip_qkv(cfg, t)
    if cfg.qk_norm == "none" or kind == 2:
        return t
    if cfg.qk_norm in ("head", "each_head"):
        return apply_norm(cfg, t, *qk_norm_params(cfg, blk, kind))
    w = blk.lnq_w if kind == 0 else blk.lnk_w
    group = 1 if kind == 0 else cfg.n_heads // cfg.kv_heads
    g = t[:, ::group]  # keys: one copy per K/V group (the ungrouped copies are equal)
    B, Hg, P, E = g.shape
    n = apply_norm(cfg, g.transpose(1, 2).reshape(B, P, Hg * E), w).view(B, P, Hg, E).transpose(1, 2)
    return n.repeat_interleave(group, 1) if group > 1 else n


def clip_qkv(cfg: ModelConfig, t: torch.Tensor) -> torch.Tensor:
    """``t`` clamped to [-clip_qkv, clip_qkv] where the model clamps its projections (OLMo 1), else ``t``."""
    return t if cfg.clip_qkv is None else t.clamp(-cfg.clip_qkv, cfg.clip_qkv)


def project_heads(cfg: ModelConfig, blk, x: torch.Tensor, kind: int) -> torch.Tensor:
    """[B, H, P, E]: each head's q, k or v (after q/k norms) from its own normalised input x [B, H, P, D]."""
    W, b = kind_weights(blk, kind)
    if cfg.qk_norm != "full" or kind == 2:
        return qk_normalize(cfg, blk, per_head_bmm(x, W) + b[None, :, None, :], kind)
    Wf, bf, group = full_projection(cfg, blk, kind)
    B, H, P, _ = x.shape
    w = blk.lnq_w if kind == 0 else blk.lnk_w
    normed = apply_norm(cfg, x @ Wf + bf, w).view(B, H, P, -1, cfg.d_head)  # every head's column block
    heads = torch.arange(H, device=x.device)
    return normed[:, heads, :, heads // group].transpose(0, 1)  # head h keeps its own block


def project_rows(cfg: ModelConfig, blk, x: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """[R, T, E]: row i's q, k or v (``local[i]`` = kind * H + head; after q/k norms) from x [R, T, D]."""
    H, E = cfg.n_heads, cfg.d_head
    kind, h = local // H, local % H
    W = torch.stack((blk.W_Q, blk.W_K, blk.W_V)).flatten(0, 1)[local]  # [R, D, E]: each row's own head
    b = torch.stack((blk.b_Q, blk.b_K, blk.b_V)).flatten(0, 1)[local]
    new = clip_qkv(cfg, torch.baddbmm(b[:, None], x, W))
    if cfg.qk_norm in ("head", "each_head"):
        for k in (0, 1):
            new = torch.where((kind == k)[:, None, None], apply_norm(cfg, new, *qk_norm_params(cfg, blk, k, h)), new)
    elif cfg.qk_norm == "full":
        for k, w in ((0, blk.lnq_w), (1, blk.lnk_w)):
            rows = torch.nonzero(kind == k).flatten()
            if rows.numel():
                Wf, bf, group = full_projection(cfg, blk, k)
                normed = apply_norm(cfg, x[rows] @ Wf + bf, w).view(len(rows), x.shape[1], -1, E)
                new = new.index_copy(0, rows, normed[torch.arange(len(rows), device=x.device), :, h[rows] // group])
    return new


def attention_pattern(cfg: ModelConfig, q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor,
                      sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention pattern (float32, float64 for float64 ``q``) [B, H, Pq, Pk] of queries ``q`` over keys ``k``.

    Scores are scaled by 1/sqrt(d_head), by query_pre_attn_scalar**-0.5 (Gemma) or by Granite's
    attention_multiplier, then soft-capped as cap * tanh(s / cap) where the model does (Gemma 2:
    ``eager_attention_forward``'s softcap).
    ``sinks`` (GPT-OSS, broadcastable to [B, H, Pq, 1]: each row's head's sink logit) is a column of the
    softmax dropped afterwards, so a row's weights sum to less than 1 (GptOss ``eager_attention_forward``)."""
    ct = compute_dtype(q.dtype)
    scores = (q @ k.transpose(-1, -2)).to(ct)
    if cfg.attn_multiplier is not None:  # Granite: scores * attention_multiplier (GraniteAttention.scaling)
        scores = scores * cfg.attn_multiplier
    elif cfg.attn_scalar is not None:
        scores = scores * cfg.attn_scalar ** -0.5
    else:
        scores = scores / math.sqrt(cfg.d_head)
    if cfg.attn_softcap is not None:
        scores = torch.tanh(scores / cfg.attn_softcap) * cfg.attn_softcap
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is None:
        return scores.softmax(-1)
    sink = sinks.to(ct).expand(*scores.shape[:-1], 1)
    return torch.cat((scores, sink), -1).softmax(-1)[..., :-1]


def head_sinks(blk, heads: torch.Tensor | int | None = None) -> torch.Tensor | None:
    """The sink logits of ``blk`` shaped for :func:`attention_pattern`: every head [1, H, 1, 1], or one head per
    row (``heads`` [R] or an int) [R, 1, 1, 1]; None for a model without sinks."""
    if not hasattr(blk, "sinks"):
        return None
    if heads is None:
        return blk.sinks.view(1, -1, 1, 1)
    return blk.sinks[heads].reshape(-1, 1, 1, 1)


def attend(cfg: ModelConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           allowed: torch.Tensor, sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention pattern (float32 or float64, :func:`attention_pattern`) and the heads' mixed values [B, H, Pq, E]."""
    pattern = attention_pattern(cfg, q, k, allowed, sinks)
    return pattern, pattern.to(v.dtype) @ v


def attention_block(cfg: ModelConfig, blk, resid, dense, sparse, allowed, rot, per_head, q_at=None, keep=None,
                    probes=None):
    """Head outputs [B, H, P, D] (or None), the attention output [B, P, D] (before any post-norm) and
    the pattern.

    ``dense`` [B, 3, H, P, D]: per-receiver additions to the residual (each head's q, k, v input
    normalised on its own); ``sparse`` (kind, head, delta): one receiver's addition.
    ``q_at`` [B]: compute queries (and everything after) only at that position per row,
    returning [B, 1, ...] tensors; keys and values still span every position.
    ``keep``: a list the rotated q, k, v are appended to; ``probes``: gradient probes added to
    the projections before rotary (before per-head q/k norms; after a whole-projection q/k norm,
    whose gradient circuitstat.circuits.engine.gradients maps back).
    """
    norm = lambda x: attn_input_norm(cfg, blk, x)  # noqa: E731
    if dense is None:
        q, k_, v = project_shared(cfg, blk, norm(resid))
        if probes is not None and cfg.qk_norm != "full":
            q, k_, v = q + probes[0], k_ + probes[1], v + probes[2]
        q, k_, v = qk_normalize(cfg, blk, q, 0), qk_normalize(cfg, blk, k_, 1), qk_normalize(cfg, blk, v, 2)
        if probes is not None and cfg.qk_norm == "full":
            q, k_, v = q + probes[0], k_ + probes[1], v + probes[2]
    else:
        # unbind, not dense[:, i]: each indexing's backward would zero-fill a full [B, 3, H, P, D]
        q, k_, v = (project_heads(cfg, blk, norm(resid[:, None] + d), kind) for kind, d in enumerate(dense.unbind(1)))
    if sparse is not None:
        kind, h, delta = sparse
        x = resid + delta if dense is None else resid + dense[:, kind, h] + delta
        local = torch.full((x.shape[0],), kind * cfg.n_heads + h, device=x.device)
        one = project_rows(cfg, blk, norm(x), local)[:, None]
        parts = [q, k_, v]
        t = parts[kind]
        parts[kind] = torch.cat((t[:, :h], one, t[:, h + 1 :]), dim=1)
        q, k_, v = parts
    if rot is not None:
        q, k_ = apply_rotary(cfg, q, *rot), apply_rotary(cfg, k_, *rot)
    if keep is not None:
        keep.append((q, k_, v))
    if q_at is not None:
        ar = torch.arange(q.shape[0], device=q.device)
        q = q[ar, :, q_at][:, :, None]  # [B, H, 1, E]
        allowed = allowed[ar, :, q_at][:, :, None]
    pattern, zc = attend(cfg, q, k_, v, allowed, head_sinks(blk))
    if per_head:
        return per_head_bmm(zc, blk.W_O), None, pattern
    B, H, Pq, E = zc.shape
    return None, zc.transpose(1, 2).reshape(B, Pq, H * E) @ blk.W_O.reshape(H * E, -1) + blk.b_O, pattern
