"""The main job (`make demo`): default zoo → audit with exact and EAP → head stability → HTML report."""

from __future__ import annotations

from pathlib import Path

import typer

DEMO_RECIPE = "attn-only-2l"


def demo_spec(n_jobs: int = 2, quick: bool = False):
    """The demo's audit spec: the zoo's attention-only seeds on the induction task.

    ``examples/audit-zoo.yaml`` is the same spec as a file (a test keeps them equal), so
    ``circuitstat check examples/claims-zoo.yaml --run runs/demo`` checks the demo's run.
    """
    from circuitstat.pipelines.spec import parse_spec
    from circuitstat.pipelines.zoo import ZOO_SEEDS

    return parse_spec({
        "models": [f"zoo:{DEMO_RECIPE}/seed-{s}" for s in ZOO_SEEDS],
        "task": {"name": "induction", "n": 24 if quick else 64, "seed": 0, "options": {"seq_len": 10}},
        "methods": ["exact", "eap"],
        "batch_size": 16,
        "bootstrap": {"n_resamples": 200 if quick else 1000},
        "k": [5, 10, 20, 50],
        "ranking": "absolute",
        "heads": {"n_probe": 20 if quick else 100, "n_resamples": 50 if quick else 200},
        "seed": 0,
        "n_jobs": n_jobs,
    }, "<demo>")


def print_summary(run: Path, echo=typer.echo) -> None:
    """Print the run's one-screen verdict: the lines its report opens with (circuitstat.reports.verdicts), built from its tables.

    ``circuitstat demo`` and ``circuitstat audit`` both end with it."""
    from circuitstat.reports.verdicts import verdict, verdict_text

    report = Path(run) / "report.html"
    echo("\n" + verdict_text(verdict(run), report if report.exists() else None))
