"""Re-running a job: a new job with the parent's validated spec and uploaded task files, recording ``parent_id``.

Only the owner re-runs a job (seeing a shared or public job is not owning it). The new job is a new
submission in every other respect: it counts against the owner's active-job quota and takes today's
work quota, its model sources must still be on the operator's allow-list (an operator who removed a
model refuses its re-runs), and it starts private (the parent's sharing is not copied). The parent
may be in any state: a failed or cancelled job is re-run as well as a completed one.
"""

from __future__ import annotations

import shutil
import uuid

from sqlalchemy import select

from circuitstat.core.errors import InputError

from . import access, queue
from .accounts import Principal
from .context import Service
from .db import Job, JobEvent, User, now
from .problems import Problem
from .quotas import check_active
from .retention import check_disk
from .sources import allowed_source

INPUTS = "inputs"


def _check_sources(job: Job, svc: Service) -> None:
    """422 when a model source the parent's request named is no longer on the allow-list."""
    for source in job.model.split(", "):  # the request's sources as submitted (submission.prepare joins them so)
        try:
            allowed_source(source, svc.cfg.sources)
        except InputError as e:
            raise Problem(422, f"cannot re-run: {e}") from None


def _copy_inputs(svc: Service, parent: Job, job_id: str) -> str:
    """Copy the parent's inputs (spec and uploaded task files) for job ``job_id``; its spec JSON, with the
    parent's paths inside the server's job directory rewritten to the new job's."""
    old, new = svc.cfg.jobs_dir / parent.id, svc.cfg.jobs_dir / job_id
    new.mkdir(parents=True)
    if (old / INPUTS).is_dir():
        shutil.copytree(old / INPUTS, new / INPUTS, symlinks=True)
    spec = parent.spec
    for before, after in ((str(old.resolve()), str(new.resolve())), (str(old), str(new))):
        spec = spec.replace(before, after)
    return spec


def rerun(svc: Service, principal: Principal, job_id: str) -> Job:
    """A new queued job of ``principal`` with the spec and uploads of their job ``job_id`` and ``parent_id`` set;
    404 when it is not theirs, 422 when its sources are no longer allowed, 429 over the active-job quota."""
    quotas = svc.cfg.quotas_for(principal.name)
    with svc.db.session() as s:
        parent = access.owned_job(s, principal, job_id)
        check_active(queue.active_count(s, principal.user_id), quotas.max_active_jobs)
    _check_sources(parent, svc)
    new_id = uuid.uuid4().hex
    try:
        spec = _copy_inputs(svc, parent, new_id)
        with svc.db.session() as s:
            s.execute(select(User.id).where(User.id == principal.user_id).with_for_update())
            check_active(queue.active_count(s, principal.user_id), quotas.max_active_jobs)
            # the copied uploads count against the disk quota as a new submission's would (retention.py)
            check_disk(s, svc.cfg, principal.user_id, quotas.max_disk_bytes, parent.request_bytes or 0)
            job = Job(id=new_id, owner_id=principal.user_id, kind=parent.kind, name=parent.name, model=parent.model,
                      spec=spec, state="queued", created_at=now(), public=False, attempts=0, not_before=0.0,
                      cancel_requested=False, max_work_flops=quotas.max_work_flops,
                      request_bytes=parent.request_bytes, parent_id=parent.id)
            s.add(job)
            s.add(JobEvent(job_id=new_id, at=job.created_at, state="queued", message=f"re-run of job {parent.id}"))
        return job
    except BaseException:
        shutil.rmtree(svc.cfg.jobs_dir / new_id, ignore_errors=True)
        raise
