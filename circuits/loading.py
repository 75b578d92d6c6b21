"""Model sources: local HF directories, the local HF cache, ``random:ARCH?...`` specs, own models.

Nothing here touches the network: hub ids resolve only from the local cache.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qsl

import torch

from .convert import SUPPORTED, from_hf
from .errors import InputError, UnsupportedArchitectureError
from .model import CircuitModel, ModelConfig

# HF defaults for these families describe multi-billion-parameter models; random: specs start
# from small shapes instead (every key can still be overridden in the spec).
_SMALL = {
    "gpt_neox": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                     vocab_size=50304, max_position_embeddings=2048),
    "llama": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                  intermediate_size=688, vocab_size=32000, max_position_embeddings=2048),
    "qwen2": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                  intermediate_size=688, vocab_size=32000, max_position_embeddings=2048),
    "gpt2": {},
}


def _parse_value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_random_spec(source: str) -> tuple[str, dict, int]:
    """(arch, config overrides, seed) from ``random:ARCH?key=value&...``."""
    body = source[len("random:"):]
    arch, _, query = body.partition("?")
    arch = arch.strip().lower()
    if arch not in _SMALL:
        raise UnsupportedArchitectureError(
            f"unknown architecture {arch!r} in {source!r}; use random:ARCH with ARCH one of {', '.join(SUPPORTED)}"
        )
    values: dict = {}
    if query:
        for item in query.split("&"):
            if "=" not in item or not item.split("=", 1)[0]:
                raise InputError(f"malformed random: spec {source!r}: expected key=value pairs joined by '&', got {item!r}")
        values = {k: _parse_value(v) for k, v in parse_qsl(query, keep_blank_values=True)}
    seed = values.pop("seed", 0)
    if not isinstance(seed, int):
        raise InputError(f"seed in {source!r} must be an integer, got {seed!r}")
    return arch, values, seed


def random_hf_model(source: str):
    """A Hugging Face model with random weights built from a ``random:`` spec, in eval mode."""
    import transformers

    arch, values, seed = parse_random_spec(source)
    config_cls = transformers.AutoConfig.for_model(arch).__class__
    base = dict(_SMALL[arch])
    base.update(values)
    valid = set(config_cls().to_dict())
    unknown = [k for k in values if k not in valid and not hasattr(config_cls(), k)]
    if unknown:
        raise InputError(
            f"unknown config keys {unknown} for {arch} in {source!r}; see transformers.{config_cls.__name__}"
        )
    vocab = base.get("vocab_size", getattr(config_cls(), "vocab_size", None))
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        # Special ids from the family's default vocabulary may not exist in a smaller one.
        default = getattr(config_cls(), key, None)
        if key not in values and isinstance(default, int) and vocab is not None and default >= vocab:
            base[key] = vocab - 1
    config = config_cls(**base)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.eval()


def load_hf(source: str):
    """The Hugging Face model behind a source (random spec, local dir or cached hub id), eval mode."""
    import transformers

    if source.startswith("random:"):
        return random_hf_model(source)
    path = Path(source).expanduser()
    kwargs = dict(dtype=torch.float32, attn_implementation="eager")
    if path.is_dir():
        if not (path / "config.json").exists():
            raise InputError(f"{source} has no config.json; point to a Hugging Face model directory")
        return transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, **kwargs).eval()
    if "/" in source and not path.exists() and not source.startswith((".", "/", "~")):
        try:
            return transformers.AutoModelForCausalLM.from_pretrained(source, local_files_only=True, **kwargs).eval()
        except OSError:
            raise InputError(
                f"{source!r} is not a local directory and is not in the local Hugging Face cache; "
                "download it on a machine with network access and pass its directory"
            ) from None
    raise InputError(f"model source {source!r} not found: pass a model directory, a cached hub id or random:ARCH?...")


def _load_own(path: Path, device, dtype) -> CircuitModel:
    from safetensors.torch import load_file

    doc = json.loads((path / "config.json").read_text())
    cfg = ModelConfig.from_dict(doc["config"])
    model = CircuitModel(cfg)
    model.load_state_dict(load_file(str(path / "model.safetensors")), strict=True)
    model.meta = doc.get("meta", {})
    return model.to(device=device, dtype=dtype or torch.float32).eval().requires_grad_(False)


def _attach_tokenizer(model: CircuitModel, source: str) -> None:
    try:
        from .tokenizers import load_tokenizer
    except ImportError:  # tokenizers module not present in a stripped install
        return
    try:
        model.tokenizer = load_tokenizer(source)
    except (InputError, OSError, ValueError):
        model.tokenizer = None


def load_model(source: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> CircuitModel:
    """A CircuitModel from a model directory, a cached hub id, a circuitstat model or ``random:ARCH?...``."""
    source = str(source)
    path = Path(source).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        doc = json.loads((path / "config.json").read_text())
        if doc.get("format") == "circuitstat":
            model = _load_own(path, device, dtype)
            model.source = str(path.resolve())
            _attach_tokenizer(model, str(path))
            return model
    if source.startswith("random:"):
        hf = load_hf(source)
        model = from_hf(hf, dtype=dtype or torch.float32, device=device)
        model.source = source
        if model.cfg.vocab_size == 50257:
            _attach_tokenizer(model, "gpt2")
        return model
    hf = load_hf(source)
    model = from_hf(hf, dtype=dtype, device=device)
    model.source = source
    _attach_tokenizer(model, source)
    return model
