"""Torch threads per call: one thread for small work, up to the cores for large work, or what the user set.

torch starts with one intra-op thread per physical core. On a tiny model every matrix product is too
small to split, and on a loaded machine the extra threads wait for cores other processes hold: one
``faithfulness(...)`` call on a zoo-sized model took 28 s with torch's default threads on a loaded
2-core machine and 0.6 s with one thread (issue 23). ``bench/threads.py`` measures the rule below as
ratios within one run (docs/benchmarks-threads.md):

* ``CIRCUITSTAT_THREADS=N`` (or ``OMP_NUM_THREADS=N``, which torch reads at start-up), or a
  ``torch.set_num_threads(N)`` made after circuitstat was imported, is used as given;
* otherwise ``threads = clamp(flops // MIN_FLOPS_PER_THREAD, 1, idle cores)``: a call whose forward
  pass over one batch costs fewer than ``MIN_FLOPS_PER_THREAD`` per thread runs on fewer threads, and
  never on more than the cores other processes leave idle (the cores this process may use, at most
  torch's default, less the 1-minute load average beyond this process's own one). On the loaded 2-core
  machine two threads were 2.7-9.3x slower than one for every call up to GPT-2-small size, and 0.8x to
  4.3x on GPT-2 small itself from one run to the next: one thread there costs at most 1.25x.

The setting is restored when the call returns. The CLI runs every stage single-threaded already
(circuitstat.pipelines.parallel.single_threaded), which counts as an explicit setting here.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Callable, Iterator

import torch

ENV = "CIRCUITSTAT_THREADS"
MIN_FLOPS_PER_THREAD = 1e10
"""Forward-pass FLOPs of one batch below which a second thread does not pay (bench/threads.py)."""

_AT_IMPORT = torch.get_num_threads()  # torch's default (or OMP_NUM_THREADS), before any call of ours


def available_cores() -> int:
    """Cores this process may run on: its CPU affinity, at most torch's default thread count."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, _AT_IMPORT))


def idle_cores() -> int:
    """Cores not busy with other processes: available_cores() less the 1-minute load average beyond one
    (this process's own thread), at least 1."""
    cores = available_cores()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this platform: assume an idle machine
        return cores
    return max(1, min(cores, round(cores + 1 - load)))


def explicit_threads() -> int | None:
    """The thread count the user chose (CIRCUITSTAT_THREADS, OMP_NUM_THREADS, or a torch.set_num_threads
    since import), or None when torch runs on its default."""
    value = os.environ.get(ENV)
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            from circuitstat.core.errors import InputError

            raise InputError(f"{ENV}={value!r} is not a number of threads; set it to an integer such as 1") from None
    if os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads() != _AT_IMPORT:
        return torch.get_num_threads()
    return None


def threads_for(flops: float) -> int:
    """The threads for a call whose forward pass over one batch costs ``flops`` (see the module doc)."""
    chosen = explicit_threads()
    if chosen is not None:
        return chosen
    return int(min(idle_cores(), max(1, flops // MIN_FLOPS_PER_THREAD)))


def batch_flops(model: Any, data: Any, batch_size: int) -> float:
    """FLOPs of one forward pass of ``model`` over a batch of ``batch_size`` examples of ``data``."""
    from .plan import forward_flops

    positions = int(data.clean.shape[1])
    return float(min(int(batch_size), int(data.clean.shape[0]))) * forward_flops(model.cfg, positions)


@contextlib.contextmanager
def call_threads(threads: int) -> Iterator[None]:
    """Context with ``threads`` torch threads, the previous count restored afterwards."""
    before = torch.get_num_threads()
    if threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def sized_threads(fn: Callable) -> Callable:
    """Decorator for ``fn(model, data, ..., batch_size=...)``: run it on :func:`threads_for` its batch's work."""
    import inspect

    default = inspect.signature(fn).parameters["batch_size"].default

    @functools.wraps(fn)
    def wrapper(model, data, *args, **kwargs):
        try:
            flops = batch_flops(model, data, kwargs.get("batch_size", default))
        except AttributeError:  # not a CircuitModel or not pair data: fn itself says what is wrong
            return fn(model, data, *args, **kwargs)
        with call_threads(threads_for(flops)):
            return fn(model, data, *args, **kwargs)

    return wrapper
