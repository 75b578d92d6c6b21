"""Job states and leases, each change one transaction guarded by the state it starts from.

``queued -> running -> completed | failed | cancelled``; ``running -> queued`` when a lease is lost
(a server died), a worker died or a drain interrupted the job: it then resumes from its run
directory. A server claims a job by taking a lease (``lease_owner``, ``lease_expires``) and keeps
it by heartbeats; only the lease holder may finish the job (every update names it), so a server
whose lease expired cannot overwrite the work of the one that took the job over. On PostgreSQL the
claim is ``SELECT ... FOR UPDATE SKIP LOCKED``: two servers never take the same job. On SQLite
every transaction begins with ``BEGIN IMMEDIATE`` (circuitstat.pipelines.service.db), which serialises claims.
"""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from .db import ACTIVE_STATES, Job, JobAttempt, JobEvent, now


def _event(s: Session, job_id: str, state: str, message: str = "") -> None:
    s.add(JobEvent(job_id=job_id, at=now(), state=state, message=message[:2000]))


def fair_order(s: Session, per_user: int | None = None, t: float | None = None) -> list[tuple[str, int]]:
    """The queued jobs (id, owner) in the order :func:`claim` takes them: round-robin by user (fair share), not
    first come first served. A job's key is (its owner's running jobs + its place in its owner's queue, created,
    id): every user's first queued job comes before anyone's second, so one user's 8 queued jobs delay another
    user's first job by at most one job, and a user with jobs running yields to one without. With ``per_user``,
    a user's jobs past that many running are left out (the per-user concurrency cap). Jobs waiting out a retry
    delay (``not_before`` after ``t``) are left out when ``t`` is given."""
    q = select(Job.id, Job.owner_id, Job.created_at).where(Job.state == "queued", Job.deleted_at.is_(None))
    if t is not None:
        q = q.where(Job.not_before <= t)
    queued = s.execute(q.order_by(Job.created_at, Job.id)).all()
    running = dict(s.execute(select(Job.owner_id, func.count()).where(Job.state == "running")
                             .group_by(Job.owner_id)).all())
    place: dict[int, int] = {}
    keyed = []
    for job_id, owner, created in queued:
        k = running.get(owner, 0) + place.get(owner, 0)
        place[owner] = place.get(owner, 0) + 1
        if per_user is None or k < per_user:
            keyed.append(((k, created, job_id), owner))
    return [(key[2], owner) for key, owner in sorted(keyed)]


def claim(s: Session, server: str, lease_seconds: float, limit: int, postgres: bool,
          per_user: int | None = None) -> list[Job]:
    """Take up to ``limit`` queued jobs for ``server`` in :func:`fair_order` (round-robin by user, at most
    ``per_user`` running per user): running, leased, one attempt each."""
    if limit < 1:
        return []
    t = now()
    order = [job_id for job_id, _ in fair_order(s, per_user, t)][:4 * limit + 16]
    if not order:
        return []
    q = select(Job).where(Job.id.in_(order), Job.state == "queued")
    if postgres:
        q = q.with_for_update(skip_locked=True)  # another server's claim of one of them is skipped, not waited on
    rank = {job_id: i for i, job_id in enumerate(order)}
    jobs = sorted(s.scalars(q), key=lambda j: rank[j.id])[:limit]
    for job in jobs:
        job.state, job.lease_owner, job.lease_expires = "running", server, t + lease_seconds
        job.attempts += 1
        job.started_at = job.started_at or t
        s.add(JobAttempt(job_id=job.id, server=server, started_at=t))
        _event(s, job.id, "running", f"attempt {job.attempts} on server {server}")
    return jobs


def record_worker(s: Session, job_id: str, server: str, worker: str) -> None:
    """Note which worker runs the job's current attempt."""
    attempt = _current_attempt(s, job_id, server)
    if attempt is not None:
        attempt.worker = worker[:128]


def _current_attempt(s: Session, job_id: str, server: str) -> JobAttempt | None:
    return s.scalar(select(JobAttempt).where(JobAttempt.job_id == job_id, JobAttempt.server == server,
                                             JobAttempt.ended_at.is_(None)).order_by(JobAttempt.id.desc()).limit(1))


def renew(s: Session, server: str, job_ids: list[str], lease_seconds: float) -> set[str]:
    """Extend the leases ``server`` holds on ``job_ids``; the ids it still holds (a lost one must stop)."""
    if not job_ids:
        return set()
    t = now()
    s.execute(update(Job).where(Job.id.in_(job_ids), Job.lease_owner == server, Job.state == "running")
              .values(lease_expires=t + lease_seconds))
    rows = s.execute(select(Job.id).where(Job.id.in_(job_ids), Job.lease_owner == server, Job.state == "running"))
    return {r[0] for r in rows}


def set_progress(s: Session, server: str, job_id: str, stage: str | None, fraction: float | None,
                 eta: float | None) -> None:
    """Record a running job's stage, progress and ETA (only by its lease holder)."""
    s.execute(update(Job).where(Job.id == job_id, Job.lease_owner == server, Job.state == "running")
              .values(stage=stage, progress=fraction, eta_seconds=eta))


def finish(s: Session, server: str, job_id: str, state: str, *, error: str | None = None,
           error_kind: str | None = None, work_flops: float | None = None, outcome: str | None = None,
           stage: str | None = None) -> bool:
    """End ``server``'s attempt at a job: ``state`` completed, failed or cancelled (a completed job's ``stage`` is
    its run's last); False if the lease was lost meanwhile (then nothing changes)."""
    t = now()
    values = dict(state=state, lease_owner=None, lease_expires=None, finished_at=t, error=error,
                  error_kind=error_kind, eta_seconds=None)
    if state == "completed":
        values["progress"] = 1.0
        if stage is not None:
            values["stage"] = stage
    if work_flops is not None:
        values["work_flops"] = work_flops
    done = s.execute(update(Job).where(Job.id == job_id, Job.lease_owner == server, Job.state == "running")
                     .values(**values)).rowcount
    if not done:
        return False
    _end_attempt(s, job_id, server, outcome or state)
    _event(s, job_id, state, error or "")
    return True


def _end_attempt(s: Session, job_id: str, server: str, outcome: str) -> None:
    attempt = _current_attempt(s, job_id, server)
    if attempt is not None:
        attempt.ended_at, attempt.outcome = now(), outcome[:32]


def requeue(s: Session, server: str, job_id: str, outcome: str, *, max_attempts: int, delay: float = 0.0,
            count_attempt: bool = True) -> str | None:
    """Give a running job back to the queue (it resumes from its run directory), or fail it after
    ``max_attempts``; its new state, or None when ``server`` no longer held it."""
    job = s.get(Job, job_id)
    if job is None or job.state != "running" or job.lease_owner != server:
        return None
    _end_attempt(s, job_id, server, outcome)
    if not count_attempt:
        job.attempts -= 1
    if job.attempts >= max_attempts:
        job.state, job.finished_at, job.error_kind = "failed", now(), "lost"
        job.error = f"the job was interrupted {job.attempts} times ({outcome}); the operator's log says why"
    else:
        job.state, job.not_before = "queued", now() + delay
    job.lease_owner = job.lease_expires = None
    _event(s, job_id, job.state, outcome)
    return job.state


def expire_leases(s: Session, max_attempts: int, postgres: bool) -> list[str]:
    """Requeue running jobs whose lease expired (their server died); their ids."""
    t = now()
    q = select(Job).where(Job.state == "running", Job.lease_expires < t)
    if postgres:
        q = q.with_for_update(skip_locked=True)
    ids = []
    for job in s.scalars(q):
        owner = job.lease_owner or ""
        if requeue(s, owner, job.id, "lease expired", max_attempts=max_attempts) is not None:
            ids.append(job.id)
    return ids


CANCEL_REQUESTED = "cancel requested by "


def request_cancel(s: Session, job: Job, by: str = "its owner") -> str:
    """Cancel ``job`` on behalf of ``by`` ("its owner", "admin NAME"): a queued job at once, a running one by
    its server; the resulting state."""
    if job.state == "queued":
        s.execute(update(Job).where(Job.id == job.id, Job.state == "queued")
                  .values(state="cancelled", finished_at=now(), error=f"cancelled by {by}", error_kind="cancelled"))
        _event(s, job.id, "cancelled", f"cancelled while queued by {by}")
        s.refresh(job)
        return job.state
    if job.state == "running":
        job.cancel_requested = True
        _event(s, job.id, "running", CANCEL_REQUESTED + by)
    return job.state


def cancelled_by(s: Session, job_id: str) -> str:
    """Who asked to cancel the running job ``job_id`` ("its owner" when no request names anyone)."""
    msg = s.scalar(select(JobEvent.message).where(JobEvent.job_id == job_id,
                                                  JobEvent.message.startswith(CANCEL_REQUESTED))
                   .order_by(JobEvent.at.desc(), JobEvent.id.desc()).limit(1))
    return msg[len(CANCEL_REQUESTED):] if msg else "its owner"


def cancel_requested(s: Session, server: str) -> list[str]:
    """Ids of ``server``'s running jobs whose owner asked to cancel them."""
    rows = s.execute(select(Job.id).where(Job.lease_owner == server, Job.state == "running",
                                          Job.cancel_requested.is_(True)))
    return [r[0] for r in rows]


def active_count(s: Session, user_id: int) -> int:
    """The user's queued and running jobs."""
    return s.scalar(select(func.count()).select_from(Job).where(Job.owner_id == user_id,
                                                                Job.state.in_(ACTIVE_STATES))) or 0


def state_counts(s: Session) -> dict[str, int]:
    """Jobs per state (for /metrics)."""
    return {state: n for state, n in s.execute(select(Job.state, func.count()).group_by(Job.state))}


def position(s: Session, job: Job) -> int | None:
    """A queued job's place in the queue: 1 + the queued jobs :func:`claim` takes before it now (every user's,
    in :func:`fair_order`: round-robin by user); None for a job in any other state. Jobs submitted later by a
    user with fewer jobs queued may still go ahead of it, and one waiting out a retry delay is counted, so the
    place is a guide, not a promise."""
    if job.state != "queued":
        return None
    ids = [job_id for job_id, _ in fair_order(s)]
    return ids.index(job.id) + 1 if job.id in ids else None
