"""A job re-run from another records its parent: ``jobs.parent_id`` (nullable, indexed).

Revision ID: 0003
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002_tokens_admin_delete"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # no foreign key: a parent's row is kept (a deleted job stays as a tombstone), and SQLite adds a
    # column with a constraint only by copying the table
    op.add_column("jobs", sa.Column("parent_id", sa.String(32), nullable=True))
    op.create_index("ix_jobs_parent_id", "jobs", ["parent_id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_parent_id", "jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("parent_id")
