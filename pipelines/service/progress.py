"""A running job's stage, progress and ETA, read from its run directory (the worker never writes the database).

The stages a job will run follow from its spec, as the CLI's runners run them; the manifest says
which have finished. ``attribute`` has one stage whose checkpoint chunks give finer progress. The
tests compare :func:`planned_stages` with the stages a finished run recorded, so the two cannot
drift apart silently.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Progress:
    """Where a run stands: the stage running (or last finished), the fraction done, seconds left."""

    stage: str | None
    fraction: float | None
    eta_seconds: float | None


def planned_stages(kind: str, spec) -> list[str]:
    """The RunDir stages job ``kind`` with (validated) ``spec`` runs, in order."""
    if kind == "attribute":
        return ["scores"]
    if kind == "calibration":
        return [f"scores_{spec.method}", "calibration"]
    if kind == "audit":
        others = [m for m in spec.methods if m != "exact"]
        return (["index", *(f"scores_{m}" for m in spec.methods), "edge_stats", "stability"]
                + (["faithfulness"] if spec.faithfulness else [])
                + (["approximation"] if "exact" in spec.methods and others else [])
                + (["heads"] if len(spec.sources) > 1 else []))
    from circuitstat.pipelines.variance_study import Key

    levels = [lab for lab, _, _ in spec.estimator_levels()]
    keys = [Key(s, 0, c, lab) for s in range(len(spec.sources)) for c in range(spec.counterfactual.n_draws)
            for lab in levels] + [Key(0, j, 0, "exact") for j in range(1, spec.dataset.n_fresh + 1)]
    selection = spec.selection.enabled and spec.level == "edge"
    return (["index", *(k.name for k in keys), "intrinsic", "stability", "approximation", "variance", "factors"]
            + (["selection"] if selection else []) + ["summary"])


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


def progress(kind: str, spec, run_dir: Path, started_at: float | None, now: float | None = None) -> Progress:
    """The Progress of a job from its run directory; ETA by the pace so far."""
    planned = planned_stages(kind, spec)
    stages = read_stages(run_dir)
    done = [s for s in planned if stages.get(s, {}).get("status") == "done"]
    running = [s for s in planned if stages.get(s, {}).get("status") == "running"]
    fraction = len(done) / len(planned)
    if kind == "attribute" and not done:
        fraction = 0.99 * _chunks_done(run_dir, spec)
    stage = running[0] if running else (done[-1] if done else None)
    eta = None
    if started_at is not None and 0 < fraction < 1:
        elapsed = (now or time.time()) - started_at
        eta = elapsed * (1 - fraction) / fraction
    return Progress(stage, fraction, eta)
