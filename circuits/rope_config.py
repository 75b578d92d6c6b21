"""The rotary schedule of a Hugging Face config as ModelConfig fields (``rotary_base``, ``rope``,
``rope_local``, ``rope_max_positions``), resolved the way transformers 5 resolves it.

transformers 5 keeps ``config.rope_parameters`` standardised (``RotaryEmbeddingConfigMixin``):
one dict, or one per layer type (Gemma 3: ``sliding_attention`` and ``full_attention``).  Each
type's defaults are resolved here as ``modeling_rope_utils._compute_*_parameters`` resolves them
(yarn's and longrope's ``factor`` and ``attention_factor``), so the engine
(:mod:`circuitstat.circuits.engine.rotary`) needs no HF config.  A rope type transformers has but circuitstat
does not reproduce, or a parameter a type does not use, is refused by name.
"""

from __future__ import annotations

import math

from circuitstat.core.errors import UnsupportedArchitectureError

# parameters each rope type reads (modeling_rope_utils, _validate_*_rope_parameters)
_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "yarn": {"factor", "attention_factor", "beta_fast", "beta_slow", "original_max_position_embeddings",
             "mscale", "mscale_all_dim", "truncate"},
    "longrope": {"short_factor", "long_factor", "factor", "attention_factor", "original_max_position_embeddings"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
}
_ALWAYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}


def _yarn_attention_factor(p: dict, factor: float) -> float:
    """_compute_yarn_parameters' attention_factor (get_mscale)."""
    def mscale(scale, m=1):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if p.get("attention_factor") is not None:
        return float(p["attention_factor"])
    if p.get("mscale") and p.get("mscale_all_dim"):
        return float(mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"]))
    return float(mscale(factor))


def _one(c, p: dict, where: str) -> tuple[dict | None, int | None]:
    """(ModelConfig rope dict or None for default, longest prompt it is exact for or None) of one schedule."""
    kind = p.get("rope_type", p.get("type", "default"))
    if kind not in _KEYS:
        raise UnsupportedArchitectureError(
            f"{c.model_type} config field {where}.rope_type={kind!r} is not reproduced by circuitstat; "
            f"supported rope types: {', '.join(_KEYS)}")
    extra = sorted(k for k, v in p.items() if k not in _KEYS[kind] | _ALWAYS and v is not None)
    if extra:
        raise UnsupportedArchitectureError(
            f"{c.model_type} config field {where}.{extra[0]} is not reproduced by circuitstat for rope_type {kind!r}; "
            "remove it")
    if kind == "default":
        return None, None
    out: dict = {"rope_type": kind}
    limit = None
    if kind in ("linear", "dynamic"):
        out["factor"] = float(p["factor"])
    if kind == "dynamic":  # exact up to max_position_embeddings (HF grows the base beyond it)
        out["max_position_embeddings"] = limit = int(c.max_position_embeddings)
    if kind == "llama3":
        out.update({k: p[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                      "original_max_position_embeddings")})
    if kind == "yarn":
        original = int(p["original_max_position_embeddings"])
        factor = p.get("factor") or c.max_position_embeddings / original
        # _compute_yarn_parameters reads truncate from the top-level rope_parameters
        truncate = (getattr(c, "rope_parameters", None) or {}).get("truncate", True)
        out.update(factor=float(factor), original_max_position_embeddings=original, truncate=bool(truncate),
                   beta_fast=p.get("beta_fast"), beta_slow=p.get("beta_slow"),
                   attention_factor=_yarn_attention_factor(p, factor))
    if kind == "longrope":  # exact up to original_max_position_embeddings (HF switches to long_factor beyond)
        original = int(p["original_max_position_embeddings"])
        factor = p.get("factor") or c.max_position_embeddings / original
        attention = p.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        out.update(short_factor=[float(x) for x in p["short_factor"]], attention_factor=float(attention))
        limit = original
    return out, limit


def rope_fields(c) -> dict:
    """ModelConfig keyword arguments for the rotary schedule(s) of HF config ``c``."""
    rope = dict(getattr(c, "rope_parameters", None) or {})
    nested = isinstance(rope.get("full_attention"), dict) or isinstance(rope.get("sliding_attention"), dict)
    full = rope.get("full_attention", {}) if nested else rope
    theta = float(full.get("rope_theta", getattr(c, "rope_theta", 10000.0)))
    schedule, limit = _one(c, full, "rope_parameters.full_attention" if nested else "rope_parameters")
    out = {"rotary_base": theta, "rope": schedule, "rope_local": None, "rope_max_positions": limit}
    if nested and isinstance(rope.get("sliding_attention"), dict):
        local = rope["sliding_attention"]
        if local.get("partial_rotary_factor", 1.0) != full.get("partial_rotary_factor", 1.0):
            raise UnsupportedArchitectureError(
                f"{c.model_type} config field rope_parameters.sliding_attention.partial_rotary_factor differs from the "
                "full-attention layers'; not reproduced by circuitstat")
        local_schedule, local_limit = _one(c, local, "rope_parameters.sliding_attention")
        local_theta = float(local.get("rope_theta", theta))
        if local_schedule != schedule or local_theta != theta:
            out["rope_local"] = {**(local_schedule or {"rope_type": "default"}), "rope_theta": local_theta}
        if local_limit is not None:
            out["rope_max_positions"] = min(x for x in (limit, local_limit) if x is not None)
    return out
