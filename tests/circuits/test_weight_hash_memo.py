"""The weight-hash memo (circuitstat.circuits.cache): a reload of unchanged files skips hashing; any rewrite of
the weights, another dtype or a corrupt memo falls back to hashing the weights themselves."""

from __future__ import annotations

import os

import pytest
import torch

from circuitstat.circuits import load_model
from circuitstat.circuits.model import CircuitModel, ModelConfig

CFG = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_head=8, d_mlp=32, vocab_size=50, n_ctx=16)


@pytest.fixture()
def saved(tmp_path, monkeypatch):
    monkeypatch.setenv("CIRCUITSTAT_CACHE", str(tmp_path / "cache"))
    return CircuitModel(CFG).init_weights(3).save(tmp_path / "m")


def _no_hashing(monkeypatch):
    def fail(state):
        raise AssertionError("the weights were hashed")
    monkeypatch.setattr(CircuitModel, "_hash_weights", staticmethod(fail))


def test_a_reload_takes_the_hash_from_the_memo(saved, monkeypatch):
    first = load_model(saved)
    digest = first.weight_hash()  # computed from the weights, then recorded
    assert digest == CircuitModel._hash_weights(sorted(first.state_dict().items()))
    _no_hashing(monkeypatch)
    assert load_model(saved).weight_hash() == digest


def test_rewritten_weights_other_dtypes_and_bad_memos_are_hashed_again(saved, monkeypatch, tmp_path):
    digest = load_model(saved).weight_hash()
    # another dtype hashes other bytes: its own memo entry
    half = load_model(saved, dtype=torch.float64)
    assert half.weight_hash() != digest
    # the same weights rewritten (new ctime, even with the old mtime restored): not trusted
    st = os.stat(saved / "model.safetensors")
    other = CircuitModel(CFG).init_weights(4)
    other.save(saved)
    os.utime(saved / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    reloaded = load_model(saved)
    assert reloaded.weight_hash() == CircuitModel._hash_weights(sorted(other.state_dict().items())) != digest
    # a corrupt memo is ignored (hashed again), never echoed
    for memo in (tmp_path / "cache" / "weight-hashes").iterdir():
        memo.write_text("not a digest")
    assert load_model(saved).weight_hash() == reloaded.weight_hash()


def test_in_place_changes_after_loading_invalidate_the_memoised_hash(saved, monkeypatch):
    load_model(saved).weight_hash()
    m = load_model(saved)
    before = m.weight_hash()
    with torch.no_grad():
        m.W_E.add_(1.0)
    assert m.weight_hash() != before
