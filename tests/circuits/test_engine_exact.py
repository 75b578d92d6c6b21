"""Exact edge effects of the layer-batched engine against the definition (one full run per edge),
on deeper models of every block variant, padded prompts and corruptions that start late (so
the engine reuses clean keys/values before the first changed position); structurally zero
edges come out exactly 0.0."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitstat.circuits import load_model
from circuitstat.circuits.ablation import last_index
from circuitstat.circuits.attribution import attribute
from circuitstat.circuits.parity import brute_force_edge_effects
from circuitstat.circuits.tasks import make_task

VOCAB = 97


def _model(family: str, layers: int):
    spec = {
        "gpt2": f"random:gpt2?n_layer={layers}&n_head=4&n_embd=32&vocab_size={VOCAB}&n_positions=64&seed=1",
        "neox": f"random:gpt_neox?hidden_size=32&num_hidden_layers={layers}&num_attention_heads=4"
        f"&intermediate_size=64&vocab_size={VOCAB}&seed=2",
        "llama": f"random:llama?hidden_size=32&num_hidden_layers={layers}&num_attention_heads=4"
        f"&num_key_value_heads=2&intermediate_size=64&vocab_size={VOCAB}&seed=3",
    }[family]
    return load_model(spec)


def _late_padded_task(n: int = 4, P: int = 9, seed: int = 0):
    """Random prompts, right-padded to different lengths, corrupted only from position 3 or 4 on."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(1, VOCAB, (n, P), generator=g)
    corrupted = clean.clone()
    mask = torch.ones(n, P, dtype=torch.long)
    for i in range(n):
        first = 3 + i % 2
        corrupted[i, first : first + 2] = torch.randint(1, VOCAB, (2,), generator=g)
        length = P - (i % 3)  # rows end at P, P-1, P-2: padding after the read-out
        mask[i, length:] = 0
        clean[i, length:] = corrupted[i, length:] = 0
    base = make_task("induction", vocab_size=VOCAB, n=n, seed=seed, seq_len=4)
    return base.__class__(name="late", clean=clean, corrupted=corrupted, attention_mask=mask,
                          answer=clean[:, 0], wrong_answer=clean[:, 1])


def _edges_to_check(model, layers: int) -> np.ndarray:
    """All edges at 2 layers; at more layers a random subset plus every edge into the last two layers."""
    g = model.graph
    if layers <= 2:
        return np.arange(g.n_edges)
    late = np.flatnonzero(g.receiver_layer[g.edge_receiver] >= layers - 1)
    rest = np.setdiff1d(np.arange(g.n_edges), late)
    pick = np.random.default_rng(0).choice(rest, size=60, replace=False)
    return np.union1d(late, pick)


@pytest.mark.parametrize("family", ["gpt2", "neox", "llama"])
@pytest.mark.parametrize("layers", [2, pytest.param(6, marks=pytest.mark.slow)])
def test_exact_equals_brute_force_late_corruption_with_padding(family, layers):
    model = _model(family, layers)
    task = _late_padded_task()
    edges = _edges_to_check(model, layers)
    with torch.no_grad():
        cf = model.run(task.corrupted, task.attention_mask, keep_senders=True).senders
    ref = brute_force_edge_effects(model, task, cf, edges)
    got = attribute(model, task, "exact", batch_size=3, max_rows=50, progress=False).scores[:, edges]
    assert np.abs(got - ref).max() <= 1e-5
    assert np.abs(ref).max() > 1e-3  # not vacuous


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "neox"])
def test_exact_equals_brute_force_on_induction_at_6_layers(family):
    model = _model(family, 6)
    task = make_task("induction", vocab_size=VOCAB, n=3, seed=1, seq_len=5)
    edges = _edges_to_check(model, 6)
    with torch.no_grad():
        cf = model.run(task.corrupted, task.attention_mask, keep_senders=True).senders
    ref = brute_force_edge_effects(model, task, cf, edges)
    got = attribute(model, task, "exact", batch_size=3, progress=False).scores[:, edges]
    assert np.abs(got - ref).max() <= 1e-5


def _structurally_zero(model, task) -> np.ndarray:
    """[N, E] True where an edge's Δz is zero at every position its receiver can pass to the read-out,
    derived by hand: the last layer's q and MLP inputs and the logits read the read-out position
    only; every other receiver reads the real positions up to it."""
    g, L = model.graph, model.cfg.n_layers
    with torch.no_grad():
        delta = (model.run(task.corrupted, task.attention_mask, keep_senders=True).senders
                 - model.run(task.clean, task.attention_mask, keep_senders=True).senders)
    last = last_index(task.attention_mask)
    N, U, P, _ = delta.shape
    out = np.zeros((N, g.n_edges), dtype=bool)
    for e in range(g.n_edges):
        u, r = g.edge_sender[e], g.edge_receiver[e]
        name = g.receivers[r]
        read_only = name == "logits" or (g.receiver_layer[r] == L - 1 and (name.endswith("<q>") or "<" not in name))
        for n in range(N):
            span = [int(last[n])] if read_only else [p for p in range(int(last[n]) + 1) if task.attention_mask[n, p]]
            out[n, e] = bool((delta[n, u, span] == 0).all())
    return out


@pytest.mark.parametrize("make", ["induction", "late"])
def test_structurally_zero_edges_are_exactly_zero(make):
    model = _model("gpt2", 3)
    task = make_task("induction", vocab_size=VOCAB, n=3, seed=2, seq_len=5) if make == "induction" else _late_padded_task()
    zero = _structurally_zero(model, task)
    assert zero.any() and not zero.all()
    got = attribute(model, task, "exact", batch_size=2, max_rows=20, progress=False).scores
    assert np.all(got[zero] == 0.0)  # exactly, not 1e-8 from subtracting two recomputed runs
    # every other edge was computed (a real effect below float32 resolution may round to 0)
    assert np.mean(got[~zero] != 0.0) >= 0.99
    if make == "induction":
        # corrupt="all" changes only the first copy: the input's Δz is zero at the read-out
        g = model.graph
        for r in ("a2.h0<q>", "m2", "logits"):
            assert np.all(got[:, g.edge_index(f"input->{r}")] == 0.0)


def test_rows_scores_do_not_depend_on_other_rows():
    model = _model("gpt2", 3)
    task = _late_padded_task(n=5)
    full = attribute(model, task, "exact", batch_size=5, progress=False).scores
    part = attribute(model, task, "exact", batch_size=2, rows=np.array([4, 1]), progress=False).scores
    assert np.allclose(part, full[[4, 1]], atol=1e-6)
