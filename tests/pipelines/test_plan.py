"""``circuitstat attribute --plan``: the printed counts are the model's, and the calibration states its clock,
the machine's load and its own cost in model passes, counted here. No timing is asserted (bench/plan.py
compares the time estimate with measured runs; tests/circuits/test_plan_measured.py checks the counts against
the operations of real runs)."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from circuitstat.circuits import load_model
from circuitstat.circuits.plan import METHODS, method_cost, weight_bytes
from circuitstat.pipelines.build import build_task
from circuitstat.pipelines.cli import app
from circuitstat.pipelines.plan import plan_costs
from circuitstat.pipelines.plan_fit import fit_mark, run_limits

TINY = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=1"
SMALL = "random:gpt2?n_layer=2&n_head=4&n_embd=64&vocab_size=256&n_positions=64&seed=0"


def test_plan_prints_every_method_with_the_models_counts_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["attribute", "--model", TINY, "--n", "6", "--batch-size", "3", "--plan"])
    assert res.exit_code == 0, res.output + res.stderr
    rows = {line.split()[0]: line.split() for line in res.stdout.splitlines() if line.split()[:1] in
            [[m] for m in METHODS]}
    assert sorted(rows) == sorted(METHODS)
    model = load_model(TINY)
    P = int(build_task(model, "induction", n=6).clean.shape[1])
    for method, cols in rows.items():
        c = method_cost(model.cfg, method, n=6, positions=P, batch_size=3)
        assert [int(x.replace(",", "")) for x in cols[1:5]] == [c.columns, c.forwards, c.backwards, c.suffix_rows]
        assert cols[-1] in ("s", "min", "h") and float(cols[-2]) > 0
    assert list(tmp_path.iterdir()) == []


def test_plan_with_a_budget_shrinks_the_batch():
    model = load_model(TINY)
    task = build_task(model, "induction", n=32)
    free = plan_costs(model, task, batch_size=32)
    tight = plan_costs(model, task, batch_size=32, budget=free["eap"].memory_peak // 2)
    assert tight["eap"].batch_size < 32 and tight["eap"].memory_peak <= free["eap"].memory_peak // 2
    budget = weight_bytes(model.cfg) + 1
    tiny = plan_costs(model, task, batch_size=32, budget=budget)
    limits = run_limits(budget, allow_large=False)
    for method, cost in tiny.items():  # priced at its smallest run (one example, one suffix row) and marked
        assert cost.batch_size == 1 and cost.memory_peak > budget, method
        assert fit_mark(cost, limits) == "no:mem"
        assert fit_mark(free[method], run_limits(free[method].memory_peak, allow_large=False)) == "yes"  # control


def test_plan_states_its_clock_load_and_its_own_cost_in_counted_model_passes(tmp_path, monkeypatch):
    """Issue 38: --plan calibrated in wall time on a busy machine without saying so (GPT-2-small exact
    priced at 21 h against 2.9 h) and took minutes. It times CPU time with one thread, prints the load,
    and prints how many model passes it ran, which must be what it ran."""
    from circuitstat.circuits.model import CircuitModel

    calls = []
    real = CircuitModel.run

    def counted(self, ids, *a, **kw):
        calls.append(int(ids.shape[0]))
        return real(self, ids, *a, **kw)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(CircuitModel, "run", counted)
    res = CliRunner().invoke(app, ["attribute", "--model", SMALL, "--n", "8", "--batch-size", "4", "--plan"])
    assert res.exit_code == 0, res.output + res.stderr
    assert "one thread, CPU time:" in res.stdout and "time: CPU time of one thread per worker" in res.stdout
    line = next(x for x in res.stdout.splitlines() if x.startswith("calibration cost:"))
    passes = int(re.search(r"(\d+) model passes", line).group(1))
    # every pass of the command is the calibration's (the counts come from shapes), the exact probe included
    assert passes == len(calls) and 0 < passes <= 22, (passes, calls)  # 38 before issue 38
    assert re.search(r"load average \d+\.\d on \d+ cores?; wall / CPU", line), line


def test_a_mask_fit_is_priced_by_its_calibrated_masked_step(tmp_path, monkeypatch):
    """Issue 43: edge pruning's time was priced from EAP's gradient run (a masked run feeds every head its own
    q/k/v input and backpropagates to every gate: 1.04 CPU-s planned, 90 measured). The calibration now times that
    masked step, and a fit's steps and draws are priced with it; without it the plan refuses to guess."""
    import dataclasses

    import pytest

    from circuitstat.circuits.plan import pruning_cost
    from circuitstat.pipelines.plan import calibrate, estimate_seconds

    model = load_model(TINY)
    task = build_task(model, "induction", n=6)
    P = int(task.clean.shape[1])
    cal = calibrate(model, task, 3, mask=True)
    assert cal.mask_step_s > 0 and calibrate(model, task, 3).mask_step_s == 0.0  # timed only when asked
    cost = pruning_cost(model.cfg, n=6, positions=P, steps=4, fits=2, batch_size=3, method="ugs", draws=3)
    assert (cost.forwards, cost.backwards, cost.optimizer_steps) == (2 * 6 * (3 + 12), 2 * 6 * 12, 8)
    est = estimate_seconds(cal, model, cost, n=6)
    assert est == pytest.approx(6 / cal.batch_size * (3 * 2 * cal.forward_s + 2 * 4 * 3 * cal.mask_step_s))
    with pytest.raises(ValueError, match="masked step"):
        estimate_seconds(dataclasses.replace(cal, mask_step_s=0.0), model, cost, n=6)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["attribute", "--model", TINY, "--n", "6", "--batch-size", "3", "--plan",
                                   "--method", "ugs", "--steps", "4", "--n-samples", "3"])
    assert res.exit_code == 0, res.output
    row = next(line.split() for line in res.stdout.splitlines() if line.startswith("ugs "))
    one_fit = dataclasses.replace(cost, forwards=cost.forwards // 2, backwards=cost.backwards // 2)
    assert [int(x.replace(",", "")) for x in row[1:4]] == [cost.columns, one_fit.forwards, one_fit.backwards]
    assert ", masked step " in res.stdout and list(tmp_path.iterdir()) == []


def test_the_limits_a_plan_marks_against(monkeypatch):
    """--max-memory when given; else circuitstat's 16 GiB or this machine's memory, whichever is less; with
    --allow-large the machine's memory alone and no work limit."""
    import circuitstat.pipelines.plan_fit as plan_fit
    from circuitstat.circuits.limits import MAX_BYTES, MAX_WORK

    monkeypatch.setattr(plan_fit, "device_memory", lambda device: 8 * 2**30)  # a small machine
    assert plan_fit.run_limits(None, allow_large=False) == plan_fit.Limits(8 * 2**30, "this machine's memory", MAX_WORK)
    assert plan_fit.run_limits(2**30, allow_large=False).memory == 2**30
    monkeypatch.setattr(plan_fit, "device_memory", lambda device: 512 * 2**30)  # a large one
    assert plan_fit.run_limits(None, allow_large=False).memory == MAX_BYTES
    lifted = plan_fit.run_limits(None, allow_large=True, device="cuda:1")
    assert lifted == plan_fit.Limits(512 * 2**30, "the memory of cuda:1", None)
