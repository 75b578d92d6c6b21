"""circuitstat.circuits.plan against the operations the real attribution run performs: its forwards, backwards and suffix rows
counted by wrapping the engine's functions, its FLOPs counted by torch's FlopCounterMode from the shapes actually
multiplied. No timing (bench/plan.py compares the time estimate with measured time).

The data corrupt every token, so every sender's Δz is nonzero at every position and the engine skips no row:
there the plan's counts are exact. On a task that leaves positions clean the engine skips rows, and the plan
is an upper bound (tested too)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from circuitstat.circuits import load_model
from circuitstat.circuits.attribution import attribute
from circuitstat.circuits.plan import method_cost
from circuitstat.circuits.tasks.construct import task_from_token_lists

SOURCES = {
    "gpt2": "random:gpt2?n_layer=2&n_head=4&n_embd=32&vocab_size=97&n_positions=64&seed=1",
    "neox-parallel": "random:gpt_neox?hidden_size=32&num_hidden_layers=2&num_attention_heads=4"
                     "&intermediate_size=64&vocab_size=97&seed=2",
    "llama-gqa": "random:llama?hidden_size=32&num_hidden_layers=2&num_attention_heads=4&num_key_value_heads=2"
                 "&intermediate_size=64&vocab_size=97&seed=3",
}
RUNS = [("exact", "edge"), ("exact", "node"), ("eap", "edge"), ("clean-corrupted", "edge"),
        ("eap-ig-inputs", "edge"), ("eap-ig-activations", "edge")]
N, P, BATCH, STEPS = 3, 6, 2, 2  # a short last batch (3 = 2 + 1)


def _family_model(name: str):
    if name in SOURCES:
        return load_model(SOURCES[name])
    from families import hf_model

    from circuitstat.circuits.convert import from_hf

    return from_hf(hf_model(name, 0))


@pytest.fixture(scope="module", params=[*SOURCES, "gemma2", "olmo2"])  # + post-norm, soft-caps; full q/k norm
def model(request):
    return _family_model(request.param)


def fully_corrupted(model, n: int = N, p: int = P):
    """Random clean prompts and corrupted prompts that differ from them at every position."""
    V = model.cfg.vocab_size
    rng = np.random.default_rng(0)
    clean = rng.integers(3, V, (n, p))
    corrupted = 3 + (clean - 3 + rng.integers(1, V - 3, (n, p))) % (V - 3)  # never equal to clean
    assert (corrupted != clean).all()
    return task_from_token_lists("t", clean.tolist(), corrupted.tolist(), rng.integers(3, V, n).tolist(),
                                 rng.integers(3, V, n).tolist())


@contextlib.contextmanager
def counted(model, monkeypatch):
    """Counts {forwards, backwards, suffix_rows} in examples (rows) while the engine runs."""
    cls, counts = type(model), {"forwards": 0, "backwards": 0, "suffix_rows": 0}
    real_run, real_patched, real_grad = cls.run, cls.patched_layer_logits, torch.autograd.grad

    def run(self, input_ids, *a, **kw):
        # a run with an intervention and no gradient is a node-level patched run: one suffix row per example
        patched = kw.get("intervention") is not None and not kw.get("receiver_grads")
        counts["suffix_rows" if patched else "forwards"] += int(input_ids.shape[0])
        return real_run(self, input_ids, *a, **kw)

    def patched_layer_logits(self, clean, mask, layer, local, rows, *a, **kw):
        counts["suffix_rows"] += int(rows.shape[0])
        return real_patched(self, clean, mask, layer, local, rows, *a, **kw)

    def grad(outputs, inputs, *a, **kw):
        counts["backwards"] += int(inputs[0].shape[0])  # every probe is [B, ...]
        return real_grad(outputs, inputs, *a, **kw)

    monkeypatch.setattr(cls, "run", run)
    monkeypatch.setattr(cls, "patched_layer_logits", patched_layer_logits)
    monkeypatch.setattr(torch.autograd, "grad", grad)
    # exact pads calls of fewer than MIN_ROWS rows with repeats (bit-identical rows, not more work the plan
    # prices): counted without the padding, the rows are the work itself
    monkeypatch.setattr("circuitstat.circuits.attribution.MIN_ROWS", 1)
    yield counts
    monkeypatch.undo()


@pytest.mark.parametrize("method, level", RUNS)
def test_plan_counts_equal_the_operations_of_the_real_run(model, method, level, monkeypatch):
    task = fully_corrupted(model)
    plan = method_cost(model.cfg, method, n=N, positions=P, level=level, batch_size=BATCH, ig_steps=STEPS)
    with counted(model, monkeypatch) as counts, FlopCounterMode(display=False) as flops:
        attribute(model, task, method, level=level, batch_size=BATCH, ig_steps=STEPS, progress=False)
    assert counts == {"forwards": plan.forwards, "backwards": plan.backwards, "suffix_rows": plan.suffix_rows}
    if method == "exact":
        # exact's suffix rows run in windows of their own (circuits.attribution._row_chunks, for bit-identical
        # subsets), never wider than the window the plan prices: the plan bounds them (measured 1-6% over here)
        assert 0.9 * plan.flops <= flops.get_total_flops() <= plan.flops
    else:
        assert flops.get_total_flops() == plan.flops  # matrix-multiply FLOPs, the plan's unit


@pytest.mark.parametrize("method", ["exact", "eap"])
def test_plan_bounds_a_run_whose_engine_skips_rows(method, monkeypatch):
    """Induction prompts corrupt only their first half: exact skips the rows whose Δz cannot reach the
    read-out and recomputes only the window after the first corrupted token; the plan counts every row."""
    from circuitstat.pipelines.build import build_task

    model = _family_model("gpt2")
    task = build_task(model, "induction", n=N, seed=0, seq_len=4)
    positions = int(task.clean.shape[1])
    plan = method_cost(model.cfg, method, n=N, positions=positions, batch_size=BATCH)
    with counted(model, monkeypatch) as counts, FlopCounterMode(display=False) as flops:
        attribute(model, task, method, batch_size=BATCH, progress=False)
    assert counts["forwards"] == plan.forwards and counts["backwards"] == plan.backwards
    assert counts["suffix_rows"] <= plan.suffix_rows and flops.get_total_flops() <= plan.flops
    if method == "exact":
        assert counts["suffix_rows"] < plan.suffix_rows and flops.get_total_flops() < plan.flops
