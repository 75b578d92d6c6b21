"""Searching, sorting and paging the job list (``GET /api/v1/jobs`` and the ``/jobs`` page).

Filters: a substring of the name or of the model (case-insensitive, ``%`` and ``_`` taken literally), the
state, the kind, and a range of submission times. Sorts: ``created``, ``name`` or ``state`` (in the life
order queued, running, completed, failed, cancelled), ascending or descending, the job id breaking ties so
the order is total. Pages: ``limit`` rows (at most :data:`MAX_PAGE_SIZE`, which no request can lift) after
a ``cursor`` (keyset: the position of the previous page's last row, so pages neither skip nor repeat a job
when new jobs arrive), or the 1-based ``page``. Every value from a request reaches SQL as a bound
parameter, never as SQL text.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.orm import Session
from sqlalchemy.sql import Select

from .db import JOB_STATES, Job
from .problems import Problem

MAX_PAGE_SIZE = 200
"""The most jobs one page holds, for every user and request (the page's rows cost two queries each)."""
DEFAULT_PAGE_SIZE = 50
SORTS = ("created", "name", "state")
ORDERS = ("desc", "asc")


@dataclass(frozen=True)
class JobQuery:
    """One listing request: filters, sort and page (validated by :func:`check`)."""

    name: str | None = None
    model: str | None = None
    state: str | None = None
    kind: str | None = None
    created_after: float | None = None
    created_before: float | None = None
    sort: str = "created"
    order: str = "desc"
    limit: int = DEFAULT_PAGE_SIZE
    cursor: str | None = None
    page: int | None = None
    offset: int = 0


def parse_time(value: str | None, what: str) -> float | None:
    """UNIX seconds of ``value``: a number of seconds, or an ISO 8601 date or time (UTC unless it says); a 422
    Problem naming ``what`` when it is neither."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise Problem(422, f"{what} must be UNIX seconds or an ISO 8601 date or time (2026-12-01 or "
                           f"2026-12-01T12:00:00Z), not {value[:40]!r}") from None
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def _key(sort: str):
    if sort == "name":
        return Job.name
    if sort == "state":
        return case({s: i for i, s in enumerate(JOB_STATES)}, value=Job.state, else_=len(JOB_STATES))
    return Job.created_at


def _row_key(job: Job, sort: str):
    if sort == "name":
        return job.name
    if sort == "state":
        return JOB_STATES.index(job.state) if job.state in JOB_STATES else len(JOB_STATES)
    return job.created_at


def encode_cursor(q: JobQuery, job: Job) -> str:
    """The opaque cursor of the position after ``job`` in ``q``'s order."""
    doc = {"s": q.sort, "o": q.order, "v": _row_key(job, q.sort), "i": job.id}
    return base64.urlsafe_b64encode(json.dumps(doc, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(q: JobQuery) -> tuple[object, str]:
    """(sort value, job id) of ``q.cursor``; a 422 Problem for a cursor this server did not give for this order."""
    bad = Problem(422, "cursor is not one this server gave for this sort and order; start again without it and "
                       "follow next_cursor")
    try:
        raw = base64.urlsafe_b64decode(q.cursor + "=" * (-len(q.cursor) % 4))
        doc = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad from None
    if not isinstance(doc, dict) or doc.get("s") != q.sort or doc.get("o") != q.order or not isinstance(doc.get("i"), str):
        raise bad
    value = doc.get("v")
    ok = isinstance(value, str) if q.sort == "name" else (isinstance(value, (int, float)) and not isinstance(value, bool))
    if not ok:
        raise bad
    return value, doc["i"]


def check(q: JobQuery) -> None:
    """None; a 422 Problem for an unknown sort or order, a page size over the bound, or a cursor with a page."""
    if q.sort not in SORTS or q.order not in ORDERS:
        raise Problem(422, f"sort must be one of {', '.join(SORTS)} and order one of {', '.join(ORDERS)}")
    if not 1 <= q.limit <= MAX_PAGE_SIZE:
        raise Problem(422, f"limit must be between 1 and {MAX_PAGE_SIZE} (the largest page this server gives); "
                           "follow next_cursor for more")
    if q.cursor is not None and (q.page is not None or q.offset):
        raise Problem(422, "give either cursor or page/offset, not both")
    for what, text in (("name", q.name), ("model", q.model)):
        if text and any(ord(c) < 32 or ord(c) == 127 for c in text):  # a NUL ends SQLite's LIKE pattern: all match
            raise Problem(422, f"the {what} search contains a control character (such as %00); search for "
                               "printable text")


def filtered(base: Select, q: JobQuery) -> Select:
    """``base`` (the jobs the caller may see) narrowed by ``q``'s filters, unordered."""
    conds = []
    if q.name:
        conds.append(Job.name.icontains(q.name, autoescape=True))
    if q.model:
        conds.append(Job.model.icontains(q.model, autoescape=True))
    if q.state:
        conds.append(Job.state == q.state)
    if q.kind:
        conds.append(Job.kind == q.kind)
    if q.created_after is not None:
        conds.append(Job.created_at >= q.created_after)
    if q.created_before is not None:
        conds.append(Job.created_at < q.created_before)
    return base.order_by(None).where(*conds) if conds else base.order_by(None)


def page(s: Session, base: Select, q: JobQuery) -> tuple[list[Job], int, str | None]:
    """(the page's jobs, how many jobs match the filters, the cursor of the next page or None) of ``q``."""
    check(q)
    where = filtered(base, q)
    total = s.scalar(select(func.count()).select_from(where.subquery())) or 0
    key = _key(q.sort)
    desc = q.order == "desc"
    stmt = where.order_by(key.desc() if desc else key.asc(), Job.id.desc() if desc else Job.id.asc())
    if q.cursor is not None:
        value, last = decode_cursor(q)
        after = (key < value) if desc else (key > value)
        tie = (Job.id < last) if desc else (Job.id > last)
        stmt = stmt.where(or_(after, and_(key == value, tie)))
    else:
        stmt = stmt.offset(q.offset + ((q.page - 1) * q.limit if q.page else 0))
    jobs = list(s.scalars(stmt.limit(q.limit + 1)))
    more = len(jobs) > q.limit
    jobs = jobs[:q.limit]
    return jobs, total, (encode_cursor(q, jobs[-1]) if more and jobs else None)
