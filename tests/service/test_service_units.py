"""The service's parts without a server: tokens, leases, the allow-list, log redaction, the schema."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from pathlib import Path

import pytest

from circuitstat.core.errors import InputError
from circuitstat.pipelines.service import accounts, queue
from circuitstat.pipelines.service.config import SourcesConfig
from circuitstat.pipelines.service.db import Base, Database, Job, migrate, now
from circuitstat.pipelines.service.logs import JsonFormatter, redact
from circuitstat.pipelines.service.sources import allowed_source


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
        assert accounts.authenticate(s, cookie, accounts.SESSION_PREFIX).name == "alice"
        assert accounts.authenticate(s, cookie) is None  # a session is no bearer token
        assert accounts.authenticate(s, token, accounts.SESSION_PREFIX) is None  # nor a token a session
        accounts.revoke_token(s, ident)
    with db.session() as s:
        assert accounts.authenticate(s, token) is None
        assert accounts.authenticate(s, cookie, accounts.SESSION_PREFIX) is None
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
    assert allowed_source("zoo:attn-only-2l/seed-3", sources) == "zoo:attn-only-2l/seed-3"
    assert allowed_source("gpt2-small", sources) == "served:gpt2-small"  # the worker loads the path; no spec holds it
    tiny = "random:gpt2?n_layer=1&n_head=2&n_embd=16"
    assert allowed_source(tiny, sources) == tiny
    for bad in ("served:gpt2-small", "zoo:mlp-2l/seed-0", "/srv/models/gpt2", "gpt2", "./gpt2-small", "gpt2-small/",
                None, 3):
        with pytest.raises(InputError, match="not allowed|must be a string"):
            allowed_source(bad, sources)
    # what the source grammar refuses (circuitstat.circuits.model_source), with its message, as every entry point
    for bad in ("zoo:attn-only-2l/seed-0/..", "zoo:attn-only-2l/../x", "zoo:attn-only-2l/seed-07", "random:../x", ""):
        with pytest.raises(InputError, match="not a model source|unknown architecture"):
            allowed_source(bad, sources)
    # a random: spec's keys are checked by the worker's loader before anything is built; a value is never a path
    assert allowed_source("random:gpt2?x=/etc/passwd", sources) == "random:gpt2?x=/etc/passwd"
    with pytest.raises(InputError, match="not allowed"):
        allowed_source(tiny, SourcesConfig(random=False))


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


@pytest.mark.slow  # two small audits in this process (about 10 s of CPU); the API test runs the same job on a server
def test_an_uploaded_task_file_runs_by_its_name_as_a_local_run_beside_it(tmp_path, monkeypatch):
    """A spec naming an uploaded task file keeps the bare name: the worker runs in the job's inputs directory, so the
    manifest (spec, stage params, task provenance), every table's provenance and the report record `ioi.jsonl`, never
    the server's path, and spec_sha256 and the tables equal `circuitstat audit spec.yaml` run beside the file."""
    import pyarrow.parquet as pq
    import yaml
    from support import AUDIT_FILE, IOI_FILE, assert_same_tables, manifest
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app
    from circuitstat.pipelines.service.runner import execute, payload
    from circuitstat.pipelines.service.submission import Upload, prepare

    job_dir = tmp_path / "data" / "jobs" / ("c" * 32)
    text = yaml.safe_dump({**AUDIT_FILE, "methods": ["eap"], "k": [2]}).encode()  # the smallest audit of the file
    prepared = prepare("audit", text, None, [Upload("ioi.jsonl", IOI_FILE)], job_dir, SourcesConfig())
    assert prepared.spec["task"]["name"] == "ioi.jsonl"
    outcome = execute(payload("c" * 32, "audit", prepared.spec, job_dir, 1e18))
    assert outcome["status"] == "completed", (outcome, (job_dir / "log.txt").read_text())
    local = tmp_path / "local"
    local.mkdir()
    (local / "spec.yaml").write_bytes(text)
    (local / "ioi.jsonl").write_bytes(IOI_FILE)
    monkeypatch.chdir(local)
    r = CliRunner().invoke(app, ["audit", "spec.yaml", "--out", "run", "--no-report"])
    assert r.exit_code == 0, r.output
    got, want = manifest(job_dir / "run"), manifest(local / "run")
    assert got["spec"] == want["spec"] and got["spec_sha256"] == want["spec_sha256"]
    assert got["spec"]["task"]["name"] == "ioi.jsonl"
    assert {json.dumps(st.get("params", {}).get("task", {}).get("name")) for st in got["stages"].values()} <= {
        '"ioi.jsonl"', "null"}
    assert_same_tables(job_dir / "run", local / "run")
    secrets = (str(job_dir), str(job_dir.resolve()), str(tmp_path))
    texts = {"manifest": json.dumps(got), "report": (job_dir / "run" / "report.html").read_text()}
    for p in (job_dir / "run").glob("*.parquet"):
        meta = pq.read_schema(p).metadata or {}
        texts[p.name] = b" ".join(meta.values()).decode("utf-8", "replace")
        assert b"ioi.jsonl" in b" ".join(meta.values()), p.name  # the task's provenance is there, by its name
    for what, t in texts.items():
        assert not [x for x in secrets if x in t], what
    assert re.search(r"<title>[^<]*ioi\.jsonl", texts["report"]) and "ioi.jsonl" in got["provenance"]["task"]["meta"]["source"]


GPT2_XL = "random:gpt2?n_layer=48&n_head=25&n_embd=1600&vocab_size=50257"
GPT2_XL_PARAMETERS = 1_557_611_200  # GPT-2 XL's published count (tied embeddings): the oracle of the count below


def test_a_job_too_large_to_price_under_the_limits_is_refused_at_submission(tmp_path, monkeypatch):
    """A 1.5 B-parameter random: model and a 200-model list are 422s at submission naming the limit's key, priced from
    the spec alone: nothing is built (the loaders would fail the test) and no torch is needed."""
    import yaml

    from circuitstat.circuits import loading, skeleton
    from circuitstat.pipelines.service.config import Quotas
    from circuitstat.pipelines.service.pricing import random_shape
    from circuitstat.pipelines.service.problems import Problem
    from circuitstat.pipelines.service.submission import prepare
    from support import AUDIT, TINY

    def built(*a, **k):
        raise AssertionError("a model was built to price a submission")

    monkeypatch.setattr(loading, "random_hf_model", built)
    monkeypatch.setattr(skeleton, "load_skeleton", built)
    xl = random_shape(GPT2_XL)
    assert GPT2_XL_PARAMETERS <= xl.parameters <= 1.06 * GPT2_XL_PARAMETERS  # an upper bound, and a close one
    quotas = Quotas()
    for i, (spec, key) in enumerate([({**AUDIT, "model": GPT2_XL}, "max_parameters"),
                                     ({**AUDIT, "model": None, "models": [TINY] * 200}, "max_models_per_job")]):
        with pytest.raises(Problem) as e:
            prepare("audit", yaml.safe_dump(spec).encode(), None, [], tmp_path / f"j{i}", SourcesConfig(), quotas)
        assert e.value.status == 422 and key in e.value.detail, e.value.detail
    with pytest.raises(Problem, match="max_memory_bytes"):
        prepare("audit", yaml.safe_dump({**AUDIT, "model": GPT2_XL}).encode(), None, [], tmp_path / "m",
                SourcesConfig(), Quotas(max_parameters=10**10, max_memory_bytes=2**30))
    small = prepare("audit", yaml.safe_dump(AUDIT).encode(), None, [], tmp_path / "ok", SourcesConfig(), quotas)
    assert small.spec["model"] == TINY


def test_the_pricing_counts_bound_what_the_skeleton_holds():
    """Pricing and the loader read one table of family shapes (circuitstat.circuits.families); its GPT-2 shape is
    transformers' GPT2Config, and a priced count bounds the skeleton's own parameter count from above (the uniform
    form) for every family's small default."""
    from circuitstat.circuits.families import GPT2_CONFIG
    from circuitstat.circuits.skeleton import load_skeleton
    from circuitstat.pipelines.service.pricing import random_shape

    import transformers

    assert {k: getattr(transformers.GPT2Config(), k) for k in GPT2_CONFIG} == GPT2_CONFIG
    for source in ("random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=100", "random:llama", "random:gpt_neox",
                   "random:qwen3?hidden_size=64&num_attention_heads=4", "random:mixtral", "random:qwen2_moe",
                   "random:gptj", "random:falcon", "random:phi"):
        model = load_skeleton(source)
        held = sum(p.numel() for p in model.parameters())
        assert held <= random_shape(source).parameters <= 2 * held, source


def test_every_stage_is_priced_head_stability_included():
    """max_work_flops prices the head-stability stage too: two models add exactly heads_flops, which grows with the
    probe set and the pairs compared."""
    from circuitstat.circuits.engine.config import ModelConfig
    from circuitstat.pipelines.runs.audit.pricing import heads_flops
    from circuitstat.pipelines.runs.audit.stages import audit_flops
    from circuitstat.pipelines.spec import parse_spec
    from support import AUDIT, TINY

    cfg = ModelConfig(n_layers=2, n_heads=4, d_model=64, d_head=16, d_mlp=256, vocab_size=100, n_ctx=128)
    one = parse_spec(AUDIT, "spec")
    assert heads_flops(one, cfg) == 0.0
    three = parse_spec({**AUDIT, "model": None, "models": [TINY] * 3}, "spec")
    assert heads_flops(three, cfg) > 0 and audit_flops(three, cfg) == audit_flops(one, cfg) + heads_flops(three, cfg)
    more = parse_spec({**AUDIT, "model": None, "models": [TINY] * 3, "heads": {"n_probe": 200, "pairs": "all"}},
                      "spec")
    assert heads_flops(more, cfg) > 2 * heads_flops(three, cfg)


class FakePool:
    """A pool that runs nothing: jobs stay running until aborted (the dispatcher's side of a worker pool)."""

    def __init__(self) -> None:
        self.started, self.ended, self.aborted = [], [], []

    def ready(self) -> int:
        return 1

    def free(self) -> int:
        return 1 - (len(self.started) - len(self.aborted))

    def start(self, job: dict) -> str:
        self.started.append(job)
        return "fake worker"

    def poll(self) -> list:
        out, self.ended = self.ended, []
        return out

    def abort(self, job_id: str, why: str = "aborted") -> None:
        self.aborted.append(job_id)
        self.ended.append((job_id, {"status": why}))


def test_a_job_over_its_wall_time_limit_fails_with_the_reason_and_keeps_its_stages(db, tmp_path):
    """The owner's max_job_seconds is enforced by the server: a job running longer is stopped and ends failed, naming
    the limit; its run directory (the stages it finished) is kept. The clock is moved, not waited for."""
    from support import AUDIT

    from circuitstat.pipelines.service.config import ServiceConfig
    from circuitstat.pipelines.service.dispatcher import Dispatcher

    cfg = ServiceConfig(data=tmp_path, users={"alice": {"max_job_seconds": 60, "max_parameters": 1000}})
    with db.session() as s:
        uid = accounts.add_user(s, "alice").id
        _job(s, "d" * 32, uid).spec = json.dumps(AUDIT)
    run = cfg.jobs_dir / ("d" * 32) / "run"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text('{"stages": {"index": {"status": "done"}}}')
    pool = FakePool()
    d = Dispatcher(cfg, db, lambda: pool)
    d.pool = pool
    d.tick()
    assert [j["job_id"] for j in pool.started] == ["d" * 32] and pool.started[0]["limits"]["max_parameters"] == 1000
    d._last_beat = -1e18
    d.tick()
    assert pool.aborted == []  # within its limit
    d.running["d" * 32].started_at -= 61  # a minute later
    d._last_beat = -1e18
    d.tick()
    d.tick()
    assert pool.aborted == ["d" * 32] and not d.running
    with db.session() as s:
        job = s.get(Job, "d" * 32)
        assert job.state == "failed" and job.error_kind == "limit" and "max_job_seconds" in job.error, job.error
        assert "60 s" in job.error and "finished stages are kept" in job.error
    assert (run / "manifest.json").is_file()


def _manifest_at(run: Path, stages: dict) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "manifest.json").write_text(json.dumps({"stages": stages}))


def test_progress_moves_within_a_stage_and_its_eta_counts_down_or_is_unknown(tmp_path):
    """Progress counts the running stage's own work units (the chunks run_chunks reports, through the worker's
    units.json), and the ETA comes from the pace of progress: while progress is flat it never rises, and once the flat
    spell outlasts it the ETA is unknown (None), not a made-up number."""
    from support import AUDIT

    import datetime as _dt

    from circuitstat.pipelines.parallel import run_chunks, units_listener
    from circuitstat.pipelines.service.progress import EtaClock, planned_stages, progress, read_units
    from circuitstat.pipelines.service.runner import _UnitsFile
    from circuitstat.pipelines.spec import parse_spec

    spec = parse_spec(AUDIT, "spec")
    planned = planned_stages("audit", spec)
    job, run = tmp_path / "job", tmp_path / "job" / "run"
    started = "2026-01-01T00:00:00.000000Z"  # a fixed stage start: the units record is dated relative to it
    _manifest_at(run, {"index": {"status": "done"}, "scores_exact": {"status": "running", "started_utc": started}})
    with units_listener(_UnitsFile(job)):  # the worker's listener: a stage's first and last unit are always written
        seen = run_chunks(lambda c: read_units(job).get("done"), [1, 2, 3, 4])
    assert seen == [0, 0, 0, 0] and read_units(job)["done"] == read_units(job)["total"] == 4
    since = _dt.datetime(2026, 1, 1, tzinfo=_dt.timezone.utc).timestamp() + 1  # written after the stage began
    (job / "units.json").write_text(json.dumps({"done": 2, "total": 4, "at": since}))
    p = progress("audit", spec, run, started_at=0.0, now=100.0)
    assert p.stage == "scores_exact" and p.fraction == pytest.approx(1.5 / len(planned))  # not 1/len: within too
    (job / "units.json").write_text(json.dumps({"done": 2, "total": 4, "at": 0.0}))  # from before the stage began
    assert progress("audit", spec, run, started_at=0.0, now=100.0).fraction == pytest.approx(1 / len(planned))

    clock, etas = EtaClock(started_at=0.0), []
    for now in range(10, 400, 10):  # the same run directory sampled every 10 s: progress flat at 1/len
        etas.append(progress("audit", spec, run, started_at=0.0, now=float(now), clock=clock).eta_seconds)
    known = [e for e in etas if e is not None]
    assert known and known == sorted(known, reverse=True) and etas[0] == pytest.approx(10 * (len(planned) - 1))
    assert etas[-1] is None and etas.index(None) == len(known)  # unknown once overdue, and stays unknown
    assert clock.update(2 / len(planned), 400.0) == pytest.approx(400.0 * (len(planned) - 2) / 2)  # moved: a new pace


def test_a_completed_jobs_stage_is_its_runs_last(db, tmp_path):
    """The stage a completed job shows is its run's last stage, not whichever stage the last progress sample saw."""
    from support import AUDIT

    from circuitstat.pipelines.service.config import ServiceConfig
    from circuitstat.pipelines.service.dispatcher import Dispatcher
    from circuitstat.pipelines.service.progress import planned_stages
    from circuitstat.pipelines.spec import parse_spec

    cfg = ServiceConfig(data=tmp_path)
    with db.session() as s:
        _job(s, "e" * 32, accounts.add_user(s, "alice").id).spec = json.dumps(AUDIT)
    pool = FakePool()
    d = Dispatcher(cfg, db, lambda: pool)
    d.pool = pool
    d.tick()
    with db.session() as s:
        queue.set_progress(s, d.server, "e" * 32, "scores_eap", 0.4, 3.0)
    pool.ended.append(("e" * 32, {"status": "completed", "work_flops": 1.0}))
    d.tick()
    with db.session() as s:
        job = s.get(Job, "e" * 32)
        assert job.state == "completed" and job.progress == 1.0 and job.eta_seconds is None
        assert job.stage == planned_stages("audit", parse_spec(AUDIT, "spec"))[-1] != "scores_eap"


def test_pages_of_running_jobs_refresh_without_a_script_and_finished_ones_stay_still(db, tmp_path):
    """A queued or running job's page (and a job list holding one) reloads itself by a meta refresh; a finished job's
    page does not; the policy still allows no script."""
    from fastapi.testclient import TestClient

    from circuitstat.pipelines.service.app import create_app
    from circuitstat.pipelines.service.config import ServiceConfig
    from circuitstat.pipelines.service.context import SESSION_COOKIE

    cfg = ServiceConfig(data=tmp_path, database=str(db.engine.url))
    with db.session() as s:
        uid = accounts.add_user(s, "alice").id
        cookie = accounts.open_session(s, accounts.authenticate(s, accounts.create_token(s, "alice")))
        _job(s, "f" * 32, uid).state = "running"
    with TestClient(create_app(cfg, start_workers=False)) as client:
        client.cookies.set(SESSION_COOKIE, cookie)
        refresh = re.compile(r'<meta http-equiv="refresh" content="\d+">')
        for path in ("/jobs/" + "f" * 32, "/jobs"):
            r = client.get(path)
            assert r.status_code == 200 and refresh.search(r.text), path
            assert "<script" not in r.text and "script-src" not in r.headers["content-security-policy"]
        assert "time left unknown" in client.get("/jobs/" + "f" * 32).text
        with db.session() as s:
            s.get(Job, "f" * 32).state = "completed"
        for path in ("/jobs/" + "f" * 32, "/jobs"):
            assert not refresh.search(client.get(path).text), path


def test_a_crashed_attempts_stale_lock_reaches_the_job_log_without_path_host_or_pid(tmp_path):
    """The next attempt takes over the lock a killed worker left; the job's log says so in one line that names no
    installation path, host name or process id (the lock file holds them)."""
    import socket
    import subprocess
    import sys

    from circuitstat.core.provenance import utc_now
    from circuitstat.core.rundir import RunDir
    from circuitstat.pipelines.service.runner import job_warnings

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    run = tmp_path / "job" / "run"
    run.mkdir(parents=True)
    (run / ".lock").write_text(json.dumps({"pid": int(dead), "host": socket.gethostname(), "created_utc": utc_now(),
                                           "token": "0" * 32}))
    with open(tmp_path / "log.txt", "w") as log, job_warnings(log, tmp_path / "job"):
        with RunDir(run):
            pass
    text = (tmp_path / "log.txt").read_text()
    assert "StaleLockWarning" in text and "taken over" in text and len(text.splitlines()) == 1
    import circuitstat

    for secret in (socket.gethostname(), dead, str(tmp_path), str(Path(circuitstat.__file__).parent), "lock.py"):
        assert secret not in text, secret


def test_an_unreachable_database_at_start_is_one_line_naming_the_setting_and_exit_2(tmp_path):
    """`circuitstat serve` on a database that does not answer: the operator's configuration (exit 2, one line naming
    the setting, no password), not "a bug in circuitstat" with a traceback (exit 3)."""
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    r = CliRunner().invoke(app, ["serve", "--data", str(tmp_path / "data"), "--port", "0",
                                 "--database", "postgresql://someone:hunter2@127.0.0.1:1/nothing"])
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    text = " ".join(lines)
    assert "database:" in text and "cannot reach the database" in text and "hunter2" not in text, r.output
    assert "Traceback" not in r.output and "a bug" not in r.output and len(lines) <= 3


def test_the_job_records_the_n_jobs_it_runs_with(tmp_path):
    """A spec asking for n_jobs: 64 runs with the server's one worker per job; the job's spec (which the manifest
    records) says 1, not the 64 it never ran with."""
    import yaml
    from support import AUDIT

    from circuitstat.pipelines.service.submission import SERVICE_N_JOBS, prepare

    prepared = prepare("audit", yaml.safe_dump({**AUDIT, "n_jobs": 64}).encode(), None, [], tmp_path / "j",
                       SourcesConfig())
    assert prepared.spec["n_jobs"] == SERVICE_N_JOBS == 1


def test_sharing_refusals_do_not_tell_whether_a_user_exists(db):
    """Sharing with a name that is no user and with a user it cannot be shared with (the owner) is the same 422, word
    for word but the name: the refusal cannot be used to list user names."""
    from circuitstat.pipelines.service import access
    from circuitstat.pipelines.service.problems import Problem

    with db.session() as s:
        owner = accounts.add_user(s, "alice").id
        accounts.add_user(s, "bob")
        job = _job(s, "9" * 32, owner)
        s.flush()
        details = {}
        for name in ("nobody-such", "alice"):
            with pytest.raises(Problem) as e:
                access.set_sharing(s, job, public=None, users=[name])
            assert e.value.status == 422
            details[name] = e.value.detail.replace(repr(name), "NAME")
        assert details["nobody-such"] == details["alice"] and "unknown" not in details["alice"]
        access.set_sharing(s, job, public=None, users=["bob"])
        assert access.shared_with(s, job) == ["bob"]


def test_a_draining_server_answers_503_draining_until_its_jobs_are_done(db, tmp_path):
    """SIGTERM starts the drain while the server still serves: every request (the API, the pages, /healthz) is a 503
    problem+json with `draining: true` and Retry-After, not a refused connection; once the dispatcher has drained,
    uvicorn stops, and the signal is not raised again (exit 0)."""
    import signal
    import threading

    import uvicorn
    from fastapi.testclient import TestClient

    from circuitstat.pipelines.service.app import create_app
    from circuitstat.pipelines.service.config import ServiceConfig
    from circuitstat.pipelines.service.server import draining_server

    class Dispatcher:  # the dispatcher's side of a drain, with a job still running until released
        draining, drained, release = False, [], threading.Event()

        def drain(self, seconds):
            self.release.wait(timeout=60)
            self.drained.append(seconds)

    app = create_app(ServiceConfig(data=tmp_path, database=str(db.engine.url)), start_workers=False)
    with db.session() as s:
        token = accounts.create_token(s, accounts.add_user(s, "alice").name)
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        d = app.state.service.dispatcher = Dispatcher()
        server = draining_server(uvicorn.Config(app), app, drain_seconds=7.0)
        server.handle_exit(signal.SIGTERM, None)
        for path in ("/api/v1/jobs", "/healthz", "/jobs"):
            r = client.get(path, headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 503 and r.headers["content-type"] == "application/problem+json", path
            assert r.json()["draining"] is True and r.headers["retry-after"], path
        assert not server.should_exit  # still serving while the job runs
        d.release.set()
        server.drain_thread.join(timeout=60)
        assert d.drained == [7.0] and server.should_exit and server._captured_signals == []


@pytest.mark.parametrize("n_files", [9, 30])
def test_too_many_uploads_are_the_documented_422(db, tmp_path, n_files):
    """9 (or 30) task files: the documented 422 (at most 8 task files), never the multipart parser's 400."""
    from fastapi.testclient import TestClient
    from support import AUDIT

    import yaml

    from circuitstat.pipelines.service.app import create_app
    from circuitstat.pipelines.service.config import ServiceConfig

    with db.session() as s:
        token = accounts.create_token(s, accounts.add_user(s, "alice").name)
    app = create_app(ServiceConfig(data=tmp_path, database=str(db.engine.url)), start_workers=False)
    files = [("spec", ("spec.yaml", yaml.safe_dump(AUDIT).encode()))]
    files += [("files", (f"t{i}.jsonl", b"{}\n")) for i in range(n_files)]
    with TestClient(app) as client:
        r = client.post("/api/v1/jobs", data={"kind": "audit"}, files=files, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json", r.text
    assert "at most 8 task files" in r.json()["detail"]
    assert not list(tmp_path.glob("jobs/*/inputs"))  # nothing left behind


def test_the_job_list_shortens_long_model_lists(db, tmp_path):
    """A job of 16 long random: sources shows the first two, cut, and how many more, in the job list's cell."""
    from fastapi.testclient import TestClient

    from circuitstat.pipelines.service.app import create_app
    from circuitstat.pipelines.service.config import ServiceConfig
    from circuitstat.pipelines.service.context import SESSION_COOKIE
    from circuitstat.pipelines.service.pages import short_models

    models = [f"random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed={i}" for i in range(16)]
    with db.session() as s:
        uid = accounts.add_user(s, "alice").id
        cookie = accounts.open_session(s, accounts.authenticate(s, accounts.create_token(s, "alice")))
        _job(s, "7" * 32, uid).model = ", ".join(models)
    with TestClient(create_app(ServiceConfig(data=tmp_path, database=str(db.engine.url)), start_workers=False)) as c:
        c.cookies.set(SESSION_COOKIE, cookie)
        page = c.get("/jobs").text
    import html

    cell = html.unescape(re.search(r'<td title="[^"]*">([^<]*)</td>', page).group(1))
    assert cell.endswith(" and 14 more") and len(cell) < 2 * 60 + 20 and models[2] not in cell
    assert short_models("zoo:attn-only-2l/seed-0") == "zoo:attn-only-2l/seed-0"  # a short list stays whole


def test_a_refused_token_is_called_unknown_or_revoked_not_expired(db, tmp_path):
    """No token has an expiry date, so no refusal says "expired": the API's 401 and the login page say an unknown or
    revoked token."""
    from fastapi.testclient import TestClient

    from circuitstat.pipelines.service.app import create_app
    from circuitstat.pipelines.service.config import ServiceConfig

    bogus = "csk_000000000000_" + "x" * 43
    with TestClient(create_app(ServiceConfig(data=tmp_path, database=str(db.engine.url)), start_workers=False)) as c:
        api = c.get("/api/v1/jobs", headers={"Authorization": f"Bearer {bogus}"})
        page = c.post("/login", data={"token": bogus}, headers={"Origin": "http://testserver"}, follow_redirects=False)
    assert api.status_code == 401 and page.status_code == 401
    for text in (api.json()["detail"], page.text):
        assert "unknown or revoked token" in text and "expired" not in text


def test_a_served_mixture_of_experts_model_is_priced_with_every_expert(tmp_path):
    """Mixtral-8x7B's config.json (served by an operator) is priced at its 46.7 B parameters (every expert held),
    not as the 7 B dense model its shape keys alone describe; a quota between the two refuses it."""
    import json

    from circuitstat.pipelines.service.pricing import directory_shape

    cfg = {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
           "vocab_size": 32000, "max_position_embeddings": 32768}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    moe = directory_shape(tmp_path)
    dense = directory_shape_of({k: v for k, v in cfg.items() if k != "num_local_experts"}, tmp_path / "d")
    # an upper bound (the uniform form: K/V ungrouped, the dense MLP counted too) within 15% of HF's own count
    assert dense.parameters < 10e9 < 46_702_792_704 <= moe.parameters < 1.15 * 46_702_792_704


def directory_shape_of(cfg: dict, d):
    import json

    from circuitstat.pipelines.service.pricing import directory_shape

    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return directory_shape(d)


def test_the_eta_never_rises_when_progress_steps_at_a_slowing_pace():
    """Issue 44: the ETA rose at every progress step (41 -> 74 s) while the time left fell. Stages that each take
    longer than the last: the raw pace estimate rises at each step (the control), the shown ETA never does."""
    from circuitstat.pipelines.service.progress import EtaClock

    clock, shown, raw, now, fraction = EtaClock(started_at=0.0), [], [], 0.0, 0.0
    for stage in range(1, 6):  # 5 equal parts taking 10, 20, 30, 40, 50 s
        for _ in range(stage):
            now += 10.0
            shown.append(clock.update(fraction, now))
        fraction = stage / 5
        raw.append((1 - fraction) * now / fraction if fraction < 1 else 0.0)
        shown.append(clock.update(fraction, now))
    assert any(b > a for a, b in zip(raw, raw[1:4]))  # the pace alone would rise
    known = [e for e in shown if e is not None]
    ticks = [(i, e) for i, e in enumerate(shown) if e is not None]
    assert len(known) >= 4
    for (i, a), (j, b) in zip(ticks, ticks[1:]):  # between any two shown values, no rise
        if all(shown[k] is not None for k in range(i, j + 1)):
            assert b <= a + 1e-9, (i, a, j, b)


def test_servers_racing_on_a_deletion_remove_each_directory_once_and_log_no_error(db, tmp_path, monkeypatch, caplog):
    """Issue 44: two servers' first sweeps logged 13 'directory not removed' errors. A removal is claimed (an
    atomic rename) before it runs: the second server, arriving while the first removes, finds it claimed."""
    import logging
    import shutil
    import uuid as _uuid

    from circuitstat.pipelines.service import deletion

    jobs = tmp_path / "jobs"
    ids = [_uuid.uuid4().hex for _ in range(3)]
    for job_id in ids:
        (jobs / job_id / "run").mkdir(parents=True)
        (jobs / job_id / "run" / "t.parquet").write_bytes(b"x" * 100)
    removed, real = [], shutil.rmtree

    def racing_rmtree(path, *a, **kw):  # the other server's sweep runs while this one removes
        removed.append(path)
        assert all(deletion.remove_files(jobs, job_id) is False for job_id in ids if job_id in str(path))
        real(path, *a, **kw)

    monkeypatch.setattr(deletion.shutil, "rmtree", racing_rmtree)
    with caplog.at_level(logging.INFO, logger="circuitstat.service"):
        assert [deletion.remove_files(jobs, job_id) for job_id in ids] == [True] * 3
    assert len(removed) == 3 and not any(caplog.records) and list(jobs.iterdir()) == []
    # a claimed removal that a server left unfinished is finished by the next sweep
    left = jobs / f".deleting-{ids[0]}-0123abcd"
    (left / "run").mkdir(parents=True)
    monkeypatch.setattr(deletion.shutil, "rmtree", real)
    deletion.finalize(db, jobs)
    assert list(jobs.iterdir()) == []


def test_users_commands_on_an_unreachable_database_are_one_line_and_exit_2():
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    for args in (["users", "add", "x"], ["users", "list"], ["users", "token", "x"]):
        r = CliRunner().invoke(app, [*args, "--database", "postgresql://someone:hunter2@127.0.0.1:1/nothing"])
        assert r.exit_code == 2, (args, r.output)
        assert "cannot reach the database" in r.output and "hunter2" not in r.output, r.output
        assert "Traceback" not in r.output and len([x for x in r.output.splitlines() if x.strip()]) <= 3


def test_a_server_on_a_port_in_use_stops_before_its_start_up(tmp_path):
    """The bind comes first: a second server on a used port exits 2 naming the port, and has not created its data
    directory, migrated a database or started a worker."""
    import socket

    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = CliRunner().invoke(app, ["serve", "--data", str(tmp_path / "data"), "--port", str(port)])
    assert r.exit_code == 2 and f"127.0.0.1:{port}" in r.output and "--port" in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "data").exists()  # no start-up ran
