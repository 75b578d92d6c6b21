"""Exact patching on a subset (circuitstat.circuits.verify): bit for bit the full run's rows and columns; its cost counted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitstat.circuits import load_model
from circuitstat.circuits.attribution import attribute
from circuitstat.circuits.plan import exact_subset_cost, method_cost
from circuitstat.circuits.tasks import make_task
from circuitstat.circuits.verify import exact_subset
from circuitstat.core.errors import InputError

MODELS = {
    "gpt2": "random:gpt2?n_layer=2&n_head=4&n_embd=32&vocab_size=97&n_positions=64&seed=1",
    "llama": "random:llama?hidden_size=32&num_hidden_layers=2&num_attention_heads=4&num_key_value_heads=2"
    "&intermediate_size=64&vocab_size=97&seed=3",
}


def _task(n=11, padded=False):
    t = make_task("induction", vocab_size=97, n=n, seed=0, seq_len=5)
    if padded:  # right padding of different lengths: read-outs (and suffix windows) differ per example
        mask = t.attention_mask.clone()
        for i in range(0, n, 3):
            mask[i, -1 - i % 2:] = 0
        t.attention_mask = mask
    return t


@pytest.mark.parametrize("family,ablation,padded", [("gpt2", "counterfactual", False), ("gpt2", "mean", True),
                                                    ("llama", "counterfactual", True)])
def test_subset_equals_full_run_bit_for_bit(family, ablation, padded):
    model = load_model(MODELS[family])
    task = _task(padded=padded)
    full = attribute(model, task, "exact", batch_size=4, max_rows=40, ablation=ablation, progress=False).scores
    rng = np.random.default_rng(1)
    E = model.graph.n_edges
    cases = [dict(rows=[7, 2, 3]), dict(edges=rng.choice(E, 17, replace=False)), dict(rows=[10, 0], edges=[5, 1, 60]),
             dict(rows=[4], receivers=[3, int(model.graph.logits_receiver)]), dict(rows=[1], edges=[0])]
    for case in cases:
        got = exact_subset(model, task, batch_size=4, max_rows=40, ablation=ablation, **case)
        assert np.array_equal(got.scores, full[np.ix_(got.rows, got.edges)]), case
        assert np.isfinite(got.scores).all() and np.abs(got.scores).max() > 0  # not vacuous


def test_small_calls_would_round_differently():
    """Why circuitstat.circuits.attribution pads suffix calls to MIN_ROWS: a 1-row product rounds differently (the
    bit-for-bit test above fails without the padding on this BLAS)."""
    torch.manual_seed(0)
    x, W = torch.randn(16, 32), torch.randn(32, 97)
    full = x @ W
    assert any(not torch.equal(x[i:i + 1] @ W, full[i:i + 1]) for i in range(16))
    assert all(torch.equal((x[i:i + 8] @ W), full[i:i + 8]) for i in range(0, 16, 8))


def test_subset_selection_errors():
    model = load_model(MODELS["gpt2"])
    task = _task(n=3)
    with pytest.raises(InputError, match="rows must be"):
        exact_subset(model, task, rows=[3])
    with pytest.raises(InputError, match="edges must be"):
        exact_subset(model, task, edges=[model.graph.n_edges])
    with pytest.raises(InputError, match="use method 'exact'"):
        attribute(model, task, "eap", edges=[1], progress=False)


def test_subset_cost_counts_the_rows_it_runs(monkeypatch):
    model = load_model(MODELS["gpt2"])
    task = _task(n=10)
    P, g = task.clean.shape[1], model.graph
    full = method_cost(model.cfg, "exact", n=10, positions=P, batch_size=4)
    every = exact_subset_cost(model.cfg, np.arange(g.n_edges), n=10, positions=P, batch_size=4)
    assert (every.suffix_rows, every.flops, every.forwards) == (full.suffix_rows, full.flops, full.forwards)
    counted = {"rows": 0, "forwards": 0}
    score, run = type(task).score, type(model).run

    def counting_score(self, logits, *a, **k):
        if logits.shape[0] and torch.is_grad_enabled() is False and k.get("clean_logits") is not None:
            counted["rows"] += int(logits.shape[0])
        return score(self, logits, *a, **k)

    def counting_run(self, *a, **k):
        counted["forwards"] += 1
        return run(self, *a, **k)

    monkeypatch.setattr(type(task), "score", counting_score)
    monkeypatch.setattr(type(model), "run", counting_run)
    edges = [0, 7, 30, 31, 64, g.n_edges - 1]
    # zero ablation: every Δz is nonzero everywhere, so no row is skipped as unreachable
    got = exact_subset(model, task, rows=[1, 2, 9], edges=edges, batch_size=4, ablation="zero")
    cost = exact_subset_cost(model.cfg, edges, n=3, positions=P, batch_examples=got.batch_examples, batch_size=4)
    batches = 2  # examples 1, 2 in batch 0 (4 examples) and 9 in batch 2 (examples 8, 9)
    # each batch scores its clean run once, then one metric row per suffix row
    assert counted["rows"] - got.batch_examples == cost.suffix_rows == got.suffix_rows == 3 * len(edges)
    assert cost.forwards == 2 * got.batch_examples == 2 * (4 + 2)  # clean and counterfactual, per example
    assert counted["forwards"] == batches  # one clean run per batch (zero ablation: no counterfactual forward)
    assert list(got.receivers) == sorted({int(g.edge_receiver[e]) for e in edges})
