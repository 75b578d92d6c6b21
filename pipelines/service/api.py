"""The JSON API of jobs under ``/api/v1``: submit, list, status, cancel, sharing, log.

Submitting takes ``multipart/form-data`` (``kind``, ``spec`` as a file or text, task files as
``files``, optional ``name``, ``public``, ``share``) or ``application/json`` (``kind``, ``spec`` as
YAML text or an object, ``name``, ``public``, ``share``). The job is queued at once (202); the
status says where it stands.
"""

from __future__ import annotations

import json
import shutil
import uuid
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Security
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from . import access, listing, queue
from .accounts import Principal
from .context import Service, current_principal, service
from .db import JOB_KINDS, JOB_STATES, Job, JobEvent, User, now
from .listing import JobQuery
from .problems import Problem
from .quotas import check_active, check_body
from .retention import check_disk, disk_usage
from .runner import LOG
from .submission import MAX_UPLOADS, Upload, prepare, too_many_uploads

router = APIRouter(prefix="/api/v1", tags=["jobs"])
LOG_TAIL_LINES = 200


class JobOut(BaseModel):
    """A job as the API shows it."""

    id: str
    kind: str
    name: str
    owner: str
    model: str
    state: str
    stage: str | None
    progress: float | None
    eta_seconds: float | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    error: str | None
    error_kind: str | None
    attempts: int
    public: bool
    shared_with: list[str] | None = Field(None, description="only shown to the owner")
    parent_id: str | None = Field(None, description="the job this one re-runs (POST /jobs/{id}/rerun), if any")
    queue_position: int | None = Field(None, description="while queued: 1 + the queued jobs (of every user) the "
                                       "server takes before this one now, round-robin by user; null in every "
                                       "other state")
    links: dict[str, str]


class JobList(BaseModel):
    jobs: list[JobOut]
    total: int = Field(description="jobs matching the filters, on every page")
    next_cursor: str | None = Field(None, description="pass as cursor for the next page; null on the last page")


class Sharing(BaseModel):
    model_config = ConfigDict(extra="forbid")
    public: bool | None = None
    users: list[str] | None = Field(None, max_length=1000)


def job_out(s: Session, job: Job, principal: Principal) -> JobOut:
    """The JobOut of ``job`` for ``principal``."""
    base = f"/api/v1/jobs/{job.id}"
    links = {"self": base, "log": f"{base}/log", "manifest": f"{base}/manifest", "tables": f"{base}/tables",
             "report": f"{base}/report", "claims": f"{base}/claims", "page": f"/jobs/{job.id}"}
    own = job.owner_id == principal.user_id
    if job.parent_id:
        links["parent"] = f"/api/v1/jobs/{job.parent_id}"
    return JobOut(id=job.id, kind=job.kind, name=job.name, owner=access.owner_name(s, job), model=job.model,
                  state=job.state, stage=job.stage, progress=job.progress, eta_seconds=job.eta_seconds,
                  created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at, error=job.error,
                  error_kind=job.error_kind, attempts=job.attempts, public=job.public,
                  shared_with=access.shared_with(s, job) if own else None, parent_id=job.parent_id,
                  queue_position=queue.position(s, job), links=links)


# ----- submit ---------------------------------------------------------------------------------------
def _flag(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise Problem(422, f"{where} must be true or false")


def _names(value: Any) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise Problem(422, "share must be a list of user names (or one comma-separated string)")


async def _read_multipart(request: Request, limit: int) -> dict:
    from starlette.exceptions import HTTPException
    from starlette.formparsers import MultiPartException

    try:  # the spec's file, the task files and one more: a form with too many is the documented 422 below
        form = await request.form(max_files=MAX_UPLOADS + 2, max_fields=16, max_part_size=limit)
    except (MultiPartException, HTTPException) as e:  # Starlette turns the parser's error into a 400 HTTPException
        message = str(getattr(e, "message", None) or getattr(e, "detail", ""))
        if "too many files" in message.lower():
            raise Problem(422, too_many_uploads()) from None
        raise Problem(400, f"the form cannot be read ({message}); send multipart/form-data with fields kind, spec "
                           "and files") from None
    spec = form.get("spec")
    spec_text = spec.encode() if isinstance(spec, str) else (await spec.read() if spec is not None else None)
    files = [Upload(f.filename or "", await f.read()) for f in form.getlist("files") if not isinstance(f, str)]
    if any(isinstance(f, str) for f in form.getlist("files")):
        raise Problem(400, "'files' must be file uploads (curl -F files=@task.jsonl)")
    default_name = getattr(spec, "filename", None) or ""
    return {"kind": form.get("kind"), "spec_text": spec_text, "spec_data": None, "files": files,
            "name": form.get("name") or default_name, "public": form.get("public", "false"),
            "share": form.get("share")}


async def _read_json(request: Request) -> dict:
    try:
        body = await request.json()
    except (ValueError, RecursionError):
        raise Problem(400, "the body is not valid JSON; send {\"kind\": \"audit\", \"spec\": ...}") from None
    if not isinstance(body, dict):
        raise Problem(400, "the body must be a JSON object with kind and spec")
    unknown = sorted(set(body) - {"kind", "spec", "name", "public", "share"})
    if unknown:
        raise Problem(422, f"unknown keys {unknown[:5]}; the body takes kind, spec, name, public and share")
    spec = body.get("spec")
    return {"kind": body.get("kind"), "spec_text": spec.encode() if isinstance(spec, str) else None,
            "spec_data": spec if isinstance(spec, dict) else None, "files": [], "name": body.get("name") or "",
            "public": body.get("public", False), "share": body.get("share")}


def _create(svc: Service, principal: Principal, sub: dict, size: int) -> JobOut:
    quotas = svc.cfg.quotas_for(principal.name)
    kind = sub["kind"]
    if kind not in JOB_KINDS:
        raise Problem(422, f"kind must be one of {', '.join(JOB_KINDS)}")
    name = str(sub["name"] or kind)[:200]
    public, share = _flag(sub["public"], "public"), _names(sub["share"])
    with svc.db.session() as s:
        check_active(queue.active_count(s, principal.user_id), quotas.max_active_jobs)
        check_disk(s, svc.cfg, principal.user_id, quotas.max_disk_bytes, size)
    job_id = uuid.uuid4().hex
    job_dir = svc.cfg.jobs_dir / job_id
    try:
        prepared = prepare(kind, sub["spec_text"], sub["spec_data"], sub["files"], job_dir, svc.cfg.sources,
                           quotas)
        with svc.db.session() as s:
            # one submission per user at a time (a row lock; SQLite's BEGIN IMMEDIATE already serialises)
            s.execute(select(User.id).where(User.id == principal.user_id).with_for_update())
            check_active(queue.active_count(s, principal.user_id), quotas.max_active_jobs)
            job = Job(id=job_id, owner_id=principal.user_id, kind=kind, name=name, model=prepared.model,
                      spec=json.dumps(prepared.spec), state="queued", created_at=now(), public=public, attempts=0,
                      not_before=0.0, cancel_requested=False, max_work_flops=quotas.max_work_flops,
                      request_bytes=size)
            s.add(job)
            s.flush()
            access.set_sharing(s, job, public=None, users=share)
            s.add(JobEvent(job_id=job_id, at=job.created_at, state="queued", message="submitted"))
            s.flush()
            return job_out(s, job, principal)
    except BaseException:
        shutil.rmtree(job_dir, ignore_errors=True)
        raise


@router.post("/jobs", status_code=202, response_model=JobOut,
             openapi_extra={"requestBody": {"content": {
                 "multipart/form-data": {"schema": {"type": "object", "required": ["kind", "spec"], "properties": {
                     "kind": {"type": "string", "enum": list(JOB_KINDS)},
                     "spec": {"type": "string", "format": "binary", "description": "the CLI's YAML spec"},
                     "files": {"type": "array", "items": {"type": "string", "format": "binary"}},
                     "name": {"type": "string"}, "public": {"type": "boolean"},
                     "share": {"type": "string", "description": "comma-separated user names"}}}},
                 "application/json": {"schema": {"type": "object", "required": ["kind", "spec"]}}}}})
async def submit(request: Request, principal: Principal = Security(current_principal, scopes=["write"])) -> JobOut:
    """Queue an audit, a study or an attribute run; 202 with the job."""
    svc = service(request)
    limit = svc.cfg.quotas_for(principal.name).max_request_bytes
    ctype = request.headers.get("content-type", "").lower()
    if ctype.startswith("multipart/form-data"):
        sub = await _read_multipart(request, limit)
    elif ctype.startswith("application/json"):
        sub = await _read_json(request)
    else:
        raise Problem(400, "send multipart/form-data (kind, spec, files) or application/json (kind, spec)")
    size = int(request.scope.get("state", {}).get("body_bytes") or request.headers.get("content-length") or 0)
    check_body(size, limit)
    return await run_in_threadpool(_create, svc, principal, sub, size)


# ----- read and change ------------------------------------------------------------------------------------
def _list(svc: Service, principal: Principal, scope: str, q: JobQuery) -> JobList:
    with svc.db.session() as s:
        base = access.visible_jobs(principal)
        if scope == "own":
            base = base.where(Job.owner_id == principal.user_id)
        elif scope == "others":
            base = base.where(Job.owner_id != principal.user_id)
        jobs, total, cursor = listing.page(s, base, q)
        return JobList(jobs=[job_out(s, j, principal) for j in jobs], total=total, next_cursor=cursor)


@router.get("/jobs", response_model=JobList)
def list_jobs(request: Request, principal: Principal = Depends(current_principal),
              state: str | None = Query(None, pattern="^(" + "|".join(JOB_STATES) + ")$"),
              kind: str | None = Query(None, pattern="^(" + "|".join(JOB_KINDS) + ")$"),
              scope: str = Query("all", pattern="^(all|own|others)$"),
              name: str | None = Query(None, max_length=200, description="a substring of the name (any case)"),
              model: str | None = Query(None, max_length=200, description="a substring of the model (any case)"),
              created_after: str | None = Query(None, max_length=40, description="submitted at or after: UNIX "
                                                "seconds or an ISO 8601 date or time (UTC unless it says)"),
              created_before: str | None = Query(None, max_length=40, description="submitted before (as above)"),
              sort: str = Query("created", pattern="^(" + "|".join(listing.SORTS) + ")$"),
              order: str = Query("desc", pattern="^(asc|desc)$"),
              limit: int = Query(listing.DEFAULT_PAGE_SIZE, ge=1, le=listing.MAX_PAGE_SIZE,
                                 description=f"jobs per page, at most {listing.MAX_PAGE_SIZE}"),
              cursor: str | None = Query(None, max_length=600, description="next_cursor of the previous page"),
              page: int | None = Query(None, ge=1, le=1_000_000, description="1-based page (instead of cursor)"),
              offset: int = Query(0, ge=0, le=10_000_000)) -> JobList:
    """The jobs you may see (your own, shared with you, public), filtered by name, model, state, kind and
    submission time, sorted by created, name or state, one page at a time (``next_cursor`` continues)."""
    q = JobQuery(name=name, model=model, state=state, kind=kind,
                 created_after=listing.parse_time(created_after, "created_after"),
                 created_before=listing.parse_time(created_before, "created_before"), sort=sort, order=order,
                 limit=limit, cursor=cursor, page=page, offset=offset)
    return _list(service(request), principal, scope, q)


@router.get("/jobs/{job_id}", response_model=JobOut)
def job_status(job_id: str, request: Request, principal: Principal = Depends(current_principal)) -> JobOut:
    """A job's state, stage, progress and ETA."""
    with service(request).db.session() as s:
        return job_out(s, access.visible_job(s, principal, job_id), principal)


@router.post("/jobs/{job_id}/cancel", response_model=JobOut)
def cancel(job_id: str, request: Request, principal: Principal = Security(current_principal, scopes=["write"])
           ) -> JobOut:
    """Cancel your queued or running job, or any job as an admin (409 when it has ended)."""
    with service(request).db.session() as s:
        job = access.managed_job(s, principal, job_id, "cancel")
        if job.state not in ("queued", "running"):
            raise Problem(409, f"the job is {job.state}; only queued or running jobs can be cancelled")
        queue.request_cancel(s, job, "its owner" if job.owner_id == principal.user_id else f"admin {principal.name}")
        return job_out(s, job, principal)


@router.put("/jobs/{job_id}/sharing", response_model=JobOut)
def share(job_id: str, body: Sharing, request: Request,
          principal: Principal = Security(current_principal, scopes=["write"])) -> JobOut:
    """Make your job public or not, and share it with exactly the users named."""
    with service(request).db.session() as s:
        job = access.owned_job(s, principal, job_id)
        access.set_sharing(s, job, public=body.public, users=body.users)
        s.flush()
        return job_out(s, job, principal)


def log_tail(svc: Service, job: Job, lines: int) -> str:
    """The last ``lines`` lines of the job's log, the server's path of the job replaced by '.'."""
    from collections import deque

    path = svc.cfg.jobs_dir / job.id / LOG
    if not path.is_file() or path.is_symlink():
        return ""
    with open(path, encoding="utf-8", errors="replace") as f:
        tail = "".join(deque(f, maxlen=lines))
    return tail.replace(str((svc.cfg.jobs_dir / job.id).resolve()), ".").replace(str(svc.cfg.jobs_dir / job.id), ".")


@router.get("/jobs/{job_id}/log", response_class=PlainTextResponse)
def job_log(job_id: str, request: Request, principal: Principal = Depends(current_principal),
            lines: int = Query(LOG_TAIL_LINES, ge=1, le=10_000)) -> PlainTextResponse:
    """The tail of what the job's run printed (text/plain)."""
    svc = service(request)
    with svc.db.session() as s:
        job = access.visible_job(s, principal, job_id)
    return PlainTextResponse(log_tail(svc, job, lines))


@router.get("/me")
def me(request: Request, principal: Principal = Depends(current_principal)) -> dict:
    """Who the token belongs to, its scope, whether an admin, the disk the user's jobs use, and the quotas."""
    svc = service(request)
    with svc.db.session() as s:
        used = disk_usage(s, svc.cfg, principal.user_id)
    return {"user": principal.name, "token_id": principal.token_id, "scope": principal.scope, "admin": principal.admin,
            "disk_bytes": used, "quotas": svc.cfg.quotas_for(principal.name).model_dump()}
