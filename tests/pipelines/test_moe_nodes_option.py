"""``--moe-nodes`` on ``attribute`` and ``moe_nodes`` in the audit spec (circuitstat.circuits.moe_nodes): the same
scores as the Python API on the split graph, recorded in the manifest only when 'experts' (a default run's records are
as before the option existed); a dense model is refused before anything is written."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
from typer.testing import CliRunner

from circuitstat.circuits import load_model
from circuitstat.circuits.attribution import attribute
from circuitstat.circuits.moe_nodes import set_moe_nodes
from circuitstat.core.rundir import RunDir
from circuitstat.core.tables import table_to_matrix
from circuitstat.pipelines.build import build_task
from circuitstat.pipelines.cli import app

TINY_MOE = ("random:qwen2_moe?hidden_size=16&num_hidden_layers=2&num_attention_heads=2&num_key_value_heads=1"
            "&intermediate_size=16&moe_intermediate_size=8&shared_expert_intermediate_size=8&num_experts=3"
            "&num_experts_per_tok=2&vocab_size=64&seed=1")
runner = CliRunner()


def _python_scores(n: int = 6) -> tuple[np.ndarray, list[str]]:
    m = set_moe_nodes(load_model(TINY_MOE), "experts")
    t = build_task(m, "induction", n=n, seed=0, metric=None)
    return attribute(m, t, "eap", batch_size=3, progress=False).scores, m.graph.edge_names


def test_attribute_and_audit_with_experts_as_nodes_match_the_python_api_and_are_recorded(tmp_path):
    ref, names = _python_scores()
    assert "m0.e2->m1" in names and "m1.shared->logits" in names
    out = tmp_path / "run"
    res = runner.invoke(app, ["attribute", "--model", TINY_MOE, "--method", "eap", "--n", "6", "--batch-size", "3",
                              "--moe-nodes", "experts", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert np.allclose(table_to_matrix(pq.read_table(out / "scores.parquet")), ref, atol=1e-6)
    assert pq.read_table(out / "edges.parquet").column("name").to_pylist() == names
    manifest = RunDir.read_manifest(out)
    assert manifest["spec"]["moe_nodes"] == "experts"
    spec = {"model": TINY_MOE, "task": {"name": "induction", "n": 6}, "methods": ["eap"], "moe_nodes": "experts",
            "batch_size": 3, "bootstrap": {"n_resamples": 40}, "k": [2, 4]}
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec))
    audit = tmp_path / "audit"
    res = runner.invoke(app, ["audit", str(path), "--out", str(audit), "--no-report"])
    assert res.exit_code == 0, res.output
    run = RunDir.read_manifest(audit)
    assert run["spec"]["moe_nodes"] == "experts" and run["stages"]["scores_eap"]["params"]["moe_nodes"] == "experts"
    assert np.allclose(table_to_matrix(pq.read_table(audit / "scores_eap.parquet")), ref, atol=1e-6)
    block = tmp_path / "block"  # the default records nothing new
    res = runner.invoke(app, ["attribute", "--model", TINY_MOE, "--n", "3", "--out", str(block)])
    assert res.exit_code == 0, res.output
    assert "moe_nodes" not in RunDir.read_manifest(block)["spec"]


def test_audit_spec_with_experts_on_a_dense_model_is_refused_before_the_run(tmp_path):
    spec = {"model": "random:llama", "task": {"name": "induction", "n": 4}, "methods": ["eap"], "moe_nodes": "experts"}
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec))
    res = runner.invoke(app, ["audit", str(path), "--out", str(tmp_path / "run"), "--no-report"])
    assert res.exit_code == 2 and "no mixture-of-experts layer" in res.output
    assert not (tmp_path / "run").exists()
