"""`circuitstat study calibration`: coverage tables end to end on a tiny random model."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from circuitstat.pipelines.runs.calibration.study import summary_lines
from circuitstat.pipelines.cli import app
from circuitstat.stats.intervals import METHODS

MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64"


def _spec(tmp_path, **over) -> str:
    doc = {"model": MODEL, "task": {"name": "induction", "n": 128, "options": {"seq_len": 6}}, "method": "exact",
           "sizes": [16, 32], "n_datasets": 20, "n_resamples": 60, **over}
    p = tmp_path / "cal.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def test_calibration_study_writes_coverage_per_method_and_size(tmp_path) -> None:
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["study", "calibration", _spec(tmp_path), "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = pq.read_table(out / "coverage.parquet").to_pylist()
    assert {(x["kind"], x["n"]) for x in rows} == {(f"edge/{m}", n) for m in METHODS for n in (16, 32)}
    n_edges = pq.read_table(out / "scores_exact.parquet").schema.field("scores").type.list_size
    for x in rows:
        assert 0.0 <= x["coverage"] <= 1.0 and x["estimand"].startswith("mean effect")
        # one unit per edge (no null copies), and so no null-rejection rate to report
        assert x["n_units"] == n_edges and np.isnan(x["null_rejection_rate"]) and x["coverage_mc_se"] > 0
    per_unit = pq.read_table(out / "coverage_per_unit.parquet")
    assert per_unit.num_rows == len(rows) * n_edges
    # per edge: units named as the model's edges, each worst unit one of them, kurtosis deciles written
    labels = set(per_unit.column("unit_label").to_pylist())
    assert all("->" in u for u in labels) and {x["worst_unit"] for x in rows} <= labels
    by_kurtosis = pq.read_table(out / "coverage_by_kurtosis.parquet").to_pylist()
    assert {(x["kind"], x["n"]) for x in by_kurtosis} == {(x["kind"], x["n"]) for x in rows}
    assert all(sum(d["n_units"] for d in by_kurtosis if (d["kind"], d["n"]) == (x["kind"], x["n"])) <= n_edges
               for x in rows)
    assert "per unit: the worst unit" in r.output and "coverage by decile of the edges' excess kurtosis" in r.output
    # a fresh run of the same spec reproduces the table exactly (seeds from the spec, not the clock)
    again = CliRunner().invoke(app, ["study", "calibration", _spec(tmp_path), "--out", str(tmp_path / "run2")])
    assert again.exit_code == 0, again.output
    np.testing.assert_equal(pq.read_table(tmp_path / "run2" / "coverage.parquet").to_pylist(), rows)  # NaN == NaN
    html = CliRunner().invoke(app, ["report", str(out)])
    assert html.exit_code == 0, html.output
    page = (out / "report.html").read_text()
    assert "Calibration: interval coverage vs N" in page and "studentized_symmetric" in page


def test_calibration_spec_refuses_sizes_above_population(tmp_path) -> None:
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["study", "calibration", _spec(tmp_path, sizes=[16, 500]), "--out", str(out)])
    assert r.exit_code == 2 and "task.n" in r.output and not out.exists()


STABILITY_KINDS = {f"stability/{name}" for name in ("jaccard_data", "jaccard_pop", "phi_data", "jaccard_mc")}
FAITHFULNESS_KINDS = {"faithfulness/selected", "faithfulness/fixed", "faithfulness/fixed_bca"}


def test_calibration_study_with_stability_and_faithfulness_kinds(tmp_path) -> None:
    out = tmp_path / "run"
    spec = _spec(tmp_path, sizes=[32], intervals=["edge", "stability", "faithfulness"], ks=[3, 6],
                 n_truth_pairs=400)
    r = CliRunner().invoke(app, ["study", "calibration", spec, "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = {x["kind"]: x for x in pq.read_table(out / "coverage.parquet").to_pylist()}
    assert set(rows) == {f"edge/{m}" for m in METHODS} | STABILITY_KINDS | FAITHFULNESS_KINDS
    for kind in FAITHFULNESS_KINDS:
        assert rows[kind]["n_units"] == 2 and 0.0 <= rows[kind]["coverage"] <= 1.0 and kind in r.output
        assert "selected from N prompts" in rows[kind]["estimand"] or "f_pop(C(D))" in rows[kind]["estimand"]
    # Fieller's set flags bounded sets (coverage among them is its 'reliable' column); the BCa kind flags nothing
    assert 0.0 <= rows["faithfulness/fixed"]["share_reliable"] <= 1.0
    bca = rows["faithfulness/fixed_bca"]
    assert np.isnan(bca["share_reliable"]) and "BCa" in bca["estimand"]
    for kind in STABILITY_KINDS:
        x = rows[kind]
        assert x["n_units"] == 2 and x["n_datasets"] == 20 and 0.0 <= x["coverage"] <= 1.0
        assert np.isnan(x["null_rejection_rate"])  # no null units: not a false-positive rate
        assert 0.0 < x["mean_width"] <= 2.0  # Jaccard in [0, 1], Phi in [-1, 1]
        assert kind in r.output  # the one-screen summary lists the kind
    assert "E[Jaccard(top-k of D1, top-k of D2)]" in rows["stability/jaccard_data"]["estimand"]
    assert np.isnan(rows["stability/jaccard_data"]["share_reliable"]) and rows["edge/t"]["share_reliable"] > 0
    assert "NOT an interval" in rows["stability/jaccard_mc"]["estimand"]
    # Monte Carlo error of one dataset's statistic is far narrower than a data-level interval
    assert rows["stability/jaccard_mc"]["mean_width"] < rows["stability/jaccard_data"]["mean_width"]
    lines = summary_lines(list(rows.values()), 0.95, out)  # the one-screen summary
    for kind, x in rows.items():
        line = next(ln for ln in lines if ln.startswith(kind + " "))
        # no reliability flags there, but for Fieller's set, which flags its bounded sets
        assert ("—" in line) == (kind.startswith(("stability/", "faithfulness/")) and kind != "faithfulness/fixed")
        assert f"  {kind}: {x['estimand']}" in lines or kind.startswith("edge/")
    assert f"  edge/*: {rows['edge/t']['estimand']}" in lines
    per_unit = pq.read_table(out / "coverage_per_unit.parquet").to_pylist()
    labels = {(x["kind"], x["unit_label"]) for x in per_unit if x["kind"].startswith("stability/")}
    assert labels == {(k, f"k={v}") for k in STABILITY_KINDS for v in (3, 6)}
    truth = {(x["kind"], x["unit_label"]): x["truth"] for x in per_unit}
    for k in ("k=3", "k=6"):  # the Monte Carlo interval is checked against the data-level J_N
        assert truth[("stability/jaccard_mc", k)] == truth[("stability/jaccard_data", k)]
        assert 0.0 <= truth[("stability/jaccard_data", k)] <= 1.0
    html = CliRunner().invoke(app, ["report", str(out)])
    assert html.exit_code == 0, html.output
    page = (out / "report.html").read_text()
    assert "stability/jaccard_data" in page
    # families are told apart by line style (8 colours, up to 12 kinds): stability dashed, faithfulness dotted
    assert 'stroke-dasharray="5,3"' in page and 'stroke-dasharray="1.5,2.5"' in page


@pytest.mark.parametrize("over, message", [
    ({"intervals": ["edge", "stability"], "sizes": [16, 32]}, "at least 32 prompts"),
    ({"intervals": ["stability"], "sizes": [32], "ks": [3, 500]}, "every k must be below"),
    ({"intervals": ["edge", "bogus"]}, "intervals"),
    ({"intervals": ["faithfulness"], "sizes": [32], "ablation": "mean"}, "per-example ablation"),
    ({"intervals": ["faithfulness"], "sizes": [4, 32]}, "at least 8 prompts"),
])
def test_calibration_spec_refuses_bad_stability_settings(tmp_path, over, message) -> None:
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["study", "calibration", _spec(tmp_path, **over), "--out", str(out)])
    assert r.exit_code == 2 and message in r.output, r.output
    assert not out.exists()


# --- an existing attribution run as the population ----------------------------------------------
def _attribute(tmp_path, n: int = 128):
    out = tmp_path / "attr"
    r = CliRunner().invoke(app, ["attribute", "--model", MODEL, "--task", "induction", "--method", "exact",
                                 "--n", str(n), "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


def _write(tmp_path, name: str, doc: dict) -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return str(p)


SMALL = {"sizes": [32], "n_datasets": 20, "n_resamples": 60, "intervals": ["edge", "faithfulness"], "ks": [3, 6]}


def test_calibration_on_an_attribution_run_equals_the_study_that_attributes_itself(tmp_path) -> None:
    attr = _attribute(tmp_path)
    task = {"name": "induction", "n": 128}
    own = _write(tmp_path, "own.yaml", {"model": MODEL, "task": task, "method": "exact", **SMALL})
    reuse = _write(tmp_path, "reuse.yaml", {"scores": "attr", "model": MODEL, "task": task, **SMALL})
    for spec, out in ((own, "run-own"), (reuse, "run-reuse")):
        r = CliRunner().invoke(app, ["study", "calibration", spec, "--out", str(tmp_path / out)])
        assert r.exit_code == 0, r.output
    a, b = (pq.read_table(tmp_path / d / "coverage.parquet").to_pylist() for d in ("run-own", "run-reuse"))
    assert {x["kind"] for x in b} >= FAITHFULNESS_KINDS and len(b) == len(METHODS) + 3
    np.testing.assert_equal(a, b)  # the same population and seeds: the same table, faithfulness re-run included
    # the run records where its population came from, and the scores run's method and ablation
    import json

    manifest = json.loads((tmp_path / "run-reuse" / "manifest.json").read_text())
    assert manifest["spec"]["method"] == "exact" and manifest["spec"]["scores"].endswith("attr")


def test_calibration_on_an_attribution_run_without_a_spec(tmp_path) -> None:
    attr = _attribute(tmp_path)
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["study", "calibration", "--scores", str(attr), "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = pq.read_table(out / "coverage.parquet").to_pylist()
    # the defaults: every per-edge method at N = 32, 64, 128 of the run's 128 prompts, 200 datasets
    assert {(x["kind"], x["n"]) for x in rows} == {(f"edge/{m}", n) for m in METHODS for n in (32, 64, 128)}
    assert all(x["n_datasets"] == 200 for x in rows) and "edge/studentized_symmetric" in r.output


@pytest.mark.parametrize("doc, argv, message", [
    ({"scores": "attr", "method": "eap"}, [], "come from the attribution run"),
    ({"scores": "attr", "intervals": ["faithfulness"], "sizes": [32]}, [], "give model and task"),
    ({"scores": "attr", "model": MODEL, "task": {"name": "induction", "n": 128, "seed": 1},
      "intervals": ["faithfulness"], "sizes": [32]}, [], "does not rebuild the prompts"),
    ({"scores": "attr", "model": "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&seed=1"}, [],
     "is not the model of"),
    ({"scores": "attr", "sizes": [32, 256]}, [], "has 128 prompts"),
    ({"scores": "../attr"}, [], "allow-outside"),
    ({"scores": "nothing-here"}, [], "holds no scores.parquet"),
    (None, [], "or --scores DIR"),
])
def test_calibration_on_an_attribution_run_refuses_what_it_cannot_honour(tmp_path, doc, argv, message) -> None:
    _attribute(tmp_path)
    (tmp_path / "specs").mkdir()
    spec_dir = tmp_path if doc is None or doc["scores"] != "../attr" else tmp_path / "specs"
    args = [] if doc is None else [_write(spec_dir, "s.yaml", doc)]
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["study", "calibration", *args, *argv, "--out", str(out)])
    assert r.exit_code == 2 and message in r.output, r.output
    assert not out.exists()
