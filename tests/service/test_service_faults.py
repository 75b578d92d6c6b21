"""Load and faults on two servers sharing one PostgreSQL database and one data directory (the scale-out
set-up): 50 concurrent submissions and 500 polls with every job run exactly once; kill -9 of a worker
and of a server mid-job; SIGTERM with and without time to drain.

A job that was interrupted ends with the tables of an uninterrupted `circuitstat audit` (bit for bit),
and its run directory shows that the stages finished before the fault were resumed, not recomputed.
Each fault is made to strike inside a stage: the worker is stopped (SIGSTOP) there first. The servers
are the session's (support.Fleet: the first is test_service_api.py's PostgreSQL server), plus one that
drains patiently and the successor of a killed one. (Throughput and latency are measured by
bench/serve.py, never asserted here.)
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import itertools
import os
import signal
import time

import pytest

from support import AUDIT, TINY, assert_same_tables, job_rows, manifest, run_cli_audit, submit, wait_job

pytestmark = pytest.mark.slow
SPEC = {**AUDIT, "bootstrap": {"n_resamples": 1000}, "k": [2, 3, 4, 5]}  # a stability stage long enough to stop in
BEFORE = ("index", "scores_exact", "scores_eap", "edge_stats")  # finished before the fault strikes
WORKERS = 2
USERS = [f"user{i}" for i in range(5)]


class Pair:
    """Two servers on the fleet's PostgreSQL database: [0] drains at once, [1] waits for its running jobs."""

    def __init__(self, fleet) -> None:
        if fleet.pg_url is None:
            pytest.skip("PostgreSQL not installed and CIRCUITSTAT_ALLOW_NO_POSTGRES=1")
        self.fleet, self.url = fleet, fleet.pg_url
        self.servers = [fleet.pg(), fleet.add_pg(wait=False, drain_seconds=300)]
        self.data = self.servers[0].data
        self.tokens = {u: fleet.token(self.servers[0], u) for u in ["alice", *USERS]}
        self.ids = [s.wait_ready()["server"] for s in self.servers]

    def replace(self, i: int) -> None:
        """Start the successor of the stopped server ``i`` (same settings) and wait until it is ready."""
        self.servers[i] = self.fleet.add_pg(**self.servers[i].extra)
        self.ids[i] = self.servers[i].wait_ready()["server"]

    def client(self, i: int, user: str = "alice"):
        return self.servers[i].client(self.tokens[user])


@pytest.fixture(scope="module")
def pair(fleet):
    return Pair(fleet)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_cli_audit(SPEC, tmp_path_factory.mktemp("reference"))


def _attempts(pair, job_id: str) -> list[dict]:
    return sorted((r for r in job_rows(pair.url, "job_attempts") if r["job_id"] == job_id), key=lambda r: r["id"])


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
        time.sleep(0.003)
    raise AssertionError("the job never reached its stability stage")


def _running_on(pair, job_id: str, timeout: float = 300) -> tuple[int, int]:
    """(index of the server, pid of the worker) of ``job_id``'s attempt, once a worker runs it (asked before
    the fault's window opens, so the fault strikes at once when it does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        open_ = [a for a in _attempts(pair, job_id) if a["ended_at"] is None and a["worker"]]
        if open_:
            return pair.ids.index(open_[-1]["server"]), int(open_[-1]["worker"].rsplit(" ", 1)[1])
        time.sleep(0.01)
    raise AssertionError(f"no worker ran job {job_id}")


def _freeze(pid: int, run) -> None:
    """SIGSTOP the worker ``pid`` inside its stability stage: the fault then strikes at a known point."""
    os.kill(pid, signal.SIGSTOP)
    while _proc_status(pid).get("State", "").split()[:1] != ["T"]:
        time.sleep(0.005)
    assert manifest(run)["stages"]["stability"]["status"] == "running"  # stopped inside it


def _proc_status(pid: int) -> dict:
    try:
        lines = open(f"/proc/{pid}/status").read().splitlines()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def _pending(pid: int, sig: int) -> bool:
    """True when ``sig`` waits to be delivered to the (stopped) process ``pid``."""
    st = _proc_status(pid)
    mask = int(st.get("SigPnd", "0"), 16) | int(st.get("ShdPnd", "0"), 16)
    return bool(mask >> (sig - 1) & 1)


def _wait_for(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


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


def test_fifty_concurrent_submissions_and_five_hundred_polls_every_job_exactly_once(pair):
    """5 users on two servers: 50 concurrent submissions, 500 status polls; nothing lost or duplicated, no
    5xx, every job ends, and each ran exactly once although both servers took jobs from the one queue."""
    job = {"model": TINY, "task": "induction", "method": "eap", "n": 2, "batch_size": 2}
    clients = {(u, i): pair.client(i, u) for u in USERS for i in range(2)}
    where = {u: k % 2 for k, u in enumerate(USERS)}
    codes = collections.Counter()
    try:
        with cf.ThreadPoolExecutor(max_workers=50) as pool:
            def go(i):
                u = USERS[i % 5]
                return u, submit(clients[u, (where[u] + i) % 2], {**job, "seed": i}, kind="attribute", name=f"load {i}")

            subs = list(pool.map(go, range(50)))
            codes.update(r.status_code for _, r in subs)
            assert codes[202] == 50, [r.text for _, r in subs if r.status_code != 202][:3]
            jobs = [(u, r.json()["id"]) for u, r in subs]
            targets = list(itertools.islice(itertools.cycle(jobs), 500))
            polls = list(pool.map(lambda uj: clients[uj[0], hash(uj[1]) % 2].get(f"/api/v1/jobs/{uj[1]}"), targets))
            codes.update(r.status_code for r in polls)
        assert all(r.status_code == 200 for r in polls) and not [c for c in codes if c >= 500]
        assert all(r.json()["state"] in ("queued", "running", "completed") for r in polls)
        ids = [j for _, j in jobs]
        assert len(set(ids)) == 50  # nothing duplicated
        for u, job_id in jobs:
            assert wait_job(clients[u, 0], job_id)["state"] == "completed"  # nothing lost, every job ends
        for u in USERS:  # each user sees exactly their ten, on either server
            for i in range(2):
                listed = clients[u, i].get("/api/v1/jobs", params={"scope": "own", "limit": 100}).json()
                assert sorted(j["id"] for j in listed["jobs"]) == sorted(j for v, j in jobs if v == u)
        rows = [r for r in job_rows(pair.url, "jobs") if r["id"] in ids]
        assert len(rows) == 50 and all(r["state"] == "completed" and r["attempts"] == 1 for r in rows)
        attempts = [a for a in job_rows(pair.url, "job_attempts") if a["job_id"] in ids]
        assert sorted(a["job_id"] for a in attempts) == sorted(ids)  # each ran exactly once
        assert len({a["server"] for a in attempts}) == 2  # both servers took jobs from the one queue
        for job_id in ids:  # and each run directory was opened by one run only
            assert len(manifest(pair.data / "jobs" / job_id / "run")["history"]) == 1
    finally:
        for c in clients.values():
            c.close()


def test_kill_9_of_a_worker_resumes_the_job(pair, reference):
    c = pair.client(0)
    job = submit(c, SPEC).json()
    run = pair.data / "jobs" / job["id"] / "run"
    i, worker = _running_on(pair, job["id"])
    before = _mid_job(run)
    _freeze(worker, run)
    os.kill(worker, signal.SIGKILL)
    done = wait_job(c, job["id"])
    assert done["state"] == "completed" and done["attempts"] == 2, done
    assert_same_tables(run, reference)
    _resumed(run, before)
    attempts = _attempts(pair, job["id"])
    assert [a["outcome"] for a in attempts] == ["worker died", "completed"]
    assert attempts[0]["worker"] != attempts[1]["worker"]  # another worker took over
    deadline = time.monotonic() + 120
    while pair.servers[i].wait_ready()["workers_ready"] < WORKERS and time.monotonic() < deadline:
        time.sleep(0.1)  # the dead worker was replaced
    assert pair.servers[i].wait_ready()["workers_ready"] == WORKERS


def test_kill_9_of_the_server_mid_job_then_a_restart_completes_it_identically(pair, reference):
    c = pair.client(0)
    job = submit(c, SPEC).json()
    run = pair.data / "jobs" / job["id"] / "run"
    i, worker = _running_on(pair, job["id"])
    before = _mid_job(run)
    _freeze(worker, run)
    pair.servers[i].proc.kill()
    pair.servers[i].proc.wait(timeout=60)
    os.kill(worker, signal.SIGCONT)
    assert _gone(worker)  # its worker followed it (the lifeline), releasing the run directory
    assert manifest(run)["stages"]["stability"]["status"] == "running"  # killed mid-stage
    pair.replace(i)  # the restart
    done = wait_job(pair.client(i), job["id"])
    assert done["state"] == "completed", done
    assert_same_tables(run, reference)
    _resumed(run, before)
    # "busy": the other server tried while the dead server's worker was still exiting, and waited (not counted)
    outcomes = [a["outcome"] for a in _attempts(pair, job["id"])]
    assert [o for o in outcomes if o != "busy"] == ["lease expired", "completed"] and done["attempts"] == 2


def _first_in_stability_on(pair, i: int, jobs: list[dict], timeout: float = 300) -> tuple[dict, int]:
    """(job, worker pid) of the first of ``jobs`` seen inside its stability stage on server ``i``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        open_ = {a["job_id"]: a for a in job_rows(pair.url, "job_attempts")
                 if a["ended_at"] is None and a["worker"] and a["server"] == pair.ids[i]}
        for j in jobs:
            if j["id"] in open_:
                try:
                    stages = manifest(pair.data / "jobs" / j["id"] / "run")["stages"]
                except (OSError, ValueError):
                    continue
                if stages.get("stability", {}).get("status") == "running":
                    return j, int(open_[j["id"]]["worker"].rsplit(" ", 1)[1])
        time.sleep(0.002)
    raise AssertionError(f"no job reached its stability stage on server {i}")


def test_sigterm_without_time_to_drain_interrupts_running_jobs_which_resume_elsewhere(pair, reference):
    """SIGTERM, drain_seconds 0: no new job starts on the server; its running jobs are interrupted inside
    their stage, keep the stages they finished, go back to the queue and finish on the other server."""
    jobs = [submit(pair.client(0), SPEC).json() for _ in range(2 * WORKERS + 1)]  # more than both servers run
    a, worker = _first_in_stability_on(pair, 0, jobs)
    run = pair.data / "jobs" / a["id"] / "run"
    _freeze(worker, run)
    before = manifest(run)["stages"]
    here = [j["id"] for j in jobs if any(x["server"] == pair.ids[0] for x in _attempts(pair, j["id"]))]
    draining, t_term = pair.servers[0], time.time()
    draining.send(signal.SIGTERM)
    _wait_for(lambda: _pending(worker, signal.SIGINT), "the drain never interrupted the running job")
    os.kill(worker, signal.SIGCONT)  # it takes the interrupt inside its stability stage
    assert draining.proc.wait(timeout=120) == 0  # a clean exit
    late = [x for x in job_rows(pair.url, "job_attempts") if x["server"] == pair.ids[0] and x["started_at"] > t_term]
    assert late == []  # nothing started on the draining server once SIGTERM arrived
    assert _attempts(pair, a["id"])[0]["outcome"] == "interrupted"
    for job_id in here:
        assert wait_job(pair.client(1), job_id)["state"] == "completed"  # resumed on the other server
    assert [x["outcome"] for x in _attempts(pair, a["id"])] == ["interrupted", "completed"]
    assert_same_tables(run, reference)
    _resumed(run, before)
    for j in jobs:
        wait_job(pair.client(1), j["id"])


def test_sigterm_with_time_to_drain_finishes_running_jobs_and_starts_none(pair, reference):
    """SIGTERM, drain_seconds 300 (the only server left): the server waits for its running jobs, then exits
    0; the job waiting in the queue never starts."""
    if pair.servers[0].proc.poll() is None:  # (the test before ends it; alone, this one does)
        assert pair.servers[0].stop() == 0
    patient = pair.servers[1]
    jobs = [submit(pair.client(1), SPEC).json() for _ in range(WORKERS + 1)]
    b, waiting = jobs[0], jobs[-1]
    _, worker = _running_on(pair, b["id"])
    os.kill(worker, signal.SIGSTOP)  # b cannot finish before the signal
    patient.send(signal.SIGTERM)
    _wait_for(lambda: '"draining"' in patient.log_file.read_text(), "the server never started draining")
    time.sleep(1.0)
    assert patient.proc.poll() is None and not _pending(worker, signal.SIGINT)  # it waits for b
    os.kill(worker, signal.SIGCONT)
    assert patient.proc.wait(timeout=300) == 0
    rows = {r["id"]: r for r in job_rows(pair.url, "jobs")}
    assert rows[b["id"]]["state"] == "completed" and [x["outcome"] for x in _attempts(pair, b["id"])] == ["completed"]
    assert rows[waiting["id"]]["state"] == "queued" and rows[waiting["id"]]["started_at"] is None
    assert_same_tables(pair.data / "jobs" / b["id"] / "run", reference)
