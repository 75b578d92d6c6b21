"""The one verified reader of a run directory: every command reads only tables its run recorded.

A run records, in ``manifest.json``, the sha256 and file identity of every table it wrote: a finished
stage's outputs (``stages.<name>.outputs``, written at the stage's commit point) and the tables written
outside any stage (``tables``: a result written through RunDir, ``check --record``'s claims table).
:func:`verify_outputs` is the check every command that reads a run makes first (circuit, query, compare,
report, check, sample-size, export mib, and the service's report):

* a recorded table whose bytes changed is refused, naming it and its stage;
* a manifest that cannot be read (not JSON, not a run manifest, ``stages`` not a mapping) is refused:
  nothing it records could be checked;
* a top-level ``*.parquet`` with no record (no manifest at all, a stage deleted from it or not finished,
  a table planted beside the run's own) is refused, since nothing says the run wrote it.

Hand-made tables (written by another tool) are read only with an explicit ``trust_unrecorded``
(``--trust-unrecorded``): they are then read as they are, and the returned :class:`RunCheck` names them,
so the command says which tables it read unchecked. A recorded table is checked even then. Refusals are
:class:`~circuitstat.core.integrity.IntegrityError` (exit 2), naming the table and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["RunCheck", "TRUST_FLAG", "verify_outputs", "recorded_outputs", "record_tables"]

TRUST_FLAG = "--trust-unrecorded"


@dataclass(frozen=True)
class RunCheck:
    """What :func:`verify_outputs` found: how many recorded tables it checked and which it read unchecked."""

    checked: int
    unchecked: tuple[str, ...] = ()

    def note(self, label: str) -> str | None:
        """The line a command prints when it read tables of run ``label`` unchecked (None when it did not)."""
        if not self.unchecked:
            return None
        return (f"{label}: {len(self.unchecked)} table(s) read unchecked ({TRUST_FLAG}: no manifest record of "
                f"them to check): {', '.join(self.unchecked)}")


def recorded_outputs(manifest: dict) -> dict[str, tuple[str, dict]]:
    """{relative path: (where it is recorded, its record)} of every table ``manifest`` records as written:
    the outputs of finished stages and the tables written outside a stage. ValueError when the manifest's
    ``stages`` or ``tables`` is not a mapping (a malformed manifest records nothing that can be trusted)."""
    stages, extra = manifest.get("stages"), manifest.get("tables", {})
    if not isinstance(stages, dict) or not isinstance(extra, dict):
        raise ValueError("its 'stages' or 'tables' is not a mapping")
    found: dict[str, tuple[str, dict]] = {}
    # tables written outside a stage last: such a record is newer than a stage's (a stage that writes the
    # table again removes it, RunDir.stage)
    for name, rec in [*((f"stage {n}", r) for n, r in stages.items()),
                      *((f"table {n}", {"status": "done", "outputs": {n: r}}) for n, r in extra.items())]:
        if not isinstance(rec, dict) or rec.get("status") != "done" or not isinstance(rec.get("outputs"), dict):
            continue
        for o in rec["outputs"].values():
            if isinstance(o, dict) and isinstance(o.get("path"), str) and o["path"].endswith(".parquet"):
                found[o["path"]] = (name, o)
    return found


def _read_manifest(root: Path) -> tuple[dict | None, str | None]:
    """(the manifest of ``root`` or None when it has none, what is wrong with it or None)."""
    from circuitstat.core.rundir import MANIFEST, RunDir, RunDirError

    if not os.path.lexists(root / MANIFEST):
        return None, None
    if not (root / MANIFEST).is_file() or (root / MANIFEST).is_symlink():  # a FIFO would block the read
        return None, f"its {MANIFEST} is not a regular file"
    try:
        manifest = RunDir.read_manifest(root)
        recorded_outputs(manifest)
    except (RunDirError, ValueError, RecursionError, OSError, UnicodeDecodeError) as e:
        return None, f"its {MANIFEST} cannot be read ({str(e).split(';')[0][:200]})"
    return manifest, None


def _present(root: Path) -> list[str]:
    """The ``*.parquet`` paths below ``root`` relative to it (a cross-seed run's ``model-<i>/`` tables too), hidden
    files and directories (temporary files) excepted; links to directories are not followed."""
    found = []
    for here, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = Path(here).relative_to(root)
        found += [(rel / f).as_posix() for f in files if f.endswith(".parquet") and not f.startswith(".")]
    return sorted(found)


def verify_outputs(path: str | os.PathLike[str], *, trust_unrecorded: bool = False) -> RunCheck:
    """Check the run directory ``path`` before any of its tables is read (module doc); IntegrityError naming
    the tables and the fix when a table changed, the manifest cannot be read, or a table has no record
    (unless ``trust_unrecorded``: then returned as unchecked)."""
    from circuitstat.core.integrity import IntegrityError
    from circuitstat.core.rundir import changed_outputs

    root = Path(path)
    present = _present(root)
    manifest, problem = _read_manifest(root)
    if problem is not None and not trust_unrecorded:
        raise IntegrityError(f"{root}: {problem}, so none of its tables ({_names(present)}) can be checked against "
                             "the sha256 the run recorded. Restore manifest.json or rerun the command that made the "
                             f"run; pass {TRUST_FLAG} only to read tables you made yourself, unchecked")
    records = recorded_outputs(manifest) if manifest is not None else {}
    changed = [f"{p} ({where})" for p, (where, o) in records.items() if changed_outputs(root, [o])]
    if changed:
        raise IntegrityError(f"{root}: {len(changed)} table(s) changed since the run wrote them: "
                             f"{', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}; their sha256 no longer "
                             "matches manifest.json. Restore them, or rerun the command that made the run "
                             "(it redoes the changed stages)")
    unrecorded = [n for n in present if n not in records and not _alias(root, n, records)]
    if unrecorded and not trust_unrecorded:
        unrecorded = [n + _what(root / n) for n in unrecorded]
        why = "it has no manifest.json" if manifest is None else "no finished stage in its manifest.json records them"
        raise IntegrityError(f"{root}: {len(unrecorded)} table(s) not written by the run: {_names(unrecorded)} "
                             f"({why}). Rerun the command that made the run (or remove them); pass {TRUST_FLAG} "
                             "only to read tables you made yourself, unchecked")
    return RunCheck(len(records), tuple(unrecorded))


def _alias(root: Path, name: str, records: dict) -> bool:
    """True when ``name`` is a symbolic link to a recorded table inside the run (its own view of that table)."""
    p = root / name
    if not p.is_symlink():
        return False
    try:
        return p.resolve(strict=True).relative_to(root.resolve()).as_posix() in records
    except (OSError, ValueError, RuntimeError):
        return False


def _what(p: Path) -> str:
    """'' for a regular file, else what ``p`` is, in parentheses (a planted link or FIFO is named as such)."""
    if p.is_symlink():
        return " (a symbolic link)"
    return "" if p.is_file() else " (not a regular file)"


def _names(names: list[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "") or "none"


def record_tables(run_dir: str | os.PathLike[str], paths: Iterable[str | os.PathLike[str]]) -> None:
    """Record ``paths`` (tables just written inside ``run_dir`` outside any stage) in its manifest's ``tables``,
    so the readers accept them. The caller holds the run's lock (RunDir, or ``check --record``'s DirLock)."""
    import json

    from circuitstat.core.atomic import atomic_write_bytes
    from circuitstat.core.rundir import MANIFEST, RunDir, output_record

    root = Path(run_dir)
    manifest = RunDir.read_manifest(root)
    tables = manifest.setdefault("tables", {})
    for p in paths:
        rec = output_record(root, Path(p))
        tables[rec["path"]] = rec
    atomic_write_bytes(root / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
