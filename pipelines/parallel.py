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
        from circuitstat.core.errors import InputError

        raise InputError("--scheduler needs Dask distributed, which is not installed: "
                         "pip install 'circuitstat[dask]' (or dask[distributed])") from e

    client = _connect(Client, scheduler, n_jobs)
    try:
        with joblib.parallel_config(backend="dask"):
            yield max(1, len(client.scheduler_info().get("workers", {})) or n_jobs)
    finally:
        client.close()


def _connect(Client, scheduler: str, n_jobs: int):
    """A Dask client for ``scheduler`` ('local' starts n_jobs single-threaded workers); InputError
    when the address is malformed or nothing answers there."""
    from circuitstat.core.errors import InputError

    if scheduler == "local":
        return Client(n_workers=max(1, n_jobs), threads_per_worker=1, processes=True, dashboard_address=None)
    try:
        return Client(scheduler, timeout=CONNECT_TIMEOUT_S)
    except (OSError, ValueError, TypeError) as e:  # timeouts are OSErrors; a malformed address a ValueError
        raise InputError(f"cannot reach the Dask scheduler at {scheduler!r} ({type(e).__name__}); check the "
                         "address (tcp://HOST:PORT) and that the scheduler runs, or use --scheduler local") from None


CONNECT_TIMEOUT_S = 10
"""Seconds to wait for a Dask scheduler before the run is refused."""


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Context with one torch thread and one BLAS/OpenMP thread (threadpoolctl), restored afterwards.

    Every stage and chunk runs single-threaded wherever it runs (here, a joblib worker or a Dask
    worker): floating-point reductions, and hence the tables, are the same for any n_jobs, and
    workers on a busy machine do not oversubscribe its cores.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with _blas_one_thread():
            yield
    finally:
        torch.set_num_threads(before)


def _blas_one_thread():
    """threadpoolctl's one-thread limit on BLAS/OpenMP pools (numpy, scipy); a no-op without it."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # an optional dependency (scikit-learn brings it); torch is pinned regardless
        return contextlib.nullcontext()
    return threadpool_limits(limits=1)


def _single_threaded(fn: Callable, *args: Any) -> Any:
    """fn(*args) inside :func:`single_threaded`."""
    with single_threaded():
        return fn(*args)


_UNITS: list[Callable[[str | None, int, int], None]] = []


@contextlib.contextmanager
def units_listener(fn: Callable[[str | None, int, int], None]) -> Iterator[None]:
    """Context in which serial ``run_chunks`` calls ``fn(desc, done, total)`` before its first chunk and after each
    one: a stage's own work units (the service records them as the running job's progress)."""
    _UNITS.append(fn)
    try:
        yield
    finally:
        _UNITS.remove(fn)


def _units(desc: str | None, done: int, total: int) -> None:
    for fn in _UNITS:
        fn(desc, done, total)


def run_chunks(fn: Callable, chunks: Sequence[Any], n_jobs: int = 1, *args: Any, desc: str | None = None) -> list:
    """[fn(chunk, *args) for chunk in chunks], in order, in parallel when n_jobs > 1 or under Dask
    (serially with a progress bar named ``desc`` on a terminal, telling :func:`units_listener`'s listeners)."""
    if n_jobs == 1 and not _dask_active():
        from tqdm.auto import tqdm

        bar = tqdm(chunks, desc=desc, leave=False, disable=True if desc is None else None)  # None: on a tty only
        out = []
        _units(desc, 0, len(chunks))
        for c in bar:
            out.append(_single_threaded(fn, c, *args))
            _units(desc, len(out), len(chunks))
        return out
    import joblib  # only here: a one-worker run does not pay its import

    return joblib.Parallel(n_jobs=n_jobs)(joblib.delayed(_single_threaded)(fn, c, *args) for c in chunks)


def _dask_active() -> bool:
    import sys

    if "joblib" not in sys.modules:  # a Dask backend is set through joblib, so none can be active
        return False
    from joblib.parallel import get_active_backend

    backend_obj, _ = get_active_backend()
    return type(backend_obj).__name__.lower().startswith("dask")
