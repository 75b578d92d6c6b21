"""Ranges of the real-valued fields of a Hugging Face config, checked by name before a model is built.

A config.json (or a ``random:`` spec) is someone else's file: a ``query_pre_attn_scalar`` of 0 divides
by zero inside transformers, a ``partial_rotary_factor`` of -1 gives a negative rotary width, and a
linear rope factor of 1e308 or -1 runs to the end with finite, meaningless scores.  Each field here is
refused by name, with its range, before transformers or the converter reads it.  The rope ranges follow
transformers' own validation (modeling_rope_utils: every ``factor`` >= 1, ``high_freq_factor`` above
``low_freq_factor``), which only warns; here they are errors.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from circuitstat.core.errors import InputError

__all__ = ["SCALARS", "ROPE_SCALARS", "MAX_ROPE_FACTOR", "check_config_values", "check_rope_parameters"]

INF = math.inf
MAX_ROPE_FACTOR = 1e6
"""Largest rope ``factor`` accepted: a million-fold stretch of the positions (published models use 2 to 64)."""

# key: (low, high, low is allowed); None is always allowed (the family's default applies)
SCALARS: dict[str, tuple[float, float, bool]] = {
    "query_pre_attn_scalar": (0.0, INF, False),  # Gemma: attention scores scale by its -1/2 power
    "partial_rotary_factor": (0.0, 1.0, False),  # share of each head's dimensions that rotate
    "rotary_pct": (0.0, 1.0, False),  # GPT-NeoX's name for it
    "rope_theta": (0.0, INF, False),
    "rotary_emb_base": (0.0, INF, False),
    "attn_logit_softcapping": (0.0, INF, False),
    "final_logit_softcapping": (0.0, INF, False),
    # Granite: scales of the embeddings, attention scores, residual writes; logits are divided by logits_scaling
    "embedding_multiplier": (0.0, INF, False),
    "attention_multiplier": (0.0, INF, False),
    "residual_multiplier": (0.0, INF, False),
    "logits_scaling": (0.0, INF, False),
    "clip_qkv": (0.0, INF, False),  # OLMo 1: q, k and v clamped to [-clip_qkv, clip_qkv]
}
ROPE_SCALARS: dict[str, tuple[float, float, bool]] = {
    "rope_theta": (0.0, INF, False),
    "partial_rotary_factor": (0.0, 1.0, False),
    "factor": (1.0, MAX_ROPE_FACTOR, True),
    "attention_factor": (0.0, INF, False),
    "beta_fast": (0.0, INF, False),
    "beta_slow": (0.0, INF, False),
    "mscale": (0.0, INF, True),
    "mscale_all_dim": (0.0, INF, True),
    "low_freq_factor": (0.0, INF, False),
    "high_freq_factor": (0.0, INF, False),
    "original_max_position_embeddings": (1.0, INF, True),
}


def _check(key: str, value: Any, bounds: tuple[float, float, bool], where: str) -> None:
    """None; InputError naming ``key`` and its range when ``value`` is not a finite number inside it."""
    low, high, closed = bounds
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and math.isfinite(value) and (low <= value if closed else low < value) and value <= high:
        return
    lower = f"{low:g} <=" if closed else f"{low:g} <"
    upper = f" <= {high:g}" if math.isfinite(high) else " (finite)"
    shown = repr(value) if number else f"a {type(value).__name__}"
    raise InputError(f"{where}: {key}={shown} is out of range; use {lower} {key.rsplit('.', 1)[-1]}{upper}; "
                     f"fix {key}")


def check_rope_parameters(p: Any, where: str, prefix: str = "rope_parameters") -> None:
    """None; InputError naming the field when a rope schedule (one dict, or one per layer type) holds a
    value out of range: a non-finite or non-positive ``rope_theta``, a ``factor`` below 1 or above
    :data:`MAX_ROPE_FACTOR`, ``high_freq_factor`` not above ``low_freq_factor``, a non-positive
    long/short factor."""
    if not isinstance(p, Mapping):
        if p is not None:
            raise InputError(f"{where}: {prefix} must be a mapping of rope settings; fix {prefix}")
        return
    for key, value in p.items():
        name = f"{prefix}.{key}"
        if isinstance(value, Mapping):  # one schedule per layer type (Gemma 3)
            check_rope_parameters(value, where, name)
        elif key in ROPE_SCALARS and value is not None:
            _check(name, value, ROPE_SCALARS[key], where)
        elif key in ("short_factor", "long_factor") and value is not None:
            if not isinstance(value, (list, tuple)) or not value:
                raise InputError(f"{where}: {name} must be a list of positive numbers; fix {name}")
            for i, x in enumerate(value):
                _check(f"{name}[{i}]", x, (0.0, INF, False), where)
    low, high = p.get("low_freq_factor"), p.get("high_freq_factor")
    if low is not None and high is not None and not high > low:
        raise InputError(f"{where}: {prefix}.high_freq_factor={high!r} must be above {prefix}.low_freq_factor={low!r}; "
                         f"fix {prefix}")


def check_config_values(values: Mapping, where: str) -> None:
    """None; InputError naming the first real-valued config field (:data:`SCALARS`, the rope settings
    under ``rope_parameters`` or its old name ``rope_scaling``) whose value is out of range."""
    for key, bounds in SCALARS.items():
        if values.get(key) is not None:
            _check(key, values[key], bounds, where)
    for key in ("rope_parameters", "rope_scaling"):
        check_rope_parameters(values.get(key), where, key)
