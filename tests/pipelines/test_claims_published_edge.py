"""Claim kind ``published_edge`` (one module, pipelines/claims/kind_published_edge.py, and one registry entry): a
bound on one edge of a published circuit -- its q-value, interval ends or inclusion -- holds where the run's
published_circuit_edges row meets it and fails where it does not (negative controls: the same claim on a run where
the edge is unsupported, and a bound just beyond the observed value)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from builders import EDGES, audit_tables
from circuitstat.core.rundir import RunDir
from circuitstat.core.schema import fill
from circuitstat.pipelines.claims import evaluate_claims, parse_claims, spec_problem
from circuitstat.pipelines.cli import app

SUPPORTED = {"kind": "published_edge", "edge": "a0.h3 -> a1.h5<k>", "method": "exact", "statistic": "q", "max": 0.05}


def _run(path, q_of_edge_2=None):
    """A synthetic audit with a published circuit (tests/builders.py); ``q_of_edge_2`` overrides the published
    circuit's q-value of a0.h3->a1.h5<k> (a run where the paper's edge is not supported)."""
    tables = audit_tables(published=True)
    if q_of_edge_2 is not None:
        pce = tables["published_circuit_edges"]
        pce["q"] = [q_of_edge_2 if name == EDGES[2] else q for name, q in zip(pce["name"], pce["q"])]
    with RunDir(path, spec={"synthetic": True}, seed=0) as run:
        for name, t in tables.items():
            run.write_table(name, fill(name, t, len(next(iter(t.values())))))
    return path


def _check(run, *claims):
    return evaluate_claims(parse_claims({"claims": list(claims)}), run)


def test_holds_where_the_edge_is_supported_and_fails_where_it_is_not(tmp_path):
    held = _check(_run(tmp_path / "a"), SUPPORTED)[0]
    assert held.status == "pass", held.reason
    assert held.observed == {"q": pytest.approx(0.004)} and held.bound == "q <= 0.05"
    assert "q of a0.h3->a1.h5<k> (exact, published circuit) is 0.004 <= 0.05" in held.reason
    failed = _check(_run(tmp_path / "b", q_of_edge_2=0.3), SUPPORTED)[0]  # negative control: the same claim
    assert failed.status == "fail" and failed.observed == {"q": pytest.approx(0.3)}
    assert "is 0.3 > 0.05" in failed.reason


def test_inclusion_and_interval_bounds_read_the_edge_s_own_row(tmp_path):
    run = _run(tmp_path / "run")
    inc = {"kind": "published_edge", "edge": "a0.h3->a1.h5<k>", "method": "eap", "statistic": "inclusion"}
    low = {"kind": "published_edge", "edge": "input->a1.h5<k>", "method": "exact", "statistic": "ci_high"}
    r = _check(run, {**inc, "min": 0.9}, {**inc, "min": 0.96}, {**low, "max": -0.3}, {**low, "max": -0.31},
               {**inc, "edge": "a0.h1->a1.h2<v>", "max": 0.0})
    assert [x.status for x in r] == ["pass", "fail", "pass", "fail", "pass"], [x.reason for x in r]
    assert r[0].observed == {"inclusion": pytest.approx(0.95)} and r[2].observed == {"ci_high": pytest.approx(-0.3)}


def test_refused_where_a_few_prompts_carry_the_mean_or_the_edge_is_not_in_the_circuit(tmp_path):
    run = _run(tmp_path / "run")
    tail = {"kind": "published_edge", "edge": "a1.h5->logits", "method": "exact", "statistic": "ci_low", "min": 0.1}
    r = _check(run, tail, {**tail, "statistic": "inclusion"}, {**tail, "edge": "a0.h3->logits"},
               {**tail, "edge": "a9.h9->logits"})
    assert r[0].status == "error" and "no_tail_seen" in r[0].reason  # edge_stats flags the edge's interval
    assert r[1].status == "pass"  # inclusion is not an interval: the flag does not apply
    assert r[2].status == "error" and "is not an edge of the published circuit" in r[2].reason
    assert r[3].status == "error" and "is not an edge of the run's model" in r[3].reason


def test_the_preflight_asks_for_a_published_circuit(tmp_path):
    from circuitstat.pipelines.spec import parse_spec

    claim = parse_claims({"claims": [SUPPORTED]}).claims[0]
    base = {"model": "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=32", "methods": ["exact"]}
    assert "published_edge claims need a published circuit; add circuit: {file: FILE}" in spec_problem(
        claim, parse_spec(base))
    assert spec_problem(claim, parse_spec({**base, "circuit": {"file": "circuit.txt"}})) is None
    assert "method 'exact' is not in the spec's methods ['eap']" in spec_problem(
        claim, parse_spec({**base, "methods": ["eap"], "circuit": {"file": "circuit.txt"}}))


def test_a_real_check_circuit_run_answers_it(tmp_path):
    """On a real audit of a published circuit (check-circuit on a random model): the edge's row is read, a bound at the
    observed value holds and one just beyond it fails."""
    circuit = "input->a0.h1<v>\na0.h1->a1.h0<k>\na1.h0->logits\nm1->logits\n"
    (tmp_path / "circuit.txt").write_text(circuit)
    model = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3"
    r = CliRunner().invoke(app, ["check-circuit", str(tmp_path / "circuit.txt"), "--model", model, "--task", "induction",
                                 "--task-option", "seq_len=5", "--n", "12", "--batch-size", "4", "--n-resamples", "40",
                                 "--seed", "1", "--method", "eap", "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    rows = pq.read_table(tmp_path / "run" / "published_circuit_edges.parquet").to_pylist()
    row = next(x for x in rows if x["name"] == "a1.h0->logits")
    claim = {"kind": "published_edge", "edge": "a1.h0->logits", "method": "eap", "statistic": "inclusion"}
    res = _check(tmp_path / "run", {**claim, "min": row["inclusion"]}, {**claim, "min": row["inclusion"] + 0.01},
                 {**claim, "max": row["inclusion"] - 0.01})
    assert [x.status for x in res] == ["pass", "fail", "fail"], [x.reason for x in res]
    assert res[0].observed == {"inclusion": pytest.approx(row["inclusion"])}
    assert yaml.safe_dump(res[0].to_dict())  # the result is reportable as the other kinds' are
