"""ModelConfig: the architecture of a CircuitModel, and the values each field allows."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from circuitstat.core.errors import InputError
from .moe_config import check_moe

#: ``rmsnorm``: Llama's (normalise in float32, cast, then scale by w); ``rmsnorm_f32w``: OLMo 2's
#: (scale by w in float32, then cast); ``rmsnorm_1p``: Gemma's (scale by 1 + w in float32, then cast).
#: The three agree in float32 except that Gemma's weight is stored as w with the scale 1 + w.
NORMS = ("layernorm", "rmsnorm", "rmsnorm_f32w", "rmsnorm_1p", "none")
RMS_NORMS = ("rmsnorm", "rmsnorm_f32w", "rmsnorm_1p")
POSITIONALS = ("learned", "rotary", "none")
MLPS = ("standard", "gated", "none")
#: per-head q/k RMSNorm over d_head (Qwen 3, Gemma 3), or over the whole projection (OLMo 2);
#: ``each_head``: over d_head with each head's own weights [H, d_head] (Cohere's use_qk_norm, StableLM's
#: qk_layernorm; K weights ungrouped).  Under ``norm="layernorm"`` q/k norms also have biases.
QK_NORMS = ("none", "head", "full", "each_head")
LAYER_TYPES = ("full_attention", "sliding_attention")
#: rotary frequency schedules (transformers' modeling_rope_utils); ``dynamic`` and ``longrope``
#: change with the sequence length, so prompts beyond ``rope_max_positions`` are refused.
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
ACTIVATIONS = {
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype norms, softmaxes, rotations and routers compute in: float32 for float32 and narrower (bf16 models
    accumulate in float32, as HF), float64 for a float64 model (float64 end to end)."""
    return torch.promote_types(dtype, torch.float32)


@dataclass
class ModelConfig:
    """Architecture of a CircuitModel; every supported family maps onto these fields.

    The fields after ``arch`` describe the families beyond GPT-2/NeoX/Llama 2 (all off by default):
    ``attn_scalar`` (Gemma's query_pre_attn_scalar: scores scaled by attn_scalar**-0.5 instead of
    d_head**-0.5), ``attn_softcap`` / ``logit_softcap`` (tanh soft-capping of attention scores and of
    the final logits), ``embed_scale`` (Gemma's √d_model, cast to the weights' dtype), ``pre_norm``
    (False: no norm before attention and MLP, OLMo 2), ``post_norm`` (a norm on the attention and the
    MLP output before the residual add: Gemma's sandwich, OLMo 2), ``qk_norm`` (see QK_NORMS),
    ``sliding_window`` with per-layer ``layer_types``, ``rope`` (the rotary schedule of full-attention
    layers: {"rope_type": ..., its parameters}) and ``rope_local`` (sliding layers' own schedule with
    its ``rope_theta``, Gemma 3), ``rope_max_positions`` (longest prompt whose rotary frequencies
    are the ones implemented, for length-dependent schedules), and Granite's ``attn_multiplier`` (scores
    times it, in place of d_head**-0.5), ``embed_multiplier`` (token embeddings times it, a Python scalar as
    in GraniteModel) and ``logits_scaling`` (logits divided by it); ``rope_layers``: per layer whether its queries
    and keys are rotated (SmolLM3's NoPE layers have no positional encoding at all; None: every layer);
    ``clip_qkv``: every query, key and value clamped to [-clip_qkv, clip_qkv] right after its projection (OLMo 1);
    ``rotary_interleaved`` (rotation of feature pairs (2i, 2i+1): GPT-J's rotate_every_two, Cohere; default: the halves, Llama's rotate_half),
    ``logit_scale`` (Cohere: logits multiplied by it);
    ``moe`` (a mixture-of-experts MLP node on
    the layers it names: circuitstat.circuits.engine.moe), ``attn_sinks`` (GPT-OSS's per-head sink logit,
    a column of the softmax that no value is read from: circuitstat.circuits.engine.attention.attention_pattern).
    """

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_mlp: int
    vocab_size: int
    n_ctx: int = 1024
    n_kv_heads: int | None = None
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    positional: str = "learned"
    rotary_dim: int | None = None
    rotary_base: float = 10000.0
    mlp: str = "standard"
    act: str = "gelu_new"
    parallel: bool = False
    tied_embeddings: bool = False
    arch: str = "circuitstat"
    attn_scalar: float | None = None
    attn_softcap: float | None = None
    logit_softcap: float | None = None
    embed_scale: float | None = None
    pre_norm: bool = True
    post_norm: bool = False
    qk_norm: str = "none"
    sliding_window: int | None = None
    layer_types: list[str] | None = None
    rope: dict | None = None
    rope_local: dict | None = None
    rope_max_positions: int | None = None
    attn_multiplier: float | None = None
    embed_multiplier: float | None = None
    logits_scaling: float | None = None
    rope_layers: list[bool] | None = None
    clip_qkv: float | None = None
    rotary_interleaved: bool = False
    logit_scale: float | None = None
    moe: dict | None = None  # a mixture-of-experts MLP node (circuitstat.circuits.engine.moe_config.KEYS)
    attn_sinks: bool = False  # GPT-OSS: a learned per-head logit in each softmax's denominator

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("norm", self.norm, NORMS),
            ("positional", self.positional, POSITIONALS),
            ("mlp", self.mlp, MLPS),
            ("act", self.act, tuple(ACTIVATIONS)),
            ("qk_norm", self.qk_norm, QK_NORMS),
        ):
            if value not in allowed:
                raise InputError(f"model config {name}={value!r} is not supported; use one of {', '.join(allowed)}")
        for name in ("n_layers", "n_heads", "d_model", "d_head", "vocab_size", "n_ctx"):
            if int(getattr(self, name)) <= 0:
                raise InputError(f"model config {name} must be a positive integer, got {getattr(self, name)!r}")
        if self.mlp != "none" and self.d_mlp <= 0:
            raise InputError("model config d_mlp must be positive when the model has MLPs (or set mlp='none')")
        if self.positional == "rotary":
            if self.rotary_dim is None:
                self.rotary_dim = self.d_head
            if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.d_head:
                raise InputError(f"rotary_dim must be even and in (0, d_head={self.d_head}], got {self.rotary_dim}")
        self._check_family_fields()

    def _check_family_fields(self) -> None:
        """InputError naming the first of the newer fields that has a wrong type or value."""
        for name in ("attn_scalar", "attn_softcap", "logit_softcap", "embed_scale", "attn_multiplier",
                     "embed_multiplier", "logits_scaling", "clip_qkv", "logit_scale"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v <= 0):
                raise InputError(f"model config {name} must be a positive number or null, got {v!r}")
        for name in ("pre_norm", "post_norm", "rotary_interleaved", "attn_sinks"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"model config {name} must be true or false")
        for name in ("sliding_window", "rope_max_positions"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InputError(f"model config {name} must be a positive integer or null, got {v!r}")
        if self.layer_types is not None:
            if not isinstance(self.layer_types, (list, tuple)) or len(self.layer_types) != self.n_layers \
                    or any(t not in LAYER_TYPES for t in self.layer_types):
                raise InputError(f"model config layer_types must list one of {', '.join(LAYER_TYPES)} per layer "
                                 f"({self.n_layers} entries)")
            self.layer_types = list(self.layer_types)
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise InputError("model config layer_types has sliding_attention layers but no sliding_window")
        if self.rope_layers is not None:
            if not isinstance(self.rope_layers, (list, tuple)) or len(self.rope_layers) != self.n_layers \
                    or any(not isinstance(v, bool) for v in self.rope_layers):
                raise InputError(f"model config rope_layers must list true or false per layer "
                                 f"({self.n_layers} entries)")
            if self.positional != "rotary":
                raise InputError("model config rope_layers needs positional='rotary'")
            self.rope_layers = list(self.rope_layers)
        for name in ("rope", "rope_local"):
            v = getattr(self, name)
            if v is None:
                continue
            if not isinstance(v, dict) or v.get("rope_type", "default") not in ROPE_TYPES:
                raise InputError(f"model config {name} must be a dict with rope_type one of {', '.join(ROPE_TYPES)}")
            if self.positional != "rotary":
                raise InputError(f"model config {name} needs positional='rotary'")
        if self.clip_qkv is not None and self.qk_norm == "full":
            raise InputError("model config clip_qkv with qk_norm='full' is not supported (the whole-projection norm's "
                             "gradient does not pass a clamp); use one of them")
        if self.qk_norm == "full" and self.norm not in RMS_NORMS:
            raise InputError("model config qk_norm='full' needs an RMS norm")
        check_moe(self)
        if self.qk_norm == "full" and self.n_kv_heads not in (None, self.n_heads) and self.n_heads % self.n_kv_heads:
            raise InputError("model config n_heads must be a multiple of n_kv_heads")

    @property
    def has_mlp(self) -> bool:
        """Whether layers have an MLP."""
        return self.mlp != "none"

    @property
    def kv_heads(self) -> int:
        """The number of distinct K/V heads before ungrouping."""
        return self.n_kv_heads or self.n_heads

    def is_sliding(self, layer: int) -> bool:
        """Whether ``layer`` attends through the sliding window."""
        if self.sliding_window is None:
            return False
        return self.layer_types is None or self.layer_types[layer] == "sliding_attention"

    def is_rotary(self, layer: int) -> bool:
        """Whether ``layer`` rotates its queries and keys (False for SmolLM3's NoPE layers)."""
        return self.positional == "rotary" and (self.rope_layers is None or self.rope_layers[layer])

    @property
    def additive_writes(self) -> bool:
        """Whether each head's output is added to the residual as it is (no norm on the summed attention
        output); where it is not, edges are defined through the post-norm (see circuitstat.circuits.engine.run)."""
        return not self.post_norm

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        """A config from a dict, rejecting unknown keys."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise InputError(f"unknown model config keys {sorted(unknown)}; known keys: {sorted(known)}")
        return cls(**data)
