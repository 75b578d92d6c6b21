"""Re-run, queue position, and search/sort/pagination of the job list, in process (inprocess.App: no workers;
job rows inserted as the API leaves them). What a worker does with a re-run is the end-to-end test's
(test_service_api.py::test_a_rerun_runs_the_same_spec_into_the_same_tables)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from inprocess import App

from circuitstat.pipelines.service.db import Job


@pytest.fixture
def server(tmp_path):
    app = App(tmp_path / "data", users=("alice", "bob", "carol"),
              sources={"zoo": ["attn-only-2l"], "random": True, "models": {}})
    yield app
    app.close()


def _uploaded_job(server: App, owner: str) -> str:
    """A failed job of ``owner`` whose spec names an uploaded task file by its path in the job's inputs."""
    job = server.add_job(owner, state="failed", model="zoo:attn-only-2l/seed-0")
    inputs = server.svc.cfg.jobs_dir / job / "inputs"
    inputs.mkdir()
    (inputs / "ioi.jsonl").write_text('{"clean": "a", "corrupted": "b", "answer": " c", "wrong_answer": " d"}\n')
    (inputs / "spec.yaml").write_text("task: ioi.jsonl\n")
    spec = {"model": "zoo:attn-only-2l/seed-0", "task": {"name": str((inputs / "ioi.jsonl").resolve()), "n": 1}}
    with server.svc.db.session() as s:
        s.get(Job, job).spec = json.dumps(spec)
    return job


def test_a_rerun_is_a_new_queued_job_with_the_same_spec_and_uploads_and_its_parent(server) -> None:
    parent = _uploaded_job(server, "alice")
    r = server.post("alice", f"/api/v1/jobs/{parent}/rerun")
    assert r.status_code == 202, r.text
    child = r.json()
    assert child["id"] != parent and child["parent_id"] == parent and child["state"] == "queued"
    assert child["links"]["parent"] == f"/api/v1/jobs/{parent}" and child["queue_position"] == 1
    assert server.get("alice", f"/api/v1/jobs/{child['id']}").json()["parent_id"] == parent  # the status shows it
    jobs = server.svc.cfg.jobs_dir
    with server.svc.db.session() as s:
        old, new = s.get(Job, parent), s.get(Job, child["id"])
        spec_old, spec_new = json.loads(old.spec), json.loads(new.spec)
        assert (new.kind, new.name, new.model, new.public) == (old.kind, old.name, old.model, False)
    assert spec_new["task"]["name"] == str((jobs / child["id"] / "inputs" / "ioi.jsonl").resolve())
    assert {**spec_new, "task": None} == {**spec_old, "task": None}  # nothing else changed
    for name in ("ioi.jsonl", "spec.yaml"):  # the uploads travel with it
        assert (jobs / child["id"] / "inputs" / name).read_bytes() == (jobs / parent / "inputs" / name).read_bytes()
    page = server.page("alice", f"/jobs/{child['id']}")
    assert 'id="parent"' in page.text and f'href="/jobs/{parent}"' in page.text and 'id="queue-position"' in page.text
    assert f'href="/jobs/{child["id"]}"' in server.page("alice", f"/jobs/{parent}").text  # the parent lists it
    done = server.page("alice", f"/jobs/{parent}/rerun", method="POST", follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"].startswith("/jobs/")


def test_only_the_owner_reruns_and_others_get_the_404_of_no_job(server) -> None:
    job = server.add_job("alice", state="completed")
    with server.svc.db.session() as s:  # public: bob and carol see it, and seeing is not owning
        s.get(Job, job).public = True
    missing = server.post("bob", f"/api/v1/jobs/{'0' * 32}/rerun")
    for user in ("bob", "carol"):
        r = server.post(user, f"/api/v1/jobs/{job}/rerun")
        assert r.status_code == 404 == missing.status_code and r.json()["detail"] == missing.json()["detail"]
        assert server.page(user, f"/jobs/{job}/rerun", method="POST").status_code == 404
        assert 'id="rerun"' not in server.page(user, f"/jobs/{job}").text  # no button on another's job
    with server.svc.db.session() as s:
        assert s.scalar(select(Job.id).where(Job.parent_id == job)) is None  # nothing was created


def test_a_rerun_obeys_todays_allow_list_and_active_job_quota(tmp_path) -> None:
    app = App(tmp_path / "data", sources={"zoo": [], "random": True, "models": {}},
              quotas={"max_active_jobs": 2})
    try:
        gone = app.add_job("alice", model="zoo:attn-only-2l/seed-0")
        r = app.post("alice", f"/api/v1/jobs/{gone}/rerun")
        assert r.status_code == 422 and "not allowed" in r.json()["detail"]
        job = app.add_job("alice", model="random:gpt2?n_layer=1")
        assert app.post("alice", f"/api/v1/jobs/{job}/rerun").status_code == 202
        assert app.post("alice", f"/api/v1/jobs/{job}/rerun").status_code == 202
        over = app.post("alice", f"/api/v1/jobs/{job}/rerun")
        assert over.status_code == 429 and over.headers["retry-after"]
        assert len(list((tmp_path / "data" / "jobs").iterdir())) == 4  # no directory left by the refusals
    finally:
        app.close()


def test_queue_position_counts_the_queued_jobs_taken_first(server) -> None:
    t = 1000.0
    ids = [server.add_job(u, state="queued", created=t + i) for i, u in enumerate(("alice", "bob", "alice"))]
    running = server.add_job("alice", state="running", created=t - 5)
    same_time = server.add_job("bob", state="queued", created=t + 1)  # ties: the id decides, as claim() orders
    from circuitstat.pipelines.service import queue

    with server.svc.db.session() as s:
        order = [j.id for j in s.scalars(select(Job).where(Job.state == "queued")
                                         .order_by(Job.created_at, Job.id))]
        assert order == [j.id for j in queue.claim(s, "probe", 5.0, 10, False)]  # the order the server takes them
        s.rollback()
    want = {job: i + 1 for i, job in enumerate(order)}
    for job in [*ids, same_time]:
        owner = "bob" if job in (ids[1], same_time) else "alice"
        assert server.get(owner, f"/api/v1/jobs/{job}").json()["queue_position"] == want[job]
    assert server.get("alice", f"/api/v1/jobs/{running}").json()["queue_position"] is None
