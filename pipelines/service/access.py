"""Which jobs a user may see: their own, those shared with them, and public ones; every other is a 404.

One rule, one place: every endpoint that takes a job id goes through :func:`visible_job` (read),
:func:`owned_job` (change: sharing) or :func:`managed_job` (cancel, delete: the owner or an admin),
and every listing through :func:`visible_jobs`. A malformed id is the same 404 as another user's
job, so neither its existence nor the id format leaks. A deleted job is 410 to its owner (and to an
admin cancelling or deleting it), the same 404 to everyone else (a tombstone is neither shared nor
public), and in no listing.

An admin's power is used only by :func:`managed_job` and the admin listing, and every use on another
user's job is one ``admin action`` line in the service log (who, what, which job, whose).
"""

from __future__ import annotations

import logging
import re

from sqlalchemy import exists, or_, select
from sqlalchemy.orm import Session
from sqlalchemy.sql import Select

from .accounts import Principal
from .db import Job, JobShare, User
from .problems import Problem, not_found

JOB_ID = re.compile(r"[0-9a-f]{32}")
log = logging.getLogger("circuitstat.service")


def gone() -> Problem:
    """The one 410 for a deleted job (told only to its owner, and to admins managing it)."""
    return Problem(410, "this job was deleted: its run and uploads are gone; its id is not reused")


def audit_admin(principal: Principal, action: str, job: Job | None = None, owner: str | None = None, **extra) -> None:
    """Write the service log's ``admin action`` line: who did what to which job (and whose)."""
    log.info("admin action", extra={"admin": principal.name, "action": action, "job": job.id if job else None,
                                    "owner": owner, **extra})


def visible_filter(principal: Principal):
    """The SQL condition of the jobs ``principal`` may see."""
    shared = exists().where(JobShare.job_id == Job.id, JobShare.user_id == principal.user_id)
    return or_(Job.owner_id == principal.user_id, Job.public.is_(True), shared)


def visible_jobs(principal: Principal) -> Select:
    """SELECT of the (undeleted) jobs ``principal`` may see, newest first."""
    return (select(Job).where(visible_filter(principal), Job.deleted_at.is_(None))
            .order_by(Job.created_at.desc(), Job.id))


def visible_job(s: Session, principal: Principal, job_id: str) -> Job:
    """The job ``job_id`` if ``principal`` may see it; the 404 Problem otherwise, 410 once it is deleted."""
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise not_found()
    job = s.scalar(select(Job).where(Job.id == job_id, visible_filter(principal)))
    if job is None:
        raise not_found()
    if job.deleted_at is not None:
        raise gone()
    return job


def managed_job(s: Session, principal: Principal, job_id: str, action: str) -> Job:
    """The job ``job_id`` if ``principal`` owns it or is an admin (then ``action`` on another user's job is
    logged); 404 otherwise (as for any job they cannot see), 410 once deleted. Row-locked on PostgreSQL."""
    if not principal.admin:
        return owned_job(s, principal, job_id)
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise not_found()
    job = s.scalar(select(Job).where(Job.id == job_id).with_for_update())
    if job is None:
        raise not_found()
    if job.deleted_at is not None:
        raise gone()
    if job.owner_id != principal.user_id:
        audit_admin(principal, action, job, owner_name(s, job))
    return job


def owned_job(s: Session, principal: Principal, job_id: str) -> Job:
    """The job ``job_id`` if ``principal`` owns it; the 404 Problem otherwise (seeing is not owning)."""
    job = visible_job(s, principal, job_id)
    if job.owner_id != principal.user_id:
        raise not_found()
    return job


def owner_name(s: Session, job: Job) -> str:
    """The name of the job's owner."""
    return s.get(User, job.owner_id).name


def shared_with(s: Session, job: Job) -> list[str]:
    """Names of the users ``job`` is shared with."""
    rows = s.execute(select(User.name).join(JobShare, JobShare.user_id == User.id).where(JobShare.job_id == job.id))
    return sorted(r[0] for r in rows)


def set_sharing(s: Session, job: Job, *, public: bool | None, users: list[str] | None) -> None:
    """Make ``job`` public or not and share it with exactly ``users`` (None leaves either as it is); a 422 Problem
    for names it cannot be shared with, one message whether a name is no user or is the owner's own, so a refusal
    never tells whether a user of that name exists."""
    if public is not None:
        job.public = bool(public)
    if users is None:
        return
    names = sorted(set(users))
    found = {u.name: u.id for u in s.scalars(select(User).where(User.name.in_(names)))} if names else {}
    refused = [n for n in names if n not in found or found[n] == job.owner_id]
    if refused:
        shown = ", ".join(repr(n[:64]) for n in refused[:5])
        raise Problem(422, f"cannot share this job with {shown}: share it with other users of this server, by the "
                           "user names the operator gave them (`circuitstat users list`)")
    s.query(JobShare).filter(JobShare.job_id == job.id).delete()
    for uid in found.values():
        s.add(JobShare(job_id=job.id, user_id=uid))
