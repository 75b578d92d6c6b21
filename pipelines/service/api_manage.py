"""Deleting a job (its owner or an admin) and the admin's view of every job, under ``/api/v1``.

``DELETE /api/v1/jobs/{id}`` needs a full token: 200 ``deleted`` (a tombstone now, files removed) or
202 ``deleting`` (it was running: cancelled first, the tombstone follows when its worker stopped).
``GET /api/v1/admin/jobs`` needs an admin; it lists every user's jobs, and each call is an
``admin action`` line in the service log, as is every cancel or delete of another user's job.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response, Security
from sqlalchemy import func, select

from . import access, deletion
from .accounts import Principal
from .api import JobList, job_out
from .context import current_principal, service
from .db import DELETED, JOB_KINDS, JOB_STATES, Job, User

router = APIRouter(prefix="/api/v1", tags=["manage"])


@router.delete("/jobs/{job_id}")
def delete_job(job_id: str, request: Request, response: Response,
               principal: Principal = Security(current_principal, scopes=["write"])) -> dict:
    """Delete your job (or any, as an admin): its uploads, run and log are removed, its id stays taken;
    a running job is cancelled first (202 ``deleting``)."""
    svc = service(request)
    with svc.db.session() as s:
        job = access.managed_job(s, principal, job_id, "delete")
        who = "its owner" if job.owner_id == principal.user_id else f"admin {principal.name}"
        state = deletion.request_delete(s, job, f"deleted by {who}")
    if state == DELETED:
        deletion.remove_files(svc.cfg.jobs_dir, job_id)
    else:
        response.status_code = 202
    return {"id": job_id, "state": state}


@router.get("/admin/jobs", response_model=JobList)
def admin_jobs(request: Request, principal: Principal = Security(current_principal, scopes=["admin"]),
               state: str | None = Query(None, pattern="^(" + "|".join((*JOB_STATES, DELETED)) + ")$"),
               kind: str | None = Query(None, pattern="^(" + "|".join(JOB_KINDS) + ")$"),
               owner: str | None = Query(None, max_length=64),
               limit: int = Query(50, ge=1, le=1000), offset: int = Query(0, ge=0)) -> JobList:
    """Every user's jobs, newest first (tombstones only with ``state=deleted``); admins only, and logged."""
    svc = service(request)
    access.audit_admin(principal, "list", state=state, owner_filter=owner)
    with svc.db.session() as s:
        q = select(Job).order_by(Job.created_at.desc(), Job.id)
        q = q.where(Job.state == state) if state else q.where(Job.state != DELETED)
        if kind:
            q = q.where(Job.kind == kind)
        if owner:
            q = q.join(User, User.id == Job.owner_id).where(User.name == owner)
        total = s.scalar(select(func.count()).select_from(q.order_by(None).subquery()))
        jobs = list(s.scalars(q.limit(limit).offset(offset)))
        return JobList(jobs=[job_out(s, j, principal) for j in jobs], total=total or 0)
