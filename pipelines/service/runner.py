"""What a worker runs for one job: the CLI command's own function, into the job's run directory.

:func:`execute` takes a plain payload (so it runs the same in a local worker process and on a Dask
worker that shares the data directory), writes everything the run prints to the job's log, and
returns an outcome; it never raises. It runs in the job's inputs directory (a spec names uploaded task files by
their bare names). Before any work it prices each model on its skeleton (parameters, memory, models per job) and
the FLOPs of every stage (the ``--plan`` arithmetic, head stability included), and refuses a job above its owner's
quotas. The run directory's stages make a rerun resume: a job interrupted by a drain, a killed worker
or a killed server ends with the tables an uninterrupted run writes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from circuitstat.pipelines.parallel import units_listener
from circuitstat.pipelines.sources import RunInputs

RUN, LOG = "run", "log.txt"


class WorkQuotaError(Exception):
    """The job's estimated work is above its owner's quota."""


def payload(job_id: str, kind: str, spec: dict, job_dir: Path, max_work_flops: float,
            served: dict[str, str] | None = None, limits: dict | None = None) -> dict:
    """The plain-data description of one job that :func:`execute` runs; ``served`` maps the operator's model
    names to what the server loads for them (a spec names them ``served:NAME``, never by path). Paths are made
    absolute here, in the server's working directory: the worker runs the job in the job's inputs directory.
    ``limits``: the owner's max_parameters, max_memory_bytes and max_models_per_job (checked on the skeletons)."""
    served = {k: (os.path.abspath(v) if os.path.exists(v) else v) for k, v in (served or {}).items()}
    return {"job_id": job_id, "kind": kind, "spec": spec, "job_dir": os.path.abspath(job_dir),
            "max_work_flops": max_work_flops, "served": served, "limits": dict(limits or {})}


INPUTS = "inputs"
_CWD = threading.Lock()  # the working directory is the process's: one job at a time may move it


@contextlib.contextmanager
def in_inputs(job_dir: Path):
    """Run the body in the job's inputs directory, where its uploaded task files are: a spec names them by their bare
    names, and the run resolves and records them as `circuitstat audit spec.yaml` does beside them (so the manifest,
    tables and report hold the name, never the server's path, and spec_sha256 equals a local run's)."""
    cache = os.environ.get("CIRCUITSTAT_CACHE")
    with _CWD:
        before = os.getcwd()
        if cache:  # a relative cache (the zoo's models) stays where it was
            os.environ["CIRCUITSTAT_CACHE"] = os.path.abspath(cache)
        (job_dir / INPUTS).mkdir(parents=True, exist_ok=True)
        os.chdir(job_dir / INPUTS)
        try:
            yield
        finally:
            os.chdir(before)
            if cache:
                os.environ["CIRCUITSTAT_CACHE"] = cache


def estimated_flops(kind: str, spec, cfg) -> float:
    """The attribution FLOPs job ``kind`` with ``spec`` runs on a model of config ``cfg`` (its run kind's cost)."""
    from circuitstat.pipelines.kinds import kind as run_kind

    return run_kind(kind).flops(spec, cfg)


@functools.lru_cache(maxsize=32)
def _config_at(location: str):
    from circuitstat.circuits.skeleton import load_skeleton

    return load_skeleton(location).cfg


def model_config(source: str, inputs: RunInputs):
    """The config of the model ``source`` names (resolved by ``inputs``), from its skeleton (no weight read or
    allocated) under the CLI's size limits (InputError above them); the run itself loads the model."""
    return _config_at(inputs.resolve(source).location)


def check_work(kind: str, spec, max_flops: float, inputs: RunInputs, limits: dict | None = None) -> float:
    """The job's estimated FLOPs (every stage); WorkQuotaError when above ``max_flops``, or when a model is above
    ``limits`` (max_parameters, max_memory_bytes, max_models_per_job), priced on skeletons (nothing allocated)."""
    from types import SimpleNamespace

    from circuitstat.pipelines.kinds import kind as run_kind

    from .pricing import Shape, check_model_size, moe_parameters
    from .problems import Problem

    sources = run_kind(kind).sources(spec)
    limits = dict(limits or {})
    if limits:
        quotas = SimpleNamespace(**limits)
        try:
            if len(sources) > quotas.max_models_per_job:
                raise Problem(422, f"the spec names {len(sources)} models, above the limit of "
                                   f"{quotas.max_models_per_job} models per job (max_models_per_job)")
            for source in dict.fromkeys(sources):
                c = model_config(source, inputs)
                m = c.moe or {}
                shape = Shape(c.n_layers, c.n_heads, c.d_model, c.d_head, c.d_mlp, c.vocab_size, c.n_ctx,
                              2 if c.mlp == "standard" else 3,
                              moe_parameters(c.n_layers, c.d_model, m["experts"], m["d_expert"], m["d_shared"])
                              if m else 0)
                check_model_size(source, shape.parameters, shape.memory_bytes, quotas)
        except Problem as p:
            raise WorkQuotaError(p.detail) from None
    flops = estimated_flops(kind, spec, model_config(sources[0], inputs)) if sources else 0.0
    if flops > max_flops:
        raise WorkQuotaError(f"the job's estimated work is {flops:.3g} FLOPs (every stage, the --plan arithmetic), "
                             f"above your quota of {max_flops:.3g} (max_work_flops); make it smaller (fewer "
                             "examples, methods or models) or ask the operator")
    return flops


@contextlib.contextmanager
def job_warnings(log, job_dir: Path):
    """Warnings go to the job's log as one line each, with no server detail: not the installation's file and line
    (Python's default format), not the job's server path, and a stale lock of a crashed attempt without the host
    name and process id the lock file holds."""
    import warnings

    from circuitstat.core.lock import StaleLockWarning

    def show(message, category, filename, lineno, file=None, line=None):
        text = str(message).replace(str(job_dir), ".")
        if issubclass(category, StaleLockWarning):
            text = "the lock of an earlier attempt that stopped was taken over; the job resumes from its finished stages"
        print(f"warning: {category.__name__}: {text}", file=log, flush=True)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


class _UnitsFile:
    """Records the running stage's work units in the job's units.json (read by circuitstat.pipelines.service.progress),
    written whole (a temporary file renamed) at most every half second, and at each stage's first and last unit."""

    def __init__(self, job_dir: Path) -> None:
        self.path, self.last = job_dir / "units.json", 0.0

    def __call__(self, desc: str | None, done: int, total: int) -> None:
        import json

        t = time.time()
        if 0 < done < total and t - self.last < 0.5:
            return
        self.last = t
        tmp = self.path.with_name(".units.json.tmp")
        tmp.write_text(json.dumps({"desc": desc, "done": done, "total": total, "at": t}))
        os.replace(tmp, self.path)


def _run(kind: str, spec, out: Path, inputs: RunInputs) -> None:
    """Run job ``kind`` into ``out`` as its CLI command does (limits never lifted; the report where the command
    renders one), its sources resolved by ``inputs``."""
    from circuitstat.pipelines.kinds import kind as run_kind

    from .submission import SERVICE_N_JOBS

    declared = run_kind(kind)
    if getattr(spec, "n_jobs", SERVICE_N_JOBS) != SERVICE_N_JOBS:  # a job queued before submission replaced it
        spec = spec.model_copy(update={"n_jobs": SERVICE_N_JOBS})
    declared.run(spec, out, n_jobs=SERVICE_N_JOBS, allow_pickle=False, allow_large=False, inputs=inputs)
    if declared.report:
        from circuitstat.reports.html import render_report

        render_report(out, hide_paths=True)


def _outcome(exc: BaseException) -> dict[str, Any]:
    """The outcome of a job that raised ``exc``: what the CLI would print, classified."""
    from circuitstat.pipelines.errors import user_error_message
    from circuitstat.core.lock import RunLockedError

    if isinstance(exc, KeyboardInterrupt):
        return {"status": "interrupted", "error": "interrupted; the job resumes from its finished stages"}
    if isinstance(exc, RunLockedError):
        return {"status": "busy", "error": "the run directory is locked by another process"}
    if isinstance(exc, WorkQuotaError):
        return {"status": "failed", "kind": "quota", "error": str(exc)}
    message = user_error_message(exc)
    if message is not None:
        return _server_advice(" ".join(message.split()))
    traceback.print_exception(exc, file=sys.__stderr__)  # the operator's log, not the user's
    return {"status": "failed", "kind": "internal",
            "error": f"internal error (a bug in circuitstat, not in your input): {type(exc).__name__}; the operator's "
                     "log has the traceback"}


def _server_advice(message: str) -> dict[str, Any]:
    """A failed job's outcome for the CLI's ``message``: a size limit that the CLI lifts with a flag is the server's
    quota (kind quota), and its advice names what a server user can do, never the CLI-only flag."""
    from circuitstat.circuits.limits import LIFT

    if LIFT not in message:
        return {"status": "failed", "kind": "input", "error": message}
    message = message.replace(f"pass {LIFT} to lift the limit", "ask the operator: this server keeps the limit")
    message = message.replace(LIFT, "a higher limit (ask the operator)")
    return {"status": "failed", "kind": "quota", "error": message}


def execute(job: dict) -> dict[str, Any]:
    """Run one job (a :func:`payload`); its outcome: ``status`` completed, failed (with ``kind`` input,
    quota or internal, and ``error``), interrupted or busy. Never raises."""
    argv = sys.argv
    # the manifest records sys.argv as the run's command: the server's own (a database URL) must not leak
    sys.argv = ["circuitstat", "serve", "job", job["job_id"], job["kind"]]
    try:
        return _logged(job, Path(job["job_dir"]).absolute())
    finally:
        sys.argv = argv


def _logged(job: dict, job_dir: Path) -> dict[str, Any]:
    """:func:`execute`'s work, everything printed going to the job's log."""
    from .submission import parse_kind

    t0 = time.time()
    with open(job_dir / LOG, "a", encoding="utf-8") as log, contextlib.redirect_stdout(log), \
            contextlib.redirect_stderr(log):
        print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {job['kind']} job {job['job_id']} starting", flush=True)
        try:
            # sources by their public names: no server path in the run's manifest, tables, report or errors
            inputs = RunInputs(served=dict(job.get("served", {})), hide_paths=True)
            spec = parse_kind(job["kind"], job["spec"])
            with in_inputs(job_dir), units_listener(_UnitsFile(job_dir)), job_warnings(log, job_dir):
                flops = check_work(job["kind"], spec, float(job["max_work_flops"]), inputs, job.get("limits"))
                print(f"estimated work {flops:.3g} FLOPs", flush=True)
                _run(job["kind"], spec, job_dir / RUN, inputs)
            outcome: dict[str, Any] = {"status": "completed", "work_flops": flops}
        except BaseException as exc:  # noqa: BLE001 - the worker's boundary: every outcome is reported
            outcome = _outcome(exc)
        if outcome.get("error"):  # errors name the job's files by their place in the job, not the server's path
            outcome["error"] = outcome["error"].replace(str(job_dir.resolve()), ".").replace(str(job_dir), ".")
        print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {outcome['status']} after {time.time() - t0:.1f} s"
              + (f": {outcome['error']}" if outcome.get("error") else ""), flush=True)
    return outcome
