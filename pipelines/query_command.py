"""``circuitstat query "SQL" [DIR...]``: DuckDB over the Parquet tables of one or many runs.

Every ``*.parquet`` table of the run directories is a view by its name (``edges``, ``edge_stats``,
``stability_vs_k``, ...), unioned over the runs, with a ``run`` column naming the directory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

__all__ = ["FORMATS", "format_table", "query_command"]

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


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)  # dates, decimals, ...


def _fail(message: str) -> None:
    typer.echo(f"error: {' '.join(message.split())}", err=True)  # one line, whatever DuckDB's layout
    raise typer.Exit(2)


def query_command(
    sql: str = typer.Argument(..., help="SQL over the run's tables, e.g. \"SELECT * FROM stability_vs_k\""),
    runs: list[Path] = typer.Argument(None, help="run directories (default: the current directory)"),
    format: str = typer.Option("table", "--format", "-f", help="table, csv or json"),
) -> None:
    """Run one SELECT (DuckDB) over the Parquet tables of one or many run directories; reads nothing else."""
    import duckdb

    from reports.query import query

    if format not in FORMATS:
        _fail(f"--format must be table, csv or json, not {format!r}")
    dirs = list(runs) if runs else [Path(".")]
    try:
        result = query(sql, dirs)
    except ValueError as e:  # unknown table (lists the available ones), missing run dir, column clash
        _fail(str(e))
    except AttributeError:  # DuckDB returns no relation for statements such as CREATE or SET
        _fail("the SQL returns no rows; give a query such as SELECT ... FROM edge_stats")
    except duckdb.Error as e:
        _fail(f"{type(e).__name__}: {str(e).strip()}")
    if format == "csv":
        import pyarrow.csv as pcsv

        sink = __import__("io").BytesIO()
        pcsv.write_csv(result, sink)
        typer.echo(sink.getvalue().decode(), nl=False)
    elif format == "json":
        typer.echo(json.dumps([_jsonable(r) for r in result.to_pylist()], indent=1, allow_nan=False))
    else:
        typer.echo(format_table(result))
        typer.echo(f"({result.num_rows} row{'s' if result.num_rows != 1 else ''})")
