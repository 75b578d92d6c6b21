"""Hostile real-valued config fields are refused by name before a model is built (issue 38 items 4 and 7),
and ``random:`` sets nested fields (rope settings) key by key, validated the same way."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from circuitstat.circuits.loading import load_model, random_hf_model
from circuitstat.circuits.model_source import parse_random_spec
from circuitstat.core.errors import InputError

SHAPE = "hidden_size=32&num_hidden_layers=1&num_attention_heads=2&num_key_value_heads=1&intermediate_size=64&" \
        "vocab_size=64&max_position_embeddings=64"
LLAMA = f"random:llama?{SHAPE}&head_dim=16"
PHI3 = f"random:phi3?{SHAPE}&original_max_position_embeddings=64"
GEMMA2 = f"random:gemma2?{SHAPE}&head_dim=16"


def _cli(source: str):
    from circuitstat.pipelines.cli import app

    return CliRunner().invoke(app, ["model", source, "--logits-only", "--n-inputs", "1", "--length", "4"])


HOSTILE_RANDOM = [
    (f"{GEMMA2}&query_pre_attn_scalar=0", "query_pre_attn_scalar"),  # ZeroDivisionError inside transformers
    (f"{PHI3}&rope_parameters.partial_rotary_factor=-1", "partial_rotary_factor"),
    (f"{LLAMA}&rope_parameters.rope_type=linear&rope_parameters.factor=1e308", "rope_parameters.factor"),
    (f"{LLAMA}&rope_parameters.rope_type=linear&rope_parameters.factor=-1", "rope_parameters.factor"),
    (f"{LLAMA}&rope_scaling.rope_type=dynamic&rope_scaling.factor=-3", "factor"),
    (f"{LLAMA}&rope_parameters.rope_theta=0", "rope_theta"),
    (f"{LLAMA}&rope_parameters.rope_theta=nan", "rope_theta"),
    (f"{LLAMA}&rope_parameters.rope_type=llama3&rope_parameters.factor=8&rope_parameters.low_freq_factor=4&"
     "rope_parameters.high_freq_factor=1&rope_parameters.original_max_position_embeddings=32", "high_freq_factor"),
]


@pytest.mark.parametrize("source, key", HOSTILE_RANDOM)
def test_hostile_values_in_a_random_spec_are_exit_2_naming_the_field(source, key) -> None:
    r = _cli(source)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert key in r.stderr and ("out of range" in r.stderr or "must be above" in r.stderr), r.stderr
    assert "half precision" not in r.stderr


def _directory(tmp_path, source: str, **edit) -> str:
    d = tmp_path / "model"
    random_hf_model(source).save_pretrained(d)
    cfg = json.loads((d / "config.json").read_text())
    for key, value in edit.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    (d / "config.json").write_text(json.dumps(cfg))  # NaN as JSON's common extension, as json writes it
    return str(d)


@pytest.mark.parametrize("source, edit, key", [
    (PHI3, {"partial_rotary_factor": -1}, "partial_rotary_factor"),
    (PHI3, {"rope_parameters": {"partial_rotary_factor": -1}}, "partial_rotary_factor"),
    (LLAMA, {"rope_parameters": {"rope_type": "linear", "factor": 1e308}}, "factor"),
    (LLAMA, {"rope_scaling": {"rope_type": "linear", "factor": -1.0}}, "factor"),
    (LLAMA, {"rope_parameters": {"rope_type": "dynamic", "factor": -3.0}}, "factor"),
    (LLAMA, {"rope_parameters": {"rope_theta": 0.0}}, "rope_theta"),
    (LLAMA, {"rope_parameters": {"rope_theta": math.nan}}, "rope_theta"),
    (GEMMA2, {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar"),
])
def test_hostile_values_in_config_json_are_refused_by_name(tmp_path, source, edit, key) -> None:
    path = _directory(tmp_path, source, **edit)
    with pytest.raises(InputError, match=key):
        load_model(path)
    r = _cli(path)
    assert r.exit_code == 2 and key in r.stderr and "Traceback" not in r.output, r.output


def test_a_model_in_memory_with_a_hostile_rope_factor_is_refused_before_conversion() -> None:
    from circuitstat.circuits.convert import from_hf

    hf = random_hf_model(LLAMA)
    hf.config.rope_parameters = {"rope_type": "linear", "factor": 1e308, "rope_theta": 10000.0}
    with pytest.raises(InputError, match="rope_parameters.factor"):
        from_hf(hf)


def test_random_sets_nested_rope_fields_and_they_take_effect() -> None:
    """rope_parameters.KEY=VALUE (or the old name rope_scaling) reaches the HF config and the converted
    model, whose logits match HF's; the family's other rope keys are kept."""
    import torch

    from circuitstat.circuits.convert import from_hf

    values = parse_random_spec(f"{LLAMA}&rope_scaling.rope_type=linear&rope_scaling.factor=2").values
    assert values["rope_parameters"] == {"rope_type": "linear", "factor": 2}
    hf = random_hf_model(f"{LLAMA}&rope_parameters.rope_type=linear&rope_parameters.factor=4")
    assert hf.config.rope_parameters["factor"] == 4 and hf.config.rope_parameters["rope_theta"] == 10000.0
    cm = from_hf(hf)
    assert cm.cfg.rope == {"rope_type": "linear", "factor": 4.0}
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(cm(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)
    plain = random_hf_model(LLAMA)
    # the factor reached the computation: HF's linear schedule divides every frequency by it
    torch.testing.assert_close(hf.model.rotary_emb.inv_freq * 4, plain.model.rotary_emb.inv_freq)


@pytest.mark.parametrize("query, needle", [
    ("n_layer=2&n_layer=3", "more than once"),
    ("foo.bar=1", "not a nested config field"),
    ("rope_parameters=1&rope_parameters.factor=2", "both whole and key by key"),
    ("rope_scaling.factor=2&rope_parameters.factor=2", "both rope_scaling and rope_parameters"),
])
def test_malformed_nested_random_keys_are_refused(query, needle) -> None:
    with pytest.raises(InputError, match=needle):
        parse_random_spec(f"random:llama?{query}")
