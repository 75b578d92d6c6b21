"""Attribution methods against independent oracles: brute-force patching, Taylor expansion, node patches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitstat.circuits import Intervention, load_model
from circuitstat.circuits.ablation import last_index
from circuitstat.circuits.attribution import attribute
from circuitstat.circuits.parity import brute_force_edge_effects
from circuitstat.circuits.scores import ScoreMatrix
from circuitstat.circuits.tasks import make_task

MODELS = {
    "gpt2": "random:gpt2?n_layer=2&n_head=4&n_embd=32&vocab_size=97&n_positions=64&seed=1",
    "neox": "random:gpt_neox?hidden_size=32&num_hidden_layers=2&num_attention_heads=4"
    "&intermediate_size=64&vocab_size=97&seed=2",
    "llama": "random:llama?hidden_size=32&num_hidden_layers=2&num_attention_heads=4&num_key_value_heads=2"
    "&intermediate_size=64&vocab_size=97&seed=3",
}


@pytest.fixture(scope="module")
def gpt2():
    return load_model(MODELS["gpt2"])


def _task(n=6, seed=0, seq_len=5):
    return make_task("induction", vocab_size=97, n=n, seed=seed, seq_len=seq_len)


def test_exact_equals_brute_force(gpt2):
    task = _task()
    with torch.no_grad():
        cf = gpt2.run(task.corrupted, task.attention_mask, keep_senders=True).senders
    ref = brute_force_edge_effects(gpt2, task, cf)
    got = attribute(gpt2, task, "exact", batch_size=4, max_rows=7, progress=False)
    assert got.scores.shape == ref.shape
    assert np.abs(got.scores - ref).max() <= 1e-5
    assert np.abs(ref).max() > 1e-3  # the check is not vacuous


def test_exact_independent_of_batching(gpt2):
    task = _task(n=5)
    a = attribute(gpt2, task, "exact", batch_size=5, max_rows=1000, progress=False).scores
    b = attribute(gpt2, task, "exact", batch_size=2, max_rows=3, progress=False).scores
    assert np.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("family", ["gpt2", "neox"])
def test_node_exact_equals_all_out_edges_patched(family):
    model = load_model(MODELS[family])
    task = _task(n=3)
    nodes = attribute(model, task, "exact", level="node", progress=False).scores
    g = model.graph
    idx = torch.arange(3)
    last = last_index(task.attention_mask)
    with torch.no_grad():
        cf = model.run(task.corrupted, task.attention_mask, keep_senders=True).senders
        base = model.run(task.clean, task.attention_mask, logits_at=last).logits
        m0 = task.score(base, indices=idx, clean_logits=base)
        for u in range(g.n_senders):
            mask = torch.zeros(g.n_edges)
            mask[torch.as_tensor(g.sender_out_edges(u))] = 1
            lo = model.run(task.clean, task.attention_mask, intervention=Intervention.edges(mask, cf), logits_at=last).logits
            ref = (task.score(lo, indices=idx, clean_logits=base) - m0).numpy()
            assert np.allclose(nodes[:, u], ref, atol=1e-5), g.senders[u]


class _Perturbed:
    """Counterfactual = the clean run with input embeddings moved by eps * delta."""

    kind = "perturbed"

    def __init__(self, model, task, eps, seed=0):
        self.model, self.task, self.eps = model, task, eps
        g = torch.Generator().manual_seed(seed)
        self.delta = torch.randn(task.clean.shape + (model.cfg.d_model,), generator=g)

    @torch.no_grad()
    def senders(self, index):
        ids, mask = self.task.clean[index], self.task.attention_mask[index]
        emb = self.model.embed(ids, self.model.positions(mask))
        return self.model.run(ids, mask, intervention=Intervention.at_sender(0, emb + self.eps * self.delta[index]),
                              keep_senders=True, compute_logits=False).senders


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_eap_is_first_order_taylor_term_of_exact(family):
    model = load_model(MODELS[family]).double()
    task = _task(n=4, seq_len=4)
    errors = []
    for eps in (4e-3, 2e-3, 1e-3):
        abl = _Perturbed(model, task, eps)
        exact = attribute(model, task, "exact", ablation=abl, progress=False).scores.astype(np.float64)
        eap = attribute(model, task, "eap", ablation=abl, progress=False).scores.astype(np.float64)
        errors.append(np.linalg.norm(eap - exact) / np.linalg.norm(exact))
    # relative error of the linear term is O(eps): halving eps halves it
    ratios = [errors[0] / errors[1], errors[1] / errors[2]]
    assert errors[-1] < 0.05, errors
    for r in ratios:
        assert 1.7 < r < 2.3, (errors, ratios)


def test_gradient_methods_agree_on_linear_path(gpt2):
    task = _task(n=4)
    eap = attribute(gpt2, task, "eap", progress=False).scores
    ig1 = attribute(gpt2, task, "eap-ig-inputs", ig_steps=1, progress=False).scores
    # with one step, EAP-IG-inputs takes the gradient at the counterfactual (alpha = 0) point
    cc = attribute(gpt2, task, "clean-corrupted", progress=False).scores
    assert np.allclose(cc, (eap + ig1) / 2, atol=1e-5)


def test_eap_node_scores_are_sums_of_out_edges(gpt2):
    task = _task(n=3)
    edges = attribute(gpt2, task, "eap", progress=False)
    nodes = attribute(gpt2, task, "eap", level="node", progress=False)
    g = gpt2.graph
    for u in range(g.n_senders):
        assert np.allclose(nodes.scores[:, u], edges.scores[:, g.sender_out_edges(u)].sum(1), atol=1e-5)


@pytest.mark.parametrize("ablation", ["zero", "mean", "mean-positional", "resample"])
def test_ablations_exact_match_brute_force(gpt2, ablation):
    from circuitstat.circuits.ablation import Ablation

    task = _task(n=4)
    abl = Ablation(ablation, gpt2, task, seed=3)
    cf = abl.senders(torch.arange(4))
    ref = brute_force_edge_effects(gpt2, task, cf)
    got = attribute(gpt2, task, "exact", ablation=ablation, seed=3, progress=False).scores
    assert np.abs(got - ref).max() <= 1e-5


def test_mean_ablation_is_mean_over_reference(gpt2):
    from circuitstat.circuits.ablation import sender_means

    task = _task(n=5)
    means = sender_means(gpt2, task, positional=False, batch_size=2)
    with torch.no_grad():
        z = gpt2.run(task.clean, task.attention_mask, keep_senders=True).senders
    w = task.attention_mask.float()[:, None, :, None]
    ref = (z * w).sum((0, 2)) / w.sum()
    assert torch.allclose(means[0, :, 0], ref, atol=1e-6)


def test_score_matrix_roundtrip(gpt2, tmp_path):
    task = _task(n=3)
    sm = attribute(gpt2, task, "eap", progress=False)
    sm.write(tmp_path)
    back = ScoreMatrix.read(tmp_path)
    assert np.array_equal(back.scores, sm.scores) and back.method == "eap" and back.graph == sm.graph
    assert back.names == sm.names


def test_nan_metric_is_reported_with_rows(gpt2):
    from circuitstat.core.errors import InputError

    task = _task(n=3)

    class Bad:
        clean, corrupted, attention_mask = task.clean, task.corrupted, task.attention_mask
        metric_name = "bad"

        def score(self, logits, indices=None, clean_logits=None):
            out = logits[:, 0].clone()
            out[1] = float("nan")
            return out

    with pytest.raises(InputError, match=r"examples \[1\]"):
        attribute(gpt2, Bad(), "eap", progress=False)


def test_clean_corrupted_refuses_non_counterfactual_ablations(gpt2):
    from circuitstat.core.errors import InputError

    with pytest.raises(InputError, match="needs ablation 'counterfactual'"):
        attribute(gpt2, _task(n=2), "clean-corrupted", ablation="mean", progress=False)
