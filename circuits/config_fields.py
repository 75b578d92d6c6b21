"""Refusing the fields of a Hugging Face config that a conversion does not reproduce, by name.

Every field of a family's config class is read by its conversion, known not to change an eval-mode
forward, or refused when it differs from the class default (circuitstat.circuits.convert and
circuitstat.circuits.convert_dense each pass the fields they read and those that are irrelevant).
"""

from __future__ import annotations

from circuitstat.core.errors import UnsupportedArchitectureError


def refuse(kind: str, field: str, value, fix: str) -> UnsupportedArchitectureError:
    """The error (exit 2) naming config field ``field`` of model type ``kind`` and its ``value``, with ``fix``."""
    return UnsupportedArchitectureError(
        f"{kind} config field {field}={value!r} is not reproduced by circuitstat; {fix}")


def check_unread_fields(c, known: set) -> None:
    """UnsupportedArchitectureError naming the first field of HF config ``c`` outside ``known`` (read or
    irrelevant) and transformers' base config whose value differs from the config class's default."""
    import transformers

    base = set(transformers.PretrainedConfig().to_dict())
    defaults = type(c)().to_dict()
    values = c.to_dict()
    for field in sorted(set(defaults) - base - known):
        if field in values and values[field] != defaults[field]:
            raise refuse(c.model_type, field, values[field], f"set it to its default {defaults[field]!r} or use another model")
