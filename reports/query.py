"""SQL over the Parquet tables of one or many run directories, via DuckDB."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    import duckdb


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _quote_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def list_tables(run_dirs: Iterable[str | os.PathLike[str]]) -> dict[str, list[tuple[str, Path]]]:
    """Return {table name (file stem): [(run name, parquet path), ...]} for the top-level tables of `run_dirs`.

    The run name is the directory as given (e.g. 'runs/a'), so it is unique among the arguments.
    """
    tables: dict[str, list[tuple[str, Path]]] = {}
    for d in run_dirs:
        d = Path(d)
        if not d.is_dir():
            raise ValueError(f"run directory {str(d)!r} does not exist or is not a directory")
        # Hidden files are temp files of writers in progress (see reports.atomic).
        for p in sorted(d.glob("*.parquet")):
            if not p.name.startswith("."):
                tables.setdefault(p.stem, []).append((str(d), p))
    return tables


def connect(run_dirs: Iterable[str | os.PathLike[str]], run_column: str = "run") -> duckdb.DuckDBPyConnection:
    """Return an in-memory DuckDB connection with one view per table name, unioned over `run_dirs`.

    Each view has an extra column `run_column` naming the run directory a row came from.
    Tables with the same name but different columns are unioned by column name (missing -> NULL).
    """
    import duckdb  # imported on use: most callers of reports never query

    con = duckdb.connect(":memory:")
    for name, files in list_tables(run_dirs).items():
        selects = []
        for run, path in files:
            if run_column in pq.read_schema(path).names:
                raise ValueError(
                    f"table {name!r} in {run} already has a column {run_column!r}; "
                    f"pass run_column='...' (e.g. 'run_dir') to name the added column differently"
                )
            selects.append(
                f"SELECT *, {_quote_str(run)} AS {_quote_ident(run_column)} FROM read_parquet({_quote_str(str(path))})"
            )
        con.execute(f"CREATE VIEW {_quote_ident(name)} AS " + " UNION ALL BY NAME ".join(selects))
    return con


def query(sql: str, run_dirs: Iterable[str | os.PathLike[str]], run_column: str = "run") -> pa.Table:
    """Return the result of `sql` as a pyarrow Table, with every table of `run_dirs` available as a view.

    Unknown table names raise a ValueError listing the tables available.
    """
    import duckdb

    run_dirs = list(run_dirs)
    con = connect(run_dirs, run_column)
    try:
        return con.sql(sql).to_arrow_table()
    except duckdb.CatalogException as e:
        available = sorted(r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall())
        raise ValueError(
            f"{str(e).splitlines()[0]}\nTables available in {[str(d) for d in run_dirs]}: "
            f"{', '.join(available) or '(none: no *.parquet files)'}"
        ) from None
    finally:
        con.close()
