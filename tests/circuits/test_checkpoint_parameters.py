"""circuitstat.circuits.skeleton.checkpoint_parameters (issue 43, item 2): a checkpoint's parameter count from its
config alone, for every family of the README's table, against the oracle ``sum(p.numel())`` of the Hugging Face
model built from the same config on the meta device (nothing allocated). Before: the plan quoted the memory
check's upper bound (K/V ungrouped, every MLP gated, untied embeddings, a position table): 9,373,947,136 for
Llama-3.1-8B, which has 8,030,261,248."""

from __future__ import annotations

import pytest
import torch
import transformers

from families import FAMILIES, hf_config

from circuitstat.circuits.convert import SUPPORTED
from circuitstat.circuits.skeleton import checkpoint_parameters

SMALL = dict(vocab_size=97, max_position_embeddings=64)
NATIVE = {  # the two families with their own key names (tests/families.py holds the other 23)
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, vocab_size=97, n_positions=64),
    "gpt_neox": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, **SMALL),
}
# each family's structural switches turned the other way: a formula that ignored one would miss by its size
VARIANTS = [
    ("gpt2", dict(n_inner=48)), ("gpt_neox", dict(tie_word_embeddings=True)),
    ("llama3", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=False)),
    ("qwen3", dict(attention_bias=False)), ("granite", dict(attention_bias=True, mlp_bias=True)),
    ("olmo", dict(attention_bias=True)), ("starcoder2", dict(use_bias=False)),
    ("phi", dict(qk_layernorm=False)), ("cohere", dict(use_qk_norm=False, attention_bias=False)),
    ("stablelm", dict(use_qkv_bias=False, qk_layernorm=False, use_parallel_residual=False)),
    ("falcon", dict(new_decoder_architecture=False, multi_query=True, parallel_attn=True, bias=False)),
    ("falcon", dict(new_decoder_architecture=False, multi_query=False, parallel_attn=False)),
    ("falcon", dict(num_ln_in_parallel_attn=1)), ("gemma2", dict(tie_word_embeddings=False)),
    ("qwen2_moe", dict(shared_expert_intermediate_size=0, mlp_only_layers=[])),
    ("qwen3_moe", dict(decoder_sparse_step=2)),
]
# published config.json values: (config, the count its model card / safetensors index states)
PUBLISHED = {
    "Llama-3.1-8B": (dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                          num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                          max_position_embeddings=131072, tie_word_embeddings=False), 8_030_261_248),
    "Gemma-2-2B": (dict(model_type="gemma2", hidden_size=2304, num_hidden_layers=26, num_attention_heads=8,
                        num_key_value_heads=4, head_dim=256, intermediate_size=9216, vocab_size=256000,
                        max_position_embeddings=8192), 2_614_341_888),
    "Mixtral-8x7B": (dict(model_type="mixtral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                          num_key_value_heads=8, intermediate_size=14336, num_local_experts=8,
                          num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=32768,
                          tie_word_embeddings=False), 46_702_792_704),
}


def config_of(family: str, **overrides):
    if family in NATIVE:
        return transformers.AutoConfig.for_model(family, **{**NATIVE[family], **overrides})
    return hf_config(family, **overrides)


def meta_count(config) -> int:
    """The oracle: the HF model of ``config`` on the meta device, its parameters summed (tied ones once)."""
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in hf.parameters())


def test_the_families_cover_every_supported_model_type():
    """The 25 families of the README's table, each once: a family added later must be added here too."""
    types = {config_of(f).model_type for f in [*NATIVE, *FAMILIES]}
    assert types == set(SUPPORTED) and len(types) == 25


@pytest.mark.parametrize("family", [*NATIVE, *FAMILIES])
def test_the_count_from_the_config_equals_the_meta_models(family):
    config = config_of(family)
    assert checkpoint_parameters(config) == meta_count(config)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize("family, overrides", VARIANTS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(VARIANTS)])
def test_each_structural_switch_is_counted(family, overrides):
    """Negative control built in: each variant changes the oracle's count from the family's default, so the
    formula must follow the switch, not only the default."""
    base, config = config_of(family), config_of(family, **overrides)
    assert meta_count(config) != meta_count(base)
    assert checkpoint_parameters(config) == meta_count(config)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_checkpoints_count_their_published_parameters(name):
    """Two oracles: the count the checkpoint's publisher states, and the meta-device model."""
    values, published = PUBLISHED[name]
    config = transformers.AutoConfig.for_model(**values)
    assert checkpoint_parameters(config) == published == meta_count(config)


def test_the_memory_checks_bound_is_not_the_count():
    """The pre-allocation check's bound (K/V ungrouped, embeddings untied, positions) is an upper bound, never
    the count: Llama-3.1-8B's is the 9,373,947,136 the plan used to print."""
    from circuitstat.circuits.own_format import circuit_parameters

    assert circuit_parameters(32, 32, 4096, 128, 14336, 128256, 131072) == 9_373_947_136
    assert checkpoint_parameters(transformers.AutoConfig.for_model(**PUBLISHED["Llama-3.1-8B"][0])) == 8_030_261_248
