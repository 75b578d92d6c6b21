"""Task validation: the task error, and integer / token-id / flag checks that refuse to coerce."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from circuitstat.core.errors import InputError

MAX_ROWS_SHOWN = 10


class TaskValidationError(InputError):
    """A task's data is unusable; the message names the rows and the fix."""


def check_int(what: str, value: Any, minimum: int | None = None) -> int:
    """``value`` as an int; TaskValidationError when it is not an integer (a bool, a decimal number
    or a quoted number is refused, never coerced) or is below ``minimum``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TaskValidationError(f"{what} must be an integer, got a {type(value).__name__}; "
                                  "write it as a whole number without quotes or decimals")
    if minimum is not None and value < minimum:
        raise TaskValidationError(f"{what} must be at least {minimum}, got {int(value)}")
    return int(value)


def check_token_ids(what: str, values: Any) -> list[int]:
    """``values`` (a list of integer token ids) as ints; TaskValidationError naming the first entry
    that is not a non-negative integer (decimals are refused, not truncated)."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise TaskValidationError(f"{what} must be a list of integer token ids, got a {type(values).__name__}")
    out = []
    for i, v in enumerate(values):
        out.append(check_int(f"{what}[{i}]", v.item() if isinstance(v, np.generic) else v, minimum=0))
    return out


def check_bool(what: str, value: Any) -> bool:
    """``value`` as a bool; TaskValidationError when it is not true or false."""
    if not isinstance(value, (bool, np.bool_)):
        raise TaskValidationError(f"{what} must be true or false, got a {type(value).__name__}")
    return bool(value)


def rows_str(rows: Sequence[int]) -> str:
    """Row numbers (0-based indices) for a message, counted from 1 as a file's rows are and saying so: the first
    MAX_ROWS_SHOWN, then how many in all."""
    rows = list(rows)
    s = ", ".join(str(int(r) + 1) for r in rows[:MAX_ROWS_SHOWN])
    return s + (f", ... ({len(rows)} rows in all, counting from 1)" if len(rows) > MAX_ROWS_SHOWN
                else " (counting from 1)")


