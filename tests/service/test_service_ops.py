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

    def user(self, name: str, *, scope: str = "full", admin: bool = False, expires_at: float | None = None) -> TestClient:
        """A client holding a new token of ``name`` (the user is made on first use)."""
        with self.db.session() as s:
            if s.query(User).filter_by(name=name).first() is None:
                accounts.add_user(s, name)
            if admin:
                accounts.set_admin(s, name, True)
            token = accounts.create_token(s, name, "test", scope=scope, expires_at=expires_at)
        c = TestClient(self.app, headers={"Authorization": f"Bearer {token}"})
        self.tokens[c] = token
        return c

    def job(self, owner: str, state: str = "completed", *, nbytes: int = 1000, age_days: float = 0.0) -> str:
        """A job of ``owner`` in ``state`` with a run directory and an upload of ``nbytes`` bytes each."""
        job_id = uuid.uuid4().hex
        t = now() - age_days * 86400
        folder = self.cfg.jobs_dir / job_id
        (folder / "run").mkdir(parents=True)
        (folder / "inputs").mkdir()
        (folder / "run" / "edges.parquet").write_bytes(b"x" * nbytes)
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
    assert alice.get(f"/api/v1/jobs/{job}").json()["state"] == "completed"  # nothing changed
    assert alice.post("/api/v1/tokens", json={"scope": "read"}).status_code == 201  # the full token may


def test_an_expired_token_is_refused_saying_it_expired(env):
    alice = env.user("alice")
    ident = env.tokens[alice].split("_")[1]
    assert alice.get("/api/v1/jobs").status_code == 200
    with env.db.session() as s:
        s.get(Token, ident).expires_at = now() - 1
    for method, path in (("GET", "/api/v1/jobs"), ("POST", "/api/v1/jobs"), ("GET", "/api/v1/tokens")):
        body = _problem(alice.request(method, path), 401)
        assert "expired" in body["detail"]
    wrong = TestClient(env.app, headers={"Authorization": f"Bearer {env.tokens[alice][:-1]}A"})
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
                                     "expired"}
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
