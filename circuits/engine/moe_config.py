"""The shape of a mixture-of-experts MLP node as ``ModelConfig.moe`` holds it, and its check (no torch: the config
module validates with it; the block itself is circuitstat.circuits.engine.moe)."""

from __future__ import annotations

from circuitstat.core.errors import InputError

ROUTINGS = ("softmax_topk", "topk_softmax")
EXPERT_ACTS = ("gated", "swiglu_clamp")
#: the keys of ModelConfig.moe and what each must be
KEYS = {
    "experts": "number of routed experts (>= 1)",
    "top_k": "experts per token (1..experts)",
    "d_expert": "hidden width of each routed expert",
    "d_shared": "hidden width of the shared expert (0: none)",
    "norm_topk": "renormalise the top-k softmax weights to sum 1 (softmax_topk only)",
    "routing": f"one of {', '.join(ROUTINGS)}",
    "router_bias": "the router has a bias",
    "expert_bias": "the experts' projections have biases",
    "act": f"the experts' hidden layer (gated: the model's act, as the dense MLP): one of {', '.join(EXPERT_ACTS)}",
    "swiglu_alpha": "GPT-OSS's sigmoid scale (swiglu_clamp)",
    "swiglu_limit": "GPT-OSS's clamp (swiglu_clamp)",
    "sparse_layers": "the layers whose MLP is the MoE block (the others are dense)",
}


def check_moe(cfg) -> None:
    """InputError naming the first key of ``cfg.moe`` that is missing, unknown or out of range."""
    moe = cfg.moe
    if moe is None:
        return
    if not isinstance(moe, dict) or set(moe) != set(KEYS):
        got = set(moe) if isinstance(moe, dict) else set()
        raise InputError(f"model config moe must be a dict with exactly the keys {sorted(KEYS)}; "
                         f"missing {sorted(set(KEYS) - got)}, unknown {sorted(got - set(KEYS))}")
    for key in ("experts", "top_k", "d_expert", "d_shared"):
        v = moe[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "d_shared" else 1):
            raise InputError(f"model config moe.{key} must be an integer ({KEYS[key]}), got {v!r}")
    if moe["top_k"] > moe["experts"]:
        raise InputError(f"model config moe.top_k={moe['top_k']} exceeds moe.experts={moe['experts']}")
    if moe["routing"] not in ROUTINGS or moe["act"] not in EXPERT_ACTS:
        raise InputError(f"model config moe.routing must be one of {ROUTINGS} and moe.act one of {EXPERT_ACTS}")
    layers = moe["sparse_layers"]
    if not isinstance(layers, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int)
                                                    or not 0 <= i < cfg.n_layers for i in layers):
        raise InputError(f"model config moe.sparse_layers must list layer indices in [0, {cfg.n_layers})")
    cfg.moe = {**moe, "sparse_layers": sorted(set(layers))}  # a copy: the caller's dict stays as given
    if not cfg.has_mlp or cfg.mlp != "gated":
        raise InputError("model config moe needs mlp='gated' (dense layers are gated MLPs)")
