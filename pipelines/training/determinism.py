"""Torch deterministic algorithms (CUDA too) and a fixed thread count for the span of one training run."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

__all__ = ["use_deterministic"]


@contextlib.contextmanager
def deterministic(threads: int) -> Iterator[None]:
    """Return a context in which torch runs deterministic algorithms on ``threads`` threads (restored on exit)."""
    import torch

    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_threads = torch.get_num_threads()
    use_deterministic(warn_only=False)
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        _set_deterministic(prev_det, prev_warn)
        torch.set_num_threads(prev_threads)


def use_deterministic(warn_only: bool = True) -> None:
    """Switch torch to deterministic algorithms for the rest of the process, valid on CUDA too.

    cuBLAS is deterministic only with a fixed workspace (``CUBLAS_WORKSPACE_CONFIG``), read when
    cuBLAS initialises, so it is set here, before any model is loaded (a user's own value wins).
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    _set_deterministic(True, warn_only=warn_only)


def _set_deterministic(mode: bool, warn_only: bool = False) -> None:
    """``torch.use_deterministic_algorithms`` without its import of torch._inductor (seconds per
    process in torch 2.13); the inductor flag is set too when inductor is already loaded."""
    import sys

    import torch

    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        setter(mode, warn_only=warn_only)
