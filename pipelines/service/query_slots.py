"""Fair query slots: the server runs at most ``total`` DuckDB queries at once, and one user at most ``per_user``.

One process-wide semaphore let one user's two heavy queries hold both slots while another user's one-row
query waited for them. Here a waiting query may start only when a slot is free *and* its user holds fewer
than ``per_user`` slots; among the queries that may start, the one that came first goes first. So a user
with queries running never delays another user's query for longer than a slot takes to free, and one
user alone still gets ``per_user`` slots.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import Counter
from typing import Iterator

__all__ = ["FairSlots", "QueryBusy"]


class QueryBusy(Exception):
    """No slot came free within the wait the server allows (the caller says 503 with Retry-After)."""


class FairSlots:
    """``total`` slots shared fairly between users, at most ``per_user`` each; FIFO among those that may run."""

    def __init__(self, total: int = 2, per_user: int = 1) -> None:
        if total < 1 or per_user < 1:
            raise ValueError("total and per_user must be at least 1")
        self.total, self.per_user = int(total), int(per_user)
        self._cond = threading.Condition()
        self._held: Counter[str] = Counter()
        self._waiting: list[tuple[int, str]] = []  # (ticket, user), in arrival order
        self._tickets = itertools.count()

    def _may_start(self, ticket: int, user: str) -> bool:
        if sum(self._held.values()) >= self.total or self._held[user] >= self.per_user:
            return False
        # the first waiting query whose user is under its share goes first
        for t, u in self._waiting:
            if self._held[u] < self.per_user:
                return t == ticket
        return False

    @contextlib.contextmanager
    def slot(self, user: str, wait_s: float | None = None) -> Iterator[None]:
        """Hold one slot for ``user`` while the block runs; QueryBusy if none is given within ``wait_s``."""
        with self._cond:
            ticket = next(self._tickets)
            self._waiting.append((ticket, user))
            try:
                if not self._cond.wait_for(lambda: self._may_start(ticket, user), timeout=wait_s):
                    raise QueryBusy(f"all {self.total} query slots are busy; try again shortly")
            finally:
                self._waiting.remove((ticket, user))
            self._held[user] += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._held[user] -= 1
                if self._held[user] == 0:
                    del self._held[user]
                self._cond.notify_all()

    def held(self) -> dict[str, int]:
        """The slots each user holds now (a snapshot)."""
        with self._cond:
            return dict(self._held)
