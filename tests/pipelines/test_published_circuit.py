"""``circuitstat check-circuit``: a circuit published in EAP-IG's JSON format, audited end to end on a tiny model.

The JSON is written the way EAP-IG's ``Graph.to_json`` writes one (tests/eapig_format.py, from EAP-IG's
``Graph.from_model`` definitions); the published tables are checked against the audit's own tables and an
independent re-evaluation of the same edge set.
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from eapig_format import eapig_graph, write_eapig_json

from circuitstat.pipelines.cli import app

MODEL = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3"
CFG = {"n_layers": 2, "n_heads": 2, "parallel_attn_mlp": False, "d_model": 32}
CIRCUIT = ["input->a0.h1<v>", "a0.h1->a1.h0<k>", "a0.h1->m0", "m0->a1.h0<q>", "a1.h0->logits", "m1->logits"]
ARGS = ["--model", MODEL, "--task", "induction", "--task-option", "seq_len=5", "--n", "12", "--batch-size", "4",
        "--n-resamples", "40", "--seed", "1"]


def _cli(*args):
    return CliRunner().invoke(app, ["check-circuit", *map(str, args)])


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    d = tmp_path_factory.mktemp("published")
    _, edges = eapig_graph(CFG)
    scores = dict(zip(edges, np.random.default_rng(0).normal(size=len(edges)).tolist()))
    path = write_eapig_json(d / "ioi-circuit.json", CFG, set(CIRCUIT), scores)
    claims = d / "claims.yaml"
    claims.write_text(yaml.safe_dump({"claims": [
        {"kind": "published_circuit", "name": "share of unsupported edges is a share", "method": "eap",
         "statistic": "share_unsupported", "max": 1.0},
        {"kind": "published_circuit", "name": "deliberately false", "method": "eap", "statistic": "share_unsupported",
         "max": -0.5}]}))
    r = _cli(path, *ARGS, "--out", d / "run", "--claims", claims)
    return d, path, scores, r


def test_published_circuit_is_audited_by_the_audit_stages(checked):
    d, path, scores, r = checked
    assert r.exit_code == 1, r.output  # the deliberately false claim fails, the other holds
    lines = {ln.split("  ")[0]: ln for ln in r.output.splitlines()}
    assert " pass " in lines["share of unsupported edges is a share"] and " FAIL " in lines["deliberately false"]
    run = d / "run"
    summary = pq.read_table(run / "published_circuit.parquet").to_pylist()
    assert [s["method"] for s in summary] == ["eap"] and summary[0]["n_edges"] == len(CIRCUIT)
    assert summary[0]["circuit"] == "ioi-circuit.json" and summary[0]["format"] == "eap-ig"
    assert "selection not included" in summary[0]["f_ci_estimand"]
    per = pq.read_table(run / "published_circuit_edges.parquet").to_pandas()
    assert sorted(per["name"]) == sorted(CIRCUIT)
    stats = pq.read_table(run / "edge_stats.parquet").to_pandas().set_index("name")
    np.testing.assert_array_equal(per["q"], stats.loc[per["name"], "q"])
    np.testing.assert_array_equal(per["estimate"], stats.loc[per["name"], "estimate"])
    assert summary[0]["n_unsupported"] == int((per["q"] > 0.05).sum())
    inc = pq.read_table(run / "inclusion.parquet").to_pandas()
    inc = inc[inc.k == len(CIRCUIT)].set_index("name")["frequency"]
    np.testing.assert_allclose(per["inclusion"], [inc.get(n, 0.0) for n in per["name"]])
    from circuitstat.reports.html import render_report

    page = render_report(run).read_text()
    assert '<section id="published">' in page and "ioi-circuit.json" in page and "a0.h1-&gt;a1.h0&lt;k&gt;" in page
    from interval_check import check_intervals

    check_intervals(run, page)  # every interval printed reads back from its table, with its estimand
    ks = set(pq.read_table(run / "faithfulness_vs_k.parquet").column("k").to_pylist())
    assert {3, 6, 12} <= ks  # the curve around the circuit's size: half, size, double


def test_published_faithfulness_and_cpr_match_a_re_evaluation(checked):
    from circuitstat.circuits.circuit import Circuit
    from circuitstat.circuits.faithfulness import MIB_FRACTIONS, faithfulness, faithfulness_curve
    from circuitstat.pipelines.build import build_task
    from circuitstat.pipelines.sources import LOCAL

    d, _, scores, _ = checked
    s = pq.read_table(d / "run" / "published_circuit.parquet").to_pylist()[0]
    model = LOCAL.load(MODEL)
    task = build_task(model, "induction", n=12, seed=1, seq_len=5)
    f = faithfulness(model, task, Circuit.from_edges(model.graph, CIRCUIT), batch_size=4, seed=1, progress=False)
    assert s["f_ratio"] == pytest.approx(float(f.ratio_of_means[0]), abs=1e-6)
    assert s["f_ci_low"] <= s["f_ratio"] <= s["f_ci_high"]
    vec = np.array([scores[n] for n in model.graph.edge_names], dtype=np.float32)
    curve = faithfulness_curve(model, task, vec, ranking="absolute", fractions=MIB_FRACTIONS, batch_size=4, seed=1,
                               progress=False)
    assert s["cpr"] == pytest.approx(curve.cpr, abs=1e-6) and s["cmd"] == pytest.approx(curve.cmd, abs=1e-6)
    assert s["cpr_ci_low"] <= s["cpr"] <= s["cpr_ci_high"]


def test_unknown_edges_and_another_models_json_are_exit_2(tmp_path):
    bad = tmp_path / "edges.txt"
    bad.write_text("# a circuit from another model\ninput->a0.h0<q>\na5.h0->logits\na0.h7->logits\nm9->logits\n")
    r = _cli(bad, *ARGS, "--out", tmp_path / "run")
    assert r.exit_code == 2 and "3 unknown edge name(s)" in r.output and "'a5.h0->logits'" in r.output
    assert not (tmp_path / "run").exists()
    other = write_eapig_json(tmp_path / "gpt2.json", {**CFG, "n_heads": 3}, {"a0.h2->logits"})
    r = _cli(other, *ARGS, "--out", tmp_path / "run")
    assert r.exit_code == 2 and "describes a graph" in r.output and not (tmp_path / "run").exists()


def test_a_specs_circuit_file_stays_in_the_specs_tree(tmp_path):
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.spec import load_spec

    (tmp_path / "specs").mkdir()
    (tmp_path / "circuit.json").write_text("{}")
    spec = tmp_path / "specs" / "audit.yaml"
    spec.write_text(yaml.safe_dump({"model": MODEL, "circuit": {"file": "../circuit.json"}}))
    with pytest.raises(InputError, match="circuit.file"):
        load_spec(spec)
    from pathlib import Path

    assert Path(load_spec(spec, allow_outside=True).circuit.file).resolve() == (tmp_path / "circuit.json").resolve()
    (tmp_path / "specs" / "c.txt").write_text("a1.h0->logits\n")
    spec.write_text(yaml.safe_dump({"model": MODEL, "circuit": {"file": "c.txt"}}))
    parsed = load_spec(spec)
    assert Path(parsed.circuit.file).resolve() == (tmp_path / "specs" / "c.txt").resolve()
    assert parsed.circuit.file_format == "edges"


def test_a_circuit_needs_the_resamples_of_a_faithfulness_interval():
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.spec import parse_spec

    doc = {"model": MODEL, "faithfulness": False, "bootstrap": {"n_resamples": 20}}
    assert parse_spec(doc).circuit is None  # without a circuit, 20 resamples are enough
    with pytest.raises(InputError, match="n_resamples=20 is too few"):
        parse_spec({**doc, "circuit": {"file": "c.txt"}})
