"""The linear edge score: a sender's change times a receiver's gradient, contracted over positions and features.

EAP, EAP-IG, clean-corrupted and AtP* all score an edge (u, v) as Σ_pos Δz_u · ∂m/∂in_v; they differ in where the
gradient is taken. This module holds that one contraction (and the check every gradient run makes of its
metric), so circuitstat.circuits.attribution and circuitstat.circuits.atpstar share it without importing each other.
"""

from __future__ import annotations

from typing import Iterable

import torch

from circuitstat.core.errors import InputError

from .model import CircuitModel

__all__ = ["check_metric", "edge_scores_from_grads"]


def check_metric(values: torch.Tensor, index: torch.Tensor, what: str) -> None:
    """None; InputError naming the examples whose metric is NaN or infinite."""
    bad = ~torch.isfinite(values)
    if bool(bad.any()):
        rows = index[bad.cpu()].tolist()[:10]
        raise InputError(f"the metric is NaN or infinite for examples {rows} ({what}); check answers and prompts")


def edge_scores_from_grads(model: CircuitModel, delta: torch.Tensor, grads: Iterable[torch.Tensor]) -> torch.Tensor:
    """Σ_pos Δz_u · g_v for every edge (u, v): [B, E] float32, in the graph's edge order.

    ``grads`` holds the receiver groups in order and is read once, group by group (an iterator keeps
    only one group's gradients alive)."""
    g, cfg = model.graph, model.cfg
    delta = delta.float()
    B, U, P, D = delta.shape
    flat = delta.reshape(B, U, P * D)  # senders' Δz with positions and features as one axis
    cols = []
    it = iter(grads)

    def contract(u: int, grad: torch.Tensor) -> torch.Tensor:
        # [B, R, P*D] x [B, P*D, u] as one batched matmul (einsum's layout choice copied both operands)
        return torch.bmm(grad.float().reshape(B, -1, P * D), flat[:, :u].transpose(1, 2)).reshape(B, -1)

    for layer in range(cfg.n_layers):
        cols.append(contract(g.upstream_of_attention(layer), next(it)))  # [B, 3, H, P, D] -> [B, 3 H u]
        if cfg.has_mlp:
            cols.append(contract(g.upstream_of_mlp(layer), next(it)))
    cols.append(contract(U, next(it)))
    return torch.cat(cols, dim=1)
