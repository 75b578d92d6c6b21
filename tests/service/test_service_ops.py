"""Tokens (scopes, expiry, listing, rotation), the admin role, deleting jobs and retention, in process:
the FastAPI app without workers (fastapi.testclient), jobs as database rows and run directories made
here, as a finished job leaves them. No audit runs: what is tested is who may do what to which job."""

from __future__ import annotations

import json
import logging
import uuid

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from circuitstat.pipelines.service import accounts
from circuitstat.pipelines.service.db import Job, Token, User, now

MISSING = "0" * 32


class Env:
    """The app, its database and data directory, and a client per user."""

    def __init__(self, app, cfg) -> None:
        self.app, self.cfg, self.svc = app, cfg, app.state.service
        self.db, self.tokens, self.clients = self.svc.db, {}, {}

    def user(self, name: str, *, scope: str = "full", admin: bool = False,
             expires_at: float | None = None) -> TestClient:
        """A client holding a new token of ``name`` (the user is made on first use)."""
        with self.db.session() as s:
            if s.query(User).filter_by(name=name).first() is None:
                accounts.add_user(s, name)
            if admin:
                accounts.set_admin(s, name, True)
            token = accounts.create_token(s, name, "test", scope=scope, expires_at=expires_at)
        c = TestClient(self.app, headers={"Authorization": f"Bearer {token}", "Origin": "http://testserver"})
        self.tokens[c] = token
        return c

    def job(self, owner: str, state: str = "completed", *, nbytes: int = 1000, age_days: float = 0.0) -> str:
        """A job of ``owner`` in ``state`` with a run directory and an upload of ``nbytes`` bytes each."""
        job_id = uuid.uuid4().hex
        t = now() - age_days * 86400
        folder = self.cfg.jobs_dir / job_id
        (folder / "run").mkdir(parents=True)
        (folder / "inputs").mkdir()
        (folder / "run" / "data.bin").write_bytes(b"x" * nbytes)
        (folder / "inputs" / "task.jsonl").write_bytes(b"y" * nbytes)
        with self.db.session() as s:
            uid = s.query(User).filter_by(name=owner).one().id
            s.add(Job(id=job_id, owner_id=uid, kind="audit", name=f"{owner}'s job", model="m", spec='{"a": 1}',
                      state=state, created_at=t, started_at=t if state != "queued" else None,
                      finished_at=t if state in ("completed", "failed", "cancelled") else None, public=False,
                      attempts=0, not_before=0.0, cancel_requested=False, max_work_flops=1.0, request_bytes=nbytes,
                      lease_owner="gone-server" if state == "running" else None,
                      lease_expires=now() + 3600 if state == "running" else None))
        return job_id

    def row(self, job_id: str) -> Job:
        with self.db.session() as s:
            return s.get(Job, job_id)


@pytest.fixture
def env(tmp_path):
    from circuitstat.pipelines.service.app import create_app
    from circuitstat.pipelines.service.config import ServiceConfig

    cfg = ServiceConfig(data=tmp_path / "data", quotas={"requests_per_minute": 100_000})
    app = create_app(cfg, start_workers=False)
    with TestClient(app):  # the lifespan: migrations, the jobs directory
        yield Env(app, cfg)


def _problem(r, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    return r.json()


# ----- tokens -------------------------------------------------------------------------------------------------
def test_a_read_token_may_look_and_check_but_change_nothing(env):
    alice = env.user("alice")
    ci = env.user("alice", scope="read")
    job, bobs = env.job("alice"), env.job(env.user("bob") and "bob")
    assert ci.get("/api/v1/jobs").json()["total"] == 1 and ci.get(f"/api/v1/jobs/{job}").status_code == 200
    assert ci.get(f"/api/v1/jobs/{job}/log").status_code == 200 and ci.get("/api/v1/tokens").status_code == 200
    # checking claims and querying pass the scope check (they then look at the run, absent here: 409/422, not 403)
    assert ci.post(f"/api/v1/jobs/{job}/claims", content=b"claims: []").status_code != 403
    assert ci.post("/api/v1/query", json={"sql": "SELECT 1", "jobs": [job]}).status_code != 403
    writes = [("POST", "/api/v1/jobs", {"json": {"kind": "audit", "spec": {}}}),
              ("POST", "/api/v1/jobs/{j}/cancel", {}), ("DELETE", "/api/v1/jobs/{j}", {}),
              ("PUT", "/api/v1/jobs/{j}/sharing", {"json": {"public": True}}),
              ("POST", "/api/v1/tokens", {"json": {"scope": "full"}}),
              ("POST", f"/api/v1/tokens/{env.tokens[ci].split('_')[1]}/rotate", {}),
              ("DELETE", f"/api/v1/tokens/{env.tokens[alice].split('_')[1]}", {})]
    for method, path, kw in writes:
        answers = [ci.request(method, path.format(j=j), **kw) for j in (job, bobs, MISSING)]
        details = {_problem(r, 403)["detail"] for r in answers}  # the same for any job: the scope says no, not the job
        assert len(details) == 1 and "read-only" in details.pop(), path
        assert 'error="insufficient_scope"' in answers[0].headers["www-authenticate"]
    reads = [(m, p, kw) for m, p, kw in _job_endpoints(job) if not p.endswith(("/sharing", "/cancel", job))]
    assert len(reads) == 8  # log, manifest, tables, a table, report, claims (post and get), query; and status:
    lenient = TestClient(env.app, headers=dict(ci.headers), raise_server_exceptions=False)  # an empty run: not scope
    for method, path, kw in [*reads, ("GET", f"/api/v1/jobs/{job}", {})]:
        assert lenient.request(method, path, **kw).status_code not in (401, 403), path  # the scope lets it through
    assert alice.get(f"/api/v1/jobs/{job}").json()["state"] == "completed"  # nothing changed
    assert alice.post("/api/v1/tokens", json={"scope": "read"}).status_code == 201  # the full token may


def test_an_expired_token_is_refused_saying_it_expired(env):
    alice = env.user("alice")
    ident = env.tokens[alice].split("_")[1]
    assert alice.get("/api/v1/jobs").status_code == 200
    with env.db.session() as s:
        s.get(Token, ident).expires_at = now() - 1
    job = env.job("alice")
    every = [("GET", "/api/v1/jobs", {}), ("POST", "/api/v1/jobs", {}), ("GET", "/api/v1/tokens", {}),
             ("POST", "/api/v1/tokens", {"json": {}}), ("GET", "/api/v1/me", {}), *_job_endpoints(job)]
    for method, path, kw in every:
        assert "expired" in _problem(alice.request(method, path, **kw), 401)["detail"], path
    token = env.tokens[alice]
    wrong = TestClient(env.app, headers={"Authorization": f"Bearer {token[:-1]}{'A' if token[-1] != 'A' else 'B'}"})
    assert "expired" not in _problem(wrong.get("/api/v1/jobs"), 401)["detail"]  # only the holder learns it expired
    with pytest.raises(Exception, match="in the past"), env.db.session() as s:
        accounts.create_token(s, "alice", expires_at=now() - 5)
    # a browser session ends with its token's expiry
    soon = env.user("alice", expires_at=now() + 3600)
    r = soon.post("/login", data={"token": env.tokens[soon]}, follow_redirects=False)
    assert r.status_code == 303
    with env.db.session() as s:
        from circuitstat.pipelines.service.db import BrowserSession

        assert s.query(BrowserSession).one().expires_at <= now() + 3600


def test_tokens_are_listed_without_secrets_created_rotated_and_revoked(env):
    alice, bob = env.user("alice"), env.user("bob")
    made = alice.post("/api/v1/tokens", json={"label": "ci", "scope": "read", "expires_in_days": 30})
    assert made.status_code == 201, made.text
    new = made.json()
    assert new["scope"] == "read" and new["label"] == "ci" and 29.9 * 86400 < new["expires_at"] - now() <= 30 * 86400
    listed = alice.get("/api/v1/tokens")
    assert [t["id"] for t in listed.json()] == [env.tokens[alice].split("_")[1], new["id"]]
    secret = new["token"].split("_", 2)[2]
    assert secret not in listed.text and accounts.digest(secret) not in listed.text
    assert set(listed.json()[1]) == {"id", "label", "scope", "created_at", "expires_at", "revoked_at", "revoked",
                                     "expired", "parent_id"}
    ci = TestClient(env.app, headers={"Authorization": f"Bearer {new['token']}"})
    assert ci.get("/api/v1/me").json()["user"] == "alice"
    rotated = alice.post(f"/api/v1/tokens/{new['id']}/rotate").json()
    assert rotated["id"] != new["id"] and rotated["token"] != new["token"]
    assert (rotated["scope"], rotated["label"], rotated["expires_at"]) == ("read", "ci", new["expires_at"])
    assert ci.get("/api/v1/jobs").status_code == 401  # the old one is revoked
    ci2 = TestClient(env.app, headers={"Authorization": f"Bearer {rotated['token']}"})
    assert ci2.get("/api/v1/jobs").status_code == 200 and ci2.post("/api/v1/jobs", json={}).status_code == 403
    again = alice.post(f"/api/v1/tokens/{new['id']}/rotate")
    assert "revoked" in _problem(again, 422)["detail"]
    # another user's token is the same 404 as none, for every token endpoint
    for method, suffix in (("POST", "/rotate"), ("DELETE", "")):
        theirs = bob.request(method, f"/api/v1/tokens/{rotated['id']}{suffix}")
        nothing = bob.request(method, f"/api/v1/tokens/{'0' * 12}{suffix}")
        assert _problem(theirs, 404)["detail"] == _problem(nothing, 404)["detail"]
    assert rotated["id"] not in bob.get("/api/v1/tokens").text
    assert ci2.get("/api/v1/jobs").status_code == 200  # bob's attempts changed nothing
    assert alice.delete(f"/api/v1/tokens/{rotated['id']}").json()["revoked"] is True
    assert ci2.get("/api/v1/jobs").status_code == 401


def test_the_operator_commands_for_scopes_expiry_rotation_and_admins(env):
    from circuitstat.pipelines.cli import app

    run = CliRunner().invoke
    data = ["--data", str(env.cfg.data)]
    assert run(app, ["users", "add", "carol", *data]).exit_code == 0
    out = run(app, ["users", "token", "carol", "--scope", "read", "--expires-days", "2", "--label", "ci", *data])
    assert out.exit_code == 0, out.output
    token = out.output.strip()
    ident = token.split("_")[1]
    c = TestClient(env.app, headers={"Authorization": f"Bearer {token}"})
    assert c.get("/api/v1/jobs").status_code == 200 and c.post("/api/v1/jobs", json={}).status_code == 403
    listed = run(app, ["users", "tokens", "carol", *data]).output
    line = next(x for x in listed.splitlines() if x.startswith(ident))
    assert " read " in line and " live " in line and line.endswith("ci") and token.split("_", 2)[2] not in listed
    assert run(app, ["users", "token", "carol", "--scope", "admin", *data]).exit_code == 2  # typer refuses it
    rotated = run(app, ["users", "rotate", ident, *data])
    assert rotated.exit_code == 0 and accounts.TOKEN_PATTERN.fullmatch(rotated.output.strip())
    assert c.get("/api/v1/jobs").status_code == 401
    c2 = TestClient(env.app, headers={"Authorization": f"Bearer {rotated.output.strip()}"})
    assert c2.get("/api/v1/jobs").status_code == 200 and c2.post("/api/v1/jobs", json={}).status_code == 403
    assert " revoked " in run(app, ["users", "tokens", "carol", *data]).output
    assert run(app, ["users", "rotate", ident, *data]).exit_code == 2  # a revoked token is not rotated
    assert run(app, ["users", "admin", "carol", *data]).exit_code == 0
    assert "carol (admin)" in run(app, ["users", "list", *data]).output
    assert run(app, ["users", "admin", "carol", "--off", *data]).exit_code == 0
    assert "(admin)" not in run(app, ["users", "list", *data]).output


# ----- delete -------------------------------------------------------------------------------------------------
def _job_endpoints(job: str) -> list[tuple[str, str, dict]]:
    api = f"/api/v1/jobs/{job}"
    return [("GET", api, {}), ("GET", f"{api}/log", {}), ("GET", f"{api}/manifest", {}), ("GET", f"{api}/tables", {}),
            ("GET", f"{api}/tables/edges.parquet", {}), ("GET", f"{api}/report", {}),
            ("POST", f"{api}/claims", {"content": b"claims: []"}), ("GET", f"{api}/claims/{'1' * 32}", {}),
            ("POST", "/api/v1/query", {"json": {"sql": "SELECT 1", "jobs": [job]}}),
            ("PUT", f"{api}/sharing", {"json": {"public": False}}), ("POST", f"{api}/cancel", {}),
            ("DELETE", api, {})]


def test_delete_removes_the_files_and_keeps_a_tombstone(env, tmp_path):
    alice, bob, carol = env.user("alice"), env.user("bob"), env.user("carol")
    job, other = env.job("alice"), env.job("alice")
    assert alice.put(f"/api/v1/jobs/{job}/sharing", json={"users": ["carol"]}).status_code == 200
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    (env.cfg.jobs_dir / job / "run" / "link.txt").symlink_to(outside)  # removal never follows a link
    theirs, nothing = bob.delete(f"/api/v1/jobs/{job}"), bob.delete(f"/api/v1/jobs/{MISSING}")
    assert _problem(theirs, 404)["detail"] == _problem(nothing, 404)["detail"]
    assert carol.delete(f"/api/v1/jobs/{job}").status_code == 404  # seeing is not owning
    r = alice.delete(f"/api/v1/jobs/{job}")
    assert r.status_code == 200 and r.json() == {"id": job, "state": "deleted"}
    assert not (env.cfg.jobs_dir / job).exists() and outside.read_text() == "keep me"
    assert (env.cfg.jobs_dir / other / "run" / "data.bin").is_file()  # only that job's files
    row = env.row(job)
    assert row.state == "deleted" and row.deleted_at is not None and row.spec == "{}"
    for method, path, kw in _job_endpoints(job):  # 410 to its owner, on every endpoint
        assert _problem(alice.request(method, path, **kw), 410)["detail"].startswith("this job was deleted"), path
        for c in (bob, carol):  # everyone else, those it was shared with too: the same 404 as no job at all
            theirs, nothing = c.request(method, path, **kw), c.request(method, path.replace(job, MISSING), **kw)
            assert _problem(theirs, 404)["detail"] == _problem(nothing, 404)["detail"], path
    assert [j["id"] for j in alice.get("/api/v1/jobs").json()["jobs"]] == [other]
    assert job not in carol.get("/api/v1/jobs").text
    with env.db.session() as s:
        from circuitstat.pipelines.service.db import JobEvent

        events = [e.message for e in s.query(JobEvent).filter_by(job_id=job)]
    assert events == ["deleted by its owner"]


def test_deleting_a_running_job_cancels_it_first_and_a_queued_one_never_runs(env):
    from circuitstat.pipelines.service import queue
    from circuitstat.pipelines.service.dispatcher import Dispatcher, _Running

    alice = env.user("alice")
    running, queued = env.job("alice", "running"), env.job("alice", "queued")
    r = alice.delete(f"/api/v1/jobs/{running}")
    assert r.status_code == 202 and r.json()["state"] == "deleting"
    row = env.row(running)
    assert row.state == "running" and row.cancel_requested and row.deleted_at is not None
    assert (env.cfg.jobs_dir / running / "run").is_dir()  # its worker still runs: nothing removed under it
    assert alice.get(f"/api/v1/jobs/{running}").status_code == 410
    with env.db.session() as s:
        assert queue.cancel_requested(s, "gone-server") == [running]  # what its server's heartbeat stops
    d = Dispatcher(env.cfg, env.db, make_pool=lambda: None)
    d.server = "gone-server"
    d._record(running, _Running("audit", None, env.cfg.jobs_dir / running, now(), stopping="cancel"),
              {"status": "interrupted"})
    assert env.row(running).state == "deleted" and not (env.cfg.jobs_dir / running).exists()
    assert alice.delete(f"/api/v1/jobs/{queued}").json()["state"] == "deleted"
    assert env.row(queued).state == "deleted" and not (env.cfg.jobs_dir / queued).exists()
    # deleted while running on a server that then died: its lease expires, it is queued again, and never runs
    orphan = env.job("alice", "running")
    assert alice.delete(f"/api/v1/jobs/{orphan}").status_code == 202
    with env.db.session() as s:
        s.get(Job, orphan).lease_expires = now() - 1
    with env.db.session() as s:
        assert queue.expire_leases(s, max_attempts=3, postgres=False) == [orphan]
    assert env.row(orphan).state == "queued"
    with env.db.session() as s:
        assert queue.claim(s, "server", 30, 10, postgres=False) == []  # a job marked deleted is never claimed
    from circuitstat.pipelines.service.retention import sweep

    assert sweep(env.cfg, env.db) == {"expired": 0, "deleted": 1}  # the next sweep makes its tombstone
    assert env.row(orphan).state == "deleted" and not (env.cfg.jobs_dir / orphan).exists()


# ----- the admin role -----------------------------------------------------------------------------------------
def test_an_admin_lists_cancels_and_deletes_any_job_and_each_action_is_logged(env, caplog):
    alice, root = env.user("alice"), env.user("root", admin=True)
    root_read = env.user("root", scope="read")
    done, queued, running = env.job("alice"), env.job("alice", "queued"), env.job("alice", "running")
    bob = env.user("bob")
    for c in (alice, bob):  # not admins: the admin endpoint is 403, another user's job stays 404
        assert "admin" in _problem(c.get("/api/v1/admin/jobs"), 403)["detail"]
    assert bob.post(f"/api/v1/jobs/{queued}/cancel").status_code == 404
    assert bob.delete(f"/api/v1/jobs/{done}").status_code == 404
    assert root.get(f"/api/v1/jobs/{done}").status_code == 404  # admin powers are list, cancel, delete: not reading
    with caplog.at_level(logging.INFO, logger="circuitstat.service"):
        listed = root.get("/api/v1/admin/jobs").json()
        assert {j["id"] for j in listed["jobs"]} == {done, queued, running} and listed["total"] == 3
        assert root.get("/api/v1/admin/jobs", params={"owner": "bob"}).json()["total"] == 0
        assert root_read.get("/api/v1/admin/jobs").status_code == 200  # listing needs no full token
        assert root_read.delete(f"/api/v1/jobs/{done}").status_code == 403  # changing does
        assert root.post(f"/api/v1/jobs/{queued}/cancel").json()["state"] == "cancelled"
        assert root.post(f"/api/v1/jobs/{running}/cancel").status_code == 200 and env.row(running).cancel_requested
        assert root.delete(f"/api/v1/jobs/{done}").json()["state"] == "deleted"
        assert not (env.cfg.jobs_dir / done).exists()
        assert root.get("/api/v1/admin/jobs", params={"state": "deleted"}).json()["jobs"][0]["id"] == done
    lines = [(r.admin, r.action, r.job, r.owner) for r in caplog.records if r.getMessage() == "admin action"]
    assert lines == [("root", "list", None, None), ("root", "list", None, None), ("root", "list", None, None),
                     ("root", "cancel", queued, "alice"), ("root", "cancel", running, "alice"),
                     ("root", "delete", done, "alice"), ("root", "list", None, None)]
    with env.db.session() as s:
        from circuitstat.pipelines.service.db import JobEvent

        assert [e.message for e in s.query(JobEvent).filter_by(job_id=done)] == ["deleted by admin root"]


def _login(env, client: TestClient) -> TestClient:
    r = client.post("/login", data={"token": env.tokens[client]}, follow_redirects=False)
    assert r.status_code == 303, r.text
    browser = TestClient(env.app, follow_redirects=False, headers={"Origin": "http://testserver"})  # its own pages
    browser.cookies.set("circuitstat_session", r.cookies["circuitstat_session"])
    return browser


def test_the_admin_page_lists_and_deletes_any_job_and_others_get_403(env, caplog):
    alice, root, ci = env.user("alice"), env.user("root", admin=True), env.user("alice", scope="read")
    job, mine = env.job("alice"), env.job("alice")
    page = _login(env, root).get("/admin/jobs")
    assert page.status_code == 200 and job in page.text and "alice" in page.text
    assert _login(env, alice).get("/admin/jobs").status_code == 403
    with caplog.at_level(logging.INFO, logger="circuitstat.service"):
        r = _login(env, root).post(f"/jobs/{job}/delete?back=admin")
    assert r.status_code == 303 and r.headers["location"] == "/admin/jobs" and not (env.cfg.jobs_dir / job).exists()
    assert any(x.getMessage() == "admin action" and x.job == job and x.action == "delete" for x in caplog.records)
    assert _login(env, ci).post(f"/jobs/{mine}/delete").status_code == 403  # a read token's browser changes nothing
    owner = _login(env, alice)
    assert 'id="delete"' in owner.get(f"/jobs/{mine}").text and 'id="delete"' not in _login(env, ci).get(
        f"/jobs/{mine}").text
    assert owner.post(f"/jobs/{mine}/delete").headers["location"] == "/jobs" and env.row(mine).state == "deleted"
    assert owner.get(f"/jobs/{mine}").status_code == 410


# ----- retention ----------------------------------------------------------------------------------------------
def _bytes_on_disk(folder) -> int:
    """The oracle of the disk quota: every regular file under ``folder`` by os.walk."""
    import os

    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(folder) for f in files
               if not os.path.islink(os.path.join(d, f)))


def test_the_disk_quota_refuses_a_submission_over_it(tmp_path):
    from circuitstat.pipelines.service.app import create_app
    from circuitstat.pipelines.service.config import ServiceConfig
    from support import AUDIT

    cfg = ServiceConfig(data=tmp_path / "data", users={"alice": {"max_disk_bytes": 5000}})
    with TestClient(create_app(cfg, start_workers=False)) as app_client:
        env = Env(app_client.app, cfg)
        alice, bob = env.user("alice"), env.user("bob")
        jobs = [env.job("alice", nbytes=1500), env.job("alice", nbytes=1000)]
        env.job("bob", nbytes=100_000)  # bob's bytes are not alice's
        used = alice.get("/api/v1/me").json()["disk_bytes"]
        assert used == _bytes_on_disk(env.cfg.jobs_dir / jobs[0]) + _bytes_on_disk(env.cfg.jobs_dir / jobs[1]) == 5000
        r = alice.post("/api/v1/jobs", json={"kind": "audit", "spec": AUDIT})
        body = _problem(r, 422)
        assert body["disk_bytes"] == 5000 and body["max_disk_bytes"] == 5000 and "DELETE" in body["detail"]
        assert len(list(env.cfg.jobs_dir.iterdir())) == 3  # nothing written for the refused request
        assert bob.post("/api/v1/jobs", json={"kind": "audit", "spec": AUDIT}).status_code == 202  # no quota
        assert alice.delete(f"/api/v1/jobs/{jobs[0]}").status_code == 200
        assert alice.get("/api/v1/me").json()["disk_bytes"] == 2000
        assert alice.post("/api/v1/jobs", json={"kind": "audit", "spec": AUDIT}).status_code == 202


def test_retention_expires_old_finished_jobs_on_the_dispatchers_sweep(tmp_path):
    from circuitstat.pipelines.service.config import ServiceConfig
    from circuitstat.pipelines.service.dispatcher import Dispatcher
    from circuitstat.pipelines.service.retention import sweep

    class NoPool:  # the dispatcher's pool, idle
        def poll(self):
            return []

        def ready(self):
            return 0

        def free(self):
            return 0

    from circuitstat.pipelines.service.app import create_app

    cfg = ServiceConfig(data=tmp_path / "data", retention_days=30)
    with TestClient(create_app(cfg, start_workers=False)) as c:
        env = Env(c.app, cfg)
        env.user("alice")
        old = {state: env.job("alice", state, age_days=40) for state in ("completed", "failed", "cancelled",
                                                                           "running", "queued")}
        young = env.job("alice", "completed", age_days=29)
        d = Dispatcher(cfg, env.db, make_pool=lambda: None)
        d.pool = NoPool()
        d.tick()  # the first tick sweeps
        for state, job in old.items():
            expired = state in ("completed", "failed", "cancelled")
            assert (env.row(job).state == "deleted") == expired, state
            assert (env.cfg.jobs_dir / job).exists() != expired, state
        assert env.row(young).state == "completed" and (env.cfg.jobs_dir / young).exists()
        assert sweep(cfg, env.db) == {"expired": 0, "deleted": 0}  # nothing twice
        assert sweep(cfg, env.db, at=now() + 2 * 86400)["expired"] == 1  # two days on, the young one's turn
        assert env.row(young).state == "deleted"
        with env.db.session() as s:
            from circuitstat.pipelines.service.db import JobEvent

            assert s.query(JobEvent).filter_by(job_id=young).one().message == "expired: finished more than 30 days ago"
        (env.cfg.jobs_dir / young / "run").mkdir(parents=True)  # a tombstone's files left by a crash: swept
        assert sweep(cfg, env.db) == {"expired": 0, "deleted": 0} and not (env.cfg.jobs_dir / young).exists()


# ----- the schema -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0002_upgrades_a_database_made_by_0001(backend, tmp_path, request):
    from alembic import command
    from alembic.config import Config
    from pathlib import Path

    from circuitstat.pipelines.service import db as dbmod
    from circuitstat.pipelines.service.db import Database, migrate

    url = (f"sqlite:///{tmp_path / 'old.db'}" if backend == "sqlite"
           else request.getfixturevalue("postgres").create_database("mig"))
    d = Database(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(dbmod.__file__).with_name("migrations")))
    with d.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")  # the schema an older server made
    secret = "s" * 43
    with d.engine.begin() as conn:
        from sqlalchemy import text

        conn.execute(text("INSERT INTO users (name, created_at, disabled) VALUES ('old', 1.0, false)"))
        uid = conn.execute(text("SELECT id FROM users")).scalar()
        conn.execute(text("INSERT INTO tokens (id, user_id, digest, label, created_at) VALUES "
                          "('abcdefabcdef', :u, :d, 'old', 1.0)"), {"u": uid, "d": accounts.digest(secret)})
        conn.execute(text("INSERT INTO jobs (id, owner_id, kind, name, model, spec, state, created_at, public, "
                          "attempts, not_before, cancel_requested, max_work_flops, request_bytes) VALUES "
                          f"('{'a' * 32}', :u, 'audit', 'j', 'm', '{{}}', 'completed', 1.0, false, 1, 0, false, 1, 0)"),
                     {"u": uid})
    migrate(d.engine)  # to head: 0002 on top
    with d.session() as s:
        p = accounts.authenticate(s, f"csk_abcdefabcdef_{secret}")
        assert p is not None and p.scope == "full" and p.admin is False  # old tokens: full, never expiring
        assert s.get(Token, "abcdefabcdef").expires_at is None
        job = s.get(Job, "a" * 32)
        assert job.deleted_at is None and job.state == "completed"
    d.dispose()


def test_the_report_of_a_completed_job_whose_run_holds_no_tables_is_409_not_500(env):
    """Found while testing deletion: render_report's RunDirError escaped as an unhandled 500."""
    alice = env.user("alice")
    job_id = env.job("alice")  # completed, but its run directory holds no manifest or tables
    body = _problem(alice.get(f"/api/v1/jobs/{job_id}/report"), 409)
    assert str(env.cfg.data) not in json.dumps(body)  # names the job, never the server's folder
