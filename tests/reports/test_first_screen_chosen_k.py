"""The report's first screen reads stability at the circuit's own k (issue 43 item 3): the audit measures stability
and inclusion at the k the faithfulness search chose, so the verdict does not fall back to the grid's nearest k
and the graph of that circuit is coloured by inclusion, not grey."""

from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

import circuitstat.pipelines.runs.audit.common as audit  # the faithfulness stage calls faithfulness_table there
from circuitstat.pipelines.cli import app

MODEL = "random:gpt2?n_layer=2&n_head=2&n_embd=16&vocab_size=128&n_positions=64&seed=1"
GRID = [5, 10, 20, 40]
CHOSEN = 33


def _fake_faithfulness(model, task, S, method, ks, plan, spec, seed=None, **kw):
    """A faithfulness table whose selection-aware lower bound reaches the 0.8 bar from k = 33 up."""
    from circuitstat.core.schema import fill

    n = len(ks)
    return fill("faithfulness_vs_k", {"method": [method] * n, "k": np.asarray(ks), "f_ratio": np.full(n, 0.9), "f_ci_low": np.full(n, np.nan),
            "f_selected_ci_low": np.asarray([0.95 if k >= CHOSEN else 0.5 for k in ks]),
            "f_selected_ci_high": np.full(n, 1.0), "f_selected": np.full(n, 0.97), "cpr": np.full(n, math.nan),
            "cmd": np.full(n, math.nan), "area_note": [""] * n, "k_source": ["grid"] * n}, n)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("chosen")
    (d / "spec.yaml").write_text(
        f"models: ['{MODEL}']\ntask: {{name: induction, n: 32, options: {{seq_len: 6}}}}\nmethods: [eap]\n"
        f"k: {GRID}\nbootstrap: {{n_resamples: 60}}\nranking: absolute\nseed: 0\nn_jobs: 1\n")
    mp = pytest.MonkeyPatch()
    mp.setattr(audit, "faithfulness_table", _fake_faithfulness)
    try:
        r = CliRunner().invoke(app, ["audit", str(d / "spec.yaml"), "--out", str(d / "run"), "--no-report"])
    finally:
        mp.undo()
    assert r.exit_code == 0, r.output
    return d / "run"


def test_stability_and_inclusion_are_measured_at_the_chosen_k(run):
    import pyarrow.parquet as pq

    from circuitstat.reports.verdicts import verdict

    st = pq.read_table(run / "stability_vs_k.parquet").to_pydict()
    assert sorted(st["k"]) == sorted(GRID + [CHOSEN])
    inc = pq.read_table(run / "inclusion.parquet").to_pydict()
    assert CHOSEN in set(inc["k"])
    v = verdict(run)
    line = next(ln for ln in v.lines if ln.label == "stability")
    assert v.k == CHOSEN and line.cis[0].key == (("method", "eap"), ("k", CHOSEN))
    assert "measured on the k grid" not in line.text()


def test_the_chosen_circuits_graph_is_coloured_by_inclusion(run):
    from circuitstat.reports.html import render_report

    page = render_report(run).read_text(encoding="utf-8")
    assert "Grey: no inclusion frequency at this k" not in page
    assert "Colour: inclusion frequency" in page


def test_adding_the_chosen_k_leaves_every_grid_row_unchanged():
    """The grid's rows are the same with and without the extra k (the demo's numbers do not move)."""
    from circuitstat.stats import ResamplingPlan, circuit_stability

    rng = np.random.default_rng(3)
    S = rng.standard_t(3, (40, 120)) + np.linspace(2, 0, 120)
    plan = ResamplingPlan.bootstrap(40, 60, 11)
    a = circuit_stability(S, plan, GRID, ranking="absolute").per_k
    b = circuit_stability(S, plan, sorted(GRID + [CHOSEN]), ranking="absolute").per_k
    at = [sorted(GRID + [CHOSEN]).index(k) for k in GRID]
    for col, v in a.items():
        va, vb = np.asarray(v, dtype=float), np.asarray(b[col], dtype=float)[at]
        assert np.array_equal(va, vb, equal_nan=True), col
