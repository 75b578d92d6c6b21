"""Atomic file writes: a temporary file in the target's directory, fsync, then os.replace."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

# Temp files are hidden (leading dot) and carry this suffix, so globs for "*.parquet" never see
# them and cleanup_temp_files can find exactly the ones we made.
TMP_SUFFIX = ".circuitstat-tmp"


def temp_path_for(path: Path) -> Path:
    """Return a unique hidden temporary path next to `path` (same directory, so rename is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")


def _fsync_dir(directory: Path) -> None:
    # Make the rename itself durable; not every platform/filesystem allows opening a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Yield a binary file; on clean exit it is fsynced and renamed onto `path`, else removed. A `path` that is a
    device, FIFO, socket or directory is refused (InputError) before anything is written, never replaced.

    Readers see either the old file or the complete new one, never a partial file, even if the
    process is killed (a kill leaves only a hidden temp file, removed by cleanup_temp_files).
    """
    from circuitstat.core.outpath import replaceable

    path = Path(path)
    replaceable(path)  # a device, FIFO or directory is never replaced by the rename (core/outpath.py)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    try:
        with open(tmp, "xb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        replaceable(path)  # again: it may have appeared while the file was written
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` atomically and return the path."""
    with atomic_write(path) as f:
        f.write(data)
    return Path(path)


def cleanup_temp_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove temp files left by killed writers under `directory`; return the removed paths.

    Only call this while no other writer uses the directory (RunDir does it under its lock).
    """
    removed = []
    for p in Path(directory).rglob(f".*{TMP_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            removed.append(p)
    return removed
