"""Receiver gradients: zero probes autograd differentiates, and per-head receiver-input gradients.

A run with ``receiver_grads=True`` adds a probe to every receiver input; with
``receiver_grads="projected"`` the attention probes sit on each head's q/k/v projections
instead, and :class:`ReceiverGradients` maps their gradients back to the receiver inputs:
head h's q-input gradient is J_normᵀ W_Q[h] ∂m/∂q_h (the norm's VJP: :mod:`.norms`).
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from .config import ModelConfig
from .norms import norm_vjp_heads


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
            gx = norm_vjp_heads(cfg, probed[layer], blk.ln1_w, g.permute(1, 2, 0, 3, 4).reshape(3 * H, B * P, E), W)
            yield gx.view(3, H, B, P, cfg.d_model).permute(2, 0, 1, 3, 4)
            if cfg.has_mlp:
                yield next(it)
        yield next(it)
