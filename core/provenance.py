"""Provenance records (who/what/how produced a table) and stable content hashes."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import hashlib
import importlib.metadata as _md
import json
import math
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, Callable

import numpy as np

from .seeds import seed_record

PACKAGE = "circuitstat"
# Versions recorded when installed. Looked up via importlib.metadata only: importing torch just to
# read its version would cost seconds and reports/ must stay torch-free.
LIBRARIES = ("numpy", "pyarrow", "pandas", "duckdb", "scipy", "torch", "transformers")


def package_version(name: str = PACKAGE) -> str:
    """Return the installed version of distribution `name`, or '0+unknown' if not installed."""
    try:
        return _md.version(name)
    except _md.PackageNotFoundError:
        return "0+unknown"


def library_versions(names: tuple[str, ...] = LIBRARIES) -> dict[str, str]:
    """Return {distribution: version} for those of `names` that are installed."""
    out = {}
    for name in names:
        try:
            out[name] = _md.version(name)
        except _md.PackageNotFoundError:
            continue
    return out


def utc_now() -> str:
    """Return the current UTC time as an ISO-8601 string with a 'Z' suffix."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def to_jsonable(obj: Any, fallback: Callable[[Any], Any] | None = None) -> Any:
    """Return `obj` converted to plain JSON types (numpy scalars/arrays, paths, dataclasses, ...).

    Non-finite floats become the strings 'nan', 'inf', '-inf' because strict JSON has no such
    values and provenance must be readable by any JSON parser (DuckDB, browsers, jq). Other
    objects raise TypeError, or become ``fallback(obj)`` when a fallback is given (result
    parameters record an object they cannot serialise by its repr).
    """
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, np.integer)) and not isinstance(obj, np.bool_):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist(), fallback)
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item(), fallback)
    if isinstance(obj, np.random.SeedSequence):
        return seed_record(obj)
    if isinstance(obj, (PurePath, os.PathLike)):
        return os.fspath(obj)
    if isinstance(obj, (_dt.datetime, _dt.date, _dt.time)):
        return obj.isoformat()
    if isinstance(obj, _dt.timedelta):
        return obj.total_seconds()
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value, fallback)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj).hex()
    if isinstance(obj, np.dtype):
        return obj.str
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v, fallback) for k, v in obj.items()}
    if isinstance(obj, (set, frozenset)):
        return sorted((to_jsonable(v, fallback) for v in obj), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v, fallback) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj), fallback)
    if hasattr(obj, "model_dump"):  # pydantic v2 models (audit specs)
        return to_jsonable(obj.model_dump(mode="json"), fallback)
    if fallback is not None:
        return to_jsonable(fallback(obj))
    raise TypeError(
        f"cannot record {type(obj).__name__} in provenance: convert it to a dict/list/str/number "
        "first (or record a hash of it with hash_bytes/hash_array/hash_json)"
    )


def canonical_json(obj: Any) -> str:
    """Return `obj` as canonical JSON (sorted keys, no whitespace, ASCII) so equal data hashes equal."""
    return json.dumps(to_jsonable(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def hash_bytes(data: bytes | bytearray | memoryview) -> str:
    """Return the hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def hash_array(array: np.ndarray) -> str:
    """Return the hex sha256 of an array's dtype, shape and C-order bytes (so a reshape or cast changes it)."""
    a = np.ascontiguousarray(array)
    if a.dtype.hasobject:
        raise TypeError("hash_array needs a numeric array, not dtype=object; hash_json the values instead")
    h = hashlib.sha256()
    h.update(a.dtype.str.encode())
    h.update(repr(tuple(a.shape)).encode())
    h.update(memoryview(a).cast("B") if a.size else b"")
    return h.hexdigest()


def hash_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Return the hex sha256 of a file's contents, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_size):
            h.update(block)
    return h.hexdigest()


def hash_json(obj: Any) -> str:
    """Return the hex sha256 of `obj`'s canonical JSON (key order and numpy types do not matter)."""
    return hash_bytes(canonical_json(obj).encode())


def provenance(**fields: Any) -> dict[str, Any]:
    """Return a JSON-safe provenance dict: package, python, platform, library versions, UTC time, plus `fields`.

    Conventional caller fields: model={name, source, weights_sha256}, task={name, data_sha256},
    method=..., params={...}, seed=SeedSequence (recorded with its entropy), timings={...}.
    Caller fields override the automatic ones of the same name (e.g. a fixed created_utc).
    """
    base: dict[str, Any] = {
        "package": {"name": PACKAGE, "version": package_version()},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "libraries": library_versions(),
        "created_utc": utc_now(),
    }
    base.update(to_jsonable(fields))
    return base
