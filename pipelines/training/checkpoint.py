"""Training checkpoints: safetensors tensors + a JSON header, never a pickle.

A checkpoint lies in an output directory or the shared cache, where anyone may have put a
file, so reading one must never run code. It is one safetensors file (written atomically):
tensors ``model/NAME``, ``optim/PARAM/KEY``, ``rng/...`` and ``step``, and in the header's metadata one
JSON document (format, version, recipe_hash, seed, data_hash, step, log, counters, optimizer
param groups, the numpy and Python RNG states). The JSON is checked against the recipe before
any tensor is read.

Integrity (docs/integrity.md): the JSON carries ``tensors_sha256``, the digest of every tensor's
name, dtype, shape and values (circuitstat.core.integrity.digest_tensors, the weight hash's scheme), and
``sha256``, the digest of the JSON itself; the file is read once, without following a link and
only if it is a regular file, and both digests are compared before anything is restored. An edited
value (``W_E`` x 10 with the header kept), an edited counter, a truncated or swapped file is refused
with an InputError naming it; version 2 checkpoints, which carry no digest, are refused too. A checkpoint of another recipe, seed or data is ignored with a warning and
training starts again from step 0 (the same as a finished model of another recipe in that
directory: it is retrained); a file that is not a circuitstat checkpoint is refused (InputError)
rather than overwritten. A legacy pickle ``checkpoint.pt`` is never opened.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any, TYPE_CHECKING

import numpy as np

from circuitstat.core.errors import InputError

if TYPE_CHECKING:
    from .recipe import TrainRecipe

__all__ = ["CHECKPOINT", "LEGACY_CHECKPOINT", "FORMAT_VERSION", "CHECKPOINT_FORMAT", "read_checkpoint_info"]

CHECKPOINT = "checkpoint.safetensors"
LEGACY_CHECKPOINT = "checkpoint.pt"  # pickle format of older versions: never loaded
FORMAT_VERSION = 3  # 3: the JSON carries the digests of the tensors and of itself
CHECKPOINT_FORMAT = "circuitstat-train-checkpoint"
_META_KEY = "circuitstat"
MAX_HEADER = 100 * 2**20  # safetensors' own limit on the JSON header


def _rng_state() -> tuple[dict, dict]:
    """(tensors, JSON) of the torch, numpy and Python RNG states."""
    import torch

    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    tensors = {"rng/torch": torch.get_rng_state(), "rng/numpy": torch.from_numpy(keys.astype(np.int64))}
    if torch.cuda.is_available():
        for i, st in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = st
    doc = {"numpy": [name, int(pos), int(has_gauss), float(cached)],
           "python": [version, list(internal), gauss_next]}
    return tensors, doc


def _set_rng_state(tensors: dict, doc: dict) -> None:
    import torch

    torch.set_rng_state(tensors["rng/torch"].cpu())
    name, pos, has_gauss, cached = doc["numpy"]
    np.random.set_state((name, tensors["rng/numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = doc["python"]
    random.setstate((version, tuple(internal), gauss_next))
    cuda = [tensors[k].cpu() for k in sorted(k for k in tensors if k.startswith("rng/cuda/"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def tensors_digest(tensors: dict) -> str:
    """The digest of named tensors (sorted by name): name, dtype, shape and the bytes of every value."""
    import torch

    from circuitstat.core.integrity import digest_tensors

    def items():
        for name in sorted(tensors):
            t = tensors[name].detach().cpu().contiguous()
            data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            yield name, str(t.dtype), tuple(t.shape), data

    return digest_tensors(items())


def _doc_digest(doc: dict) -> str:
    from circuitstat.core.integrity import digest_bytes

    body = {k: v for k, v in doc.items() if k != "sha256"}
    return digest_bytes(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def save_checkpoint(path: Path, model: Any, opt: Any, info: dict) -> None:
    """Write model, optimizer and RNG state plus ``info`` (JSON-able) atomically to ``path``, with the
    digests of the tensors and of the JSON."""
    import torch
    from safetensors.torch import save

    from circuitstat.core.atomic import atomic_write

    tensors = {f"model/{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    osd = opt.state_dict()
    scalars: dict = {}
    for pid, st in osd["state"].items():
        for key, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"optim/{pid}/{key}"] = v.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(pid), {})[key] = v
    rng_tensors, rng_doc = _rng_state()
    tensors.update(rng_tensors)
    # the step also as a tensor: torch.load(CHECKPOINT)["step"] works too (torch reads safetensors)
    tensors["step"] = torch.tensor(int(info["step"]), dtype=torch.int64)
    doc = {**info, "format": CHECKPOINT_FORMAT, "format_version": FORMAT_VERSION, "rng": rng_doc,
           "optimizer": {"param_groups": osd["param_groups"], "scalars": scalars},
           "tensors_sha256": tensors_digest(tensors)}
    doc = json.loads(json.dumps(doc))  # the digest covers the JSON as it is read back (tuples become lists)
    doc["sha256"] = _doc_digest(doc)
    data = save(tensors, metadata={_META_KEY: json.dumps(doc)})
    with atomic_write(path) as f:
        f.write(data)


def _not_a_checkpoint(path: Path) -> InputError:
    return InputError(f"{path} is not a circuitstat training checkpoint (corrupt, foreign or linked file); "
                      "delete it to train from step 0, or choose another --out")


def _header_doc(head: bytes, path: Path) -> dict:
    """The checkpoint JSON from a safetensors header's metadata; InputError when it is not ours."""
    try:
        meta = json.loads(head.decode("utf-8")).get("__metadata__") or {}
        doc = json.loads(meta[_META_KEY])
        ok = isinstance(doc, dict) and doc.get("format") == CHECKPOINT_FORMAT
    except Exception:  # noqa: BLE001 - every kind of corrupt or foreign file is the same bad input
        ok = False
    if not ok:
        raise _not_a_checkpoint(path)
    if doc.get("format_version") != FORMAT_VERSION:
        raise InputError(f"{path}: checkpoint format version {doc.get('format_version')!r} is not "
                         f"{FORMAT_VERSION} (older versions carry no digest of their values); delete it to train "
                         "from step 0")
    if doc.get("sha256") != _doc_digest(doc):
        raise InputError(f"{path}: the checkpoint's header does not match the digest recorded when it was written "
                         "(edited or damaged); delete it to train from step 0")
    return doc


def read_checkpoint_info(path: str | os.PathLike) -> dict:
    """The JSON part of a training checkpoint (step, log, hashes, ...), its own digest checked; reads no tensor.

    Raises InputError when ``path`` is not a circuitstat training checkpoint (or is a link, a device,
    or was edited).
    """
    from circuitstat.core.integrity import IntegrityError, open_regular

    path = Path(path)
    try:
        with open_regular(path) as f:
            n = int.from_bytes(f.read(8), "little")
            head = f.read(n) if 0 < n <= MAX_HEADER else b""
    except (OSError, IntegrityError):
        raise _not_a_checkpoint(path) from None
    return _header_doc(head, path)


def restore_checkpoint(path: Path, doc: dict, model: Any, opt: Any, recipe: "TrainRecipe", device: Any) -> dict:
    """Load a checked checkpoint into ``model``, ``opt`` and the RNGs; returns its counters
    (step, log, elapsed_s, run_loss, run_n, cpu_s). InputError when anything in it does not fit."""
    try:
        return _restore(path, doc, model, opt, recipe, device)
    except InputError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError):
        raise InputError(f"{path}: the checkpoint does not fit this recipe's model and optimizer (edited or "
                         "corrupt); delete it to train from step 0") from None


def _fits(shapes: dict[str, tuple[int, ...]], model, opt) -> bool:
    """Whether a checkpoint's tensor shapes are exactly the model's plus Adam(W) state of its parameters."""
    model_shapes = {f"model/{k}": tuple(v.shape) for k, v in model.state_dict().items()}
    if {k: v for k, v in shapes.items() if k.startswith("model/")} != model_shapes:
        return False
    params = [tuple(p.shape) for g in opt.param_groups for p in g["params"]]
    state_shape = {"step": lambda s: (), "exp_avg": lambda s: s, "exp_avg_sq": lambda s: s}
    for k, shape in shapes.items():
        if k.startswith(("model/", "rng/")) or (k == "step" and shape == ()):
            continue
        parts = k.split("/")
        if (len(parts) != 3 or parts[0] != "optim" or not parts[1].isdigit() or int(parts[1]) >= len(params)
                or parts[2] not in state_shape or state_shape[parts[2]](params[int(parts[1])]) != shape):
            return False
    return True


def _read_tensors(path: Path, doc: dict, model, opt) -> dict:
    """The checkpoint's tensors, read once from the regular file (no link followed), after checking their
    shapes against the model and optimizer and that the file's header is ``doc``'s and its values
    match ``tensors_sha256``; InputError naming the file otherwise."""
    from safetensors.torch import load

    from circuitstat.core.integrity import IntegrityError, read_regular

    expected = 16 * sum(v.numel() for v in model.state_dict().values()) + 64 * 2**20  # weights, 2 moments, RNGs
    try:
        data = read_regular(path, max_bytes=expected)
    except (OSError, IntegrityError):
        raise _not_a_checkpoint(path) from None
    n = int.from_bytes(data[:8], "little")
    if not 0 < n <= min(MAX_HEADER, len(data) - 8) or _header_doc(data[8:8 + n], path) != doc:
        raise InputError(f"{path}: the checkpoint changed while it was read; rerun to resume")
    try:
        tensors = load(data)
    except Exception:  # noqa: BLE001 - safetensors' own error for a truncated or corrupt file
        raise InputError(f"{path}: the checkpoint's tensors cannot be read (truncated or corrupt); delete it to "
                         "train from step 0") from None
    if not _fits({k: tuple(v.shape) for k, v in tensors.items()}, model, opt):
        raise InputError(f"{path}: the checkpoint's tensors do not fit the recipe's model; delete it to "
                         "train from step 0")
    if tensors_digest(tensors) != doc.get("tensors_sha256"):
        raise InputError(f"{path}: the checkpoint's tensors do not match the digest recorded when it was written "
                         "(edited or damaged); delete it to train from step 0")
    return tensors


def _restore(path: Path, doc: dict, model, opt, recipe: "TrainRecipe", device) -> dict:
    tensors = _read_tensors(path, doc, model, opt)
    counters = {"step": int(doc["step"]), "log": list(doc["log"]), "elapsed_s": float(doc["elapsed_s"]),
                "run_loss": float(doc["run_loss"]), "run_n": int(doc["run_n"]), "cpu_s": float(doc.get("cpu_s", 0.0))}
    if (not 0 < counters["step"] < recipe.steps or int(tensors["step"]) != counters["step"]
            or not all(isinstance(r, dict) for r in counters["log"])):
        raise ValueError("step or log out of range")
    model.load_state_dict({k[len("model/"):]: v.to(device) for k, v in tensors.items() if k.startswith("model/")})
    state: dict = {}
    for k, v in tensors.items():
        if k.startswith("optim/"):
            _, pid, key = k.split("/", 2)
            state.setdefault(int(pid), {})[key] = v.to(device)
    opt_doc = doc["optimizer"]
    fresh_groups = opt.state_dict()["param_groups"]
    if len(opt_doc["param_groups"]) != len(fresh_groups):
        raise ValueError("parameter groups differ")
    # JSON turned tuples (betas) into lists: give every value the fresh group's type back
    groups = [{k: tuple(v) if isinstance(fresh.get(k), tuple) else v for k, v in saved.items()}
              for saved, fresh in zip(opt_doc["param_groups"], fresh_groups)]
    opt.load_state_dict({"state": state, "param_groups": groups})
    _set_rng_state({k: v for k, v in tensors.items() if k.startswith("rng/")}, doc["rng"])
    return counters


def resume_state(ck: Path, recipe: "TrainRecipe", seed: int, data_hash: str) -> dict | None:
    """The checkpoint's JSON when it is this run's (recipe, seed, data), else None (with a warning).

    Raises InputError for a file that is not a circuitstat checkpoint. A legacy pickle checkpoint
    next to it is never opened (unpickling can run code): it is reported and ignored.
    """
    import warnings

    legacy = ck.with_name(LEGACY_CHECKPOINT)
    if legacy.exists():
        warnings.warn(f"{legacy}: a pickle checkpoint is never loaded (unpickling can run code); "
                      "ignored, delete it", stacklevel=3)
    if not ck.exists():
        return None
    doc = read_checkpoint_info(ck)
    if (doc.get("recipe_hash"), doc.get("seed"), doc.get("data_hash")) != (recipe.content_hash, int(seed), data_hash):
        warnings.warn(f"{ck}: checkpoint of another recipe, seed or data; training starts from step 0 and "
                      "replaces it", stacklevel=3)
        return None
    return doc
