"""``scripts``: the run-like entry points that are not run kinds (circuitstat.pipelines.kinds.SCRIPTS), and how to
run each."""

from __future__ import annotations

from .app import app, echo


@app.command("scripts")
def scripts_command() -> None:
    """List the scripts: studies and builders run as `python -m MODULE` that write no run directory (so `check`
    and `report` do not read their output), with what each writes and where it is documented."""
    from circuitstat.pipelines.kinds import SCRIPTS

    for script in SCRIPTS.values():
        echo(f"{script.command}\n    {script.summary}\n    writes: {script.writes}; see {script.doc}")
