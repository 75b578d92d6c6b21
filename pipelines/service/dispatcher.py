"""The server's job loop: claim queued jobs into the pool, keep their leases, record how they end.

One thread per server runs :meth:`Dispatcher.tick` every ``poll_seconds``; it is the only code
that talks to the pool. On each heartbeat (a third of the lease) it renews the leases of the jobs it
runs, stops any whose lease another server took over, stops the ones their owners cancelled,
records progress from their run directories, and requeues jobs whose server died (expired leases).
Every ``sweep_seconds`` it applies retention (circuitstat.pipelines.service.retention.sweep).

:meth:`drain` (SIGTERM): no new job starts; running jobs get ``drain_seconds`` to finish, then
are interrupted, keep every finished stage, and go back to the queue to resume on the next start.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from . import queue
from .config import ServiceConfig
from .db import Database, Job
from .progress import EtaClock, planned_stages, progress
from .runner import RUN, payload

log = logging.getLogger("circuitstat.service")


@dataclass
class _Running:
    kind: str
    spec: object
    job_dir: Path
    started_at: float
    stopping: str | None = None  # "cancel", "lost" or "timeout" once the server has stopped it
    max_seconds: float = float("inf")  # the owner's max_job_seconds (one attempt's wall time)
    clock: EtaClock | None = None  # the attempt's pace of progress (its ETA never rises while progress is flat)


class Dispatcher:
    """Claims, runs and finishes jobs for one server."""

    def __init__(self, cfg: ServiceConfig, db: Database, make_pool, metrics=None) -> None:
        self.cfg, self.db, self.metrics = cfg, db, metrics
        self._make_pool = make_pool  # called in the loop thread: starting workers never delays serving
        self.pool = None
        self.server = f"{uuid.uuid4().hex[:12]}"
        self.running: dict[str, _Running] = {}
        self.draining = False
        self.workers_ready = 0  # for /healthz: only this thread talks to the pool
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_beat = self._last_progress = 0.0
        self._last_sweep: float | None = None  # the first tick sweeps
        self.heartbeat_seconds = cfg.lease_seconds / 3
        self.progress_seconds = cfg.progress_seconds
        self.pool_error: str | None = None  # why the pool could not start (/healthz says so)
        self._drained, self._drain_lock = False, threading.Lock()

    # -- the loop ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the loop thread."""
        self._thread = threading.Thread(target=self._loop, name="circuitstat-dispatcher", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            self.pool = self._make_pool()
        except Exception as e:  # noqa: BLE001 - e.g. an unreachable scheduler: no job runs here, and the log says why
            self.pool_error = f"{type(e).__name__}: {e}"
            log.exception("the worker pool could not start; this server queues jobs but runs none")
            return
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a database hiccup must not end the loop; the next tick retries
                log.exception("dispatcher tick failed")
            self._stop.wait(self.cfg.poll_seconds)

    def tick(self) -> None:
        """One round: collect outcomes, heartbeat when due, claim work unless draining."""
        self._collect()
        self.workers_ready = self.pool.ready()
        if time.monotonic() - self._last_beat >= self.heartbeat_seconds:
            self._last_beat = time.monotonic()
            self._heartbeat()
            with self.db.session() as s:
                for job_id in queue.expire_leases(s, self.cfg.max_attempts, self.db.postgres):
                    log.info("lease expired, job requeued", extra={"job": job_id})
        if self.running and time.monotonic() - self._last_progress >= self.progress_seconds:
            self._last_progress = time.monotonic()
            self._record_progress()
        if self._last_sweep is None or time.monotonic() - self._last_sweep >= self.cfg.sweep_seconds:
            self._last_sweep = time.monotonic()
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - retention never stops claims; the next sweep retries
                log.exception("retention sweep failed")
        if not self.draining:
            self._claim()

    def sweep(self) -> dict[str, int]:
        """Apply retention and finish pending deletions (circuitstat.pipelines.service.retention.sweep)."""
        from .retention import sweep

        counts = sweep(self.cfg, self.db)
        if any(counts.values()):
            log.info("retention sweep", extra=counts)
        return counts

    # -- steps ---------------------------------------------------------------------------------------
    def _claim(self) -> None:
        free = self.pool.free()
        if free < 1:
            return
        from .submission import parse_kind

        from .db import User

        with self.db.session() as s:
            jobs = queue.claim(s, self.server, self.cfg.lease_seconds, free, self.db.postgres,
                               per_user=self.cfg.jobs_running_per_user)
            claimed = [(j.id, j.kind, j.spec, j.max_work_flops, self.cfg.quotas_for(s.get(User, j.owner_id).name))
                       for j in jobs]
        for job_id, kind, spec_json, max_work, quotas in claimed:
            import json

            spec = json.loads(spec_json)
            job_dir = self.cfg.jobs_dir / job_id
            limits = {k: getattr(quotas, k) for k in ("max_parameters", "max_memory_bytes", "max_models_per_job")}
            worker = self.pool.start(payload(job_id, kind, spec, job_dir, max_work, self.cfg.sources.models, limits))
            self.running[job_id] = _Running(kind, parse_kind(kind, spec), job_dir, time.time(),
                                            max_seconds=quotas.max_job_seconds)
            with self.db.session() as s:
                queue.record_worker(s, job_id, self.server, worker)
            log.info("job started", extra={"job": job_id, "worker": worker})

    def _collect(self) -> None:
        for job_id, outcome in self.pool.poll():
            run = self.running.pop(job_id, None)
            if run is None:
                continue
            self._record(job_id, run, outcome)

    def _record(self, job_id: str, run: _Running, outcome: dict) -> None:
        status = outcome.get("status")
        with self.db.session() as s:
            if run.stopping == "lost":
                return
            if run.stopping == "cancel":
                queue.finish(s, self.server, job_id, "cancelled", error=f"cancelled by {queue.cancelled_by(s, job_id)}",
                             error_kind="cancelled")
            elif run.stopping == "timeout" and status != "completed":
                queue.finish(s, self.server, job_id, "failed", error_kind="limit", outcome="timeout",
                             error=f"the job ran longer than its limit of {run.max_seconds:g} s of wall time "
                                   "(max_job_seconds) and was stopped; its finished stages are kept in its run")
            elif status == "completed":  # its stage is the run's last, not whichever the last sample saw
                queue.finish(s, self.server, job_id, "completed", work_flops=outcome.get("work_flops"),
                             stage=(planned_stages(run.kind, run.spec) or [None])[-1])
            elif status == "failed":
                queue.finish(s, self.server, job_id, "failed", error=outcome.get("error"),
                             error_kind=outcome.get("kind"))
            elif status in ("interrupted", "busy"):
                queue.requeue(s, self.server, job_id, status, max_attempts=self.cfg.max_attempts,
                              delay=0.0 if status == "interrupted" else 2 * self.cfg.poll_seconds + 1,
                              count_attempt=False)
            else:
                queue.requeue(s, self.server, job_id, "worker died", max_attempts=self.cfg.max_attempts)
        from .deletion import finalize

        finalize(self.db, self.cfg.jobs_dir, [job_id])  # a job deleted while it ran: its tombstone, now it stopped
        final = {"cancel": "cancelled", "timeout": "failed"}.get(run.stopping or "", status)
        log.info("job ended", extra={"job": job_id, "outcome": final, "error_kind": outcome.get("kind")})
        if self.metrics is not None:
            self.metrics.job_ended(final, outcome.get("kind"), time.time() - run.started_at)

    def _heartbeat(self) -> None:
        ids = list(self.running)
        with self.db.session() as s:
            held = queue.renew(s, self.server, ids, self.cfg.lease_seconds)
            cancels = set(queue.cancel_requested(s, self.server))
        for job_id in ids:
            run = self.running[job_id]
            if job_id not in held and run.stopping is None:
                run.stopping = "lost"  # another server took it over: stop our copy
                self.pool.abort(job_id, "lost")
                log.warning("lease lost, job stopped here", extra={"job": job_id})
            elif job_id in cancels and run.stopping is None:
                run.stopping = "cancel"
                self.pool.abort(job_id, "cancelled")
        self._stop_overdue()

    def _stop_overdue(self) -> None:
        """Stop every job running longer than its owner's max_job_seconds: it then fails with the reason, and its
        run keeps the stages it finished (each stage is written whole, circuitstat.core.rundir)."""
        t = time.time()
        for job_id, run in self.running.items():
            if run.stopping is None and t - run.started_at > run.max_seconds:
                run.stopping = "timeout"
                self.pool.abort(job_id, "timeout")
                log.warning("job over its wall-time limit, stopped", extra={"job": job_id})

    def _record_progress(self) -> None:
        with self.db.session() as s:
            for job_id, run in self.running.items():
                if run.stopping is None:
                    if run.clock is None:
                        run.clock = EtaClock(run.started_at)
                    p = progress(run.kind, run.spec, run.job_dir / RUN, run.started_at, clock=run.clock)
                    queue.set_progress(s, self.server, job_id, p.stage, p.fraction, p.eta_seconds)

    # -- shutdown -------------------------------------------------------------------------------------
    def drain(self, seconds: float) -> None:
        """Stop claiming; wait up to ``seconds`` for running jobs, interrupt the rest (they resume
        later from their run directories), then stop the loop and the pool."""
        with self._drain_lock:  # once: SIGTERM drains while serving, and the lifespan's end calls it again
            if self._drained:
                return
            self._drained = True
        self.draining = True
        log.info("draining", extra={"running": len(self.running), "seconds": seconds})
        deadline = time.monotonic() + seconds
        while self.running and time.monotonic() < deadline:
            time.sleep(min(self.cfg.poll_seconds, 0.2))
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.pool is None:
            return
        for job_id in list(self.running):
            self.pool.interrupt(job_id)
        deadline = time.monotonic() + 30
        while self.running and time.monotonic() < deadline:
            self._collect()
            time.sleep(0.05)
        for job_id in list(self.running):  # did not stop in time: killed, requeued as interrupted
            self.pool.abort(job_id, "interrupted")
        self._collect()
        self.pool.close()
        log.info("drained", extra={"server": self.server})

    def stop(self) -> None:
        """Stop the loop and the pool at once (tests, errors at start-up)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.pool is not None:
            self.pool.close()


def job_dir(cfg: ServiceConfig, job: Job) -> Path:
    """The directory of ``job`` under the data directory."""
    return cfg.jobs_dir / job.id
