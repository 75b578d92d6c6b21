"""Chunked, checkpointed attribution: a killed ``circuitstat attribute`` resumes from its finished chunks.

The examples are split into fixed chunks of whole batches before anything runs. Each finished
chunk is written atomically to ``<run>/checkpoints/<method>-<level>/rows-<start>-<stop>.npy``, next to
a small ``checkpoint.json`` that binds the chunks to everything that determines their numbers
(model weight hash, task hash, metric, method, level, ablation, options, seed, device, chunking).
A rerun reuses the chunks only when that binding is identical; otherwise it is refused with an
InputError naming what differs. Every row's scores come from
``circuits.attribution.attribute(..., rows=...)``, which does not depend on which other rows are
computed with it, and an uninterrupted run goes through the same chunks, so a resumed score
matrix equals an uninterrupted one bit for bit.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reports.errors import InputError
from reports.atomic import atomic_write, atomic_write_bytes

CHECKPOINTS = "checkpoints"
MANIFEST = "checkpoint.json"
FORMAT = "circuitstat.checkpoint/1"


def chunk_bounds(n: int, batch_size: int, every: int | None = None) -> list[tuple[int, int]]:
    """[(start, stop)] of the checkpoint chunks over ``n`` examples: ``every`` examples rounded up to
    whole batches (one batch when None), so chunks never split a batch."""
    if n < 1 or batch_size < 1 or (every is not None and every < 1):
        raise InputError(f"chunking needs positive sizes, got n={n}, batch_size={batch_size}, every={every}")
    step = batch_size * max(1, -(-(every or batch_size) // batch_size))
    return [(s, min(s + step, n)) for s in range(0, n, step)]


@dataclass(frozen=True)
class AttributionJob:
    """Everything that determines the numbers of one attribution run (what a checkpoint is bound to)."""

    weight_hash: str
    task_hash: str
    metric: str
    method: str
    level: str
    ablation: str
    n: int
    columns: int
    seed: int
    options: dict  # batch_size, max_rows, ig_steps, dtype, device type

    def binding(self) -> dict:
        """The JSON-ready dict a checkpoint manifest stores and a rerun must match exactly."""
        return {"weight_hash": self.weight_hash, "task_hash": self.task_hash, "metric": self.metric,
                "method": self.method, "level": self.level, "ablation": self.ablation, "n": self.n,
                "columns": self.columns, "seed": self.seed, "options": dict(sorted(self.options.items()))}


def _differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """'key: old -> new' for every differing entry (nested options as 'options.key')."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {_short(a)} -> {_short(b)}")
    return out


def _short(value: Any) -> str:
    """A value cut to 19 characters (hashes and chunk lists stay readable on one line)."""
    text = str(value)
    return text if len(text) <= 19 else text[:16] + "..."


class CheckpointStore:
    """The finished chunks of one method and level in a run directory, bound to one AttributionJob."""

    def __init__(self, run_dir: str | Path, job: AttributionJob, bounds: list[tuple[int, int]]) -> None:
        self.job, self.bounds = job, list(bounds)
        self.path = Path(run_dir) / CHECKPOINTS / f"{job.method}-{job.level}"
        self._binding = {**job.binding(), "chunks": [list(b) for b in self.bounds]}

    def chunk_path(self, start: int, stop: int) -> Path:
        """Path of the chunk holding rows [start, stop)."""
        return self.path / f"rows-{start:07d}-{stop:07d}.npy"

    def finished(self) -> list[tuple[int, int]]:
        """The chunks already on disk (a kill never leaves a partial one: writes are atomic)."""
        return [b for b in self.bounds if self.chunk_path(*b).is_file()]

    def check(self, *, resume: bool, force: bool) -> list[tuple[int, int]]:
        """The finished chunks this run may reuse; InputError when checkpoints exist that it may not.

        Checkpoints of a different job are refused (naming what differs) unless ``force``
        discards them; matching ones are reused with ``resume`` and refused without it."""
        manifest = self.path / MANIFEST
        if not self.path.exists():
            return []
        where = f"{self.path.parent.parent}"
        try:
            doc = json.loads(manifest.read_text())
            old = doc["binding"] if doc.get("format") == FORMAT else None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            old = None
        if old is None:
            if force or not any(self.path.glob("rows-*.npy")):  # nothing finished yet: nothing to mix in
                return []
            raise InputError(f"{where} holds checkpoints without a readable {MANIFEST}; pass --force to discard "
                             "them, or use a new --out directory")
        diffs = _differences(old, self._binding)
        if diffs:
            diff = "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")
            if force:
                return []
            raise InputError(f"the checkpoints in {where} belong to a different run ({diff}); rerun with the options "
                             "they were made with, pass --force to discard them, or use a new --out directory")
        done = self.finished()
        if done and not resume:
            if force:
                return []
            raise InputError(f"{where} holds {len(done)} finished chunks of an interrupted run; pass --resume to "
                             "continue from them, or --force to discard them")
        return done

    def start(self, reuse: list[tuple[int, int]]) -> None:
        """Prepare the directory: keep the ``reuse`` chunks, discard everything else, write the manifest."""
        keep = {self.chunk_path(*b).name for b in reuse}
        if self.path.exists():
            for p in self.path.iterdir():
                if p.name not in keep and p.name != MANIFEST:
                    p.unlink() if p.is_file() else shutil.rmtree(p)
        doc = {"format": FORMAT, "binding": self._binding, "created_unix": time.time()}
        atomic_write_bytes(self.path / MANIFEST, (json.dumps(doc, indent=1) + "\n").encode())

    def write(self, start: int, stop: int, scores: np.ndarray) -> None:
        """Store rows [start, stop) atomically (fsynced, then renamed)."""
        with atomic_write(self.chunk_path(start, stop)) as f:
            np.save(f, np.ascontiguousarray(scores, dtype=np.float32), allow_pickle=False)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) from disk; InputError when the file is not such a chunk."""
        p = self.chunk_path(start, stop)
        try:
            arr = np.load(p, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InputError(f"checkpoint {p.name} in {self.path} cannot be read ({type(e).__name__}); pass --force "
                             "to recompute") from None
        want = (stop - start, self.job.columns)
        if arr.dtype != np.float32 or arr.shape != want:
            raise InputError(f"checkpoint {p.name} in {self.path} holds {arr.dtype} {arr.shape}, not float32 {want}; "
                             "pass --force to recompute")
        return arr

    def assemble(self) -> np.ndarray:
        """The full [n, columns] matrix from every chunk, in row order."""
        return np.concatenate([self.read(*b) for b in self.bounds])

    def remove(self) -> None:
        """Delete this store's chunks (after the score table is committed; they are redundant then)."""
        shutil.rmtree(self.path, ignore_errors=True)
        parent = self.path.parent
        if parent.exists() and not any(parent.iterdir()):
            parent.rmdir()


def _score_chunk(bounds: tuple[int, int], store: CheckpointStore, model, task, method: str, kw: dict) -> None:
    """Compute rows [start, stop) with attribute(rows=...) and store them (inside a worker when parallel)."""
    from circuits.attribution import attribute

    start, stop = bounds
    sm = attribute(model, task, method, rows=np.arange(start, stop), progress=False, **kw)
    store.write(start, stop, sm.scores)


def run_checkpointed(store: CheckpointStore, model, task, method: str, kw: dict[str, Any], *,
                     reuse: list[tuple[int, int]], n_jobs: int = 1) -> np.ndarray:
    """The [n, columns] score matrix, computing only the chunks not in ``reuse`` (progress bar with ETA
    over the chunks on a terminal), each chunk stored as soon as it is finished."""
    from .parallel import run_chunks

    store.start(reuse)
    todo = [b for b in store.bounds if b not in set(reuse)]
    done_rows = sum(b - a for a, b in reuse)
    desc = f"{method} chunks" + (f" (resumed: {done_rows}/{store.job.n} examples done)" if reuse else "")
    run_chunks(_score_chunk, todo, n_jobs, store, model, task, method, kw, desc=desc)
    return store.assemble()
