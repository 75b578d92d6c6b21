"""Faults: kill -9 of the server or of a worker mid-job, SIGTERM, and two servers on one PostgreSQL.

A job that was interrupted ends with the tables of an uninterrupted `circuitstat audit` (bit for bit),
and its run directory shows that the stages finished before the fault were resumed, not recomputed.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from support import (AUDIT, Server, assert_same_tables, database, job_rows, make_user, manifest, run_cli_audit,
                     submit, wait_job)

pytestmark = pytest.mark.slow
SPEC = {**AUDIT, "bootstrap": {"n_resamples": 300}}  # a stability stage of a few seconds: a window for the fault
BEFORE = ("index", "scores_exact", "scores_eap", "edge_stats")  # finished before the fault strikes


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_cli_audit(SPEC, tmp_path_factory.mktemp("reference"))


class Live:
    """The module's data directory, its user, and the server running on it now (tests hand it on)."""

    def __init__(self, root) -> None:
        self.data, self.server, self.count = root / "data", None, 0
        self.data.mkdir(parents=True)
        db = database(f"sqlite:///{(self.data / 'service.db').resolve()}")
        self.token = make_user(db, "alice")
        db.dispose()

    def start(self, **settings) -> Server:
        self.count += 1
        self.server = Server(self.data, name=f"server{self.count}", settings=settings).start()
        self.server.wait_ready()
        return self.server

    def running(self) -> Server:
        if self.server is None or self.server.proc.poll() is not None:
            return self.start()
        return self.server


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    holder = Live(tmp_path_factory.mktemp("faults"))
    yield holder
    if holder.server is not None and holder.server.proc.poll() is None:
        assert holder.server.stop() == 0


def _mid_job(run, timeout: float = 300) -> dict:
    """The run's stages once those in BEFORE are done (the job is then inside its stability stage)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run / "manifest.json").is_file():
            stages = manifest(run)["stages"]
            if all(stages.get(s, {}).get("status") == "done" for s in BEFORE):
                return stages
        time.sleep(0.02)
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
    assert server.wait_ready()["workers_ready"] == 1


def test_sigterm_drains_no_new_job_starts_and_running_jobs_checkpoint(live, reference):
    s1 = live.running()  # drain_seconds 0: running jobs are interrupted at once
    c = s1.client(live.token)
    a = submit(c, SPEC).json()
    b = submit(c, SPEC).json()  # one worker: b waits behind a
    run = live.data / "jobs" / a["id"] / "run"
    before = _mid_job(run)
    s1.send(signal.SIGTERM)
    assert s1.proc.wait(timeout=120) == 0  # a clean exit
    jobs = {r["id"]: r for r in job_rows(s1.database_url, "jobs")}
    assert jobs[a["id"]]["state"] == "queued" and jobs[a["id"]]["lease_owner"] is None  # back in the queue
    assert jobs[b["id"]]["state"] == "queued" and jobs[b["id"]]["started_at"] is None  # never started
    outcome = [r["outcome"] for r in job_rows(s1.database_url, "job_attempts") if r["job_id"] == a["id"]]
    assert outcome == ["interrupted"]
    assert manifest(run)["stages"]["stability"]["status"] == "failed"  # interrupted, its finished stages kept

    # the next server resumes a; SIGTERM with time to drain lets a finish and starts nothing new
    s2 = live.start(drain_seconds=300)
    wait_job(s2.client(live.token), a["id"], states=("running",))
    s2.send(signal.SIGTERM)
    assert s2.proc.wait(timeout=300) == 0
    jobs = {r["id"]: r for r in job_rows(s2.database_url, "jobs")}
    assert jobs[a["id"]]["state"] == "completed"
    assert jobs[b["id"]]["state"] == "queued" and jobs[b["id"]]["started_at"] is None
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
