"""Scoped, expiring tokens; the admin flag of users; deleted jobs kept as tombstones.

Revision ID: 0002_tokens_admin_delete
Revises: 0001

Every new column has a server default or is nullable, so rows written by 0001 read on: existing
tokens are ``full`` and never expire, no user is an admin, no job is deleted.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_tokens_admin_delete"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch mode: SQLite copies the table where it cannot ALTER in place; PostgreSQL alters directly
    with op.batch_alter_table("users") as b:
        b.add_column(sa.Column("admin", sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table("tokens") as b:
        b.add_column(sa.Column("scope", sa.String(16), nullable=False, server_default="full"))
        b.add_column(sa.Column("expires_at", sa.Float(), nullable=True))
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("deleted_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.drop_column("deleted_at")
    with op.batch_alter_table("tokens") as b:
        b.drop_column("expires_at")
        b.drop_column("scope")
    with op.batch_alter_table("users") as b:
        b.drop_column("admin")
