"""Load and faults: 50 concurrent submissions and 500 polls; kill -9 of the server or of a worker mid-job,
SIGTERM, and two servers on one PostgreSQL.

A job that was interrupted ends with the tables of an uninterrupted `circuitstat audit` (bit for bit),
and its run directory shows that the stages finished before the fault were resumed, not recomputed.
The tests hand one data directory and its server on to each other (a fault test that ends a server
starts the next), so the module starts five servers, not one or two per test; each test also runs alone.
(Throughput and latency are measured by bench/serve.py, never asserted here.)
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import itertools
import os
import signal
import time

import pytest

from support import (AUDIT, TINY, Server, assert_same_tables, database, job_rows, make_user, manifest, run_cli_audit,
                     submit, wait_job)

pytestmark = pytest.mark.slow
SPEC = {**AUDIT, "bootstrap": {"n_resamples": 2000}}  # a stability stage of a second or more: the fault's window
BEFORE = ("index", "scores_exact", "scores_eap", "edge_stats")  # finished before the fault strikes
WORKERS = 2
USERS = [f"user{i}" for i in range(5)]
SETTINGS = {"quotas": {"max_active_jobs": 100, "requests_per_minute": 100_000}}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_cli_audit(SPEC, tmp_path_factory.mktemp("reference"))


def test_fifty_concurrent_submissions_and_five_hundred_polls(live):
    """5 users, 50 concurrent submissions, 500 status polls: nothing lost or duplicated, no 5xx, every job ends."""
    job = {"model": TINY, "task": "induction", "method": "eap", "n": 2, "batch_size": 2}
    server = live.running()
    clients = {u: server.client(live.tokens[u]) for u in USERS}
    codes = collections.Counter()
    try:
        with cf.ThreadPoolExecutor(max_workers=50) as pool:
            subs = list(pool.map(lambda i: (USERS[i % 5], submit(clients[USERS[i % 5]], {**job, "seed": i},
                                                                 kind="attribute", name=f"load {i}")), range(50)))
            codes.update(r.status_code for _, r in subs)
            assert codes[202] == 50, [r.text for _, r in subs if r.status_code != 202][:3]
            jobs = [(u, r.json()["id"]) for u, r in subs]
            targets = list(itertools.islice(itertools.cycle(jobs), 500))
            polls = list(pool.map(lambda uj: clients[uj[0]].get(f"/api/v1/jobs/{uj[1]}"), targets))
            codes.update(r.status_code for r in polls)
        assert all(r.status_code == 200 for r in polls) and not [c for c in codes if c >= 500]
        assert all(r.json()["state"] in ("queued", "running", "completed") for r in polls)
        ids = [j for _, j in jobs]
        assert len(set(ids)) == 50  # nothing duplicated
        for u, job_id in jobs:
            assert wait_job(clients[u], job_id)["state"] == "completed"  # nothing lost, every job ends
        for u in USERS:  # each user sees exactly their ten
            listed = clients[u].get("/api/v1/jobs", params={"scope": "own", "limit": 100}).json()
            assert sorted(j["id"] for j in listed["jobs"]) == sorted(j for v, j in jobs if v == u)
        rows = [r for r in job_rows(server.database_url, "jobs") if r["id"] in ids]
        assert len(rows) == 50 and all(r["state"] == "completed" and r["attempts"] == 1 for r in rows)
        attempts = [a["job_id"] for a in job_rows(server.database_url, "job_attempts") if a["job_id"] in ids]
        assert sorted(attempts) == sorted(ids)  # each ran exactly once
    finally:
        for c in clients.values():
            c.close()


class Live:
    """The module's data directory, its user, and the server running on it now (tests hand it on)."""

    def __init__(self, root) -> None:
        self.data, self.server, self.count = root / "data", None, 0
        self.data.mkdir(parents=True)
        db = database(f"sqlite:///{(self.data / 'service.db').resolve()}")
        self.tokens = {u: make_user(db, u) for u in ["alice", *USERS]}
        self.token = self.tokens["alice"]
        db.dispose()

    def start(self, **settings) -> Server:
        self.count += 1
        self.server = Server(self.data, name=f"server{self.count}", workers=WORKERS,
                             settings={**SETTINGS, **settings}).start()
        self.server.wait_ready()
        return self.server

    def running(self) -> Server:
        if self.server is None or self.server.proc.poll() is not None:
            return self.start()
        return self.server


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    holder = Live(tmp_path_factory.mktemp("faults"))
    holder.start()  # its workers warm up while the reference audit runs here
    yield holder
    if holder.server is not None and holder.server.proc.poll() is None:
        assert holder.server.stop() == 0


def _mid_job(run, timeout: float = 300) -> dict:
    """The run's stages once those in BEFORE are done and stability runs (the fault then strikes inside it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            stages = manifest(run)["stages"]
        except (OSError, ValueError):
            stages = {}
        if (all(stages.get(s, {}).get("status") == "done" for s in BEFORE)
                and stages.get("stability", {}).get("status") == "running"):
            return stages
        time.sleep(0.01)
    raise AssertionError("the job never reached its stability stage")


def _worker_pid(database_url: str, job_id: str) -> int:
    rows = [r for r in job_rows(database_url, "job_attempts") if r["job_id"] == job_id and r["ended_at"] is None]
    return int(rows[-1]["worker"].rsplit(" ", 1)[1])


def _gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _resumed(run, stages_before: dict) -> None:
    """The stages finished before the fault were not run again (one attempt each, same fingerprint)."""
    after = manifest(run)["stages"]
    for s in BEFORE:
        assert after[s]["attempts"] == 1 and after[s]["fingerprint"] == stages_before[s]["fingerprint"], s
    assert after["stability"]["status"] == "done"


def test_kill_9_of_the_server_mid_job_then_a_restart_completes_it_identically(live, reference):
    s1 = live.running()
    job = submit(s1.client(live.token), SPEC).json()
    run = live.data / "jobs" / job["id"] / "run"
    before = _mid_job(run)
    worker = _worker_pid(s1.database_url, job["id"])
    s1.proc.kill()
    s1.proc.wait(timeout=60)
    assert manifest(run)["stages"].get("stability", {}).get("status") != "done"  # killed mid-job
    assert _gone(worker)  # its worker followed it (the lifeline), releasing the run directory
    s2 = live.start()
    done = wait_job(s2.client(live.token), job["id"])
    assert done["state"] == "completed", done
    assert_same_tables(run, reference)
    _resumed(run, before)
    outcomes = [r["outcome"] for r in job_rows(s2.database_url, "job_attempts") if r["job_id"] == job["id"]]
    assert outcomes == ["lease expired", "completed"]


def test_kill_9_of_a_worker_resumes_the_job(live, reference):
    server = live.running()
    c = server.client(live.token)
    job = submit(c, SPEC).json()
    run = live.data / "jobs" / job["id"] / "run"
    before = _mid_job(run)
    worker = _worker_pid(server.database_url, job["id"])
    os.kill(worker, signal.SIGKILL)
    done = wait_job(c, job["id"])
    assert done["state"] == "completed" and done["attempts"] == 2, done
    assert_same_tables(run, reference)
    _resumed(run, before)
    attempts = [r for r in job_rows(server.database_url, "job_attempts") if r["job_id"] == job["id"]]
    assert [a["outcome"] for a in attempts] == ["worker died", "completed"]
    assert attempts[0]["worker"] != attempts[1]["worker"]  # a new worker took over
    deadline = time.monotonic() + 120
    while server.wait_ready()["workers_ready"] < WORKERS and time.monotonic() < deadline:
        time.sleep(0.1)  # the dead worker was replaced
    assert server.wait_ready()["workers_ready"] == WORKERS


def test_sigterm_drains_no_new_job_starts_and_running_jobs_checkpoint(live, reference):
    s1 = live.running()  # drain_seconds 0: running jobs are interrupted at once
    c = s1.client(live.token)
    jobs = [submit(c, SPEC).json() for _ in range(WORKERS + 1)]  # the last waits for a worker
    a, waiting = jobs[0], jobs[-1]
    run = live.data / "jobs" / a["id"] / "run"
    before = _mid_job(run)
    s1.send(signal.SIGTERM)
    assert s1.proc.wait(timeout=120) == 0  # a clean exit
    rows = {r["id"]: r for r in job_rows(s1.database_url, "jobs")}
    assert rows[a["id"]]["state"] == "queued" and rows[a["id"]]["lease_owner"] is None  # back in the queue
    assert rows[waiting["id"]]["state"] == "queued" and rows[waiting["id"]]["started_at"] is None  # never started
    outcome = [r["outcome"] for r in job_rows(s1.database_url, "job_attempts") if r["job_id"] == a["id"]]
    assert outcome == ["interrupted"]
    assert manifest(run)["stages"]["stability"]["status"] == "failed"  # interrupted, its finished stages kept

    # the next server resumes a; SIGTERM with time to drain lets it finish, and starts nothing new
    s2 = live.start(drain_seconds=300)
    wait_job(s2.client(live.token), a["id"], states=("running",))
    s2.send(signal.SIGTERM)
    assert s2.proc.wait(timeout=300) == 0
    rows = {r["id"]: r for r in job_rows(s2.database_url, "jobs")}
    assert rows[a["id"]]["state"] == "completed"
    assert rows[waiting["id"]]["state"] == "queued" and rows[waiting["id"]]["started_at"] is None
    assert_same_tables(run, reference)
    _resumed(run, before)


def test_two_servers_on_one_postgres_run_every_job_exactly_once(postgres, tmp_path):
    url = postgres.create_database("two")
    one = Server(tmp_path / "data", database=url, workers=2, name="one").start()
    two = Server(tmp_path / "data", database=url, workers=2, name="two").start()
    db = database(url)
    tokens = {u: make_user(db, u) for u in ("alice", "bob")}
    db.dispose()
    try:
        for s in (one, two):
            while s.wait_ready()["workers_ready"] < 2:
                time.sleep(0.1)
        spec = {**AUDIT, "methods": ["eap"], "task": {"name": "induction", "n": 8, "options": {"seq_len": 4}}}
        clients = [one.client(tokens["alice"]), two.client(tokens["bob"])]
        ids = [submit(clients[i % 2], {**spec, "seed": i}).json()["id"] for i in range(10)]
        for i, job_id in enumerate(ids):
            assert wait_job(clients[i % 2], job_id)["state"] == "completed"
        attempts = [r for r in job_rows(url, "job_attempts") if r["job_id"] in ids]
        assert sorted(r["job_id"] for r in attempts) == sorted(ids)  # one attempt per job, no more
        assert len({r["server"] for r in attempts}) == 2  # both servers took jobs from the one queue
        for job_id in ids:
            run = tmp_path / "data" / "jobs" / job_id / "run"
            assert len(manifest(run)["history"]) == 1  # the run directory was opened by one run only
    finally:
        assert one.stop() == 0 and two.stop() == 0
