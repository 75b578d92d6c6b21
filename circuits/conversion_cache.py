"""The conversion cache: a Hugging Face checkpoint's circuitstat-format conversion, read back checked.

An entry is a circuitstat model directory under ``<cache>/converted/<key>`` (circuitstat.circuits.cache keys
it by the checkpoint files' identity and the dtype) with ``SEAL.json`` (circuitstat.circuits.cache.seal_conversion).
It is used only when it is no link, its seal is its own and its files match it (re-hashed when
their identity changed), and the weight hash its config.json recorded equals the memo's of the
checkpoint (or the hash computed from the loaded weights); anything else is removed and the
checkpoint converted again: a cache entry is never trusted on its name alone (docs/integrity.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .model import CircuitModel


def load_conversion(converted: Path | None, device, dtype, allow_large: bool,
                    memo: Callable[[CircuitModel], object] | None = None) -> CircuitModel | None:
    """The cached conversion in ``converted`` in its stored dtype (or ``dtype``) with the weight-hash
    memo ``memo(model)`` attached, or None when there is none or it fails a check (then it is removed
    and the checkpoint is converted again)."""
    import torch

    from circuitstat.core.integrity import file_identity, remove_entry

    from .cache import check_conversion
    from .loading import _load_own, check_recorded_weight_hash, read_json_object

    if converted is None or not (converted.exists() or converted.is_symlink()):
        return None
    try:
        check_conversion(converted)
        before = file_identity(converted / "model.safetensors")
        doc = read_json_object(converted / "config.json", "config.json")
        stored = doc.get("meta", {}).get("dtype")
        as_dtype = dtype or getattr(torch, str(stored).removeprefix("torch."), None)
        if not isinstance(as_dtype, torch.dtype):
            raise ValueError("the cached conversion records no dtype")
        model, stored_dtype = _load_own(converted, doc, device, as_dtype, allow_large)
        if file_identity(converted / "model.safetensors") != before:
            raise ValueError("the entry changed while it was read")
        if memo is not None:
            model.use_weight_hash_memo(memo(model))
        check_recorded_weight_hash(model, doc, stored_dtype, converted / "model.safetensors")
    except Exception:  # noqa: BLE001 - a damaged, linked or foreign entry: drop it, convert again
        remove_entry(converted)
        return None
    model.meta = {}  # as a fresh conversion: nothing but the weights comes from the cache
    return model


def save_conversion(model: CircuitModel, converted: Path) -> None:
    """Write ``model`` (before its tokenizer is attached) as the cached conversion with its seal,
    atomically: a temporary directory renamed into place. A cache that cannot be written (a full or
    read-only disk: OSError, or safetensors' own error) or reached only through a link is skipped."""
    import shutil
    import tempfile

    from .cache import seal_conversion, writable_below

    if converted.exists() or converted.is_symlink() or not writable_below(converted.parent):
        return
    try:
        converted.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=converted.parent, prefix=".tmp-"))
    except OSError:
        return
    try:
        model.save(tmp, meta={"dtype": str(model.dtype)})  # the stored dtype, read back by load_conversion
        seal_conversion(tmp, key=converted.name)  # sealed before it appears: readers never see it unsealed
        tmp.rename(converted)  # renaming the directory keeps its files' identities
    except Exception:  # noqa: BLE001 - safetensors raises SafetensorError (not OSError) on a full disk
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
