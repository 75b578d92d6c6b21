"""The families' small shapes: what ``random:ARCH`` starts from, and what a model's bytes per parameter are.

Torch-free data, read by the loader (circuitstat.circuits.loading builds random models from it) and by the
service's pricing (circuitstat.pipelines.service.pricing prices them before anything is built), so the two
never disagree.
"""

from __future__ import annotations

__all__ = ["BYTES_PER_PARAM", "GPT2_CONFIG", "MOE_SMALL", "POINTERS", "SMALL"]

BYTES_PER_PARAM = 4 * 2
"""float32, held twice while loading (the HF model and its converted copy)."""

GPT2_CONFIG = {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257, "n_positions": 1024}
"""transformers.GPT2Config's shape: ``random:gpt2`` starts from it (its small shape is empty)."""

_LLAMA = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
              intermediate_size=688, vocab_size=32000, max_position_embeddings=2048)
_MOE_BASE = dict(_LLAMA, num_experts_per_tok=2)
MOE_SMALL = {  # mixture-of-experts families (circuitstat.circuits.convert_moe): 4 experts, 2 active per token
    "mixtral": dict(_MOE_BASE, head_dim=32, num_local_experts=4),
    "qwen2_moe": dict(_MOE_BASE, num_experts=4, moe_intermediate_size=172, shared_expert_intermediate_size=688),
    "qwen3_moe": dict(_MOE_BASE, head_dim=32, num_experts=4, moe_intermediate_size=172),
    "olmoe": dict(_MOE_BASE, num_experts=4),
    # yarn's factor 32 over 4096 original positions: the context it implies (HF warns on any other)
    "gpt_oss": dict(_MOE_BASE, head_dim=32, num_local_experts=4, sliding_window=128, layer_types=None,
                    max_position_embeddings=131072),
}

# HF defaults for these families describe multi-billion-parameter models; random: specs start
# from small shapes instead (every key can still be overridden in the spec).
SMALL: dict[str, dict] = {
    "gpt_neox": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                     vocab_size=50304, max_position_embeddings=2048),
    "llama": dict(_LLAMA),
    "qwen2": dict(_LLAMA),
    "gpt2": {},
}
# the decoder families of circuitstat.circuits.convert.FAMILIES: the same small shape (head_dim where the config
# class has the field; the others use hidden_size // heads)
_NO_HEAD_DIM = ("phi3", "olmo2", "granite", "smollm3", "olmo", "starcoder2")
for _arch in ("qwen3", "mistral", "gemma2", "gemma3_text", "gemma", *_NO_HEAD_DIM):
    SMALL[_arch] = dict(_LLAMA, **({} if _arch in _NO_HEAD_DIM else {"head_dim": 32}))
SMALL["phi3"].update(original_max_position_embeddings=2048)
for _arch in ("gemma2", "gemma3_text"):
    SMALL[_arch].update(query_pre_attn_scalar=32)
SMALL.update(MOE_SMALL)
# the dense families of circuitstat.circuits.convert_dense
for _arch in ("phi", "cohere", "stablelm"):
    SMALL[_arch] = dict(_LLAMA)
SMALL["gptj"] = dict(n_embd=256, n_layer=4, n_head=8, rotary_dim=16, n_inner=1024, vocab_size=32000, n_positions=2048)
SMALL["falcon"] = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_kv_heads=8,
                       ffn_hidden_size=1024, vocab_size=32000, max_position_embeddings=2048)

# the supported families, in the order refusals list them (circuitstat.circuits.convert.SUPPORTED reads it)
SMALL = {arch: SMALL[arch] for arch in ("gpt2", "gpt_neox", "llama", "qwen2", "qwen3", "mistral", "gemma2",
                                        "gemma3_text", "phi3", "olmo2", "gemma", "granite", "smollm3", "olmo",
                                        "starcoder2", "phi", "gptj", "cohere", "stablelm", "falcon", *MOE_SMALL)}

# model types that are not a family but hold one: where the supported family is, in the refusal
POINTERS = {
    "gemma3": "'gemma3' is Gemma 3's vision-language model (Gemma3ForConditionalGeneration); its text-only models "
              "(Gemma3ForCausalLM, e.g. gemma-3-1b) are supported as model type 'gemma3_text': use a "
              "gemma3_text checkpoint (or random:gemma3_text)",
}
