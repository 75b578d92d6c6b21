"""Reproducible parallel execution: joblib locally, the same code on a Dask cluster.

Work is split into fixed chunks before it is dispatched, and every chunk's randomness comes
from the run's seed and the chunk, never from the worker, so results do not depend on the
number of workers or on the scheduler.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

_CLIENT: contextvars.ContextVar = contextvars.ContextVar("circuitstat_dask_client", default=None)
"""The Dask client of the innermost :func:`backend` with a scheduler (None: joblib or serial)."""


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
    token = _CLIENT.set(client)
    try:
        with joblib.parallel_config(backend="dask"):
            yield max(1, len(client.scheduler_info().get("workers", {})) or n_jobs)
    finally:
        _CLIENT.reset(token)
        client.close()


def _connect(Client, scheduler: str, n_jobs: int):
    """A Dask client for ``scheduler`` ('local' starts n_jobs single-threaded workers); InputError
    when the address is malformed or nothing answers there."""
    from circuitstat.core.errors import InputError

    if scheduler == "local":
        return Client(n_workers=max(1, n_jobs), threads_per_worker=1, processes=True, dashboard_address=None)
    probe_scheduler(scheduler)  # a peer that is not a Dask scheduler is refused before Dask reads its bytes
    try:
        return Client(scheduler, timeout=CONNECT_TIMEOUT_S)
    except (OSError, ValueError, TypeError) as e:  # timeouts are OSErrors; a malformed address a ValueError
        raise InputError(f"cannot reach the Dask scheduler at {scheduler!r} ({type(e).__name__}); check the "
                         "address (tcp://HOST:PORT) and that the scheduler runs, or use --scheduler local") from None


CONNECT_TIMEOUT_S = float(os.environ.get("CIRCUITSTAT_SCHEDULER_TIMEOUT", 5))
"""Seconds to wait for a Dask scheduler (to connect, and for its first bytes) before the run is refused
(``CIRCUITSTAT_SCHEDULER_TIMEOUT`` overrides)."""

MAX_HANDSHAKE_BYTES = 2**20
"""Largest first message a Dask scheduler's handshake may announce (its own is a few hundred bytes)."""


def _address(scheduler: str) -> tuple[str, int] | None:
    """(host, port) of a ``tcp://HOST:PORT`` (or ``HOST:PORT``) address; None for Dask's other schemes."""
    from circuitstat.core.errors import InputError

    body = scheduler[len("tcp://"):] if scheduler.startswith("tcp://") else scheduler
    if "://" in body:
        return None  # tls://, ucx://, inproc://: Dask's own checks
    host, sep, port = body.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host.strip("[]"):
        raise InputError(f"--scheduler {scheduler!r} is not an address; give tcp://HOST:PORT (or 'local')")
    return host.strip("[]"), int(port)


def probe_scheduler(scheduler: str, timeout: float | None = None) -> None:
    """None when the peer at ``scheduler`` opens with a Dask handshake frame within ``timeout`` seconds (default
    :data:`CONNECT_TIMEOUT_S`); InputError naming the address otherwise: nothing listening, nothing said (a
    listener that never answers, or an HTTP server, which waits for a request), or bytes that are not Dask's
    framing (a length prefix above :data:`MAX_HANDSHAKE_BYTES`). A Dask scheduler writes its handshake first
    (distributed.comm.core: the listener's on_connection writes, then reads)."""
    import socket
    import struct
    import time

    from circuitstat.core.errors import InputError

    addr = _address(scheduler)
    if addr is None:
        return
    timeout = CONNECT_TIMEOUT_S if timeout is None else float(timeout)
    fix = "check the address (tcp://HOST:PORT) and that a Dask scheduler runs there, or use --scheduler local"
    head, deadline = b"", time.monotonic() + timeout
    try:
        with socket.create_connection(addr, timeout=timeout) as conn:
            while len(head) < 8 and time.monotonic() < deadline:
                conn.settimeout(max(deadline - time.monotonic(), 0.01))
                chunk = conn.recv(8 - len(head))
                if not chunk:
                    break
                head += chunk
    except socket.timeout:
        pass
    except OSError as e:
        raise InputError(f"cannot reach the Dask scheduler at {scheduler!r} ({e.strerror or type(e).__name__}); "
                         f"{fix}") from None
    if len(head) < 8:
        raise InputError(f"the peer at {scheduler!r} sent no Dask handshake within {timeout:g} s (it is not a Dask "
                         f"scheduler, or it does not answer); {fix}")
    (length,) = struct.unpack("Q", head)
    if not 0 < length <= MAX_HANDSHAKE_BYTES:
        raise InputError(f"the peer at {scheduler!r} answered, but not with Dask's protocol (its first bytes announce "
                         f"a {length:,}-byte message); {fix}")


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


def run_chunks(fn: Callable, chunks: Sequence[Any], n_jobs: int = 1, *args: Any, desc: str | None = None,
               on_result: Callable[[Any, Any], None] | None = None) -> list:
    """[fn(chunk, *args) for chunk in chunks], in order, in parallel when n_jobs > 1 or under Dask
    (serially with a progress bar named ``desc`` on a terminal); every path tells :func:`units_listener`'s
    listeners how many chunks are done.

    ``on_result(chunk, result)`` runs here, in the calling process, as each chunk finishes (in any order
    when parallel): callers store results there, so workers never write to the run directory and need
    no shared file system, and a lost worker costs only the chunks it had not returned. Results handed to
    ``on_result`` are not kept (the list holds what it returns: None from a writer), so a large run holds one chunk at a time here.
    """
    if _CLIENT.get() is not None:
        return _run_on_dask(_CLIENT.get(), fn, chunks, args, on_result, desc)
    if n_jobs == 1 and not _dask_active():
        from tqdm.auto import tqdm

        bar = tqdm(chunks, desc=desc, leave=False, disable=True if desc is None else None)  # None: on a tty only
        out = []
        _units(desc, 0, len(chunks))
        for c in bar:
            r = _single_threaded(fn, c, *args)
            out.append(r if on_result is None else on_result(c, r))
            _units(desc, len(out), len(chunks))
        return out
    import joblib  # only here: a one-worker run does not pay its import

    results: list = [None] * len(chunks)
    tagged = joblib.Parallel(n_jobs=n_jobs, return_as="generator_unordered")(
        joblib.delayed(_tagged)(i, fn, c, *args) for i, c in enumerate(chunks))
    _units(desc, 0, len(chunks))
    for done, (i, r) in enumerate(tagged, 1):
        results[i] = r if on_result is None else on_result(chunks[i], r)
        _units(desc, done, len(chunks))
    return results


def _tagged(i: int, fn: Callable, *args: Any) -> tuple[int, Any]:
    """(i, fn(*args) single-threaded): the chunk's index travels with its result."""
    return i, _single_threaded(fn, *args)


def _run_on_dask(client, fn: Callable, chunks: Sequence[Any], args: tuple, on_result, desc: str | None) -> list:
    """run_chunks on a Dask cluster: every non-scalar argument (the model, the task) is broadcast to each worker
    once and kept there for the whole call, not shipped with every chunk; results come back as they finish."""
    from distributed import as_completed

    # each non-scalar argument travels as its pickled bytes (Packed): Dask copies a scattered object between
    # workers by serialising the worker's own copy, which a task on that worker may be using at the time; a torch
    # module's dicts changing under that serialisation failed the copy ("dictionary changed size during
    # iteration"), and the task waiting for it on the other worker then waited forever. Bytes cannot change.
    shared = [a if isinstance(a, (int, float, str, bool, type(None))) else
              client.scatter(Packed.of(a), broadcast=True, hash=False) for a in args]
    futures = [client.submit(_run_unpacked, fn, c, *shared, pure=False) for c in chunks]
    where = {f.key: i for i, f in enumerate(futures)}
    results: list = [None] * len(chunks)
    _units(desc, 0, len(chunks))
    try:
        for done, fut in enumerate(as_completed(futures), 1):
            i = where[fut.key]
            r = fut.result()
            fut.release()
            results[i] = r if on_result is None else on_result(chunks[i], r)
            _units(desc, done, len(chunks))
    finally:
        client.cancel([f for f in futures if not f.done()])
        client.cancel([f for f in shared if hasattr(f, "key")])
    return results


class Packed:
    """An argument of a Dask run as its pickled bytes and a token naming it; each worker unpickles it once."""

    __slots__ = ("token", "blob")

    def __init__(self, token: str, blob: bytes) -> None:
        self.token, self.blob = token, blob

    def __reduce__(self) -> tuple:
        return (Packed, (self.token, self.blob))

    @classmethod
    def of(cls, value: Any) -> "Packed":
        """Return ``value`` pickled, with a new token."""
        import pickle
        import uuid

        return cls(uuid.uuid4().hex, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


_UNPACKED: dict[tuple[str, str], Any] = {}  # (worker, token) -> the unpickled argument, newest last
_UNPACKED_MAX = 8  # a run holds a few (the model, the task); older runs' arguments are dropped
_UNPACK_LOCK = threading.Lock()


def unpacked(value: Any) -> Any:
    """Return ``value``, or for a Packed argument its unpickled object: one per worker and token (a worker's tasks
    share it, as they shared a scattered object; two workers in one process each get their own)."""
    if not isinstance(value, Packed):
        return value
    import pickle

    try:
        from distributed import get_worker

        worker = get_worker().id
    except (ImportError, ValueError):
        worker = ""
    key = (worker, value.token)
    with _UNPACK_LOCK:
        if key not in _UNPACKED:
            _UNPACKED[key] = pickle.loads(value.blob)
            while len(_UNPACKED) > _UNPACKED_MAX:
                del _UNPACKED[next(iter(_UNPACKED))]
        return _UNPACKED[key]


def _run_unpacked(fn: Callable, chunk: Any, *args: Any) -> Any:
    """fn(chunk, *args) single-threaded, with its Packed arguments unpickled (a Dask task)."""
    return _single_threaded(fn, chunk, *(unpacked(a) for a in args))


def _dask_active() -> bool:
    import sys

    if "joblib" not in sys.modules:  # a Dask backend is set through joblib, so none can be active
        return False
    from joblib.parallel import get_active_backend

    backend_obj, _ = get_active_backend()
    return type(backend_obj).__name__.lower().startswith("dask")
