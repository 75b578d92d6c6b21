"""Reproducible parallel execution: joblib locally, the same code on a Dask cluster.

Work is split into fixed chunks before it is dispatched, and every chunk's randomness comes
from the run's seed and the chunk, never from the worker, so results do not depend on the
number of workers or on the scheduler.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any


@contextlib.contextmanager
def backend(n_jobs: int = 1, scheduler: str | None = None) -> Iterator[int]:
    """Context in which ``run_chunks`` uses joblib with ``n_jobs`` workers or a Dask cluster."""
    if scheduler is None:
        yield n_jobs
        return
    import joblib

    try:
        from distributed import Client
    except ImportError as e:
        from circuits.errors import InputError

        raise InputError("--scheduler needs Dask distributed, which is not installed: "
                         "pip install 'circuitstat[dask]' (or dask[distributed])") from e

    client = Client(scheduler) if scheduler != "local" else Client(n_workers=max(1, n_jobs), threads_per_worker=1,
                                                                     processes=True, dashboard_address=None)
    try:
        with joblib.parallel_config(backend="dask"):
            yield max(1, len(client.scheduler_info().get("workers", {})) or n_jobs)
    finally:
        client.close()


def _single_threaded(fn: Callable, *args: Any) -> Any:
    """fn(*args) with one torch thread, restored afterwards.

    Every chunk runs single-threaded wherever it runs (here, a joblib worker or a Dask worker),
    so floating-point reductions, and hence the tables, are the same for any n_jobs.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(before)


def run_chunks(fn: Callable, chunks: Sequence[Any], n_jobs: int = 1, *args: Any) -> list:
    """[fn(chunk, *args) for chunk in chunks], in order, in parallel when n_jobs > 1 or under Dask."""
    import joblib

    if n_jobs == 1 and not _dask_active():
        return [_single_threaded(fn, c, *args) for c in chunks]
    return joblib.Parallel(n_jobs=n_jobs)(joblib.delayed(_single_threaded)(fn, c, *args) for c in chunks)


def _dask_active() -> bool:
    from joblib.parallel import get_active_backend

    backend_obj, _ = get_active_backend()
    return type(backend_obj).__name__.lower().startswith("dask")
