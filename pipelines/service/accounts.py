"""Users, bearer tokens and browser sessions.

A token is ``csk_<id>_<secret>``: the id (12 hex digits) is public and finds the row; the secret
(256 random bits) is stored only as its SHA-256 and checked with :func:`hmac.compare_digest`.
A fast hash is the right one here: the secret is random, not a password, so there is nothing to
guess. An unknown id still costs one comparison (against a dummy digest), so the time of a refusal
does not say whether the id exists. Browser sessions work the same way (``css_<id>_<secret>``
in an HttpOnly, SameSite=Strict cookie) and end with the token that opened them.

A token has a scope (``read``: look at jobs, fetch results, check claims and query; ``full``: also
submit, cancel, delete, share and manage tokens) and optionally an expiry time; a session has the
scope and expiry of its token. Rotation replaces a token by a new one (new id and secret, same
user, label, scope and expiry) and revokes the old one.

A token minted through the API by another token (its parent) has a scope and an expiry within the parent's,
and revoking a token revokes every token minted from it, at any depth (a leaked token's descendants end
with it); rotation hands the children to the new token.
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

from .db import TOKEN_SCOPES, BrowserSession, Token, User, now

TOKEN_PREFIX, SESSION_PREFIX = "csk", "css"
TOKEN_PATTERN = re.compile(r"(csk|css)_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SESSION_SECONDS = 12 * 3600
MAX_TOKENS = 100  # live (unrevoked, unexpired) tokens of one user
GRANTS = {"read": frozenset({"read"}), "full": frozenset({"read", "write"})}
"""What each token scope grants: the scopes endpoints ask for with ``Security(current_principal, scopes=[...])``."""
_DUMMY_DIGEST = hashlib.sha256(b"no such credential").hexdigest()


@dataclass(frozen=True)
class Principal:
    """The authenticated caller: the user and the token (or session) that proved it."""

    user_id: int
    name: str
    token_id: str
    scope: str = "full"
    admin: bool = False

    @property
    def grants(self) -> frozenset[str]:
        """The endpoint scopes this caller holds: its token's, plus ``admin`` for an admin user."""
        return GRANTS[self.scope] | ({"admin"} if self.admin else frozenset())


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


def _check_scope(scope: str) -> str:
    if scope not in TOKEN_SCOPES:
        raise InputError(f"token scope {scope!r} is not one of {', '.join(TOKEN_SCOPES)}; use read for CI that only "
                         "checks and fetches, full to submit and change jobs")
    return scope


def _live_tokens(s: Session, user_id: int) -> int:
    t = now()
    return len([1 for row in s.scalars(select(Token).where(Token.user_id == user_id, Token.revoked_at.is_(None)))
                if row.expires_at is None or row.expires_at > t])


MAX_LABEL = 64
"""Longest token label (what the token is for, e.g. 'ci')."""


def _within_parent(parent: Token, scope: str, expires_at: float | None) -> float | None:
    """The expiry of a token that ``parent`` mints with ``scope``: none asked is the parent's; InputError when
    the scope or the expiry asked for would exceed the parent's (a minted token never outlives its parent)."""
    if not GRANTS[scope] <= GRANTS[parent.scope]:
        raise InputError(f"a {parent.scope} token cannot mint a {scope} token; use a full token")
    if expires_at is None:
        return parent.expires_at
    if parent.expires_at is not None and expires_at > parent.expires_at:
        left = max(parent.expires_at - now(), 0.0) / 86400
        raise InputError(f"the new token would outlive the token that mints it (it expires in {left:.4g} days); "
                         f"ask for at most {left:.4g} days, or omit the expiry to take the parent's")
    return expires_at


def create_token(s: Session, user_name: str, label: str = "", *, scope: str = "full",
                 expires_at: float | None = None, parent: Token | None = None) -> str:
    """A new bearer token for ``user_name`` (returned once, stored only as a hash) with ``scope``
    (read or full) that expires at ``expires_at`` (UNIX seconds; None: never, or the parent's); minted by the
    token ``parent`` (None: by the operator), its scope and expiry are within the parent's."""
    if len(label) > MAX_LABEL:  # refused, never cut: the operator reads the label back to tell tokens apart
        raise InputError(f"the token's label is {len(label):,} characters; give at most {MAX_LABEL}")
    user = user_by_name(s, user_name)
    _check_scope(scope)
    if parent is not None:
        expires_at = _within_parent(parent, scope, expires_at)
    if expires_at is not None and not expires_at > now():
        raise InputError("the token's expiry is in the past; give a time (or a number of days) in the future")
    if _live_tokens(s, user.id) >= MAX_TOKENS:
        raise InputError(f"user {user_name!r} has {MAX_TOKENS} live tokens, the most allowed; revoke unused ones first")
    ident, secret, token = _new_credential(TOKEN_PREFIX)
    s.add(Token(id=ident, user_id=user.id, digest=digest(secret), label=label, created_at=now(), scope=scope,
                expires_at=expires_at, parent_id=parent.id if parent is not None else None))
    return token


def token_row(s: Session, token_id: str, user_id: int | None = None) -> Token:
    """The token whose public id is ``token_id`` (or the token itself), of ``user_id`` when given;
    InputError when there is none (another user's token reads as none)."""
    token_id = token_id.split("_")[1] if token_id.startswith(TOKEN_PREFIX + "_") and token_id.count("_") >= 2 \
        else token_id
    row = s.get(Token, token_id) if re.fullmatch(r"[0-9a-f]{12}", token_id or "") else None
    if row is None or (user_id is not None and row.user_id != user_id):
        raise InputError(f"no token with id {token_id[:16]!r}; `circuitstat users tokens NAME` shows the ids")
    return row


def revoke_token(s: Session, token_id: str, user_id: int | None = None) -> None:
    """Revoke the token with public id ``token_id`` and every token minted from it, at any depth (their browser
    sessions end with them); InputError if unknown."""
    rows, t = [token_row(s, token_id, user_id)], now()
    while rows:
        row = rows.pop()
        if row.revoked_at is None:
            row.revoked_at = t
        s.execute(update(BrowserSession).where(BrowserSession.token_id == row.id).values(expires_at=0.0))
        rows += list(s.scalars(select(Token).where(Token.parent_id == row.id, Token.revoked_at.is_(None))))


def rotate_token(s: Session, token_id: str, user_id: int | None = None) -> str:
    """A new token replacing ``token_id`` (same user, label, scope and expiry; new id and secret), the old
    one revoked; InputError when it is unknown, revoked or expired (then make a new one)."""
    row = token_row(s, token_id, user_id)
    if row.revoked_at is not None or (row.expires_at is not None and row.expires_at <= now()):
        raise InputError(f"token {row.id} is {'revoked' if row.revoked_at is not None else 'expired'}; only a live "
                         "token is rotated: create a new one instead")
    user = s.get(User, row.user_id)
    token = create_token(s, user.name, row.label, scope=row.scope, expires_at=row.expires_at)
    s.flush()
    new = token_row(s, token)
    new.parent_id = row.parent_id  # the new token takes the old one's place: same parent, and its children
    s.execute(update(Token).where(Token.parent_id == row.id).values(parent_id=new.id))
    row.revoked_at = now()
    s.execute(update(BrowserSession).where(BrowserSession.token_id == row.id).values(expires_at=0.0))
    return token


def token_info(row: Token) -> dict:
    """What may be shown of a token: never its secret nor its hash."""
    t = now()
    return {"id": row.id, "label": row.label, "scope": row.scope, "created_at": row.created_at,
            "expires_at": row.expires_at, "revoked_at": row.revoked_at, "revoked": row.revoked_at is not None,
            "expired": row.expires_at is not None and row.expires_at <= t, "parent_id": row.parent_id}


def list_tokens(s: Session, user_id: int) -> list[dict]:
    """Every token of the user, oldest first, as :func:`token_info` shows them."""
    return [token_info(r) for r in s.scalars(select(Token).where(Token.user_id == user_id)
                                             .order_by(Token.created_at, Token.id))]


def set_admin(s: Session, user_name: str, admin: bool) -> User:
    """Make ``user_name`` an admin (or not); the user."""
    user = user_by_name(s, user_name)
    user.admin = bool(admin)
    return user


def _verify(stored: str | None, secret: str) -> bool:
    """Constant-time comparison of a secret's digest with the stored one (a dummy when none is stored)."""
    ok = hmac.compare_digest(stored or _DUMMY_DIGEST, digest(secret))
    return ok and stored is not None


def check_credential(s: Session, credential: str | None, kind: str = TOKEN_PREFIX) -> tuple[Principal | None, str]:
    """(the Principal a credential of ``kind`` proves, "") or (None, why): "missing", "invalid" (malformed, of
    the other kind, wrong, revoked, a disabled user) or "expired". ``kind`` is TOKEN_PREFIX for a bearer token
    (the API) and SESSION_PREFIX for a session cookie (the pages): a token is never a session, nor a session a
    token. Expiry is told only to a caller who holds the right secret."""
    if credential is None:
        _verify(None, "")
        return None, "missing"
    m = TOKEN_PATTERN.fullmatch(credential)
    if m is None or m.group(1) != kind:
        _verify(None, credential)  # the same work as a wrong secret
        return None, "invalid"
    kind, ident, secret = m.groups()
    if kind == SESSION_PREFIX:
        sess = s.get(BrowserSession, ident)
        if not _verify(sess.digest if sess else None, secret) or sess.expires_at < now():
            return None, "invalid"
        token = s.get(Token, sess.token_id)
    else:
        token = s.get(Token, ident)
        if not _verify(token.digest if token else None, secret):
            return None, "invalid"
    if token is None or token.revoked_at is not None:
        return None, "invalid"
    user = s.get(User, token.user_id)
    if user is None or user.disabled:
        return None, "invalid"
    if token.expires_at is not None and token.expires_at <= now():
        return None, "expired"
    return Principal(user.id, user.name, token.id, token.scope, bool(user.admin)), ""


def authenticate(s: Session, credential: str | None, kind: str = TOKEN_PREFIX) -> Principal | None:
    """The Principal a bearer token (or, with ``kind=SESSION_PREFIX``, a session cookie) proves, or None
    (missing, malformed, of the other kind, wrong, revoked, expired, or a disabled user)."""
    return check_credential(s, credential, kind)[0]


def open_session(s: Session, principal: Principal) -> str:
    """A new browser-session cookie value for ``principal`` (stored only as a hash)."""
    ident, secret, cookie = _new_credential(SESSION_PREFIX)
    t = now()
    token = s.get(Token, principal.token_id)
    ends = t + SESSION_SECONDS if token.expires_at is None else min(t + SESSION_SECONDS, token.expires_at)
    s.add(BrowserSession(id=ident, digest=digest(secret), token_id=principal.token_id, created_at=t, expires_at=ends))
    return cookie


def close_session(s: Session, cookie: str | None) -> None:
    """End the browser session of ``cookie`` (nothing when it is not one)."""
    m = TOKEN_PATTERN.fullmatch(cookie or "")
    if m is not None and m.group(1) == SESSION_PREFIX:
        s.execute(update(BrowserSession).where(BrowserSession.id == m.group(2)).values(expires_at=0.0))


def list_users(s: Session) -> list[dict]:
    """Every user, whether an admin, with its tokens as :func:`token_info` shows them (never a secret)."""
    return [{"name": user.name, "admin": bool(user.admin), "tokens": list_tokens(s, user.id)}
            for user in s.scalars(select(User).order_by(User.name))]
