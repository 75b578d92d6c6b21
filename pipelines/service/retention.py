"""Retention: a per-user disk quota checked at submission, and the expiry of old finished jobs.

* **Disk quota** (``quotas.max_disk_bytes``): the bytes under the directories of the user's
  undeleted jobs (uploads, run directories, logs, claims files; links not followed) plus the new
  request's body must stay within it, or the submission is refused with 422 naming both numbers.
  A running job may grow past it; the next submission is then refused until jobs are deleted.
* **Expiry** (``retention_days``): every ``sweep_seconds`` each server's dispatcher deletes the
  finished (completed, failed, cancelled) jobs that ended more than ``retention_days`` ago, exactly
  as ``DELETE /api/v1/jobs/{id}`` does (circuitstat.pipelines.service.deletion), and finishes
  deletions left pending (a running job whose server died while it was being deleted).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from . import deletion
from .config import ServiceConfig
from .db import FINAL_STATES, Database, Job, now
from .problems import Problem

log = logging.getLogger("circuitstat.service")
DAY = 86400.0


def tree_bytes(path: Path) -> int:
    """The bytes of the regular files under ``path`` (symbolic links are neither followed nor counted)."""
    total, stack = 0, [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
            elif e.is_file(follow_symlinks=False):
                total += e.stat(follow_symlinks=False).st_size
    return total


def disk_usage(s: Session, cfg: ServiceConfig, user_id: int) -> int:
    """The bytes under the directories of ``user_id``'s undeleted jobs."""
    ids = s.scalars(select(Job.id).where(Job.owner_id == user_id, Job.deleted_at.is_(None)))
    return sum(tree_bytes(cfg.jobs_dir / job_id) for job_id in ids)


def check_disk(s: Session, cfg: ServiceConfig, user_id: int, limit: int | None, incoming: int) -> None:
    """None; a 422 Problem when the user's jobs and a request of ``incoming`` bytes pass ``limit``."""
    if limit is None:
        return
    used = disk_usage(s, cfg, user_id)
    if used + incoming > limit:
        raise Problem(422, f"your jobs use {used:,} bytes of disk and this request adds {incoming:,}, more than your "
                           f"quota of {limit:,} bytes; delete jobs you no longer need (DELETE /api/v1/jobs/ID)",
                      disk_bytes=used, max_disk_bytes=limit)


def expire(db: Database, days: float, at: float | None = None) -> list[str]:
    """Make tombstones of the finished jobs that ended more than ``days`` ago (at time ``at``, default now);
    their ids (their files go with :func:`circuitstat.pipelines.service.deletion.finalize`)."""
    cutoff = (now() if at is None else at) - days * DAY
    with db.session() as s:
        ids = list(s.scalars(select(Job.id).where(Job.state.in_(FINAL_STATES), Job.deleted_at.is_(None),
                                                  Job.finished_at < cutoff)))
        if not ids:
            return []
        s.execute(update(Job).where(Job.id.in_(ids), Job.deleted_at.is_(None)).values(deleted_at=now()))
        return [i for i in ids if deletion.tombstone(s, i, f"expired: finished more than {days:g} days ago")]


def sweep(cfg: ServiceConfig, db: Database, at: float | None = None) -> dict[str, int]:
    """One retention round: expire old jobs (when ``retention_days`` is set), make tombstones of every other
    marked job that no longer runs, and remove the files of every tombstone; the counts, each expiry logged."""
    expired = expire(db, cfg.retention_days, at) if cfg.retention_days is not None else []
    for job_id in expired:
        log.info("job expired by retention", extra={"job": job_id, "retention_days": cfg.retention_days})
    done = deletion.finalize(db, cfg.jobs_dir)
    return {"expired": len(expired), "deleted": len(done)}
