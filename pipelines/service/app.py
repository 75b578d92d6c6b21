"""The FastAPI application of ``circuitstat serve``: API, pages, health, metrics and the job dispatcher.

:func:`create_app` builds it from a ServiceConfig; its lifespan migrates the database, checks the
allow-list, starts the worker pool and the dispatcher, and on shutdown (SIGTERM through uvicorn)
drains them. OpenAPI is at ``/api/v1/openapi.json`` (the interactive docs pages would load scripts
from elsewhere, so they are off).
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from .config import ServiceConfig
from .context import LoginRequired, Service
from .db import Database, migrate
from .metrics import CONTENT_TYPE, Metrics
from .query_slots import FairSlots
from .quotas import BodyLimit, RateLimiter

log = logging.getLogger("circuitstat.service")
API_CSP = "default-src 'none'; frame-ancestors 'none'"


SECURITY_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"same-origin"),
                    (b"x-frame-options", b"DENY"), (b"cache-control", b"no-store")]


class AccessLog:
    """ASGI middleware: one structured log line and one metrics sample per request, and the security
    headers (a Content-Security-Policy where the response has none of its own)."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in names]
                if b"content-security-policy" not in names:
                    headers.append((b"content-security-policy", API_CSP.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - t0
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.request(route, status[0], seconds)
            client = scope.get("client")
            log.info("request", extra={"method": scope.get("method"), "path": scope.get("path"), "status": status[0],
                                       "ms": round(1000 * seconds, 1), "user": scope.get("state", {}).get("user"),
                                       "client": client[0] if client else None})


class Draining:
    """ASGI middleware: while the server drains (SIGTERM), every request is a 503 problem+json with ``draining:
    true`` and Retry-After, so clients and load balancers go elsewhere instead of meeting a refused connection."""

    def __init__(self, app, svc: Service) -> None:
        self.app, self.svc = app, svc

    async def __call__(self, scope, receive, send):
        d = self.svc.dispatcher
        if scope["type"] != "http" or d is None or not d.draining:
            return await self.app(scope, receive, send)
        from .problems import problem_response

        response = problem_response(503, "the server is draining (shutting down): it takes no requests now; retry "
                                         "on another server or once it has restarted", draining=True,
                                    headers={"Retry-After": "10"})
        await response(scope, receive, send)


def create_app(cfg: ServiceConfig, *, start_workers: bool = True) -> FastAPI:
    """The ASGI app serving ``cfg``'s data directory and database."""
    from . import api, api_manage, api_runs, api_tokens, pages, problems
    from .sources import check_config

    check_config(cfg.sources)
    db = Database(cfg.database_url)
    svc = Service(cfg=cfg, db=db, metrics=Metrics(db), limiter=RateLimiter(),
                  query_slots=FairSlots(cfg.query_slots, cfg.query_slots_per_user))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        from starlette.concurrency import run_in_threadpool

        await run_in_threadpool(migrate, db.engine)
        cfg.jobs_dir.mkdir(parents=True, exist_ok=True)
        if start_workers:
            from .dispatcher import Dispatcher
            from .pools import make_pool

            svc.dispatcher = Dispatcher(cfg, db, lambda: make_pool(cfg.scheduler, cfg.workers), svc.metrics)
            svc.dispatcher.start()
            log.info("serving", extra={"server": svc.dispatcher.server, "database": db.engine.url.render_as_string(
                hide_password=True), "scheduler": cfg.scheduler or f"local x{cfg.workers}", "data": str(cfg.data)})
        try:
            yield
        finally:
            if svc.dispatcher is not None:
                await run_in_threadpool(svc.dispatcher.drain, cfg.drain_seconds)
            db.dispose()

    app = FastAPI(title="circuitstat", version=_version(), lifespan=lifespan, openapi_url="/api/v1/openapi.json",
                  docs_url=None, redoc_url=None,
                  description="Statistical circuit audits as a service: submit audits, studies and attribution "
                              "runs, follow them, fetch their tables and reports, and check claims against them.")
    app.state.service = svc
    problems.install(app, page=pages.problem_page)  # a page's Problem is an HTML page; /api's stays problem+json
    app.add_exception_handler(LoginRequired, pages.to_login)
    app.include_router(api.router)
    app.include_router(api_runs.router)
    app.include_router(api_tokens.router)
    app.include_router(api_manage.router)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=Path(__file__).with_name("static")), name="static")

    app.openapi = lambda: _openapi(app)
    app.add_middleware(Draining, svc=svc)
    app.add_middleware(AccessLog, metrics=svc.metrics)
    app.add_middleware(BodyLimit, limit=cfg.max_request_bytes)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> JSONResponse:
        from sqlalchemy import text

        try:
            with db.session() as s:
                s.execute(text("SELECT 1"))
        except Exception as e:  # noqa: BLE001 - the probe reports any database failure
            return JSONResponse({"status": "error", "database": type(e).__name__}, status_code=503)
        d = svc.dispatcher
        if d is not None and d.pool_error:
            return JSONResponse({"status": "error", "database": "ok", "workers": f"the pool could not start: "
                                 f"{d.pool_error}"}, status_code=503)
        return JSONResponse({"status": "ok", "database": "ok", "workers_ready": d.workers_ready if d else 0,
                             "draining": bool(d and d.draining), "server": d.server if d else None})

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(svc.metrics.render(), media_type=CONTENT_TYPE)

    return app


SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "a token `csk_<id>_<secret>` from the operator "
               "(`circuitstat users token NAME`) or POST /api/v1/tokens; scope read: list, fetch, check, query; "
               "scope full: also submit, cancel, delete, share and manage tokens; an admin user also sees every job"},
    "session": {"type": "apiKey", "in": "cookie", "name": "circuitstat_session", "description": "a browser session "
                "(`css_...`, from POST /login): GET and HEAD only; an API token sent as this cookie is refused"},
}
"""The OpenAPI security schemes: what every /api/v1 operation takes (context.current_principal checks them)."""


def _openapi(app: FastAPI) -> dict:
    """The OpenAPI document with its security schemes: every /api/v1 operation needs a bearer token (reads also
    take the session cookie)."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        doc.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
        for path, ops in doc.get("paths", {}).items():
            if path.startswith("/api/v1/"):
                for method, op in ops.items():
                    op["security"] = [{"bearer": []}] + ([{"session": []}] if method in ("get", "head") else [])
        app.openapi_schema = doc
    return app.openapi_schema


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("circuitstat")
    except PackageNotFoundError:
        return "0"
