"""Alembic environment of the service's database (run by circuitstat.pipelines.service.db.migrate, or by `alembic`
with ``-x url=...`` when a maintainer writes a new revision with ``--autogenerate``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from circuitstat.pipelines.service.db import Base

config = context.config
target_metadata = Base.metadata


def _run(connection) -> None:
    # render_as_batch: SQLite cannot ALTER most things in place; batch mode copies the table instead
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        raise SystemExit("pass the database with: alembic -x url=postgresql://... upgrade head")
    with create_engine(url).connect() as conn:
        _run(conn)
