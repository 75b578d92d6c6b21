"""A model larger than one device is refused before its weights are read (issue 36 item 3): circuitstat never
splits a model across devices. No GPU here: torch's CUDA queries are replaced by a device of 1 MB."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from circuitstat.circuits.plan import weight_bytes
from circuitstat.core.errors import InputError
from circuitstat.pipelines.runs.attribute.run import prepare_attribute
from circuitstat.pipelines.sources import LOCAL

MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=50257&n_positions=64&seed=1"
OPTS = dict(method="eap", level="edge", ablation="counterfactual", metric=None, n=4, batch_size=2, ig_steps=5, seed=0,
            n_jobs=1, max_memory=None, allow_pickle=False, allow_large=False)


@pytest.fixture
def small_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=10**6))
    loads = []
    monkeypatch.setattr(type(LOCAL), "load", lambda self, *a, **k: loads.append(a) or pytest.fail("weights loaded"))
    return loads


def test_a_model_larger_than_the_device_is_refused_before_loading(small_gpu):
    weights = weight_bytes(LOCAL.skeleton(MODEL).cfg, 4)
    assert weights > 10**6  # the 50,257-token embedding alone is 3.2 MB in float32
    with pytest.raises(InputError, match=r"do not fit on cuda:0 .*does not split it across devices"):
        prepare_attribute(MODEL, "induction", device="cuda:0", dtype="float32", **OPTS)
    assert small_gpu == []


def test_a_model_that_fits_goes_on_to_load(small_gpu):
    with pytest.raises(BaseException, match="weights loaded"):  # got past the check to the (replaced) load
        prepare_attribute(MODEL.replace("50257", "64"), "induction", device="cuda:0", dtype="float32", **OPTS)
