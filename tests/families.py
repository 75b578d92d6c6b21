"""Tiny random-weight Hugging Face models of every decoder family, built offline from transformers' own
config classes, with every quirk switched on: grouped-query attention, windows shorter than the test
prompts, soft-caps in their nonlinear range, scaled rotary schedules, q/k norms, sandwich norms; the dense
families' parallel blocks from one shared norm, interleaved rotary, per-head q/k LayerNorms and lm_head biases.

Weights are redrawn (:func:`scramble`) so that nothing sits at a neutral value (norm weights of 1,
Gemma's 0) and activations are large enough for the soft-caps and norms to bend: a conversion that
dropped one of them would show at the first logit.
"""

from __future__ import annotations

import torch
import transformers
from torch.overrides import TorchFunctionMode

VOCAB = 97
BASE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
            vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)

FAMILIES = {
    # Llama 3.1's rope scaling (original context 16, so the tiny head's frequencies fall in all three bands)
    "llama3": ("llama", dict(head_dim=8, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}, tie_word_embeddings=True)),
    # Qwen 2.5: q/k/v biases; a window of 3 on the second layer
    "qwen2": ("qwen2", dict(use_sliding_window=True, sliding_window=3, max_window_layers=1)),
    # Qwen 3: per-head q/k norms, yarn
    "qwen3": ("qwen3", dict(head_dim=8, attention_bias=True, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16})),
    # Mistral: a window of 3 on every layer, head_dim (16) not hidden_size / heads (8)
    "mistral": ("mistral", dict(head_dim=16, sliding_window=3)),
    # Gemma 2: query_pre_attn_scalar != head_dim, soft-caps in range, window 3 on alternating layers
    "gemma2": ("gemma2", dict(head_dim=8, query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
                              final_logit_softcapping=8.0, sliding_window=3)),
    # Gemma 3: per-head q/k norms, a local (sliding, base 10k) and a global (linear-scaled, base 1M) layer
    "gemma3": ("gemma3_text", dict(head_dim=8, query_pre_attn_scalar=8, sliding_window=3, final_logit_softcapping=8.0,
                                   layer_types=["sliding_attention", "full_attention"], rope_parameters={
                                       "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                       "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}})),
    # Phi-3: fused qkv_proj / gate_up_proj, longrope with partial rotary, a window of 4
    "phi3": ("phi3", dict(original_max_position_embeddings=32, sliding_window=4, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
        "short_factor": [1.5, 3.0], "long_factor": [4.0, 8.0]})),
    # OLMo 2: q/k norms over the whole projection, norms on the attention and MLP outputs only
    "olmo2": ("olmo2", dict()),
    # Gemma 1: (1 + w) RMSNorm, √d embedding scale, GeGLU (tanh GELU), head_dim (16) != hidden / heads (8), tied
    "gemma": ("gemma", dict(head_dim=16)),
    # Granite: every multiplier far from 1 (attention_multiplier 0.6 vs head_dim**-0.5 = 0.35)
    "granite": ("granite", dict(embedding_multiplier=3.0, attention_multiplier=0.6, residual_multiplier=0.4,
                                logits_scaling=2.0)),
    # SmolLM3: layer 1 is a NoPE layer (no rotary) with a window of 3 (use_sliding_window: windows on NoPE layers)
    "smollm3": ("smollm3", dict(no_rope_layers=[1, 0], use_sliding_window=True, sliding_window=3)),
    # OLMo 1: non-parametric LayerNorm, q/k/v clamped at 1.5 (a good share of the projections is clamped)
    "olmo": ("olmo", dict(clip_qkv=1.5)),
    # StarCoder2: LayerNorm with bias, ungated c_fc/c_proj MLP and every projection with a bias, a window of 3
    "starcoder2": ("starcoder2", dict(sliding_window=3)),
    # Phi-2: parallel attention + MLP from one LayerNorm, partial rotary (0.5), biases, q/k LayerNorm, lm_head bias
    "phi": ("phi", dict(qk_layernorm=True, hidden_act="gelu_new", rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
    # GPT-J: parallel from ln_1, interleaved rotary over 4 of 8 features, no q/k/v biases, lm_head bias
    "gptj": ("gptj", dict(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_inner=64, n_positions=64)),
    # Cohere: parallel from one bias-free LayerNorm, interleaved rotary (linear-scaled), per-head q/k norms, logit_scale
    "cohere": ("cohere", dict(use_qk_norm=True, attention_bias=True, logit_scale=0.5, tie_word_embeddings=True,
                              rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})),
    # StableLM 2: partial rotary (0.25 of 8 = 2), q/k/v biases, one LayerNorm per head on q and k, parallel residual
    "stablelm": ("stablelm", dict(use_qkv_bias=True, qk_layernorm=True, use_parallel_residual=True)),
    # Falcon 40B/180B layout: new_decoder_architecture (grouped fused qkv, ln_attn / ln_mlp), biases
    "falcon": ("falcon", dict(new_decoder_architecture=True, num_kv_heads=2, bias=True, ffn_hidden_size=64,
                              tie_word_embeddings=False)),
    # mixture-of-experts (circuitstat.circuits.engine.moe): 4 experts, more than one active per token, router
    # weights scrambled so clean and corrupted prompts route differently (asserted in test_families.py)
    # Mixtral: top-2 renormalised, a window of 3 on every layer
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=3)),
    # Qwen2-MoE: layer 0 sparse with a sigmoid-gated shared expert, layer 1 dense (mlp_only_layers), top-2 not
    # renormalised, q/k/v biases, a window of 3 on layer 0 (Qwen2MoeConfig: even layers below max_window_layers)
    "qwen2_moe": ("qwen2_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                    shared_expert_intermediate_size=24, mlp_only_layers=[1], norm_topk_prob=False,
                                    use_sliding_window=True, sliding_window=3, max_window_layers=1)),
    # Qwen3-MoE: per-head q/k norms, top-3 of 4 renormalised
    "qwen3_moe": ("qwen3_moe", dict(head_dim=8, num_experts=4, num_experts_per_tok=3, moe_intermediate_size=16,
                                    norm_topk_prob=True)),
    # OLMoE: q/k norms over the whole projection with pre-norms, top-2 not renormalised
    "olmoe": ("olmoe", dict(num_experts=4, num_experts_per_tok=2, norm_topk_prob=False)),
    # GPT-OSS: attention sinks, a window of 3 on the first (sliding) layer, full attention on the second, router
    # bias, top-2 of 4 experts with biases and the clamped SwiGLU (limit 1.5: the scrambled activations reach it),
    # yarn rope (original context 16)
    "gpt_oss": ("gpt_oss", dict(head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=3,
                                layer_types=["sliding_attention", "full_attention"], swiglu_limit=1.5,
                                rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                 "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                 "original_max_position_embeddings": 16})),
}

#: GPT-2 and GPT-NeoX (tested against HF in tests/circuits/test_model.py) for the float64 rows, which cover every family
CLASSIC = {
    "gpt2": ("gpt2", dict(n_embd=32, n_layer=2, n_head=4, n_inner=64, n_positions=64)),
    "gpt_neox": ("gpt_neox", dict(num_key_value_heads=None)),
}
#: MoE families: HF's default grouped_mm experts take float32/bf16 only, its eager loop any dtype
MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss")


def hf_config(family: str, **overrides):
    """The transformers config of ``family`` (a key of FAMILIES) with ``overrides``."""
    model_type, extra = FAMILIES[family] if family in FAMILIES else CLASSIC[family]
    base = {k: v for k, v in BASE.items() if model_type not in ("gptj", "gpt2") or k in (
        "vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")}
    kw = {k: v for k, v in {**base, **extra, **overrides}.items() if v is not None}
    return transformers.AutoConfig.for_model(model_type, **kw)


def scramble(hf, seed: int, std: float = 0.35):
    """``hf`` with every weight redrawn (norm weights around their neutral value), in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name or name.split(".")[-2].startswith("ln_"):  # GPT-J, Falcon: ln_1, ln_f, ln_attn
                neutral = 0.0 if hf.config.model_type.startswith("gemma") else 1.0
                p.copy_(neutral + 0.3 * noise)
            elif p.dim() == 1:  # biases
                p.copy_(0.3 * noise)
            else:
                p.copy_(std * noise / max(1.0, (p.shape[-1] / 32) ** 0.5))
    return hf.eval()


def hf_model(family: str, seed: int = 0, **overrides):
    """A scrambled, eager-attention HF model of ``family`` (float32, eval mode)."""
    config = hf_config(family, **overrides)
    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return scramble(hf, seed)


class KeepFloat64(TorchFunctionMode):
    """HF's forward as float64 as its weights: every cast of a float64 tensor to float32 is dropped.

    HF's classes cast down on purpose (``LlamaRMSNorm``: ``hidden_states.to(torch.float32)``; eager attention:
    ``softmax(..., dtype=torch.float32)``; routers: ``router_logits.float()``), so an HF model in float64 computes
    its norms, softmaxes and rotary angles in float32 (logits ~3e-7 relative from float64's).  Under this mode an
    op that reads a float64 tensor gets float64 where it asked for float32 (``.float()`` of a float64 tensor is the
    tensor): the same formulas, in float64.  GPT-2's HF classes never cast down, so for GPT-2 the mode changes
    nothing (checked in tests/circuits/test_families.py)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(isinstance(a, torch.Tensor) and a.dtype == torch.float64 for a in (*args, *kwargs.values())):
            if func is torch.Tensor.float:
                return args[0]
            wide = lambda a: torch.float64 if a is torch.float32 else a  # noqa: E731
            args, kwargs = tuple(wide(a) for a in args), {k: wide(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def hf_model_f64(family: str, seed: int = 0, **overrides):
    """``hf_model(family)`` in float64, to be run under :class:`KeepFloat64` (MoE experts through HF's eager loop).

    GPT-J's sin/cos table is a buffer HF fills in float32 at construction (``create_sinusoidal_positions``); it is
    refilled by the same formula in float64 (angles pos x inv_freq from the same float32 inverse frequencies),
    which is what HF's other families compute under the mode and circuitstat computes in float64."""
    if family in MOE:
        overrides = {"experts_implementation": "eager", **overrides}
    hf = hf_model(family, seed, **overrides).double()
    for module in hf.modules():
        if hasattr(module, "embed_positions"):  # GPTJRotaryEmbedding
            n, dim = module.embed_positions.shape
            inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim))
            angles = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq.double()
            module.embed_positions = torch.cat((angles.sin(), angles.cos()), dim=1)
    return hf


def batch(seed: int = 0, B: int = 3, P: int = 9):
    """Random ids [B, P] and a mask with two right-padded rows (prompts longer than every window)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (B, P), generator=g)
    mask = torch.ones_like(ids)
    mask[1, P - 3 :] = 0
    mask[2, P - 1 :] = 0
    return ids, mask


def hooked_last_logits(hf, task, ids, hooks):
    """HF's logits at each prompt's last real token for ``ids``, with ``hooks`` ((module, hook, is_pre) triples; pre
    hooks take kwargs) registered for this one forward: the HF-only oracles build edges from them."""
    from circuitstat.circuits.ablation import last_index

    handles = [mod.register_forward_pre_hook(h, with_kwargs=True) if pre else mod.register_forward_hook(h)
               for mod, h, pre in hooks]
    try:
        with torch.no_grad():
            logits = hf(ids, attention_mask=task.attention_mask).logits
        return logits[torch.arange(ids.shape[0]), last_index(task.attention_mask)]
    finally:
        for h in handles:
            h.remove()
