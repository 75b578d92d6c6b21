"""The JSON API over a job's run directory: tables (Parquet, JSON), manifest, HTML report, claims, query.

Names from the request never become paths by themselves: a table is one of the run's top-level
Parquet files, looked up by its stem among those on disk (no symbolic links), and a job is found
through the access rules first.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Security
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from circuitstat.core.errors import InputError
from circuitstat.core.rundir import RunDirError

from . import access
from .accounts import Principal
from .api import JobOut, job_out
from .context import Service, current_principal, service
from .db import ClaimCheck, Job, now
from .problems import Problem, not_found
from .runner import RUN

router = APIRouter(prefix="/api/v1", tags=["runs"])
TABLE_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
MAX_JSON_ROWS, MAX_JSON_VALUES = 10_000, 2_000_000
MAX_QUERY_ROWS, MAX_QUERY_JOBS = 10_000, 50


def run_dir(svc: Service, job: Job) -> Path:
    """The run directory of ``job``."""
    return svc.cfg.jobs_dir / job.id / RUN


def _finished(job: Job, what: str) -> None:
    if job.state != "completed":
        raise Problem(409, f"the job is {job.state}; its {what} are there once it has completed "
                           f"(GET /api/v1/jobs/{job.id} shows its progress)")


def _job(request: Request, principal: Principal, job_id: str) -> tuple[Service, Job]:
    svc = service(request)
    with svc.db.session() as s:
        return svc, access.visible_job(s, principal, job_id)


def tables_of(run: Path) -> dict[str, Path]:
    """{table name: path} of the run's top-level Parquet tables (regular files only, no hidden temp files)."""
    if not run.is_dir():
        return {}
    return {p.stem: p for p in sorted(run.glob("*.parquet"))
            if TABLE_NAME.fullmatch(p.stem) and p.is_file() and not p.is_symlink()}


@router.get("/jobs/{job_id}/tables")
def list_tables(job_id: str, request: Request, principal: Principal = Depends(current_principal)) -> dict:
    """The run's tables, with their sizes and rows, and links to each as Parquet and JSON."""
    import pyarrow.parquet as pq

    svc, job = _job(request, principal, job_id)
    _finished(job, "tables")
    out = []
    for name, path in verified_tables(svc, job).items():
        meta = pq.read_metadata(path)
        base = f"/api/v1/jobs/{job.id}/tables/{name}"
        out.append({"name": name, "bytes": path.stat().st_size, "rows": meta.num_rows, "columns": meta.num_columns,
                    "parquet": base + ".parquet", "json": base + ".json"})
    return {"tables": out}


def verified_tables(svc: Service, job: Job) -> dict[str, Path]:
    """:func:`tables_of` the run of ``job``, only those its manifest records, once the one verified reader
    (circuitstat.core.run_check) accepts them: 409 naming the job when a recorded table changed or the manifest cannot
    be read; a file no record names (planted beside them) is never served."""
    from circuitstat.core.run_check import verify_outputs

    run = run_dir(svc, job)
    if not run.is_dir():
        return {}
    try:
        check = verify_outputs(run, trust_unrecorded=True)
        if check.unchecked and not check.checked:  # tables, but no readable record of any: the manifest is damaged
            raise InputError(f"{run}: its manifest.json records none of its tables ({', '.join(check.unchecked[:3])})")
    except InputError as e:
        raise _damaged(svc, job, e) from None
    return {n: p for n, p in tables_of(run).items() if p.name not in set(check.unchecked)}


def _table_path(svc: Service, job: Job, name: str) -> Path:
    path = verified_tables(svc, job).get(name)
    if path is None:
        raise not_found("table")
    return path


@router.get("/jobs/{job_id}/tables/{filename}")
def get_table(job_id: str, filename: str, request: Request, principal: Principal = Depends(current_principal),
              offset: int = Query(0, ge=0), limit: int = Query(1000, ge=1, le=MAX_JSON_ROWS)):
    """One table: ``NAME.parquet`` (the file, provenance included) or ``NAME.json`` (rows offset..offset+limit)."""
    svc, job = _job(request, principal, job_id)
    stem, _, ext = filename.rpartition(".")
    if ext not in ("parquet", "json") or not TABLE_NAME.fullmatch(stem):
        raise not_found("table")
    _finished(job, "tables")
    path = _table_path(svc, job, stem)
    if ext == "parquet":
        return FileResponse(path, media_type="application/vnd.apache.parquet", filename=f"{stem}.parquet")
    return JSONResponse(_json_rows(path, offset, limit))


def _json_rows(path: Path, offset: int, limit: int) -> dict:
    from circuitstat.core.query import json_rows
    from circuitstat.core.tables import read_table

    table = read_table(path)  # columns renamed since the run was written under their current names
    part = table.slice(offset, limit)
    width = sum(_values_per_row(f.type, part.column(f.name)) for f in part.schema)
    if part.num_rows * width > MAX_JSON_VALUES:
        raise Problem(422, f"{part.num_rows} rows of this table hold about {part.num_rows * width:,} values, more than "
                           f"{MAX_JSON_VALUES:,} for JSON; ask for fewer rows (limit) or fetch {path.stem}.parquet")
    return {"name": path.stem, "total_rows": table.num_rows, "offset": offset, "columns": part.column_names,
            "rows": json_rows(part.to_pylist())}


def _values_per_row(type_, column) -> int:
    import pyarrow as pa

    if pa.types.is_fixed_size_list(type_):
        return type_.list_size
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        lengths = [len(v) for v in column.to_pylist() if v is not None]
        return max(lengths, default=1)
    return 1


@router.get("/jobs/{job_id}/manifest")
def get_manifest(job_id: str, request: Request, principal: Principal = Depends(current_principal)) -> JSONResponse:
    """The run's manifest.json (stages, seeds, provenance); there as soon as the run has started. Its
    ``history`` shows when each attempt opened the run and with what spec, without the server's host name and
    process id (HOST_FIELDS): those describe the server, not the run."""
    svc, job = _job(request, principal, job_id)
    path = run_dir(svc, job) / "manifest.json"
    if not path.is_file() or path.is_symlink():
        raise Problem(409, f"the job is {job.state} and its run has no manifest yet; try again once it runs")
    doc = json.loads(path.read_text())
    if isinstance(doc, dict) and isinstance(doc.get("history"), list):
        doc["history"] = [{k: v for k, v in h.items() if k not in HOST_FIELDS} if isinstance(h, dict) else h
                          for h in doc["history"]]
    return JSONResponse(doc)


HOST_FIELDS = ("host", "pid")
"""The fields of a manifest's history entries (core.rundir) that name the server's machine and process."""


def report_file(svc: Service, job: Job) -> Path:
    """The job's report.html, rendered (by circuitstat.reports.html, as `circuitstat report`) when it is missing."""
    from circuitstat.reports.html import render_report

    run = run_dir(svc, job)
    path = run / "report.html"
    if path.is_file() and not path.is_symlink():
        return path
    out = svc.cfg.jobs_dir / job.id / "report.html"
    if not out.is_file():
        try:
            render_report(run, out, hide_paths=True)  # as the job's worker renders it: no server path on the page
        except (InputError, RunDirError) as e:  # a table changed since the job wrote it, or the run holds none
            raise _damaged(svc, job, e) from None
    return out


def _damaged(svc: Service, job: Job, e: Exception) -> Problem:
    """409 for a job whose run no longer reads back as it was written, naming the job, not the server's path."""
    run = run_dir(svc, job)
    detail = str(e).replace(str(run.resolve()), f"job {job.id}").replace(str(run), f"job {job.id}")
    return Problem(409, f"{detail} (ask the operator: the server's copy of this job changed)")


def report_csp() -> str:
    """The report's own Content-Security-Policy, plus no framing."""
    from circuitstat.reports.html.assets import CSP

    return CSP + "; frame-ancestors 'none'"


@router.get("/jobs/{job_id}/report", response_class=HTMLResponse)
def get_report(job_id: str, request: Request, principal: Principal = Depends(current_principal)) -> Response:
    """The run's self-contained HTML report (the CLI's `report`)."""
    svc, job = _job(request, principal, job_id)
    _finished(job, "report")
    path = report_file(svc, job)
    return HTMLResponse(path.read_text(encoding="utf-8"), headers={"Content-Security-Policy": report_csp()})


# ----- claims --------------------------------------------------------------------------------------------
def _jsonable(v: Any) -> Any:
    from circuitstat.core.provenance import to_jsonable
    from circuitstat.core.query import json_rows

    return json_rows(to_jsonable(v))


def run_claims(svc: Service, principal: Principal, job: Job, text: bytes, name: str) -> ClaimCheck:
    """Check the claims file ``text`` against ``job``'s run (circuitstat.pipelines.claims.check, as `circuitstat check
    --run`) and store the verdicts; 400 unreadable, 422 invalid. The file's ``run:`` and ``spec:`` are
    not followed: the run is the job's, and no audit runs from a claims file here."""
    from circuitstat.pipelines.claims import check, format_results, junit_xml, parse_claims
    from circuitstat.pipelines.yamlio import read_yaml_strict

    check_id = uuid.uuid4().hex
    folder = svc.cfg.jobs_dir / job.id / "claims"
    folder.mkdir(exist_ok=True)
    path = folder / f"{check_id}.yaml"
    path.write_bytes(text)
    shown = (name or "claims.yaml")[:200]
    try:
        data = read_yaml_strict(path)
    except InputError as e:
        raise Problem(400, str(e).replace(str(path), shown)) from None
    try:
        cf = parse_claims(data, shown)
    except InputError as e:
        raise Problem(422, str(e)) from None
    ignored = [k for k in ("run", "spec") if getattr(cf, k) is not None]
    cf = cf.model_copy(update={"run": None, "spec": None})
    from circuitstat.pipelines.claims.runkind import finished_run_problem
    from circuitstat.core.integrity import IntegrityError

    run = run_dir(svc, job)
    try:
        problem = finished_run_problem(run)
    except InputError as e:  # its manifest no longer reads back
        raise _damaged(svc, job, e) from None
    if problem is not None:  # a job of another kind (an attribute job): nothing to check the claims on
        detail = problem.replace(str(run.resolve()), f"job {job.id}").replace(str(run), f"job {job.id}")
        raise Problem(422, f"{detail}; claims are checked on an audit or tokens job")
    try:
        report = check(cf, run, bind=False)  # the job is the run: no spec to bind, and no server path in a note
    except IntegrityError as e:  # the run, not the claims file: a table changed since the job wrote it
        raise _damaged(svc, job, e) from None
    notes = [f"'{k}:' in the file is not used by the service: the run is job {job.id}" for k in ignored]
    results = [_jsonable(r.to_dict()) for r in report.results]
    doc = {"results": results, "counts": report.counts, "exit_code": report.exit_code,
           "table": format_results(report.results), "notes": notes + list(report.notes)}
    junit = junit_xml(report.results, suite=f"circuitstat check {shown}").decode()
    row = ClaimCheck(id=check_id, job_id=job.id, user_id=principal.user_id, created_at=now(), name=shown,
                     exit_code=report.exit_code, results=json.dumps(doc), junit=junit)
    with svc.db.session() as s:
        s.add(row)
    return row


def claims_out(row: ClaimCheck) -> dict:
    """The API's view of a stored claims check."""
    doc = json.loads(row.results)
    base = f"/api/v1/jobs/{row.job_id}/claims/{row.id}"
    return {"id": row.id, "job": row.job_id, "name": row.name, "created_at": row.created_at, **doc, "junit": row.junit,
            "links": {"self": base, "junit": base + "/junit.xml", "page": f"/jobs/{row.job_id}/claims/{row.id}"}}


async def read_claims_body(request: Request) -> tuple[bytes, str]:
    """(claims YAML, its name) from a multipart upload (``claims``) or a YAML/JSON text body."""
    ctype = request.headers.get("content-type", "").lower()
    if ctype.startswith("multipart/form-data"):
        from starlette.formparsers import MultiPartException

        try:
            form = await request.form(max_files=1, max_fields=4)
        except MultiPartException as e:
            raise Problem(400, f"the form cannot be read ({e.message}); send the claims file as 'claims'") from None
        f = form.get("claims")
        if f is None:
            raise Problem(422, "no claims file: send it as the 'claims' field (curl -F claims=@claims.yaml)")
        if isinstance(f, str):
            return f.encode(), "claims.yaml"
        return await f.read(), f.filename or "claims.yaml"
    return await request.body(), request.query_params.get("name", "claims.yaml")


@router.post("/jobs/{job_id}/claims", status_code=201)
async def post_claims(job_id: str, request: Request, principal: Principal = Depends(current_principal)) -> dict:
    """Check a claims file against the finished run: verdicts (JSON), the text table and JUnit XML;
    ``exit_code`` is what a local `circuitstat check` exits with (0 all hold, 1 any fails, 2 errors)."""
    svc, job = await run_in_threadpool(_job, request, principal, job_id)
    _finished(job, "claims")
    text, name = await read_claims_body(request)
    row = await run_in_threadpool(run_claims, svc, principal, job, text, name)
    return claims_out(row)


def stored_check(svc: Service, principal: Principal, job_id: str, check_id: str) -> ClaimCheck:
    """The stored claims check ``check_id`` of a job ``principal`` may see (404 otherwise)."""
    with svc.db.session() as s:
        job = access.visible_job(s, principal, job_id)
        row = s.get(ClaimCheck, check_id) if access.JOB_ID.fullmatch(check_id or "") else None
        if row is None or row.job_id != job.id:
            raise not_found("claims check")
        return row


@router.get("/jobs/{job_id}/claims/{check_id}")
def get_claims(job_id: str, check_id: str, request: Request, principal: Principal = Depends(current_principal)) -> dict:
    """A stored claims check."""
    return claims_out(stored_check(service(request), principal, job_id, check_id))


@router.get("/jobs/{job_id}/claims/{check_id}/junit.xml")
def get_junit(job_id: str, check_id: str, request: Request, principal: Principal = Depends(current_principal)):
    """A stored claims check as JUnit XML."""
    row = stored_check(service(request), principal, job_id, check_id)
    return Response(row.junit, media_type="application/xml")


# ----- query ----------------------------------------------------------------------------------------------
class QueryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sql: str = Field(max_length=100_000)
    jobs: list[str] = Field(min_length=1, max_length=MAX_QUERY_JOBS)


def _query(svc: Service, principal: Principal, body: QueryIn) -> dict:
    import dataclasses

    import duckdb
    import pyarrow as pa

    from circuitstat.core.integrity import IntegrityError
    from circuitstat.core.query import DEFAULT_LIMITS, json_rows, query

    from .query_slots import QueryBusy

    runs = {}
    with svc.db.session() as s:
        for job_id in dict.fromkeys(body.jobs):
            job = access.visible_job(s, principal, job_id)
            _finished(job, "tables")
            runs[job.id] = run_dir(svc, job)
    limits = dataclasses.replace(DEFAULT_LIMITS, timeout_s=svc.cfg.query_timeout_seconds)
    try:
        with svc.query_slots.slot(principal.name, wait_s=svc.cfg.query_wait_seconds):
            result = query(body.sql, runs, limits=limits)
    except QueryBusy as e:
        raise Problem(503, str(e), headers={"Retry-After": "5"}) from None
    except IntegrityError as e:  # a job's table changed on the server's disk (named by its job id)
        raise Problem(409, f"{e} (ask the operator: the server's copy of this job changed)") from None
    except ValueError as e:  # not one SELECT, unknown table (lists the available ones), a column clash
        raise Problem(422, str(e)) from None
    except AttributeError:
        raise Problem(422, "the SQL returns no rows; give a query such as SELECT ... FROM edge_stats") from None
    except duckdb.Error as e:
        raise Problem(422, f"{type(e).__name__}: {str(e).strip()}") from None
    except (OSError, pa.ArrowException):  # a table unreadable on the server's disk: its text would name the file
        raise Problem(409, f"a table of job(s) {', '.join(runs)} could not be read on the server; ask the operator "
                           "(the server's copy of the job is damaged)") from None
    if result.num_rows > MAX_QUERY_ROWS:
        raise Problem(422, f"the query returns {result.num_rows:,} rows, more than {MAX_QUERY_ROWS:,}; add a LIMIT or "
                           "aggregate")
    return {"columns": result.column_names, "rows": json_rows(result.to_pylist()), "row_count": result.num_rows}


@router.post("/query")
def post_query(body: QueryIn, request: Request, principal: Principal = Depends(current_principal)) -> dict:
    """One SELECT over the tables of finished jobs you may see, with the CLI's locked-down DuckDB rules
    (`circuitstat query`); each table is a view by its name, with a ``run`` column naming the job."""
    return _query(service(request), principal, body)


# ----- compare --------------------------------------------------------------------------------------------
def compare_jobs(svc: Service, principal: Principal, job_a: str, job_b: str):
    """The comparison (circuitstat.reports.compare.RunComparison) of two finished jobs ``principal`` may see,
    B minus A, as `circuitstat compare` computes it on their run directories; 404 for a job the caller may
    not see (either one, the same 404 as no job), 409 unfinished or damaged, 422 not comparable."""
    from circuitstat.core.integrity import IntegrityError
    from circuitstat.reports.compare import compare_runs

    with svc.db.session() as s:
        a, b = access.visible_job(s, principal, job_a), access.visible_job(s, principal, job_b)
    for job in (a, b):
        _finished(job, "tables")
    try:
        return compare_runs(run_dir(svc, a), run_dir(svc, b), labels=(a.id, b.id), models=([a.model], [b.model]))
    except IntegrityError as e:  # a table changed on the server's disk: named by job id, as _damaged names it
        detail = str(e)
        for job in (a, b):
            run = run_dir(svc, job)
            detail = detail.replace(str(run.resolve()), f"job {job.id}").replace(str(run), f"job {job.id}")
        raise Problem(409, f"{detail} (ask the operator: the server's copy of this job changed)") from None
    except InputError as e:  # no edge_stats, or no shared edge: named by job id, never by path
        raise Problem(422, str(e)) from None


@router.get("/jobs/{job_a}/compare/{job_b}")
def get_compare(job_a: str, job_b: str, request: Request, principal: Principal = Depends(current_principal)) -> dict:
    """Two finished jobs side by side, B minus A (`circuitstat compare` on their runs, the same numbers): per-edge
    estimates with intervals joined on method and edge name, stability and faithfulness against k, and claims
    verdicts when both runs recorded them; ``overlap`` false flags intervals that do not overlap."""
    comp = compare_jobs(service(request), principal, job_a, job_b)
    return {**comp.to_dict(), "links": {"a": f"/api/v1/jobs/{job_a}", "b": f"/api/v1/jobs/{job_b}",
                                        "page": f"/jobs/{job_a}/compare/{job_b}"}}


# ----- re-run ---------------------------------------------------------------------------------------------
@router.post("/jobs/{job_id}/rerun", status_code=202, response_model=JobOut)
def post_rerun(job_id: str, request: Request,
               principal: Principal = Security(current_principal, scopes=["write"])) -> JobOut:
    """Re-run your job: a new queued job with the same spec and uploaded task files, recording ``parent_id``
    (202 with the new job; 404 when the job is not yours, 422 when its model is no longer allowed, 429 over
    your active-job quota)."""
    from .rerun import rerun

    svc = service(request)
    job = rerun(svc, principal, job_id)
    with svc.db.session() as s:
        return job_out(s, s.get(Job, job.id), principal)
