"""The service's tables (SQLAlchemy) and how to open the database: SQLite by default, PostgreSQL by URL.

Times are UNIX seconds (floats): the same on every backend, no time-zone conversions. The schema
is created and upgraded by the Alembic migrations in ``migrations/`` (:func:`migrate`), never by
``create_all``, so a database made by an older server is upgraded in place.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import (Boolean, Float, ForeignKey, Index, Integer, String, Text, create_engine, event, text)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from circuitstat.pipelines.kinds import SERVED

JOB_STATES = ("queued", "running", "completed", "failed", "cancelled")
ACTIVE_STATES = ("queued", "running")
FINAL_STATES = ("completed", "failed", "cancelled")
DELETED = "deleted"  # a tombstone: the job's files are gone, its row keeps the id (never listed, 410 to its owner)
TOKEN_SCOPES = ("read", "full")  # read: look and check only; full: also submit, cancel, delete, share, manage tokens
JOB_KINDS = tuple(SERVED)  # the run kinds the service runs (circuitstat.pipelines.kinds)


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)  # lists, cancels and deletes any job (0002)


class Token(Base):
    """A bearer token: its public id and the SHA-256 of its secret part (never the secret)."""

    __tablename__ = "tokens"
    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    digest: Mapped[str] = mapped_column(String(64))
    label: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    scope: Mapped[str] = mapped_column(String(16), default="full")  # one of TOKEN_SCOPES (0002)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # None: never (0002)
    parent_id: Mapped[str | None] = mapped_column(String(16), nullable=True, index=True)  # the minting token (0004)


class BrowserSession(Base):
    """A logged-in browser: the SHA-256 of its cookie, tied to the token that logged it in."""

    __tablename__ = "browser_sessions"
    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64))
    token_id: Mapped[str] = mapped_column(ForeignKey("tokens.id"), index=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(String(1100))  # the source as the request named it
    spec: Mapped[str] = mapped_column(Text)  # JSON: the validated spec the worker runs
    state: Mapped[str] = mapped_column(String(16), index=True)
    stage: Mapped[str | None] = mapped_column(String(64), nullable=True)
    progress: Mapped[float | None] = mapped_column(Float, nullable=True)
    eta_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, index=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_kind: Mapped[str | None] = mapped_column(String(16), nullable=True)
    public: Mapped[bool] = mapped_column(Boolean, default=False)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_expires: Mapped[float | None] = mapped_column(Float, nullable=True)
    not_before: Mapped[float] = mapped_column(Float, default=0.0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    max_work_flops: Mapped[float] = mapped_column(Float)  # the owner's quota when it was submitted
    work_flops: Mapped[float | None] = mapped_column(Float, nullable=True)  # the worker's estimate
    request_bytes: Mapped[int] = mapped_column(Integer, default=0)
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # delete asked for (0002)
    parent_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)  # re-run of this job

    __table_args__ = (Index("ix_jobs_state_created", "state", "created_at"),)


class JobShare(Base):
    __tablename__ = "job_shares"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), primary_key=True)


class JobAttempt(Base):
    """One execution of a job: which server leased it, which worker ran it and how it ended."""

    __tablename__ = "job_attempts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    server: Mapped[str] = mapped_column(String(64))
    worker: Mapped[str | None] = mapped_column(String(128), nullable=True)
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    outcome: Mapped[str | None] = mapped_column(String(32), nullable=True)


class JobEvent(Base):
    """A state change of a job, written in the same transaction as the change."""

    __tablename__ = "job_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    at: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text, default="")


class ClaimCheck(Base):
    """A claims check against a finished job: the verdicts (JSON) and the JUnit XML."""

    __tablename__ = "claim_checks"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[float] = mapped_column(Float)
    name: Mapped[str] = mapped_column(String(200))
    exit_code: Mapped[int] = mapped_column(Integer)
    results: Mapped[str] = mapped_column(Text)
    junit: Mapped[str] = mapped_column(Text)


def now() -> float:
    """The current time in UNIX seconds (the one clock every table uses)."""
    return time.time()


def is_postgres(engine: Engine) -> bool:
    """True when ``engine`` talks to PostgreSQL (row locks with SKIP LOCKED are available)."""
    return engine.dialect.name == "postgresql"


def make_engine(url: str) -> Engine:
    """An Engine for ``url``; SQLite in WAL mode with every transaction taking the write lock at
    BEGIN (BEGIN IMMEDIATE), so a read-then-update such as claiming a job cannot interleave."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    path = url.split("///", 1)[-1]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": 60, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # the driver's own BEGIN is off: ours below takes the lock
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def migrate(engine: Engine) -> None:
    """Create or upgrade the schema to the newest Alembic revision (one server at a time on PostgreSQL)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
    with engine.begin() as conn:
        if is_postgres(engine):  # two servers starting together: the second waits, then finds the schema done
            conn.execute(text("SELECT pg_advisory_xact_lock(726354)"))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


class Database:
    """The engine and a session factory for one database URL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def postgres(self) -> bool:
        """True on PostgreSQL."""
        return is_postgres(self.engine)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """A session whose transaction commits when the block ends and rolls back on an exception."""
        with self._sessions() as s, s.begin():
            yield s

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()
