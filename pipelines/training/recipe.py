"""The training recipe (everything that determines a trained model apart from its seed) and the
prepared data every seed of a recipe shares."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import asdict, dataclass

from circuitstat.core.errors import InputError
from circuitstat.core.params import D_MLP, INIT_STD, MIN_LR_RATIO, REPEAT_FRACTION, WARMUP_STEPS

__all__ = ["TrainRecipe", "DataSpec"]


@dataclass(frozen=True)
class TrainRecipe:
    """Everything that determines a trained model apart from its seed."""

    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 128
    d_head: int | None = None  # default d_model // n_heads
    d_mlp: int | None = None  # default 4 * d_model
    attn_only: bool = False
    n_ctx: int = 128
    norm: str = "layernorm"
    positional: str = "learned"
    act: str = "gelu_new"
    tokenizer: str = "bpe"  # "bpe" (trained on the corpus' train split), "gpt2", or a path
    vocab_size: int = 4096  # for tokenizer="bpe"
    corpus: str = "stdlib"  # "stdlib", a text folder/file or a Parquet file
    optimizer: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.99)
    warmup_steps: int = WARMUP_STEPS.default
    min_lr_ratio: float = MIN_LR_RATIO.default
    grad_clip: float = 1.0
    repeat_fraction: float = REPEAT_FRACTION.default  # share of training sequences in which a span is copied later (see _repeat_spans)
    init_std: float | None = None  # None: CircuitModel.init_weights (GPT-2, std 0.02); else weight matrices rescaled to this std
    batch_size: int = 16
    steps: int = 1000
    eval_every: int = 100
    eval_batches: int = 8
    checkpoint_every: int = 100
    threads: int = 1

    def __post_init__(self) -> None:
        if self.optimizer not in ("adam", "adamw"):
            raise InputError(f"optimizer must be 'adam' or 'adamw', got {self.optimizer!r}")
        for name in ("n_layers", "n_heads", "d_model", "n_ctx", "batch_size", "steps", "threads",
                     "eval_every", "checkpoint_every", "eval_batches"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"training recipe: {name} must be a positive integer, got {getattr(self, name)!r}")
        if self.d_head is None and self.d_model % self.n_heads:
            raise InputError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; pass d_head")
        # the bounds every entry point shares (circuitstat.core.params): the CLI, a recipe.json, the zoo
        REPEAT_FRACTION.check(self.repeat_fraction)
        MIN_LR_RATIO.check(self.min_lr_ratio)
        WARMUP_STEPS.check(self.warmup_steps)
        if self.init_std is not None:
            INIT_STD.check(self.init_std)
        if self.d_mlp is not None:
            D_MLP.check(self.d_mlp)
        if not (math.isfinite(self.lr) and math.isfinite(self.weight_decay)) or self.weight_decay < 0 or self.lr <= 0:
            raise InputError("training recipe: lr must be a positive finite number and weight_decay a "
                             "non-negative one")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))

    def validate(self, vocab_size: int | None = None, *, allow_large: bool = False) -> None:
        """None; raises InputError when the model config is invalid (norm, positional, activation) or
        training would need more memory than :mod:`circuitstat.circuits.limits` allows (``allow_large`` lifts it).

        ``vocab_size``: the prepared tokenizer's; before the data exists, the recipe's (a BPE's size).
        """
        from circuitstat.circuits.limits import check_bytes
        from circuitstat.circuits.own_format import circuit_parameters

        vocab = int(vocab_size or self.vocab_size)
        cfg = self.model_config(vocab)  # ModelConfig checks norm, positional, act
        n = circuit_parameters(cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_mlp, vocab, cfg.n_ctx)
        # fp32 weights, gradients and two Adam moments, plus the logits of one batch (the largest activation)
        need = 16 * n + 3 * 4 * self.batch_size * self.n_ctx * (vocab + cfg.n_layers * cfg.n_heads * self.n_ctx)
        check_bytes(need, f"training a {n:,}-parameter model", allow_large=allow_large)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainRecipe":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise InputError(f"unknown training recipe keys {sorted(unknown)}; known: {sorted(known)}")
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)

    def replace(self, **kw) -> "TrainRecipe":
        return dataclasses.replace(self, **kw)

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    def model_config(self, vocab_size: int):
        from circuitstat.circuits.model import ModelConfig

        d_head = self.d_head or self.d_model // self.n_heads
        mlp = "none" if self.attn_only else "standard"
        d_mlp = 0 if self.attn_only else (self.d_mlp or 4 * self.d_model)
        return ModelConfig(
            n_layers=self.n_layers, n_heads=self.n_heads, d_model=self.d_model, d_head=d_head, d_mlp=d_mlp,
            vocab_size=int(vocab_size), n_ctx=self.n_ctx, norm=self.norm, positional=self.positional,
            mlp=mlp, act=self.act, parallel=False, arch="circuitstat",
        )


@dataclass(frozen=True)
class DataSpec:
    """Prepared, cached training data shared by all seeds (paths, so it crosses process boundaries)."""

    tokenizer_dir: str
    train_tokens: str
    val_tokens: str
    corpus_name: str
    corpus_hash: str
    tokenizer_hash: str
    vocab_size: int
    n_train_tokens: int
    token_counts: str = ""  # .npy of per-token-id counts in the train split

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(f"{self.corpus_hash}|{self.tokenizer_hash}".encode()).hexdigest()
