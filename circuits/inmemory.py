"""Models that already live in memory: a Hugging Face model object (and its tokenizer), the HF model
inside an nnsight ``LanguageModel``, or a CircuitModel. ``circuits.load_model(obj, tokenizer)`` lands here.

The weights are copied once into CircuitModel's uniform form (:func:`circuitstat.circuits.convert.from_hf`); the
object itself is never called and its hooks (nnsight's, or anyone's) play no part. A TransformerLens
``HookedTransformer`` is not a Hugging Face model and is refused with the way round: load the
checkpoint it was made from with ``transformers`` (TransformerLens's default weight processing,
``fold_ln``/``center_writing_weights``/``center_unembed``, rewrites the weights, so its state dict is
not the checkpoint's). docs/python-api.md has the recipes.
"""

from __future__ import annotations

from typing import Any

from circuitstat.core.errors import InputError

TL_RECIPE = ("a TransformerLens HookedTransformer is not a Hugging Face model, and its default weight processing "
             "(fold_ln, center_writing_weights, center_unembed) rewrites the checkpoint's weights; load the checkpoint "
             "it was made from with transformers, e.g. AutoModelForCausalLM.from_pretrained(PATH), and pass that: "
             "load_model(hf_model, tokenizer=tl_model.tokenizer) (docs/python-api.md)")


def _is_hf_model(obj: Any) -> bool:
    import torch

    config = getattr(obj, "config", None)
    return isinstance(obj, torch.nn.Module) and isinstance(getattr(config, "model_type", None), str)


def _unwrap(obj: Any) -> tuple[Any, Any]:
    """(the Hugging Face model in ``obj``, the tokenizer it carries or None): ``obj`` itself, or the HF
    model an nnsight LanguageModel wraps (its ``_model``, or ``model`` in older versions)."""
    if _is_hf_model(obj):
        return obj, None
    for attr in ("_model", "model"):
        inner = getattr(obj, attr, None)
        if inner is not None and _is_hf_model(inner):
            return inner, getattr(obj, "tokenizer", None)
    cfg = getattr(obj, "cfg", None)
    if hasattr(obj, "blocks") and hasattr(cfg, "d_vocab"):
        raise InputError(TL_RECIPE)
    raise InputError(f"load_model got a {type(obj).__name__}, which is neither a source (a path, a cached hub id, "
                     "random:ARCH?...) nor a Hugging Face causal LM (a transformers PreTrainedModel with a "
                     "config.model_type); pass one of those, or an nnsight LanguageModel")


def as_tokenizer(tokenizer: Any):
    """``tokenizer`` as circuitstat's tokenizer: a transformers tokenizer object is wrapped (HFTokenizer);
    a circuitstat tokenizer, a path or a name goes through circuitstat.circuits.tokenizers.load_tokenizer."""
    from .tokenizers import HFTokenizer, load_tokenizer

    if tokenizer is None:
        return None
    if hasattr(tokenizer, "encode") and hasattr(tokenizer, "convert_ids_to_tokens"):  # a transformers tokenizer
        return HFTokenizer(tokenizer)
    return load_tokenizer(tokenizer)


def model_from_memory(obj: Any, tokenizer: Any = None, *, device="cpu", dtype=None):
    """A CircuitModel with a copy of the weights of ``obj`` (a HF model, an nnsight LanguageModel or a
    CircuitModel) and ``tokenizer`` (default: the one an nnsight model carries; None: induction tasks only)."""
    from .convert import from_hf
    from .model import CircuitModel

    if isinstance(obj, CircuitModel):
        model = obj.to(device=device, dtype=dtype) if dtype is not None else obj.to(device=device)
        if tokenizer is not None:
            model.tokenizer = as_tokenizer(tokenizer)
        return model
    hf, carried = _unwrap(obj)
    if any(p.is_meta for p in hf.parameters()):
        raise InputError(f"the {type(hf).__name__}'s weights are not loaded (meta tensors); load them first "
                         "(nnsight: LanguageModel(..., dispatch=True), or run it once)")
    model = from_hf(hf, dtype=dtype, device=device)
    model.source = f"memory:{type(hf).__name__}:{getattr(hf.config, 'name_or_path', '') or hf.config.model_type}"
    model.tokenizer = as_tokenizer(tokenizer if tokenizer is not None else carried)
    return model


def require_circuit_model(model: Any, where: str) -> None:
    """None; InputError with the conversion to use when ``model`` is not a CircuitModel (a HF model object)."""
    from .model import CircuitModel

    if not isinstance(model, CircuitModel):
        raise InputError(f"{where} needs a CircuitModel, got a {type(model).__name__}: convert it first with "
                         "circuits.load_model(model, tokenizer) (a Hugging Face model, or an nnsight LanguageModel)")
