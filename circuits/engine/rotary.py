"""Rotary position embeddings: inverse frequencies, cos/sin tables per position, their application.

Every forward path (full run, patched suffix, fused training forward) takes its tables from
:func:`rotary_tables` (per layer through :func:`layer_rotary`) and rotates with :func:`apply_rotary`;
frequency schedules (base, scaling) belong in :func:`rotary_inv_freq` and :func:`rotary_scaling`.

The schedules are those of transformers 5's ``modeling_rope_utils`` (``_compute_*_parameters``),
rewritten operation for operation so that the frequencies are bit-identical in float32:
``default``, ``linear`` (frequencies / factor), ``llama3`` (Llama 3.1's piecewise smoothing),
``yarn`` (NTK-by-parts with its attention factor on cos/sin), ``longrope`` (Phi-3's per-frequency
short factors and attention factor) and ``dynamic`` (NTK).  ``dynamic`` and ``longrope`` change
with the sequence length in HF (``dynamic_rope_update``: dynamic grows its base, statefully, beyond
``max_position_embeddings``; longrope switches to ``long_factor`` beyond
``original_max_position_embeddings``, for the whole batch, from its longest prompt).  Up to that
length both are exactly the static schedule implemented here; longer prompts are refused
(``ModelConfig.rope_max_positions``, checked in the run set-up), never approximated.
"""

from __future__ import annotations

import math

import torch

from .config import ModelConfig, compute_dtype


def rope_params(cfg: ModelConfig, local: bool = False) -> dict:
    """The rotary schedule of full-attention (or, with ``local``, sliding-window) layers, with its rope_theta."""
    if local and cfg.rope_local is not None:
        return {"rope_type": "default", **cfg.rope_local}
    return {"rope_type": "default", **(cfg.rope or {}), "rope_theta": cfg.rotary_base}


def _default_inv_freq(base: float, dim: int) -> torch.Tensor:
    # modeling_rope_utils: 1 / base ** (arange(0, dim, 2, int64).float() / dim)
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3(inv_freq: torch.Tensor, p: dict) -> torch.Tensor:
    """_compute_llama3_parameters: low frequencies divided by factor, a smooth ramp in between."""
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old = p["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv_freq
    out = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, out)


def _yarn(base: float, dim: int, p: dict) -> torch.Tensor:
    """_compute_yarn_parameters: interpolated low and extrapolated high frequencies, a linear ramp between."""
    factor = p["factor"]
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1
    original = p["original_max_position_embeddings"]

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF's guard against a singular ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extra_factor = 1 - ramp
    return interpolation * (1 - extra_factor) + extrapolation * extra_factor


def rotary_inv_freq(cfg: ModelConfig, local: bool = False) -> torch.Tensor:
    """Rotary inverse frequencies [rotary_dim / 2] (a buffer computed from the config, never stored)."""
    p = rope_params(cfg, local)
    kind, base, dim = p["rope_type"], float(p["rope_theta"]), cfg.rotary_dim
    if kind == "yarn":
        return _yarn(base, dim, p)
    if kind == "longrope":  # the short factors: prompts up to original_max_position_embeddings
        shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        return 1.0 / (torch.tensor(p["short_factor"], dtype=torch.float32) * base ** shape)
    if kind == "dynamic":  # HF's base at seq_len = max_position_embeddings (its value up to that length)
        f = p["factor"]
        seq = max_pos = p["max_position_embeddings"]
        base = base * ((f * seq / max_pos) - (f - 1)) ** (dim / (dim - 2))
    inv_freq = _default_inv_freq(base, dim)
    if kind == "linear":
        inv_freq /= p["factor"]
    elif kind == "llama3":
        inv_freq = _llama3(inv_freq, p)
    return inv_freq


def rotary_scaling(cfg: ModelConfig, local: bool = False) -> float:
    """The factor cos and sin are multiplied by (yarn's and longrope's attention factor; 1 otherwise)."""
    p = rope_params(cfg, local)
    return float(p.get("attention_factor") or 1.0) if p["rope_type"] in ("yarn", "longrope") else 1.0


def rotary_tables(inv_freq: torch.Tensor, positions: torch.Tensor,
                  scaling: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [B, 1, P, rotary_dim] for position ids [B, P], in ``inv_freq``'s dtype (float32 or wider)."""
    freqs = positions.float()[..., None] * inv_freq  # [B, P, dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if scaling != 1.0:
        cos, sin = cos * scaling, sin * scaling
    return cos[:, None], sin[:, None]  # [B, 1, P, dim]


def layer_rotary(model, positions: torch.Tensor) -> dict[bool, tuple[torch.Tensor, torch.Tensor]] | None:
    """Rotary tables for positions [B, P] keyed by whether a layer is a sliding one (None without rotary).

    Full and sliding layers share one table unless the model has a local schedule (Gemma 3)."""
    cfg = model.cfg
    if cfg.positional != "rotary":
        return None
    full = rotary_tables(model_inv_freq(model), positions, rotary_scaling(cfg))
    if cfg.rope_local is None:
        return {False: full, True: full}
    return {False: full, True: rotary_tables(model_inv_freq(model, True), positions, rotary_scaling(cfg, True))}


def model_inv_freq(model, local: bool = False) -> torch.Tensor:
    """``model``'s inverse frequencies (sliding layers' with ``local``) in the dtype its tables are computed in.

    The frequencies are HF's float32 values; angles, cos and sin are float32 (as HF computes them in every
    dtype) except in a float64 model, which takes them in float64 (exact angles pos × inv_freq)."""
    inv = model.inv_freq_local if local else model.inv_freq
    return inv.to(compute_dtype(model.dtype))


def rotary_of_layer(cfg: ModelConfig, rot: dict | None, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (cos, sin) ``layer`` rotates with, from :func:`layer_rotary`'s tables ``rot``; None where it does not
    rotate (no rotary embedding, or a NoPE layer: SmolLM3Attention skips apply_rotary_pos_emb where
    ``no_rope_layers[layer]`` is 0)."""
    if rot is None or not cfg.is_rotary(layer):
        return None
    return rot[cfg.is_sliding(layer)]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The last axis' halves swapped, the first negated: (x1, x2) -> (-x2, x1)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """Feature pairs (x_2i, x_2i+1) -> (-x_2i+1, x_2i): GPT-J's ``rotate_every_two``, Cohere's ``rotate_half``."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def apply_rotary(cfg: ModelConfig, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` [..., E] with its first ``rotary_dim`` features rotated (in float32, float64 for float64 ``x``; cast back).

    Interleaved models (``cfg.rotary_interleaved``: GPT-J, Cohere) rotate pairs (2i, 2i+1) with frequency i:
    their cos/sin are HF's ``repeat_interleave(freqs, 2)`` tables, the same values as the first half of
    the (freqs, freqs) tables here, so they are taken from it (bit-identical)."""
    rd = cfg.rotary_dim
    rot, rest = x[..., :rd], x[..., rd:]
    if cfg.rotary_interleaved:
        cos, sin = cos[..., : rd // 2].repeat_interleave(2, -1), sin[..., : rd // 2].repeat_interleave(2, -1)
    ct = compute_dtype(x.dtype)
    rot, cos, sin = rot.to(ct), cos.to(ct), sin.to(ct)
    if cfg.rotary_interleaved:
        rot = (rot * cos + rotate_every_two(rot) * sin).to(x.dtype)
    else:
        rot = (rot * cos + rotate_half(rot) * sin).to(x.dtype)
    return torch.cat((rot, rest), dim=-1) if rest.shape[-1] else rot
