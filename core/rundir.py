"""A run directory: manifest.json, an exclusive lock, and resumable stages with spec fingerprints."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import socket
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa

from circuitstat.core.atomic import TMP_SUFFIX, atomic_write_bytes, cleanup_temp_files
from circuitstat.core.lock import DirLock, RunLockedError
from circuitstat.core.provenance import hash_file, hash_json, provenance as make_provenance, to_jsonable, utc_now
from circuitstat.core.seeds import seed_record
from circuitstat.core.tables import TableLike, read_provenance, read_table, to_arrow, write_table
from circuitstat.core.schema import schema_for

MANIFEST = "manifest.json"
LOCK = ".lock"
FORMAT = "circuitstat.run/1"

__all__ = ["RunDir", "RunDirError", "RunLockedError", "StageSpecChangedError", "StageOutputError", "output_record",
           "changed_outputs"]


class RunDirError(RuntimeError):
    """A run directory cannot be used as asked (not a run dir, corrupt manifest, seed mismatch, ...)."""


class StageSpecChangedError(RunDirError):
    """A finished stage is being re-run with different parameters or upstream stages."""


class StageOutputError(RunDirError):
    """A stage did not produce exactly the outputs it declared."""


def _short(v: Any, n: int = 200) -> str:
    """``v`` as JSON; a value longer than ``n`` characters is cut where it says how much is left out."""
    s = json.dumps(v, sort_keys=True)
    return s if len(s) <= n else f"{s[:n]}... ({len(s) - n:,} more characters)"


def _leaf_diffs(old: Any, new: Any, path: str = "") -> list[str]:
    """``key.sub: old -> new`` for every leaf that differs, descending into dicts both sides have."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            a, b = old.get(k, "<absent>"), new.get(k, "<absent>")
            if a != b:
                out += _leaf_diffs(a, b, f"{path}.{k}" if path else str(k))
        return out
    return [f"{path + ': ' if path else ''}{_short(old)} -> {_short(new)}"]


def _diff(old: Any, new: Any, limit: int = 8) -> str:
    """Return which values differ between two JSON values, to their leaves (``bootstrap.n_resamples: 1000 -> 500``)."""
    parts = _leaf_diffs(old, new)
    return "; ".join(parts[:limit]) + (f"; and {len(parts) - limit} more" if len(parts) > limit else "")


class RunDir:
    """A directory holding one run: manifest.json, Parquet outputs, and a lock while open.

    Nothing is written until the run is opened (``with RunDir(...) as run:`` or open()): that
    checks everything it can without writing (the path is a writable directory or can be made
    one, the manifest is readable, the seed matches, no foreign files), then takes the lock. The
    updated manifest is written (and temp files of a killed run removed) only when the run first
    writes something: a stage that has to run, a table, or a clean close. So a run refused on
    opening or by a finished stage's changed spec (StageSpecChangedError) leaves the directory
    exactly as it was: every file's bytes and times, the directory's modification time (the lock
    file's coming and going is undone) and no directory it had to create.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        spec: Any = None,
        command: str | list[str] | None = None,
        seed: int | np.random.SeedSequence | None = None,
        provenance: Mapping[str, Any] | None = None,
        kind: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.kind = kind  # the run kind recorded in the manifest (circuitstat.pipelines.kinds); None records none
        self.spec = to_jsonable(spec)
        self.command = command
        self._seed_arg = seed
        self._extra_provenance = dict(provenance or {})
        self._lock = DirLock(self.path / LOCK)
        self._manifest: dict[str, Any] | None = self.read_manifest(self.path) if (self.path / MANIFEST).exists() else None
        self._current_stage: dict[str, Any] | None = None
        self._current_outputs: list[str] = []
        self._pending = False  # the manifest of this opening is not on disk yet
        self._created: list[Path] = []  # directories open() made, outermost first
        self._dir_times: tuple[Path, int, int] | None = None  # (directory, atime ns, mtime ns) before open

    # ----- manifest -------------------------------------------------------------------------
    @staticmethod
    def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
        """Return the manifest dict of the run directory at `path`."""
        mpath = Path(path) / MANIFEST
        try:
            manifest = json.loads(mpath.read_text())
        except FileNotFoundError:
            raise RunDirError(f"{path} is not a run directory: it has no {MANIFEST}") from None
        except ValueError as e:
            raise RunDirError(f"{mpath} is not valid JSON ({e}); restore it or start a new run directory") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise RunDirError(f"{mpath} is not a circuitstat run manifest (format {FORMAT!r} expected)")
        return manifest

    @property
    def manifest(self) -> dict[str, Any]:
        """Return a copy of the current manifest ({} before the run is first opened)."""
        return copy.deepcopy(self._manifest or {})

    def _write_manifest(self) -> None:
        assert self._manifest is not None
        if self._pending:  # the first write of this opening: now the run really changes the directory
            cleanup_temp_files(self.path)
        self._manifest["updated_utc"] = utc_now()
        atomic_write_bytes(self.path / MANIFEST, (json.dumps(self._manifest, indent=2) + "\n").encode())
        # Only once the manifest is on disk has this opening changed the run: a first write that failed
        # (a full disk) leaves it untouched, so closing it undoes what open() made.
        self._pending = False

    @property
    def run_id(self) -> str | None:
        """Return the run id (None before the run is first opened)."""
        return (self._manifest or {}).get("run_id")

    @property
    def seed(self) -> np.random.SeedSequence:
        """Return the run's root SeedSequence (recorded in the manifest, so a resume reuses it)."""
        if self._manifest is None:
            raise RunDirError("open the run first (with RunDir(...) as run:) to fix its seed")
        s = self._manifest["seed"]
        return np.random.SeedSequence(s["entropy"], spawn_key=tuple(s["spawn_key"]))

    def stage_seed(self, name: str) -> np.random.SeedSequence:
        """Return a SeedSequence for stage `name`, derived from the root seed and the name only.

        It does not depend on which stages ran before, so a resumed run draws the same numbers.
        """
        root = self.seed
        key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
        return np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, key))

    @property
    def provenance(self) -> dict[str, Any]:
        """Return the run-level provenance recorded at the latest open."""
        return copy.deepcopy((self._manifest or {}).get("provenance", {}))

    # ----- open / close ---------------------------------------------------------------------
    def open(self) -> RunDir:
        """Check, take the lock and prepare the manifest (written on the first write); return self."""
        self._preflight()
        self._created = self._make_dirs()
        try:
            self._lock.acquire()
        except BaseException:
            if not self._created:  # another run holds the directory: its times are its own
                self._dir_times = None
            self._undo_untouched()
            raise
        try:
            self._manifest = self._prepared_manifest()  # again under the lock: another run may have written
        except BaseException:
            self._lock.release()
            self._undo_untouched()
            raise
        self._pending = True
        return self

    def _preflight(self) -> None:
        """Raise RunDirError for everything that would refuse this run, writing nothing."""
        p = self.path
        if p.exists() and not p.is_dir():
            raise RunDirError(f"{p} is a file, not a directory; give a new or empty directory for the run (--out)")
        existing = next(a for a in [p, *p.parents] if a.exists())
        if not existing.is_dir():
            raise RunDirError(f"{existing} is a file, so {p} cannot be created; give another output directory")
        if not os.access(existing, os.W_OK | os.X_OK):
            what = "run directory" if existing == p else "directory"
            raise RunDirError(f"{what} {existing} is not writable; give an output directory you can write to")
        # the directory that creating the lock (or the run directory) changes: restored on a refusal
        self._dir_times = (existing, existing.stat().st_atime_ns, existing.stat().st_mtime_ns)
        if p.is_dir():
            self._prepared_manifest()

    def _make_dirs(self) -> list[Path]:
        """Create the run directory and missing parents; return those created, outermost first."""
        missing = [a for a in [self.path, *self.path.parents] if not a.exists()][::-1]
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunDirError(f"cannot create {self.path}: {e.strerror or e}; give another output directory") from None
        return missing

    def _prepared_manifest(self) -> dict[str, Any]:
        """The manifest this opening will write (validated against the one on disk); writes nothing."""
        if (self.path / MANIFEST).exists():
            manifest = self.read_manifest(self.path)
        else:
            # Refuse to turn an unrelated non-empty directory into a run (we would mix files).
            foreign = [p.name for p in self.path.iterdir() if p.name != LOCK and not p.name.endswith(TMP_SUFFIX)]
            if foreign:
                raise RunDirError(
                    f"{self.path} is not empty and has no {MANIFEST} (found {sorted(foreign)[:5]}); "
                    "use a new or empty output directory"
                )
            manifest = {
                "format": FORMAT,
                "kind": self.kind,
                "run_id": uuid.uuid4().hex,
                "created_utc": utc_now(),
                "command": None,
                "spec": None,
                "spec_sha256": None,
                "seed": seed_record(self._seed_arg),
                "stages": {},
                "history": [],
            }
        if self._seed_arg is not None:
            want = seed_record(self._seed_arg)
            have = manifest["seed"]
            if (want["entropy"], want["spawn_key"]) != (have["entropy"], list(have["spawn_key"])):
                raise RunDirError(
                    f"{self.path} was started with seed entropy {have['entropy']} but this run asks for "
                    f"{want['entropy']}; resume with the same seed (or none) or use a new output directory"
                )
        if self.kind is not None and manifest.get("kind") not in (None, self.kind):
            raise RunDirError(f"{self.path} holds a `{manifest['kind']}` run, not a `{self.kind}` run; "
                              "use a new output directory")
        if self.kind is not None:
            manifest["kind"] = self.kind
        spec_hash = hash_json(self.spec)
        manifest["command"] = self.command
        manifest["spec"] = self.spec
        manifest["spec_sha256"] = spec_hash
        manifest["provenance"] = make_provenance(**self._extra_provenance)
        manifest["history"].append(
            {"opened_utc": utc_now(), "pid": os.getpid(), "host": socket.gethostname(), "command": to_jsonable(self.command), "spec_sha256": spec_hash}
        )
        return manifest

    def _undo_untouched(self) -> None:
        """After a refusal that wrote nothing: remove the directories open() made, restore the times."""
        for d in reversed(self._created):
            try:
                d.rmdir()
            except OSError:  # not empty: something else lives there now
                break
        self._created = []
        if self._dir_times is not None:
            with contextlib.suppress(OSError):
                os.utime(self._dir_times[0], ns=self._dir_times[1:])

    def close(self, *, commit: bool = True) -> None:
        """Release the lock; with `commit`, first write the manifest if this opening wrote nothing yet.

        ``commit=False`` (a with-block left by an exception) leaves a run that wrote nothing
        exactly as it was.
        """
        if not self._lock.held:
            return
        try:
            if self._pending and commit:
                self._write_manifest()
        finally:
            self._lock.release()
            if self._pending:  # refused, or its first write failed (a full disk): nothing of it is on disk
                self._undo_untouched()
            self._pending = False

    def __enter__(self) -> RunDir:
        return self.open()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(commit=exc_type is None)

    def _require_open(self) -> None:
        if not self._lock.held:
            raise RunDirError(f"{self.path} is not open for writing; use `with RunDir(path, ...) as run:`")

    # ----- outputs ----------------------------------------------------------------------------
    def output_path(self, name: str) -> Path:
        """Return the path of output `name` ('scores' -> DIR/scores.parquet; names with a suffix are kept)."""
        rel = PurePosixPath(name)
        if not name or rel.is_absolute() or ".." in rel.parts or name in (MANIFEST, LOCK):
            raise ValueError(f"bad output name {name!r}: use a relative name inside the run directory such as 'scores'")
        if not rel.suffix:
            rel = rel.with_suffix(".parquet")
        return self.path / rel

    def write_table(self, name: str, table: TableLike, provenance: Mapping[str, Any] | None = None) -> Path:
        """Write output `name` atomically with run (and current stage) provenance merged in; return its path.

        Precedence of provenance keys: `provenance` arg > the table's own metadata > stage > run.
        """
        self._require_open()
        if self._current_stage is not None and name not in self._current_outputs:
            raise StageOutputError(
                f"stage {self._current_stage['name']!r} wrote {name!r}, which is not among its outputs "
                f"{self._current_outputs}; declare it in outputs=[...]"
            )
        if self._pending:
            self._write_manifest()  # the run's manifest exists before any of its tables
        t = to_arrow(table)
        registered = schema_for(PurePosixPath(name).name)
        if registered is not None:  # the one schema (core/schema.py): a drifted writer fails here
            t = registered.validate(t)
        prov: dict[str, Any] = self.provenance
        prov["run"] = {"id": self.run_id, "dir": self.path.name, "spec_sha256": self._manifest["spec_sha256"]}
        if self._current_stage is not None:
            prov["stage"] = copy.deepcopy(self._current_stage)
            prov["seed"] = seed_record(self.stage_seed(self._current_stage["name"]))
        else:
            prov["seed"] = seed_record(self.seed)
        prov.update(read_provenance(t))
        prov.update(to_jsonable(dict(provenance or {})))
        path = write_table(t, self.output_path(name), prov)
        if self._current_stage is None:  # a table written outside a stage is recorded now (the readers check it)
            rec = output_record(self.path, path)
            self._manifest.setdefault("tables", {})[rec["path"]] = rec
            self._write_manifest()
        return path

    def remove_table(self, name: str) -> None:
        """Remove output `name` written outside a stage, and its record in the manifest (a result replaced)."""
        self._require_open()
        path = self.output_path(name)
        if self._pending:
            self._write_manifest()
        path.unlink(missing_ok=True)
        self._manifest.get("tables", {}).pop(path.relative_to(self.path).as_posix(), None)
        self._write_manifest()

    def table(self, name: str) -> pa.Table:
        """Return output table `name` read from the run directory."""
        return read_table(self.output_path(name))

    # ----- stages -----------------------------------------------------------------------------
    def status(self, name: str) -> str | None:
        """Return the recorded status of stage `name` ('running', 'done', 'failed') or None."""
        return (self._manifest or {}).get("stages", {}).get(name, {}).get("status")

    def is_done(self, name: str) -> bool:
        """Return True if stage `name` finished and all its recorded outputs are present and unchanged.

        Unchanged: each output is a regular file inside the run (no link) whose bytes match the sha256
        recorded when the stage finished; it is re-hashed only when its file identity (size, inode,
        mtime, ctime) differs from the recorded one (circuitstat.core.integrity). A changed output is not
        used by a resumed run: the stage runs again.
        """
        rec = (self._manifest or {}).get("stages", {}).get(name)
        if not rec or rec.get("status") != "done":
            return False
        return not changed_outputs(self.path, rec.get("outputs", {}).values())

    def fingerprint(self, params: Any = None, outputs: Iterable[str] = (), depends_on: Iterable[str] = ()) -> str:
        """Return the fingerprint of a stage: hash of its params, outputs and its dependencies' fingerprints.

        Chaining the upstream fingerprints means a changed upstream spec also changes every stage
        that depends on it, so stale downstream results are never mixed with new upstream ones.
        """
        deps = {}
        for d in depends_on:
            if not self.is_done(d):
                raise RunDirError(f"stage depends on {d!r}, which has not finished; run stage {d!r} first")
            deps[d] = self._manifest["stages"][d]["fingerprint"]
        return hash_json({"params": params, "outputs": sorted(outputs), "depends_on": deps})

    def _changed(self, name: str, old: Mapping[str, Any], params_json: Any, outputs: list[str],
                 dep_fps: Mapping[str, str]) -> StageSpecChangedError:
        """The refusal of re-running finished stage `name` with a different spec, saying what changed."""
        why = []
        if old.get("params") != params_json:
            why.append(f"params changed ({_diff(old.get('params'), params_json)})")
        if sorted(old.get("outputs", {})) != sorted(outputs):
            why.append(f"outputs changed ({sorted(old.get('outputs', {}))} -> {sorted(outputs)})")
        if old.get("depends_on_fingerprints") != dict(dep_fps):
            why.append(f"upstream stages {list(dep_fps)} changed or differ")
        err = StageSpecChangedError(
            f"stage {name!r} in {self.path} already finished with a different spec: "
            f"{'; '.join(why) or 'fingerprint differs'}. Its results would be mixed with the new "
            "spec's. Rerun with --force (force=True in Python) to recompute it and the stages that depend on it, "
            "or use a new output directory"
        )
        err.stage, err.run_dir = name, self.path  # for messages that may not quote the spec's values
        return err

    def check_plan(self, stages: Iterable[tuple[str, Any, Iterable[str], Iterable[str]]], *, force: bool = False) -> None:
        """Raise StageSpecChangedError if running `stages` in order would refuse any of them; writes nothing.

        `stages` are (name, params, outputs, depends_on) as later given to stage(). Calling this
        right after opening makes a resume all or nothing: without it a new stage (a method added
        to the spec) could run and write before a later finished stage refuses the changed spec.
        """
        self._require_open()
        recorded = self._manifest["stages"]
        planned: dict[str, str] = {}
        for name, params, outputs, depends_on in stages:
            outputs = list(dict.fromkeys(outputs))
            params_json = to_jsonable(params)
            dep_fps = {}
            for d in depends_on:
                if d not in planned and recorded.get(d, {}).get("status") != "done":
                    raise RunDirError(f"stage {name!r} depends on {d!r}, which is neither finished nor planned before it")
                dep_fps[d] = planned.get(d) or recorded[d]["fingerprint"]
            fp = hash_json({"params": params_json, "outputs": sorted(outputs), "depends_on": dep_fps})
            old = recorded.get(name)
            if old is not None and old.get("status") == "done" and old["fingerprint"] != fp and not force:
                raise self._changed(name, old, params_json, outputs, dep_fps)
            planned[name] = fp

    def stage(
        self,
        name: str,
        fn: Callable[[], Mapping[str, TableLike] | None],
        outputs: Iterable[str] = (),
        *,
        params: Any = None,
        depends_on: Iterable[str] = (),
        force: bool = False,
    ) -> dict[str, Path]:
        """Run stage `name` unless it already finished with the same fingerprint; return {output: path}.

        `fn()` either returns {output: table} (written here, atomically) or writes its outputs itself
        via run.write_table. The stage is marked done only after every declared output exists. If a
        finished stage's params/outputs/dependencies changed, raise StageSpecChangedError, or
        recompute when force=True.
        """
        self._require_open()
        if not name or "/" in name:
            raise ValueError(f"bad stage name {name!r}")
        outputs = list(dict.fromkeys(outputs))
        depends_on = list(depends_on)
        paths = {o: self.output_path(o) for o in outputs}
        params_json = to_jsonable(params)
        fp = self.fingerprint(params_json, outputs, depends_on)
        stages = self._manifest["stages"]
        old = stages.get(name)

        if old is not None and old.get("status") == "done":
            if old["fingerprint"] == fp:
                if self.is_done(name):
                    return paths
                warnings.warn(f"stage {name!r} was done but some outputs are missing or changed since it finished; "
                              "recomputing it", stacklevel=2)
            elif not force:
                raise self._changed(name, old, params_json, outputs,
                                    {d: stages[d]["fingerprint"] for d in depends_on})

        if self._pending:
            self._write_manifest()  # the stage runs: the first change to the directory
        # Outputs left from an earlier attempt or spec must not survive into this result.
        for p in paths.values():
            p.unlink(missing_ok=True)
        rec: dict[str, Any] = {
            "status": "running",
            "fingerprint": fp,
            "params": params_json,
            "depends_on_fingerprints": {d: stages[d]["fingerprint"] for d in depends_on},
            "outputs": {},
            "started_utc": utc_now(),
            "attempts": (old or {}).get("attempts", 0) + 1,
            "seed": seed_record(self.stage_seed(name)),
        }
        stages[name] = rec
        self._write_manifest()

        t0 = time.perf_counter()
        self._current_stage = {"name": name, "fingerprint": fp, "params": params_json}
        self._current_outputs = outputs
        try:
            self._store_outputs(name, fn(), outputs, paths)
        except BaseException as e:
            rec.update(status="failed", error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0)
            self._write_manifest()
            raise
        finally:
            self._current_stage, self._current_outputs = None, []

        rec["outputs"] = {o: output_record(self.path, p) for o, p in paths.items()}
        for r in rec["outputs"].values():  # this stage's record of a table replaces one written outside a stage
            self._manifest.get("tables", {}).pop(r["path"], None)
        rec.update(status="done", finished_utc=utc_now(), seconds=time.perf_counter() - t0)
        self._write_manifest()  # the commit point: only now is the stage done
        return paths

    def _store_outputs(self, name: str, result: Mapping[str, TableLike] | None, outputs: list[str],
                       paths: dict[str, Path]) -> None:
        """Write the tables a stage's fn returned (declared outputs only); raise unless every declared output exists."""
        if result is not None:
            if not isinstance(result, Mapping):
                raise TypeError(f"stage {name!r}: fn must return None or a mapping {{output: table}}, not {type(result).__name__}")
            unknown = sorted(set(result) - set(outputs))
            if unknown:
                raise StageOutputError(f"stage {name!r} returned undeclared outputs {unknown}; add them to outputs=[...]")
            for oname, tab in result.items():
                self.write_table(oname, tab)
        missing = [o for o, p in paths.items() if not p.exists()]
        if missing:
            raise StageOutputError(
                f"stage {name!r} declared outputs {missing} but did not write them; return them from fn or call run.write_table"
            )

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r}, run_id={self.run_id!r})"


def output_record(root: Path, p: Path) -> dict[str, Any]:
    """What a run records of its output file ``p`` (inside ``root``): path, size, sha256 and file identity."""
    from circuitstat.core.integrity import file_identity

    identity = file_identity(p)  # before hashing: a later change of the file changes it
    return {"path": p.relative_to(root).as_posix(), "bytes": p.stat().st_size, "sha256": hash_file(p),
            "identity": identity}


def changed_outputs(root: Path, outputs: Iterable[Any]) -> list[str]:
    """The recorded paths among ``outputs`` (output records) that are no longer the regular file inside ``root``
    whose sha256 was recorded (re-hashed only when the file identity changed)."""
    from circuitstat.core.integrity import IntegrityError, check_file

    changed = []
    for o in outputs:
        try:
            check_file(root / o["path"], {"sha256": o.get("sha256"), "identity": o.get("identity")}, root=root)
        except (IntegrityError, OSError, KeyError, TypeError, ValueError):
            changed.append(str(o.get("path") if isinstance(o, dict) else o))
    return changed
