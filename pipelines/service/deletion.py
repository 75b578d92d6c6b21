"""Deleting a job: its files go, its database row stays as a tombstone.

A delete marks the job (``deleted_at``) in one transaction. A queued or finished job becomes a
tombstone at once: state ``deleted``, spec and error cleared, its shares and stored claims checks
dropped, its events and attempts kept (what happened to it stays on record), and its directory
``DATA/jobs/<id>/`` (uploads, run directory, log, claims files) removed. A running job is cancelled
first: its server stops the worker, then makes the tombstone (:func:`finalize`), so no worker ever
writes into a directory being removed. Ids are never reused (the row keeps the id). A tombstone is
no longer public nor shared: every endpoint answers 410 to its owner (and to an admin cancelling or
deleting it), and the same 404 as for no job to everyone else.

Removal is confined to the service's jobs directory: the path is built from the 32-hex-digit id,
must resolve inside ``DATA/jobs``, and a symbolic link is unlinked, never followed.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from pathlib import Path

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from circuitstat.core.confine import inside

from .access import JOB_ID
from .db import DELETED, ClaimCheck, Database, Job, JobEvent, JobShare, now

log = logging.getLogger("circuitstat.service")


def request_delete(s: Session, job: Job, reason: str) -> str:
    """Mark ``job`` deleted (``reason`` goes into its events): ``"deleted"`` when it is a tombstone now,
    ``"deleting"`` when it runs and its server cancels it first (then :func:`finalize` makes the tombstone)."""
    s.refresh(job, with_for_update=True)  # its state now, locked: a server claiming it waits (PostgreSQL)
    if job.deleted_at is None:
        job.deleted_at = now()
    if job.state != "running":
        s.flush()
        if tombstone(s, job.id, reason):
            return DELETED
        s.refresh(job)
    job.cancel_requested = True
    s.add(JobEvent(job_id=job.id, at=now(), state="running", message=f"{reason}: cancelling first"[:2000]))
    return "deleting"


def tombstone(s: Session, job_id: str, reason: str) -> bool:
    """Make a marked, not running job a tombstone (not public, not shared, no stored checks); False when
    it is not such a job (one guarded UPDATE: two servers never both do it)."""
    done = s.execute(update(Job).where(Job.id == job_id, Job.deleted_at.is_not(None), Job.state != "running",
                                       Job.state != DELETED)
                     .values(state=DELETED, spec="{}", error=None, public=False, lease_owner=None,
                             lease_expires=None, eta_seconds=None)).rowcount
    if not done:
        return False
    s.execute(delete(JobShare).where(JobShare.job_id == job_id))
    s.execute(delete(ClaimCheck).where(ClaimCheck.job_id == job_id))
    s.add(JobEvent(job_id=job_id, at=now(), state=DELETED, message=reason[:2000]))
    return True


def remove_files(jobs_dir: Path, job_id: str) -> bool:
    """Remove ``jobs_dir/<job_id>`` (confined to ``jobs_dir``, links unlinked, never followed); True when
    it was there and is gone (False and a log line when it could not be removed: the sweep retries)."""
    if not JOB_ID.fullmatch(job_id or ""):
        raise ValueError(f"not a job id: {job_id!r}")
    folder = jobs_dir / job_id
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
        return True
    if not folder.exists():
        return False
    if not inside(folder, jobs_dir):  # a jobs directory that is itself a link elsewhere: leave it to the operator
        log.error("job directory outside the jobs directory, not removed", extra={"job": job_id})
        return False
    return _claim_and_remove(folder, jobs_dir, job_id)


CLAIMED = re.compile(r"\.deleting-([0-9a-f]{32})-[0-9a-f]{8}")
"""The name a job directory is renamed to by the server that claims its removal."""


def _claim_and_remove(folder: Path, jobs_dir: Path, job_id: str) -> bool:
    """Claim ``folder``'s removal by renaming it (atomic: of servers racing, one wins, as a job's claim in the
    queue), then remove it; True when this server removed it. The losers return False without a word."""
    claimed = jobs_dir / f".deleting-{job_id}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(folder, claimed)
    except FileNotFoundError:  # another server claimed it first
        return False
    except OSError as e:
        log.error("job directory not removed; the next sweep retries", extra={"job": job_id, "error": type(e).__name__})
        return False
    try:
        shutil.rmtree(claimed)  # unlinks symbolic links inside, never follows them
    except OSError as e:  # the tombstone stands; the next sweep (finalize's leftovers) claims it again
        log.error("job directory not removed; the next sweep retries", extra={"job": job_id, "error": type(e).__name__})
        return False
    return True


def finalize(db: Database, jobs_dir: Path, job_ids: list[str] | None = None) -> list[str]:
    """Make tombstones of the marked jobs that no longer run (``job_ids``, or all of them) and remove
    their files; also remove what is left of earlier tombstones' files. The ids made tombstones now."""
    with db.session() as s:
        q = select(Job.id).where(Job.deleted_at.is_not(None), Job.state != "running", Job.state != DELETED)
        if job_ids is not None:
            q = q.where(Job.id.in_(job_ids))
        done = [job_id for (job_id,) in s.execute(q).all() if tombstone(s, job_id, "deleted once it stopped")]
    gone = done if job_ids is not None else [*done, *_leftovers(db, jobs_dir)]
    for job_id in dict.fromkeys(gone):
        remove_files(jobs_dir, job_id)
    if job_ids is None and jobs_dir.is_dir():  # claimed removals a server did not finish (it died, or rmtree failed)
        for p in jobs_dir.iterdir():
            m = CLAIMED.fullmatch(p.name)
            if m and not p.is_symlink() and p.is_dir():
                _claim_and_remove(p, jobs_dir, m.group(1))
    return done


def _leftovers(db: Database, jobs_dir: Path) -> list[str]:
    """Tombstones whose directory is still there (a removal that failed or a server that died midway)."""
    if not jobs_dir.is_dir():
        return []
    present = [p.name for p in jobs_dir.iterdir() if JOB_ID.fullmatch(p.name)]
    out = []
    with db.session() as s:
        for i in range(0, len(present), 500):
            out += list(s.scalars(select(Job.id).where(Job.id.in_(present[i:i + 500]), Job.state == DELETED)))
    return out
