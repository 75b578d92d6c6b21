"""SQL over the Parquet tables of one or many run directories, via DuckDB.

A query is untrusted input (the service exposes it to remote users), so it runs under limits that
SQL cannot lift: one SELECT; a connection that reads the run's own tables and nothing else; DuckDB's
own ``memory_limit`` and ``threads`` settings, then ``lock_configuration`` so no ``SET``/``RESET``
changes them; a statement timeout (DuckDB has no such setting: a timer interrupts the connection);
an address-space cap around the execution, because some functions allocate outside DuckDB's buffer
manager (``repeat('x', 4000000000)`` would otherwise take 8 GB before any interrupt is seen); and a
cap on the rows returned, read batch by batch so a huge result is refused before it is held.
The tables of a run directory are its own regular files: a ``*.parquet`` that is a symbolic link
leading out of the directory, or not a regular file, is refused (circuitstat.core.confine).
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    import duckdb


@dataclass(frozen=True)
class QueryLimits:
    """What one query may use: DuckDB memory and threads, seconds, rows returned, and whether the
    process's address space is capped while it runs (the CLI's one-shot process; a server that runs
    queries in its own threads should run them in a worker process instead)."""

    memory_bytes: int = 2 * 2**30
    threads: int = 2
    timeout_s: float = 60.0
    max_rows: int = 1_000_000
    cap_address_space: bool = True


DEFAULT_LIMITS = QueryLimits()
ADDRESS_HEADROOM = 512 * 2**20
"""Address space a query may take beyond its memory limit: thread stacks, allocator arenas, the result."""


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _quote_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _own_table(run_dir: Path, p: Path, name: str) -> Path:
    """The real path of table ``p`` of ``run_dir`` (called ``name`` in messages: the service names runs by job
    id, never by a server path); ValueError when it leads out of the run or is not a regular file."""
    from circuitstat.core.confine import inside

    if not inside(p, run_dir):
        raise ValueError(f"table {p.name} in run directory {name!r} is a symbolic link leading out of it; "
                         "query reads only the run's own files: remove the link")
    real = p.resolve()
    if not stat.S_ISREG(real.stat().st_mode):
        raise ValueError(f"table {p.name} in run directory {name!r} is not a regular file; remove it")
    return real


RunDirs = Iterable[str | os.PathLike[str]] | Mapping[str, str | os.PathLike[str]]


def _named(run_dirs: RunDirs) -> list[tuple[str, Path]]:
    """(run name, directory) pairs: a mapping's keys name its directories, else each directory names itself."""
    if isinstance(run_dirs, Mapping):
        return [(str(name), Path(d)) for name, d in run_dirs.items()]
    return [(str(d), Path(d)) for d in run_dirs]


def list_tables(run_dirs: RunDirs) -> dict[str, list[tuple[str, Path]]]:
    """Return {table name (file stem): [(run name, parquet path), ...]} for the top-level tables of `run_dirs`.

    The run name is the directory as given (e.g. 'runs/a'), so it is unique among the arguments; or,
    when `run_dirs` is a mapping {name: directory}, its key (the service names runs by job id). The
    path is the table's real path inside its run (ValueError for one that leads out or is no file).
    """
    tables: dict[str, list[tuple[str, Path]]] = {}
    for name, d in _named(run_dirs):
        if not d.is_dir():
            raise ValueError(f"run directory {name!r} does not exist or is not a directory")
        # Hidden files are temp files of writers in progress (see circuitstat.core.atomic).
        for p in sorted(d.glob("*.parquet")):
            if not p.name.startswith("."):
                tables.setdefault(p.stem, []).append((name, _own_table(d, p, name)))
    return tables


NEUTRAL_SETTINGS: dict[str, Any] = {
    "home_directory": "/nonexistent/home",
    "extension_directory": "/nonexistent/extensions",
    "secret_directory": "/nonexistent/secrets",
    "temp_directory": "",
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}
"""DuckDB's settings that otherwise name directories of the machine (the home, extension and secret directories
default to ``$HOME/.duckdb/...``): fixed values that name no directory of any machine, set before the
configuration is locked, so ``current_setting``, ``duckdb_settings()`` and the errors of the functions that
use them show these and nothing of the host."""


def _dataset(path: Path):
    """A lazy pyarrow dataset over the already opened (memory-mapped) Parquet file ``path``: DuckDB scans it
    through Arrow (projections and filters pushed down) and never learns a file name."""
    import pyarrow.dataset as ds

    fmt = ds.ParquetFileFormat()
    frag = fmt.make_fragment(pa.memory_map(str(path)))
    # a per-example matrix (fixed-size list) reads as a list, as DuckDB's own Parquet reader shows it, so runs
    # with different numbers of edges union
    schema = pa.schema([pa.field(f.name, pa.list_(f.type.value_type), f.nullable, f.metadata)
                        if pa.types.is_fixed_size_list(f.type) else f for f in frag.physical_schema])
    return ds.FileSystemDataset([frag], schema=schema, format=fmt)


def connect(run_dirs: RunDirs, run_column: str = "run",
            limits: QueryLimits = DEFAULT_LIMITS) -> duckdb.DuckDBPyConnection:
    """Return an in-memory DuckDB connection with one view per table name, unioned over `run_dirs`.

    Each view has an extra column `run_column` naming the run a row came from. No file path reaches the
    connection: each table is an Arrow dataset over a file opened here, registered under a neutral name
    (``__t0``, ``__t1``, ...), the views select from those names, and the settings that would name host
    directories hold NEUTRAL_SETTINGS; then the connection is locked down (no file access, no setting
    changes) within ``limits``' memory and threads. So nothing a query can read (catalog, settings, errors)
    holds a path of the host, whatever function transforms it. Tables with the same name but different
    columns are unioned by column name (missing -> NULL).
    """
    import duckdb  # imported on use: most callers of reports never query

    from circuitstat.core.schema import RENAMED_COLUMNS

    con = duckdb.connect(":memory:", config=dict(NEUTRAL_SETTINGS))
    tables = list_tables(run_dirs)
    count = 0
    for name, files in tables.items():
        selects = []
        for run, path in files:
            stored = pq.read_schema(path).names
            if run_column in stored:
                raise ValueError(
                    f"table {name!r} in {run} already has a column {run_column!r}; "
                    f"pass run_column='...' (e.g. 'run_dir') to name the added column differently"
                )
            # a run written before a column was renamed shows it under its current name (core/schema.py)
            old = [(o, n) for o, n in RENAMED_COLUMNS.get(name, {}).items() if o in stored and n not in stored]
            star = "*" + (" RENAME (" + ", ".join(f"{_quote_ident(o)} AS {_quote_ident(n)}" for o, n in old) + ")"
                          if old else "")
            source, count = f"__t{count}", count + 1
            con.register(source, _dataset(path))
            selects.append(f"SELECT {star}, {_quote_str(run)} AS {_quote_ident(run_column)} FROM {source}")
        con.execute(f"CREATE VIEW {_quote_ident(name)} AS " + " UNION ALL BY NAME ".join(selects))
    _lock_down(con, limits)
    return con


def _lock_down(con: duckdb.DuckDBPyConnection, limits: QueryLimits = DEFAULT_LIMITS) -> None:
    """Confine `con` to its registered tables within `limits`: no file, extension, attach, spilling to disk,
    or setting.

    External access off stops COPY ... TO, read_text/read_csv/read_parquet/glob of any file, INSTALL/LOAD
    and ATTACH; the views read their tables through Arrow, not through DuckDB's file system; no temporary
    directory means no spilling past the memory limit; the locked configuration stops SQL from turning
    any of it back on (SET and RESET of any option are refused).
    """
    con.execute(f"SET memory_limit = '{int(limits.memory_bytes)}B'")
    con.execute(f"SET threads = {int(limits.threads)}")
    con.execute("SET enable_progress_bar = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def check_read_only(sql: str) -> None:
    """Raise ValueError unless `sql` is one SELECT statement (the query reads and never writes)."""
    import duckdb

    kinds = [st.type for st in duckdb.extract_statements(sql)]
    if len(kinds) != 1 or kinds[0] != duckdb.StatementType.SELECT:
        what = "no statement" if not kinds else ", ".join(k.name for k in kinds)
        raise ValueError(f"query runs one SELECT statement over the run's tables and writes nothing (got {what}); "
                         "give a query such as SELECT ... FROM edge_stats")


def _vm_bytes() -> int | None:
    """This process's virtual memory size (Linux), or None where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


@contextlib.contextmanager
def _capped(limits: QueryLimits) -> Iterator[None]:
    """Cap the address space at its current size plus the query's memory and a fixed headroom (DuckDB's
    threads, the result's batches) while the query runs; restored after. No-op where unsupported."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Linux/macOS
        yield
        return
    vm = _vm_bytes() if limits.cap_address_space else None
    if vm is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = vm + int(limits.memory_bytes) + ADDRESS_HEADROOM
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY:
        cap = min(cap, soft)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


class QueryLimitError(ValueError):
    """A query went past one of its limits (time, memory, rows)."""


def _execute(con: duckdb.DuckDBPyConnection, sql: str, limits: QueryLimits) -> pa.Table:
    """The result of ``sql`` on ``con`` within ``limits``; QueryLimitError naming the limit it passed."""
    import duckdb

    timer = threading.Timer(limits.timeout_s, con.interrupt)
    timer.daemon = True
    timer.start()
    try:
        with _capped(limits):
            reader = con.sql(sql).to_arrow_reader(65536)
            batches, rows = [], 0
            for batch in reader:
                rows += batch.num_rows
                if rows > limits.max_rows:
                    raise QueryLimitError(f"the query returns more than {limits.max_rows:,} rows; add a LIMIT, "
                                          "a WHERE or an aggregate")
                batches.append(batch)
            return pa.Table.from_batches(batches, schema=reader.schema)
    except duckdb.InterruptException:
        raise QueryLimitError(f"the query ran longer than its limit of {limits.timeout_s:g} s and was stopped; "
                              "narrow it (WHERE, LIMIT, fewer joins)") from None
    except (duckdb.OutOfMemoryException, MemoryError):
        raise QueryLimitError(f"the query needs more than its memory limit of {limits.memory_bytes / 2**30:.3g} GiB; "
                              "narrow it (WHERE, LIMIT, fewer or smaller columns)") from None
    finally:
        timer.cancel()


def query(sql: str, run_dirs: RunDirs, run_column: str = "run",
          limits: QueryLimits = DEFAULT_LIMITS, *, trust_unrecorded: bool = False) -> pa.Table:
    """Return the result of `sql` as a pyarrow Table, with every table of `run_dirs` available as a view.

    Only one SELECT statement runs, on a connection that can read nothing but those tables (see
    connect), within ``limits`` (time, memory, threads, rows; QueryLimitError past one). Unknown table
    names raise a ValueError listing the tables available. A run whose tables changed since it wrote
    them (sha256 in its manifest: circuitstat.core.run_check.verify_outputs), or holds a table it has no
    record of (unless ``trust_unrecorded``), is refused (IntegrityError naming the run
    as given, never read), as check and report refuse it.
    """
    import duckdb

    from circuitstat.core.integrity import IntegrityError
    from circuitstat.core.run_check import verify_outputs

    run_dirs = dict(_named(run_dirs))
    check_read_only(sql)
    for name, d in run_dirs.items():
        try:
            verify_outputs(d, trust_unrecorded=trust_unrecorded)
        except IntegrityError as e:
            raise IntegrityError(str(e).replace(str(d), name)) from None
    con = connect(run_dirs, run_column, limits)
    try:
        return _execute(con, sql, limits)
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
