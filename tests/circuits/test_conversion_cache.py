"""The conversion cache of Hugging Face checkpoints (circuitstat.circuits.cache.conversion_dir, load_model)."""

from __future__ import annotations

import os

import pytest
import torch

import circuitstat.circuits.loading as loading
from circuitstat.circuits import load_model
from circuitstat.circuits.loading import random_hf_model


@pytest.fixture
def hf_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CIRCUITSTAT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CIRCUITSTAT_CONVERSION_CACHE", "1")
    d = tmp_path / "hf"
    random_hf_model("random:gpt2?n_layer=2&n_head=2&n_embd=16&vocab_size=64&n_positions=16&seed=3").save_pretrained(d)
    return d


def _count_conversions(monkeypatch) -> list:
    calls = []
    real = loading.from_hf
    monkeypatch.setattr(loading, "from_hf", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_second_load_uses_the_cached_conversion_and_equals_a_fresh_one(hf_dir, tmp_path, monkeypatch):
    calls = _count_conversions(monkeypatch)
    first = load_model(hf_dir)
    second = load_model(hf_dir)
    assert calls == [1]  # converted once, then read from the cache
    assert len(list((tmp_path / "cache" / "converted").iterdir())) == 1
    ids = torch.randint(0, 64, (2, 9))
    assert torch.equal(first(ids), second(ids))
    first_id, second_id = first.identity(), second.identity()
    assert first_id.pop("weight_hash_from") == "computed from the weights in this run"
    assert second_id.pop("weight_hash_from").startswith("memo ")  # provenance says the hash was trusted
    assert second_id == first_id and second.source == first.source == str(hf_dir)
    assert second.meta == first.meta == {}
    assert second.dtype == first.dtype == torch.float32
    half = load_model(hf_dir, dtype=torch.bfloat16)  # another dtype is another entry
    assert half.dtype == torch.bfloat16 and calls == [1, 1]


def test_a_changed_checkpoint_or_a_damaged_entry_is_converted_again(hf_dir, tmp_path, monkeypatch):
    calls = _count_conversions(monkeypatch)
    load_model(hf_dir)
    (entry,) = (tmp_path / "cache" / "converted").iterdir()
    (entry / "model.safetensors").write_bytes(b"not a safetensors file")
    again = load_model(hf_dir)
    assert calls == [1, 1] and (entry / "config.json").is_file()  # dropped, converted, cached afresh
    w = hf_dir / "model.safetensors"
    os.utime(w, ns=(w.stat().st_atime_ns, w.stat().st_mtime_ns + 10**9))  # the checkpoint "changed"
    load_model(hf_dir)
    assert calls == [1, 1, 1] and len(list((tmp_path / "cache" / "converted").iterdir())) == 2
    assert again.weight_hash() == load_model(hf_dir).weight_hash()


def test_the_cache_can_be_turned_off(hf_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CIRCUITSTAT_CONVERSION_CACHE", "0")
    calls = _count_conversions(monkeypatch)
    load_model(hf_dir)
    load_model(hf_dir)
    assert calls == [1, 1] and not (tmp_path / "cache" / "converted").exists()
