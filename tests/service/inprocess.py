"""The service in this process for tests that need no worker: the app of create_app(start_workers=False) under
FastAPI's TestClient, users with tokens, and job rows inserted as the API or a worker leaves them."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import select

from circuitstat.pipelines.service import accounts
from circuitstat.pipelines.service.app import create_app
from circuitstat.pipelines.service.config import ServiceConfig
from circuitstat.pipelines.service.db import Job, JobEvent, User, now


class App:
    """One in-process app on a fresh data directory; ``get``/``post`` as a user (bearer), ``page`` as their browser."""

    def __init__(self, data: Path, users=("alice", "bob"), **settings) -> None:
        self.app = create_app(ServiceConfig(data=data, **settings), start_workers=False)
        self.client = TestClient(self.app).__enter__()
        self.svc = self.app.state.service
        self.tokens = {}
        with self.svc.db.session() as s:
            for u in users:
                accounts.add_user(s, u)
                self.tokens[u] = accounts.create_token(s, u, "test")

    def close(self) -> None:
        self.client.__exit__(None, None, None)

    def _auth(self, user: str) -> dict:
        return {"Authorization": f"Bearer {self.tokens[user]}"}

    def get(self, user: str, path: str, **kw):
        return self.client.get(path, headers=self._auth(user), **kw)

    def post(self, user: str, path: str, **kw):
        return self.client.post(path, headers=self._auth(user), **kw)

    def page(self, user: str, path: str, method: str = "GET", **kw):
        """``path`` as ``user``'s logged-in browser (the client keeps the session cookie)."""
        same = {"Origin": "http://testserver"}  # a form of the server's own page (pages.py refuses one without)
        r = self.client.post("/login", data={"token": self.tokens[user]}, headers=same, follow_redirects=False)
        assert r.status_code == 303
        return self.client.request(method, path, **{"headers": same, **kw})

    def add_job(self, owner: str, run: Path | None = None, *, state: str = "completed", name: str = "job",
                model: str = "random:gpt2?n_layer=1", spec: dict | None = None, created: float | None = None,
                kind: str = "audit", job_id: str | None = None) -> str:
        """A job row of ``owner`` in ``state`` with ``run`` copied as its run directory; its id."""
        job_id = job_id or uuid.uuid4().hex
        (self.svc.cfg.jobs_dir / job_id).mkdir(parents=True)
        if run is not None:
            shutil.copytree(run, self.svc.cfg.jobs_dir / job_id / "run")
        t = created if created is not None else now()
        with self.svc.db.session() as s:
            uid = s.scalar(select(User.id).where(User.name == owner))
            s.add(Job(id=job_id, owner_id=uid, kind=kind, name=name, model=model, spec=json.dumps(spec or {"n": 1}),
                      state=state, created_at=t, public=False, attempts=0 if state == "queued" else 1, not_before=0.0,
                      cancel_requested=False, max_work_flops=1e15, request_bytes=0,
                      finished_at=t if state in ("completed", "failed", "cancelled") else None))
            s.add(JobEvent(job_id=job_id, at=t, state=state, message="test"))
        return job_id
