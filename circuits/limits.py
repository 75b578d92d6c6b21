"""Limits on memory and work, checked before a computation starts.

Inputs come from files written by others (specs, claims, model configs): a size that would need
petabytes, or a seed range of a hundred million, must be refused with a one-line error before
anything is allocated or written. The command line's ``--allow-large`` lifts the limits (a file
cannot lift them for itself).
"""

from __future__ import annotations

import math
import os
import re

from circuitstat.core.errors import InputError

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


MAX_WORK = float(os.environ.get("CIRCUITSTAT_MAX_WORK", 1e15))
"""Default limit on the estimated work of one run: 1e15 arithmetic operations (about a day on two CPU
cores, minutes on a large GPU); ``CIRCUITSTAT_MAX_WORK`` overrides it, ``--allow-large`` lifts it."""


def check_range(value: int | float, minimum: int | float, maximum: int | float, what: str, *,
                allow_large: bool = False) -> None:
    """None; raises InputError naming the minimum and maximum when ``value`` (``what``) lies outside them.

    The minimum is what the computation needs and always holds; the maximum is a work limit that
    ``allow_large`` lifts (a file can never lift it for itself).
    """
    if value < minimum or (value > maximum and not allow_large):
        raise InputError(f"{what} is {value:,}; use {minimum:,} to {maximum:,} (pass {LIFT} to lift the maximum)")


def check_work(operations: float, what: str, *, allow_large: bool = False, limit: float | None = None,
               shrink: str = "") -> None:
    """None; raises InputError when ``what`` is estimated to need more than ``limit`` operations (default
    :data:`MAX_WORK`), naming the estimate, the maximum and what to shrink, before any work starts."""
    limit = MAX_WORK if limit is None else limit
    if allow_large or operations <= limit:
        return
    how = f"shrink {shrink}" if shrink else "make it smaller"
    raise InputError(f"{what} needs about {operations:.2g} operations, above the maximum of {limit:.2g} for one run; "
                     f"{how}, or pass {LIFT} to lift the limit")


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """Bytes in a size such as ``'2GiB'``, ``'512MB'``, ``'1.5g'`` or ``'1000000'``; InputError otherwise."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise InputError(f"memory size {text!r} is not a size; write it like 2GiB, 512MiB, 8GB or a number of bytes")
    value = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(value) or value < 1:
        raise InputError(f"memory size {text!r} must be at least one byte; write it like 2GiB, 512MiB or 8GB")
    return int(value)


def machine_memory(device: str | None = None) -> int | None:
    """Bytes of this machine's physical memory (and, for a CUDA ``device``, that device's if larger);
    None where the platform does not say."""
    try:
        total = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        total = None
    if device is not None and str(device).startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            total = max(total or 0, int(torch.cuda.get_device_properties(torch.device(device)).total_memory))
    return total


def check_budget(nbytes: int, option: str = "--max-memory", device: str | None = None) -> int:
    """``nbytes`` when a memory budget fits the machine (:func:`machine_memory`); InputError naming both
    otherwise (a budget above the memory there is would be planned for and then fail)."""
    have = machine_memory(device)
    if have is not None and nbytes > have:
        raise InputError(f"{option} {format_bytes(nbytes)} is more than this machine's memory ({format_bytes(have)}); "
                         f"give at most {format_bytes(have)}")
    return nbytes


def check_fits_device(weights: int, device: str) -> None:
    """None when a model's ``weights`` (bytes) fit on ``device``; InputError otherwise (a CUDA device only).

    circuitstat keeps the whole model on one device and never splits it (no ``device_map``): every worker of a
    run holds its own copy, so a model larger than one device is refused here, before its weights are read."""
    if not str(device).startswith("cuda"):
        return
    import torch

    have = int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    if weights > have:
        raise InputError(f"the model's weights ({format_bytes(weights)}) do not fit on {device} ({format_bytes(have)}): "
                         "circuitstat keeps a whole model on one device and does not split it across devices; use a "
                         "device with more memory or a smaller --dtype (bfloat16 halves float32), and see --plan's "
                         "memory column (per worker and device)")
