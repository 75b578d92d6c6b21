"""A submitted spec and its uploaded task files -> the validated spec a worker runs.

The spec is the YAML the CLI command takes (``audit``, ``study variance``, ``study calibration``)
or, for ``attribute``, a mapping of that command's options. It is read with the CLI's own strict
reader and validated by the CLI's own spec classes; then the service's rules apply on top:

* every model source must be on the operator's allow-list (:mod:`circuitstat.pipelines.service.sources`);
* a task is a built-in task or one of the files uploaded with the request, by its bare name:
  nothing in a spec can name a path on the server;
* sizes stay under the CLI's limits, which no request can lift (the worker runs with
  ``allow_large=False`` and ``allow_pickle=False``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from circuitstat.core.errors import InputError

from .config import SourcesConfig
from .problems import Problem
from .sources import allowed_source

BUILTIN_TASKS = ("induction", "ioi", "greater-than", "greater_than", "gt")
"""The tasks of circuitstat.circuits.tasks a request may name (its registry without ``file``, which takes a path)."""
TASK_FILE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet")
UPLOAD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
MAX_UPLOADS = 8
SPEC_FILE = "spec.yaml"
SERVICE_N_JOBS = 1
"""The n_jobs every job runs with (the pool runs jobs side by side); a spec's own n_jobs is replaced by it."""


MAX_K_VALUES = 64
"""Most circuit sizes (the spec's ``k`` list) one job may ask for."""


def parse_kind(kind: str, data: Any, source: str = SPEC_FILE):
    """The spec object of job kind ``kind`` validated from parsed YAML (InputError naming each bad key)."""
    from circuitstat.pipelines.kinds import SERVED, kind as run_kind

    if kind not in SERVED:
        raise InputError(f"unknown job kind {kind!r}; use {', '.join(SERVED)}")
    return run_kind(kind).parse(data, source)


@dataclass(frozen=True)
class Upload:
    """One uploaded file: its name as sent and its bytes."""

    name: str
    data: bytes


@dataclass(frozen=True)
class Prepared:
    """A validated submission: the spec a worker runs (JSON) and what the job list shows."""

    spec: dict
    model: str


def _relative(message: str, inputs: Path) -> str:
    """``message`` without the server's path of the job's inputs (errors name the upload only)."""
    return message.replace(str(inputs.resolve()) + "/", "").replace(str(inputs) + "/", "")


def too_many_uploads(n: int | None = None) -> str:
    """The 422's detail for a request with more task files than a job takes."""
    return f"{'more than ' + str(MAX_UPLOADS) if n is None else n} files uploaded; at most {MAX_UPLOADS} task files per job"


def save_uploads(files: list[Upload], inputs: Path) -> list[str]:
    """Write the uploaded task files into ``inputs``; their names. A 422 Problem for a bad name."""
    if len(files) > MAX_UPLOADS:
        raise Problem(422, too_many_uploads(len(files)))
    names = []
    for f in files:
        name = f.name
        if (not UPLOAD_NAME.fullmatch(name or "") or not name.lower().endswith(TASK_FILE_SUFFIXES)
                or name == SPEC_FILE):
            raise Problem(422, f"uploaded file name {name[:80]!r} is not a task file name; use letters, digits, "
                               f"'.', '_' and '-' ending in one of {', '.join(TASK_FILE_SUFFIXES)}")
        if name in names:
            raise Problem(422, f"the file {name!r} is uploaded twice; upload each task file once")
        (inputs / name).write_bytes(f.data)
        names.append(name)
    return names


def _task_name(spec) -> str:
    task = spec.task
    return task if isinstance(task, str) else task.name


def _confine_task(spec, uploads: list[str]) -> None:
    """None when the spec's task is built in or one of the uploaded files, by its bare name (the spec keeps that
    name: the worker runs in the job's inputs directory, as `circuitstat audit spec.yaml` runs beside its task file,
    so no server path reaches the manifest, tables or report); a 422 Problem otherwise."""
    name = _task_name(spec)
    if name in BUILTIN_TASKS or name in uploads:
        return
    hint = (f"upload it with the request (files={name})" if name.lower().endswith(TASK_FILE_SUFFIXES)
            else f"use a built-in task ({', '.join(BUILTIN_TASKS[:3])}) or upload a task file")
    raise Problem(422, f"task {name[:80]!r} is neither a built-in task nor a file uploaded with this request; "
                       f"{hint} (a request cannot name a path on the server)")


def _with_sources(spec, sources: SourcesConfig):
    """``spec`` with each model source replaced by what the server loads for it (422 if not allowed)."""
    try:
        resolved = [allowed_source(s, sources) for s in spec.sources]
    except InputError as e:
        raise Problem(422, str(e)) from None
    if getattr(spec, "models", None) is not None:
        return spec.model_copy(update={"models": resolved})
    return spec.model_copy(update={"model": resolved[0]})


def prepare(kind: str, spec_text: bytes | None, spec_data: Any, files: list[Upload], job_dir: Path,
            sources: SourcesConfig, quotas=None) -> Prepared:
    """The validated submission written under ``job_dir/inputs``; a Problem (400 unreadable, 422
    refused: what the CLI would say, or a cost above ``quotas``, circuitstat.pipelines.service.pricing)."""
    from circuitstat.pipelines.yamlio import read_yaml_strict

    inputs = job_dir / "inputs"
    inputs.mkdir(parents=True, exist_ok=False)
    uploads = save_uploads(files, inputs)
    if spec_text is not None:
        (inputs / SPEC_FILE).write_bytes(spec_text)
        try:
            spec_data = read_yaml_strict(inputs / SPEC_FILE)
        except InputError as e:
            raise Problem(400, _relative(str(e), inputs)) from None
    if spec_data is None:
        raise Problem(422, "no spec: send the spec (the YAML the CLI command takes) as the 'spec' field")
    try:
        spec = parse_kind(kind, spec_data, SPEC_FILE)
    except InputError as e:
        raise Problem(422, _relative(str(e), inputs)) from None
    if getattr(spec, "circuit", None) is not None:  # a file path on the server: never taken from a request
        raise Problem(422, "the server does not audit circuit files (spec key circuit); run `circuitstat audit` "
                           "or `circuitstat check-circuit` locally")
    k = getattr(spec, "k", None)
    if isinstance(k, (list, tuple)) and len(k) > MAX_K_VALUES:
        raise Problem(422, f"the spec's k lists {len(k)} circuit sizes, above the limit of {MAX_K_VALUES} per job "
                           "(each is a circuit per resample); give fewer sizes, or split them into several jobs")
    display = ", ".join(spec.sources)
    _confine_task(spec, uploads)
    spec = _with_sources(spec, sources)
    if getattr(spec, "n_jobs", SERVICE_N_JOBS) != SERVICE_N_JOBS:  # what the job runs with, so its manifest says so
        spec = spec.model_copy(update={"n_jobs": SERVICE_N_JOBS})
    if quotas is not None:
        from circuitstat.pipelines.kinds import kind as run_kind

        from .pricing import check_job_cost

        check_job_cost(run_kind(kind).sources(spec), quotas, sources.models)
    return Prepared(spec.model_dump(mode="json"), display[:1100])
