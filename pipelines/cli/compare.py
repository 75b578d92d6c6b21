"""``compare``: two finished runs side by side (circuitstat.reports.compare); reads tables only, never imports torch."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from .app import app, echo, trust_option, verified


@app.command("compare")
def compare_command(
    run_a: str = typer.Argument(..., help="run directory A (the --out of an audit), or a job id with --server"),
    run_b: str = typer.Argument(..., help="run directory B (or job id); differences are B minus A"),
    json_out: bool = typer.Option(False, "--json", help="print the whole comparison (every edge) as JSON instead "
                                  "of the text summary"),
    html: Path | None = typer.Option(None, "--html", help="also write the comparison as a self-contained HTML page "
                                     "to this file"),
    top: int = typer.Option(20, "--top", min=1, max=10_000, help="edges the text shows: the largest differences, "
                            "and at most this many of those whose intervals do not overlap"),
    server: str | None = typer.Option(None, "--server", help="compare two jobs on a circuitstat server (URL): RUN_A "
                                      "and RUN_B are then job ids, the token comes from $CIRCUITSTAT_TOKEN"),
    trust_unrecorded: bool = trust_option(),
) -> None:
    """Compare two runs: per-edge estimates with intervals (joined on method and edge name), circuit stability
    and faithfulness against k, and claims verdicts where both runs have them; flags intervals that do not
    overlap. Runs of different models or graphs are refused (exit 2) unless their edge sets intersect."""
    from circuitstat.core.query import json_rows
    from circuitstat.reports.compare import compare_runs

    if html is not None:
        from circuitstat.core.outpath import check_output_file

        check_output_file(html, flag="--html")  # before any work: never a device, FIFO, link or a run's record
    if server is not None:
        from circuitstat.pipelines.service.client import compare as compare_remote

        comp = compare_remote(server, run_a, run_b)
    else:
        for r in (run_a, run_b):
            if Path(r).is_dir():
                verified(Path(r), trust_unrecorded)
        comp = compare_runs(Path(run_a), Path(run_b), labels=(run_a, run_b), trust_unrecorded=trust_unrecorded)
    if html is not None:
        from circuitstat.reports.html.compare import render_comparison

        render_comparison(comp, html)
    if json_out:
        echo(json.dumps(json_rows(comp.to_dict()), indent=1, allow_nan=False))
    else:
        echo(comp.summary(top=top))
        if html is not None:
            echo(f"html: {html}")
