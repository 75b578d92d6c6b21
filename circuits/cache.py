"""circuitstat's local cache directory, and the weight-hash memo of model directories.

Hashing a model's weights (its identity in every table's provenance and every checkpoint
binding) reads all of them: 4.3 CPU s for GPT-2 small, most of a command's start-up. The memo
keeps the digest of a directory's weights keyed by the files' identity, the way make and git
trust file metadata: real path, size, inode, mtime and ctime (ctime cannot be set back by
`touch`, so a rewritten file never matches an old entry), plus the dtype the weights were cast
to and the hash scheme's version. A miss hashes the weights as before and records them.

The conversion of a Hugging Face checkpoint (transformers import, loading, conversion: about 5 s
for GPT-2 small) is cached the same way: a circuitstat model directory under ``converted/``
keyed by the checkpoint files' identity and the dtype, loaded instead of converting again. It
costs one copy of the weights on disk; ``CIRCUITSTAT_CONVERSION_CACHE=0`` turns it off. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Iterable

__all__ = ["cache_dir", "weight_hash_memo", "read_weight_hash", "write_weight_hash", "conversion_dir"]

#: bump when CircuitModel.weight_hash or the conversion of checkpoints changes what is hashed
HASH_SCHEME = 1
#: bump when circuits.convert changes what a checkpoint converts to (old conversions are then unused)
CONVERSION_SCHEME = 1
NO_CONVERSION_CACHE = "CIRCUITSTAT_CONVERSION_CACHE"
"""Set to 0 to convert Hugging Face checkpoints on every load instead of caching the conversion."""
_HEX64 = re.compile(r"[0-9a-f]{64}")


def cache_dir() -> Path:
    """Return ``$CIRCUITSTAT_CACHE`` or ``~/.cache/circuitstat`` (not created)."""
    return Path(os.environ.get("CIRCUITSTAT_CACHE") or Path.home() / ".cache" / "circuitstat").expanduser()


def _identity(path: Path) -> list:
    """Return the file's identity: real path, size, inode, mtime and ctime in nanoseconds."""
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]


def _key(files: Iterable[Path], *parts: object) -> str | None:
    """Return the sha256 hex key of ``parts`` and the files' identities (None if a file is missing)."""
    try:
        ident = [_identity(Path(f)) for f in files]
    except OSError:
        return None
    return hashlib.sha256(json.dumps([*parts, ident], sort_keys=True).encode()).hexdigest()


def weight_hash_memo(files: Iterable[Path], dtype: str, kind: str) -> Path | None:
    """Return the memo file for the weights in ``files`` cast to ``dtype`` (None if a file is missing)."""
    key = _key(files, HASH_SCHEME, kind, dtype)
    return None if key is None else cache_dir() / "weight-hashes" / f"{key}.txt"


def conversion_dir(files: Iterable[Path], dtype: str) -> Path | None:
    """Return where the circuitstat-format conversion of the checkpoint in ``files`` at ``dtype`` is
    cached, keyed like the weight-hash memo (None if a file is missing or the cache is turned off)."""
    if os.environ.get(NO_CONVERSION_CACHE, "1").strip() in ("0", "false", "no", "off"):
        return None
    key = _key(files, CONVERSION_SCHEME, HASH_SCHEME, dtype)
    return None if key is None else cache_dir() / "converted" / key


def read_weight_hash(memo: Path | None) -> str | None:
    """Return the recorded digest, or None when there is none (or it is not a sha256 hex digest)."""
    if memo is None:
        return None
    try:
        text = memo.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if _HEX64.fullmatch(text) else None


def write_weight_hash(memo: Path | None, digest: str) -> None:
    """Record ``digest`` in ``memo`` atomically; a cache that cannot be written is skipped (a memo
    only saves time)."""
    if memo is None or not _HEX64.fullmatch(digest):
        return
    from reports.atomic import atomic_write_bytes

    try:
        atomic_write_bytes(memo, digest.encode("ascii"))
    except OSError:
        pass
