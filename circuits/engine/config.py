"""ModelConfig: the architecture of a CircuitModel, and the values each field allows."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch.nn.functional as F

from reports.errors import InputError

NORMS = ("layernorm", "rmsnorm", "none")
POSITIONALS = ("learned", "rotary", "none")
MLPS = ("standard", "gated", "none")
ACTIVATIONS = {
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


@dataclass
class ModelConfig:
    """Architecture of a CircuitModel; every supported family maps onto these fields."""

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

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("norm", self.norm, NORMS),
            ("positional", self.positional, POSITIONALS),
            ("mlp", self.mlp, MLPS),
            ("act", self.act, tuple(ACTIVATIONS)),
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

    @property
    def has_mlp(self) -> bool:
        """Whether layers have an MLP."""
        return self.mlp != "none"

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        """A config from a dict, rejecting unknown keys."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise InputError(f"unknown model config keys {sorted(unknown)}; known keys: {sorted(known)}")
        return cls(**data)
