"""Which runs a check may read, and which an audit may be written into: decided from the run's manifest
and tables before anything is read or written (issue 38: `check --run` ran an audit into an `attribute`
run, overwriting its tables)."""

from __future__ import annotations

import re
from pathlib import Path

from .kinds import TABLE_HINTS

__all__ = ["audit_target_problem", "finished_run_problem"]

# The tables claims are evaluated on (the edge list alone is written by `attribute` too).
CLAIM_TABLES = frozenset(TABLE_HINTS) - {"edges"}


def _manifest(run_dir: Path) -> dict | None:
    """The run's manifest (None when it has none); InputError when it is unreadable."""
    from circuitstat.core.errors import InputError
    from circuitstat.core.rundir import MANIFEST, RunDir, RunDirError

    if not (run_dir / MANIFEST).exists():
        return None
    try:
        return RunDir.read_manifest(run_dir)
    except RunDirError as e:
        raise InputError(str(e)) from None


def _stages(manifest: dict | None) -> dict:
    stages = (manifest or {}).get("stages")
    return stages if isinstance(stages, dict) else {}


def _kind(manifest: dict | None) -> str | None:
    """The kind of run its manifest records (circuitstat.pipelines.kinds.recorded_kind); None when it records none."""
    from circuitstat.pipelines.kinds import recorded_kind

    return recorded_kind(manifest)


def _kind_words(manifest: dict | None) -> str:
    names = sorted(_stages(manifest))
    stages = f"stages {names[:6]}{' ...' if len(names) > 6 else ''}"
    kind = _kind(manifest)
    if kind is None:
        unrecorded = manifest is not None and "kind" not in manifest
        return f"its {stages}" + (" (a run from before run kinds were recorded)" if unrecorded else "")
    return f"it is {'an' if kind[0] in 'aeiou' else 'a'} `{kind}` run ({stages})"


def finished_run_problem(run_dir: Path) -> str | None:
    """Why ``run_dir`` is not a finished run a check can read (None when it is); reads only its listing and manifest."""
    if not run_dir.exists():
        return f"run directory {run_dir} does not exist"
    if not run_dir.is_dir():
        return f"run directory {run_dir} is a file"
    manifest = _manifest(run_dir)
    tables = {p.stem for p in run_dir.glob("*.parquet")}
    if manifest is None and not tables:
        return f"{run_dir} holds no run (no manifest.json and no Parquet tables)"
    stages = _stages(manifest)
    unfinished = sorted(n for n, s in stages.items() if not isinstance(s, dict) or s.get("status") != "done")
    if unfinished:
        return (f"the run {run_dir} is unfinished: stage(s) {', '.join(unfinished)} did not finish (a run that was "
                "killed, or is still running)")
    recorded = {Path(str(o.get("path", ""))).stem for s in stages.values()
                if isinstance(s, dict) and isinstance(s.get("outputs"), dict)
                for o in s["outputs"].values() if isinstance(o, dict)}
    if not (tables | recorded) & CLAIM_TABLES:
        what = _kind_words(manifest) if stages else f"its tables are {sorted(tables)[:6]}"
        return f"{run_dir} is not an audit or tokens run: {what}, with none of the tables claims are checked on"
    return None


def audit_target_problem(run_dir: Path) -> str | None:
    """Why an audit may not be run (or resumed) into ``run_dir`` (None when it may: a new or empty directory,
    or an audit's run); reads only its listing and manifest."""
    if not run_dir.exists():
        return None
    if not run_dir.is_dir():
        return f"{run_dir} is a file"
    manifest = _manifest(run_dir)
    stages = _stages(manifest)
    from circuitstat.pipelines.runs.audit.run import is_audit_stage

    from circuitstat.pipelines.kinds import NO_KIND

    if manifest is not None and "kind" not in manifest:
        return f"{run_dir} {NO_KIND}"
    foreign = sorted(n for n in stages if not is_audit_stage(n))
    if foreign or _kind(manifest) not in (None, "audit"):
        return f"{run_dir} is not an audit's run: {_kind_words(manifest)}"
    return None
