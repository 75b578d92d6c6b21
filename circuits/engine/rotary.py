"""Rotary position embeddings: inverse frequencies, cos/sin tables per position, their application.

Every forward path (full run, patched suffix, fused training forward) takes its tables from
:func:`rotary_tables` and rotates with :func:`apply_rotary`; frequency schedules (base, scaling)
belong in :func:`rotary_inv_freq`.
"""

from __future__ import annotations

import torch

from .config import ModelConfig


def rotary_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Rotary inverse frequencies [rotary_dim / 2] (a buffer computed from the config, never stored)."""
    dim = cfg.rotary_dim
    return 1.0 / (cfg.rotary_base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def rotary_tables(inv_freq: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [B, 1, P, rotary_dim] for position ids [B, P]."""
    freqs = positions.float()[..., None] * inv_freq  # [B, P, dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[:, None], emb.sin()[:, None]  # [B, 1, P, dim]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The last axis' halves swapped, the first negated: (x1, x2) -> (-x2, x1)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(cfg: ModelConfig, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` [..., E] with its first ``rotary_dim`` features rotated (in float32, cast back)."""
    rd = cfg.rotary_dim
    rot, rest = x[..., :rd], x[..., rd:]
    rot = (rot.float() * cos + rotate_half(rot.float()) * sin).to(x.dtype)
    return torch.cat((rot, rest), dim=-1) if rest.shape[-1] else rot
