"""Pricing the active design from shapes (circuits.plan.active_verify_cost): its expected cells and forwarded examples
against draws of the design itself, `attribute --plan` printing it, and the service pricing the same spec."""

from __future__ import annotations

import re

import numpy as np
import pytest
from typer.testing import CliRunner

from circuitstat.circuits.plan import active_verify_cost, exact_cells_cost, graph_of, method_cost
from circuitstat.circuits.verify import whole_batches
from circuitstat.pipelines.cli import app as APP
from circuitstat.stats.verified.active import ACTIVE_MIX, active_probabilities, active_sample

MODEL = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3"


def _cfg():
    from circuitstat.pipelines.sources import LOCAL

    return LOCAL.skeleton(MODEL).cfg


@pytest.mark.parametrize("N, budget, batch", [(512, 4, 4), (256, 2.5, 16)])
def test_expected_cost_against_draws_of_the_design(N, budget, batch):
    """Over 400 draws of active_sample on a heavy-tailed approximation: the mean sampled cells equal the priced suffix
    rows (E x budget: each edge's π sum to the budget), and the mean examples in the batches holding a cell lie within
    the priced bounds (the lower one is informative here: below N)."""
    cfg = _cfg()
    E = graph_of(cfg).n_edges
    rng = np.random.default_rng(0)
    approx = rng.standard_t(2, (N, E)) * rng.gamma(1.0, 1.0, E)
    p = active_probabilities(approx, budget)
    cost, (low, high) = active_verify_cost(cfg, budget=budget, N=N, positions=8, mix=ACTIVE_MIX, batch_size=batch)
    assert cost.suffix_rows == round(E * budget)
    cells, examples = [], []
    for seed in range(400):
        c = active_sample(p, seed)
        cells.append(c.sum())
        examples.append(len(whole_batches(np.flatnonzero(c.any(1)), N, batch)))
    cells, examples = np.asarray(cells, float), np.asarray(examples, float)
    se = cells.std(ddof=1) / np.sqrt(cells.size)
    assert abs(cells.mean() - E * budget) < 4 * se
    se_x = examples.std(ddof=1) / np.sqrt(examples.size)
    assert low - 4 * se_x <= examples.mean() <= high + 4 * se_x
    assert low < N and high == N  # the bounds bracket, the lower one below every prompt
    # priced at the upper bound: exact_cells_cost of budget cells per edge and `high` forwarded examples
    want = exact_cells_cost(cfg, np.full(E, float(budget)), positions=8, batch_examples=high, batch_size=batch)
    assert cost.flops == want.flops and cost.forwards == 2 * N
    # negative control: without the defensive mixture's floor (mix -> 1) no lower bound is left
    assert active_verify_cost(cfg, budget=budget, N=N, positions=8, mix=1.0, batch_size=batch)[1][0] == 0.0


def test_attribute_plan_prices_the_active_design():
    r = CliRunner().invoke(APP, ["attribute", "--model", MODEL, "--task-option", "seq_len=5", "--n", "64",
                                 "--batch-size", "8", "--plan", "--verify-design", "active", "--verify-budget", "6"])
    assert r.exit_code == 0, r.output
    cfg = _cfg()
    P = int(re.search(r"plan: 64 examples x (\d+) positions", r.output).group(1))
    lines = r.output.splitlines()
    p2 = next(ln for ln in lines if ln.strip().startswith("phase 2"))
    both = next(ln for ln in lines if ln.strip().startswith("both"))
    want2 = active_verify_cost(cfg, budget=6, N=64, positions=P, mix=ACTIVE_MIX, batch_size=8)[0].flops
    want1 = method_cost(cfg, "eap", n=64, positions=P, batch_size=8).flops
    exact = method_cost(cfg, "exact", n=64, positions=P, batch_size=8).flops
    assert float(re.search(r"FLOPs\s+(\S+)", p2).group(1)) == pytest.approx(want2, rel=5e-3)
    share = float(re.search(r"= ([\d.]+)% of exact on all 64 by FLOPs", both).group(1))
    assert share == pytest.approx(100 * (want1 + want2) / exact, abs=0.06)
    E = graph_of(cfg).n_edges
    assert f"exact on 6 expected (prompt, edge) cells per edge ({6 * E:,} suffix rows" in r.output


def test_service_prices_the_active_spec():
    from circuitstat.pipelines.build import task_positions
    from circuitstat.pipelines.service.runner import check_work
    from circuitstat.pipelines.service.submission import parse_kind
    from circuitstat.pipelines.sources import LOCAL

    base = {"model": MODEL, "task": {"name": "induction", "n": 64, "options": {"seq_len": 5}},
            "methods": ["eap", "eap-ig-inputs"], "batch_size": 8}
    act = parse_kind("audit", {**base, "verify": {"design": "active", "budget": 6}})
    extra = check_work("audit", act, 1e30, LOCAL) - check_work("audit", parse_kind("audit", base), 1e30, LOCAL)
    P = task_positions("induction", {"seq_len": 5})
    want = active_verify_cost(_cfg(), budget=6, N=64, positions=P, mix=ACTIVE_MIX, streams=2, batch_size=8)[0].flops
    assert extra == pytest.approx(want, rel=1e-9)
