"""Per-user quotas: request rate, request size and active jobs (estimated work: circuitstat.pipelines.service.runner).

* **rate**: a token bucket per user (``requests_per_minute``, bursts up to the same number), kept
  by each server for the requests it answers; over it, 429 with Retry-After;
* **size**: :class:`BodyLimit` refuses a body above the largest quota before it is read into
  memory (413), and the submit endpoint checks the caller's own quota;
* **active jobs**: queued + running per user, checked when a job is submitted (429).
"""

from __future__ import annotations

import math
import threading
import time

from .problems import Problem, problem_response


class RateLimiter:
    """Token buckets, one per user name."""

    def __init__(self) -> None:
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def check(self, user: str, per_minute: int) -> None:
        """Take one request from ``user``'s bucket; a 429 Problem (with Retry-After) when it is empty."""
        rate = per_minute / 60.0
        t = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(user, (float(per_minute), t))
            tokens = min(float(per_minute), tokens + (t - last) * rate)
            if tokens < 1.0:
                self._buckets[user] = (tokens, t)
                wait = math.ceil((1.0 - tokens) / rate)
                raise Problem(429, f"more than {per_minute} requests a minute; wait {wait} s and retry",
                              headers={"Retry-After": str(wait)})
            self._buckets[user] = (tokens - 1.0, t)


class BodyTooLarge(Exception):
    """The request body passed the limit while it was read."""


class BodyLimit:
    """ASGI middleware: 413 for a body above ``limit`` bytes, by its Content-Length or while it streams."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._refuse(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.message)
            scope.setdefault("state", {})["body_bytes"] = seen
            return message

        try:
            await self.app(scope, counted, send)
        except BodyTooLarge:
            await self._refuse(scope, receive, send)

    @property
    def message(self) -> str:
        return (f"the request body is larger than {self.limit:,} bytes; send smaller task files (or ask the operator "
                "for a larger max_request_bytes)")

    async def _refuse(self, scope, receive, send):
        response = problem_response(413, self.message, headers={"Connection": "close"})
        await response(scope, receive, send)


def check_body(size: int, limit: int) -> None:
    """None; a 413 Problem when a request of ``size`` bytes is above the caller's ``limit``."""
    if size > limit:
        raise Problem(413, f"the request body ({size:,} bytes) is larger than your quota of {limit:,} bytes; "
                           "send smaller task files")


def check_active(active: int, limit: int) -> None:
    """None; a 429 Problem when the caller already has ``limit`` queued or running jobs."""
    if active >= limit:
        raise Problem(429, f"you have {active} queued or running jobs, the most your quota allows; wait for one to "
                           "finish or cancel one", headers={"Retry-After": "10"})
