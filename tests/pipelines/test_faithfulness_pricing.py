"""The faithfulness stage is priced (issue 37 item 4: the service's max_work_flops covers every stage): the bound
audit_flops uses holds against the example forwards the stage really runs, counted through CircuitModel.run."""

from __future__ import annotations

import pytest

from circuitstat.circuits.model import CircuitModel
from circuitstat.pipelines.runs.audit import pricing
from circuitstat.pipelines.runs.audit import common, stages
from circuitstat.pipelines.runs.audit import run as audit
from circuitstat.pipelines.spec import parse_spec

MODEL = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3"
BASE = {"model": MODEL, "task": {"name": "induction", "n": 24, "options": {"seq_len": 5}}, "batch_size": 4,
        "bootstrap": {"n_resamples": 40}, "k": [3, 6], "methods": ["eap"]}


def _counted_forwards(spec, out, monkeypatch) -> int:
    """Example rows run through the model inside the faithfulness stage of an audit of ``spec``."""
    rows, inside = [0], [False]
    run, search = CircuitModel.run, common.faithfulness_with_search

    def counted_run(self, ids, *a, **kw):
        if inside[0]:
            rows[0] += int(ids.shape[0])
        return run(self, ids, *a, **kw)

    def counted_search(*a, **kw):
        inside[0] = True
        try:
            return search(*a, **kw)
        finally:
            inside[0] = False

    monkeypatch.setattr(CircuitModel, "run", counted_run)
    monkeypatch.setattr(common, "faithfulness_with_search", counted_search)  # the stages call it there
    audit.run_audit(spec, out)
    return rows[0]


@pytest.mark.parametrize("k_search", [0, 3])
def test_the_priced_forwards_bound_the_counted_ones(tmp_path, monkeypatch, k_search):
    spec = parse_spec({**BASE, "k_search": k_search})
    counted = _counted_forwards(spec, tmp_path / "run", monkeypatch)
    priced = pricing.faithfulness_forwards(spec)
    assert counted > 0
    assert counted <= priced  # a limit priced below the work would let a job pass that should not
    if k_search == 0:  # without the search the bound is tight: the curve and two cross-fitted repeats
        assert priced <= 1.5 * counted, (priced, counted)


def test_audit_flops_include_faithfulness_only_when_it_runs():
    from circuitstat.circuits.plan import forward_flops
    from circuitstat.pipelines.sources import LOCAL

    cfg = LOCAL.skeleton(MODEL).cfg
    on, off = parse_spec(BASE), parse_spec({**BASE, "faithfulness": False})
    assert stages.audit_flops(on, cfg) - stages.audit_flops(off, cfg) == pytest.approx(
        pricing.faithfulness_forwards(on) * forward_flops(cfg, 10))  # induction, seq_len 5: 2 x 5 positions
    assert pricing.faithfulness_flops(off, cfg) == 0.0


@pytest.mark.parametrize("tests", [{"k": 3, "n_random": 19, "random_quantile": None, "n_permutations": 19}])
def test_the_priced_tests_forwards_bound_the_counted_ones(tmp_path, monkeypatch, tests):
    # the circuit_tests stage's forwards, counted through CircuitModel.run inside evaluate_layout, against
    # tests_forwards: the bound holds, within 2.2x (it bounds the testing half by every prompt)
    from circuitstat.pipelines import circuit_tests as ct

    spec = parse_spec({**BASE, "faithfulness": False, "tests": tests})
    rows, inside = [0], [False]
    run, evaluate = CircuitModel.run, ct.evaluate_layout

    def counted_run(self, ids, *a, **kw):
        if inside[0]:
            rows[0] += int(ids.shape[0])
        return run(self, ids, *a, **kw)

    def counted_evaluate(*a, **kw):
        inside[0] = True
        try:
            return evaluate(*a, **kw)
        finally:
            inside[0] = False

    monkeypatch.setattr(CircuitModel, "run", counted_run)
    monkeypatch.setattr(ct, "evaluate_layout", counted_evaluate)
    audit.run_audit(spec, tmp_path / "run")
    priced = pricing.tests_forwards(spec)
    assert 0 < rows[0] <= priced <= 2.2 * rows[0], (rows[0], priced)
    assert pricing.tests_forwards(parse_spec(BASE)) == 0


def test_audit_flops_include_the_tests_stage_only_when_it_runs():
    from circuitstat.circuits.plan import forward_flops
    from circuitstat.pipelines.sources import LOCAL

    cfg = LOCAL.skeleton(MODEL).cfg
    on = parse_spec({**BASE, "tests": {"k": 3, "n_random": 19, "random_quantile": None}})
    assert stages.audit_flops(on, cfg) - stages.audit_flops(parse_spec(BASE), cfg) == pytest.approx(
        pricing.tests_forwards(on) * forward_flops(cfg, 10) + 3.0 * on.tests.n_permutations * on.task.n ** 2)
