"""Real-checkpoint layout for the new families: a Hugging Face cache directory (models--org--name/snapshots/
<rev>, refs/main) holding sharded safetensors (model.safetensors.index.json) in bfloat16 or float16, loaded
by ``org/name@revision`` without network, at parity with transformers reading the same files."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from families import batch, hf_model

from circuitstat.circuits import load_model

COMMIT = "c" * 40


def _cache(tmp_path, monkeypatch, family: str, dtype: torch.dtype):
    """A fake HF cache holding one sharded ``dtype`` checkpoint of ``family``; returns its snapshot directory."""
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = tmp_path / "hub" / f"models--org--tiny-{family}"
    snap = repo / "snapshots" / COMMIT
    hf_model(family, seed=5).to(dtype).save_pretrained(snap, max_shard_size="40KB")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snap


@pytest.mark.parametrize("family, dtype", [("gemma2", torch.bfloat16), ("olmo2", torch.float16),
                                           ("llama3", torch.bfloat16)])
def test_sharded_half_precision_checkpoint_from_the_cache_at_parity(tmp_path, monkeypatch, family, dtype):
    snap = _cache(tmp_path, monkeypatch, family, dtype)
    index = json.loads((snap / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # really sharded
    ref = transformers.AutoModelForCausalLM.from_pretrained(snap, dtype=torch.float32, attn_implementation="eager",
                                                            local_files_only=True).eval()
    ids, mask = batch()
    real = mask.bool()
    with torch.no_grad():
        expected = ref(ids, attention_mask=mask).logits
    name = f"org/tiny-{family}"
    for src in (name, f"{name}@{COMMIT}", f"{name}@main"):
        m = load_model(src)
        assert m.source == src and m.dtype == torch.float32  # the stored half values, widened exactly
        with torch.no_grad():
            assert (m(ids, mask) - expected).abs()[real].max() <= 1e-5
    half = load_model(f"{name}@{COMMIT}", dtype=dtype)
    assert half.dtype == dtype
    stored = ref.get_input_embeddings().weight.to(dtype)
    assert torch.equal(half.W_E, stored)  # the checkpoint's own bits, not a rounded float32 copy
    with torch.no_grad():
        err = (half(ids, mask).float() - expected).abs()[real].max()
    assert err <= 0.1 * float(expected[real].abs().max())  # half-precision arithmetic, not a different model


@pytest.mark.parametrize("family", ["gemma3", "olmo2", "phi3", "qwen2"])
def test_converted_family_saves_and_loads_as_a_circuitstat_model(tmp_path, family):
    """The cached-conversion format keeps every family field (rope schedules, windows, norms, soft-caps)."""
    from circuitstat.circuits.convert import from_hf

    m = from_hf(hf_model(family, seed=6))
    back = load_model(m.save(tmp_path / "m"))
    assert back.cfg == m.cfg and back.weight_hash() == m.weight_hash()
    ids, mask = batch()
    with torch.no_grad():
        assert torch.equal(back(ids, mask), m(ids, mask))
