"""The ``ensemble`` method: the plain mean of EAP, EAP-IG-inputs and EAP-IG-activations per example and edge."""

from __future__ import annotations

import numpy as np
import pytest

from circuitstat.circuits import load_model
from circuitstat.circuits.attribution import ENSEMBLE_MEMBERS, attribute
from circuitstat.circuits.plan import method_cost
from circuitstat.circuits.tasks import make_task

MODEL = "random:gpt2?n_layer=2&n_head=4&n_embd=32&vocab_size=97&n_positions=64&seed=1"


@pytest.fixture(scope="module")
def setup():
    model = load_model(MODEL)
    return model, make_task("induction", vocab_size=97, n=5, seed=0, seq_len=5)


@pytest.mark.parametrize("level", ["edge", "node"])
def test_ensemble_is_the_mean_of_its_three_members(setup, level) -> None:
    model, task = setup
    members = [attribute(model, task, m, level=level, ig_steps=3, batch_size=2, progress=False).scores.astype(np.float64)
               for m in ENSEMBLE_MEMBERS]
    got = attribute(model, task, "ensemble", level=level, ig_steps=3, batch_size=2, progress=False)
    np.testing.assert_allclose(got.scores, sum(members) / 3, rtol=1e-5, atol=1e-6)
    assert got.method == "ensemble" and got.params["ig_steps"] == 3
    # the members differ on this model, so an ensemble returning any one of them would fail
    assert min(np.abs(got.scores - m).max() for m in members) > 1e-4


def test_ensemble_cost_is_the_sum_of_its_members_less_what_they_share() -> None:
    cfg = load_model(MODEL).cfg
    parts = [method_cost(cfg, m, n=10, positions=12, ig_steps=4) for m in ENSEMBLE_MEMBERS]
    ens = method_cost(cfg, "ensemble", n=10, positions=12, ig_steps=4)
    # shared: one counterfactual forward for three, and EAP's gradient run's senders for two clean forwards
    # (tests/circuits/test_plan_measured.py counts the real ensemble's passes and FLOPs)
    from circuitstat.circuits.plan import forward_flops, unembed_flops

    fwd = forward_flops(cfg, 12)
    assert ens.flops == sum(p.flops for p in parts) - 10 * (2 * (fwd - unembed_flops(cfg)) + 2 * fwd)
    assert ens.forwards == sum(p.forwards for p in parts) - 4 * 10 and ens.backwards == sum(p.backwards for p in parts)
    assert ens.memory_peak == max(p.memory_peak for p in parts) and ens.method == "ensemble"
