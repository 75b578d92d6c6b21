"""``circuitstat export``: a run's results in other tools' formats (``export mib``: MIB's leaderboard)."""

from __future__ import annotations

from pathlib import Path

import typer

from circuitstat.pipelines.mib_export import MIB_PRUNES
from circuitstat.core.params import SEED

from .analyse import Ranking
from .app import BoundaryGroup, app, choices, echo, trust_option, verified

export_app = typer.Typer(cls=BoundaryGroup, no_args_is_help=True, help="Export a run's results in other tools' formats.")
app.add_typer(export_app, name="export")

MibForm = choices("MibForm", "importances", "circuits")
MibPrune = choices("MibPrune", *MIB_PRUNES)


@export_app.command("mib")
def export_mib_command(
    run: Path = typer.Argument(..., help="run directory with edge scores (from audit or attribute)"),
    out: Path = typer.Option(..., "--out", help="submission directory: the <task>_<model> folder is written in it"),
    form: MibForm = typer.Option(MibForm("importances"), "--form",
                                 help="importances: one importances.json of edge scores; circuits: nine circuits of "
                                      "at most 0.1 ... 50 % of the edges"),
    method: str | None = typer.Option(None, "--method", help="which method's scores in an audit run (default: exact "
                                                              "if present, else the first)"),
    task_name: str | None = typer.Option(None, "--task-name", help="MIB's task name (default: the run's task)"),
    model_name: str | None = typer.Option(None, "--model-name",
                                          help="MIB's model name: gpt2, qwen2.5, gemma2, llama3 (default: from the "
                                               "run's model when it is one of them)"),
    ranking: Ranking | None = typer.Option(None, "--ranking", help="ranking of --form circuits (default: the "
                                                                    "audit's, else absolute)"),
    seed: int = typer.Option(SEED.default, "--seed", **SEED.option, help="seed of the tie-break at each cut-off"),
    force: bool = typer.Option(False, "--force", help="replace an earlier export in the same folder"),
    prune: MibPrune = typer.Option(MibPrune("complete"), "--prune",
                                   help="--form circuits: complete (to input -> logits paths, the circuit MIB's "
                                        "evaluation patches) or mib (apply_topn's one pass, dangling edges kept, "
                                        "the size MIB reports); docs/mib.md"),
    trust_unrecorded: bool = trust_option(),
) -> None:
    """Write a run's mean edge scores as a submission to MIB's circuit-localization leaderboard
    (docs/mib.md); the run's intervals go beside them in Parquet files MIB does not read."""
    from circuitstat.pipelines.mib_export import export_mib

    if run.is_dir():
        verified(run, trust_unrecorded)
    done = export_mib(run, out, method=method, form=form.value, task_name=task_name, model_name=model_name,
                      ranking=None if ranking is None else ranking.value, seed=seed, force=force,
                      prune=prune.value, trust_unrecorded=trust_unrecorded)
    echo(f"MIB {done.form} of {done.method} scores written to {done.folder}:")
    for f in done.files:
        echo(f"  {f.name}")
    for note in done.notes:
        echo(f"note: {note}")
