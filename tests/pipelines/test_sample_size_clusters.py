"""A cluster-scheme audit is a ``sample-size`` pilot (issue 49): the audit records its templates with its scores,
and sample-size plans in whole templates (template means as units; claims simulated on datasets of whole
templates with the cluster scheme's own tables)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app

MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=50257&n_positions=64&seed=1"
PLACES = ["store", "park", "office", "school", "beach", "bank", "zoo", "farm", "shop", "lake", "church", "house",
          "market", "hotel", "garden", "library"]
NAMES = [("Mary", "John", "Alice"), ("Tom", "Anna", "David")]


def _audit(d, places) -> object:
    """Run a cluster-scheme audit of len(places) templates x 2 prompts; return the run directory."""
    rows = []
    for place in places:
        for a, b, c in NAMES:
            clean = f"When {a} and {b} went to the {place}, {b} gave a drink to"
            rows.append({"clean": clean, "corrupted": clean.replace(f", {b} ", f", {c} "), "answer": " " + a,
                         "wrong_answer": " " + b, "group": place})
    (d / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (d / "spec.yaml").write_text(
        f"models: ['{MODEL}']\ntask: {{name: t.jsonl, n: {len(rows)}}}\nmethods: [eap]\nk: [3, 6]\n"
        "bootstrap: {n_resamples: 200, scheme: clusters}\nranking: absolute\nseed: 0\nn_jobs: 1\n")
    r = CliRunner().invoke(app, ["audit", str(d / "spec.yaml"), "--out", str(d / "run")])
    assert r.exit_code == 0, r.output
    return d / "run"


@pytest.fixture(scope="module")
def pilot(tmp_path_factory):
    return _audit(tmp_path_factory.mktemp("cl16"), PLACES)


def test_a_cluster_audit_is_a_sample_size_pilot(pilot, tmp_path):
    from circuitstat.circuits.scores import ScoreMatrix
    from circuitstat.core.tables import read_table

    sm = ScoreMatrix.read(pilot, "scores_eap")
    g = sm.provenance["groups"]  # the templates, one label per prompt (two prompts each, in row order)
    assert len(g) == 32 and len(set(g)) == 16 and g[0::2] == g[1::2]
    es = read_table(pilot / "edge_stats.parquet").to_pydict()
    name = es["name"][int(np.argmax(np.abs(es["estimate"])))]
    claims = tmp_path / "claims.yaml"
    claims.write_text(f"claims:\n  - {{kind: edge_effect, method: eap, edge: '{name}', sign: nonzero, max_q: 0.5}}\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["sample-size", str(pilot), "--n", "32", "--n", "64", "--k", "3", "--target", "0.5",
                                 "--claims", str(claims), "--datasets", "3", "--out", str(out)])
    assert r.exit_code == 0, r.output
    w = read_table(out / "sample_size_widths.parquet").to_pydict()
    assert sorted(set(w["n"])) == [32, 64]
    w32 = np.array(w["width"])[np.array(w["n"]) == 32]
    w64 = np.array(w["width"])[np.array(w["n"]) == 64]
    live = w32 > 0  # edges whose scores vary (the others are 0 on every prompt)
    assert live.sum() >= 5 and np.all(w64[live] < w32[live]) and np.all(w64[~live] == 0)  # twice the templates
    st = read_table(out / "sample_size_stability.parquet").to_pydict()
    # J_{N/2} is planned in whole templates: N = 64 prompts hold 32 templates, each half 16 (jaccard_half_units)
    assert dict(zip(st["n"], st["half_units"])) == {32: 8, 64: 16}
    assert all(0 <= lo <= j <= hi <= 1 for lo, j, hi in zip(st["jaccard_half_pi_low"], st["jaccard_half"],
                                                            st["jaccard_half_pi_high"]))
    c = read_table(out / "sample_size_claims.parquet").to_pydict()
    p = dict(zip(c["n"], c["p_pass"]))
    assert 0.0 <= p[32] <= 1.0 and 0.0 <= p[64] <= 1.0  # simulated, not skipped


def test_the_pilot_widths_are_template_level(pilot):
    """Oracle: at the pilot's own size the pilot width is the default interval of the G template means (built by
    hand), not of the n prompts (negative control: the examples scheme's differs)."""
    from circuitstat.circuits.scores import ScoreMatrix
    from circuitstat.core.seeds import spawn_seeds
    from circuitstat.pipelines.runs.sample_size.simulate import pilot_groups, sample_size
    from circuitstat.pipelines.spec import AuditSpec
    from circuitstat.stats import ResamplingPlan, bootstrap_edges

    sm = ScoreMatrix.read(pilot, "scores_eap")
    groups = pilot_groups(sm)
    spec = AuditSpec.model_validate({"model": "pilot", "bootstrap": {"scheme": "clusters", "n_resamples": 200}})
    plain = AuditSpec.model_validate({"model": "pilot", "bootstrap": {"n_resamples": 200}})
    cl = sample_size(sm.scores, sm.names, "eap", [32], [3], 0.5, spec=spec, groups=groups, n_datasets=2)
    ex = sample_size(sm.scores, sm.names, "eap", [32], [3], 0.5, spec=plain, n_datasets=2)
    assert cl.params["unit"] == "templates" and list(cl.params["n_templates"]) == [16]
    S = np.asarray(sm.scores, dtype=np.float64)
    M = np.stack([S[groups == g].mean(axis=0) for g in np.unique(groups)])  # template means, label order
    c_w = spawn_seeds(np.random.SeedSequence(0), 3)[0]  # sample_size's widths child of seed 0
    want = bootstrap_edges(M, ResamplingPlan.bootstrap(16, 200, c_w), method="studentized_symmetric")
    np.testing.assert_allclose(cl.widths["pilot_width"], want.confidence_interval.high - want.confidence_interval.low,
                               rtol=1e-9, atol=1e-15)
    live = ex.widths["pilot_width"] > 0
    assert not np.allclose(cl.widths["pilot_width"][live], ex.widths["pilot_width"][live])
    with pytest.raises(Exception, match="do not record"):
        sample_size(sm.scores, sm.names, "eap", [32], [3], 0.5, spec=spec, groups=None, n_datasets=2)


def test_too_few_templates_exit_2_naming_templates(tmp_path):
    run = _audit(tmp_path, PLACES[:8])  # 16 prompts: enough prompts, too few templates
    r = CliRunner().invoke(app, ["sample-size", str(run), "--n", "32", "--k", "3", "--datasets", "2"])
    assert r.exit_code == 2, r.output
    assert "at least 16, got G = 8" in " ".join(r.output.split())
