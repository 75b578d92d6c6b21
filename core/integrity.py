"""Integrity of the state circuitstat writes and later reads back itself (caches, memos, checkpoints).

One mechanism for every such file (docs/integrity.md lists them all):

* **digests** recorded when the state is written and compared when it is read back: sha256 of a
  file's bytes (:func:`digest_file`), of tensor values (:func:`digest_tensors`: name, dtype, shape
  and bytes of each, the scheme of ``CircuitModel.weight_hash``), or of a JSON record
  (:func:`seal` / :func:`unseal`: the record carries the digest of its own canonical JSON, so an
  edited, truncated or half-written record is recognised);
* **file identity** (size, inode, device, mtime and ctime in nanoseconds, from the open file) recorded
  beside a file's digest: a later read whose identity is unchanged skips re-hashing (the way make
  and git trust file metadata; ctime cannot be set back by ``touch``, so a rewritten file never
  matches an old identity), any other read hashes the file again;
* **no links followed**: every read below a cache or run directory opens each path component
  with ``O_NOFOLLOW`` relative to its parent (:func:`open_regular`), so neither a symbolic link
  nor a swapped directory leads the read elsewhere, and only regular files are read (a FIFO,
  ``/dev/zero`` or a directory under a state file's name is refused, never waited on or read
  without end).

What the digests protect against is damage and mix-ups (a truncated write, an edited or copied
file, an entry of another model or run, a link planted in the cache), not a forger who can write
the cache and recompute a sha256: that needs a key out of the writer's reach, which a per-user
cache has not. A mismatch raises :class:`IntegrityError`; callers rebuild a cache entry and refuse
a checkpoint, naming the file. Torch-free and numpy-free: every layer may import it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from circuitstat.core.errors import InputError

__all__ = ["IntegrityError", "open_regular", "read_regular", "file_identity", "digest_file", "digest_bytes",
           "digest_tensors", "seal", "unseal", "write_sealed", "read_sealed", "check_file", "record_file",
           "is_plain_path", "remove_entry", "seal_entry", "check_entry", "seal_file", "check_sealed_file", "seal_path"]

CHUNK = 1 << 20
SEAL_KEY = "sha256"


class IntegrityError(InputError):
    """State circuitstat wrote itself no longer matches its digest (edited, truncated, swapped, linked)."""


def _components(path: Path, root: Path | None) -> tuple[Path, list[str]]:
    """(directory to start from, names below it) of ``path``: below ``root`` when given, else its parent."""
    if root is None:
        return path.parent, [path.name]
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise IntegrityError(f"{path} is not inside {root}; state files are read only below their directory") from None
    parts = list(rel.parts)
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise IntegrityError(f"{path}: not a file name below {root}")
    return root, parts


def _open_fd(path: Path, root: Path | None) -> int:
    """A read-only descriptor of the regular file ``path``, every component below ``root`` opened
    without following a link (IntegrityError otherwise; FileNotFoundError when it does not exist)."""
    start, parts = _components(Path(path), None if root is None else Path(root))
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    directory = os.open(start, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        for name in parts[:-1]:
            try:
                nxt = os.open(name, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | nofollow, dir_fd=directory)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise IntegrityError(f"{path}: {name} is a symbolic link or not a directory; state files "
                                         "are never read through a link") from None
                raise
            os.close(directory)
            directory = nxt
        try:
            # O_NONBLOCK: a FIFO planted under the file's name must not block the open
            fd = os.open(parts[-1], os.O_RDONLY | nofollow | getattr(os, "O_NONBLOCK", 0), dir_fd=directory)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise IntegrityError(f"{path} is a symbolic link; state files are never read through a link") from None
            raise
    finally:
        os.close(directory)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IntegrityError(f"{path} is not a regular file (a device, FIFO or directory); it is not read")
    return fd


@contextlib.contextmanager
def open_regular(path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> Iterator[BinaryIO]:
    """Yield the regular file ``path`` open for binary reading, with no component below ``root``
    (default: the file's own directory) followed through a symbolic link; IntegrityError otherwise."""
    fd = _open_fd(Path(path), None if root is None else Path(root))
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as f:
        yield f


def _identity_of(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns]


def file_identity(path: str | os.PathLike[str]) -> list[int] | None:
    """[size, inode, device, mtime ns, ctime ns] of ``path`` itself (a link is not followed), or None
    when it is missing or not a regular file."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return _identity_of(st) if stat.S_ISREG(st.st_mode) else None


def read_regular(path: str | os.PathLike[str], *, max_bytes: int, root: str | os.PathLike[str] | None = None) -> bytes:
    """The bytes of the regular file ``path`` (read as :func:`open_regular` does); IntegrityError when
    it holds more than ``max_bytes`` (a state record is small: a large one is not ours)."""
    with open_regular(path, root=root) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise IntegrityError(f"{path} is larger than {max_bytes:,} bytes; it is not a file circuitstat wrote")
    return data


def digest_bytes(data: bytes | bytearray | memoryview) -> str:
    """The hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def digest_file(path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> tuple[str, list[int]]:
    """(hex sha256 of the file's bytes, its identity taken from the same open file), read as
    :func:`open_regular` does."""
    h = hashlib.sha256()
    with open_regular(path, root=root) as f:
        ident = _identity_of(os.fstat(f.fileno()))
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest(), ident


def digest_tensors(items: Iterable[tuple[str, str, tuple[int, ...], Any]]) -> str:
    """The hex sha256 of named tensors given as (name, dtype name, shape, bytes-like of the values), in
    the order given: each contributes its name, dtype name, ``str(shape)`` and bytes (so a renamed,
    recast, reshaped or edited tensor changes it). The scheme of ``CircuitModel.weight_hash``."""
    h = hashlib.sha256()
    for name, dtype, shape, data in items:
        h.update(name.encode())
        h.update(dtype.encode())
        h.update(str(tuple(shape)).encode())
        h.update(data)
    return h.hexdigest()


def _canonical(payload: Any) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def seal(payload: dict) -> bytes:
    """``payload`` as JSON bytes carrying the sha256 of its own canonical form (see :func:`unseal`)."""
    return _canonical({"payload": payload, SEAL_KEY: digest_bytes(_canonical(payload))}) + b"\n"


def unseal(data: bytes) -> dict | None:
    """The payload of a :func:`seal` record, or None when it is not one or its digest does not match."""
    try:
        doc = json.loads(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or set(doc) != {"payload", SEAL_KEY} or not isinstance(doc["payload"], dict):
        return None
    try:
        ok = doc[SEAL_KEY] == digest_bytes(_canonical(doc["payload"]))
    except (TypeError, ValueError):
        return None
    return doc["payload"] if ok else None


MAX_RECORD = 1 << 20
"""The largest sealed record read back (a seal lists a few files: far below)."""


def write_sealed(path: str | os.PathLike[str], payload: dict) -> None:
    """Write ``payload`` sealed to ``path`` atomically (circuitstat.core.atomic)."""
    from circuitstat.core.atomic import atomic_write_bytes

    atomic_write_bytes(path, seal(payload))


def read_sealed(path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> dict:
    """The payload of the sealed record at ``path``; IntegrityError when it is linked, not a regular
    file, too large, or does not match its own digest (FileNotFoundError when it is missing)."""
    payload = unseal(read_regular(path, max_bytes=MAX_RECORD, root=root))
    if payload is None:
        raise IntegrityError(f"{path} does not match its own digest (edited, truncated or not written by "
                             "circuitstat)")
    return payload


def record_file(path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> dict:
    """{"sha256", "identity"} of a file just written, for a seal (checked later by :func:`check_file`)."""
    digest, ident = digest_file(path, root=root)
    return {"sha256": digest, "identity": ident}


def check_file(path: str | os.PathLike[str], record: Any, *, root: str | os.PathLike[str] | None = None) -> bool:
    """True when ``path`` keeps the identity of its :func:`record_file` record (not re-hashed), False when
    it had to be hashed again and its bytes still match (the caller may record the new identity);
    IntegrityError when its bytes differ, or it is missing, linked or not a regular file."""
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
        raise IntegrityError(f"{path}: its record in the seal is malformed")
    try:
        with open_regular(path, root=root) as f:
            ident = _identity_of(os.fstat(f.fileno()))
            if ident == record.get("identity"):
                return True
            h = hashlib.sha256()
            while block := f.read(CHUNK):
                h.update(block)
    except FileNotFoundError:
        raise IntegrityError(f"{path} is missing") from None
    if h.hexdigest() != record["sha256"]:
        raise IntegrityError(f"{path} does not match the digest recorded when it was written (edited, truncated "
                             "or replaced)")
    return False


def is_plain_path(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """True when no component of ``path`` below ``root`` is a symbolic link (missing ones count as plain)."""
    path, root = Path(path), Path(root)
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return False
    at = root
    for name in parts:
        at = at / name
        try:
            if stat.S_ISLNK(os.lstat(at).st_mode):
                return False
        except FileNotFoundError:
            return True
    return True


def remove_entry(path: str | os.PathLike[str]) -> None:
    """Remove a damaged state entry: a link or file is unlinked (never its target), a directory
    removed with its contents (links inside are unlinked, not followed); errors are ignored."""
    import shutil

    p = Path(path)
    with contextlib.suppress(OSError):
        st = os.lstat(p)
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(p, ignore_errors=True)  # rmtree never follows links inside the tree
        else:
            p.unlink()


def seal_entry(entry: str | os.PathLike[str], names: Iterable[str], binding: dict, *, seal_name: str = "SEAL.json",
               root: str | os.PathLike[str] | None = None) -> None:
    """Seal the cache entry directory ``entry``: ``entry/seal_name`` records ``binding`` (what the entry
    is for: its key, a scheme version) and each of its files ``names`` with digest and identity."""
    entry = Path(entry)
    files = {name: record_file(entry / name, root=root) for name in names}
    write_sealed(entry / seal_name, {"binding": binding, "files": files})


def check_entry(entry: str | os.PathLike[str], names: Iterable[str], binding: dict, *, root: str | os.PathLike[str],
                seal_name: str = "SEAL.json") -> None:
    """None when the entry directory ``entry`` below ``root`` is sealed for ``binding`` and each of its files
    ``names`` matches the seal (re-hashed only when its identity changed; the seal is then renewed);
    IntegrityError when anything is linked, missing, foreign or changed."""
    entry, root, names = Path(entry), Path(root), sorted(names)
    if not is_plain_path(entry, root):
        raise IntegrityError(f"{entry}: a symbolic link below {root}; it is not followed")
    try:
        payload = read_sealed(entry / seal_name, root=root)
    except FileNotFoundError:
        raise IntegrityError(f"{entry} has no {seal_name}") from None
    files = payload.get("files")
    if payload.get("binding") != binding or not isinstance(files, dict) or sorted(files) != names:
        raise IntegrityError(f"{entry}: its seal belongs to another entry")
    if not all([check_file(entry / name, files[name], root=root) for name in names]):
        with contextlib.suppress(OSError, IntegrityError):  # same bytes, new identity (a restored copy): fast next time
            seal_entry(entry, names, binding, seal_name=seal_name, root=root)


def seal_path(path: str | os.PathLike[str]) -> Path:
    """Where the seal of the single cached file ``path`` lives: beside it, ``<name>.seal``."""
    path = Path(path)
    return path.with_name(path.name + ".seal")


def seal_file(path: str | os.PathLike[str], binding: dict, *, root: str | os.PathLike[str] | None = None) -> None:
    """Seal the single cached file ``path`` (just written) for ``binding``: its digest and identity beside it."""
    write_sealed(seal_path(path), {"binding": binding, "file": record_file(path, root=root)})


def check_sealed_file(path: str | os.PathLike[str], binding: dict, *, root: str | os.PathLike[str]) -> None:
    """None when the cached file ``path`` below ``root`` matches its seal for ``binding``; IntegrityError otherwise."""
    try:
        payload = read_sealed(seal_path(path), root=root)
    except FileNotFoundError:
        raise IntegrityError(f"{path} has no seal") from None
    if payload.get("binding") != binding:
        raise IntegrityError(f"{path}: its seal belongs to another file")
    if not check_file(path, payload.get("file"), root=root):
        with contextlib.suppress(OSError, IntegrityError):
            seal_file(path, binding, root=root)
