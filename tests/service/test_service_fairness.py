"""Fair share (issue 44, defect 4), as orderings, never as times: waiting queries and queued jobs are served
round-robin by user, with a per-user cap."""

from __future__ import annotations

import threading

import pytest

from inprocess import App

from circuitstat.pipelines.service import queue
from circuitstat.pipelines.service.db import Job
from circuitstat.pipelines.service.query_slots import FairSlots, QueryBusy


def _waiting(slots: FairSlots, n: int) -> None:
    """Until ``n`` queries wait for a slot (an ordering handshake, no sleep)."""
    with slots._cond:
        assert slots._cond.wait_for(lambda: len(slots._waiting) == n, timeout=60)


def test_a_third_users_query_goes_before_either_flooders_next_one():
    """One server-wide slot, two users flooding it: the third user's query is served before either flooder's
    next query (first come first served would serve both flooders' earlier queries first)."""
    slots, order, gates = FairSlots(total=1, per_user=1), [], {}

    def query(tag: str) -> None:
        user = tag[0]
        with slots.slot(user, wait_s=60):
            order.append(tag)
            gates[tag].wait(timeout=60)

    def start(tag: str, waiting: int) -> threading.Thread:
        gates[tag] = threading.Event()
        th = threading.Thread(target=query, args=(tag,))
        th.start()
        _waiting(slots, waiting)
        return th

    threads = [start("a1", 0)]
    while order != ["a1"]:
        threading.Event().wait(0.001)
    threads += [start("b1", 1), start("a2", 2)]  # both flooders queue up behind a1
    gates["a1"].set()
    while order[-1:] != ["b1"]:  # b1 (never served) before a2
        threading.Event().wait(0.001)
    threads += [start("c1", 2), start("b2", 3)]  # the third user arrives after both flooders' next queries
    for tag in ("b1", "c1", "a2", "b2"):
        gates[tag].set()
    for th in threads:
        th.join(timeout=60)
    assert order == ["a1", "b1", "c1", "a2", "b2"], order
    # the refusal of a user over their own cap names their slots, not the server's
    two = FairSlots(total=2, per_user=1)
    with two.slot("d"):
        with pytest.raises(QueryBusy, match="your 1 query slot is busy"):
            with two.slot("d", wait_s=0):
                pass
    with two.slot("e"), two.slot("f"):
        with pytest.raises(QueryBusy, match="all 2 query slots of the server are busy"):
            with two.slot("g", wait_s=0):
                pass


@pytest.fixture
def server(tmp_path):
    app = App(tmp_path / "data", users=("alice", "bob", "carol"))
    yield app
    app.close()


def test_one_users_eight_queued_jobs_do_not_delay_anothers_first_job_behind_all_eight(server):
    alice = [server.add_job("alice", state="queued", created=1000.0 + i) for i in range(8)]
    bob = server.add_job("bob", state="queued", created=2000.0)
    carol = server.add_job("carol", state="queued", created=3000.0)
    with server.svc.db.session() as s:
        fifo = [j.id for j in s.query(Job).filter(Job.state == "queued").order_by(Job.created_at)]
        assert fifo.index(bob) == 8  # the control: first come first served puts bob behind all of alice's
        order = [job_id for job_id, _ in queue.fair_order(s)]
        assert order[:3] == [alice[0], bob, carol] and order[3:] == alice[1:]
        assert queue.position(s, s.get(Job, bob)) == 2
    taken = []
    for _ in range(3):  # one worker claiming one job at a time
        with server.svc.db.session() as s:
            taken += [j.id for j in queue.claim(s, "srv", 30.0, 1, postgres=False)]
    assert taken == [alice[0], bob, carol]
    with server.svc.db.session() as s:  # alice has one running: the cap of one running job per user holds her back
        assert queue.claim(s, "srv", 30.0, 5, postgres=False, per_user=1) == []
        more = [j.id for j in queue.claim(s, "srv", 30.0, 5, postgres=False, per_user=2)]
    assert more == [alice[1]]  # her second, and no more: two running now
