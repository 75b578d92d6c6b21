"""Chunked, checkpointed attribution: a killed ``circuitstat attribute`` resumes from its finished chunks.

The examples are split into fixed chunks of whole batches before anything runs. Each finished
chunk is written atomically to ``<run>/checkpoints/<method>-<level>/rows-<start>-<stop>.npy``, next to
a small sealed ``checkpoint.json`` (circuitstat.core.integrity) that binds the chunks to everything that
determines their numbers (model weight hash, task hash, metric, method, level, ablation, options,
seed, device, chunking) and to the run directory's manifest (its run id; the manifest holds the
seed). A rerun reuses the chunks only when that binding is identical; otherwise it is refused with
an InputError naming what differs.

Every chunk also has a seal, ``rows-<start>-<stop>.seal``, written just before it: the sha256 of the
chunk file's bytes and of the binding. A chunk is read back only through its seal, without
following links, so a chunk that was edited, truncated, replaced by a link or copied from another
run (another ``--seed``, model or run directory) is refused naming the file, never used; ``--force``
discards it. A chunk without its seal (a kill between the two writes) is not finished: it is
computed again. Every row's scores come from
``circuitstat.circuits.attribution.attribute(..., rows=...)``, which does not depend on which other rows are
computed with it, and an uninterrupted run goes through the same chunks, so a resumed score
matrix equals an uninterrupted one bit for bit.
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from circuitstat.core.atomic import atomic_write_bytes
from circuitstat.core.errors import InputError
from circuitstat.core.integrity import IntegrityError, digest_bytes, read_regular, read_sealed, write_sealed

CHECKPOINTS = "checkpoints"
MANIFEST = "checkpoint.json"
FORMAT = "circuitstat.checkpoint/2"
RUN = "run"  # the binding's key for the run directory's run id


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
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / CHECKPOINTS / f"{job.method}-{job.level}"
        self._binding = {**job.binding(), "chunks": [list(b) for b in self.bounds]}
        self._run_id: str | None = None

    def chunk_path(self, start: int, stop: int) -> Path:
        """Path of the chunk holding rows [start, stop)."""
        return self.path / f"rows-{start:07d}-{stop:07d}.npy"

    def seal_path(self, start: int, stop: int) -> Path:
        """Path of the seal of the chunk holding rows [start, stop)."""
        return self.chunk_path(start, stop).with_suffix(".seal")

    def finished(self) -> list[tuple[int, int]]:
        """The chunks on disk with their seal (a kill never leaves a partial file: writes are atomic)."""
        return [b for b in self.bounds if self.chunk_path(*b).is_file() and self.seal_path(*b).is_file()]

    def _manifest_run_id(self) -> str | None:
        from circuitstat.core.rundir import RunDir, RunDirError

        try:
            return RunDir.read_manifest(self.run_dir).get("run_id")
        except RunDirError:
            return None

    def check(self, *, resume: bool, force: bool) -> list[tuple[int, int]]:
        """The finished chunks this run may reuse; InputError when checkpoints exist that it may not.

        Checkpoints of a different job or run directory are refused (naming what differs) unless
        ``force`` discards them; matching ones are reused with ``resume`` and refused without it."""
        if not (self.path.exists() or self.path.is_symlink()):
            return []
        where = f"{self.run_dir}"
        try:
            doc = read_sealed(self.path / MANIFEST, root=self.run_dir)
            old = dict(doc["binding"]) if doc.get("format") == FORMAT else None
        except (OSError, IntegrityError, KeyError, TypeError, ValueError):
            old = None
        if old is None:
            if force or not any(self.path.glob("rows-*")):  # nothing finished yet: nothing to mix in
                return []
            raise InputError(f"{where} holds checkpoints without a readable, sealed {MANIFEST} (damaged, or made by "
                             "another version); pass --force to discard them, or use a new --out directory")
        run_id = old.pop(RUN, None)
        diffs = _differences(old, self._binding)
        if not diffs and run_id != self._manifest_run_id():
            diffs = ["the run directory's manifest (run id) differs: they were copied from another run"]
        if diffs:
            diff = "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")
            if force:
                return []
            raise InputError(f"the checkpoints in {where} belong to a different run ({diff}); rerun with the options "
                             "they were made with, pass --force to discard them, or use a new --out directory")
        self._run_id = run_id
        done = self.finished()
        if done and not resume:
            if force:
                return []
            raise InputError(f"{where} holds {len(done)} finished chunks of an interrupted run; pass --resume to "
                             "continue from them, or --force to discard them")
        good = []
        for b in done:  # each reused chunk is checked now, before anything is written
            try:
                self.read(*b)
            except InputError:
                if not force:
                    raise
                continue  # --force: a damaged chunk is discarded and computed again
            good.append(b)
        return good

    def _bound(self) -> dict:
        return {**self._binding, RUN: self._run_id}

    def start(self, reuse: list[tuple[int, int]], run_id: str | None = None) -> None:
        """Prepare the directory for the run ``run_id`` (the RunDir's): keep the ``reuse`` chunks and
        their seals, discard everything else, write the sealed manifest."""
        if reuse and run_id != self._run_id:
            raise InputError(f"the checkpoints in {self.run_dir} belong to another run directory's manifest; "
                             "pass --force to discard them")
        self._run_id = run_id
        from circuitstat.core.integrity import is_plain_path, remove_entry

        keep = {p(*b).name for b in reuse for p in (self.chunk_path, self.seal_path)}
        if not is_plain_path(self.path.parent, self.run_dir):  # a linked checkpoints folder: nothing read or deleted
            raise InputError(f"{self.path.parent} is a symbolic link; remove it (circuitstat makes that folder "
                             "itself), or pass a new --out")
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_dir()):
            remove_entry(self.path, root=self.run_dir)
        if self.path.exists():
            for p in self.path.iterdir():
                if p.name not in keep and p.name != MANIFEST:
                    remove_entry(p, root=self.run_dir)
        write_sealed(self.path / MANIFEST, {"format": FORMAT, "binding": self._bound(), "created_unix": time.time()})

    def _binding_digest(self) -> str:
        return digest_bytes(json.dumps(self._bound(), sort_keys=True).encode())

    def write(self, start: int, stop: int, scores: np.ndarray) -> None:
        """Store rows [start, stop) atomically (fsynced, then renamed), their seal first."""
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(scores, dtype=np.float32), allow_pickle=False)
        data = buf.getvalue()
        write_sealed(self.seal_path(start, stop), {"rows": [start, stop], "binding": self._binding_digest(),
                                                   "sha256": digest_bytes(data)})
        atomic_write_bytes(self.chunk_path(start, stop), data)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) from disk, checked against their seal; InputError naming the file otherwise."""
        p = self.chunk_path(start, stop)
        fix = "pass --force to recompute it, or use a new --out directory"
        want = (stop - start, self.job.columns)
        try:
            seal = read_sealed(self.seal_path(start, stop), root=self.run_dir)
            data = read_regular(p, max_bytes=4 * want[0] * want[1] + 4096, root=self.run_dir)
        except (OSError, IntegrityError) as e:
            why = "is missing" if isinstance(e, FileNotFoundError) else "cannot be read as a checkpoint"
            raise InputError(f"checkpoint {p.name} in {self.path} {why} ({type(e).__name__}); {fix}") from None
        if seal.get("rows") != [start, stop] or seal.get("binding") != self._binding_digest():
            raise InputError(f"checkpoint {p.name} in {self.path} was made by another run (another seed, model, "
                             f"options or run directory); {fix}")
        if seal.get("sha256") != digest_bytes(data):
            raise InputError(f"checkpoint {p.name} in {self.path} does not match the digest recorded when it was "
                             f"written (edited or damaged); {fix}")
        arr = np.load(io.BytesIO(data), allow_pickle=False)
        if arr.dtype != np.float32 or arr.shape != want:
            raise InputError(f"checkpoint {p.name} in {self.path} holds {arr.dtype} {arr.shape}, not float32 {want}; "
                             f"{fix}")
        return arr

    def assemble(self) -> np.ndarray:
        """The full [n, columns] matrix from every chunk, in row order."""
        return np.concatenate([self.read(*b) for b in self.bounds])

    def remove(self) -> None:
        """Delete this store's chunks (after the score table is committed; they are redundant then)."""
        from circuitstat.core.integrity import remove_entry

        remove_entry(self.path, root=self.run_dir)
        parent = self.path.parent
        if parent.exists() and not parent.is_symlink() and not any(parent.iterdir()):
            parent.rmdir()


def _score_chunk(bounds: tuple[int, int], model, task, method: str, kw: dict) -> np.ndarray:
    """Rows [start, stop) with attribute(rows=...), as float32 (inside a worker when parallel; the caller stores
    them, so workers need no access to the run directory)."""
    from circuitstat.circuits.attribution import attribute

    start, stop = bounds
    sm = attribute(model, task, method, rows=np.arange(start, stop), progress=False, **kw)
    return np.ascontiguousarray(sm.scores, dtype=np.float32)


def run_checkpointed(store: CheckpointStore, model, task, method: str, kw: dict[str, Any], *,
                     reuse: list[tuple[int, int]], n_jobs: int = 1, run_id: str | None = None) -> np.ndarray:
    """The [n, columns] score matrix, computing only the chunks not in ``reuse`` (progress bar with ETA
    over the chunks on a terminal), each chunk stored here as soon as a worker returns it; the chunks are
    bound to the run directory ``run_id`` (its RunDir's). Under a Dask backend the chunks run on the cluster."""
    from .parallel import run_chunks

    store.start(reuse, run_id)
    todo = [b for b in store.bounds if b not in set(reuse)]
    done_rows = sum(b - a for a, b in reuse)
    desc = f"{method} chunks" + (f" (resumed: {done_rows}/{store.job.n} examples done)" if reuse else "")
    run_chunks(_score_chunk, todo, n_jobs, model, task, method, kw, desc=desc,
               on_result=lambda b, scores: store.write(*b, scores))
    return store.assemble()
