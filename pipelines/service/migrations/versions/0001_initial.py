"""The service's first schema: users, tokens, browser sessions, jobs, shares, attempts, events, claim checks.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    _accounts()
    _jobs()
    _job_records()


def _accounts() -> None:
    """Users, their tokens and browser sessions."""
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("label", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
    )
    op.create_index("ix_tokens_user_id", "tokens", ["user_id"])
    op.create_table(
        "browser_sessions",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("token_id", sa.String(16), sa.ForeignKey("tokens.id"), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_browser_sessions_token_id", "browser_sessions", ["token_id"])


def _jobs() -> None:
    """The jobs table (state, lease, quota columns) and its indexes."""
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("model", sa.String(1100), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("stage", sa.String(64), nullable=True),
        sa.Column("progress", sa.Float(), nullable=True),
        sa.Column("eta_seconds", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_kind", sa.String(16), nullable=True),
        sa.Column("public", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(64), nullable=True),
        sa.Column("lease_expires", sa.Float(), nullable=True),
        sa.Column("not_before", sa.Float(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("max_work_flops", sa.Float(), nullable=False),
        sa.Column("work_flops", sa.Float(), nullable=True),
        sa.Column("request_bytes", sa.Integer(), nullable=False),
    )
    op.create_index("ix_jobs_owner_id", "jobs", ["owner_id"])
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_index("ix_jobs_created_at", "jobs", ["created_at"])
    op.create_index("ix_jobs_state_created", "jobs", ["state", "created_at"])


def _job_records() -> None:
    """What hangs off a job: shares, attempts, events and claim checks."""
    op.create_table(
        "job_shares",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id"), primary_key=True),
    )
    op.create_table(
        "job_attempts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("server", sa.String(64), nullable=False),
        sa.Column("worker", sa.String(128), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("outcome", sa.String(32), nullable=True),
    )
    op.create_index("ix_job_attempts_job_id", "job_attempts", ["job_id"])
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id"])
    op.create_table(
        "claim_checks",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=False),
        sa.Column("results", sa.Text(), nullable=False),
        sa.Column("junit", sa.Text(), nullable=False),
    )
    op.create_index("ix_claim_checks_job_id", "claim_checks", ["job_id"])


def downgrade() -> None:
    for index, table in (("ix_claim_checks_job_id", "claim_checks"), ("ix_job_events_job_id", "job_events"),
                         ("ix_job_attempts_job_id", "job_attempts")):
        op.drop_index(index, table)
    for table in ("claim_checks", "job_events", "job_attempts", "job_shares"):
        op.drop_table(table)
    for index in ("ix_jobs_state_created", "ix_jobs_created_at", "ix_jobs_state", "ix_jobs_owner_id"):
        op.drop_index(index, "jobs")
    op.drop_table("jobs")
    op.drop_index("ix_browser_sessions_token_id", "browser_sessions")
    op.drop_table("browser_sessions")
    op.drop_index("ix_tokens_user_id", "tokens")
    op.drop_table("tokens")
    op.drop_table("users")
