"""Comparing two jobs on the server (GET /api/v1/jobs/{a}/compare/{b} and its page), in process: the app with no
workers (create_app(start_workers=False)), jobs inserted as a finished worker leaves them, their run
directories synthetic audits (tests/report_builders.py). The oracle is the local `circuitstat compare` on the
same two run directories: the same numbers."""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: report_builders

from report_builders import EVIL, make_report_run
from circuitstat.pipelines.service import accounts
from circuitstat.pipelines.service.app import create_app
from circuitstat.pipelines.service.config import ServiceConfig
from circuitstat.pipelines.service.db import Job, JobEvent, User, now
from sqlalchemy import select
from circuitstat.reports.compare import compare_runs

USERS = ("alice", "bob")


def add_job(app, owner: str, run: Path | None, *, state: str = "completed", name: str = "job", model: str = "m",
            spec: dict | None = None, created: float | None = None) -> str:
    """A job row of ``owner`` in ``state`` (as the worker leaves it) with ``run`` copied as its run directory."""
    svc = app.state.service
    job_id = uuid.uuid4().hex
    if run is not None:
        shutil.copytree(run, svc.cfg.jobs_dir / job_id / "run")
    with svc.db.session() as s:
        uid = s.scalar(select(User.id).where(User.name == owner))
        t = created if created is not None else now()
        s.add(Job(id=job_id, owner_id=uid, kind="audit", name=name, model=model, spec=json.dumps(spec or {"n": 1}),
                  state=state, created_at=t, public=False, attempts=1 if state != "queued" else 0, not_before=0.0,
                  cancel_requested=False, max_work_flops=1e15, request_bytes=0,
                  finished_at=t if state in ("completed", "failed", "cancelled") else None))
        s.add(JobEvent(job_id=job_id, at=t, state=state, message="test"))
    return job_id


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app with no workers, two users and their tokens, and two synthetic audit runs."""
    root = tmp_path_factory.mktemp("svc")
    app = create_app(ServiceConfig(data=root / "data"), start_workers=False)
    runs = {"a": make_report_run(root / "ra", seed=0, variance=False), "b": make_report_run(root / "rb", seed=1, variance=False)}
    with TestClient(app) as client:
        tokens = {}
        with app.state.service.db.session() as s:
            for u in USERS:
                accounts.add_user(s, u)
                tokens[u] = accounts.create_token(s, u, "test")
        yield {"app": app, "client": client, "tokens": tokens, "runs": runs}


def _get(server, user: str, path: str, **kw):
    return server["client"].get(path, headers={"Authorization": f"Bearer {server['tokens'][user]}"}, **kw)


def _page(server, user: str, path: str, **kw):
    """GET page ``path`` as ``user``'s logged-in browser (the client keeps the session cookie)."""
    r = server["client"].post("/login", data={"token": server["tokens"][user]}, follow_redirects=False)
    assert r.status_code == 303
    return server["client"].get(path, **kw)


def _numbers(doc: dict) -> dict:
    """A comparison's rows and counts (what must match), without the labels (paths locally, job ids on the server)."""
    return {k: doc[k] for k in ("counts", "edges", "stability", "faithfulness", "claims", "estimands")}


def test_the_server_compares_two_jobs_with_the_local_commands_numbers(server) -> None:
    a = add_job(server["app"], "alice", server["runs"]["a"], name="before", model="zoo:attn-only-2l/seed-0")
    b = add_job(server["app"], "alice", server["runs"]["b"], name="after", model="zoo:attn-only-2l/seed-1")
    r = _get(server, "alice", f"/api/v1/jobs/{a}/compare/{b}")
    assert r.status_code == 200, r.text
    local = json.loads(json.dumps(compare_runs(server["runs"]["a"], server["runs"]["b"]).to_dict()))
    assert _numbers(r.json()) == _numbers(local) and r.json()["counts"]["edges_flagged"] > 0
    assert r.json()["runs"]["a"]["label"] == a and r.json()["runs"]["b"]["models"] == ["zoo:attn-only-2l/seed-1"]
    data = str(server["app"].state.service.cfg.data)
    assert data not in r.text and str(server["runs"]["a"]) not in r.text  # no path of either side
    page = _page(server, "alice", f"/jobs/{a}/compare/{b}")
    assert page.status_code == 200 and "Comparison: B minus A" in page.text
    assert EVIL not in page.text and "&lt;script&gt;" in page.text and data not in page.text
    flagged = page.text.split('id="flagged"')[1].split("</table>")[0]
    assert flagged.count("<tr>") == 1 + r.json()["counts"]["edges_flagged"]  # header + every flagged edge
    form = _page(server, "alice", f"/jobs/{a}/compare", params={"other": b}, follow_redirects=False)
    assert form.status_code == 303 and form.headers["location"] == f"/jobs/{a}/compare/{b}"


def test_compare_is_404_on_either_job_of_another_user_and_409_unfinished(server) -> None:
    mine = add_job(server["app"], "bob", server["runs"]["a"])
    theirs = add_job(server["app"], "alice", server["runs"]["b"])
    missing = "0" * 32
    nothing = _get(server, "bob", f"/api/v1/jobs/{mine}/compare/{missing}")
    assert nothing.status_code == 404
    for path in (f"/api/v1/jobs/{mine}/compare/{theirs}", f"/api/v1/jobs/{theirs}/compare/{mine}",
                 f"/api/v1/jobs/{theirs}/compare/{theirs}"):
        r = _get(server, "bob", path)
        assert r.status_code == 404 and r.json()["detail"] == nothing.json()["detail"], path
    assert _get(server, "alice", f"/api/v1/jobs/{theirs}/compare/{theirs}").status_code == 200  # the owner may
    blank = _page(server, "bob", f"/jobs/{mine}/compare/{missing}")
    for path in (f"/jobs/{mine}/compare/{theirs}", f"/jobs/{theirs}/compare/{mine}"):
        page = _page(server, "bob", path)
        assert page.status_code == 404 == blank.status_code and theirs not in page.text.replace(path, ""), path
    queued = add_job(server["app"], "bob", None, state="queued")
    r = _get(server, "bob", f"/api/v1/jobs/{mine}/compare/{queued}")
    assert r.status_code == 409 and "queued" in r.json()["detail"]


def test_runs_sharing_no_edge_are_422_named_by_job(server, tmp_path) -> None:
    import pyarrow.parquet as pq
    from report_builders import write_filled

    other = make_report_run(tmp_path / "o", seed=0, variance=False)
    for name in ("edges", "edge_stats"):
        t = pq.read_table(other / f"{name}.parquet").to_pydict()
        t["name"] = ["x:" + n for n in t["name"]]
        write_filled(t, other / f"{name}.parquet")
    a = add_job(server["app"], "alice", server["runs"]["a"])
    b = add_job(server["app"], "alice", other)
    r = _get(server, "alice", f"/api/v1/jobs/{a}/compare/{b}")
    assert r.status_code == 422 and "share no edge" in r.json()["detail"] and a in r.json()["detail"]
    assert str(server["app"].state.service.cfg.data) not in r.text
