"""circuitstat's local cache directory, the weight-hash memo and the conversion cache.

Hashing a model's weights (its identity in every table's provenance and every checkpoint
binding) reads all of them: 4.3 CPU s for GPT-2 small, most of a command's start-up. The memo
keeps the digest of a directory's weights keyed by the files' identity, the way make and git
trust file metadata: real path, size, inode, device, mtime and ctime (ctime cannot be set back
by `touch`, so a rewritten file never matches an old entry), plus the dtype the weights were cast
to and the hash scheme's version. A miss hashes the weights as before and records them.

The conversion of a Hugging Face checkpoint (transformers import, loading, conversion: about 5 s
for GPT-2 small) is cached the same way: a circuitstat model directory under ``converted/``
keyed by the checkpoint files' identity and the dtype, loaded instead of converting again. It
costs one copy of the weights on disk; ``CIRCUITSTAT_CONVERSION_CACHE=0`` turns it off.

Both are state circuitstat reads back, so both are checked (circuitstat.core.integrity, docs/integrity.md):

* a memo is a sealed record (it carries the digest of its own JSON) that names the files'
  identities and the dtype it was made for; it is used only when all of them equal the current
  ones, read without following a link (a memo linked to ``/dev/zero`` is refused, not read), and
  anything else is ignored and rewritten. The provenance says that the hash came from a memo and
  what bound it (:meth:`WeightHashMemo.describe`);
* a conversion entry carries ``SEAL.json``: its key and each file's sha256 and identity at write
  time. An entry whose files keep their identity is used without re-hashing; a changed identity
  is hashed again; an entry that is linked, unsealed, of another key or does not match its digest
  is removed and converted again, never used. Its ``config.json`` also records the weight hash,
  which loading compares with the memo's (circuitstat.circuits.loading).

Nothing below the cache directory is followed through a symbolic link, for reading or writing.
A cache that cannot be written (full or read-only disk) is skipped: it only saves time. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

__all__ = ["cache_dir", "weight_hash_memo", "read_weight_hash", "write_weight_hash", "conversion_dir",
           "WeightHashMemo", "writable_below", "CONVERSION_SEAL", "seal_conversion", "check_conversion"]

#: bump when CircuitModel.weight_hash or the conversion of checkpoints changes what is hashed
HASH_SCHEME = 1
#: bump when circuitstat.circuits.convert changes what a checkpoint converts to (old conversions are then unused)
CONVERSION_SCHEME = 1
#: bump when the memo's record changes (old memos are then ignored)
MEMO_FORMAT = "circuitstat.weight-hash-memo/2"
NO_CONVERSION_CACHE = "CIRCUITSTAT_CONVERSION_CACHE"
"""Set to 0 to convert Hugging Face checkpoints on every load instead of caching the conversion."""
CONVERSION_SEAL = "SEAL.json"
_HEX64 = re.compile(r"[0-9a-f]{64}")


def cache_dir() -> Path:
    """Return ``$CIRCUITSTAT_CACHE`` or ``~/.cache/circuitstat`` (not created)."""
    return Path(os.environ.get("CIRCUITSTAT_CACHE") or Path.home() / ".cache" / "circuitstat").expanduser()


def _identity(path: Path) -> list:
    """Return the file's identity: real path, size, inode, device, mtime and ctime in nanoseconds."""
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns]


def _identities(files: Iterable[Path]) -> list | None:
    try:
        return [_identity(Path(f)) for f in files]
    except OSError:
        return None


def _key(ident: list, *parts: object) -> str:
    """Return the sha256 hex key of ``parts`` and the files' identities."""
    return hashlib.sha256(json.dumps([*parts, ident], sort_keys=True).encode()).hexdigest()


def writable_below(path: Path, root: Path | None = None) -> bool:
    """True when no existing component of ``path`` below the cache directory is a symbolic link (a
    cache write never lands elsewhere through one)."""
    from circuitstat.core.integrity import is_plain_path

    root = cache_dir() if root is None else root
    return is_plain_path(path, root)


@dataclass(frozen=True)
class WeightHashMemo:
    """The memo of one set of weight files at one dtype: where it lives and what it must be bound to."""

    path: Path
    binding: dict  # format, kind, dtype, hash scheme and the files' identities

    def read(self) -> str | None:
        """The recorded digest when the memo is sealed, bound to exactly this binding and not linked; else None."""
        from circuitstat.core.integrity import IntegrityError, read_sealed

        try:
            payload = read_sealed(self.path, root=cache_dir())
        except (OSError, IntegrityError):
            return None
        digest = payload.get("weight_hash")
        if {k: v for k, v in payload.items() if k != "weight_hash"} != self.binding:
            return None  # another model's memo under this name, or files changed since
        return digest if isinstance(digest, str) and _HEX64.fullmatch(digest) else None

    def write(self, digest: str) -> None:
        """Record ``digest`` sealed with the binding, atomically; skipped when the cache cannot be written."""
        from circuitstat.core.integrity import write_sealed

        if not _HEX64.fullmatch(digest) or not writable_below(self.path.parent):
            return
        try:
            if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
                self.path.unlink()  # a planted link or FIFO in circuitstat's own cache: removed, never written through
            write_sealed(self.path, {**self.binding, "weight_hash": digest})
        except OSError:
            pass

    def describe(self) -> str:
        """How a hash taken from this memo was bound, for provenance."""
        return (f"memo {self.path.name} (a sealed record bound to the weight files' real path, size, inode, "
                f"device, mtime and ctime and to dtype {self.binding['dtype']}; not re-hashed in this run)")


def weight_hash_memo(files: Iterable[Path], dtype: str, kind: str) -> WeightHashMemo | None:
    """Return the memo for the weights in ``files`` cast to ``dtype`` (None if a file is missing)."""
    ident = _identities(files)
    if ident is None:
        return None
    binding = {"format": MEMO_FORMAT, "scheme": HASH_SCHEME, "kind": kind, "dtype": dtype, "files": ident}
    return WeightHashMemo(cache_dir() / "weight-hashes" / f"{_key(ident, HASH_SCHEME, kind, dtype)}.json", binding)


def conversion_dir(files: Iterable[Path], dtype: str) -> Path | None:
    """Return where the circuitstat-format conversion of the checkpoint in ``files`` at ``dtype`` is
    cached, keyed like the weight-hash memo (None if a file is missing or the cache is turned off)."""
    if os.environ.get(NO_CONVERSION_CACHE, "1").strip() in ("0", "false", "no", "off"):
        return None
    ident = _identities(files)
    return None if ident is None else cache_dir() / "converted" / _key(ident, CONVERSION_SCHEME, HASH_SCHEME, dtype)


def read_weight_hash(memo: WeightHashMemo | None) -> str | None:
    """Return the digest ``memo`` records for its files, or None when there is none it may be trusted for."""
    return None if memo is None else memo.read()


def write_weight_hash(memo: WeightHashMemo | None, digest: str) -> None:
    """Record ``digest`` in ``memo``; a cache that cannot be written is skipped (a memo only saves time)."""
    if memo is not None:
        memo.write(digest)


CONVERSION_FILES = ("config.json", "model.safetensors")


def _conversion_binding(key: str) -> dict:
    return {"kind": "conversion", "key": key, "scheme": CONVERSION_SCHEME, "hash_scheme": HASH_SCHEME}


def seal_conversion(entry: Path, key: str | None = None) -> None:
    """Write ``entry``/SEAL.json: the entry's key (default: its directory name) and each file's digest
    and identity (circuitstat.core.integrity.seal_entry)."""
    from circuitstat.core.integrity import seal_entry

    seal_entry(entry, CONVERSION_FILES, _conversion_binding(key or entry.name), seal_name=CONVERSION_SEAL)


def check_conversion(entry: Path, key: str | None = None) -> None:
    """None when ``entry`` is a sealed conversion of key ``key`` (default: its directory name) whose files
    match their seal (re-hashed only when a file's identity changed); IntegrityError otherwise."""
    from circuitstat.core.integrity import check_entry

    check_entry(entry, CONVERSION_FILES, _conversion_binding(key or entry.name), root=cache_dir(),
                seal_name=CONVERSION_SEAL)
