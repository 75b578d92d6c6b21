"""Re-run, queue position, and search/sort/pagination of the job list, in process (inprocess.App: no workers;
job rows inserted as the API leaves them). What a worker does with a re-run is the end-to-end test's
(test_service_api.py::test_a_rerun_runs_the_same_spec_into_the_same_tables)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

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
        order = [job_id for job_id, _ in queue.fair_order(s)]
        # round-robin by user: bob (nothing running) first, then alice's first (one running) beside bob's second
        assert order[0] in (ids[1], same_time) and order[1] == ids[0] and order[3] == ids[2]
        assert order == [j.id for j in queue.claim(s, "probe", 5.0, 10, False)]  # the order the server takes them
        s.rollback()
    want = {job: i + 1 for i, job in enumerate(order)}
    for job in [*ids, same_time]:
        owner = "bob" if job in (ids[1], same_time) else "alice"
        assert server.get(owner, f"/api/v1/jobs/{job}").json()["queue_position"] == want[job]
    assert server.get("alice", f"/api/v1/jobs/{running}").json()["queue_position"] is None


# ----- search, sort, pages --------------------------------------------------------------------------------
NAMES = ["IOI audit", "ioi small", "50%_done", "5000done", "greater-than", "Induction", "induction b",
         "' OR 1=1 --", "zeta", "alpha"]
STATES = ["completed", "queued", "failed", "running", "cancelled"]
DAY = 86400.0
T0 = datetime(2026, 5, 28, tzinfo=timezone.utc).timestamp()


@pytest.fixture
def listed(server):
    """Ten jobs of alice (names, models, states and days of NAMES, models a/b, STATES cycled) and one of bob."""
    rows = []
    for i, name in enumerate(NAMES):
        model = "zoo:attn-only-2l/seed-0" if i % 2 else "random:gpt2?n_layer=1"
        state, created = STATES[i % len(STATES)], T0 + (i % 7) * DAY  # days repeat: created ties happen
        rows.append({"id": server.add_job("alice", name=name, model=model, state=state, created=created),
                     "name": name, "model": model, "state": state, "created_at": created})
    server.add_job("bob", name="IOI of bob", state="completed")
    return rows


def _ids(server: App, **params) -> list[str]:
    r = server.get("alice", "/api/v1/jobs", params=params)
    assert r.status_code == 200, r.text
    return [j["id"] for j in r.json()["jobs"]]


def test_filters_by_name_model_state_and_dates_as_parameters(server, listed) -> None:
    def want(pred):
        return sorted((r for r in listed if pred(r)), key=lambda r: (r["created_at"], r["id"]), reverse=True)

    by_id = lambda rows: [r["id"] for r in rows]  # noqa: E731
    assert _ids(server, name="ioi") == by_id(want(lambda r: "ioi" in r["name"].lower()))  # any case, bob's not
    assert _ids(server, name="%_") == by_id(want(lambda r: "%_" in r["name"]))  # wildcards are literal
    assert _ids(server, name="' OR 1=1 --") == by_id(want(lambda r: r["name"] == "' OR 1=1 --"))
    assert _ids(server, model="ZOO:") == by_id(want(lambda r: r["model"].startswith("zoo")))
    assert _ids(server, state="failed", model="random") == by_id(want(lambda r: r["state"] == "failed"
                                                                        and r["model"].startswith("random")))
    after, before = T0 + 2 * DAY, T0 + 5 * DAY
    in_range = by_id(want(lambda r: after <= r["created_at"] < before))
    assert _ids(server, created_after="2026-05-30", created_before="2026-06-02") == in_range
    assert _ids(server, created_after=str(after), created_before=f"{before}") == in_range
    bad = server.get("alice", "/api/v1/jobs", params={"created_after": "yesterday"})
    assert bad.status_code == 422 and "ISO 8601" in bad.json()["detail"]
    assert server.get("bob", "/api/v1/jobs", params={"name": "ioi"}).json()["total"] == 1  # his own only


@pytest.mark.parametrize("sort,order", [("created", "desc"), ("created", "asc"), ("name", "asc"), ("name", "desc"),
                                        ("state", "asc"), ("state", "desc")])
def test_cursor_pages_walk_the_whole_sorted_list_once(server, listed, sort, order) -> None:
    key = {"created": lambda r: r["created_at"], "name": lambda r: r["name"],
           "state": lambda r: STATES_ORDER.index(r["state"])}[sort]
    want = [r["id"] for r in sorted(listed, key=lambda r: (key(r), r["id"]), reverse=order == "desc")]
    got, cursor, pages = [], None, 0
    while True:
        r = server.get("alice", "/api/v1/jobs", params={"sort": sort, "order": order, "limit": 3,
                                                        **({"cursor": cursor} if cursor else {})}).json()
        assert r["total"] == len(listed) + (pages >= 2) and len(r["jobs"]) <= 3  # the late job counts once there
        got += [j["id"] for j in r["jobs"]]
        pages += 1
        cursor = r["next_cursor"]
        if cursor is None:
            break
        if pages == 2:  # a job submitted mid-walk neither repeats nor shifts the rest of it
            server.add_job("alice", name="late", state="queued", created=T0 + 3.5 * DAY)
    assert [g for g in got if g in want] == want and len(got) == len(set(got))  # each once, in order
    assert pages == 4
    paged = server.get("alice", "/api/v1/jobs", params={"sort": sort, "order": order, "limit": 3, "page": 2}).json()
    assert len(paged["jobs"]) == 3


from circuitstat.pipelines.service.db import JOB_STATES as STATES_ORDER  # noqa: E402


def test_the_page_size_is_bounded_and_cursors_are_checked(server, listed) -> None:
    from circuitstat.pipelines.service.listing import MAX_PAGE_SIZE

    r = server.get("alice", "/api/v1/jobs", params={"limit": MAX_PAGE_SIZE + 1})
    assert r.status_code == 422  # no request lifts it
    assert len(server.get("alice", "/api/v1/jobs", params={"limit": MAX_PAGE_SIZE}).json()["jobs"]) == len(listed)
    first = server.get("alice", "/api/v1/jobs", params={"limit": 2, "sort": "name"}).json()
    for params in ({"cursor": first["next_cursor"]},  # given for sort=name, used with created
                   {"cursor": first["next_cursor"], "sort": "name", "page": 2},
                   {"cursor": "not-a-cursor", "sort": "name"},
                   {"cursor": "eyJzIjoibmFtZSIsIm8iOiJkZXNjIiwidiI6MSwiaSI6IngifQ", "sort": "name"}):  # v not a name
        r = server.get("alice", "/api/v1/jobs", params={"limit": 2, **params})
        assert r.status_code == 422, params
    nxt = server.get("alice", "/api/v1/jobs", params={"limit": 2, "sort": "name", "cursor": first["next_cursor"]})
    assert nxt.status_code == 200 and len(nxt.json()["jobs"]) == 2


def test_the_jobs_page_searches_sorts_and_pages(server, listed) -> None:
    page = server.page("alice", "/jobs", params={"name": "ioi", "sort": "name", "order": "asc"})
    assert page.status_code == 200
    import re

    names = re.findall(r'<td><a href="/jobs/[0-9a-f]{32}">([^<]*)</a>', page.text)
    assert names == sorted(n for n in NAMES if "ioi" in n.lower())
    first = server.page("alice", "/jobs", params={"sort": "name", "order": "asc"})
    assert first.text.count('<tr data-job="') == len(listed) and 'id="next"' not in first.text
    for i in range(60 - len(listed)):
        server.add_job("alice", name=f"bulk {i:02d}", created=T0 - i)
    one = server.page("alice", "/jobs", params={"sort": "name", "order": "asc"})
    two = server.page("alice", "/jobs", params={"sort": "name", "order": "asc", "page": "2"})
    assert one.text.count('<tr data-job="') == 50 and two.text.count('<tr data-job="') == 10
    assert 'id="next"' in one.text and "page=2" in one.text and 'id="prev"' in two.text
    bad = server.page("alice", "/jobs", params={"after": "nonsense"})
    assert bad.status_code == 422
