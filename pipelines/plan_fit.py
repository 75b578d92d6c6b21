"""What a plan marks (``attribute --plan``): the limits a run meets on this machine, whether each priced method
fits them, the model's parameters and why its time is not calibrated. A plan never refuses a size: it prices what
does not fit here, for the machine a user would rent, and marks it (--allow-large is for running); and how a plan
writes a duration."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from circuitstat.circuits.plan import Cost

if TYPE_CHECKING:
    from circuitstat.circuits.model import CircuitModel

TIMING_BYTES = 2 * 2**30
"""Largest weights ``attribute --plan`` loads to time the passes (GPT-2 small is 0.5 GB); a larger model
(Gemma-2-2B: 5 GiB in bf16) is planned from its shapes alone, its time priced by FLOPs."""


@dataclass(frozen=True)
class Limits:
    """What a run may use here: ``memory`` bytes per worker (``memory_from`` says where the number comes from)
    and ``work`` FLOPs (None when --allow-large lifts it). A plan marks the rows above them; it never refuses."""

    memory: float
    memory_from: str
    work: float | None


def run_limits(budget: int | None, *, allow_large: bool, device: str = "cpu") -> Limits:
    """The Limits a run with these options meets: ``--max-memory`` when given, else the smaller of circuitstat's
    memory limit (circuitstat.circuits.limits.MAX_BYTES) and the device's own memory (the device's alone when
    --allow-large lifts the limit); the work limit (MAX_WORK) unless lifted."""
    from circuitstat.circuits.limits import MAX_BYTES, MAX_WORK

    work = None if allow_large else MAX_WORK
    if budget is not None:
        return Limits(float(budget), "--max-memory", work)
    own = float(device_memory(device))
    where = "this machine's memory" if device.startswith("cpu") else f"the memory of {device}"
    if allow_large or own < MAX_BYTES:
        return Limits(own, where, work)
    return Limits(float(MAX_BYTES), "circuitstat's limit; --allow-large lifts it", work)


def device_memory(device: str) -> int:
    """Bytes of memory on ``device``: a GPU's total memory, or this machine's physical memory on a CPU."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def fit_mark(cost: Cost, limits: Limits) -> str:
    """``yes`` when ``cost`` fits ``limits``, else ``no:`` and what it exceeds (``mem``, ``work``), one word."""
    over = [name for name, bad in (("mem", cost.memory_peak > limits.memory),
                                   ("work", limits.work is not None and cost.flops > limits.work)) if bad]
    return "yes" if not over else "no:" + "+".join(over)


def parameters_line(model: "CircuitModel") -> str:
    """The model's parameter count as its checkpoint stores them (circuitstat.circuits.skeleton.checkpoint_parameters)
    and the weights' memory in the model's dtype: as stored, and as CircuitModel holds them (K/V ungrouped)."""
    from circuitstat.circuits.limits import format_bytes
    from circuitstat.circuits.plan import weight_bytes

    n = getattr(model, "checkpoint_parameters", None)
    if n is None:
        n = sum(p.numel() for p in model.parameters())
    dtype, size = str(model.dtype).replace("torch.", ""), model.dtype.itemsize
    return (f"model: {n:,} parameters; weights {format_bytes(n * size)} in {dtype} as stored, "
            f"{format_bytes(weight_bytes(model.cfg, size))} as circuitstat holds them (K/V per query head)")


def limits_line(limits: Limits) -> str:
    """The legend of the table's ``fits`` column."""
    from circuitstat.circuits.limits import format_bytes

    work = "lifted by --allow-large" if limits.work is None else f"{limits.work:.3g} FLOPs (--allow-large lifts it)"
    return (f"fits: within memory {format_bytes(limits.memory)} per worker ({limits.memory_from}) and work {work}; "
            "no:mem / no:work rows are priced for a larger machine and would not run here as given")


def untimed_reason(model: "CircuitModel", source_directory: "Path | None" = None) -> str:
    """Why ``model`` (a skeleton of the model to plan) cannot be loaded and timed here: its directory holds no
    weights, or its weights exceed the memory limit or what a timing calibration loads; "" when it can be."""
    from circuitstat.circuits.limits import MAX_BYTES, format_bytes
    from circuitstat.circuits.loading import has_weights
    from circuitstat.circuits.plan import weight_bytes

    need = weight_bytes(model.cfg, model.dtype.itemsize)
    if source_directory is not None and not has_weights(source_directory):
        return "the directory holds no weights yet (config.json only)"
    if need > MAX_BYTES:
        return f"the weights ({format_bytes(need)}) exceed the memory limit of {format_bytes(MAX_BYTES)}"
    if need > TIMING_BYTES:  # loading and timing a multi-GB model would take minutes: a plan takes seconds
        return f"the weights ({format_bytes(need)}) are over the {format_bytes(TIMING_BYTES)} a timing calibration loads"
    return ""


def duration(seconds: float) -> str:
    """Return ``seconds`` as a short duration in s, min or h (three significant digits)."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"
