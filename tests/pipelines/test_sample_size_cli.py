"""``circuitstat sample-size`` end to end on a pilot whose answer is known: three edges far above the rest."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app


def _pilot(path: Path) -> list[str]:
    """Write a pilot scores run of 32 prompts: edges 0-2 carry effects of 6 SD, the others are noise about 0."""
    from circuitstat.circuits.graph import ComponentGraph
    from circuitstat.circuits.scores import ScoreMatrix

    g = ComponentGraph(1, 2)
    rng = np.random.default_rng(0)
    S = rng.standard_normal((32, g.n_edges))
    S[:, :3] += 6.0
    ScoreMatrix(S.astype(np.float32), g, "edge", "eap", "counterfactual", "logit_diff").write(path)
    return g.edge_names


def test_sample_size_predicts_widths_stability_and_claims(tmp_path):
    names = _pilot(tmp_path / "pilot")
    claims = tmp_path / "claims.yaml"
    claims.write_text(
        "claims:\n"
        f"  - {{kind: edge_effect, method: eap, edge: '{names[0]}', sign: positive, max_q: 0.05}}\n"
        "  - {kind: circuit_stability, method: eap, k: 3, statistic: jaccard_data_ci_low, min: 0.5}\n"
        "  - {kind: faithfulness, method: eap, k: 3, statistic: f_ci_low, min: 0.5}\n"
        f"  - {{kind: edge_effect, method: exact, edge: '{names[0]}', sign: positive, max_q: 0.05}}\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["sample-size", str(tmp_path / "pilot"), "--n", "16", "--n", "40", "--k", "3",
                                 "--target", "0.5", "--claims", str(claims), "--datasets", "3", "--resamples", "200",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "P(lower end >= 0.5)" in r.output and "n/a (N < 32)" in r.output
    from circuitstat.core.tables import read_table

    stab = read_table(out / "sample_size_stability.parquet").to_pydict()
    at40 = stab["n"].index(40)
    assert stab["jaccard"][at40] == 1.0 and stab["p_clear"][at40] == 1.0  # the three edges never change
    assert math.isnan(stab["p_clear"][stab["n"].index(16)])
    widths = read_table(out / "sample_size_widths.parquet").to_pydict()
    assert len(widths["n"]) == 2 * len(names) and widths["name"][:3] == names[:3]
    w16 = np.array(widths["width"])[np.array(widths["n"]) == 16]
    w40 = np.array(widths["width"])[np.array(widths["n"]) == 40]
    assert np.all(w40 < w16)  # more prompts, narrower intervals
    c = read_table(out / "sample_size_claims.parquet").to_pydict()
    p = {(i, n): v for i, n, v in zip(c["claim"], c["n"], c["p_pass"])}
    assert p[(0, 40)] == 1.0 and p[(1, 40)] == 1.0
    assert math.isnan(p[(2, 40)]) and math.isnan(p[(3, 40)]) and math.isnan(p[(0, 16)])
    notes = dict(zip(zip(c["claim"], c["n"]), c["note"]))
    assert "not simulated" in notes[(2, 40)] and "exact" in notes[(3, 40)]
    assert (out / "sample_size.svg").read_text().startswith("<svg")


@pytest.mark.parametrize("args, match", [
    (["{tmp}/nowhere"], "is not a directory"),
    (["{pilot}", "--k", "500"], "circuit sizes k must lie in"),
    (["{pilot}", "--method", "exact"], "no scores of method"),
])
def test_bad_input_exits_2_naming_the_fix(tmp_path, args, match):
    _pilot(tmp_path / "pilot")
    argv = [a.format(tmp=tmp_path, pilot=tmp_path / "pilot") for a in args]
    r = CliRunner().invoke(app, ["sample-size", *argv, "--datasets", "2"])
    assert r.exit_code == 2, r.output
    assert match in r.output
    assert not (tmp_path / "out").exists()


def test_plan_prices_a_model_larger_than_the_memory_limit(tmp_path):
    """Issue 43: a plan never refuses a size. ``sample-size --plan --model`` on Llama-3.1-8B's config.json alone
    (69.8 GiB by the pre-allocation bound, over the 16 GiB limit) prices each N instead of exiting 2."""
    import json

    from circuitstat.circuits.graph import ComponentGraph
    from circuitstat.circuits.scores import ScoreMatrix

    g = ComponentGraph(1, 2)
    S = np.random.default_rng(0).standard_normal((32, g.n_edges)).astype(np.float32)
    ScoreMatrix(S, g, "edge", "eap", "counterfactual", "logit_diff",
                provenance={"task": {"n_positions": 39}}).write(tmp_path / "pilot")
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "max_position_embeddings": 131072}))
    r = CliRunner().invoke(app, ["sample-size", str(tmp_path / "pilot"), "--n", "64", "--k", "3", "--plan",
                                 "--model", str(model), "--datasets", "2"])
    assert r.exit_code == 0, r.output
    assert "cost priced at" in r.output and "--allow-large" not in r.output
