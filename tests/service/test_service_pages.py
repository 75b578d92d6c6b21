"""Every page route is guarded by its dependency: enumerated from app.routes, never from a hand list.

A page request without a session is a 303 to /login; another user's job is refused exactly as a job that does not
exist (same status, an HTML error page that names neither the job, its name nor a path of the server). A route
registered without the dependency, or with it but without the access check, is caught by the same enumeration.
"""

from __future__ import annotations

import re
import uuid

import pytest
from fastapi import Depends, Request
from fastapi.responses import HTMLResponse
from fastapi.routing import APIRoute

from inprocess import App

from circuitstat.pipelines.service.context import page_principal
from circuitstat.pipelines.service.db import Job
from circuitstat.pipelines.service.problems import API_PREFIX

# The routes outside /api that answer without a session, on purpose; a new one must be added here knowingly.
PUBLIC = {("GET", "/"), ("GET", "/login"), ("POST", "/login"), ("POST", "/logout"), ("GET", "/healthz"),
          ("GET", "/metrics")}
SAME_ORIGIN = {"Origin": "http://testserver"}  # a form post of the server's own pages


def page_routes(app) -> list[tuple[str, str]]:
    """(method, path template) of every route of ``app`` outside the JSON API (HEAD answers as GET does)."""
    try:  # FastAPI >= 0.165 keeps an included router as one entry of app.routes; this walks into it
        from fastapi.routing import iter_route_contexts
    except ImportError:
        routes = [r for r in app.routes if isinstance(r, APIRoute)]
    else:
        routes = [r for r in iter_route_contexts(app.routes) if isinstance(r.original_route, APIRoute)]
    return sorted((m, r.path) for r in routes if not r.path.startswith(API_PREFIX) for m in r.methods - {"HEAD"})


def _fill(path: str, job: str, check: str) -> str:
    return re.sub(r"\{job_(id|a|b)\}", job, path).replace("{check_id}", check)


def guard_failures(server: App, owner_name: str) -> list[str]:
    """What breaks the pages' guards: a non-public route that answers a request without a session other than by a
    303 to /login, or that answers bob on alice's job otherwise than on a job that does not exist, or with a page
    that names the job, its name or the data directory."""
    job = server.add_job("alice", name=owner_name)
    missing, check = uuid.uuid4().hex, uuid.uuid4().hex
    secrets = (job, owner_name, str(server.svc.cfg.data))
    failures = []
    for method, template in page_routes(server.app):
        if (method, template) in PUBLIC:
            continue
        path = _fill(template, job, check)
        server.client.cookies.clear()  # no session
        # every request asks to compare with the same job: the compare form reads ?other=, other routes ignore it
        anon = server.client.request(method, path, params={"other": job}, headers=SAME_ORIGIN, follow_redirects=False)
        if anon.status_code != 303 or anon.headers.get("location") != "/login":
            failures.append(f"{method} {template} without a session: {anon.status_code}")
        if "{job_" not in template:
            continue
        theirs = server.page("bob", path, method, params={"other": job})  # redirects followed: the form's target too
        nothing = server.page("bob", _fill(template, missing, check), method, params={"other": missing})
        shown = theirs.text.replace(path, "")
        if theirs.status_code != nothing.status_code or theirs.status_code < 400:
            failures.append(f"{method} {template} on another user's job: {theirs.status_code}, "
                            f"on no job {nothing.status_code}")
        elif any(s in shown for s in secrets) or not theirs.headers["content-type"].startswith("text/html"):
            failures.append(f"{method} {template} on another user's job leaks: {shown[:200]}")
    return failures


@pytest.fixture
def server(tmp_path):
    app = App(tmp_path / "data")
    yield app
    app.close()


def test_every_page_route_refuses_no_session_and_another_users_job_alike(server):
    routes = page_routes(server.app)
    # the enumeration sees the pages (a changed route list would otherwise pass by testing nothing)
    assert {("GET", "/jobs/{job_id}"), ("POST", "/jobs/{job_id}/delete"), ("GET", "/admin/jobs"),
            ("GET", "/jobs/{job_a}/compare/{job_b}")} <= set(routes) and len(routes) >= 15
    assert guard_failures(server, "alices-secret-name") == []
    job = server.add_job("alice", name="alices-secret-name")
    assert server.page("alice", f"/jobs/{job}").status_code == 200  # the owner sees it: bob's 404 is a refusal
    assert "alices-secret-name" in server.page("alice", f"/jobs/{job}").text


def test_a_pages_problem_is_html_and_the_apis_stays_problem_json(server):
    missing = uuid.uuid4().hex
    page = server.page("bob", f"/jobs/{missing}")
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
    assert "no job with this id among those you may see" in page.text and "bob" in page.text  # the logged-in user
    assert "script-src" not in page.headers["content-security-policy"]  # the pages' policy
    api = server.get("bob", f"/api/v1/jobs/{missing}")
    assert api.status_code == 404 and api.headers["content-type"] == "application/problem+json"
    assert api.json()["detail"] == re.search(r'id="problem">([^<]*)<', page.text).group(1)
    cross_site = server.page("bob", f"/jobs/{missing}/delete", "POST", headers={})  # no Origin: refused before the job
    assert cross_site.status_code == 400 and "another site" in cross_site.text


def test_a_route_without_the_dependency_is_caught(server):
    """Negative controls: a page that skips the session dependency, and one that takes it but skips the access check,
    are both reported by the same enumeration."""
    svc = server.svc

    def unguarded(job_id: str) -> HTMLResponse:
        return HTMLResponse(f"run at {svc.cfg.jobs_dir / job_id}")

    def unchecked(job_id: str, request: Request, principal=Depends(page_principal)) -> HTMLResponse:
        with svc.db.session() as s:
            job = s.get(Job, job_id)
            if job is None:
                return HTMLResponse("no such job", status_code=404)
            return HTMLResponse(f"job {job.name}")

    server.app.router.add_api_route("/jobs/{job_id}/unguarded", unguarded, methods=["GET"])
    server.app.router.add_api_route("/jobs/{job_id}/unchecked", unchecked, methods=["GET"])
    failures = guard_failures(server, "alices-secret-name")
    assert any(f.startswith("GET /jobs/{job_id}/unguarded without a session") for f in failures), failures
    assert any(f.startswith("GET /jobs/{job_id}/unchecked on another user's job") for f in failures), failures
    assert not any("/unchecked without a session" in f for f in failures)  # it does take the dependency
    assert len(failures) == 3, failures  # unguarded: no session and another user's job; unchecked: the latter only
