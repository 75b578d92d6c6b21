"""Every option is honoured or refused (issue 14): changing it changes the output, or it is
documented as not affecting results and then the output must be identical.

An ignored option (``--metric`` once gave logit-difference scores under any name) fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app

# initializer_range=1: metric differences near 0.5 rather than 1e-4, so tables compared across batchings
# differ by float32 rounding only, never by a ratio of two rounding errors (issue 22)
TINY = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1&initializer_range=1.0"
BASE = {"--method": "eap", "--level": "edge", "--ablation": "counterfactual", "--n": "4", "--batch-size": "2",
        "--ig-steps": "3", "--seed": "0", "--dtype": "float32"}

runner = CliRunner()


def _scores(tmp_path: Path, name: str, **over: str) -> tuple[np.ndarray, dict]:
    opts = {**BASE, **over}
    out = tmp_path / name
    args = ["attribute", "--model", TINY, "--out", str(out)]
    for k, v in opts.items():
        args += [k, v]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.stderr
    table = pq.read_table(out / "scores.parquet")
    return np.asarray(table.column("scores").to_pylist(), dtype=np.float32), json.loads(
        (out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[np.ndarray, Path]:
    tmp = tmp_path_factory.mktemp("honoured")
    return _scores(tmp, "base")[0], tmp


@pytest.mark.parametrize("option, value", [
    ("--method", "exact"), ("--method", "eap-ig-inputs"), ("--method", "clean-corrupted"),
    ("--ablation", "zero"), ("--ablation", "mean"),
    ("--metric", "kl"), ("--metric", "prob_diff"), ("--metric", "cross_entropy"),
    ("--seed", "1"), ("--dtype", "bfloat16"),
])
def test_each_attribute_option_changes_the_scores(base, option, value):
    S0, tmp = base
    S, manifest = _scores(tmp, f"{option[2:]}-{value}", **{option: value})
    assert S.shape == S0.shape and np.isfinite(S).all()
    assert not np.array_equal(S, S0), f"{option} {value} was ignored"
    key = option[2:].replace("-", "_")
    assert str(manifest["spec"][key]) == value


def test_metric_kl_scores_are_kl_scores(base):
    """--metric kl gives the exact KL effect (an independent computation), not logit differences."""
    from circuitstat.circuits import load_model
    from circuitstat.circuits.attribution import attribute
    from circuitstat.circuits.metrics import kl_div
    from circuitstat.pipelines.build import build_task

    _, tmp = base
    S, manifest = _scores(tmp, "kl-exact", **{"--metric": "kl", "--method": "exact", "--level": "node"})
    assert manifest["spec"]["metric"] == "kl"
    model = load_model(TINY)
    task = build_task(model, "induction", n=4, seed=0, metric="kl")
    assert task.metric_name == "kl"
    # node 0 (the input) replaced by its counterfactual everywhere = the corrupted run itself
    clean = model(task.clean, task.attention_mask)
    corrupted = model(task.corrupted, task.attention_mask)
    expected = kl_div(corrupted, task, clean) - kl_div(clean, task, clean)
    assert np.allclose(S[:, 0], expected.detach().numpy(), atol=1e-5)
    ref = attribute(model, task, "exact", level="node", progress=False).scores
    assert np.allclose(S, ref, atol=1e-6)


def test_level_node_gives_one_column_per_sender(base):
    S0, tmp = base
    S, _ = _scores(tmp, "node", **{"--level": "node"})
    from circuitstat.circuits import load_model

    g = load_model(TINY).graph
    assert S0.shape[1] == g.n_edges and S.shape[1] == g.n_senders
    # EAP node scores are sums of each sender's out-edge scores
    sums = np.zeros_like(S)
    np.add.at(sums, (slice(None), g.edge_sender), S0)
    assert np.allclose(S, sums, atol=1e-5)


def test_n_sets_the_number_of_examples(base):
    S0, tmp = base
    S, _ = _scores(tmp, "n6", **{"--n": "6"})
    assert S.shape[0] == 6 and S0.shape[0] == 4


def test_ig_steps_changes_eap_ig(base):
    _, tmp = base
    a, _ = _scores(tmp, "ig3", **{"--method": "eap-ig-inputs", "--ig-steps": "3"})
    b, _ = _scores(tmp, "ig5", **{"--method": "eap-ig-inputs", "--ig-steps": "5"})
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("method", ["eap", "exact"])
def test_batch_size_does_not_change_the_scores(base, method):
    """batch_size is documented as not affecting results: the scores must be identical up to float rounding."""
    _, tmp = base
    a, _ = _scores(tmp, f"bs1-{method}", **{"--batch-size": "1", "--method": method})
    b, _ = _scores(tmp, f"bs3-{method}", **{"--batch-size": "3", "--method": method})
    assert np.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_n_jobs_does_not_change_the_scores(base):
    """--n-jobs splits whole batches across workers: the scores are bit-identical to one worker's."""
    S0, tmp = base
    S, manifest = _scores(tmp, "jobs2", **{"--n": "8", "--n-jobs": "2"})
    S1, _ = _scores(tmp, "jobs1", **{"--n": "8", "--n-jobs": "1"})
    assert S.shape == (8, S0.shape[1]) and np.array_equal(S, S1)
    assert "n_jobs" not in manifest["spec"]  # it changes how, not what: resuming with another n_jobs is allowed
    res = runner.invoke(app, ["attribute", "--model", TINY, "--out", str(tmp / "jobs0"), "--n-jobs", "0"])
    assert res.exit_code == 2 and not (tmp / "jobs0").exists()


def test_task_options_and_metric_reach_the_task():
    from circuitstat.circuits import load_model
    from circuitstat.pipelines.build import build_task

    model = load_model(TINY)
    a = build_task(model, "induction", n=3, seed=0, seq_len=4)
    b = build_task(model, "induction", n=3, seed=0, seq_len=6, metric="cross_entropy")
    assert a.metric_name == "logit_diff" and b.metric_name == "cross_entropy"
    assert b.clean.shape[1] - a.clean.shape[1] == 2 * (6 - 4)  # A and A[:-1], each 2 tokens longer
    c = build_task(model, "induction", n=3, seed=0, seq_len=4, token_ids=list(range(10, 30)))
    assert set(c.clean[:, 1:].flatten().tolist()) <= set(range(10, 30))
    d = build_task(model, "induction", n=3, seed=0, seq_len=4, corrupt="answer")
    # corrupt=answer changes only the answer's first occurrence; corrupt=all the whole first copy
    assert (d.corrupted != d.clean).sum(1).tolist() == [1, 1, 1]
    assert (a.corrupted != a.clean).sum(1).tolist() == [4, 4, 4]


# ---- the audit spec's fields -------------------------------------------------------------------
SPEC = {"model": TINY, "task": {"name": "induction", "n": 6, "options": {"seq_len": 4}}, "methods": ["eap"],
        "batch_size": 3, "bootstrap": {"n_resamples": 40}, "k": [2, 4], "faithfulness": True}


def _audit(tmp: Path, name: str, spec: dict) -> dict:
    from circuitstat.pipelines.runs.audit.run import run_audit
    from circuitstat.pipelines.spec import parse_spec

    out = tmp / name
    run_audit(parse_spec(spec), out)
    return {p.stem: pq.read_table(p).to_pandas() for p in out.glob("*.parquet")}


@pytest.fixture(scope="module")
def audit_base(tmp_path_factory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("audit")
    return _audit(tmp, "base", SPEC), tmp


def _with(path: str, value) -> dict:
    spec = json.loads(json.dumps(SPEC))
    node = spec
    *keys, last = path.split(".")
    for k in keys:
        node = node[k]
    node[last] = value
    return spec


def _differs(a, b, column: str) -> bool:
    x, y = np.stack(a[column].to_numpy()), np.stack(b[column].to_numpy())
    return x.shape != y.shape or not np.allclose(x, y, equal_nan=True)


@pytest.mark.parametrize("path, value, table, column", [
    ("task.metric", "kl", "scores_eap", "scores"),
    ("task.seed", 1, "scores_eap", "scores"),
    ("task.n", 8, "scores_eap", "scores"),
    ("task.options", {"seq_len": 5}, "scores_eap", "scores"),
    ("ablation", "zero", "scores_eap", "scores"),
    ("methods", ["eap-ig-inputs"], "scores_eap-ig-inputs", "scores"),
    ("seed", 1, "edge_stats", "ci_low"),
    ("bootstrap.n_resamples", 60, "edge_stats", "ci_low"),
    ("bootstrap.confidence_level", 0.8, "edge_stats", "ci_low"),
    ("bootstrap.ci_method", "percentile", "edge_stats", "ci_low"),
    ("k", [1, 3], "stability_vs_k", "k"),
    ("ranking", "signed", "faithfulness_vs_k", "f_ratio"),
    ("level", "node", "scores_eap", "scores"),
])
def test_each_audit_field_changes_its_table(audit_base, path, value, table, column):
    base, tmp = audit_base
    spec = _with(path, value)
    if path == "level":
        spec["k"] = [1, 2]  # the tiny model has 4 nodes
    other = _audit(tmp, path.replace(".", "_") + "-" + str(value).replace(" ", ""), spec)
    ref = base.get(table, base.get("scores_eap"))
    assert _differs(ref, other[table], column), f"{path}={value} was ignored"
    if path == "level":  # node circuits: sizes and the x axis count nodes
        assert np.allclose(other["faithfulness_vs_k"]["edge_fraction"], np.array([1, 2]) / 4)


def test_audit_batch_size_does_not_change_the_tables(audit_base):
    """Equal up to float32 rounding of differently batched matmuls (the fixture's m(M) - m(∅) is far
    from zero, so faithfulness ratios are as tight as the scores)."""
    base, tmp = audit_base
    other = _audit(tmp, "bs1", _with("batch_size", 1))
    for table, tol in (("scores_eap", 1e-5), ("edge_stats", 1e-5), ("faithfulness_vs_k", 1e-5)):
        for col in base[table].columns:
            if base[table][col].dtype.kind == "f":
                assert np.allclose(base[table][col], other[table][col], rtol=tol, atol=tol, equal_nan=True), (table, col)


def test_faithfulness_false_skips_the_stage(audit_base):
    _, tmp = audit_base
    assert "faithfulness_vs_k" not in _audit(tmp, "nofaith", _with("faithfulness", False))
