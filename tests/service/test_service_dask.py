"""Jobs on a Dask distributed cluster (a LocalCluster) through `circuitstat serve --scheduler`."""

from __future__ import annotations


import pytest

from support import AUDIT, Server, assert_same_tables, database, job_rows, make_user, run_cli_audit, submit, wait_job

pytestmark = pytest.mark.slow


def test_jobs_run_on_a_local_dask_cluster(tmp_path):
    """The cluster's scheduler and worker live in this process (already warm: torch and the CLI's code are
    loaded here); the server reaches the scheduler over TCP, as it would a remote one."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address=None) as cluster:
        server = Server(tmp_path / "data", scheduler=cluster.scheduler_address).start()
        db = database(server.database_url)
        token = make_user(db, "alice")
        db.dispose()
        try:
            server.wait_ready()
            c = server.client(token)
            job = wait_job(c, submit(c, AUDIT).json()["id"])
            assert job["state"] == "completed", job
            run = tmp_path / "data" / "jobs" / job["id"] / "run"
            assert_same_tables(run, run_cli_audit(AUDIT, tmp_path / "cli"))
            attempt = [r for r in job_rows(server.database_url, "job_attempts") if r["job_id"] == job["id"]]
            assert [a["worker"] for a in attempt] == [f"dask {cluster.scheduler_address}"]
            # on the cluster's (in-process) worker, not in the server: the worker executed the job's task
            assert sum(w.state.executed_count for w in cluster.workers.values()) >= 1
        finally:
            assert server.stop() == 0
