"""The service under load: throughput and the p50/p99 latency of submit and status calls.

Starts `circuitstat serve` on loopback (SQLite and a local pool, in a temporary directory), makes
USERS users, then from CONCURRENCY client threads submits JOBS tiny attribute jobs and polls their
status POLLS times, and waits for every job to end. It prints each call's latency percentiles, the
request throughput of the polling phase, and the job throughput (jobs completed per second from
the first submission to the last job's end), next to what one job takes run alone (the floor of the
job throughput a pool of WORKERS can reach is WORKERS / that).

    python bench/serve.py [--jobs 50] [--polls 500] [--users 5] [--workers 2] [--concurrency 25]

A benchmark, not a test: nothing is asserted, and the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "service"))

from support import TINY, Server, database, make_user, submit, wait_job  # noqa: E402

JOB = {"model": TINY, "task": "induction", "method": "eap", "n": 2, "batch_size": 2}


def percentiles(seconds: list[float]) -> str:
    """p50 and p99 of ``seconds`` in milliseconds."""
    qs = statistics.quantiles(seconds, n=100, method="inclusive")
    return f"p50 {1000 * statistics.median(seconds):7.1f} ms   p99 {1000 * qs[98]:7.1f} ms   (n={len(seconds)})"


def timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return r, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--polls", type=int, default=500)
    ap.add_argument("--users", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=25)
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="circuitstat-bench-serve-"))
    server = Server(root / "data", workers=args.workers,
                    settings={"quotas": {"max_active_jobs": args.jobs, "requests_per_minute": 10**7},
                              "lease_seconds": 30, "poll_seconds": 0.05}).start()
    db = database(server.database_url)
    tokens = [make_user(db, f"user{i}") for i in range(args.users)]
    db.dispose()
    t0 = time.perf_counter()
    server.wait_ready()
    print(f"server ready (workers warm) in {time.perf_counter() - t0:.1f} s")
    clients = [server.client(t) for t in tokens]
    try:
        alone, alone_s = timed(lambda: wait_job(clients[0], submit(clients[0], JOB, kind="attribute").json()["id"]))
        print(f"one job alone, submitted until seen completed: {alone_s:.2f} s ({alone['state']})")
        with cf.ThreadPoolExecutor(args.concurrency) as pool:
            start = time.perf_counter()
            subs = list(pool.map(lambda i: timed(lambda: submit(clients[i % args.users], {**JOB, "seed": i},
                                                                kind="attribute")), range(args.jobs)))
            ids = [(i % args.users, r.json()["id"]) for i, (r, _) in enumerate(subs)]
            targets = [ids[i % len(ids)] for i in range(args.polls)]
            t_poll = time.perf_counter()
            polls = list(pool.map(lambda t: timed(lambda: clients[t[0]].get(f"/api/v1/jobs/{t[1]}")), targets))
            poll_s = time.perf_counter() - t_poll
            ends = list(pool.map(lambda t: wait_job(clients[t[0]], t[1], timeout=3600), ids))
            total = time.perf_counter() - start
        codes = sorted({r.status_code for r, _ in subs + polls})
        print(f"submit  {percentiles([s for _, s in subs])}")
        print(f"status  {percentiles([s for _, s in polls])}")
        print(f"status throughput: {args.polls / poll_s:.0f} requests/s ({args.concurrency} client threads)")
        done = sum(e["state"] == "completed" for e in ends)
        print(f"jobs: {done}/{args.jobs} completed in {total:.1f} s = {done / total:.2f} jobs/s with {args.workers} "
              f"workers; HTTP codes {codes}")
    finally:
        for c in clients:
            c.close()
        server.stop()


if __name__ == "__main__":
    main()
