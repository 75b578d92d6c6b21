"""The mixture-of-experts MLP node: router, top-k selection, experts and an optional shared expert.

The sparse block is ONE MLP sender (``m{L}``) and its input ONE MLP receiver: the router and every
expert sit inside the node, so the edge graph is the dense one.  A receiver's patched input goes
through the router, so exact patching changes which experts a token uses; gradients (EAP) flow
through the selected experts and their softmax weights (the top-k selection is piecewise constant,
as in autograd on the HF model).  Formulas follow transformers 5:

* ``softmax_topk`` (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE: ``*TopKRouter``): p = softmax(x W_r) in
  float32, the top-k of p, renormalised to sum 1 when ``norm_topk`` (Mixtral always);
* ``topk_softmax`` (GPT-OSS's GptOssTopKRouter): the top-k of the logits x W_r + b_r, then a
  softmax over those k;
* experts: gated MLPs act(x W_g + b_g) * (x W_u + b_u) W_d + b_d, or GPT-OSS's clamped SwiGLU
  (gate clamped above at ``limit``, up clamped to [-limit, limit], gate * sigmoid(alpha gate) * (up + 1));
* the token's output is Σ_selected w_e expert_e(x) (+ sigmoid(x w_s) shared(x): Qwen2-MoE's shared expert).

``ModelConfig.moe`` holds the block's shape (circuitstat.circuits.engine.moe_config.KEYS); layers outside
``sparse_layers`` have a dense gated MLP of width ``d_mlp`` (Qwen2/3-MoE's ``mlp_only_layers`` and ``decoder_sparse_step``).
"""

from __future__ import annotations

import torch

from .config import ModelConfig, compute_dtype

def is_sparse(cfg: ModelConfig, layer: int) -> bool:
    """Whether ``layer``'s MLP node is the MoE block."""
    return cfg.moe is not None and layer in cfg.moe["sparse_layers"]


def parameter_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of an MoE layer's weights (x W convention: inputs on the left)."""
    m, D = cfg.moe, cfg.d_model
    X, F_, S = m["experts"], m["d_expert"], m["d_shared"]
    shapes = {"W_router": (D, X), "b_router": (X,), "We_gate": (X, D, F_), "be_gate": (X, F_),
              "We_in": (X, D, F_), "be_in": (X, F_), "We_out": (X, F_, D), "be_out": (X, D)}
    if S:
        shapes.update({"Ws_gate": (D, S), "Ws_in": (D, S), "Ws_out": (S, D), "w_shared": (D,)})
    return shapes


def route(cfg: ModelConfig, blk, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(selected experts [N, k], their weights [N, k] in float32 or wider) of tokens ``x`` [N, D]."""
    m = cfg.moe
    logits = x @ blk.W_router + blk.b_router
    wide = compute_dtype(logits.dtype)  # float32 as HF (float64 for a float64 model)
    if m["routing"] == "topk_softmax":  # GptOssTopKRouter: top-k of the logits, softmax over them
        top, idx = torch.topk(logits, m["top_k"], dim=-1)
        return idx, torch.softmax(top.to(wide), dim=-1)
    probs = torch.softmax(logits.to(wide), dim=-1)  # MixtralTopKRouter: softmax in float32, then top-k
    top, idx = torch.topk(probs, m["top_k"], dim=-1)
    if m["norm_topk"]:
        top = top / top.sum(-1, keepdim=True)
    return idx, top


def _expert(cfg: ModelConfig, blk, e: int, x: torch.Tensor, act) -> torch.Tensor:
    """Expert ``e``'s output for tokens ``x`` [n, D]."""
    gate = x @ blk.We_gate[e] + blk.be_gate[e]
    up = x @ blk.We_in[e] + blk.be_in[e]
    if cfg.moe["act"] == "swiglu_clamp":  # GptOssExperts._apply_gate
        limit, alpha = cfg.moe["swiglu_limit"], cfg.moe["swiglu_alpha"]
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
        hidden = (up + 1) * (gate * torch.sigmoid(gate * alpha))
    else:
        hidden = act(gate) * up
    return hidden @ blk.We_out[e] + blk.be_out[e]


def moe_block(cfg: ModelConfig, blk, h: torch.Tensor, act, parts: bool = False):
    """The MoE block's output for normalised inputs ``h`` [..., D] (``act``: the experts' activation).

    ``parts``: also each expert's write [..., X (+1), D] (experts as nodes): w_J(x) expert_J(x) at the tokens
    that selected J, else 0, then the shared expert's sigmoid(x w_s) shared(x); the output is computed as
    without ``parts`` (bit for bit), and equals their sum up to rounding."""
    shape = h.shape
    x = h.reshape(-1, shape[-1])
    idx, weights = route(cfg, blk, x)
    out = torch.zeros_like(x)
    n_parts = cfg.moe["experts"] + (1 if cfg.moe["d_shared"] else 0)
    each = x.new_zeros(x.shape[0], n_parts, x.shape[1]) if parts else None
    # one pass per expert that some token selected (as HF's experts loop): tokens and their top-k slots
    for e in torch.unique(idx).tolist():
        tok, slot = torch.where(idx == e)
        y = _expert(cfg, blk, e, x[tok], act)
        write = (y * weights[tok, slot, None]).to(x.dtype)
        out = out.index_add(0, tok, write)
        if parts:
            each[tok, e] = write  # a token selects an expert once (top-k indices are distinct)
    if cfg.moe["d_shared"]:  # Qwen2MoeSparseMoeBlock: sigmoid-gated shared expert, on every token
        shared = (act(x @ blk.Ws_gate) * (x @ blk.Ws_in)) @ blk.Ws_out
        shared = torch.sigmoid(x @ blk.w_shared[:, None]) * shared  # a matmul: FLOPs counted as --plan counts them
        out = out + shared
        if parts:
            each[:, -1] = shared
    if parts:
        return out.reshape(shape), each.reshape(*shape[:-1], n_parts, shape[-1])
    return out.reshape(shape)


def mlp_params(cfg: ModelConfig, layer: int) -> int:
    """Weights of ``layer``'s MLP node (without its norms): all experts held, router, shared expert."""
    if not is_sparse(cfg, layer):
        return cfg.d_mlp * cfg.d_model * 3 + cfg.d_mlp + cfg.d_model
    total = 0
    for shape in parameter_shapes(cfg).values():
        n = 1
        for s in shape:
            n *= s
        total += n
    return total


def mlp_flops_per_token(cfg: ModelConfig, layer: int) -> int:
    """Matmul FLOPs of ``layer``'s MLP node per token: the router, the top-k active experts and the shared expert
    (dense layers: the gated MLP)."""
    D = cfg.d_model
    if not is_sparse(cfg, layer):
        return 2 * D * cfg.d_mlp * 3
    m = cfg.moe
    shared = 2 * D * m["d_shared"] * 3 + 2 * D if m["d_shared"] else 0
    return 2 * D * m["experts"] + m["top_k"] * 2 * D * m["d_expert"] * 3 + shared


def active_width(cfg: ModelConfig) -> int:
    """The widest hidden activation per token of any layer's MLP node (memory of one layer's activations)."""
    if cfg.moe is None:
        return cfg.d_mlp
    sparse = cfg.moe["top_k"] * cfg.moe["d_expert"] + cfg.moe["d_shared"] + cfg.moe["experts"]
    dense = cfg.d_mlp if len(cfg.moe["sparse_layers"]) < cfg.n_layers else 0
    return max(sparse, dense)
