"""The operator's settings of ``circuitstat serve``: a YAML file (``--config``) and command-line overrides.

Example (every key is optional)::

    database: postgresql://circuitstat@db/circuitstat   # default: sqlite:///DATA/service.db
    scheduler: tcp://scheduler:8786                     # default: a local pool of `workers` processes
    workers: 2
    sources:                       # the model sources API users may name (circuitstat.pipelines.service.sources)
      zoo: [attn-only-2l]          # zoo:RECIPE/seed-S for these recipes
      random: true                 # random:ARCH?key=value&... within the CLI's size limits
      models:                      # named local models: the name users write -> what this server loads
        gpt2-small: /models/gpt2
    quotas:                        # per user; `users:` overrides them for named users
      max_active_jobs: 8
      max_request_bytes: 8388608
      max_work_flops: 1.0e+15      # every stage's estimated FLOPs (head stability included)
      requests_per_minute: 600
      max_disk_bytes: 10737418240  # uploads + runs of the user's jobs (default: no limit)
      max_parameters: 500000000    # per model, counted from its config (nothing is built to count it)
      max_memory_bytes: 8589934592 # to load one model
      max_models_per_job: 16
      max_job_seconds: 21600       # one attempt's wall time: then the job fails, its finished stages kept
    users:
      ci-bot: {max_active_jobs: 2}
    retention_days: 90             # finished jobs older than this are deleted (default: kept)

The file is the operator's own (trusted, like a command-line option); nothing in a request can
change any of it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from circuitstat.core.errors import InputError

DATABASE_ENV = "CIRCUITSTAT_DATABASE"
"""Environment variable holding the database URL (keeps a password off the command line and out of ps)."""


class StrictSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourcesConfig(StrictSpec):
    """Which model sources a request may name."""

    zoo: list[str] = Field(default_factory=lambda: ["attn-only-2l", "mlp-2l"])
    random: bool = True
    models: dict[str, str] = Field(default_factory=dict)


class Quotas(StrictSpec):
    """One user's limits."""

    max_active_jobs: int = Field(8, ge=1, le=100_000)  # queued + running
    max_request_bytes: int = Field(8 * 2**20, ge=1024, le=2**32)
    max_work_flops: float = Field(1e15, gt=0)  # estimated FLOPs of every stage of one job (the --plan arithmetic)
    requests_per_minute: int = Field(600, ge=1, le=10_000_000)
    max_disk_bytes: int | None = Field(None, ge=0)  # bytes under the user's jobs' directories; None: no limit
    max_parameters: int = Field(500_000_000, ge=1)  # of each model a job loads (counted from its config)
    max_memory_bytes: int = Field(8 * 2**30, ge=2**20)  # to load each model (float32, held twice while loading)
    max_models_per_job: int = Field(16, ge=1, le=10_000)  # an audit's `models:` list
    max_job_seconds: float = Field(6 * 3600.0, gt=0)  # one attempt's wall time; over it the job fails, stages kept


class QuotaOverride(StrictSpec):
    """Per-user changes to the default quotas."""

    max_active_jobs: int | None = Field(None, ge=1, le=100_000)
    max_request_bytes: int | None = Field(None, ge=1024, le=2**32)
    max_work_flops: float | None = Field(None, gt=0)
    requests_per_minute: int | None = Field(None, ge=1, le=10_000_000)
    max_disk_bytes: int | None = Field(None, ge=0)
    max_parameters: int | None = Field(None, ge=1)
    max_memory_bytes: int | None = Field(None, ge=2**20)
    max_models_per_job: int | None = Field(None, ge=1, le=10_000)
    max_job_seconds: float | None = Field(None, gt=0)


class ServiceConfig(StrictSpec):
    """Everything ``circuitstat serve`` runs with."""

    data: Path
    database: str | None = None
    scheduler: str | None = None
    workers: int = Field(1, ge=1, le=256)
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    lease_seconds: float = Field(30.0, gt=0.2, le=3600)
    poll_seconds: float = Field(0.5, gt=0.01, le=60)
    progress_seconds: float = Field(1.0, gt=0.01, le=3600)  # how often running jobs' progress is recorded
    drain_seconds: float = Field(30.0, ge=0, le=86_400)
    max_attempts: int = Field(3, ge=1, le=100)
    log_file: Path | None = None
    cookie_secure: bool = False  # set behind HTTPS: the session cookie is then sent over HTTPS only
    query_slots: int = Field(2, ge=1, le=64)  # DuckDB queries at once, server-wide (each takes its memory cap)
    query_slots_per_user: int = Field(1, ge=1, le=64)  # of those, at most this many for one user
    jobs_running_per_user: int | None = Field(None, ge=1, le=100_000)  # one user's running jobs, all servers; None: no cap
    query_timeout_seconds: float = Field(20.0, gt=0, le=3600)  # one query's run time (DuckDB is interrupted)
    query_wait_seconds: float = Field(30.0, ge=0, le=3600)  # how long a query waits for a slot, then 503
    retention_days: float | None = Field(None, gt=0, le=36_500)  # finished jobs older than this are deleted
    sweep_seconds: float = Field(600.0, gt=0.01, le=86_400)  # how often a server applies retention and deletions
    sources: SourcesConfig = SourcesConfig()
    quotas: Quotas = Quotas()
    users: dict[str, QuotaOverride] = Field(default_factory=dict)

    @property
    def database_url(self) -> str:
        """The SQLAlchemy URL: the configured one, else SQLite in the data directory."""
        return self.database or f"sqlite:///{(self.data / 'service.db').resolve()}"

    @property
    def jobs_dir(self) -> Path:
        """Where each job's inputs, run directory and log live (DATA/jobs/<id>/)."""
        return self.data / "jobs"

    def quotas_for(self, user: str) -> Quotas:
        """The quotas of ``user``: the defaults with that user's overrides."""
        over = self.users.get(user)
        if over is None:
            return self.quotas
        return self.quotas.model_copy(update={k: v for k, v in over.model_dump().items() if v is not None})

    @property
    def max_request_bytes(self) -> int:
        """The largest request body any user may send (checked before the user is known)."""
        return max([self.quotas.max_request_bytes] + [self.quotas_for(u).max_request_bytes for u in self.users])


def load_config(path: str | os.PathLike[str] | None, *, need_data: bool = True, **overrides: Any) -> ServiceConfig:
    """The ServiceConfig from the YAML file at ``path`` (or defaults) with the non-None ``overrides``
    (command-line options) on top; the database URL falls back to $CIRCUITSTAT_DATABASE. Without
    ``need_data`` a database URL alone will do (the operator's account commands)."""
    from circuitstat.pipelines.spec import validate_spec
    from circuitstat.pipelines.yamlio import read_yaml_strict

    data: dict[str, Any] = {}
    if path is not None:
        doc = read_yaml_strict(path)
        if doc is not None and not isinstance(doc, dict):
            raise InputError(f"invalid service config {path}: the top level is a {type(doc).__name__}; it must be a "
                             "mapping of keys (data, database, sources, quotas, ...)")
        data = {} if doc is None else dict(doc)
    data.update({k: v for k, v in overrides.items() if v is not None})
    if data.get("database") is None and os.environ.get(DATABASE_ENV):
        data["database"] = os.environ[DATABASE_ENV]
    if "data" not in data:
        if not need_data and data.get("database"):  # an operator command on a database named by URL
            data["data"] = "."
        else:
            raise InputError("the service needs a data directory: pass --data DIR (or set data: in --config)")
    return validate_spec(ServiceConfig, data, str(path or "<options>"), kind="service config",
                         keys="data, database, sources, quotas, ...")
