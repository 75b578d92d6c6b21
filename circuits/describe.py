"""What a model's configuration does beyond a plain pre-norm transformer, in the words
``circuitstat model`` prints (and docs/families.md uses): attention scale and soft-caps, windows,
rotary schedules, norms, and how edges are defined where head writes are not additive."""

from __future__ import annotations

from .engine.config import ModelConfig

EDGE_DEFINITION = (
    "heads' outputs are normalised together before the residual add, so a head's write is not additive; "
    "edge u->v adds N_l(S_l + Δz_u) - N_l(S_l) to v's input (S_l the layer's summed head outputs, N_l its "
    "post-attention norm): exact patching computes this, EAP its first-order term J_N Δz_u; a head's out-edges "
    "patched together are the head patched")


def feature_lines(cfg: ModelConfig) -> list[str]:
    """Lines (label padded to 14 columns) for the features ``cfg`` has; none for a plain model."""
    out = []
    attn = []
    if cfg.attn_scalar is not None:
        attn.append(f"scores x query_pre_attn_scalar^-1/2 ({cfg.attn_scalar:g})")
    if cfg.attn_multiplier is not None:
        attn.append(f"scores x attention_multiplier {cfg.attn_multiplier:g} (not d_head^-1/2)")
    if cfg.attn_softcap is not None:
        attn.append(f"tanh soft-cap {cfg.attn_softcap:g}")
    if cfg.sliding_window is not None:
        layers = [i for i in range(cfg.n_layers) if cfg.is_sliding(i)]
        where = "every layer" if len(layers) == cfg.n_layers else f"layers {layers}"
        attn.append(f"sliding window {cfg.sliding_window} on {where}")
    if cfg.clip_qkv is not None:
        attn.append(f"q, k and v clamped to ±{cfg.clip_qkv:g} (part of each head's receivers)")
    if cfg.attn_sinks:
        attn.append("a learned sink logit per head in the softmax's denominator")
    if cfg.qk_norm != "none":
        where = {"head": "per head", "each_head": "per head, each head its own weights",
                 "full": "over the whole projection (couples heads: a head's receiver projects every head from its input)"}
        attn.append(f"q/k {'LayerNorm' if cfg.norm == 'layernorm' else 'RMSNorm'} {where[cfg.qk_norm]}")
    if attn:
        out.append("attention     " + "; ".join(attn))
    if cfg.positional == "rotary" and (cfg.rope or cfg.rope_local or cfg.rotary_dim != cfg.d_head or cfg.rope_layers
                                       or cfg.rotary_interleaved):
        rope = f"rotary {(cfg.rope or {}).get('rope_type', 'default')} base {cfg.rotary_base:g}"
        if cfg.rotary_interleaved:
            rope += ", interleaved pairs (2i, 2i+1)"
        if cfg.rotary_dim != cfg.d_head:
            rope += f", {cfg.rotary_dim} of {cfg.d_head} dims"
        if cfg.rope_local is not None:
            rope += f"; sliding layers {cfg.rope_local.get('rope_type', 'default')} base {cfg.rope_local['rope_theta']:g}"
        if cfg.rope_layers is not None:
            rope += f"; no rotary (NoPE) on layers {[i for i in range(cfg.n_layers) if not cfg.is_rotary(i)]}"
        if cfg.rope_max_positions is not None:
            rope += f"; exact up to {cfg.rope_max_positions} tokens (longer prompts refused)"
        out.append("rotary        " + rope)
    norms = []
    if not cfg.pre_norm:
        norms.append("no pre-norms")
    if cfg.post_norm:
        norms.append("norms on attention and MLP outputs" + (" (sandwich)" if cfg.pre_norm else ""))
    if cfg.embed_scale is not None:
        norms.append(f"embeddings x {cfg.embed_scale:.4g}")
    if cfg.embed_multiplier is not None:
        norms.append(f"embeddings x {cfg.embed_multiplier:g}")
    if cfg.logits_scaling is not None:
        norms.append(f"logits / {cfg.logits_scaling:g}")
    if cfg.logit_scale is not None:
        norms.append(f"logits x {cfg.logit_scale:g}")
    if cfg.logit_softcap is not None:
        norms.append(f"logits tanh soft-cap {cfg.logit_softcap:g}")
    if cfg.tied_embeddings:
        norms.append("tied embeddings")
    if norms:
        out.append("stream        " + "; ".join(norms))
    if cfg.moe is not None:
        out.append("experts       " + moe_line(cfg))
    if not cfg.additive_writes:
        out.append("edge def      " + EDGE_DEFINITION)
    return out


def moe_line(cfg: ModelConfig) -> str:
    """The mixture-of-experts block in words, with the edge definition its graph keeps (``cfg.moe_nodes``: one MLP
    node, or one sender per expert; circuitstat.circuits.moe_nodes)."""
    m = cfg.moe
    where = "every layer" if len(m["sparse_layers"]) == cfg.n_layers else f"layers {m['sparse_layers']}"
    routing = ("top-k of the router logits, softmax over them" if m["routing"] == "topk_softmax" else
               "softmax, top-k" + (", renormalised" if m["norm_topk"] else ""))
    shared = f" + sigmoid-gated shared expert (width {m['d_shared']})" if m["d_shared"] else ""
    if m["act"] == "swiglu_clamp":
        shared += f"; clamped SwiGLU (alpha {m['swiglu_alpha']:g}, limit {m['swiglu_limit']:g}) with biases"
    nodes = ("each expert is its own sender m{L}.e{J} (the shared expert m{L}.shared), the receiver stays the "
             "block's input m{L}" if getattr(cfg, "moe_nodes", "block") == "experts" else
             "the block (router and experts) is one MLP node")
    return (f"{m['top_k']} of {m['experts']} experts (width {m['d_expert']}) per token on {where}{shared}; "
            f"router: {routing}; {nodes}, so a patched input re-routes")
