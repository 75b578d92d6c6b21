"""Limits on memory and work, checked before a computation starts.

Inputs come from files written by others (specs, claims, model configs): a size that would need
petabytes, or a seed range of a hundred million, must be refused with a one-line error before
anything is allocated or written. The command line's ``--allow-large`` lifts the limits (a file
cannot lift them for itself).
"""

from __future__ import annotations

import os

from reports.errors import InputError

MAX_BYTES = float(os.environ.get("CIRCUITSTAT_MAX_BYTES", 16 * 2**30))
"""Default memory limit for one allocation plan: 16 GiB (``CIRCUITSTAT_MAX_BYTES`` overrides)."""

LIFT = "--allow-large"


def format_bytes(n: float) -> str:
    """``n`` bytes as a short human-readable string (e.g. ``'3.2 GiB'``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} PiB"


def check_bytes(nbytes: float, what: str, *, allow_large: bool = False, limit: float | None = None) -> None:
    """None; raises InputError when ``what`` needs more than ``limit`` bytes and the limit is not lifted."""
    limit = MAX_BYTES if limit is None else limit
    if allow_large or nbytes <= limit:
        return
    raise InputError(f"{what} needs about {format_bytes(nbytes)} of memory, above the limit of "
                     f"{format_bytes(limit)}; make it smaller, or pass {LIFT} to lift the limit")


def check_count(n: float, limit: float, what: str, *, allow_large: bool = False) -> None:
    """None; raises InputError when a count (``what``) exceeds ``limit`` and the limit is not lifted."""
    if allow_large or n <= limit:
        return
    raise InputError(f"{what} is {n:,.0f}, above the limit of {limit:,.0f}; make it smaller, or pass {LIFT} "
                     "to lift the limit")
