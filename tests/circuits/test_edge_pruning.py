"""Edge pruning (learned hard-concrete edge masks): exact at the mask's ends, gradients against finite
differences, example weights as repeated prompts, and recovery of a planted circuit."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

from circuitstat.circuits import Intervention, load_model
from circuitstat.circuits.ablation import Ablation, last_index
from circuitstat.circuits.edge_pruning import _batches, _faithfulness, _scale, fit_edge_pruning, gates, masked_logits
from circuitstat.circuits.faithfulness import faithfulness
from circuitstat.circuits.groundtruth.planted import PlantedSpec, planted_induction
from circuitstat.circuits.tasks import make_task
from circuitstat.stats.groundtruth import auroc

MODEL = "random:gpt2?n_layer=2&n_head=4&n_embd=32&vocab_size=97&n_positions=64&seed=1"


@pytest.fixture(scope="module")
def setup():
    model = load_model(MODEL)
    task = make_task("induction", vocab_size=97, n=4, seed=0, seq_len=5)
    with torch.no_grad():
        cf = model.run(task.corrupted, task.attention_mask, keep_senders=True).senders
    return model, task, cf


@torch.no_grad()
def test_gates_at_one_clean_at_zero_fully_patched_and_binary_is_the_circuit(setup) -> None:
    model, task, cf = setup
    ids, am = task.clean, task.attention_mask
    last = last_index(am)
    E, U = model.graph.n_edges, model.graph.n_senders
    clean = model.run(ids, am, logits_at=last).logits
    empty = model.run(ids, am, intervention=Intervention.nodes(torch.ones(U), cf), logits_at=last).logits
    assert (clean - empty).abs().max() > 0.01  # the two ends differ: the checks below can fail
    torch.testing.assert_close(masked_logits(model, ids, am, cf, torch.ones(E)), clean, rtol=0, atol=1e-5)
    torch.testing.assert_close(masked_logits(model, ids, am, cf, torch.zeros(E)), empty, rtol=0, atol=1e-5)
    # deterministic gates of very large / small logits are exactly 1 / 0 (the clamp of the stretched sigmoid)
    assert gates(torch.full((3,), 20.0)).eq(1).all() and gates(torch.full((3,), -20.0)).eq(0).all()
    # a 0/1 gate vector is faithfulness's circuit evaluation (its own code path): m(C) per example
    circuit = np.random.default_rng(0).random(E) < 0.3
    m = task.score(masked_logits(model, ids, am, cf, torch.as_tensor(circuit, dtype=torch.float32)),
                   clean_logits=clean)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = faithfulness(model, task, circuit, progress=False).m_circuit[:, 0]
    np.testing.assert_allclose(m.numpy(), ref, atol=1e-5)


class _LogitDiff64:
    """The task's prompts with logit difference kept in float64 (task metrics are float32 by contract, whose
    rounding a finite difference of the scale-free loss would amplify past any useful tolerance)."""

    def __init__(self, task) -> None:
        self.task, self.clean, self.corrupted = task, task.clean, task.corrupted
        self.attention_mask = task.attention_mask

    def score(self, logits, indices=None, clean_logits=None):
        idx = torch.arange(self.clean.shape[0]) if indices is None else torch.as_tensor(indices)
        ar = torch.arange(len(idx))
        return logits[ar, self.task.answer[idx].long()] - logits[ar, self.task.wrong_answer[idx].long()]


@pytest.mark.parametrize("objective", ["mean_metric", "metric", "kl"])
def test_gradient_through_the_mask_matches_finite_differences(setup, objective) -> None:
    model, task, _ = setup
    m64 = copy.deepcopy(model).to(torch.float64)
    task = _LogitDiff64(task)
    rows, w = np.arange(4), np.array([1.0, 2.0, 0.0, 1.0])
    batches = _batches(m64, task, rows, w, Ablation("counterfactual", m64, task, batch_size=2), 2)
    total_w = float(w.sum())
    scale = _scale(batches, objective, total_w)
    E = m64.graph.n_edges
    la = torch.as_tensor(np.random.default_rng(1).uniform(-1.5, 1.5, E), dtype=torch.float64).requires_grad_(True)

    def loss(x: torch.Tensor) -> torch.Tensor:
        return _faithfulness(m64, task, batches, gates(x), objective, total_w, scale)

    (grad,) = torch.autograd.grad(loss(la), la)
    assert grad.abs().max() > 0  # not a vacuous comparison of zeros
    # the forward keeps norms and softmax in float32 even for a float64 model, so a small step is rounding noise
    # (measured: 1e-5 is off by 35%); at 1e-2 central differences agree to 5e-4 relative, truncation included
    eps = 1e-2
    tol = 1e-4 * float(grad.abs().max())
    picked = np.argsort(-np.abs(grad.numpy()))[:6].tolist()  # edges with signal above the float32 noise
    for e in picked:
        d = torch.zeros(E, dtype=torch.float64)
        d[e] = eps
        with torch.no_grad():
            fd = (loss(la + d) - loss(la - d)) / (2 * eps)
        assert abs(float(fd) - float(grad[e])) <= tol + 5e-3 * abs(float(grad[e])), (e, float(fd), float(grad[e]))


def test_count_weights_equal_repeated_prompts(setup) -> None:
    """A bootstrap resample's counts weight each prompt as if it were repeated (the same fit, same seed)."""
    model, task, _ = setup
    a = fit_edge_pruning(model, task, weights=[2, 1, 0, 1], steps=5, seed=3, batch_size=2)
    b = fit_edge_pruning(model, task, rows=[0, 0, 1, 3], steps=5, seed=3, batch_size=3)
    np.testing.assert_allclose(a.log_alpha, b.log_alpha, atol=1e-4)
    c = fit_edge_pruning(model, task, rows=[0, 1, 2, 3], steps=5, seed=3, batch_size=2)
    assert np.abs(a.log_alpha - c.log_alpha).max() > 1e-3  # the weights change the fit


def test_recovers_the_planted_circuit() -> None:
    gt = planted_induction(PlantedSpec(background=0.25))
    task = gt.task(32, 5)
    fit = fit_edge_pruning(gt.model, task, steps=40, lr=0.2, sparsity=2.0, seed=0)
    # a zero learning rate (ties: 0.5) or a reversed step (true edges pushed out first) fails this bound
    assert auroc(fit.log_alpha, gt.truth) >= 0.95
    kept = fit.circuit_mask()
    assert kept[gt.truth].all() and kept.sum() <= 2 * gt.truth.sum()
    assert fit.loss[-1] < 0.5 * fit.loss[0]
