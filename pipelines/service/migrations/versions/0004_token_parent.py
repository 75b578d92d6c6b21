"""A token minted by another token records it: ``tokens.parent_id`` (nullable, indexed). Its expiry and scope
never exceed the parent's, and revoking a token revokes every token minted from it.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # no foreign key, as jobs.parent_id (0003): SQLite adds a column with a constraint only by copying the table
    op.add_column("tokens", sa.Column("parent_id", sa.String(16), nullable=True))
    op.create_index("ix_tokens_parent_id", "tokens", ["parent_id"])


def downgrade() -> None:
    op.drop_index("ix_tokens_parent_id", "tokens")
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("parent_id")
