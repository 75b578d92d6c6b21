"""A running job's stage, progress and ETA, read from its run directory (the worker never writes the database).

The stages a job will run follow from its spec, as the CLI's runners run them; the manifest says
which have finished, and the worker's ``units.json`` how many of the running stage's own work units (the chunks
of circuitstat.pipelines.parallel.run_chunks) are done. ``attribute`` has one stage whose checkpoint chunks give
finer progress too. The ETA is :class:`EtaClock`'s (it never rises while progress is flat). The
tests compare :func:`planned_stages` with the stages a finished run recorded, so the two cannot
drift apart silently.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "manifest.json"
UNITS = "units.json"
"""The worker's record of the running stage's work units (circuitstat.pipelines.service.runner), beside the run."""


@dataclass(frozen=True)
class Progress:
    """Where a run stands: the stage running (or last finished), the fraction done, seconds left."""

    stage: str | None
    fraction: float | None
    eta_seconds: float | None


def planned_stages(kind: str, spec) -> list[str]:
    """The RunDir stages job ``kind`` with (validated) ``spec`` runs, in order (its run kind's declaration)."""
    from circuitstat.pipelines.kinds import kind as run_kind

    return run_kind(kind).stages(spec)


def read_stages(run_dir: Path) -> dict:
    """The manifest's stage records ({} when there is no readable manifest yet)."""
    try:
        doc = json.loads((run_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    stages = doc.get("stages") if isinstance(doc, dict) else None
    return stages if isinstance(stages, dict) else {}


def _chunks_done(run_dir: Path, spec) -> float:
    """The fraction of an attribute run's checkpoint chunks on disk."""
    from circuitstat.pipelines.checkpoint import chunk_bounds

    total = len(chunk_bounds(spec.n, spec.batch_size, spec.checkpoint_every))
    folder = run_dir / "checkpoints" / f"{spec.method}-{spec.level}"
    done = len(list(folder.glob("rows-*.npy"))) if folder.is_dir() else 0
    return min(1.0, done / total)


def _epoch(utc: object) -> float | None:
    """Seconds since the epoch of a manifest's ``started_utc`` (None when unreadable)."""
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(str(utc).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def read_units(job_dir: Path) -> dict:
    """The worker's last record of work units done in the running stage ({} when none or unreadable)."""
    try:
        doc = json.loads((job_dir / UNITS).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _within(run_dir: Path, stage: dict) -> float:
    """The fraction of the running stage's own work units done (its chunks; 0 where it reports none): only a record
    written since the stage started counts."""
    units, started = read_units(run_dir.parent), _epoch(stage.get("started_utc"))
    done, total, at = units.get("done"), units.get("total"), units.get("at")
    if started is None or not all(isinstance(v, (int, float)) for v in (done, total, at)) or at < started:
        return 0.0
    return min(1.0, max(0.0, done / total)) if total > 0 else 0.0


class EtaClock:
    """Seconds left, monotone: the pace of work done gives an estimated finish time (the time the progress took to
    reach its current value, scaled to the rest), and the finish time shown only ever moves earlier: a step of
    progress at a slower pace does not push it later, so the ETA counts down and never rises. Once the finish time
    passes with work left the ETA is None ("unknown"), not a wrong number, until progress moves again (then a new
    estimate from the pace so far). Progress it reports never goes back."""

    def __init__(self, started_at: float) -> None:
        self.started_at, self.fraction, self.moved_at = started_at, 0.0, started_at
        self.finish_at: float | None = None

    def update(self, fraction: float | None, now: float) -> float | None:
        """Record ``fraction`` seen at ``now``; the ETA in seconds (None when unknown)."""
        moved = fraction is not None and fraction > self.fraction
        if moved:
            self.fraction, self.moved_at = fraction, now
        if not 0 < self.fraction < 1 or self.moved_at <= self.started_at:
            return None
        pace = self.moved_at + (1 - self.fraction) * (self.moved_at - self.started_at) / self.fraction
        if self.finish_at is None or (moved and self.finish_at <= now):
            self.finish_at = pace  # the first estimate, or a fresh one after an overdue spell (shown as unknown)
        else:
            self.finish_at = min(self.finish_at, pace)  # never later than shown before
        left = self.finish_at - now
        return left if left > 0 else None


def progress(kind: str, spec, run_dir: Path, started_at: float | None, now: float | None = None,
             clock: EtaClock | None = None) -> Progress:
    """The Progress of a job from its run directory: finished stages plus the running stage's own work units done
    (an attribute run's checkpoint chunks; a stage's attribution chunks, which the worker records), each stage one
    equal part; the ETA by ``clock`` (a fresh one, from ``started_at``, when None)."""
    planned = planned_stages(kind, spec)
    stages = read_stages(run_dir)
    done = [s for s in planned if stages.get(s, {}).get("status") == "done"]
    running = [s for s in planned if stages.get(s, {}).get("status") == "running"]
    within = _within(run_dir, stages[running[0]]) if running else 0.0
    fraction = min(1.0, (len(done) + within) / len(planned))
    if kind == "attribute" and not done:
        fraction = 0.99 * max(_chunks_done(run_dir, spec), within)
    stage = running[0] if running else (done[-1] if done else None)
    now = time.time() if now is None else now
    if clock is None:
        clock = EtaClock(now if started_at is None else started_at)
    eta = clock.update(fraction, now)
    return Progress(stage, clock.fraction if clock.fraction > fraction else fraction, eta)
