"""Receiver gradients: zero probes autograd differentiates, and per-head receiver-input gradients.

A run with ``receiver_grads=True`` adds a probe to every receiver input; with
``receiver_grads="projected"`` the attention probes sit on each head's q/k/v projections
instead, and :class:`ReceiverGradients` maps their gradients back to the receiver inputs:
head h's q-input gradient is J_normᵀ W_Q[h] ∂m/∂q_h (the norm's VJP: :mod:`.norms`).

Per-head q/k norms (Qwen 3, Gemma 3) sit after the probes, so their VJP is part of ∂m/∂q_h.  A
q/k norm over the whole projection (OLMo 2) sits before them (it mixes heads): with p = x̂ W + b
the pre-norm projection (n wide), r = rsqrt(mean p² + eps) and s the norm's scale, head h's
receiver gradient at x̂ is r W_h (s_h ⊙ g_h) − c_h W pᵀ with c_h = r³/n Σ_{i∈h} g_i s_i p_i (only
slice h of the norm's output belongs to head h's receiver, but every slice of p moves it).
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from .attention import full_projection
from .config import ModelConfig, compute_dtype
from .norms import attn_input_norm, input_norm_kind, norm_scale, norm_vjp, norm_vjp_heads


def grad_probe(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """A zero tensor of ``shape`` whose gradient autograd can return (receiver gradients).

    An expanded view of one zero element: no memory to allocate and fill, yet
    ``torch.autograd.grad`` with the view as input returns the full-shape gradient.
    """
    one = torch.zeros((1,) * len(shape), dtype=like.dtype, device=like.device, requires_grad=True)
    return one.expand(shape)


class ReceiverGradients:
    """Receiver-input gradients from a run's probes (mixed into CircuitModel)."""

    cfg: ModelConfig
    blocks: nn.ModuleList

    def receiver_input_grads(self, out, grads: "list[torch.Tensor] | tuple[torch.Tensor, ...]"
                             ) -> list[torch.Tensor]:
        """Gradients in the ``receiver_grads=True`` layout from those of ``out.grad_inputs`` (a list)."""
        return list(self.iter_receiver_input_grads(out, grads))

    def iter_receiver_input_grads(self, out, grads: "list[torch.Tensor] | tuple[torch.Tensor, ...]"
                                  ) -> Iterator[torch.Tensor]:
        """Receiver-input gradients one receiver group at a time, in the ``receiver_grads=True`` order.

        For a ``receiver_grads="projected"`` run, head h's q-input gradient is
        J_normᵀ W_Q[h] ∂m/∂q_h (likewise k, v): one batched matmul and the norm's
        vector-Jacobian product per layer, [B, 3, H, P, D].  Other runs' grads pass through.
        Lazily, so that a consumer contracting each group at once holds one layer's [B, 3, H, P, D]
        at a time, not all of them (GPT-2 small, 24 x 40 tokens: 106 MB instead of 1.3 GB).
        """
        if not out.probed:
            yield from grads
            return
        cfg = self.cfg
        probed = dict(out.probed)
        it = iter(grads)
        for layer in range(min(probed), cfg.n_layers):
            blk = self.blocks[layer]
            g = torch.stack([next(it) for _ in range(3)], dim=1)  # [B, 3, H, P, E]
            B, _, H, P, E = g.shape
            W = torch.stack((blk.W_Q, blk.W_K, blk.W_V)).reshape(3 * H, cfg.d_model, E)
            gp = g.permute(1, 2, 0, 3, 4).reshape(3 * H, B * P, E)
            x, ln1_w = probed[layer], getattr(blk, "ln1_w", None)
            if cfg.qk_norm == "full":
                gp, corr = _full_qk_terms(cfg, blk, x, gp)
                gx = norm_vjp_heads(cfg, x, ln1_w, gp, W)
                gx[: 2 * H] -= corr
            else:
                gx = norm_vjp_heads(cfg, x, ln1_w, gp, W)
            yield gx.view(3, H, B, P, cfg.d_model).permute(2, 0, 1, 3, 4)
            if cfg.has_mlp:
                yield next(it)
        yield next(it)


def _full_qk_terms(cfg: ModelConfig, blk, x: torch.Tensor, gp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gp with its q and k rows replaced by r s_h ⊙ g_h, the correction c_h J_lnᵀ (W pᵀ) [2H, B*P, D])
    for a q/k norm over the whole projection (see the module docstring)."""
    H, E, D = cfg.n_heads, cfg.d_head, cfg.d_model
    ct = compute_dtype(gp.dtype)
    x = x.detach()
    xn = attn_input_norm(cfg, blk, x).reshape(-1, D).to(ct)
    gp = gp.to(ct).clone()
    heads = torch.arange(H, device=gp.device)
    corr = []
    for kind, w in ((0, blk.lnq_w), (1, blk.lnk_w)):
        Wf, bf, group = full_projection(cfg, blk, kind)
        Wf, bf = Wf.to(ct), bf.to(ct)
        p = xn @ Wf + bf  # [B*P, n]
        r = torch.rsqrt(p.pow(2).mean(-1, keepdim=True) + cfg.norm_eps)  # [B*P, 1]
        sb = norm_scale(cfg, w, ct).view(-1, E)[heads // group][:, None]  # [H, 1, E]: each head's block
        pb = p.view(p.shape[0], -1, E)[:, heads // group].transpose(0, 1)  # [H, B*P, E]
        gk = gp[kind * H : (kind + 1) * H]
        c = (r.pow(3) / p.shape[-1]) * (gk * sb * pb).sum(-1, keepdim=True)  # [H, B*P, 1]
        gp[kind * H : (kind + 1) * H] = r * sb * gk
        back = norm_vjp(cfg, input_norm_kind(cfg), x.reshape(-1, D), getattr(blk, "ln1_w", None), p @ Wf.T)
        corr.append(c * back)
    return gp, torch.cat(corr)


class GradientGates:
    """AtP*'s GradDrop (Kramár et al. 2024, arXiv:2403.00745, section 3.1.2): a layer whose residual
    writes pass no gradient.

    A run given ``grad_gates`` routes each layer's writes to the residual stream (its attention output
    and its MLP output) through an identity whose backward reads ``dropped`` *when the backward runs*:
    the gradient into the writes of layer ``dropped`` is zero (it still flows through the skip
    connection), every other layer's passes unchanged.  So one forward serves L backward passes, one
    per dropped layer (``retain_graph``); the forward values are untouched.
    """

    def __init__(self) -> None:
        self.dropped: int | None = None

    def gate(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """``x`` (layer ``layer``'s write), through the gate."""
        return _Gate.apply(x, self, layer)


class _Gate(torch.autograd.Function):
    """Identity forward; backward zero when its layer is the dropped one."""

    @staticmethod
    def forward(ctx, x, gates, layer):  # noqa: D102 - torch.autograd.Function protocol
        ctx.gates, ctx.layer = gates, layer
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        return (torch.zeros_like(grad) if ctx.gates.dropped == ctx.layer else grad), None, None
