"""circuitstat's own model directories (``config.json`` with ``format: circuitstat`` + ``model.safetensors``),
and the file checks every loader shares: JSON configs read without quoting them, positive sizes, parameter counts
and safetensors shapes read without loading a tensor.

circuitstat.circuits.loading (models from any source) and circuitstat.circuits.conversion_cache (cached
conversions, stored in this format) both read through here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from circuitstat.core.errors import InputError

from .limits import check_bytes
from .model import CircuitModel, ModelConfig

__all__ = ["MAX_CONFIG_BYTES", "check_own_config", "check_recorded_weight_hash", "circuit_parameters", "load_own",
           "positive_int", "read_json_object", "safetensors_shapes"]

MAX_CONFIG_BYTES = 4 * 2**20  # a config.json is a few KiB; larger ones are not read


def positive_int(value, key: str, where: str, optional: bool = False) -> int | None:
    """``value`` as an int after checking that it is a positive integer (not a bool or float)."""
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        kind = type(value).__name__
        shown = repr(value) if isinstance(value, (int, float)) else f"a {kind}"
        raise InputError(f"{where}: {key} must be a positive integer, got {shown}; fix {key}")
    return value


def circuit_parameters(n_layers: int, n_heads: int, d_model: int, d_head: int, d_mlp: int, vocab: int,
                       n_ctx: int) -> int:
    """Parameters of a model of these sizes in the uniform form (K/V ungrouped, a gated MLP's 3
    matrices, embedding and unembedding separate): an upper bound for every supported family."""
    attn = 4 * n_heads * d_model * d_head + 3 * n_heads * d_head + d_model
    mlp = 3 * d_model * d_mlp + d_mlp + d_model
    return n_layers * (attn + mlp + 4 * d_model) + 2 * vocab * d_model + n_ctx * d_model + vocab + 2 * d_model


def check_own_config(data: dict, where: str, allow_large: bool) -> ModelConfig:
    """A circuitstat ModelConfig from ``data`` after type and size checks."""
    if not isinstance(data, dict):
        raise InputError(f"{where}: 'config' must be a JSON object; the directory is not a circuitstat model")
    ints = ("n_layers", "n_heads", "d_model", "d_head", "vocab_size", "n_ctx")
    L, H, D, E, V, P = (positive_int(data.get(k), k, where) for k in ints)
    d_mlp = data.get("d_mlp", 0)
    if isinstance(d_mlp, bool) or not isinstance(d_mlp, int) or d_mlp < 0:
        raise InputError(f"{where}: d_mlp must be a non-negative integer; fix d_mlp")
    for key in ("n_kv_heads", "rotary_dim"):
        positive_int(data.get(key), key, where, optional=True)
    for key in ("norm_eps", "rotary_base"):
        v = data.get(key, 1.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise InputError(f"{where}: {key} must be a non-negative number; fix {key}")
    for key in ("parallel", "tied_embeddings"):
        if not isinstance(data.get(key, False), bool):
            raise InputError(f"{where}: {key} must be true or false; fix {key}")
    for key in ("norm", "positional", "mlp", "act", "arch"):
        if not isinstance(data.get(key, ""), str):
            raise InputError(f"{where}: {key} must be a string; fix {key}")
    try:
        cfg = ModelConfig.from_dict(data)  # checks every field (a mixture-of-experts block's too); allocates nothing
    except InputError:
        raise
    except (TypeError, ValueError):
        raise InputError(f"{where}: a model config value has the wrong type; fix config.json") from None
    n = circuit_parameters(L, H, D, E, d_mlp, V, P)
    if cfg.moe is not None:  # every expert is held (circuitstat.circuits.engine.moe)
        from .engine.moe import mlp_params

        n += sum(mlp_params(cfg, layer) for layer in range(L))
    check_bytes(n * 4, f"{where} ({n:,} parameters)", allow_large=allow_large)
    return cfg


def read_json_object(path: Path, what: str) -> dict:
    """The JSON object in ``path``; InputError (never quoting the file) when it is not one."""
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise InputError(f"{path}: {what} is {size:,} bytes, too large for a config; check the file")
        doc = json.loads(path.read_bytes())
    except InputError:
        raise
    except (ValueError, UnicodeDecodeError):
        raise InputError(f"{path}: {what} is not valid JSON; replace it with the model's config") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read {what} ({e.strerror or type(e).__name__})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: {what} must hold a JSON object; replace it with the model's config")
    return doc


def safetensors_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from safetensors headers (no weight is read); InputError if corrupt."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():
                    shapes[k] = tuple(h.get_slice(k).get_shape())
        except Exception:  # noqa: BLE001 - safetensors raises its own error types for every corruption
            raise InputError(f"{f}: not a valid safetensors file (truncated or corrupt); "
                             "download the weights again") from None
    return shapes


def load_own(path: Path, doc: dict, device, dtype, allow_large: bool) -> tuple[CircuitModel, "torch.dtype | None"]:
    """(the model in a circuitstat model directory (config.json with format 'circuitstat' +
    model.safetensors), the one dtype its weights were stored in, or None when they mix dtypes)."""
    from safetensors.torch import load_file

    cfg = check_own_config(doc.get("config"), str(path / "config.json"), allow_large)
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise InputError(f"{path}: no model.safetensors; the model directory is incomplete")
    shapes = safetensors_shapes([weights])
    with torch.device("meta"):  # shapes only: nothing is allocated
        expected = {k: tuple(v.shape) for k, v in CircuitModel(cfg).state_dict().items()}
    if shapes != expected:
        bad = sorted(set(shapes) ^ set(expected)) or sorted(k for k in shapes if shapes[k] != expected[k])
        raise InputError(f"{weights}: the weights do not match config.json (first difference: {bad[0]}); "
                         "the config and the weights do not belong together")
    state = load_file(str(weights))
    stored = {t.dtype for t in state.values()}
    model = CircuitModel.from_state_dict(cfg, state)
    meta = doc.get("meta", {})
    model.meta = meta if isinstance(meta, dict) else {}
    model = model.to(device=device, dtype=dtype or torch.float32).eval().requires_grad_(False)
    return model, (stored.pop() if len(stored) == 1 else None)


def check_recorded_weight_hash(model: CircuitModel, doc: dict, stored_dtype, where: Path) -> None:
    """None when the weight hash a circuitstat directory's config.json recorded at saving equals the
    model's (from a memo bound to the files, or computed here), or when they cannot be compared (the
    weights were cast on loading); IntegrityError naming the file otherwise."""
    from circuitstat.core.integrity import IntegrityError

    recorded = doc.get("weight_hash")
    if not isinstance(recorded, str) or stored_dtype != model.dtype:
        return
    if model.weight_hash() != recorded:
        raise IntegrityError(f"{where}: the weights do not match the weight hash recorded in config.json when "
                             "they were saved (edited or damaged since); restore the model directory or save it again")
