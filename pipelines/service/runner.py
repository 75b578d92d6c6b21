"""What a worker runs for one job: the CLI command's own function, into the job's run directory.

:func:`execute` takes a plain payload (so it runs the same in a local worker process and on a Dask
worker that shares the data directory), writes everything the run prints to the job's log, and
returns an outcome; it never raises. Before any work it estimates the job's attribution FLOPs with
:func:`circuitstat.circuits.plan.method_cost` (the ``--plan`` arithmetic) and refuses a job above its owner's
quota. The run directory's stages make a rerun resume: a job interrupted by a drain, a killed worker
or a killed server ends with the tables an uninterrupted run writes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

RUN, LOG = "run", "log.txt"


class WorkQuotaError(Exception):
    """The job's estimated work is above its owner's quota."""


def payload(job_id: str, kind: str, spec: dict, job_dir: Path, max_work_flops: float,
            served: dict[str, str] | None = None) -> dict:
    """The plain-data description of one job that :func:`execute` runs; ``served`` maps the operator's model
    names to what the server loads for them (a spec names them ``served:NAME``, never by path)."""
    return {"job_id": job_id, "kind": kind, "spec": spec, "job_dir": str(job_dir), "max_work_flops": max_work_flops,
            "served": dict(served or {})}


def _positions(spec, cfg) -> int:
    from circuitstat.pipelines.build import task_positions

    task = spec.task if not isinstance(spec.task, str) else None
    name, options = (task.name, task.options) if task is not None else (spec.task, {})
    return task_positions(name, options) or min(int(cfg.n_ctx), 64)


def estimated_flops(kind: str, spec, cfg) -> float:
    """The attribution FLOPs job ``kind`` with ``spec`` runs on a model of config ``cfg`` (circuitstat.circuits.plan)."""
    from circuitstat.circuits.plan import method_cost

    P = _positions(spec, cfg)

    def cost(method: str, n: int, ig_steps: int, level: str = "edge") -> float:
        return method_cost(cfg, method, n=n, positions=P, level=level, batch_size=spec.batch_size,
                           ig_steps=ig_steps).flops

    if kind == "audit":
        return sum(cost(m, spec.task.n, spec.ig_steps, spec.level) for m in spec.methods)
    if kind == "attribute":
        return cost(spec.method, spec.n, spec.ig_steps, spec.level)
    if kind == "calibration":
        return cost(spec.method, spec.task.n, spec.ig_steps)
    per_draw = sum(cost(m, spec.task.n, steps, spec.level) for _, m, steps in spec.estimator_levels())
    fresh = spec.dataset.n_fresh * cost("exact", spec.task.n, 1, spec.level)
    return len(spec.sources) * spec.counterfactual.n_draws * per_draw + fresh


@functools.lru_cache(maxsize=32)
def model_config(source: str, dtype: str):
    """The config of the model ``source`` names, loaded once per worker under the CLI's size limits
    (InputError above them); the run itself loads the model again, as the CLI command does."""
    from circuitstat.pipelines.build import load_source

    return load_source(source, device="cpu", dtype=dtype).cfg


def check_work(kind: str, spec, max_flops: float) -> float:
    """The job's estimated FLOPs; WorkQuotaError when above ``max_flops``."""
    flops = estimated_flops(kind, spec, model_config(spec.sources[0], getattr(spec, "dtype", "float32")))
    if flops > max_flops:
        raise WorkQuotaError(f"the job's estimated work is {flops:.3g} FLOPs (circuitstat.circuits.plan), above your quota of "
                             f"{max_flops:.3g}; make it smaller (fewer examples or methods) or ask the operator")
    return flops


def _run(kind: str, spec, out: Path) -> None:
    """Run job ``kind`` into ``out`` with the CLI command's function (limits never lifted)."""
    if kind == "audit":
        from circuitstat.pipelines.audit.run import run_audit
        from circuitstat.reports.html import render_report

        run_audit(spec, out, n_jobs=1, allow_pickle=False, allow_large=False)
        render_report(out)  # as `circuitstat audit` does by default
    elif kind == "variance":
        from circuitstat.pipelines.variance_study import run_variance_study
        from circuitstat.reports.html import render_report

        run_variance_study(spec, out, n_jobs=1, allow_pickle=False, allow_large=False)
        render_report(out)
    elif kind == "calibration":
        from circuitstat.pipelines.calibration.study import run_calibration_study

        run_calibration_study(spec, out, n_jobs=1, allow_pickle=False, allow_large=False)
    else:
        from circuitstat.pipelines.cli.analyse import run_attribute

        opts = spec.model_dump(exclude={"model", "task"})
        run_attribute(spec.model, spec.task, out, **opts, n_jobs=1, allow_pickle=False, allow_large=False)


def _outcome(exc: BaseException) -> dict[str, Any]:
    """The outcome of a job that raised ``exc``: what the CLI would print, classified."""
    from circuitstat.pipelines.cli import user_error_message
    from circuitstat.core.lock import RunLockedError

    if isinstance(exc, KeyboardInterrupt):
        return {"status": "interrupted", "error": "interrupted; the job resumes from its finished stages"}
    if isinstance(exc, RunLockedError):
        return {"status": "busy", "error": "the run directory is locked by another process"}
    if isinstance(exc, WorkQuotaError):
        return {"status": "failed", "kind": "quota", "error": str(exc)}
    message = user_error_message(exc)
    if message is not None:
        return {"status": "failed", "kind": "input", "error": " ".join(message.split())}
    traceback.print_exception(exc, file=sys.__stderr__)  # the operator's log, not the user's
    return {"status": "failed", "kind": "internal",
            "error": f"internal error (a bug in circuitstat, not in your input): {type(exc).__name__}; the operator's "
                     "log has the traceback"}


def execute(job: dict) -> dict[str, Any]:
    """Run one job (a :func:`payload`); its outcome: ``status`` completed, failed (with ``kind`` input,
    quota or internal, and ``error``), interrupted or busy. Never raises."""
    argv = sys.argv
    # the manifest records sys.argv as the run's command: the server's own (a database URL) must not leak
    sys.argv = ["circuitstat", "serve", "job", job["job_id"], job["kind"]]
    try:
        return _logged(job, Path(job["job_dir"]))
    finally:
        sys.argv = argv


def _logged(job: dict, job_dir: Path) -> dict[str, Any]:
    """:func:`execute`'s work, everything printed going to the job's log."""
    from circuitstat.pipelines.build import served_sources

    from .submission import parse_kind

    t0 = time.time()
    with open(job_dir / LOG, "a", encoding="utf-8") as log, contextlib.redirect_stdout(log), \
            contextlib.redirect_stderr(log):
        print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {job['kind']} job {job['job_id']} starting "
              f"(pid {os.getpid()})", flush=True)
        try:
            # sources by their public names: no server path in the run's manifest, tables, report or errors
            with served_sources(job.get("served", {})):
                spec = parse_kind(job["kind"], job["spec"])
                flops = check_work(job["kind"], spec, float(job["max_work_flops"]))
                print(f"estimated work {flops:.3g} FLOPs", flush=True)
                _run(job["kind"], spec, job_dir / RUN)
            outcome: dict[str, Any] = {"status": "completed", "work_flops": flops}
        except BaseException as exc:  # noqa: BLE001 - the worker's boundary: every outcome is reported
            outcome = _outcome(exc)
        if outcome.get("error"):  # errors name the job's files by their place in the job, not the server's path
            outcome["error"] = outcome["error"].replace(str(job_dir.resolve()), ".").replace(str(job_dir), ".")
        print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {outcome['status']} after {time.time() - t0:.1f} s"
              + (f": {outcome['error']}" if outcome.get("error") else ""), flush=True)
    return outcome
