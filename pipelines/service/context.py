"""What every request handler needs: the server's state, and who the caller is.

The API takes ``Authorization: Bearer <token>``; a browser's session cookie is accepted too, but
only for reading (GET and HEAD), so a page can link to tables and reports and no other site can
make a logged-in browser change anything (the cookie is also SameSite=Strict, and page forms check
their Origin or Referer). A session is not a token: a bearer token sent as the cookie opens no page,
and a session cookie sent as a bearer token calls no API.

Endpoints ask for what they need as FastAPI security scopes, ``Security(current_principal,
scopes=["write"])``: ``read`` (every token), ``write`` (a ``full`` token: submit, cancel, delete,
share, manage tokens) and ``admin`` (a user the operator made an admin). A caller without one gets
403 with ``WWW-Authenticate: Bearer error="insufficient_scope"`` (RFC 6750), whatever the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request
from fastapi.security import SecurityScopes
from starlette.concurrency import run_in_threadpool

from .accounts import SESSION_PREFIX, TOKEN_PREFIX, Principal, authenticate, check_credential
from .config import ServiceConfig
from .query_slots import FairSlots
from .db import Database
from .metrics import Metrics
from .problems import Problem
from .quotas import RateLimiter

SESSION_COOKIE = "circuitstat_session"
SAFE_METHODS = ("GET", "HEAD")


@dataclass
class Service:
    """The server's state: settings, database, metrics, rate limiter, query slots and the job dispatcher."""

    cfg: ServiceConfig
    db: Database
    metrics: Metrics
    limiter: RateLimiter
    dispatcher: object | None = None
    query_slots: FairSlots = field(default_factory=FairSlots)


def service(request: Request) -> Service:
    """The Service of the app answering ``request``."""
    return request.app.state.service


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def credential(request: Request, *, cookie_ok: bool) -> tuple[str | None, str]:
    """(the bearer token of ``request``, TOKEN_PREFIX), else (when ``cookie_ok``) (its session cookie,
    SESSION_PREFIX): the kind the value must be (a token sent as a cookie is no session)."""
    token = _bearer(request)
    if token is None and cookie_ok and SESSION_COOKIE in request.cookies:
        return request.cookies.get(SESSION_COOKIE), SESSION_PREFIX
    return token, TOKEN_PREFIX


def _identify(svc: Service, value: str | None) -> Principal | None:
    """The principal of a browser's session cookie ``value`` (never of an API token sent as one)."""
    with svc.db.session() as s:
        return authenticate(s, value, SESSION_PREFIX)


def _check(svc: Service, value: str | None, kind: str) -> tuple[Principal | None, str]:
    with svc.db.session() as s:
        return check_credential(s, value, kind)


_REFUSALS = {"missing": "no token", "invalid": "the token is not valid: an unknown or revoked token",
             "expired": "the token has expired; ask the operator for a new one (or rotate a live one before it "
                        "expires)"}
SCOPE_HINTS = {"write": "this token is read-only (scope read): it may list, fetch, check and query, not submit, "
                        "cancel, delete, share or manage tokens; use a full token",
               "admin": "this needs an admin; the operator makes one with `circuitstat users admin NAME`"}


async def current_principal(request: Request, security_scopes: SecurityScopes) -> Principal:
    """The caller of an API request holding every scope the endpoint asks for (401 Problem when
    unauthenticated or expired; 403 without a scope; 429 over the rate quota)."""
    svc = service(request)
    value, kind = credential(request, cookie_ok=request.method in SAFE_METHODS)
    principal, why = await run_in_threadpool(_check, svc, value, kind)
    if principal is None:
        raise Problem(401, f"{_REFUSALS[why]}: send 'Authorization: Bearer <token>' with a token from the operator "
                           "(`circuitstat users token NAME`)", headers={"WWW-Authenticate": 'Bearer realm="circuitstat"'})
    request.state.user = principal.name
    svc.limiter.check(principal.name, svc.cfg.quotas_for(principal.name).requests_per_minute)
    missing = [sc for sc in security_scopes.scopes if sc not in principal.grants]
    if missing:
        raise Problem(403, SCOPE_HINTS.get(missing[0], f"this needs the scope {missing[0]}"), headers={
            "WWW-Authenticate": f'Bearer realm="circuitstat", error="insufficient_scope", scope="{missing[0]}"'})
    return principal


class LoginRequired(Exception):
    """A page request without a live session (the pages' handler answers it with a redirect to /login)."""


async def page_principal(request: Request) -> Principal:
    """The logged-in browser's caller; LoginRequired (a 303 to /login) when the request carries no live session."""
    svc = service(request)
    principal = await run_in_threadpool(_identify, svc, request.cookies.get(SESSION_COOKIE))
    if principal is None:
        raise LoginRequired()
    request.state.user = principal.name
    svc.limiter.check(principal.name, svc.cfg.quotas_for(principal.name).requests_per_minute)
    return principal
