"""``circuitstat sample-size`` end to end on a pilot whose answer is known: three edges far above the rest."""

from __future__ import annotations

import html
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
    # the primary, J_{N/2}: two disjoint halves of 20 prompts each, the audit's jaccard_half and its interval
    assert stab["half_units"][at40] == 20 and stab["jaccard_half"][at40] == 1.0 and stab["p_clear_half"][at40] == 1.0
    assert "J_N/2 (primary)" in r.output and "jaccard_half" in r.output and "J_N (extrapolated)" in r.output
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


def test_sample_size_is_a_run_kind_whose_run_records_its_kind_and_spec(tmp_path):
    """Issue 46: ``sample-size`` writes a run directory, so it is a run kind: its spec reads back (from the manifest
    too), its run records its kind, and the command line goes through it (its manifest holds the kind's spec)."""
    import json

    from circuitstat.core.tables import read_table
    from circuitstat.pipelines.kinds import KINDS, kind, recorded_kind

    _pilot(tmp_path / "pilot")
    k = kind("sample-size")
    assert "sample-size" in KINDS and k.name == "sample-size"
    spec = k.parse({"pilot": str(tmp_path / "pilot"), "n": [16, 40], "k": [3], "datasets": 2, "resamples": 200,
                    "seed": 3}, "a test")
    assert k.parse(spec.model_dump(mode="json"), "its dump") == spec
    assert k.parse({"pilot": spec.pilot}, "defaults").model_dump() == {  # the command's defaults
        "pilot": spec.pilot, "n": [64, 128, 256, 512], "k": [5, 10, 20], "target": 0.5, "claims": None, "method": None,
        "datasets": 20, "means": "tested", "resamples": None, "level": 0.9, "plan": False, "model": None,
        "seed": 0}
    assert k.stages(spec) == [] and k.sources(spec) == []
    res = k.run(spec, tmp_path / "kind")
    manifest = json.loads((tmp_path / "kind" / "manifest.json").read_text())
    assert recorded_kind(manifest) == "sample-size" and k.parse(manifest["spec"], "the manifest") == spec
    r = CliRunner().invoke(app, ["sample-size", spec.pilot, "--n", "16", "--n", "40", "--k", "3", "--datasets", "2",
                                 "--resamples", "200", "--seed", "3", "--out", str(tmp_path / "cli")])
    assert r.exit_code == 0, r.output
    cli_manifest = json.loads((tmp_path / "cli" / "manifest.json").read_text())
    assert recorded_kind(cli_manifest) == "sample-size" and k.parse(cli_manifest["spec"], "the CLI's") == spec
    for name in res.tables():  # the same spec, the same numbers (NaN where NaN), whichever entry point ran it
        a, b = (read_table(tmp_path / d / f"{name}.parquet").to_pydict() for d in ("cli", "kind"))
        assert list(a) == list(b)
        for column in a:
            np.testing.assert_array_equal(np.asarray(a[column]), np.asarray(b[column]), err_msg=f"{name}.{column}")


def test_the_sample_size_kind_refuses_a_bad_spec_and_another_kinds_out(tmp_path):
    """Negative controls: an unknown key, a value out of bounds and another kind's run directory are refused, and
    nothing is written into that run."""
    from circuitstat.core.errors import InputError
    from circuitstat.core.rundir import RunDir
    from circuitstat.pipelines.kinds import kind

    _pilot(tmp_path / "pilot")
    k = kind("sample-size")
    with pytest.raises(InputError, match="bootstrap"):
        k.parse({"pilot": str(tmp_path / "pilot"), "bootstrap": {"n_resamples": 200}}, "a test")
    with pytest.raises(InputError, match="datasets"):
        k.parse({"pilot": str(tmp_path / "pilot"), "datasets": 1}, "a test")
    with pytest.raises(InputError, match="resamples"):
        k.parse({"pilot": str(tmp_path / "pilot"), "resamples": 9}, "a test")
    with RunDir(tmp_path / "attr", spec={"method": "eap"}, seed=0, kind="attribute"):
        pass
    before = (tmp_path / "attr" / "manifest.json").read_bytes()
    spec = k.parse({"pilot": str(tmp_path / "pilot"), "n": [16], "k": [3], "datasets": 2}, "a test")
    with pytest.raises(InputError, match="holds a `circuitstat attribute` run, not a `circuitstat sample-size` run"):
        k.run(spec, tmp_path / "attr", force=True)
    assert (tmp_path / "attr" / "manifest.json").read_bytes() == before
    assert not list((tmp_path / "attr").glob("sample_size*"))


def _pilot_of(path: Path, S: np.ndarray) -> None:
    """Write a pilot scores run of S (32 prompts x the edges of a one-layer, two-head graph)."""
    from circuitstat.circuits.graph import ComponentGraph
    from circuitstat.circuits.scores import ScoreMatrix

    g = ComponentGraph(1, 2)
    ScoreMatrix(S[:, :g.n_edges].astype(np.float32), g, "edge", "eap", "counterfactual", "logit_diff").write(path)


@pytest.mark.parametrize("spiky", [True, False])
def test_the_terminal_and_the_figure_count_the_bounds_that_plan_nothing(tmp_path, spiky):
    """Issue 49 item 3 follow-up: a pilot of 32 normal rows with one 30-SD spike per edge has bounds about 10^6
    times its own width; the terminal says per N how many edges' bounds are below the pilot's width (none) and
    names the fix, the table flags each, and the figure shows the same counts. A normal pilot (the control): every
    bound informative at N = 128 and 512, no fix printed, no flag in the figure."""
    from circuitstat.core.tables import read_table

    S = np.random.default_rng(1).standard_normal((32, 13))  # the graph's 13 edges
    if spiky:
        S[np.arange(13), np.arange(13)] += 30.0  # one 30-SD spike per edge, each on its own prompt
    _pilot_of(tmp_path / "pilot", S)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["sample-size", str(tmp_path / "pilot"), "--n", "128", "--n", "512", "--k", "3",
                                 "--datasets", "2", "--resamples", "200", "--out", str(out)])
    assert r.exit_code == 0, r.output
    w = read_table(out / "sample_size_widths.parquet").to_pydict()
    E = len(w["n"]) // 2
    flags = np.asarray(w["width_upper_below_pilot"])
    assert (not flags.any()) if spiky else flags.all()
    svg = (out / "sample_size.svg").read_text()
    shown = [f"{0 if spiky else E} of {E} edges" in line for line in r.output.splitlines()
             if line.strip().startswith(("128 ", "512 ")) and line.endswith(" edges")]
    assert shown == [True, True], r.output
    assert ("take a larger pilot" in r.output) is spiky, r.output
    if spiky:
        assert f"{E} of {E} at N = 128, {E} of {E} at N = 512" in r.output
        assert all(f"N = {n}: upper bound above the pilot&#x27;s width for {E} of {E} edges" in svg for n in (128, 512))
    else:
        assert "upper bound above" not in svg


def test_a_sample_size_run_made_before_the_flag_still_reads(tmp_path):
    """An old run's widths table without width_upper_below_pilot passes its integrity check, validates against the
    schema (the column is optional) and its bound rows say 'not assessed'."""
    import pyarrow.parquet as pq

    from circuitstat.core.run_check import record_tables, verify_outputs
    from circuitstat.core.schema_results import RESULT_TABLES
    from circuitstat.core.tables import read_table
    from circuitstat.reports.sample_size_bound import bound_notes, bound_rows

    _pilot(tmp_path / "pilot")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["sample-size", str(tmp_path / "pilot"), "--n", "128", "--k", "3", "--datasets", "2",
                                 "--resamples", "200", "--out", str(out)])
    assert r.exit_code == 0, r.output
    path = out / "sample_size_widths.parquet"
    t = pq.read_table(path)
    pq.write_table(t.drop_columns(["width_upper_below_pilot"]).replace_schema_metadata(t.schema.metadata), path)
    record_tables(out, [path])  # written by that old run: recorded in its manifest
    verify_outputs(out)
    old = RESULT_TABLES["sample_size_widths"].validate(read_table(path))
    (note,) = bound_notes(bound_rows(old.to_pydict()), 32)
    assert "not assessed" in note


def test_the_terminal_and_the_figure_say_when_the_means_were_tied(tmp_path):
    """A pilot of pure noise (every edge's mean 0): the default ties the simulated means, the table records the
    homogeneity p-value (recomputed here from scipy's one-sample t tests) and the terminal and the figure carry the
    same sentence. The control, a pilot whose edges 0-2 carry 6-SD effects, ties nothing and says nothing."""
    from scipy import stats as st

    from circuitstat.core.tables import read_table

    S = np.random.default_rng(1).standard_normal((32, 13))
    _pilot_of(tmp_path / "noise", S)
    _pilot(tmp_path / "effects")
    for name, tied in (("noise", True), ("effects", False)):
        out = tmp_path / f"out-{name}"
        r = CliRunner().invoke(app, ["sample-size", str(tmp_path / name), "--n", "128", "--k", "3", "--datasets", "2",
                                     "--resamples", "200", "--out", str(out)])
        assert r.exit_code == 0, r.output
        s = read_table(out / "sample_size_stability.parquet").to_pydict()
        assert set(s["means_tied"]) == {tied}
        svg = (out / "sample_size.svg").read_text()
        assert ("means tied: " in r.output) is tied and ("means tied: " in svg) is tied
        if tied:
            p_e = st.ttest_1samp(S.astype(np.float32).astype(np.float64), 0.0).pvalue
            E = S.shape[1]
            want = min(1.0, 2 * min(st.chi2.sf(np.sum(st.norm.isf(p_e / 2) ** 2), E), E * p_e.min()))
            assert s["pilot_homogeneity_p"][0] == pytest.approx(want, rel=1e-6) and want > 0.05
            line = next(ln for ln in r.output.splitlines() if ln.startswith("means tied: "))
            label = f"means tied: no edge&#x27;s mean told apart (homogeneity p = {want:.2g})"
            assert line.startswith(html.unescape(label) + "; every simulated mean is tied") and label in svg
