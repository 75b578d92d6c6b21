"""What a job will cost, priced at submission from the model sources' configs alone (no torch, nothing built).

The API process never imports torch, so a model's size is read here from what names it: a ``random:ARCH?...``
source's keys over its family's default shape (:mod:`circuitstat.circuits.families`, the shapes the loader builds
from), or an operator's named model's ``config.json``. The
count is :func:`circuitstat.circuits.own_format.circuit_parameters`'s arithmetic (an upper bound for every
supported family) and the memory the loader's estimate (float32, held twice while loading). A source this cannot
price (a zoo model: the operator's own recipes, or an unreadable config) is priced by the worker from its skeleton
before any weight is read (circuitstat.pipelines.service.runner), so no job escapes the limits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from circuitstat.circuits.families import BYTES_PER_PARAM, GPT2_CONFIG, SMALL
from circuitstat.circuits.model_source import Random, Served, parse_source

from .problems import Problem

GPT2_KEYS = ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions", "n_inner")
HF_KEYS = ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size", "max_position_embeddings",
           "intermediate_size")
OWN_KEYS = ("n_layers", "n_heads", "d_model", "vocab_size", "n_ctx", "d_mlp")
FAMILY_KEYS = {"gptj": GPT2_KEYS, "falcon": ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size",
                                            "max_position_embeddings", "ffn_hidden_size")}
"""The families whose shape keys are not HF_KEYS (as circuitstat.circuits.loading.check_hf_config reads them)."""
TWO_MATRIX_MLP = ("gpt_neox", "gptj", "falcon", "phi")
"""Families whose MLP is two matrices (in and out), not a gated three."""


@dataclass(frozen=True)
class Shape:
    """A transformer's sizes: layers, heads, width, head width, MLP width, vocabulary, context."""

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_mlp: int
    vocab: int
    n_ctx: int
    mlp_matrices: int = 3  # a gated MLP's 3 (the uniform form's bound); GPT-2's and NeoX's MLPs have 2
    experts: int = 0  # parameters a mixture-of-experts block adds (:func:`moe_parameters`)

    @property
    def parameters(self) -> int:
        """The parameter count (circuit_parameters' uniform form, an upper bound for every family, with the MLP's
        own number of matrices)."""
        d, h, e, f = self.d_model, self.n_heads, self.d_head, self.d_mlp
        attn = 4 * h * d * e + 3 * h * e + d
        mlp = self.mlp_matrices * d * f + f + d
        return (self.n_layers * (attn + mlp + 4 * d) + 2 * self.vocab * d + self.n_ctx * d + self.vocab + 2 * d
                + self.experts)

    @property
    def memory_bytes(self) -> int:
        """The memory loading it takes (float32, held twice)."""
        return self.parameters * BYTES_PER_PARAM


def _int(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.isdigit():
        return int(value) or None
    return None


def moe_parameters(n_layers: int, d_model: int, experts: int, d_expert: int, d_shared: int = 0) -> int:
    """Parameters a mixture-of-experts block adds per model beyond one dense MLP per layer, as an upper bound
    (every layer sparse): every expert's three matrices and biases, the router, a shared expert and its gate
    (circuitstat.circuits.engine.moe holds every expert, whichever a token uses)."""
    D, F = d_model, d_expert
    return n_layers * (experts * (3 * D * F + 2 * F + D) + experts * (D + 1) + 3 * D * d_shared + D)


def _experts(values: dict, L: int, D: int, F: int) -> int:
    """moe_parameters of an HF config (``num_local_experts`` or ``num_experts``) or an own-format ``moe``; 0 if dense."""
    moe = values.get("moe")
    if isinstance(moe, dict):
        X, Fe, S = (_int(moe.get(k)) or 0 for k in ("experts", "d_expert", "d_shared"))
        return moe_parameters(L, D, X, Fe, S)
    X = _int(values.get("num_local_experts")) or _int(values.get("num_experts")) or 0
    if not X:
        return 0
    Fe = _int(values.get("moe_intermediate_size")) or F
    return moe_parameters(L, D, X, Fe, _int(values.get("shared_expert_intermediate_size")) or 0)


def _shape(values: dict, keys: tuple[str, ...], mlp_matrices: int = 3) -> Shape | None:
    """The Shape of a config ``values`` read under ``keys`` (layers, heads, width, vocab, context, MLP)."""
    L, H, D, V, P = (_int(values.get(k)) for k in keys[:5])
    if None in (L, H, D, V, P):
        return None
    F = _int(values.get(keys[5])) or 4 * D
    E = _int(values.get("head_dim")) or _int(values.get("d_head")) or max(1, D // H)
    return Shape(L, H, D, E, F, V, P, mlp_matrices, _experts(values, L, D, F))


def random_shape(source: "str | Random") -> Shape | None:
    """The Shape a ``random:ARCH?key=value&...`` source builds (InputError where the source grammar refuses it;
    None for keys that give no positive sizes, which the worker refuses)."""
    src = source if isinstance(source, Random) else parse_source(source)
    if not isinstance(src, Random):
        return None
    if src.arch == "gpt2":
        return _shape({**GPT2_CONFIG, **src.values}, GPT2_KEYS, 2)
    return _shape({**SMALL[src.arch], **src.values}, FAMILY_KEYS.get(src.arch, HF_KEYS),
                  2 if src.arch in TWO_MATRIX_MLP else 3)


def directory_shape(path: str | Path) -> Shape | None:
    """The Shape in a model directory's config.json (circuitstat's format or a Hugging Face one; None if unread)."""
    try:
        doc = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    if doc.get("format") == "circuitstat":
        cfg = doc.get("config")
        return _shape(cfg, OWN_KEYS, 2 if cfg.get("mlp", "standard") == "standard" else 3) if isinstance(cfg, dict) \
            else None
    if doc.get("model_type") == "gpt2":
        return _shape(doc, GPT2_KEYS, 2)
    return _shape(doc, HF_KEYS, 2 if doc.get("model_type") == "gpt_neox" else 3)


def source_shape(source: str, served: dict[str, str]) -> Shape | None:
    """The Shape of a job's model source (``random:...`` or ``served:NAME``); None when it cannot be priced here
    (InputError where the source grammar, circuitstat.circuits.model_source, refuses it)."""
    src = parse_source(source)
    if isinstance(src, Random):
        return random_shape(src)
    if isinstance(src, Served) and src.name in served:
        return directory_shape(served[src.name])
    return None


def check_job_cost(sources: list[str], quotas, served: dict[str, str]) -> None:
    """None; a 422 Problem naming the limit (and the config key) when the job's models are more, or larger, than
    ``quotas`` allow: checked at submission, before a job exists or anything is built."""
    if len(sources) > quotas.max_models_per_job:
        raise Problem(422, f"the spec names {len(sources)} models, above the limit of {quotas.max_models_per_job} "
                           "models per job (max_models_per_job); split it into several jobs or ask the operator")
    for source in dict.fromkeys(sources):
        shape = source_shape(source, served)
        if shape is None:
            continue  # priced by the worker from its skeleton, before any weight is read
        check_model_size(source, shape.parameters, shape.memory_bytes, quotas)


def check_model_size(source: str, parameters: int, memory_bytes: float, quotas) -> None:
    """None; a 422 Problem when one model has more parameters or needs more memory than ``quotas`` allow."""
    shown = source if len(source) <= 80 else source[:77] + "..."
    if parameters > quotas.max_parameters:
        raise Problem(422, f"model {shown} has about {parameters:,} parameters, above the limit of "
                           f"{quotas.max_parameters:,} per model (max_parameters); use a smaller model or ask the "
                           "operator")
    if memory_bytes > quotas.max_memory_bytes:
        raise Problem(422, f"model {shown} needs about {memory_bytes / 2**30:.1f} GiB of memory to load, above the "
                           f"limit of {quotas.max_memory_bytes / 2**30:.1f} GiB (max_memory_bytes); use a smaller "
                           "model or ask the operator")
