"""The server-rendered pages: log in, the job list, a job's page, its report and a claims result.

Jinja2 with autoescaping renders every value from a request or a run (job names, specs, task
strings, claim names) as text. No page has a script; the policy below forbids any, and any
resource from elsewhere. The report keeps its own policy (circuitstat.reports.html.assets.CSP).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from . import access, queue
from .accounts import Principal, authenticate, close_session, open_session
from .api import job_out, log_tail
from .api_runs import claims_out, compare_jobs, read_claims_body, report_csp, report_file, run_claims, run_dir, stored_check, tables_of
from .context import SCOPE_HINTS, SESSION_COOKIE, LoginRequired, page_principal, service
from .db import JOB_STATES, ClaimCheck, Job
from .problems import TITLES, Problem, not_found
from .progress import read_stages

PAGE_CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; base-uri 'none'; form-action 'self'; "
            "frame-ancestors 'none'")
LOG_LINES = 60
REFRESH_SECONDS = 5
"""How often the page of a queued or running job reloads itself (a meta refresh: no script, the policy unchanged)."""
ACTIVE = ("queued", "running")
router = APIRouter(include_in_schema=False)
_env = Environment(loader=FileSystemLoader(Path(__file__).with_name("templates")),
                   autoescape=select_autoescape(["html"], default=True))


def _age(t: float | None) -> str:
    if t is None:
        return "-"
    return _duration(max(0.0, time.time() - t))


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.0f} {unit}"
    return f"{s:.0f} s"


def _observed(v) -> str:
    if not v:
        return "-"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return _fmt(v)


def _fmt(x) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _ci(row: dict, est: str, lo: str, hi: str, side: str) -> str:
    """A comparison row's interval of run ``side`` as "value [low, high]" (circuitstat.core.interval_words)."""
    from circuitstat.core.interval_words import interval_text

    if not row.get(f"in_{side}"):
        return "not in run"

    def f(v) -> float:
        return float("nan") if v is None else float(v)

    return interval_text(f(row[f"{est}_{side}"]), f(row[f"{lo}_{side}"]), f(row[f"{hi}_{side}"]), digits=4)


def _signed(v) -> str:
    return "-" if v is None else f"{v:+.4g}"


def _yesno(v) -> str:
    return "-" if v is None else ("yes" if v else "NO")




MAX_MODEL_CHARS, MAX_MODELS_SHOWN = 60, 2


def short_models(models: str) -> str:
    """A job's model list (``a, b, c``) as the job list shows it: the first two, each cut to 60 characters, and how many
    more (the whole list is the cell's title and on the job's page)."""
    names = [m for m in str(models).split(", ") if m]
    cut = [m if len(m) <= MAX_MODEL_CHARS else m[: MAX_MODEL_CHARS - 1] + "…" for m in names[:MAX_MODELS_SHOWN]]
    more = len(names) - len(cut)
    return ", ".join(cut) + (f" and {more} more" if more > 0 else "")


_env.filters.update(age=_age, duration=_duration, observed=_observed, ci=_ci, signed=_signed, yesno=_yesno,
                    models=short_models)


def render(name: str, code: int = 200, **context) -> HTMLResponse:
    """The page ``name`` rendered with ``context`` (HTTP status ``code``), with the pages' Content-Security-Policy."""
    html = _env.get_template(name).render(**context)
    return HTMLResponse(html, status_code=code, headers={"Content-Security-Policy": PAGE_CSP})


def error_page(status: int, detail: str, user: str | None, headers: dict[str, str] | None = None) -> HTMLResponse:
    """An HTML error page (the pages' counterpart of problem+json)."""
    page = render("error.html", status, status=status, title=TITLES.get(status, "Error"), detail=detail, user=user)
    page.headers.update(headers or {})
    return page


def problem_page(request: Request, problem: Problem) -> HTMLResponse:
    """``problem`` raised by a page route as its HTML error page, for the user the request logged in as (if any)."""
    return error_page(problem.status, problem.detail, getattr(request.state, "user", None), problem.headers)


async def to_login(request: Request, exc: LoginRequired) -> RedirectResponse:
    """The answer to a page request without a session: 303 to /login."""
    return RedirectResponse("/login", status_code=303)


def _same_origin(request: Request) -> bool:
    """True only when a form post shows it comes from this server's own pages: its Origin, or else its Referer,
    names this host. One with neither, a "null" Origin, or another origin is refused: SameSite=Strict does
    not tell two ports of one host apart (one site), and a post that proves no origin proves nothing.
    Browsers send Origin with every form post (and the pages' Referrer-Policy keeps Referer same-origin)."""
    host = request.headers.get("host", "")
    origin = request.headers.get("origin")
    if origin is not None:
        return origin != "null" and urlsplit(origin).netloc == host and bool(host)
    referer = request.headers.get("referer")
    return referer is not None and urlsplit(referer).netloc == host and bool(host)


def check_same_origin(request: Request) -> None:
    """Nothing when a form post comes from this server's own pages; a 400 Problem otherwise."""
    if not _same_origin(request):
        raise Problem(400, "the form was sent from another site")


async def form_principal(request: Request, principal: Principal = Depends(page_principal)) -> Principal:
    """The logged-in caller of a page's form post, sent from this server's own pages (400 otherwise)."""
    check_same_origin(request)
    return principal


async def writer_principal(principal: Principal = Depends(form_principal)) -> Principal:
    """The caller of a form that starts or changes work: a full token's session (403 for a read-only one)."""
    if "write" not in principal.grants:  # a read-only token may look, never start work
        raise Problem(403, SCOPE_HINTS["write"])
    return principal


async def admin_principal(principal: Principal = Depends(page_principal)) -> Principal:
    """The logged-in caller of an admin page (403 for anyone not an admin)."""
    if not principal.admin:
        raise Problem(403, SCOPE_HINTS["admin"])
    return principal


@router.get("/")
async def home() -> RedirectResponse:
    return RedirectResponse("/jobs", status_code=303)


@router.get("/login")
async def login_page(request: Request) -> HTMLResponse:
    return render("login.html", user=None, error=None)


@router.post("/login")
async def login(request: Request, token: str = Form("", max_length=200)) -> Response:
    """Trade a bearer token for a session cookie (HttpOnly, SameSite=Strict)."""
    svc = service(request)
    check_same_origin(request)

    def go():
        with svc.db.session() as s:
            p = authenticate(s, token.strip())  # an API token opens a session: the cookie is the session's own
            return (p, open_session(s, p)) if p is not None else (None, None)

    principal, cookie = await run_in_threadpool(go)
    if principal is None:
        return render("login.html", 401, user=None, error="That token is not valid: an unknown or revoked token.")
    request.state.user = principal.name
    resp = RedirectResponse("/jobs", status_code=303)
    secure = svc.cfg.cookie_secure or request.url.scheme == "https"  # Secure behind TLS
    resp.set_cookie(SESSION_COOKIE, cookie, httponly=True, samesite="strict", secure=secure,
                    max_age=12 * 3600, path="/")
    return resp


@router.post("/logout")
async def logout(request: Request) -> Response:
    svc = service(request)
    if _same_origin(request):
        def go():
            with svc.db.session() as s:
                close_session(s, request.cookies.get(SESSION_COOKIE))
        await run_in_threadpool(go)
    resp = RedirectResponse("/login", status_code=303)
    resp.delete_cookie(SESSION_COOKIE, path="/")
    return resp


@router.get("/jobs")
def jobs_page(request: Request, principal: Principal = Depends(page_principal), state: str | None = None,
              name: str = "", model: str = "", after: str = "", before: str = "", sort: str = "created",
              order: str = "desc", page: str = "1"):
    """The job list: filter by name, model, state and submission dates, sort, and page through it."""
    from urllib.parse import urlencode

    from .listing import DEFAULT_PAGE_SIZE, ORDERS, SORTS, JobQuery, page as list_page, parse_time

    svc = service(request)
    form = {"name": name[:200], "model": model[:200], "state": state if state in JOB_STATES else "",
            "after": after[:40], "before": before[:40], "sort": sort if sort in SORTS else "created",
            "order": order if order in ORDERS else "desc"}
    number = int(page) if page.isdigit() and 0 < int(page) <= 1_000_000 else 1
    q = JobQuery(name=form["name"] or None, model=form["model"] or None, state=form["state"] or None,
                 created_after=parse_time(form["after"], "from"), created_before=parse_time(form["before"], "to"),
                 sort=form["sort"], order=form["order"], limit=DEFAULT_PAGE_SIZE, page=number)
    with svc.db.session() as s:
        rows, total, more = list_page(s, access.visible_jobs(principal), q)
        jobs = [job_out(s, j, principal) for j in rows]
    kept = {k: v for k, v in form.items() if v}
    link = lambda n: "/jobs?" + urlencode({**kept, "page": n})  # noqa: E731
    pages = max(1, -(-total // DEFAULT_PAGE_SIZE))
    refresh = REFRESH_SECONDS if any(j.state in ACTIVE for j in jobs) else None
    return render("jobs.html", user=principal.name, jobs=jobs, total=total, states=JOB_STATES, state=form["state"],
                  refresh=refresh,
                  form=form, sorts=SORTS, page=number, pages=pages, prev=link(number - 1) if number > 1 else None,
                  next=link(number + 1) if more else None, sort_link=lambda key: "/jobs?" + urlencode(
                      {**kept, "sort": key, "order": "asc" if form["sort"] == key and form["order"] == "desc" else "desc"}))


def _stages(run: Path) -> list[dict]:
    rows = []
    for name, rec in read_stages(run).items():
        if not isinstance(rec, dict):
            continue
        seconds = rec.get("seconds")
        rows.append({"name": name, "status": rec.get("status", "?"), "started": str(rec.get("started_utc", ""))[:19],
                     "seconds": f"{seconds:.1f}" if isinstance(seconds, (int, float)) else "",
                     "attempts": rec.get("attempts", "")})
    return rows


def _job_context(svc, principal: Principal, job_id: str) -> dict:
    with svc.db.session() as s:
        job = access.visible_job(s, principal, job_id)
        out = job_out(s, job, principal)
        checks = list(s.scalars(select(ClaimCheck).where(ClaimCheck.job_id == job.id)
                                .order_by(ClaimCheck.created_at.desc()).limit(20)))
    run = run_dir(svc, job)
    tables = []
    if job.state == "completed":
        import pyarrow.parquet as pq

        for name, path in tables_of(run).items():
            tables.append({"name": name, "rows": pq.read_metadata(path).num_rows, "bytes": path.stat().st_size})
    spec = json.dumps(json.loads(job.spec), indent=2)
    spec = spec.replace(str((svc.cfg.jobs_dir / job.id).resolve()), ".")
    return {"job": out, "own": job.owner_id == principal.user_id, "stages": _stages(run), "tables": tables,
            "can_write": "write" in principal.grants,
            "spec": spec, "log": log_tail(svc, job, LOG_LINES), "log_lines": LOG_LINES, "checks": checks,
            **_family(svc, principal, job)}


def _family(svc, principal: Principal, job: Job) -> dict:
    """The job's parent (when the caller may see it) and its re-runs the caller may see, newest first."""
    with svc.db.session() as s:
        parent = s.scalar(select(Job).where(Job.id == job.parent_id, access.visible_filter(principal), Job.deleted_at.is_(None))) \
            if job.parent_id else None
        reruns = list(s.scalars(select(Job).where(Job.parent_id == job.id, access.visible_filter(principal), Job.deleted_at.is_(None))
                                .order_by(Job.created_at.desc()).limit(20)))
    return {"parent": {"id": parent.id, "name": parent.name, "state": parent.state} if parent else None,
            "reruns": [{"id": r.id, "name": r.name, "state": r.state, "created_at": r.created_at} for r in reruns]}


@router.get("/jobs/{job_id}")
def job_page(job_id: str, request: Request, principal: Principal = Depends(page_principal)):
    ctx = _job_context(service(request), principal, job_id)
    refresh = REFRESH_SECONDS if ctx["job"].state in ACTIVE else None  # a finished job's page stays still
    return render("job.html", user=principal.name, refresh=refresh, **ctx)


def _change(request: Request, principal: Principal, job_id: str, action: str) -> Response:
    """Cancel or delete a job from a page form (its owner or an admin; ``principal`` from writer_principal), then
    redirect."""
    from . import deletion

    svc = service(request)
    with svc.db.session() as s:
        job = access.managed_job(s, principal, job_id, action)
        who = "its owner" if job.owner_id == principal.user_id else f"admin {principal.name}"
        if action == "cancel" and job.state in ("queued", "running"):
            queue.request_cancel(s, job, who)
        elif action == "delete":
            state = deletion.request_delete(s, job, f"deleted by {who}")
    back = "/admin/jobs" if principal.admin and request.query_params.get("back") == "admin" else None
    if action == "delete":
        if state == "deleted":
            deletion.remove_files(svc.cfg.jobs_dir, job_id)
        return RedirectResponse(back or "/jobs", status_code=303)
    return RedirectResponse(back or f"/jobs/{job_id}", status_code=303)


@router.post("/jobs/{job_id}/cancel")
def cancel_page(job_id: str, request: Request, principal: Principal = Depends(writer_principal)):
    return _change(request, principal, job_id, "cancel")


@router.post("/jobs/{job_id}/delete")
def delete_page(job_id: str, request: Request, principal: Principal = Depends(writer_principal)):
    return _change(request, principal, job_id, "delete")


@router.get("/admin/jobs")
def admin_page(request: Request, state: str | None = None, principal: Principal = Depends(admin_principal)):
    """Every user's jobs, with cancel and delete buttons (admins only; each visit logged)."""
    state = state if state in JOB_STATES else None
    access.audit_admin(principal, "list page", state=state)
    with service(request).db.session() as s:
        q = select(Job).where(Job.deleted_at.is_(None)).order_by(Job.created_at.desc(), Job.id)
        if state:
            q = q.where(Job.state == state)
        jobs = [job_out(s, j, principal) for j in s.scalars(q.limit(500))]
    return render("admin.html", user=principal.name, jobs=jobs, total=len(jobs), states=JOB_STATES, state=state,
                  can_write="write" in principal.grants)


@router.post("/jobs/{job_id}/rerun")
def rerun_page(job_id: str, request: Request, principal: Principal = Depends(writer_principal)):
    """The job page's re-run button: a new job with the same spec, then its page."""
    from .rerun import rerun

    job = rerun(service(request), principal, job_id)
    return RedirectResponse(f"/jobs/{job.id}", status_code=303)


@router.get("/jobs/{job_id}/report")
def report_page(job_id: str, request: Request, principal: Principal = Depends(page_principal)):
    svc = service(request)
    with svc.db.session() as s:
        job = access.visible_job(s, principal, job_id)
    if job.state != "completed":
        raise Problem(409, f"the job is {job.state}; its report is there once it has completed")
    path = report_file(svc, job)
    return HTMLResponse(path.read_text(encoding="utf-8"), headers={"Content-Security-Policy": report_csp()})


@router.post("/jobs/{job_id}/claims")
async def claims_post_page(job_id: str, request: Request, principal: Principal = Depends(form_principal)):
    svc = service(request)

    def find():
        with svc.db.session() as s:
            return access.visible_job(s, principal, job_id)

    job = await run_in_threadpool(find)
    if job.state != "completed":
        raise Problem(409, f"the job is {job.state}; claims are checked once it has completed")
    text, name = await read_claims_body(request)
    row = await run_in_threadpool(run_claims, svc, principal, job, text, name)
    return RedirectResponse(f"/jobs/{job_id}/claims/{row.id}", status_code=303)


@router.get("/jobs/{job_id}/claims/{check_id}")
def claims_page(job_id: str, check_id: str, request: Request, principal: Principal = Depends(page_principal)):
    svc = service(request)
    row = stored_check(svc, principal, job_id, check_id)
    with svc.db.session() as s:
        job_name = access.visible_job(s, principal, job_id).name
    return render("claims.html", user=principal.name, check=claims_out(row), job_name=job_name)


COMPARE_ROWS = 200  # edge rows each table of the comparison page shows at most (the JSON has every one)


@router.get("/jobs/{job_id}/compare")
def compare_form(job_id: str, request: Request, principal: Principal = Depends(page_principal), other: str = ""):
    """The job page's compare form: redirect to ``/jobs/{job_id}/compare/{other}``."""
    other = other.strip()
    if not access.JOB_ID.fullmatch(job_id) or not access.JOB_ID.fullmatch(other):
        raise not_found()
    return RedirectResponse(f"/jobs/{job_id}/compare/{other}", status_code=303)


@router.get("/jobs/{job_a}/compare/{job_b}")
def compare_page(job_a: str, job_b: str, request: Request, principal: Principal = Depends(page_principal)):
    """Two jobs side by side (the numbers of ``GET /api/v1/jobs/{a}/compare/{b}``)."""
    from circuitstat.reports.compare_text import biggest, stability_lead

    svc = service(request)
    comp = compare_jobs(svc, principal, job_a, job_b)
    with svc.db.session() as s:
        names = {"a": access.visible_job(s, principal, job_a).name, "b": access.visible_job(s, principal, job_b).name}
    doc = comp.to_dict()
    flagged = [r for r in doc["edges"] if r["overlap"] is False][:COMPARE_ROWS]
    keys = {(r["method"], r["name"]) for r in biggest(comp, COMPARE_ROWS)}
    largest = sorted((r for r in doc["edges"] if (r["method"], r["name"]) in keys),
                     key=lambda r: (-abs(r["difference"]), r["method"], str(r["name"])))
    return render("compare.html", user=principal.name, cmp=doc, names=names, flagged=flagged, largest=largest,
                  top=COMPARE_ROWS, lead=stability_lead(comp))
