"""Helpers of the service tests: a real `circuitstat serve` process on loopback, users, jobs, table comparison."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parents[2]
TINY = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1"
# a tokenizer-bearing tiny model (vocab 50257 attaches GPT-2's BPE): for task files with text prompts
TINY_BPE = "random:gpt2?n_layer=1&n_head=2&n_embd=16&n_positions=64&seed=1"
AUDIT = {"model": TINY, "task": {"name": "induction", "n": 16, "options": {"seq_len": 5}},
         "methods": ["exact", "eap"], "bootstrap": {"n_resamples": 40}, "k": [2, 5]}
FINAL = ("completed", "failed", "cancelled")
_NAMES = [("Mary", "John"), ("Alice", "Bob"), ("Tom", "James"), ("Sarah", "David"), ("Paul", "Anna"),
          ("Mark", "Lucy"), ("Kate", "Peter"), ("Jack", "Emma")]
IOI_FILE = "".join(json.dumps({"clean": f"When {a} and {b} went to the store, {b} gave a drink to",
                               "corrupted": f"When {a} and {b} went to the store, {a} gave a drink to",
                               "answer": f" {a}", "wrong_answer": f" {b}"}) + "\n" for a, b in _NAMES).encode()
"""An uploadable IOI-style task file of 8 rows (text prompts: it needs a model with GPT-2's tokenizer, TINY_BPE)."""
AUDIT_FILE = {"model": TINY_BPE, "task": {"name": "ioi.jsonl", "n": 8}, "methods": ["exact", "eap"],
              "bootstrap": {"n_resamples": 40}, "k": [2, 5]}
"""An audit of the uploaded task file IOI_FILE."""
POLL_S = 0.1


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_yaml(path: Path, doc) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class Server:
    """One `circuitstat serve` subprocess on 127.0.0.1 (a real uvicorn)."""

    def __init__(self, data: Path, *, database: str | None = None, scheduler: str | None = None, workers: int = 1,
                 settings: dict | None = None, name: str = "server") -> None:
        self.data, self.database, self.scheduler, self.workers = data, database, scheduler, workers
        self.settings = {"lease_seconds": 2.0, "poll_seconds": 0.05, "progress_seconds": 0.1, "drain_seconds": 0,
                         **(settings or {})}
        self.name, self.proc, self.port, self.extra = name, None, None, {}
        self.log_file = data.parent / f"{name}.log"
        self.out_file = data.parent / f"{name}.out"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def database_url(self) -> str:
        return self.database or f"sqlite:///{(self.data / 'service.db').resolve()}"

    def start(self) -> "Server":
        self.data.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        cfg = write_yaml(self.data.parent / f"{self.name}.yaml", self.settings)
        cmd = [sys.executable, "-m", "circuitstat.pipelines.cli", "serve", "--data", str(self.data), "--port", str(self.port),
               "--config", str(cfg), "--log-file", str(self.log_file), "--workers", str(self.workers)]
        if self.scheduler:
            cmd += ["--scheduler", self.scheduler]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        if self.database:
            env["CIRCUITSTAT_DATABASE"] = self.database  # as an operator would: no password on the command line
        out = open(self.out_file, "ab")
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.data.parent)
        out.close()
        return self

    def wait_ready(self, timeout: float = 180, workers: bool = True) -> dict:
        """The /healthz document once the server answers (and, with ``workers``, a worker is ready)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.out_file.read_text()[-3000:]}")
            try:
                r = httpx.get(self.url + "/healthz", timeout=5)
            except httpx.HTTPError:
                r = None
            if r is not None and r.status_code == 503 and "workers" in r.json():
                raise AssertionError(f"{self.name}: {r.json()['workers']}")
            if r is not None and r.status_code == 200 and (not workers or r.json()["workers_ready"] >= 1):
                return r.json()
            time.sleep(POLL_S)
        raise AssertionError(f"{self.name} not ready after {timeout} s:\n{self.out_file.read_text()[-3000:]}")

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=120)

    def send(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> int:
        """Send ``sig`` and wait for the process to exit; its exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def database(url: str):
    from circuitstat.pipelines.service.db import Database, migrate

    db = Database(url)
    migrate(db.engine)
    return db


def make_user(db, name: str) -> str:
    """A new user ``name`` and a token for them."""
    from circuitstat.pipelines.service.accounts import add_user, create_token

    with db.session() as s:
        add_user(s, name)
        return create_token(s, name, "test")


def submit(client: httpx.Client, spec: dict, *, kind: str = "audit", files: dict | None = None, **form) -> httpx.Response:
    """POST a job as multipart (spec as a YAML file, task files as ``files``)."""
    parts = [("spec", ("spec.yaml", yaml.safe_dump(spec).encode()))]
    parts += [("files", (name, data)) for name, data in (files or {}).items()]
    return client.post("/api/v1/jobs", data={"kind": kind, **form}, files=parts)


def wait_job(client: httpx.Client, job_id: str, states=FINAL, timeout: float = 300) -> dict:
    """The job's status once it is in one of ``states``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = client.get(f"/api/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        if r.json()["state"] in states:
            return r.json()
        time.sleep(POLL_S)
    raise AssertionError(f"job {job_id} not in {states} after {timeout} s: {r.json()}")


def run_cli_audit(spec: dict, folder: Path) -> Path:
    """`circuitstat audit SPEC --out folder/run` in this process: the oracle of the service's tables."""
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    folder.mkdir(parents=True, exist_ok=True)
    path = write_yaml(folder / "spec.yaml", spec)
    r = CliRunner().invoke(app, ["audit", str(path), "--out", str(folder / "run"), "--no-report"])
    assert r.exit_code == 0, r.output
    return folder / "run"


def tables(run: Path) -> dict:
    """{name: table} of a run directory's Parquet tables, schema metadata (provenance, timings) dropped."""
    return {p.stem: pq.read_table(p).replace_schema_metadata(None) for p in sorted(run.glob("*.parquet"))}


def _same_column(a, b) -> bool:
    """Equal Arrow columns, NaN equal to NaN at the same place (Arrow's own equals says NaN != NaN)."""
    import numpy as np
    import pyarrow as pa

    a, b = a.combine_chunks(), b.combine_chunks()
    if a.type != b.type or len(a) != len(b) or not a.is_null().equals(b.is_null()):
        return False
    if pa.types.is_fixed_size_list(a.type) or pa.types.is_list(a.type) or pa.types.is_large_list(a.type):
        offsets_equal = pa.types.is_fixed_size_list(a.type) or a.offsets.equals(b.offsets)
        return offsets_equal and _same_column(pa.chunked_array([a.flatten()]), pa.chunked_array([b.flatten()]))
    if pa.types.is_floating(a.type):
        return np.array_equal(a.to_numpy(zero_copy_only=False), b.to_numpy(zero_copy_only=False), equal_nan=True)
    return a.equals(b)


def assert_same_tables(got: Path, want: Path) -> None:
    """Every table of ``want`` is in ``got`` with equal schema and values (bit for bit; NaN where NaN), and no
    other table."""
    a, b = tables(got), tables(want)
    assert sorted(a) == sorted(b)
    for name in b:
        assert a[name].schema.equals(b[name].schema), name
        assert a[name].num_rows == b[name].num_rows, name
        for col in b[name].column_names:
            assert _same_column(a[name].column(col), b[name].column(col)), (name, col)


def fetch_tables(client: httpx.Client, job_id: str, folder: Path) -> Path:
    """Download every table of a finished job as Parquet into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    listing = client.get(f"/api/v1/jobs/{job_id}/tables")
    assert listing.status_code == 200, listing.text
    for t in listing.json()["tables"]:
        r = client.get(t["parquet"])
        assert r.status_code == 200 and r.headers["content-type"] == "application/vnd.apache.parquet"
        (folder / f"{t['name']}.parquet").write_bytes(r.content)
    return folder


def job_rows(database_url: str, table: str) -> list[dict]:
    """Every row of one of the service's tables (read directly, as an operator would)."""
    from sqlalchemy import create_engine, text

    url = database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return [dict(r._mapping) for r in c.execute(text(f"SELECT * FROM {table}"))]
    finally:
        engine.dispose()


def manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


SETTINGS = {"users": {"quota": {"max_active_jobs": 1}, "ratey": {"requests_per_minute": 5},
                      "small": {"max_work_flops": 1000.0}},
            "quotas": {"max_request_bytes": 200_000, "requests_per_minute": 100_000, "max_active_jobs": 100}}
"""The settings of the session's servers (per-user quotas for the quota tests, room for the load test)."""


SERVED_NAME = "lab-tiny"
"""The operator's named local model on the session's servers (a directory of TINY, saved by Fleet)."""
SERVED_BPE = "lab-bpe"
"""The operator's named model with GPT-2's tokenizer (a directory of TINY_BPE, beside SERVED_NAME's)."""


def served_settings(served: Path) -> dict:
    """SETTINGS with the operator's named models ``SERVED_NAME`` at ``served`` and ``SERVED_BPE`` beside it (zoo
    and random: as by default)."""
    return {**SETTINGS, "sources": {"models": {SERVED_NAME: str(served), SERVED_BPE: str(served.parent / SERVED_BPE)}}}


class Fleet:
    """The session's servers: one on SQLite, and any number on one PostgreSQL database sharing one data
    directory (the scale-out set-up). Test modules share them: a server costs a worker warm-up (torch and
    transformers imported, one tiny audit run), the largest part of these tests' time."""

    def __init__(self, root: Path) -> None:
        from circuitstat.circuits import load_hf
        from circuitstat.circuits.convert import from_hf

        self.root, self.pg_url, self.count = root, None, 0
        self.served = root / "operator-models" / SERVED_NAME  # a path no user may see
        from_hf(load_hf(TINY)).save(self.served)
        from circuitstat.pipelines.sources import LOCAL

        LOCAL.load(TINY_BPE).save(self.served.parent / SERVED_BPE)  # with its tokenizer
        self.sqlite = Server(root / "sqlite" / "data", workers=2, settings=served_settings(self.served),
                             name="sqlite").start()
        self.pg_servers: list[Server] = []
        self._tokens: dict[tuple[str, str], str] = {}

    def use_postgres(self, url: str) -> None:
        """Start the first server on the PostgreSQL database ``url`` (not waiting for it)."""
        self.pg_url = url
        self.add_pg(wait=False)

    def add_pg(self, wait: bool = True, **settings) -> Server:
        """Start one more server on the PostgreSQL database and data directory."""
        self.count += 1
        server = Server(self.root / "pg" / "data", database=self.pg_url, workers=2, name=f"pg{self.count}",
                        settings={**served_settings(self.served), **settings}).start()
        server.extra = settings
        self.pg_servers.append(server)
        if wait:
            server.wait_ready()
        return server

    def pg(self) -> Server:
        """The first live PostgreSQL server with the default settings (a successor when all have stopped)."""
        live = [s for s in self.pg_servers if s.proc.poll() is None and not s.extra]
        return live[0] if live else self.add_pg()

    def token(self, server: Server, user: str) -> str:
        """A token of ``user`` on ``server``'s database (the user is made on first use)."""
        key = (server.database_url, user)
        if key not in self._tokens:
            db = database(server.database_url)
            self._tokens[key] = make_user(db, user)
            db.dispose()
        return self._tokens[key]

    def stop(self) -> list[int]:
        """Stop every server still running; their exit codes."""
        return [s.stop() for s in [self.sqlite, *self.pg_servers] if s.proc.poll() is None]
