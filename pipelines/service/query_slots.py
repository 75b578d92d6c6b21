"""Fair query slots: the server runs at most ``total`` DuckDB queries at once, and one user at most ``per_user``.

Waiting queries are served round-robin by user (fair share), not first come first served: when a slot frees,
among the waiting queries whose user is under ``per_user``, the one whose user was served least recently goes
first (a user never served goes before everyone), and a user's own queries keep their order. So two users
flooding the slots cannot starve a third: the third user's query is the next one served, before either
flooder's next query; and one user alone still gets ``per_user`` slots.
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
    """``total`` slots shared fairly between users, at most ``per_user`` each; round-robin by user."""

    def __init__(self, total: int = 2, per_user: int = 1) -> None:
        if total < 1 or per_user < 1:
            raise ValueError("total and per_user must be at least 1")
        self.total, self.per_user = int(total), int(per_user)
        self._cond = threading.Condition()
        self._held: Counter[str] = Counter()
        self._waiting: list[tuple[int, str]] = []  # (ticket, user), in arrival order
        self._tickets = itertools.count()
        self._served: dict[str, int] = {}  # user -> the serial number of their last query that started
        self._serial = itertools.count()

    def _may_start(self, ticket: int, user: str) -> bool:
        if sum(self._held.values()) >= self.total or self._held[user] >= self.per_user:
            return False
        # round-robin: of the waiting queries whose user is under its share, the user served least recently
        # (never: first) goes first, and within a user the oldest query
        eligible = [(self._served.get(u, -1), t) for t, u in self._waiting if self._held[u] < self.per_user]
        return bool(eligible) and min(eligible)[1] == ticket

    @contextlib.contextmanager
    def slot(self, user: str, wait_s: float | None = None) -> Iterator[None]:
        """Hold one slot for ``user`` while the block runs; QueryBusy if none is given within ``wait_s``."""
        with self._cond:
            ticket = next(self._tickets)
            self._waiting.append((ticket, user))
            try:
                if not self._cond.wait_for(lambda: self._may_start(ticket, user), timeout=wait_s):
                    raise QueryBusy(self._busy(user))
            finally:
                self._waiting.remove((ticket, user))
                self._cond.notify_all()  # the next in turn may be another user's query
            self._held[user] += 1
            self._served[user] = next(self._serial)
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._held[user] -= 1
                if self._held[user] == 0:
                    del self._held[user]
                self._cond.notify_all()

    def _busy(self, user: str) -> str:
        """Why ``user``'s query got no slot: their own slots, or the server's."""
        if self._held[user] >= self.per_user:
            return (f"your {self.per_user} query slot{'s are' if self.per_user > 1 else ' is'} busy with your other "
                    "queries; wait for one to finish, then try again")
        return f"all {self.total} query slots of the server are busy; try again shortly"

    def held(self) -> dict[str, int]:
        """The slots each user holds now (a snapshot)."""
        with self._cond:
            return dict(self._held)
