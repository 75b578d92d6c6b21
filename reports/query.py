"""SQL over the Parquet tables of one or many run directories, via DuckDB."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    import duckdb


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _quote_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


RunDirs = Iterable[str | os.PathLike[str]] | Mapping[str, str | os.PathLike[str]]


def _named(run_dirs: RunDirs) -> list[tuple[str, Path]]:
    """(run name, directory) pairs: a mapping's keys name its directories, else each directory names itself."""
    if isinstance(run_dirs, Mapping):
        return [(str(name), Path(d)) for name, d in run_dirs.items()]
    return [(str(d), Path(d)) for d in run_dirs]


def list_tables(run_dirs: RunDirs) -> dict[str, list[tuple[str, Path]]]:
    """Return {table name (file stem): [(run name, parquet path), ...]} for the top-level tables of `run_dirs`.

    The run name is the directory as given (e.g. 'runs/a'), so it is unique among the arguments; or,
    when `run_dirs` is a mapping {name: directory}, its key (the service names runs by job id).
    """
    tables: dict[str, list[tuple[str, Path]]] = {}
    for name, d in _named(run_dirs):
        if not d.is_dir():
            raise ValueError(f"run directory {name!r} does not exist or is not a directory")
        # Hidden files are temp files of writers in progress (see reports.atomic); a symbolic link is
        # never read through (it may lead anywhere: the service serves run directories to remote users).
        for p in sorted(d.glob("*.parquet")):
            if not p.name.startswith(".") and not p.is_symlink():
                tables.setdefault(p.stem, []).append((name, p))
    return tables


def connect(run_dirs: RunDirs, run_column: str = "run") -> duckdb.DuckDBPyConnection:
    """Return an in-memory DuckDB connection with one view per table name, unioned over `run_dirs`.

    Each view has an extra column `run_column` naming the run directory a row came from. Once the
    views exist the connection is locked down: it reads those Parquet files and nothing else.
    Tables with the same name but different columns are unioned by column name (missing -> NULL).
    """
    import duckdb  # imported on use: most callers of reports never query

    con = duckdb.connect(":memory:")
    tables = list_tables(run_dirs)
    for name, files in tables.items():
        selects = []
        for run, path in files:
            if run_column in pq.read_schema(path).names:
                raise ValueError(
                    f"table {name!r} in {run} already has a column {run_column!r}; "
                    f"pass run_column='...' (e.g. 'run_dir') to name the added column differently"
                )
            selects.append(
                f"SELECT *, {_quote_str(run)} AS {_quote_ident(run_column)} "
                f"FROM read_parquet({_quote_str(str(path.absolute()))})"
            )
        con.execute(f"CREATE VIEW {_quote_ident(name)} AS " + " UNION ALL BY NAME ".join(selects))
    _lock_down(con, [path.absolute() for files in tables.values() for _, path in files])
    return con


def _lock_down(con: duckdb.DuckDBPyConnection, readable: list[Path]) -> None:
    """Confine `con` to reading the `readable` files: no other file, extension, attach or setting.

    External access off stops COPY ... TO, read_text/read_csv of other files, INSTALL/LOAD and
    ATTACH of files; the views still read the run's own tables through allowed_paths; the locked
    configuration stops SQL from turning any of it back on.
    """
    con.execute(f"SET allowed_paths = [{', '.join(_quote_str(str(p)) for p in readable)}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def check_read_only(sql: str) -> None:
    """Raise ValueError unless `sql` is one SELECT statement (allowed_paths would let COPY overwrite a table)."""
    import duckdb

    kinds = [st.type for st in duckdb.extract_statements(sql)]
    if len(kinds) != 1 or kinds[0] != duckdb.StatementType.SELECT:
        what = "no statement" if not kinds else ", ".join(k.name for k in kinds)
        raise ValueError(f"query runs one SELECT statement over the run's tables and writes nothing (got {what}); "
                         "give a query such as SELECT ... FROM edge_stats")


def query(sql: str, run_dirs: RunDirs, run_column: str = "run") -> pa.Table:
    """Return the result of `sql` as a pyarrow Table, with every table of `run_dirs` available as a view.

    Only one SELECT statement runs, on a connection that can read nothing but those tables (see
    connect). Unknown table names raise a ValueError listing the tables available.
    """
    import duckdb

    run_dirs = dict(_named(run_dirs))
    check_read_only(sql)
    con = connect(run_dirs, run_column)
    try:
        return con.sql(sql).to_arrow_table()
    except duckdb.CatalogException as e:
        available = sorted(r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall())
        raise ValueError(
            f"{str(e).splitlines()[0]}\nTables available in {list(run_dirs)}: "
            f"{', '.join(available) or '(none: no *.parquet files)'}"
        ) from None
    finally:
        con.close()


# ----- presenting a result (the query command prints these) -----
FORMATS = ("table", "csv", "json")


def _cell(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_cell(x) for x in v[:6])
        return f"[{inner}{', ...' if len(v) > 6 else ''}]"
    s = str(v)
    return s if len(s) <= 60 else s[:57] + "..."


def format_table(table) -> str:
    """A pyarrow Table as aligned text (numbers right-aligned), header first."""
    import pyarrow as pa

    names = table.column_names
    cols = [table.column(i).to_pylist() for i in range(len(names))]
    cells = [[_cell(v) for v in c] for c in cols]
    numeric = [pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)
               for f in table.schema]
    widths = [max([len(n)] + [len(x) for x in c]) for n, c in zip(names, cells)]
    lines = ["  ".join(n.rjust(w) if num else n.ljust(w) for n, w, num in zip(names, widths, numeric)).rstrip()]
    for r in range(table.num_rows):
        lines.append("  ".join(c[r].rjust(w) if num else c[r].ljust(w)
                               for c, w, num in zip(cells, widths, numeric)).rstrip())
    return "\n".join(lines)


def json_rows(v: Any) -> Any:
    """Return query result rows (or one value) as plain JSON: non-finite floats become null, bytes hex."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: json_rows(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_rows(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)  # dates, decimals, ...
