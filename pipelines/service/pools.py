"""Where jobs run: a pool of local worker processes, or a Dask distributed cluster.

Both run :func:`circuitstat.pipelines.service.runner.execute` on a plain payload and report each job's outcome
through :meth:`poll`; only the dispatcher thread calls them. Workers touch the data directory, never
the database.

The local pool forks its workers from a forkserver that imported torch and the CLI's runners once,
so a new worker is ready at once and a job does not pay the import. Each worker holds a lifeline
pipe to the server: when the server dies (even by SIGKILL) the pipe closes and the worker exits
at once, releasing its run directory. A worker that dies is replaced and its job reported as
``died`` (the dispatcher requeues it: it resumes from its run directory).

On Dask, the data directory must be shared by the server and the workers (the same path), and each
worker should run one thread (a job's log is its process's stdout). Dask reschedules a task whose
worker died by itself (the job then resumes from its run directory); cancelling or draining a
running Dask job releases it, and its result, if it still comes, is discarded.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from circuitstat.pipelines.kinds import SERVED, module_of

PRELOAD = ["torch", "transformers", "circuitstat.circuits.loading", "circuitstat.circuits.attribution",
           *(module_of(k) for k in SERVED), "circuitstat.reports.html", "circuitstat.pipelines.service.runner",
           "circuitstat.pipelines.service.warmup"]
"""What the forkserver imports before it forks a worker: the modules of every run kind the service runs (the runner
calls their ``KIND.run``, as the CLI does), the report's renderer, and the warm-up (last: it runs a tiny audit)."""


def _watch_lifeline(lifeline) -> None:
    """Exit the worker as soon as the server's end of the lifeline closes (the server is gone)."""
    with contextlib.suppress(EOFError, OSError):
        lifeline.recv()
    os._exit(1)


def worker_main(conn, lifeline) -> None:
    """A worker process: run each job payload received on ``conn`` and send back its outcome."""
    from .runner import execute

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a drain interrupts the job: KeyboardInterrupt
    threading.Thread(target=_watch_lifeline, args=(lifeline,), daemon=True).start()
    conn.send({"ready": os.getpid()})
    while True:
        try:
            job = conn.recv()
        except KeyboardInterrupt:  # an interrupt that arrived between jobs
            continue
        except EOFError:
            return
        if job is None:
            return
        conn.send(execute(job))


@dataclass
class _Slot:
    process: Any
    conn: Any
    lifeline: Any
    ready: bool = False
    job_id: str | None = None
    aborted: str | None = None


@dataclass
class LocalPool:
    """``n`` local worker processes, one job each at a time."""

    n: int
    slots: list[_Slot] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(PRELOAD)
        self.slots = [self._spawn() for _ in range(self.n)]

    def _spawn(self) -> _Slot:
        parent, child = self.ctx.Pipe()
        life_r, life_w = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=worker_main, args=(child, life_r), daemon=True, name="circuitstat-worker")
        proc.start()
        child.close()
        life_r.close()
        return _Slot(proc, parent, life_w)

    def ready(self) -> int:
        """Workers started and waiting for or running a job."""
        self._read_ready()
        return sum(s.ready for s in self.slots)

    def _read_ready(self) -> None:
        for s in self.slots:
            if not s.ready and s.job_id is None and s.conn.poll():
                with contextlib.suppress(EOFError, OSError):
                    s.ready = "ready" in s.conn.recv()

    def free(self) -> int:
        """Workers ready for a job now."""
        self._read_ready()
        return sum(s.ready and s.job_id is None for s in self.slots)

    def start(self, job: dict) -> str:
        """Send ``job`` to a free worker; a description of that worker."""
        slot = next(s for s in self.slots if s.ready and s.job_id is None)
        slot.conn.send(job)
        slot.job_id, slot.aborted = job["job_id"], None
        return f"{socket.gethostname()} pid {slot.process.pid}"

    def pid_of(self, job_id: str) -> int | None:
        """The pid of the worker running ``job_id`` (None if none does)."""
        return next((s.process.pid for s in self.slots if s.job_id == job_id), None)

    def poll(self) -> list[tuple[str, dict]]:
        """(job id, outcome) of every job that ended since the last call; dead workers are replaced."""
        out = []
        for i, s in enumerate(self.slots):
            if s.job_id is None:
                if not s.process.is_alive():
                    self._replace(i)
                continue
            outcome = None
            try:
                if s.conn.poll():
                    outcome = s.conn.recv()
            except (EOFError, OSError):
                outcome = None
            if outcome is None and s.process.is_alive():
                continue
            if outcome is None:
                outcome = {"status": s.aborted or "died", "error": f"worker pid {s.process.pid} died "
                           f"(exit code {s.process.exitcode})"}
                self._replace(i)
            out.append((s.job_id, outcome))
            if i < len(self.slots) and self.slots[i] is s:
                s.job_id = None
        return out

    def _replace(self, i: int) -> None:
        old = self.slots[i]
        with contextlib.suppress(OSError):
            old.conn.close()
            old.lifeline.close()
        old.process.join(timeout=1)
        self.slots[i] = self._spawn()

    def abort(self, job_id: str, why: str = "aborted") -> None:
        """Stop ``job_id`` now (SIGKILL its worker); poll reports it with status ``why``."""
        for s in self.slots:
            if s.job_id == job_id:
                s.aborted = why
                with contextlib.suppress(ProcessLookupError):
                    os.kill(s.process.pid, signal.SIGKILL)

    def interrupt(self, job_id: str) -> None:
        """Ask ``job_id`` to stop at once (SIGINT): its run directory keeps every finished stage."""
        pid = self.pid_of(job_id)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)

    def close(self) -> None:
        """Stop every worker."""
        for s in self.slots:
            with contextlib.suppress(OSError, BrokenPipeError):
                s.conn.send(None)
        for s in self.slots:
            s.process.join(timeout=5)
            if s.process.is_alive():
                s.process.kill()
                s.process.join(timeout=5)
            with contextlib.suppress(OSError):
                s.lifeline.close()


class DaskPool:
    """Jobs as tasks on a Dask distributed cluster (one task per job attempt)."""

    def __init__(self, address: str, timeout: float = 10.0) -> None:
        from distributed import Client

        from circuitstat.core.errors import InputError

        try:
            self.client = Client(address, timeout=timeout)
        except (OSError, ValueError, TypeError) as e:
            raise InputError(f"cannot reach the Dask scheduler at {address!r} ({type(e).__name__}); check the address "
                             "(tcp://HOST:PORT) and that the scheduler runs") from None
        self.futures: dict[str, Any] = {}
        self.aborted: dict[str, str] = {}
        self._threads, self._asked = 0, 0.0

    def ready(self) -> int:
        """Worker threads in the cluster (asked of the scheduler at most once a second)."""
        import time

        if time.monotonic() - self._asked > 1.0:
            self._threads, self._asked = sum(self.client.nthreads().values()), time.monotonic()
        return self._threads

    def free(self) -> int:
        """Worker threads not busy with one of this server's jobs."""
        return max(0, self.ready() - len(self.futures))

    def start(self, job: dict) -> str:
        """Submit ``job`` as a task; a description of where it runs."""
        from .runner import execute

        self.futures[job["job_id"]] = self.client.submit(execute, job, pure=False, key=f"circuitstat-{job['job_id']}-"
                                                         f"{os.urandom(4).hex()}")
        return f"dask {self.client.scheduler.address}"

    def pid_of(self, job_id: str) -> int | None:
        """Unknown on a cluster: None."""
        return None

    def poll(self) -> list[tuple[str, dict]]:
        """(job id, outcome) of every task that ended since the last call."""
        out = []
        for job_id, fut in list(self.futures.items()):
            if job_id in self.aborted:
                out.append((job_id, {"status": self.aborted.pop(job_id)}))
            elif fut.status == "finished":
                out.append((job_id, fut.result()))
            elif fut.status in ("error", "cancelled", "lost"):
                exc = fut.exception() if fut.status == "error" else None
                out.append((job_id, {"status": "died", "error": f"the Dask task ended: {type(exc).__name__ if exc else fut.status}"}))
            else:
                continue
            del self.futures[job_id]
        return out

    def abort(self, job_id: str, why: str = "aborted") -> None:
        """Release the job's task (a running Dask task cannot be stopped; its result is discarded)."""
        fut = self.futures.get(job_id)
        if fut is not None:
            fut.cancel()
            self.aborted[job_id] = why

    def interrupt(self, job_id: str) -> None:
        """As abort, reported as interrupted (the job is requeued and resumes from its run directory)."""
        self.abort(job_id, "interrupted")

    def close(self) -> None:
        """Disconnect from the scheduler."""
        self.client.close()


def make_pool(scheduler: str | None, workers: int):
    """A DaskPool when a scheduler address is given, a LocalPool of ``workers`` processes otherwise."""
    return DaskPool(scheduler) if scheduler else LocalPool(workers)
