"""Circuit hypothesis tests in the pipeline: the selection-honest split, the masks, and one end-to-end run on a
planted model (stage -> tables -> claims -> report)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

from circuitstat.core.errors import InputError
from circuitstat.pipelines.circuit_tests import choose_circuit, layout_masks
from circuitstat.pipelines.spec import CircuitTestsSpec, parse_spec


def test_circuit_is_chosen_on_the_selection_half_only():
    rng = np.random.default_rng(0)
    S = rng.standard_normal((40, 30))
    names = [f"e{i}" for i in range(30)]
    cfg = CircuitTestsSpec(k=5)
    mask, sel, test, how = choose_circuit(S, cfg, names, ranking="absolute", groups=None, seed=7)
    assert sel.size == test.size == 20 and np.intersect1d(sel, test).size == 0
    assert np.union1d(sel, test).size == 40 and mask.sum() == 5 and "selection half" in how
    expected = np.argsort(-np.abs(S[sel].mean(0)))[:5]
    assert set(np.flatnonzero(mask)) == set(expected)
    # the testing prompts' scores cannot move the circuit: overwrite them and choose again
    S2 = S.copy()
    S2[test] = 100.0 * rng.standard_normal((20, 30))
    mask2, sel2, _, _ = choose_circuit(S2, cfg, names, ranking="absolute", groups=None, seed=7)
    np.testing.assert_array_equal(sel, sel2)
    np.testing.assert_array_equal(mask, mask2)
    given, sel3, test3, _ = choose_circuit(S, CircuitTestsSpec(edges=["e3", "e9"]), names, ranking="absolute",
                                           groups=None, seed=7)
    assert list(np.flatnonzero(given)) == [3, 9] and sel3.size == 0 and test3.size == 40
    with pytest.raises(InputError, match="not an edge"):
        choose_circuit(S, CircuitTestsSpec(edges=["nope"]), names, ranking="absolute", groups=None, seed=7)


def test_layout_masks_draw_connected_random_and_inflated_circuits():
    from circuitstat.circuits.groundtruth import load_groundtruth
    from circuitstat.stats.circuit_paths import on_paths, path_graph

    names = list(load_groundtruth("planted:induction?background=0.3").model.graph.edge_names)
    E = len(names)
    circuit = np.zeros(E, dtype=bool)
    circuit[[names.index("input->a0.h0<v>"), names.index("a0.h0->a1.h0<k>"), names.index("a1.h0->logits")]] = True
    lay = layout_masks(circuit, 30, seed=3, names=names)
    parts = lay.split(lay.masks.T)  # columns of a fake metric matrix [E, C]: one per mask
    g = path_graph(names)
    np.testing.assert_array_equal(parts["circuit"], circuit)
    np.testing.assert_array_equal(parts["complement"], ~circuit)
    assert (parts["minus"].sum(0) == 2).all() and not (parts["minus"].T & ~circuit).any()
    infl, infl_minus = parts["inflated"].T, parts["inflated_minus"].T
    assert (infl[:, circuit]).all() and (infl.sum(1) > 3).all()  # the circuit plus at least one new edge
    # each inflated circuit minus exactly one of its newly added edges
    np.testing.assert_array_equal(infl & ~infl_minus, np.eye(E, dtype=bool)[lay.added_edges])
    assert not circuit[lay.added_edges].any()
    rand = parts["random"].T
    assert (rand.sum(1) >= 3).all()
    # every random circuit is a union of input -> logits paths: all its edges are live (connected), unlike a
    # uniform 3-subset of the 75 edges (negative control: most of those have no live edge at all)
    assert all((on_paths(g, r) == r).all() for r in rand)
    rng = np.random.default_rng(0)
    uniform = [np.isin(np.arange(E), rng.choice(E, 3, replace=False)) for _ in range(200)]
    assert np.mean([(on_paths(g, u) == u).all() for u in uniform]) < 0.1
    np.testing.assert_array_equal(parts["random_complement"], ~parts["random"])
    with pytest.raises(InputError, match="edge names"):
        layout_masks(circuit, 5, seed=3, names=names[:-1])


def test_spec_needs_one_circuit_and_edge_level():
    base = {"model": "random:gpt2?n_layer=1", "task": {"n": 16}}
    with pytest.raises(InputError, match="exactly one of tests.k"):
        parse_spec({**base, "tests": {"k": 3, "edges": ["a"]}})
    with pytest.raises(InputError, match="level: edge"):
        parse_spec({**base, "level": "node", "tests": {"k": 3}})
    assert parse_spec({**base, "tests": {"k": 3}}).tests.correction == "holm"
    assert parse_spec({**base, "tests": {"k": 3}}).tests.random_quantile == 0.9  # the paper's fixed q
    # 20 random circuits: beating all of them gives p = 0.9^20 = 0.12 at q = 0.9, so the test could never pass
    with pytest.raises(InputError, match="n_random >= 29"):
        parse_spec({**base, "tests": {"k": 3, "n_random": 20}})
    with pytest.raises(InputError, match="n_random >= 19"):
        parse_spec({**base, "tests": {"k": 3, "n_random": 10, "random_quantile": None}})


def _tost_claims(tmp_path):
    path = tmp_path / "tost.yaml"
    path.write_text("run: run\nclaims:\n  - kind: circuit_equivalent_tost\n")
    return path


def test_planted_circuit_stage_tables_claims_report(tmp_path):
    from circuitstat.circuits.attribution import attribute
    from circuitstat.circuits.groundtruth import load_groundtruth
    from circuitstat.core.rundir import RunDir
    from circuitstat.pipelines.circuit_tests import circuit_tests_stage
    from circuitstat.pipelines.claims import check
    from circuitstat.reports.html.page import render_report

    gt = load_groundtruth("planted:induction?background=0.3")
    task = gt.task(64, 1)
    S = attribute(gt.model, task, "exact", batch_size=64, progress=False).scores
    spec = SimpleNamespace(tests=CircuitTestsSpec(k=4, n_random=40, n_permutations=99), methods=["exact"],
                           ranking="absolute", seed=0, batch_size=64)
    names = list(gt.model.graph.edge_names)
    out = tmp_path / "run"
    with RunDir(out, spec={"methods": ["exact"], "bootstrap": {}}, seed=0) as run:
        run.stage("circuit_tests", lambda: circuit_tests_stage(gt.model, task, {"exact": np.asarray(S)}, names, spec,
                                                               run.stage_seed("circuit_tests"), "counterfactual"),
                  ["circuit_tests", "circuit_minimality"])
    tests = pq.read_table(out / "circuit_tests.parquet").to_pandas().set_index("test")
    mini = pq.read_table(out / "circuit_minimality.parquet").to_pandas()
    assert set(mini["name"]) == set(gt.truth_names())  # 32 selection prompts find the planted circuit
    assert (tests["n_select"] == 32).all() and (tests["n_test"] == 32).all()
    assert tests.loc["equivalence", "pvalue"] > 0.05 and tests.loc["sufficiency", "pvalue"] <= 0.05
    assert tests.loc["minimality", "pvalue"] > 0.05
    claims = tmp_path / "claims.yaml"
    claims.write_text("run: run\nclaims:\n  - kind: circuit_equivalent\n  - kind: circuit_sufficient\n"
                      "  - kind: circuit_minimal\n    alpha: 0.05\n  - kind: circuit_partially_necessary\n"
                      "    alpha: 0.01\n")
    report = check(claims)
    assert [r.status for r in report.results] == ["pass", "pass", "pass", "fail"]
    assert "chosen on 32 others" in report.results[0].reason
    html = render_report(out).read_text()
    assert 'id="circuit_tests"' in html and "a1.h0-&gt;logits" in html and "testing prompts: 32" in html
    # the verdict: one line per test, its decision the claims' (at their alpha) and the page's, with the
    # statistic's Clopper-Pearson interval from the table
    from circuitstat.reports.verdicts import verdict, verdict_text

    v = verdict(out)
    lines = {ln.text().split()[2]: ln for ln in v.lines if ln.section == "circuit_tests"}
    assert list(lines) == list(tests.index)
    for claim, test in zip(report.results, ("equivalence", "sufficiency", "minimality", "partial_necessity")):
        assert lines[test].verdict.startswith("passes" if claim.status == "pass" else "fails")
    tost = check(_tost_claims(tmp_path)).results[0]
    assert lines["equivalence_tost"].verdict.startswith("passes" if tost.status == "pass" else "fails")
    assert (tost.status == "pass") == (tests.loc["equivalence_tost", "pvalue"] <= 0.05)
    text = verdict_text(v)
    row = tests.loc["sufficiency"]
    assert f"{row['statistic_low']:.3f}" in text and f"{row['statistic_high']:.3f}" in text
    assert 0 <= row["statistic_low"] <= row["statistic"] <= row["statistic_high"] <= 1
    assert text.count("circuit test ") == 6 and max(len(ln.label) for ln in lines.values()) < 14


AUDIT = {"model": "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3",
         "task": {"name": "induction", "n": 16, "options": {"seq_len": 5}}, "methods": ["exact"], "batch_size": 8,
         "bootstrap": {"n_resamples": 20}, "k": [3], "faithfulness": False}


@pytest.mark.slow  # a whole audit (scores, edge_stats, stability) around the stage: ~10 s unloaded
def test_audit_runs_the_stage_and_refuses_unknown_edges_before_any_work(tmp_path):
    import json

    from circuitstat.pipelines.runs.audit.run import audit_stages, run_audit

    with pytest.raises(InputError, match="tests.edges names 'nope->logits'"):
        run_audit(parse_spec({**AUDIT, "tests": {"edges": ["nope->logits"]}}), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    spec = parse_spec({**AUDIT, "tests": {"k": 3, "n_random": 30, "n_permutations": 19}})
    assert audit_stages(spec)[-1] == "circuit_tests"
    out = run_audit(spec, tmp_path / "run")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stages"]["circuit_tests"]["status"] == "done"
    tests = pq.read_table(out / "circuit_tests.parquet").to_pydict()
    assert tests["test"] == ["equivalence", "equivalence_tost", "independence", "minimality", "sufficiency",
                             "partial_necessity"]
    assert set(tests["n_select"]) == {8} and set(tests["n_test"]) == {8} and set(tests["k"]) == {3}
    assert pq.read_table(out / "circuit_minimality.parquet").num_rows == 3


def test_check_says_which_spec_can_answer_a_circuit_test_claim():
    from circuitstat.pipelines.claims import parse_claims, spec_problem

    claim, other = parse_claims({"claims": [{"kind": "circuit_minimal"},
                                            {"kind": "circuit_sufficient", "method": "eap"}]}).claims
    base = {"model": "random:gpt2?n_layer=1", "task": {"n": 16}, "methods": ["exact", "eap"]}
    assert "add tests: {k: K}" in spec_problem(claim, parse_spec(base))
    with_tests = parse_spec({**base, "tests": {"k": 3}})
    assert spec_problem(claim, with_tests) is None
    assert "set tests.method: eap" in spec_problem(other, with_tests)
    assert spec_problem(other, parse_spec({**base, "tests": {"k": 3, "method": "eap"}})) is None
