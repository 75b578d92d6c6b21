"""Scoped, expiring tokens; the admin flag of users; deleted jobs kept as tombstones.

Revision ID: 0002_tokens_admin_delete
Revises: 0001

Every new column is nullable or has a server default, so rows written under 0001 read on: existing
tokens are ``full`` and never expire, no user is an admin, no job is deleted. Plain ``ADD COLUMN``
on both backends: SQLite's batch mode would copy and drop ``users``, which the foreign keys of a
database with rows refuse (tests/service/test_service_ops.py upgrades such a database).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_tokens_admin_delete"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("users", sa.Column("admin", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("tokens", sa.Column("scope", sa.String(16), nullable=False, server_default="full"))
    op.add_column("tokens", sa.Column("expires_at", sa.Float(), nullable=True))
    op.add_column("jobs", sa.Column("deleted_at", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "deleted_at")
    op.drop_column("tokens", "expires_at")
    op.drop_column("tokens", "scope")
    op.drop_column("users", "admin")
