"""A model's skeleton: its CircuitModel on the meta device, built from the config alone (no weight read
or allocated), with its tokenizer. What ``attribute --plan`` prices a run on: shapes, the component
graph and the task need no weights, so a config of any size can be planned (circuitstat.circuits.plan)."""

from __future__ import annotations

from pathlib import Path

import torch

from circuitstat.core.errors import InputError
from .model import CircuitModel


def load_skeleton(source: str | Path, *, allow_pickle: bool = False, allow_large: bool = False,
                  name: str | None = None, weights: bool = True) -> CircuitModel:
    """The CircuitModel of ``source`` (as :func:`circuitstat.circuits.loading.load_model` accepts) on the meta device,
    after every check loading would make that needs no weights; its tokenizer attached. ``name``: the source as
    the user named it, recorded as the model's source (circuitstat.pipelines.sources). ``weights=False``: a HF
    directory with only config.json (and a tokenizer) is accepted, as ``attribute --plan`` needs no weights; by
    default a directory without weights is refused here, as loading it would be."""
    from .convert import from_hf
    from .loading import GPT2_VOCAB, _attach_tokenizer, _validate_hf_dir, random_hf_model, resolve_model_dir
    from .own_format import check_own_config, read_json_object

    source = str(source)
    if source.startswith("random:"):
        with torch.device("meta"):
            hf = random_hf_model(source, allow_large=allow_large)
        model = from_hf(hf, device="meta")
        model.source = name or source
        if model.cfg.vocab_size == GPT2_VOCAB:
            _attach_tokenizer(model, "gpt2")
        return model
    path = resolve_model_dir(source)
    if path is None:
        raise InputError(f"model source {source!r} not found: pass a model directory, a cached hub id "
                         "or random:ARCH?...")
    doc = read_json_object(path / "config.json", "config.json") if (path / "config.json").is_file() else {}
    if doc.get("format") == "circuitstat":
        cfg = check_own_config(doc.get("config"), str(path / "config.json"), allow_large)
        with torch.device("meta"):
            model = CircuitModel(cfg)
        meta = doc.get("meta", {})
        model.meta = meta if isinstance(meta, dict) else {}
        model.source = name or str(path.resolve())
        model.directory = path.resolve()
    else:
        import transformers

        _validate_hf_dir(path, allow_pickle=allow_pickle, allow_large=allow_large, weights=weights)
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
        with torch.device("meta"):
            hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                               trust_remote_code=False)
        model = from_hf(hf, device="meta")
        model.source = name or source
        model.directory = path.resolve()
    _attach_tokenizer(model, str(path))
    return model
