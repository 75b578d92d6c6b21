"""``application/problem+json`` errors (RFC 9457): every refusal names the problem and the fix.

Status codes, each where it belongs:

* 400 the request cannot be read (not JSON, a malformed form, YAML that does not parse);
* 401 no token, or a wrong, revoked or expired one (an expired one is named as such);
* 403 the token lacks the scope (a read-only token asked to change something) or the caller is not
  an admin on an admin endpoint;
* 404 no such job, table or check among those the caller may see (another user's run included);
* 409 the job is in the wrong state for the request (tables of an unfinished run, cancelling a
  finished job);
* 410 a job that was deleted (to its owner and admins; the same 404 as no job to everyone else);
* 413 the request body is larger than the caller's quota;
* 422 the request is readable but refused: an invalid spec or claims file, a model source the
  allow-list does not name, a refused query (what the CLI would say with exit 2);
* 429 too many active jobs or requests (with Retry-After).
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

MEDIA_TYPE = "application/problem+json"
API_PREFIX = "/api/"
"""Every path of the JSON API starts here; a Problem anywhere else is a page's, rendered as HTML."""
TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
          409: "Conflict", 410: "Gone", 413: "Content Too Large", 422: "Unprocessable Content",
          429: "Too Many Requests",
          500: "Internal Server Error", 503: "Service Unavailable"}



class BodyTooLarge(Exception):
    """The request body passed the limit while it was read (raised by the body-limit middleware, a 413)."""

class Problem(Exception):
    """An error response: status, a one-line detail and optional extra members and headers."""

    def __init__(self, status: int, detail: str, *, headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers, self.extra = status, " ".join(str(detail).split()), headers, extra


def not_found(what: str = "job") -> Problem:
    """The one 404 for an object the caller may not see, whether or not it exists."""
    return Problem(404, f"no {what} with this id among those you may see; list yours with GET /api/v1/jobs")


def problem_response(status: int, detail: str, *, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    """The problem+json response of ``status`` with ``detail``."""
    body = {"type": "about:blank", "title": TITLES.get(status, "Error"), "status": status, "detail": detail, **extra}
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def install(app, page: Callable[[Request, Problem], Response] | None = None) -> None:
    """Register the handlers that turn every error into problem+json; a Problem raised outside /api becomes
    ``page(request, problem)`` (the pages' HTML error page) when ``page`` is given."""

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem):
        if page is not None and not request.url.path.startswith(API_PREFIX):
            return page(request, exc)
        return problem_response(exc.status, exc.detail, headers=exc.headers, **exc.extra)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        detail = exc.detail if isinstance(exc.detail, str) and exc.status_code != 404 else (
            "no such resource; the API lives under /api/v1 (see /api/v1/openapi.json)")
        return problem_response(exc.status_code, detail, headers=getattr(exc, "headers", None))

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge):
        return problem_response(413, str(exc), headers={"Connection": "close"})

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        parts = []
        for err in exc.errors()[:5]:
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "(body)"
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
        return problem_response(422, "invalid request: " + "; ".join(parts))
