"""Users, bearer tokens and browser sessions.

A token is ``csk_<id>_<secret>``: the id (12 hex digits) is public and finds the row; the secret
(256 random bits) is stored only as its SHA-256 and checked with :func:`hmac.compare_digest`.
A fast hash is the right one here: the secret is random, not a password, so there is nothing to
guess. An unknown id still costs one comparison (against a dummy digest), so the time of a refusal
does not say whether the id exists. Browser sessions work the same way (``css_<id>_<secret>``
in an HttpOnly, SameSite=Strict cookie) and end with the token that opened them.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from circuitstat.core.errors import InputError

from .db import BrowserSession, Token, User, now

TOKEN_PREFIX, SESSION_PREFIX = "csk", "css"
TOKEN_PATTERN = re.compile(r"(csk|css)_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SESSION_SECONDS = 12 * 3600
_DUMMY_DIGEST = hashlib.sha256(b"no such credential").hexdigest()


@dataclass(frozen=True)
class Principal:
    """The authenticated caller: the user and the token (or session) that proved it."""

    user_id: int
    name: str
    token_id: str


def digest(secret: str) -> str:
    """The hex SHA-256 stored for a token's or session's secret."""
    return hashlib.sha256(secret.encode()).hexdigest()


def _new_credential(prefix: str) -> tuple[str, str, str]:
    """(id, secret, full credential string) of a fresh token or session."""
    ident, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    return ident, secret, f"{prefix}_{ident}_{secret}"


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not USER_NAME.fullmatch(name):
        raise InputError(f"{name!r} is not a user name; use up to 64 letters, digits, '.', '_' and '-'")
    return name


def add_user(s: Session, name: str) -> User:
    """The new user ``name``; InputError when the name is malformed or taken."""
    _check_name(name)
    if s.scalar(select(User).where(User.name == name)) is not None:
        raise InputError(f"user {name!r} exists already; pick another name")
    user = User(name=name, created_at=now(), disabled=False)
    s.add(user)
    s.flush()
    return user


def user_by_name(s: Session, name: str) -> User:
    """The user ``name``; InputError when there is none."""
    user = s.scalar(select(User).where(User.name == name))
    if user is None:
        raise InputError(f"no user {name!r}; add it with `circuitstat users add {name}`")
    return user


def create_token(s: Session, user_name: str, label: str = "") -> str:
    """A new bearer token for ``user_name`` (returned once, stored only as a hash)."""
    user = user_by_name(s, user_name)
    ident, secret, token = _new_credential(TOKEN_PREFIX)
    s.add(Token(id=ident, user_id=user.id, digest=digest(secret), label=label[:64], created_at=now()))
    return token


def revoke_token(s: Session, token_id: str) -> None:
    """Revoke the token with public id ``token_id`` (its browser sessions end with it); InputError if unknown."""
    token_id = token_id.split("_")[1] if token_id.startswith(TOKEN_PREFIX + "_") else token_id
    row = s.get(Token, token_id)
    if row is None:
        raise InputError(f"no token with id {token_id!r}; `circuitstat users list` shows the ids")
    if row.revoked_at is None:
        row.revoked_at = now()
    s.execute(update(BrowserSession).where(BrowserSession.token_id == token_id).values(expires_at=0.0))


def _verify(stored: str | None, secret: str) -> bool:
    """Constant-time comparison of a secret's digest with the stored one (a dummy when none is stored)."""
    ok = hmac.compare_digest(stored or _DUMMY_DIGEST, digest(secret))
    return ok and stored is not None


def authenticate(s: Session, credential: str | None) -> Principal | None:
    """The Principal a bearer token or session cookie proves, or None (missing, malformed, wrong,
    revoked, expired, or a disabled user)."""
    m = TOKEN_PATTERN.fullmatch(credential or "")
    if m is None:
        _verify(None, credential or "")  # the same work as a wrong secret
        return None
    kind, ident, secret = m.groups()
    if kind == SESSION_PREFIX:
        sess = s.get(BrowserSession, ident)
        if not _verify(sess.digest if sess else None, secret) or sess.expires_at < now():
            return None
        ident = sess.token_id
        token = s.get(Token, ident)
    else:
        token = s.get(Token, ident)
        if not _verify(token.digest if token else None, secret):
            return None
    if token is None or token.revoked_at is not None:
        return None
    user = s.get(User, token.user_id)
    if user is None or user.disabled:
        return None
    return Principal(user.id, user.name, token.id)


def open_session(s: Session, principal: Principal) -> str:
    """A new browser-session cookie value for ``principal`` (stored only as a hash)."""
    ident, secret, cookie = _new_credential(SESSION_PREFIX)
    t = now()
    s.add(BrowserSession(id=ident, digest=digest(secret), token_id=principal.token_id, created_at=t,
                         expires_at=t + SESSION_SECONDS))
    return cookie


def close_session(s: Session, cookie: str | None) -> None:
    """End the browser session of ``cookie`` (nothing when it is not one)."""
    m = TOKEN_PATTERN.fullmatch(cookie or "")
    if m is not None and m.group(1) == SESSION_PREFIX:
        s.execute(update(BrowserSession).where(BrowserSession.id == m.group(2)).values(expires_at=0.0))


def list_users(s: Session) -> list[dict]:
    """Every user with its tokens' ids, labels and whether they are revoked (never a secret)."""
    out = []
    for user in s.scalars(select(User).order_by(User.name)):
        tokens = s.scalars(select(Token).where(Token.user_id == user.id).order_by(Token.created_at))
        out.append({"name": user.name, "tokens": [{"id": t.id, "label": t.label, "revoked": t.revoked_at is not None}
                                                   for t in tokens]})
    return out
