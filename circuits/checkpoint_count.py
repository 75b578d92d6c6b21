"""A checkpoint's parameter count from its config alone (what ``attribute --plan`` reports, nothing built)."""

from __future__ import annotations

# ---- the checkpoint's parameter count, from its config alone ------------------------------------------------------
_TIED_DEFAULT = False  # transformers' PretrainedConfig default; each family's config class sets its own


def _get(config, *names, default=None):
    """The first of ``names`` that ``config`` sets (not None), else ``default``."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _attention_parameters(config, t: str, D: int, H: int, Hkv: int, dh: int) -> int:
    """One layer's attention in the checkpoint: the projections as stored (K/V grouped, Falcon's fused layouts),
    their biases and q/k norms, GPT-OSS's sinks."""
    q, kv = H * dh, Hkv * dh
    if t == "falcon":
        new, mq = bool(config.new_decoder_architecture), bool(config.multi_query)
        qkv = (H + 2 * Hkv) * dh if new else (H + 2) * dh if mq else 3 * D
        return (qkv + D) * D + (qkv + D if config.bias else 0)
    weights = (2 * q + 2 * kv) * D
    bias_qkv = {"gpt2": True, "gpt_neox": True, "qwen2": True, "qwen2_moe": True, "phi": True, "gptj": False,
                "starcoder2": bool(_get(config, "use_bias", default=True)), "gpt_oss": True,
                "stablelm": bool(_get(config, "use_qkv_bias", default=False))}.get(
        t, bool(_get(config, "attention_bias", default=False)))
    bias_o = {"gpt2": True, "gpt_neox": True, "phi": True, "gpt_oss": True, "qwen2": False, "qwen2_moe": False,
              "gptj": False, "stablelm": False, "starcoder2": bool(_get(config, "use_bias", default=True))}.get(
        t, bool(_get(config, "attention_bias", default=False)))
    total = weights + (q + 2 * kv if bias_qkv else 0) + (D if bias_o else 0)
    if t in ("qwen3", "qwen3_moe", "gemma3_text"):
        total += 2 * dh  # per-head RMSNorm weights shared by every head
    elif t in ("olmo2", "olmoe"):
        total += q + kv  # over the whole projection
    elif t == "cohere" and config.use_qk_norm:
        total += q + kv  # [H, dh] and [Hkv, dh]
    elif t == "stablelm" and config.qk_layernorm:
        total += q + kv  # one bias-free LayerNorm per head
    elif t == "phi" and config.qk_layernorm:
        total += 4 * dh  # one LayerNorm with bias over d_head, for q and for k
    return total + (H if t == "gpt_oss" else 0)


def _norm_parameters(config, t: str, D: int) -> tuple[int, int]:
    """(per layer, final) norm parameters: weights, and biases where the family's norm has them."""
    if t == "olmo":
        return 0, 0  # LayerNorm without weight or bias
    width = 2 * D if t in ("gpt2", "gpt_neox", "starcoder2", "phi", "gptj", "stablelm", "falcon") else D
    if t in ("phi", "gptj", "cohere"):
        per_layer = 1  # one norm feeds the parallel attention and MLP
    elif t == "stablelm":
        per_layer = 1 if config.use_parallel_residual else 2
    elif t == "falcon":
        new = config.new_decoder_architecture
        per_layer = (2 if (config.num_ln_in_parallel_attn or 2) == 2 else 1) if new else \
            1 if config.parallel_attn else 2
    elif t in ("gemma2", "gemma3_text"):
        per_layer = 4  # the sandwich: before and after attention and MLP
    else:
        per_layer = 2  # before attention and MLP; OLMo 2: after them
    return per_layer * width, width


def _mlp_parameters(config, t: str, layer: int, D: int) -> int:
    """The MLP (or mixture-of-experts block) of ``layer`` in the checkpoint."""
    keys = {"gpt2": ("n_inner",), "gptj": ("n_inner",), "falcon": ("ffn_hidden_size",)}.get(t, ("intermediate_size",))
    F = _get(config, *keys, default=4 * D)
    if t in ("gpt2", "gpt_neox", "phi", "gptj", "falcon", "starcoder2"):
        bias = bool(config.bias) if t == "falcon" else bool(_get(config, "use_bias", default=True))
        return 2 * D * F + ((F + D) if bias else 0)
    gated = 3 * D * F + ((2 * F + D) if _get(config, "mlp_bias", default=False) else 0)
    if t not in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss"):
        return gated
    if t in ("qwen2_moe", "qwen3_moe"):
        step = config.decoder_sparse_step
        if layer in (config.mlp_only_layers or []) or not (config.num_experts > 0 and (layer + 1) % step == 0):
            return gated
    X = _get(config, "num_local_experts", "num_experts")
    Fx = _get(config, "moe_intermediate_size", "intermediate_size")
    total = X * D + X * 3 * D * Fx  # router and experts
    if t == "gpt_oss":
        total += X + X * (2 * Fx + D)  # router bias, expert biases
    if t == "qwen2_moe":  # the shared expert and its sigmoid gate (a gate even where the expert's width is 0)
        total += 3 * D * (config.shared_expert_intermediate_size or 0) + D
    return total


def checkpoint_parameters(config: "transformers.PretrainedConfig") -> int:
    """The parameters of the Hugging Face checkpoint that transformers config ``config`` describes, counted from
    its fields (tied embeddings once, K/V grouped as stored, every expert): what ``sum(p.numel())`` of the model
    would give, before building it."""
    t = config.model_type
    D = _get(config, "hidden_size", "n_embd")
    L = _get(config, "num_hidden_layers", "n_layer")
    H = _get(config, "num_attention_heads", "n_head")
    Hkv = _get(config, "num_key_value_heads", "num_kv_heads", default=H)
    if t == "falcon" and not config.new_decoder_architecture:
        Hkv = 1 if config.multi_query else H
    dh = _get(config, "head_dim", default=D // H) if t not in ("gpt2", "gpt_neox", "gptj", "phi", "falcon") \
        else D // H
    V = config.vocab_size
    per_norm, final = _norm_parameters(config, t, D)
    layers = sum(_attention_parameters(config, t, D, H, Hkv, dh) + per_norm + _mlp_parameters(config, t, layer, D)
                 for layer in range(L))
    embeddings = V * D * (1 if _get(config, "tie_word_embeddings", default=_TIED_DEFAULT) else 2)
    positions = config.n_positions * D if t == "gpt2" else 0
    head_bias = V if t in ("phi", "gptj") else 0
    return layers + final + embeddings + positions + head_bias
