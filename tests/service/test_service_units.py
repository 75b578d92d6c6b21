"""The service's parts without a server: tokens, leases, the allow-list, log redaction, the schema."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from pathlib import Path

import pytest

from circuitstat.core.errors import InputError
from circuitstat.pipelines.service import accounts, queue
from circuitstat.pipelines.service.config import SourcesConfig
from circuitstat.pipelines.service.db import Base, Database, Job, migrate, now
from circuitstat.pipelines.service.logs import JsonFormatter, redact
from circuitstat.pipelines.service.sources import resolve_source


@pytest.fixture
def db(tmp_path):
    d = Database(f"sqlite:///{tmp_path / 'service.db'}")
    migrate(d.engine)
    yield d
    d.dispose()


def test_token_checks_are_constant_time_whatever_is_wrong(db, monkeypatch):
    """Every authentication does one hmac.compare_digest of two SHA-256 digests: right token, wrong
    secret, unknown id or malformed; so a refusal's timing says nothing about what was wrong."""
    with db.session() as s:
        accounts.add_user(s, "alice")
        token = accounts.create_token(s, "alice")
    calls, real = [], hmac.compare_digest

    def spy(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(accounts.hmac, "compare_digest", spy)
    ident = token.split("_")[1]
    cases = {"right": token, "wrong secret": f"csk_{ident}_{'A' * 43}", "unknown id": f"csk_{'0' * 12}_{'A' * 43}",
             "malformed": "hello", "none": None}
    for what, value in cases.items():
        calls.clear()
        with db.session() as s:
            principal = accounts.authenticate(s, value)
        assert (principal is not None) == (what == "right"), what
        assert calls == [(64, 64)], what


def test_tokens_are_stored_only_as_hashes_and_revocation_works(db):
    with db.session() as s:
        accounts.add_user(s, "alice")
        token = accounts.create_token(s, "alice", "ci")
    ident, secret = token.split("_")[1], token.split("_", 2)[2]
    with db.engine.connect() as c:
        dump = json.dumps([list(r) for r in c.exec_driver_sql("SELECT * FROM tokens")], default=str)
    assert secret not in dump and token not in dump
    assert hashlib.sha256(secret.encode()).hexdigest() in dump
    with db.session() as s:
        principal = accounts.authenticate(s, token)
        cookie = accounts.open_session(s, principal)
    with db.session() as s:
        assert accounts.authenticate(s, cookie).name == "alice"
        accounts.revoke_token(s, ident)
    with db.session() as s:
        assert accounts.authenticate(s, token) is None and accounts.authenticate(s, cookie) is None
        with pytest.raises(InputError, match="no token"):
            accounts.revoke_token(s, "000000000000")
        with pytest.raises(InputError, match="exists already"):
            accounts.add_user(s, "alice")
        with pytest.raises(InputError, match="not a user name"):
            accounts.add_user(s, "../root")


def _job(s, job_id: str, owner: int) -> Job:
    job = Job(id=job_id, owner_id=owner, kind="audit", name="j", model="m", spec="{}", state="queued",
              created_at=now(), public=False, attempts=0, not_before=0.0, cancel_requested=False,
              max_work_flops=1.0, request_bytes=0)
    s.add(job)
    return job


def test_leases_fence_out_a_server_that_lost_its_job(db):
    with db.session() as s:
        uid = accounts.add_user(s, "alice").id
        _job(s, "a" * 32, uid)
    with db.session() as s:
        assert [j.id for j in queue.claim(s, "one", 0.2, 5, postgres=False)] == ["a" * 32]
    with db.session() as s:
        assert queue.claim(s, "two", 0.2, 5, postgres=False) == []  # not twice
    time.sleep(0.3)
    with db.session() as s:
        assert queue.expire_leases(s, max_attempts=3, postgres=False) == ["a" * 32]
        assert queue.claim(s, "two", 30, 5, postgres=False)[0].attempts == 2
    with db.session() as s:
        assert queue.renew(s, "one", ["a" * 32], 30) == set()  # the old holder learns it lost the job
        assert not queue.finish(s, "one", "a" * 32, "completed")  # and cannot finish it
        assert queue.finish(s, "two", "a" * 32, "completed")
        assert s.get(Job, "a" * 32).state == "completed"


def test_a_job_that_keeps_dying_fails_after_max_attempts(db):
    with db.session() as s:
        uid = accounts.add_user(s, "alice").id
        _job(s, "b" * 32, uid)
    for attempt in range(1, 4):
        with db.session() as s:
            assert queue.claim(s, "one", 30, 1, postgres=False)[0].attempts == attempt
        with db.session() as s:
            state = queue.requeue(s, "one", "b" * 32, "worker died", max_attempts=3)
        assert state == ("failed" if attempt == 3 else "queued")
    with db.session() as s:
        assert "interrupted 3 times" in s.get(Job, "b" * 32).error


def test_the_allow_list():
    sources = SourcesConfig(zoo=["attn-only-2l"], random=True, models={"gpt2-small": "/srv/models/gpt2"})
    assert resolve_source("zoo:attn-only-2l/seed-3", sources) == "zoo:attn-only-2l/seed-3"
    assert resolve_source("gpt2-small", sources) == "served:gpt2-small"  # the worker loads the path; no spec holds it
    tiny = "random:gpt2?n_layer=1&n_head=2&n_embd=16"
    assert resolve_source(tiny, sources) == tiny
    for bad in ("served:gpt2-small", "zoo:mlp-2l/seed-0", "zoo:attn-only-2l/seed-0/..", "zoo:attn-only-2l/../x",
                "/srv/models/gpt2", "gpt2", "./gpt2-small", "gpt2-small/", "random:gpt2?x=/etc/passwd", "random:../x",
                "", None, 3):
        with pytest.raises(InputError, match="not allowed|short string"):
            resolve_source(bad, sources)
    with pytest.raises(InputError, match="not allowed"):
        resolve_source(tiny, SourcesConfig(random=False))


def test_logs_redact_tokens_cookies_bearer_headers_and_passwords():
    token = "csk_0123456789ab_" + "Z" * 43
    line = f"GET /x/{token} Authorization: Bearer {token} css_0123456789ab_{'q' * 43} postgresql://u:hunter2@db/x"
    out = redact(line)
    assert token not in out and "Z" * 10 not in out and "q" * 10 not in out and "hunter2" not in out
    assert out.count("[redacted]") == 4
    record = logging.LogRecord("circuitstat", logging.INFO, "", 0, "login with %s", (token,), None)
    record.path = f"/api/{token}"
    doc = json.loads(JsonFormatter().format(record))
    assert "Z" * 10 not in json.dumps(doc) and doc["message"] == "login with csk_[redacted]"


def test_the_migrations_create_exactly_the_orm_schema(db):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with db.engine.connect() as c:
        assert compare_metadata(MigrationContext.configure(c), Base.metadata) == []
    migrate(db.engine)  # idempotent


def test_the_builtin_task_names_are_circuits_tasks_registry():
    from circuitstat.circuits.tasks import TASKS
    from circuitstat.pipelines.service.submission import BUILTIN_TASKS

    assert sorted(BUILTIN_TASKS) == sorted(k for k in TASKS if k != "file")


def test_the_table_comparison_catches_one_changed_value(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from support import assert_same_tables

    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    t = pa.table({"x": [1.0, float("nan"), 3.0], "v": pa.array([[1.0, 2.0]] * 3, pa.list_(pa.float32(), 2))})
    pq.write_table(t, tmp_path / "a" / "t.parquet")
    pq.write_table(t, tmp_path / "b" / "t.parquet")
    assert_same_tables(tmp_path / "a", tmp_path / "b")  # NaN where NaN is equal
    changed = t.set_column(1, "v", pa.array([[1.0, 2.0], [1.0, 2.0000002], [1.0, 2.0]], pa.list_(pa.float32(), 2)))
    pq.write_table(changed, tmp_path / "b" / "t.parquet")
    with pytest.raises(AssertionError):
        assert_same_tables(tmp_path / "a", tmp_path / "b")


def test_the_api_process_never_imports_torch(tmp_path):
    """The server answers requests without torch: it starts in about a second, and models load only in workers."""
    import subprocess
    import sys

    code = ("import sys; from circuitstat.pipelines.service.config import ServiceConfig; from circuitstat.pipelines.service.app import create_app;"
            f"create_app(ServiceConfig(data={str(tmp_path)!r}), start_workers=False);"
            "import circuitstat.pipelines.service.api, circuitstat.pipelines.service.api_runs, circuitstat.pipelines.service.pages;"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert out.stdout.strip() == "False", out.stderr


def test_the_operator_commands_add_users_make_and_revoke_tokens(tmp_path):
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    run = CliRunner().invoke
    data = ["--data", str(tmp_path / "data")]
    assert run(app, ["users", "add", "alice", *data]).exit_code == 0
    again = run(app, ["users", "add", "alice", *data])
    assert again.exit_code == 2 and "exists already" in again.output
    token = run(app, ["users", "token", "alice", "--label", "ci", *data]).output.strip()
    assert accounts.TOKEN_PATTERN.fullmatch(token)
    listed = run(app, ["users", "list", *data]).output
    assert token.split("_")[1] in listed and token.split("_", 2)[2] not in listed and "ci" in listed
    assert run(app, ["users", "revoke", token, *data]).exit_code == 0  # the token itself names its id
    assert "(revoked)" in run(app, ["users", "list", *data]).output
    d = Database(f"sqlite:///{tmp_path / 'data' / 'service.db'}")
    with d.session() as s:
        assert accounts.authenticate(s, token) is None
    d.dispose()
    assert run(app, ["users", "token", "nobody", *data]).exit_code == 2
