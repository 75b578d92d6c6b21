"""``--input-node`` on ``attribute`` and ``input_node`` in the audit spec: the same scores as the Python API
(circuitstat.circuits.attribution.attribute(..., input_node=...)), recorded in the manifest."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
from typer.testing import CliRunner

from circuitstat.circuits import load_model
from circuitstat.circuits.attribution import attribute
from circuitstat.pipelines.build import build_task
from circuitstat.pipelines.cli import app
from circuitstat.core.rundir import RunDir
from circuitstat.core.tables import table_to_matrix

# learned position embeddings: the two input-node conventions differ under zero ablation
TINY = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1"
runner = CliRunner()


def _python_scores(input_node: str, n: int = 6) -> np.ndarray:
    m = load_model(TINY)
    t = build_task(m, "induction", n=n, seed=0, metric=None)
    return attribute(m, t, "eap", ablation="zero", input_node=input_node, batch_size=3, progress=False).scores


def test_attribute_input_node_tokens_matches_python_api_and_is_recorded(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["attribute", "--model", TINY, "--method", "eap", "--ablation", "zero", "--n", "6",
                              "--batch-size", "3", "--input-node", "tokens", "--out", str(out)])
    assert res.exit_code == 0, res.output
    got = table_to_matrix(pq.read_table(out / "scores.parquet"))
    tokens, embeddings = _python_scores("tokens"), _python_scores("embeddings")
    assert np.allclose(got, tokens, atol=1e-6)
    assert not np.allclose(tokens, embeddings, atol=1e-4)  # the option changes the input edges' scores
    manifest = RunDir.read_manifest(out)
    assert manifest["spec"]["input_node"] == "tokens"
    assert manifest["stages"]["scores"]["params"]["input_node"] == "tokens"


def test_attribute_refuses_unknown_input_node(tmp_path):
    res = runner.invoke(app, ["attribute", "--model", TINY, "--input-node", "positions", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and not (tmp_path / "r").exists()


def test_audit_spec_input_node_matches_python_api_and_is_recorded(tmp_path):
    spec = {"model": TINY, "task": {"name": "induction", "n": 6}, "methods": ["eap"], "ablation": "zero",
            "input_node": "tokens", "batch_size": 3, "bootstrap": {"n_resamples": 40}, "k": [2, 4]}
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec))
    out = tmp_path / "run"
    res = runner.invoke(app, ["audit", str(path), "--out", str(out), "--no-report"])
    assert res.exit_code == 0, res.output
    run = RunDir.read_manifest(out)
    assert run["spec"]["input_node"] == "tokens"
    assert run["stages"]["scores_eap"]["params"]["input_node"] == "tokens"
    got = table_to_matrix(pq.read_table(out / "scores_eap.parquet"))
    assert np.allclose(got, _python_scores("tokens"), atol=1e-6)
