"""A bounded load test: 5 users, 50 concurrent submissions and 500 status polls against one server.

No job is lost or duplicated, no response is a 5xx, and every job ends. (Throughput and latency are
measured by bench/serve.py, never asserted here.)
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import itertools

import pytest

from support import TINY, Server, database, job_rows, make_user, submit, wait_job

pytestmark = pytest.mark.slow
USERS = [f"user{i}" for i in range(5)]
JOB = {"model": TINY, "task": "induction", "method": "eap", "n": 2, "batch_size": 2}


def test_fifty_concurrent_submissions_and_five_hundred_polls(tmp_path):
    server = Server(tmp_path / "data", workers=2, settings={"quotas": {"max_active_jobs": 100}}).start()
    db = database(server.database_url)
    tokens = {u: make_user(db, u) for u in USERS}
    db.dispose()
    server.wait_ready()
    clients = {u: server.client(t) for u, t in tokens.items()}
    codes = collections.Counter()
    try:
        with cf.ThreadPoolExecutor(max_workers=50) as pool:
            subs = list(pool.map(lambda i: (USERS[i % 5], submit(clients[USERS[i % 5]], {**JOB, "seed": i},
                                                                 kind="attribute", name=f"load {i}")), range(50)))
            codes.update(r.status_code for _, r in subs)
            assert codes[202] == 50, [r.text for _, r in subs if r.status_code != 202][:3]
            jobs = [(u, r.json()["id"]) for u, r in subs]
            targets = list(itertools.islice(itertools.cycle(jobs), 500))
            polls = list(pool.map(lambda uj: clients[uj[0]].get(f"/api/v1/jobs/{uj[1]}"), targets))
            codes.update(r.status_code for r in polls)
        assert all(r.status_code == 200 for r in polls)
        assert all(r.json()["state"] in ("queued", "running", "completed") for r in polls)
        ids = [j for _, j in jobs]
        assert len(set(ids)) == 50  # nothing duplicated
        for u, job_id in jobs:
            assert wait_job(clients[u], job_id)["state"] == "completed"  # nothing lost, every job ends
        for u in USERS:  # each user sees exactly their ten
            listed = clients[u].get("/api/v1/jobs", params={"scope": "own", "limit": 100}).json()
            assert sorted(j["id"] for j in listed["jobs"]) == sorted(j for v, j in jobs if v == u)
        rows = job_rows(server.database_url, "jobs")
        assert len(rows) == 50 and all(r["state"] == "completed" and r["attempts"] == 1 for r in rows)
        attempts = job_rows(server.database_url, "job_attempts")
        assert sorted(a["job_id"] for a in attempts) == sorted(ids)  # each ran exactly once
        assert not [c for c in codes if c >= 500]
    finally:
        for c in clients.values():
            c.close()
        assert server.stop() == 0
