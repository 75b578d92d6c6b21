"""Rotary schedules against transformers' own (modeling_rope_utils, as each model's rotary module
computes them): bit-identical inverse frequencies and attention factors per rope type, logits at the
longest exact prompt, and a clear refusal beyond it."""

from __future__ import annotations

import pytest
import torch
from families import batch, hf_model

from circuitstat.circuits.convert import from_hf
from circuitstat.core.errors import InputError, UnsupportedArchitectureError

SCHEDULES = {
    "linear": {"rope_type": "linear", "factor": 3.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.5},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 16,
             "beta_slow": 2},
    "yarn-mscale": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16, "mscale": 0.7,
                    "mscale_all_dim": 1.0, "truncate": False},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_inv_freq_and_scaling_bit_identical_to_hf(name):
    hf = hf_model("llama3", head_dim=16, rope_parameters={"rope_theta": 20000.0, **SCHEDULES[name]})
    m = from_hf(hf)
    emb = hf.model.rotary_emb
    assert torch.equal(m.inv_freq, emb.inv_freq), name
    ids, mask = batch()
    with torch.no_grad():
        assert (hf(ids, attention_mask=mask).logits - m(ids, mask)).abs()[mask.bool()].max() <= 1e-5
    if name == "dynamic":  # up to max_position_embeddings dynamic NTK is the default schedule, by HF's formula
        return
    # the schedule is not the default one (the test would pass vacuously otherwise)
    plain = from_hf(hf_model("llama3", head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 20000.0}))
    assert not torch.equal(plain.inv_freq, m.inv_freq) or emb.attention_scaling != 1.0


def test_longrope_and_local_rope_bit_identical_to_hf():
    phi = hf_model("phi3")
    m = from_hf(phi)
    assert torch.equal(m.inv_freq, phi.model.rotary_emb.inv_freq)
    assert m.cfg.rope["attention_factor"] == phi.model.rotary_emb.attention_scaling != 1.0
    gemma = hf_model("gemma3")
    g = from_hf(gemma)
    emb = gemma.model.rotary_emb
    assert torch.equal(g.inv_freq, emb.full_attention_inv_freq)
    assert torch.equal(g.inv_freq_local, emb.sliding_attention_inv_freq)
    assert not torch.equal(g.inv_freq, g.inv_freq_local)


@pytest.mark.parametrize("family, overrides, limit", [
    ("phi3", {}, 32),  # longrope: original_max_position_embeddings
    ("llama3", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
                "max_position_embeddings": 12}, 12),
])
def test_length_dependent_schedules_exact_up_to_their_limit_refused_beyond(family, overrides, limit):
    hf = hf_model(family, **overrides)
    m = from_hf(hf)
    assert m.cfg.rope_max_positions == limit
    ids, mask = batch(P=limit)
    with torch.no_grad():
        assert (hf(ids, attention_mask=mask).logits - m(ids, mask)).abs()[mask.bool()].max() <= 1e-5
        longer, _ = batch(P=limit + 1)
        with pytest.raises(InputError, match=f"at most {limit} tokens"):
            m(longer)


def test_unknown_rope_type_and_parameter_refused_by_name():
    with pytest.raises(UnsupportedArchitectureError, match=r"rope_parameters\.rope_type='proportional'"):
        from_hf(hf_model("llama3", rope_parameters={"rope_type": "proportional", "rope_theta": 10000.0}))


@pytest.mark.parametrize("family", ["gptj", "cohere"])
def test_interleaved_rotary_bit_identical_to_hf(family):
    """GPT-J's rotate_every_two (over rotary_dim of d_head) and Cohere's interleaved rotate_half (after a linear
    schedule): queries rotated here equal HF's own apply_rotary_pos_emb on HF's own tables, bit for bit."""
    from importlib import import_module

    from circuitstat.circuits.engine.rotary import apply_rotary, layer_rotary

    hf = hf_model(family)
    m = from_hf(hf)
    mod = import_module(f"transformers.models.{family}.modeling_{family}")
    B, P, H, E = 2, 9, m.cfg.n_heads, m.cfg.d_head
    q = torch.randn(B, P, H, E, generator=torch.Generator().manual_seed(0)) * 3
    pos = torch.arange(P).expand(B, P)
    cos, sin = layer_rotary(m, pos)[False]
    ours = apply_rotary(m.cfg, q.transpose(1, 2), cos, sin).transpose(1, 2)
    if family == "gptj":  # sin/cos from create_sinusoidal_positions; [B, P, H, E], first rotary_dim rotated
        hs, hc = hf.transformer.rotary_emb(q, pos)
        rd = hf.config.rotary_dim
        ref = torch.cat((mod.apply_rotary_pos_emb(q[..., :rd], hs, hc), q[..., rd:]), -1)
        assert rd < E
    else:  # CohereRotaryEmbedding: repeat_interleave'd tables; [B, H, P, E]
        hc, hs = hf.model.rotary_emb(q, pos)
        ref, _ = mod.apply_rotary_pos_emb(q.transpose(1, 2), q.transpose(1, 2), hc, hs)
        ref = ref.transpose(1, 2)
    assert torch.equal(ours, ref), family
    m.cfg.rotary_interleaved = False  # the halves' rotation is another model
    assert not torch.allclose(apply_rotary(m.cfg, q.transpose(1, 2), cos, sin).transpose(1, 2), ref, atol=1e-3)
