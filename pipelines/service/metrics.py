"""``/metrics`` in Prometheus text format (prometheus_client): queue length, running jobs, job durations,
errors and HTTP requests. Queue and running counts come from the database at scrape time, so every
server behind one database reports the same numbers; the rest are this server's own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from .db import JOB_STATES, Database

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _JobStates:
    """Collector of the number of jobs in each state, read from the database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self):
        from .queue import state_counts

        with self.db.session() as s:
            counts = state_counts(s)
        g = GaugeMetricFamily("circuitstat_jobs", "Jobs in each state (all servers of this database)",
                              labels=["state"])
        for state in JOB_STATES:
            g.add_metric([state], counts.get(state, 0))
        yield g
        yield GaugeMetricFamily("circuitstat_queue_length", "Jobs waiting for a worker", value=counts.get("queued", 0))
        yield GaugeMetricFamily("circuitstat_running_jobs", "Jobs running now", value=counts.get("running", 0))


class Metrics:
    """The registry of one server and the counters its code updates."""

    def __init__(self, db: Database) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_JobStates(db))
        self.requests = Counter("circuitstat_http_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=self.registry)
        self.latency = Histogram("circuitstat_http_request_seconds", "HTTP request latency by route", ["route"],
                                 registry=self.registry)
        self.jobs_ended = Counter("circuitstat_jobs_ended", "Job attempts ended on this server, by outcome",
                                  ["outcome"], registry=self.registry)
        self.job_errors = Counter("circuitstat_job_errors", "Failed jobs on this server, by kind (input, quota, "
                                  "internal)", ["kind"], registry=self.registry)
        self.job_seconds = Histogram("circuitstat_job_duration_seconds", "Seconds of completed job attempts",
                                     buckets=(0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600),
                                     registry=self.registry)

    def job_ended(self, outcome: str | None, kind: str | None, seconds: float) -> None:
        """Count one ended job attempt (and its duration when it completed)."""
        self.jobs_ended.labels(outcome or "unknown").inc()
        if outcome == "failed":
            self.job_errors.labels(kind or "unknown").inc()
        if outcome == "completed":
            self.job_seconds.observe(seconds)

    def request(self, route: str, status: int, seconds: float) -> None:
        """Count one HTTP request."""
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)
