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
from circuitstat.pipelines.plan import fit_mark, plan_costs, run_limits

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
