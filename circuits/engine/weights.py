"""The weights of a CircuitModel in the uniform form, their construction, identity and saving.

Weights of every supported family are held in one uniform per-layer form (per-head W_Q, W_K,
W_V [H, D, d_head], W_O [H, d_head, D], biases, norms, MLP), so attribution code is written once.
Grouped-query attention is ungrouped at conversion: each query head gets its own copy of its
group's K/V weights, so every head has its own k and v receiver (as MIB does).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from ..moe_nodes import graph_of
from .config import ModelConfig
from .moe import is_sparse, parameter_shapes
from .rotary import rotary_inv_freq

_Model = TypeVar("_Model", bound="ModelWeights")


class Block(nn.Module):
    """One transformer layer's weights in the uniform form.

    Norm weights are held as the family stores them (Gemma's ``w`` of the scale ``1 + w``); without
    pre-norms (OLMo 2) there is no ln1/ln2; ``ln1_post_w``/``ln2_post_w`` are the norms on the
    attention and MLP outputs, ``lnq_w``/``lnk_w`` the q/k norms ([d_head] per head, or over the whole
    projection: [H d_head] and [H_kv d_head], or [H, d_head]: each head its own), with ``lnq_b``/``lnk_b``
    under LayerNorm.
    """

    def __init__(self, cfg: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        H, D, E = cfg.n_heads, cfg.d_model, cfg.d_head
        p = lambda *shape: nn.Parameter(torch.zeros(*shape))  # noqa: E731
        one = lambda *shape: nn.Parameter(torch.ones(*shape))  # noqa: E731
        if cfg.pre_norm:
            self.ln1_w, self.ln1_b = one(D), p(D)
        self.W_Q, self.W_K, self.W_V = p(H, D, E), p(H, D, E), p(H, D, E)
        self.b_Q, self.b_K, self.b_V = p(H, E), p(H, E), p(H, E)
        self.W_O, self.b_O = p(H, E, D), p(D)
        if cfg.attn_sinks:
            self.sinks = p(H)
        if cfg.qk_norm == "head":
            self.lnq_w, self.lnk_w = one(E), one(E)
        elif cfg.qk_norm == "full":
            self.lnq_w, self.lnk_w = one(H * E), one(cfg.kv_heads * E)
        elif cfg.qk_norm == "each_head":  # each head its own weights (K ungrouped)
            self.lnq_w, self.lnk_w = one(H, E), one(H, E)
        if cfg.qk_norm != "none" and cfg.norm == "layernorm":  # LayerNorm q/k norms have biases (Phi, StableLM)
            self.lnq_b, self.lnk_b = p(*self.lnq_w.shape), p(*self.lnk_w.shape)
        if cfg.post_norm:
            self.ln1_post_w = one(D)
        if cfg.has_mlp:
            F_ = cfg.d_mlp
            if cfg.pre_norm:
                self.ln2_w, self.ln2_b = one(D), p(D)
            if is_sparse(cfg, layer):  # the MoE block (circuitstat.circuits.engine.moe): one MLP node
                for name, shape in parameter_shapes(cfg).items():
                    setattr(self, name, p(*shape))
            else:
                self.W_in, self.b_in = p(D, F_), p(F_)
                if cfg.mlp == "gated":
                    self.W_gate = p(D, F_)
                self.W_out, self.b_out = p(F_, D), p(D)
            if cfg.post_norm:
                self.ln2_post_w = one(D)


class ModelWeights(nn.Module):
    """Embeddings, blocks, final norm and unembedding of ``cfg``, with the model's identity."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.graph = graph_of(cfg)  # the block graph, or experts as nodes where the config was set so (moe_nodes)
        D, V = cfg.d_model, cfg.vocab_size
        self.W_E = nn.Parameter(torch.zeros(V, D))
        if cfg.positional == "learned":
            self.W_pos = nn.Parameter(torch.zeros(cfg.n_ctx, D))
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layers))
        self.lnf_w, self.lnf_b = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))
        if not cfg.tied_embeddings:
            self.W_U = nn.Parameter(torch.zeros(D, V))
        self.b_U = nn.Parameter(torch.zeros(V))
        if cfg.positional == "rotary":
            self.register_buffer("inv_freq", rotary_inv_freq(cfg), persistent=False)
            if cfg.rope_local is not None:  # Gemma 3's sliding layers: their own base
                self.register_buffer("inv_freq_local", rotary_inv_freq(cfg, local=True), persistent=False)
        self.tokenizer: Any = None
        self.source: str = "memory"  # as the user named it (recorded in runs)
        self.directory: Path | None = None  # where it was loaded from (files beside the weights; never recorded)
        self.meta: dict = {}

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def from_state_dict(cls: type[_Model], cfg: ModelConfig, state: dict[str, torch.Tensor]) -> _Model:
        """The model of ``cfg`` holding the tensors of ``state`` themselves (strict names and shapes).

        Built on the meta device and assigned, so no parameter is allocated, zero-filled and then
        overwritten by a copy (GPT-2 small: 0.5 GB written twice, about 1 s of a command's start-up).
        """
        with torch.device("meta"):
            model = cls(cfg)
        model.load_state_dict(state, strict=True, assign=True)
        if cfg.positional == "rotary":  # the non-persistent buffers were built on meta
            device = next(iter(state.values())).device
            model.inv_freq = rotary_inv_freq(cfg).to(device)
            if cfg.rope_local is not None:
                model.inv_freq_local = rotary_inv_freq(cfg, local=True).to(device)
        return model

    def init_weights(self: _Model, seed: int) -> _Model:
        """Deterministic GPT-2-style initialisation from ``seed``; returns self."""
        gen = torch.Generator().manual_seed(int(seed))
        std = 0.02
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                leaf = name.rsplit(".", 1)[-1]
                if leaf.startswith(("ln", "lnf")) and leaf.endswith("_w"):
                    p.fill_(0.0 if self.cfg.norm == "rmsnorm_1p" else 1.0)  # the neutral scale
                elif leaf.startswith("b_") or leaf.endswith("_b"):
                    p.zero_()
                else:
                    s = out_std if leaf in ("W_O", "W_out") else std
                    p.copy_(torch.randn(p.shape, generator=gen) * s)
        return self

    @property
    def unembed(self) -> torch.Tensor:
        """The unembedding matrix [D, V]."""
        return self.W_E.T if self.cfg.tied_embeddings else self.W_U

    @property
    def device(self) -> torch.device:
        """Device of the weights."""
        return self.W_E.device

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the weights."""
        return self.W_E.dtype

    # ---- identity --------------------------------------------------------------------------
    def weight_hash(self) -> str:
        """sha256 over every weight's name, dtype, shape and bytes (sorted by name).

        Cached while no weight changes (same storage and in-place version counter): hashing
        GPT-2 small costs seconds, and every ScoreMatrix records it.
        """
        state = sorted(self.state_dict().items())
        key = self._state_key(state)
        cached = self.__dict__.get("_weight_hash_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        digest = self._hash_weights(state)
        self.__dict__["_weight_hash_cache"] = (key, digest)
        self.__dict__["_weight_hash_from"] = "computed from the weights in this run"
        memo = self.__dict__.pop("_weight_hash_memo", None)
        if memo is not None:  # the weights as loaded from their files: record them for the next load
            from ..cache import write_weight_hash

            write_weight_hash(memo, digest)
        return digest

    def use_weight_hash_memo(self, memo) -> None:
        """Take the weight hash from ``memo`` (circuitstat.circuits.cache) if it holds one, else record it there
        when first computed; valid only for weights exactly as loaded from the memo's files."""
        from ..cache import read_weight_hash

        digest = read_weight_hash(memo)
        if digest is None:
            self.__dict__["_weight_hash_memo"] = memo
        else:
            self.__dict__["_weight_hash_cache"] = (self._state_key(sorted(self.state_dict().items())), digest)
            self.__dict__["_weight_hash_from"] = memo.describe()  # provenance says the hash was trusted, and how

    @staticmethod
    def _state_key(state: list[tuple[str, torch.Tensor]]) -> tuple:
        """Identity of the current weights: storage, in-place version, dtype, device and shape of each."""
        return tuple((name, t.data_ptr(), t._version, t.dtype, t.device, tuple(t.shape)) for name, t in state)

    @staticmethod
    def _hash_weights(state: list[tuple[str, torch.Tensor]]) -> str:
        """sha256 of (name, dtype, shape, bytes) of each weight in ``state`` order."""
        h = hashlib.sha256()
        for name, t in state:
            t = t.detach().cpu().contiguous()
            h.update(name.encode())
            h.update(str(t.dtype).encode())
            h.update(str(tuple(t.shape)).encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return h.hexdigest()

    def identity(self) -> dict:
        """Provenance of the model: source, architecture, sizes and weight hash."""
        return {
            "source": self.source,
            "arch": self.cfg.arch,
            "n_layers": self.cfg.n_layers,
            "n_heads": self.cfg.n_heads,
            "d_model": self.cfg.d_model,
            "n_edges": self.graph.n_edges,
            "dtype": str(self.dtype).replace("torch.", ""),
            "weight_hash": self.weight_hash(),
            "weight_hash_from": self.__dict__.get("_weight_hash_from", "computed from the weights in this run"),
        }

    def save(self, directory: str | Path, meta: dict | None = None) -> Path:
        """Write config.json and model.safetensors (and the tokenizer if any); returns the dir."""
        from safetensors.torch import save_file

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        tmp = out / "model.safetensors.tmp"
        save_file(state, str(tmp))
        tmp.replace(out / "model.safetensors")
        doc = {
            "format": "circuitstat",
            "version": 1,
            "config": asdict(self.cfg),
            "weight_hash": self.weight_hash(),
            "meta": {**self.meta, **(meta or {})},
        }
        tmpj = out / "config.json.tmp"
        tmpj.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))
        tmpj.replace(out / "config.json")
        if self.tokenizer is not None and hasattr(self.tokenizer, "save"):
            self.tokenizer.save(out)
        return out
