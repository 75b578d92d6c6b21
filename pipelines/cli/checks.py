"""Commands that read finished runs: ``check`` (claims against a run) and ``query`` (SQL over its tables).

Neither imports torch: they start in well under a second (bench/startup.py; docs/benchmarks.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from circuitstat.core.errors import InputError

from .app import app, choices, echo, trust_option, verified


Format = choices("Format", "table", "csv", "json")  # output formats of `query`


@app.command("check")
def check_command(
    claims: Path = typer.Argument(..., help="claims file (YAML): published findings stated as bounds"),
    run: Path | None = typer.Option(None, "--run", help="run directory of a finished audit or tokens run (overrides "
                                    "'run:' in the file); a missing, unfinished or other kind of run is exit 2, "
                                    "nothing written"),
    run_audit: bool = typer.Option(False, "--run-audit",
                                   help="run (or resume) the audit of the file's 'spec:' into the run directory "
                                        "first when it is missing, unfinished or lacks what a claim needs (a new "
                                        "directory or an audit's run only); without it check only reads"),
    junit: Path | None = typer.Option(None, "--junit", help="write JUnit XML (one testcase per claim) to this file"),
    allow_outside: bool = typer.Option(False, "--allow-outside",
                                       help="let the file's 'run:' and 'spec:' name paths outside its directory "
                                            "(absolute, '..', symbolic links); only for claims files you trust"),
    server: str | None = typer.Option(None, "--server", help="check against a job on a circuitstat server (URL): "
                                      "--run is then the job's id, the token comes from $CIRCUITSTAT_TOKEN"),
    record: bool = typer.Option(False, "--record",
                                help="write the verdicts into the run (claims.parquet) and re-render its report, "
                                     "whose verdict then lists one line per claim"),
    trust_unrecorded: bool = trust_option(),
) -> None:
    """Check published claims against a finished audit run: exit 0 all hold, 1 any fails, 2 error.

    check only reads the run, unless --run-audit (runs the audit of the file's spec first) or --record
    (writes the verdicts into the run, under its lock)."""
    if junit is not None:
        from circuitstat.core.outpath import check_output_file

        check_output_file(junit, flag="--junit")  # a directory, device, FIFO or link is refused before the check
    if server is not None:
        from circuitstat.pipelines.service.client import check as check_remote

        if run is None:
            raise InputError("--server needs --run JOB_ID (the id `circuitstat submit` printed)")
        if record or run_audit:
            flag = "--record" if record else "--run-audit"
            raise InputError(f"{flag} works on a local run; a server keeps each check with its job already")
        raise typer.Exit(check_remote(server, claims, str(run), junit, echo=echo))
    from circuitstat.pipelines.claims import check, format_results, record_check, write_junit

    try:
        report = check(claims, run, echo=lambda m: echo(m, err=True), allow_outside=allow_outside,
                       run_audit=run_audit, trust_unrecorded=trust_unrecorded)
    except ValueError as e:  # a lower layer's refusal that is not an InputError is still the input's fault here
        if isinstance(e, InputError):
            raise
        raise InputError(f"{type(e).__name__}: {e}") from None
    if trust_unrecorded:
        verified(report.run_dir, True)
    echo(f"claims {report.source} against run {report.run_dir}"
               + (" (audit run now)" if report.ran_audit else ""))
    echo(format_results(report.results))
    c = report.counts
    echo(f"{len(report.results)} claims: {c['pass']} hold, {c['fail']} fail, {c['error']} cannot be evaluated")
    for note in report.notes:
        echo(f"note: {note}")
    if junit is not None:
        try:
            write_junit(report.results, junit, suite=f"circuitstat check {Path(report.source).name}")
        except OSError as e:
            raise InputError(f"cannot write --junit {junit}: {e.strerror or e}") from None
        echo(f"JUnit XML -> {junit}")
    if record:
        if c["error"]:  # a check that could not evaluate every claim is no verdict to record
            echo(f"not recorded: {c['error']} claim(s) cannot be evaluated; fix them and check again with --record",
                 err=True)
        else:
            table, page = record_check(report.results, report.run_dir)
            echo(f"claims table -> {table}")
            echo(f"report: {page}")
    raise typer.Exit(report.exit_code)


@app.command("query")
def query_command(
    sql: str = typer.Argument(..., help="SQL over the run's tables, e.g. \"SELECT * FROM stability_vs_k\""),
    runs: list[Path] = typer.Argument(None, help="run directories (default: the current directory)"),
    format: Format = typer.Option(Format("table"), "--format", "-f", help="output format"),
    timeout: float = typer.Option(60.0, "--timeout", min=0.1, max=86400.0, help="seconds before the query is stopped"),
    max_memory: str = typer.Option("2GiB", "--max-memory", help="memory the query may use (DuckDB's memory_limit)"),
    max_rows: int = typer.Option(1_000_000, "--max-rows", min=1, max=100_000_000, help="most rows returned"),
    trust_unrecorded: bool = trust_option(),
) -> None:
    """Run one SELECT (DuckDB) over the Parquet tables of one or many run directories; reads nothing else.

    Every ``*.parquet`` table of the run directories is a view by its name (``edges``,
    ``edge_stats``, ``stability_vs_k``, ...), unioned over the runs, with a ``run`` column. The query
    runs within --timeout, --max-memory and --max-rows, which SQL cannot change. A run whose tables changed
    since it wrote them (sha256 in its manifest), whose manifest cannot be read, or that holds a table no record
    names, is refused (exit 2), as check and report refuse it; --trust-unrecorded reads hand-made tables.
    """
    import duckdb

    from circuitstat.circuits.limits import check_budget, parse_bytes
    from circuitstat.core.query import QueryLimits, format_table, json_rows, query

    dirs = list(runs) if runs else [Path(".")]
    limits = QueryLimits(memory_bytes=check_budget(parse_bytes(max_memory)), timeout_s=timeout, max_rows=max_rows)
    watchdog = _watchdog(2 * timeout + 5)
    try:
        for d in dirs:
            if d.is_dir():
                verified(d, trust_unrecorded)
        result = query(sql, dirs, limits=limits, trust_unrecorded=trust_unrecorded)
    except ValueError as e:  # unknown table (lists the available ones), missing run dir, column clash
        raise InputError(str(e)) from None
    except AttributeError:  # DuckDB returns no relation for statements such as CREATE or SET
        raise InputError("the SQL returns no rows; give a query such as SELECT ... FROM edge_stats") from None
    except duckdb.Error as e:
        raise InputError(f"{type(e).__name__}: {str(e).strip()}") from None
    finally:
        watchdog.cancel()
    if format.value == "csv":
        import io

        import pyarrow.csv as pcsv

        sink = io.BytesIO()
        pcsv.write_csv(result, sink)
        echo(sink.getvalue().decode(), nl=False)
    elif format.value == "json":
        echo(json.dumps(json_rows(result.to_pylist()), indent=1, allow_nan=False))
    else:
        echo(format_table(result))
        echo(f"({result.num_rows} row{'s' if result.num_rows != 1 else ''})")


def _physical_memory() -> int | None:
    """Bytes of physical memory of this machine (None where the system does not say)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _watchdog(seconds: float):
    """End the process with exit 2 after ``seconds``: DuckDB checks its interrupt between operations, so
    one scalar call on a huge value (within the memory limit) can outlast --timeout; query writes
    nothing, so ending it at once loses nothing."""
    import os
    import sys
    import threading

    def stop() -> None:
        sys.stderr.write(f"error: the query did not stop within {seconds:g} s of its --timeout; narrow it\n")
        sys.stderr.flush()
        os._exit(2)

    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()
    return timer
