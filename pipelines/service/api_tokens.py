"""A user's own tokens under ``/api/v1/tokens``: list (never a secret), create, rotate and revoke.

Listing needs any token; the rest need a ``full`` one (a read-only CI token cannot mint itself a
stronger one). A minted token's scope and expiry are within those of the token that mints it, and revoking a
token revokes every token minted from it (accounts.py). Another user's token id is the same 404 as an unknown one.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Security
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from circuitstat.core.errors import InputError

from . import accounts
from .accounts import Principal
from .context import current_principal, service
from .db import now
from .problems import Problem

router = APIRouter(prefix="/api/v1", tags=["tokens"])
MAX_DAYS = 3650


class TokenOut(BaseModel):
    """A token as its owner sees it: never its secret."""

    id: str
    label: str
    scope: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    revoked: bool
    expired: bool
    parent_id: str | None = Field(None, description="the token that minted it (none: the operator made it)")


class NewToken(TokenOut):
    token: str = Field(description="the bearer token; shown this once, only its hash is stored")


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str = Field("", max_length=64)
    scope: str = Field("read", pattern="^(read|full)$")
    expires_in_days: float | None = Field(None, gt=0, le=MAX_DAYS, description="none: the expiry of the token that "
                                          "mints it (never, when that one never expires); at most that")


def _not_found() -> Problem:
    return Problem(404, "no token with this id among yours; list them with GET /api/v1/tokens")


def _new(svc, principal: Principal, make) -> NewToken:
    with svc.db.session() as s:
        try:
            token = make(s)
        except InputError as e:
            if str(e).startswith("no token"):
                raise _not_found() from None
            raise Problem(422, str(e)) from None
        s.flush()
        row = accounts.token_row(s, token, principal.user_id)
        return NewToken(token=token, **accounts.token_info(row))


@router.get("/tokens", response_model=list[TokenOut])
def list_tokens(request: Request, principal: Principal = Security(current_principal)) -> list[TokenOut]:
    """Your tokens, oldest first: id, label, scope, created, expires, revoked (never a secret)."""
    with service(request).db.session() as s:
        return [TokenOut(**t) for t in accounts.list_tokens(s, principal.user_id)]


@router.post("/tokens", status_code=201, response_model=NewToken)
async def create_token(body: TokenIn, request: Request,
                       principal: Principal = Security(current_principal, scopes=["write"])) -> NewToken:
    """A new token of yours (``read`` by default), shown once."""
    expires = None if body.expires_in_days is None else now() + body.expires_in_days * 86400

    def make(s):
        return accounts.create_token(s, principal.name, body.label, scope=body.scope, expires_at=expires,
                                     parent=accounts.token_row(s, principal.token_id))

    return await run_in_threadpool(_new, service(request), principal, make)


@router.post("/tokens/{token_id}/rotate", status_code=201, response_model=NewToken)
async def rotate_token(token_id: str, request: Request,
                       principal: Principal = Security(current_principal, scopes=["write"])) -> NewToken:
    """Replace your token ``token_id`` by a new one (same label, scope and expiry), revoking the old one."""

    def make(s):
        return accounts.rotate_token(s, token_id, principal.user_id)

    return await run_in_threadpool(_new, service(request), principal, make)


@router.delete("/tokens/{token_id}", response_model=TokenOut)
def revoke_token(token_id: str, request: Request,
                 principal: Principal = Security(current_principal, scopes=["write"])) -> TokenOut:
    """Revoke your token ``token_id`` and every token minted from it (their browser sessions end with them)."""
    with service(request).db.session() as s:
        try:
            accounts.revoke_token(s, token_id, principal.user_id)
        except InputError:
            raise _not_found() from None
        s.flush()
        return TokenOut(**accounts.token_info(accounts.token_row(s, token_id, principal.user_id)))
