"""CircuitModel: one functional transformer forward pass that exposes every sender and receiver.

Weights of every supported family are held in one uniform per-layer form (per-head W_Q, W_K,
W_V [H, D, d_head], W_O [H, d_head, D], biases, norms, MLP), so attribution code is written once.
Grouped-query attention is ungrouped at conversion: each query head gets its own copy of its
group's K/V weights, so every head has its own k and v receiver (as MIB does).

The forward pass keeps the residual stream equal to the sum of all sender outputs plus constant
biases, which is what makes edge interventions exact: a receiver's input is the stream plus the
deltas of the edges patched into it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .errors import InputError
from .graph import ComponentGraph
from .interventions import Intervention

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


class Block(nn.Module):
    """One transformer layer's weights in the uniform form."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        H, D, E = cfg.n_heads, cfg.d_model, cfg.d_head
        p = lambda *shape: nn.Parameter(torch.zeros(*shape))  # noqa: E731
        self.ln1_w, self.ln1_b = nn.Parameter(torch.ones(D)), p(D)
        self.W_Q, self.W_K, self.W_V = p(H, D, E), p(H, D, E), p(H, D, E)
        self.b_Q, self.b_K, self.b_V = p(H, E), p(H, E), p(H, E)
        self.W_O, self.b_O = p(H, E, D), p(D)
        if cfg.has_mlp:
            F_ = cfg.d_mlp
            self.ln2_w, self.ln2_b = nn.Parameter(torch.ones(D)), p(D)
            self.W_in, self.b_in = p(D, F_), p(F_)
            if cfg.mlp == "gated":
                self.W_gate = p(D, F_)
            self.W_out, self.b_out = p(F_, D), p(D)


@dataclass
class RunState:
    """Where a suffix run starts: the residual stream entering ``layer`` and the senders so far."""

    layer: int
    resid: torch.Tensor
    blocks: list[torch.Tensor] | None = None


@dataclass
class RunOutput:
    """Everything a forward pass was asked to keep."""

    logits: torch.Tensor | None
    blocks: list[torch.Tensor] | None = None
    resid_pre: list[torch.Tensor] = field(default_factory=list)
    resid_mid: list[torch.Tensor] = field(default_factory=list)
    patterns: list[torch.Tensor] = field(default_factory=list)
    grad_inputs: list[torch.Tensor] = field(default_factory=list)
    qkv: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    final_resid: torch.Tensor | None = None
    probed: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (layer, attention input)

    @property
    def senders(self) -> torch.Tensor:
        """All sender outputs stacked, [B, U, P, D]."""
        if self.blocks is None:
            raise RuntimeError("sender outputs were not kept; run with keep_senders=True")
        return torch.cat(self.blocks, dim=1)


@dataclass
class _RunSetup:
    """What one CircuitModel.run patches, keeps and needs (derived once from its arguments)."""

    B: int
    P: int
    iv: Any  # the Intervention, or None
    edge_mask: torch.Tensor | None
    sender_mask: torch.Tensor | None
    cf: torch.Tensor | None
    edge_live: Any
    sender_live: Any
    need_blocks: bool
    per_head: bool
    sv: int | None
    rd: int | None
    rd_layer: int | None
    fast_last: bool
    logits_at: torch.Tensor | None
    keep_resid: bool
    keep_patterns: bool
    keep_qkv: bool
    receiver_grads: bool | str
    positions: torch.Tensor
    allowed: torch.Tensor
    rot: tuple[torch.Tensor, torch.Tensor] | None


@dataclass
class _Window:
    """Rows and positions a patched suffix recomputes (see CircuitModel.patched_layer_logits)."""

    rows: torch.Tensor  # [R] example of the clean run each row patches
    start: int  # first recomputed position; earlier ones keep their clean values
    end: int  # one past the last position any read-out needs
    at: torch.Tensor  # [R] read-out position inside the window
    allowed: torch.Tensor  # [R, 1, T, end] attention of window queries over all keys
    rot: tuple[torch.Tensor, torch.Tensor] | None  # rotary cos/sin [R, 1, T, dim] at window positions


def _norm(kind: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """Apply the configured normalisation in float32 and cast back."""
    if kind == "none":
        return x
    dtype = x.dtype
    h = x.float()
    if kind == "layernorm":
        h = F.layer_norm(h, h.shape[-1:], None, None, eps)
        return (h.to(dtype) * w + b) if dtype != torch.float32 else h * w + b
    # RMSNorm as in Llama/Qwen2: normalise in float32, cast, then scale.
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(dtype)


def _grad_probe(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """A zero tensor of ``shape`` whose gradient autograd can return (receiver gradients).

    An expanded view of one zero element: no memory to allocate and fill, yet
    ``torch.autograd.grad`` with the view as input returns the full-shape gradient.
    """
    one = torch.zeros((1,) * len(shape), dtype=like.dtype, device=like.device, requires_grad=True)
    return one.expand(shape)


def _per_head(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """[B, H, P, K] @ [H, K, N] -> [B, H, P, N] as one bmm over heads (torch.matmul would
    broadcast W to B copies, and copy it again for the backward)."""
    B, H, P, K = x.shape
    y = torch.bmm(x.transpose(0, 1).reshape(H, B * P, K), W)
    return y.view(H, B, P, W.shape[-1]).transpose(0, 1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class CircuitModel(nn.Module):
    """A transformer in the uniform form, with interventions, suffix runs and receiver gradients."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.graph = ComponentGraph(cfg.n_layers, cfg.n_heads, cfg.has_mlp, cfg.parallel)
        D, V = cfg.d_model, cfg.vocab_size
        self.W_E = nn.Parameter(torch.zeros(V, D))
        if cfg.positional == "learned":
            self.W_pos = nn.Parameter(torch.zeros(cfg.n_ctx, D))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.lnf_w, self.lnf_b = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))
        if not cfg.tied_embeddings:
            self.W_U = nn.Parameter(torch.zeros(D, V))
        self.b_U = nn.Parameter(torch.zeros(V))
        if cfg.positional == "rotary":
            self.register_buffer("inv_freq", self._inv_freq(), persistent=False)
        self.tokenizer: Any = None
        self.source: str = "memory"
        self.meta: dict = {}

    # ---- construction ----------------------------------------------------------------------
    def _inv_freq(self) -> torch.Tensor:
        """Rotary inverse frequencies [rotary_dim / 2] (a buffer computed from the config, never stored)."""
        dim = self.cfg.rotary_dim
        return 1.0 / (self.cfg.rotary_base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))

    @classmethod
    def from_state_dict(cls, cfg: ModelConfig, state: dict[str, torch.Tensor]) -> "CircuitModel":
        """The model of ``cfg`` holding the tensors of ``state`` themselves (strict names and shapes).

        Built on the meta device and assigned, so no parameter is allocated, zero-filled and then
        overwritten by a copy (GPT-2 small: 0.5 GB written twice, about 1 s of a command's start-up).
        """
        with torch.device("meta"):
            model = cls(cfg)
        model.load_state_dict(state, strict=True, assign=True)
        if cfg.positional == "rotary":  # the non-persistent buffer was built on meta
            device = next(iter(state.values())).device
            model.inv_freq = model._inv_freq().to(device)
        return model

    def init_weights(self, seed: int) -> "CircuitModel":
        """Deterministic GPT-2-style initialisation from ``seed``; returns self."""
        gen = torch.Generator().manual_seed(int(seed))
        std = 0.02
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                leaf = name.rsplit(".", 1)[-1]
                if leaf.startswith(("ln", "lnf")) and leaf.endswith("_w"):
                    p.fill_(1.0)
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
            from .cache import write_weight_hash

            write_weight_hash(memo, digest)
        return digest

    def use_weight_hash_memo(self, memo) -> None:
        """Take the weight hash from ``memo`` (circuits.cache) if it holds one, else record it there
        when first computed; valid only for weights exactly as loaded from the memo's files."""
        from .cache import read_weight_hash

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

    # ---- forward ---------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, P, V] of a plain forward pass."""
        return self.run(input_ids, attention_mask).logits

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The ``input`` sender's output: token (+ learned position) embeddings [B, P, D]."""
        x = self.W_E[input_ids]
        if self.cfg.positional == "learned":
            # positions never exceed P - 1: only longer inputs need the (host-synchronising) check
            if positions.shape[-1] > self.cfg.n_ctx and int(positions.max()) >= self.cfg.n_ctx:
                raise InputError(
                    f"sequence of length {int(positions.max()) + 1} exceeds the model's context "
                    f"n_ctx={self.cfg.n_ctx}; use shorter prompts"
                )
            x = x + self.W_pos[positions]
        return x

    def position_embedding(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The learned position part of the ``input`` sender [B, P, D] (zeros without one)."""
        B, P = attention_mask.shape
        if self.cfg.positional != "learned":
            return torch.zeros(B, P, self.cfg.d_model, dtype=self.dtype, device=self.device)
        return self.W_pos[self.positions(attention_mask.to(self.device))]

    @staticmethod
    def positions(attention_mask: torch.Tensor) -> torch.Tensor:
        """Position ids from an attention mask: counting real tokens, so left padding works too."""
        return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)

    @property
    def has_fused_forward(self) -> bool:
        """Whether :meth:`fused_logits` has its own fused path for this configuration."""
        cfg = self.cfg
        return (not cfg.parallel and cfg.positional in ("learned", "rotary", "none")
                and cfg.n_kv_heads in (None, cfg.n_heads))

    def fused_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, P, V] of full causal sequences without padding (training).

        The same function as ``self(ids)`` (checked to float rounding in tests) but with fused
        scaled-dot-product attention, about 1.5x faster on CPU for the zoo's models; falls back to
        ``self(ids)`` for configurations it does not cover.
        """
        cfg = self.cfg
        if not self.has_fused_forward:
            return self(ids)
        B, P = ids.shape
        x = self.W_E[ids]
        if cfg.positional == "learned":
            x = x + self.W_pos[:P]
        rot = self._rotary(torch.arange(P, device=ids.device).expand(B, P)) if cfg.positional == "rotary" else None
        H, E = cfg.n_heads, cfg.d_head
        for blk in self.blocks:
            h = _norm(cfg.norm, x, blk.ln1_w, blk.ln1_b, cfg.norm_eps)
            W = torch.stack((blk.W_Q, blk.W_K, blk.W_V)).permute(2, 0, 1, 3).reshape(cfg.d_model, 3 * H * E)
            b = torch.stack((blk.b_Q, blk.b_K, blk.b_V)).reshape(3 * H * E)
            q, k, v = (h @ W + b).view(B, P, 3, H, E).permute(2, 0, 3, 1, 4)
            if rot is not None:
                q, k = self._apply_rotary(q, *rot), self._apply_rotary(k, *rot)
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, P, E]
            x = x + z.transpose(1, 2).reshape(B, P, H * E) @ blk.W_O.reshape(H * E, cfg.d_model) + blk.b_O
            if cfg.has_mlp:
                x = x + self._mlp(blk, x)
        return _norm(cfg.norm, x, self.lnf_w, self.lnf_b, cfg.norm_eps) @ self.unembed + self.b_U

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[..., None] * self.inv_freq  # [B, P, dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[:, None], emb.sin()[:, None]  # [B, 1, P, dim]

    def _apply_rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rd = self.cfg.rotary_dim
        rot, rest = x[..., :rd], x[..., rd:]
        rot = (rot.float() * cos + _rotate_half(rot.float()) * sin).to(x.dtype)
        return torch.cat((rot, rest), dim=-1) if rest.shape[-1] else rot

    def run(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        intervention: Intervention | None = None,
        state: RunState | None = None,
        keep_senders: bool = False,
        keep_resid: bool = False,
        keep_patterns: bool = False,
        receiver_grads: bool | str = False,
        compute_logits: bool = True,
        logits_at: torch.Tensor | None = None,
        keep_qkv: bool = False,
        positions: torch.Tensor | None = None,
    ) -> RunOutput:
        """Run the model, optionally from a saved state, with interventions; return what was asked.

        ``receiver_grads=True`` adds zero tensors to every receiver input and returns them in
        ``grad_inputs`` (per layer ``[B, 3, H, P, D]`` for q/k/v and ``[B, P, D]`` for the MLP,
        then ``[B, P, D]`` for logits), so one ``torch.autograd.grad`` gives every receiver's
        gradient.  ``receiver_grads="projected"`` gives the same gradients cheaper: the probes sit on
        the heads' q/k/v (widths d_head, not d_model, and no per-head normalisation in the forward
        or backward pass) and :meth:`receiver_input_grads` maps their gradients back to the
        receiver inputs (edge interventions and receiver patches fall back to input probes).
        ``logits_at`` [B] computes logits only at one position per row ([B, V]),
        which is all a metric read at the last real token needs.
        ``positions`` [B, P]: position ids (learned and rotary embeddings) in place of those counted
        from ``attention_mask``, so a key can be masked without shifting later tokens' positions
        (token mask ablation); a masked position still attends to itself (see :meth:`_allowed`).
        """
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        attention_mask = attention_mask.to(input_ids.device)
        r = self._run_setup(input_ids, attention_mask, intervention, positions, logits_at=logits_at,
                            keep_senders=keep_senders, keep_resid=keep_resid, keep_patterns=keep_patterns,
                            receiver_grads=receiver_grads, keep_qkv=keep_qkv)
        out = RunOutput(logits=None, blocks=[] if r.need_blocks else None)
        start, resid = self._run_start(input_ids, r, state, out)
        for layer in range(start, self.cfg.n_layers):
            resid, mid = self._run_attention(layer, resid, r, out)
            resid = self._run_mlp(layer, resid, mid, r, out) if self.cfg.has_mlp else mid
        out.final_resid = self._run_logits_input(resid, r, out)
        if compute_logits:
            final = out.final_resid
            if final.shape[1] == 1 and r.fast_last:
                x = final[:, 0]
            else:
                x = final if logits_at is None else final[torch.arange(r.B, device=final.device), logits_at]
            out.logits = self._unembed(x)
        return out

    def _run_setup(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, iv: Intervention | None,
                   positions: torch.Tensor | None, *, logits_at, keep_senders: bool, keep_resid: bool,
                   keep_patterns: bool, receiver_grads: bool | str, keep_qkv: bool) -> "_RunSetup":
        """What one run patches, keeps and needs, derived once from its arguments (see :meth:`run`)."""
        cfg, graph = self.cfg, self.graph
        B, P = input_ids.shape
        if iv is not None:
            iv.validate(graph.n_edges, graph.n_senders)
        edge_mask = None if iv is None else iv.edge_mask
        sender_mask = None if iv is None else iv.sender_mask
        if edge_mask is not None and edge_mask.dim() == 1:
            edge_mask = edge_mask[None].expand(B, -1)
        if sender_mask is not None and sender_mask.dim() == 1:
            sender_mask = sender_mask[None].expand(B, -1)
        need_blocks = keep_senders or edge_mask is not None
        sv = None if iv is None else iv.sender
        per_head = need_blocks or sender_mask is not None or sv is not None
        rd = iv.receiver if iv is not None else None
        if positions is None:
            positions = self.positions(attention_mask)
        elif positions.shape != input_ids.shape:
            raise InputError(f"positions must have the shape of input_ids {tuple(input_ids.shape)}, "
                             f"got {tuple(positions.shape)}")
        else:
            positions = positions.to(input_ids.device)
            if cfg.positional == "learned" and not 0 <= int(positions.min()) <= int(positions.max()) < cfg.n_ctx:
                raise InputError(f"positions must lie in [0, n_ctx={cfg.n_ctx}); pass ids counted from 0")
        return _RunSetup(
            B=B, P=P, iv=iv, edge_mask=edge_mask, sender_mask=sender_mask,
            cf=None if iv is None else iv.counterfactual,
            # which edges/senders any row patches: one host transfer per run, not one per layer
            edge_live=None if edge_mask is None else edge_mask.ne(0).any(0).cpu().numpy(),
            sender_live=None if sender_mask is None else sender_mask.ne(0).any(0).cpu().numpy(),
            need_blocks=need_blocks, per_head=per_head, sv=sv, rd=rd,
            rd_layer=int(graph.receiver_layer[rd]) if rd is not None else None,
            # With nothing kept and no intervention, the last layer only matters at the read-out
            # positions: queries, mixing and the MLP run there alone.
            fast_last=(logits_at is not None and iv is None and not (per_head or receiver_grads or keep_resid
                       or keep_patterns or keep_qkv)),
            logits_at=logits_at, keep_resid=keep_resid, keep_patterns=keep_patterns, keep_qkv=keep_qkv,
            receiver_grads=receiver_grads, positions=positions, allowed=self._allowed(attention_mask),
            rot=self._rotary(positions) if cfg.positional == "rotary" else None)

    def _run_start(self, input_ids: torch.Tensor, r: "_RunSetup", state: RunState | None,
                   out: RunOutput) -> tuple[int, torch.Tensor]:
        """(first layer, residual entering it): the (patched) input sender, or a saved suffix state."""
        if state is None:
            z_in = self.embed(input_ids, r.positions)
            if r.sender_mask is not None:
                z_in = self._patch_senders(z_in[:, None], r.sender_mask, r.cf, 0, r.sender_live)[:, 0]
            if r.sv == 0:
                z_in = r.iv.sender_value.to(z_in.dtype)
            if r.need_blocks:
                out.blocks.append(z_in[:, None])
            start, resid = 0, z_in
        else:
            start, resid = state.layer, state.resid
            if r.need_blocks:
                if state.blocks is None and r.edge_mask is not None:
                    raise ValueError("an edge intervention on a suffix run needs the state's sender blocks")
                out.blocks.extend(state.blocks or [])
        if r.rd is not None and r.rd_layer < start:
            raise ValueError("a receiver intervention upstream of the run's start layer has no effect")
        return start, resid

    def _run_attention(self, layer: int, resid: torch.Tensor, r: "_RunSetup", out: RunOutput
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual entering ``layer``, residual after its attention): the receivers' patches and
        probes, the head senders; in a fast last layer both at the read-out position only."""
        cfg, graph, blk, B, P = self.cfg, self.graph, self.blocks[layer], r.B, r.P
        if r.keep_resid:
            out.resid_pre.append(resid)
        dense = None
        if r.edge_mask is not None:
            dense = self._edge_delta(r.edge_mask, r.cf, out.blocks, layer, graph.upstream_of_attention(layer), True,
                                     r.edge_live)
        probes = None
        if r.receiver_grads == "projected" and dense is None and r.rd is None:
            probes = tuple(_grad_probe((B, cfg.n_heads, P, cfg.d_head), resid) for _ in range(3))
            out.grad_inputs.extend(probes)
            out.probed.append((layer, resid))
        elif r.receiver_grads:
            g = _grad_probe((B, 3, cfg.n_heads, P, cfg.d_model), resid)
            out.grad_inputs.append(g)
            dense = g if dense is None else dense + g
        sparse = None
        if r.rd is not None and r.rd_layer == layer and r.rd != graph.mlp_receiver_safe(layer):
            local = r.rd - layer * graph.receivers_per_layer
            sparse = (local // cfg.n_heads, local % cfg.n_heads, r.iv.receiver_delta)
        q_at = r.logits_at if r.fast_last and layer == cfg.n_layers - 1 else None
        z, attn_out, pattern = self._attention(blk, resid, dense, sparse, r.allowed, r.rot, r.per_head, q_at=q_at,
                                               keep=out.qkv if r.keep_qkv else None, probes=probes)
        if q_at is not None:  # from here on only the read-out position of each row
            resid = resid[torch.arange(B, device=resid.device), q_at][:, None]
        if r.keep_patterns:
            out.patterns.append(pattern)
        if r.per_head:
            attn_out = self._head_senders(layer, z, r, out) + blk.b_O
        mid = resid + attn_out
        if r.keep_resid:
            out.resid_mid.append(mid)
        return resid, mid

    def _head_senders(self, layer: int, z: torch.Tensor, r: "_RunSetup", out: RunOutput) -> torch.Tensor:
        """The attention output without bias from the per-head outputs ``z`` [B, H, P, D], patched."""
        if r.sender_mask is not None:
            z = self._patch_senders(z, r.sender_mask, r.cf, self.graph.head_sender(layer, 0), r.sender_live)
        first = self.graph.head_sender(layer, 0)
        if r.sv is not None and first <= r.sv < first + self.cfg.n_heads:
            h = r.sv - first
            z = torch.cat((z[:, :h], r.iv.sender_value[:, None].to(z.dtype), z[:, h + 1 :]), dim=1)
        if r.need_blocks:
            out.blocks.append(z)
        return z.sum(1)

    def _run_mlp(self, layer: int, resid: torch.Tensor, mid: torch.Tensor, r: "_RunSetup",
                 out: RunOutput) -> torch.Tensor:
        """The residual leaving ``layer``: its MLP receiver's patches and probe, its MLP sender."""
        cfg, graph, blk = self.cfg, self.graph, self.blocks[layer]
        mlp_in = resid if cfg.parallel else mid
        if r.edge_mask is not None:
            d = self._edge_delta(r.edge_mask, r.cf, out.blocks, layer, graph.upstream_of_mlp(layer), False,
                                 r.edge_live)
            if d is not None:
                mlp_in = mlp_in + d
        if r.receiver_grads:
            g = _grad_probe((r.B, r.P, cfg.d_model), resid)
            out.grad_inputs.append(g)
            mlp_in = mlp_in + g
        if r.rd is not None and r.rd == graph.mlp_receiver_safe(layer):
            mlp_in = mlp_in + r.iv.receiver_delta
        z_mlp = self._mlp(blk, mlp_in)
        if r.sender_mask is not None:
            z_mlp = self._patch_senders(z_mlp[:, None], r.sender_mask, r.cf, graph.mlp_sender(layer),
                                        r.sender_live)[:, 0]
        if r.sv is not None and r.sv == graph.mlp_sender(layer):
            z_mlp = r.iv.sender_value.to(z_mlp.dtype)
        if r.need_blocks:
            out.blocks.append(z_mlp[:, None])
        return mid + z_mlp

    def _run_logits_input(self, resid: torch.Tensor, r: "_RunSetup", out: RunOutput) -> torch.Tensor:
        """The logits receiver's input: the final residual with its edge patches, probe and receiver patch."""
        graph, final = self.graph, resid
        if r.edge_mask is not None:
            d = self._edge_delta(r.edge_mask, r.cf, out.blocks, self.cfg.n_layers, graph.n_senders, False,
                                 r.edge_live)
            if d is not None:
                final = final + d
        if r.receiver_grads:
            g = _grad_probe((r.B, r.P, self.cfg.d_model), resid)
            out.grad_inputs.append(g)
            final = final + g
        if r.rd is not None and r.rd == graph.logits_receiver:
            final = final + r.iv.receiver_delta
        return final

    # ---- receivers patched, recomputing only what changes -----------------------------------
    def patched_receiver_logits(self, clean: RunOutput, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                receiver: int, rows: torch.Tensor, delta: torch.Tensor,
                                last: torch.Tensor) -> torch.Tensor:
        """Logits [R, V] at ``last`` when ``delta`` [R, P, D] is added to ``receiver``'s input.

        Row i is example ``rows[i]`` of the clean run ``clean`` (kept with keep_senders,
        keep_resid and keep_qkv); ``input_ids`` is unused (kept for callers).  One receiver's
        case of :meth:`patched_layer_logits`, equal to a full run with Intervention.at_receiver.
        """
        g = self.graph
        layer = int(g.receiver_layer[receiver])
        local = None
        if layer < self.cfg.n_layers and receiver != g.mlp_receiver_safe(layer):
            local = torch.full((rows.shape[0],), receiver - layer * g.receivers_per_layer, device=rows.device)
        return self.patched_layer_logits(clean, attention_mask, layer, local, rows, delta, last)

    def patched_layer_logits(self, clean: RunOutput, attention_mask: torch.Tensor, layer: int,
                             local: torch.Tensor | None, rows: torch.Tensor, delta: torch.Tensor,
                             last: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Logits [R, V] at ``last`` [R] when row i adds ``delta[i]`` to one receiver of ``layer``.

        ``local[i]`` = kind * H + head picks the q (kind 0), k (1) or v (2) input of a head of
        ``layer``; ``local=None`` means the layer's MLP input (or logits when layer = n_layers).
        Row i is example ``rows[i]`` of ``clean`` (a run kept with keep_senders, keep_resid and
        keep_qkv).  ``delta`` [R, T, D] covers positions start .. start+T-1: the caller
        guarantees the delta is zero before ``start`` and that every read-out lies in that
        window, so (attention being causal) every position before ``start`` keeps its clean
        value in every layer: its keys and values are reused from ``clean``, and only the T
        window positions are recomputed, in the last layer only at the read-out.  Rows may mix
        receivers of one layer, so all of a layer's receivers share one batched suffix.
        """
        cfg = self.cfg
        R, T, _ = delta.shape
        end = start + T
        ar = torch.arange(R, device=delta.device)
        at = last - start  # read-out position inside the window
        if layer == cfg.n_layers:
            return self._unembed(clean.final_resid[rows, last] + delta[ar, at])
        mask = attention_mask[rows, :end]
        allowed = self._allowed(mask)[:, :, start:]  # [R, 1, T, end]: window queries over all keys
        rot = None
        if cfg.positional == "rotary":
            cos, sin = self._rotary(self.positions(mask)[:, start:])
            rot = (cos, sin)
        window = _Window(rows, start, end, at, allowed, rot)
        resid = self._patched_layer(clean, layer, local, delta, window)
        for later in range(layer + 1, cfg.n_layers):
            resid = self._suffix_layer(clean, later, resid, window)
        return self._unembed(resid)

    def _patched_layer(self, clean: RunOutput, layer: int, local: torch.Tensor | None, delta: torch.Tensor,
                       w: "_Window") -> torch.Tensor:
        """The residual leaving ``layer`` [R, T, D] (the last layer: [R, D] at the read-out)."""
        cfg, blk = self.cfg, self.blocks[layer]
        last_layer = layer == cfg.n_layers - 1
        rows, s, e = w.rows, w.start, w.end
        ar = torch.arange(rows.shape[0], device=delta.device)
        pre = clean.resid_pre[layer][rows, s:e]
        mid = clean.resid_mid[layer][rows, s:e]
        at_read = (lambda t: t[ar, w.at]) if last_layer else (lambda t: t)  # noqa: E731
        if local is None:  # the MLP input
            base = pre if cfg.parallel else mid
            return at_read(mid) + self._mlp(blk, at_read(base) + at_read(delta))
        H = cfg.n_heads
        kind, h = local // H, local % H
        W = torch.stack((blk.W_Q, blk.W_K, blk.W_V)).flatten(0, 1)[local]  # [R, D, E]: each row's own head
        b = torch.stack((blk.b_Q, blk.b_K, blk.b_V)).flatten(0, 1)[local]
        new = torch.baddbmm(b[:, None], _norm(cfg.norm, pre + delta, blk.ln1_w, blk.ln1_b, cfg.norm_eps), W)
        if w.rot is not None:
            turned = self._apply_rotary(new, w.rot[0][:, 0], w.rot[1][:, 0])
            new = torch.where((kind < 2)[:, None, None], turned, new)
        q, k, v = (t[rows, h, :e] for t in clean.qkv[layer])  # [R, e, E]

        def patched(t: torch.Tensor, i: int) -> torch.Tensor:  # window positions replaced where kind == i
            tail = torch.where((kind == i)[:, None, None], new, t[:, s:])
            return torch.cat((t[:, :s], tail), dim=1) if s else tail

        q, k, v = patched(q, 0)[:, s:], patched(k, 1), patched(v, 2)
        allowed = w.allowed
        if last_layer:
            q, allowed = q[ar, w.at][:, None], allowed[ar, :, w.at][:, :, None]
        _, zc = self._attend(q[:, None], k[:, None], v[:, None], allowed)
        out_h = torch.bmm(zc[:, 0], blk.W_O[h])  # [R, Tq, D]
        head_block = 1 + layer * (2 if cfg.has_mlp else 1)  # clean.blocks: input, then per layer heads (, MLP)
        z_clean = at_read(clean.blocks[head_block][rows, h, s:e])
        mid = at_read(mid) + out_h.squeeze(1) - z_clean if last_layer else mid + out_h - z_clean
        if not cfg.has_mlp:
            return mid
        if cfg.parallel:  # the MLP read the layer input, which did not change
            return mid + at_read(clean.blocks[head_block + 1][rows, 0, s:e])
        return mid + self._mlp(blk, mid)

    def _suffix_layer(self, clean: RunOutput, layer: int, resid: torch.Tensor, w: "_Window") -> torch.Tensor:
        """One unpatched layer on window residuals [R, T, D], reusing clean keys/values before it."""
        cfg, blk = self.cfg, self.blocks[layer]
        R = resid.shape[0]
        norm = _norm(cfg.norm, resid, blk.ln1_w, blk.ln1_b, cfg.norm_eps)
        q, k, v = self._project_shared(blk, norm)  # [R, H, T, E]
        if w.rot is not None:
            q, k = self._apply_rotary(q, *w.rot), self._apply_rotary(k, *w.rot)
        if w.start:
            ck, cv = clean.qkv[layer][1], clean.qkv[layer][2]
            k = torch.cat((ck[w.rows, :, : w.start], k), dim=2)
            v = torch.cat((cv[w.rows, :, : w.start], v), dim=2)
        allowed = w.allowed
        if layer == cfg.n_layers - 1:  # from here on only the read-out position
            ar = torch.arange(R, device=resid.device)
            q, allowed, resid = q[ar, :, w.at][:, :, None], allowed[ar, :, w.at][:, :, None], resid[ar, w.at][:, None]
        _, zc = self._attend(q, k, v, allowed)
        Tq, H, E = zc.shape[2], cfg.n_heads, cfg.d_head
        attn = torch.addmm(blk.b_O, zc.transpose(1, 2).reshape(R * Tq, H * E), blk.W_O.reshape(H * E, -1))
        mid = resid + attn.view(R, Tq, -1)
        if cfg.has_mlp:
            mid = mid + self._mlp(blk, resid if cfg.parallel else mid)
        return mid[:, 0] if layer == cfg.n_layers - 1 else mid

    def receiver_input_grads(self, out: RunOutput, grads: "list[torch.Tensor] | tuple[torch.Tensor, ...]"
                             ) -> list[torch.Tensor]:
        """Gradients in the ``receiver_grads=True`` layout from those of ``out.grad_inputs`` (a list)."""
        return list(self.iter_receiver_input_grads(out, grads))

    def iter_receiver_input_grads(self, out: RunOutput, grads: "list[torch.Tensor] | tuple[torch.Tensor, ...]"
                                  ) -> Iterator[torch.Tensor]:
        """Receiver-input gradients one receiver group at a time, in the ``receiver_grads=True`` order.

        For a ``receiver_grads="projected"`` run, head h's q-input gradient is
        J_normᵀ W_Q[h] ∂m/∂q_h (likewise k, v): one batched matmul and the norm's
        vector-Jacobian product per layer, [B, 3, H, P, D].  Other runs' grads pass through.
        Lazily, so that a consumer contracting each group at once holds one layer's [B, 3, H, P, D]
        at a time, not all of them (GPT-2 small, 24 x 40 tokens: 106 MB instead of 1.3 GB).
        """
        if not out.probed:
            yield from grads
            return
        cfg = self.cfg
        probed = dict(out.probed)
        it = iter(grads)
        for layer in range(min(probed), cfg.n_layers):
            blk = self.blocks[layer]
            g = torch.stack([next(it) for _ in range(3)], dim=1)  # [B, 3, H, P, E]
            B, _, H, P, E = g.shape
            W = torch.stack((blk.W_Q, blk.W_K, blk.W_V)).reshape(3 * H, cfg.d_model, E)
            gx = self._norm_vjp_heads(probed[layer], blk.ln1_w, g.permute(1, 2, 0, 3, 4).reshape(3 * H, B * P, E), W)
            yield gx.view(3, H, B, P, cfg.d_model).permute(2, 0, 1, 3, 4)
            if cfg.has_mlp:
                yield next(it)
        yield next(it)

    def _norm_vjp_heads(self, x: torch.Tensor, w: torch.Tensor, gp: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        """[R, B*P, D]: for each head-kind r, the norm's VJP at input x [B, P, D] of gp[r] @ W[r]ᵀ.

        The norm's backward, rstd (g - mean g - x̂ mean(g x̂)) with g = (gp Wᵀ) ⊙ w, is assembled so
        that its row means come from d_head-wide products: besides one bmm only two passes touch
        the [R, B*P, D] result.
        """
        cfg = self.cfg
        ct = torch.promote_types(gp.dtype, torch.float32)  # float32 at least (float64 models stay so)
        Wt = W.transpose(1, 2).to(ct)  # [R, E, D]
        if cfg.norm == "none":
            return torch.bmm(gp.to(ct), Wt)
        Wt = Wt * w.to(ct)
        D = x.shape[-1]
        xf = x.detach().to(ct).reshape(-1, D)  # [B*P, D]
        if cfg.norm == "layernorm":
            xf = xf - xf.mean(-1, keepdim=True)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + cfg.norm_eps)  # [B*P, 1]
        xh = xf * rstd
        gps = gp.to(ct) * rstd  # rstd folded into the narrow side
        out = torch.bmm(gps, Wt)  # rstd * g
        mean_gxh = (gps * torch.matmul(Wt, xh.T).transpose(1, 2)).sum(-1, keepdim=True) / D  # rstd * mean(g x̂)
        if cfg.norm == "layernorm":
            out -= torch.bmm(gps, Wt.mean(-1, keepdim=True))  # rstd * mean(g)
        return out.addcmul_(mean_gxh, xh, value=-1)

    def _unembed(self, x: torch.Tensor) -> torch.Tensor:
        """Logits from final residual vectors [..., D]."""
        cfg = self.cfg
        return _norm(cfg.norm, x, self.lnf_w, self.lnf_b, cfg.norm_eps) @ self.unembed + self.b_U

    @staticmethod
    def _allowed(attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, 1, P, P] causal attention over real keys; each position may see itself (no NaN rows).

        A masked position (padding, or a key removed by token mask ablation) keeps its diagonal:
        its own row is still computed from the real keys before it and itself, where HF hides a
        masked key from its own query too. No other query reads a masked key, so the outputs at
        unmasked positions are the same under either choice.
        """
        P = attention_mask.shape[1]
        idx = torch.arange(P, device=attention_mask.device)
        allowed = (idx[None, :] <= idx[:, None])[None, None] & attention_mask.bool()[:, None, None, :]
        return allowed | torch.eye(P, dtype=torch.bool, device=attention_mask.device)

    # ---- pieces ----------------------------------------------------------------------------
    def _edge_delta(self, mask, cf, blocks, layer, n_up, attention: bool, live):
        """Sum over patched upstream edges of (counterfactual − current) for one layer's receivers."""
        graph, cfg = self.graph, self.cfg
        if attention:
            r0 = graph.attention_receiver(layer, "q", 0)
            off = int(graph.edge_offset[r0])
            width = 3 * cfg.n_heads * n_up
        else:
            r0 = graph.mlp_receiver(layer) if layer < cfg.n_layers else graph.logits_receiver
            off = int(graph.edge_offset[r0])
            width = n_up
        if not live[off : off + width].any():  # host copy of the mask's nonzero columns
            return None
        m = mask[:, off : off + width]
        cur = torch.cat(blocks, dim=1)[:, :n_up]
        diff = cf[:, :n_up].to(cur.dtype) - cur  # broadcasts over mean/zero counterfactuals
        m = m.to(cur.dtype)
        B, _, P, D = diff.shape
        flat = diff.reshape(B, n_up, P * D)
        # one batched matmul [B, R, u] x [B, u, P*D] (an einsum here copied both operands)
        if attention:
            return torch.bmm(m.reshape(B, 3 * cfg.n_heads, n_up), flat).reshape(B, 3, cfg.n_heads, P, D)
        return torch.bmm(m[:, None, :], flat).reshape(B, P, D)

    @staticmethod
    def _patch_senders(z, mask, cf, first, live):
        """Replace the masked senders in block ``z`` [B, n, P, D] (senders first..first+n) by cf."""
        n = z.shape[1]
        if not live[first : first + n].any():  # host copy of the mask's nonzero columns
            return z
        m = mask[:, first : first + n].to(z.dtype)
        c = cf[:, first : first + n].to(z.dtype)
        return z + m[:, :, None, None] * (c - z)

    def _attention(self, blk, resid, dense, sparse, allowed, rot, per_head, q_at=None, keep=None, probes=None):
        """Head outputs [B, H, P, D] (or None), the attention output [B, P, D] and the pattern.

        ``q_at`` [B]: compute queries (and everything after) only at that position per row,
        returning [B, 1, ...] tensors; keys and values still span every position.
        """
        cfg = self.cfg
        norm = lambda x: _norm(cfg.norm, x, blk.ln1_w, blk.ln1_b, cfg.norm_eps)  # noqa: E731
        if dense is None:
            q, k_, v = self._project_shared(blk, norm(resid))
        else:
            # unbind, not dense[:, i]: each indexing's backward would zero-fill a full [B, 3, H, P, D]
            q, k_, v = (_per_head(norm(resid[:, None] + d), W) + b[None, :, None, :]
                        for d, (W, b) in zip(dense.unbind(1), ((blk.W_Q, blk.b_Q), (blk.W_K, blk.b_K),
                                                               (blk.W_V, blk.b_V))))
        if sparse is not None:
            kind, h, delta = sparse
            W, b = ((blk.W_Q, blk.b_Q), (blk.W_K, blk.b_K), (blk.W_V, blk.b_V))[kind]
            x = resid + delta if dense is None else resid + dense[:, kind, h] + delta
            one = (norm(x) @ W[h] + b[h])[:, None]
            parts = [q, k_, v]
            t = parts[kind]
            parts[kind] = torch.cat((t[:, :h], one, t[:, h + 1 :]), dim=1)
            q, k_, v = parts
        if probes is not None:  # gradient probes on the projections (before rotary)
            q, k_, v = q + probes[0], k_ + probes[1], v + probes[2]
        if rot is not None:
            q, k_ = self._apply_rotary(q, *rot), self._apply_rotary(k_, *rot)
        if keep is not None:
            keep.append((q, k_, v))
        if q_at is not None:
            ar = torch.arange(q.shape[0], device=q.device)
            q = q[ar, :, q_at][:, :, None]  # [B, H, 1, E]
            allowed = allowed[ar, :, q_at][:, :, None]
        pattern, zc = self._attend(q, k_, v, allowed)
        if per_head:
            return _per_head(zc, blk.W_O), None, pattern
        B, H, Pq, E = zc.shape
        return None, zc.transpose(1, 2).reshape(B, Pq, H * E) @ blk.W_O.reshape(H * E, -1) + blk.b_O, pattern

    def _attend(self, q, k, v, allowed):
        """Attention pattern (float32) and the heads' mixed values [B, H, Pq, E]."""
        scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(self.cfg.d_head)
        scores = scores.masked_fill(~allowed, float("-inf"))
        pattern = scores.softmax(-1)
        return pattern, pattern.to(v.dtype) @ v

    def _project_shared(self, blk, x):
        """q, k, v [B, H, P, E] for one shared normalised input, as one fused matmul."""
        H, E = self.cfg.n_heads, self.cfg.d_head
        W, b = self._fused_qkv(blk)
        B, P, _ = x.shape
        qkv = (x @ W + b).view(B, P, 3, H, E).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]

    @staticmethod
    def _fused_qkv(blk):
        """[D, 3 H E] weights and bias; cached while the weights are frozen and unchanged."""
        params = (blk.W_Q, blk.W_K, blk.W_V, blk.b_Q, blk.b_K, blk.b_V)
        if any(p.requires_grad for p in params) and torch.is_grad_enabled():
            W = torch.stack((blk.W_Q, blk.W_K, blk.W_V)).permute(2, 0, 1, 3).flatten(1)
            return W, torch.stack((blk.b_Q, blk.b_K, blk.b_V)).flatten()
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
        cached = getattr(blk, "_fused_cache", None)
        if cached is None or cached[0] != key:
            with torch.no_grad():
                W = torch.stack((blk.W_Q, blk.W_K, blk.W_V)).permute(2, 0, 1, 3).flatten(1).contiguous()
                b = torch.stack((blk.b_Q, blk.b_K, blk.b_V)).flatten().contiguous()
            cached = (key, W, b)
            object.__setattr__(blk, "_fused_cache", cached)
        return cached[1], cached[2]

    def _mlp(self, blk, x):
        """The MLP's output (a sender) for receiver input x."""
        cfg = self.cfg
        h = _norm(cfg.norm, x, blk.ln2_w, blk.ln2_b, cfg.norm_eps)
        act = ACTIVATIONS[cfg.act]
        if cfg.mlp == "gated":
            pre = act(h @ blk.W_gate) * (h @ blk.W_in + blk.b_in)
        else:
            pre = act(h @ blk.W_in + blk.b_in)
        return pre @ blk.W_out + blk.b_out
