"""verify.combine (issue 48 item 3b): several approximate methods as control variates in an audit's verified stage.

The combined rows against the library called directly on the same scores and exact cells (the oracle), the single
methods' rows against the same audit without combine (unchanged), the coefficient table against the result's
coefficients, bad specs refused (exit 2), the report, claims, compare, the service's table list and --plan."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from circuitstat.core.errors import InputError
from circuitstat.pipelines.runs.audit.run import audit_stages, run_audit
from circuitstat.pipelines.spec import parse_spec

MODEL = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3"
BASE = {"model": MODEL, "task": {"name": "induction", "n": 24, "options": {"seq_len": 5}}, "batch_size": 4,
        "bootstrap": {"n_resamples": 40}, "k": [3], "faithfulness": False}
PAIR = ["eap", "atp-qkfix"]
COMBINED = "eap+atp-qkfix"
VALUES = ("estimate", "standard_error", "ci_low", "ci_high", "df", "pvalue", "qvalue", "lam", "approx_mean",
          "rectifier_share", "approx_tail_share", "width_vs_exact_on_labelled", "estimate_crossfit")


def _spec(combine: bool, **verify):
    return parse_spec({**BASE, "methods": PAIR,
                       "verify": {"n": 8, "seed": 11, **({"combine": PAIR} if combine else {}), **verify}})


def _read(run, name):
    return pq.read_table(run / f"{name}.parquet").to_pandas()


def _matrix(run, name) -> np.ndarray:
    from circuitstat.core.tables import table_to_matrix

    return np.asarray(table_to_matrix(pq.read_table(run / f"{name}.parquet")), np.float64)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """exact on every prompt (the oracle's exact cells), and the same verified audit with and without combine."""
    root = tmp_path_factory.mktemp("combine")
    full, comb, plain = root / "full", root / "comb", root / "plain"
    run_audit(parse_spec({**BASE, "methods": ["exact", "eap"]}), full)
    run_audit(_spec(True), comb)
    run_audit(_spec(False), plain)
    return full, comb, plain


def test_combined_rows_equal_the_library_call(runs):
    """The combination's rows are verified_means_multi on the run's own scores and exact on the verified prompts."""
    from circuitstat.stats.verified import verified_means_multi

    full, comb, _ = runs
    exact = _matrix(full, "scores_exact")
    approx = {m: _matrix(comb, f"scores_{m}") for m in PAIR}
    rows = _read(comb, "verified_prompts")["row"].to_numpy()
    assert np.array_equal(rows, np.sort(np.random.default_rng(11).choice(24, 8, replace=False)))
    names = list(_read(comb, "edges")["name"])
    want = verified_means_multi(approx, exact[rows], rows, edge_names=names)
    got = _read(comb, "verified")
    assert list(dict.fromkeys(got["method"])) == [*PAIR, COMBINED]  # the singles first, then the combination
    g = got[got["method"] == COMBINED]
    assert np.array_equal(g["edge"], np.arange(exact.shape[1]))
    ref = {"estimate": want.estimate, "standard_error": want.standard_error, "ci_low": want.confidence_interval.low,
           "ci_high": want.confidence_interval.high, "df": want.df, "pvalue": want.pvalue, "qvalue": want.qvalue,
           "lam": want.lam, "approx_mean": want.approx_mean, "rectifier_share": want.rectifier_share,
           "approx_tail_share": want.approx_tail_share, "width_vs_exact_on_labelled": want.width_ratio,
           "estimate_crossfit": want.estimate_crossfit}
    for col in VALUES:
        np.testing.assert_allclose(g[col].to_numpy(), ref[col], rtol=0, atol=1e-12, err_msg=col)
    assert list(g["no_tail_seen"]) == list(want.reliable)
    assert set(g["estimand"]) == {"mean exact effect, verified on 8 of 24 prompts"}
    # negative control: the oracle tells the combination from either single method (their rows differ from it)
    for m in PAIR:
        single = got[got["method"] == m]["estimate"].to_numpy()
        assert np.abs(single - want.estimate).max() > 1e-6 * np.abs(want.estimate).max(), m


def test_coefficients_table_holds_each_coefficient_and_names_the_design(runs):
    from circuitstat.stats.verified import verified_means_multi

    full, comb, _ = runs
    exact = _matrix(full, "scores_exact")
    rows = _read(comb, "verified_prompts")["row"].to_numpy()
    want = verified_means_multi({m: _matrix(comb, f"scores_{m}") for m in PAIR}, exact[rows], rows)
    c = _read(comb, "verified_coefficients")
    E = exact.shape[1]
    assert set(c["method"]) == {COMBINED} and len(c) == 2 * E
    assert list(c["predictor"][:2]) == PAIR and np.array_equal(c["edge"], np.repeat(np.arange(E), 2))
    coef = c["coefficient"].to_numpy().reshape(E, 2)
    np.testing.assert_allclose(coef, want.coefficients, rtol=0, atol=1e-12)
    # lam of the combined rows is the sum of the coefficients written here
    v = _read(comb, "verified")
    np.testing.assert_allclose(coef.sum(1), v[v["method"] == COMBINED]["lam"], rtol=0, atol=1e-12)
    # the design: the library's own label, also in the stage's recorded parameters
    design = want.params["method"]
    assert set(c["design"]) == {design} and design.startswith("PPI++, 2 predictors, cross-fitted")
    params = json.loads((comb / "manifest.json").read_text())["stages"]["verified"]["params"]
    assert params["combined"] == {COMBINED: design} and params["verify"]["combine"] == PAIR


def test_single_method_rows_and_records_are_unchanged_by_combine(runs):
    """The single methods' verified rows and pseudo-scores are the same bits with and without combine, and a run
    without it records nothing new."""
    _, comb, plain = runs
    a, b = _read(plain, "verified"), _read(comb, "verified")
    assert set(a["method"]) == set(PAIR)
    for m in PAIR:
        ga, gb = a[a["method"] == m].reset_index(drop=True), b[b["method"] == m].reset_index(drop=True)
        assert list(ga.columns) == list(gb.columns) and len(ga) == len(gb)
        for col in ga.columns:
            assert ga[col].equals(gb[col]), (m, col)
        # negative control: the combination's rows differ from this method's, so a leak into them would show
        comb_rows = b[b["method"] == COMBINED].reset_index(drop=True)
        assert not np.allclose(comb_rows["estimate"], gb["estimate"], rtol=0, atol=1e-9), m
    assert pq.read_table(plain / "verified_pseudo.parquet").equals(pq.read_table(comb / "verified_pseudo.parquet"))
    assert not (plain / "verified_coefficients.parquet").exists()
    recorded = json.loads((plain / "manifest.json").read_text())
    params = recorded["stages"]["verified"]["params"]
    assert "combined" not in params and "combine" not in params["verify"]
    assert "combine" not in json.dumps(recorded.get("spec", {}))
    assert audit_stages(_spec(True)) == audit_stages(_spec(False))


@pytest.mark.parametrize("verify, methods, words", [
    ({"combine": ["eap"]}, PAIR, "combines at least 2"),
    ({"combine": ["eap", "eap"]}, PAIR, "more than once"),
    ({"combine": ["eap", "eap-ig-inputs"]}, PAIR, "not among the run's methods"),
    ({"combine": ["eap", "exact"]}, ["eap", "exact"], "combine approximate methods only"),
    ({"combine": ["eap", "edge-pruning"]}, ["eap", "edge-pruning"], "combine approximate methods only"),
    ({"combine": PAIR, "edges": {"top": 2, "random": 3}, "tau": 0.1}, PAIR, "remove edges and tau, or combine"),
    ({"combine": PAIR, "design": "active", "budget": 5}, PAIR, "needs the uniform design"),
    ({"combine": PAIR, "n": 4}, PAIR, "verify.n >= 5"),
])
def test_bad_combine_specs_are_refused(verify, methods, words):
    with pytest.raises(InputError, match=re.escape(words)):
        parse_spec({**BASE, "methods": methods, "verify": {"n": 8, **verify}})


def test_bad_combine_spec_exits_2_before_any_work(tmp_path):
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**BASE, "methods": PAIR, "verify": {"n": 8, "combine": ["eap", "atpstar"]}}))
    r = CliRunner().invoke(app, ["audit", str(spec), "--out", str(tmp_path / "run"), "--no-report"])
    assert r.exit_code == 2 and "verify.combine lists 'atpstar'" in r.output and "add it" in r.output, r.output
    assert not (tmp_path / "run").exists()


def test_report_shows_the_combination_with_its_design(runs):
    from circuitstat.reports.html.page import render_report
    from circuitstat.reports.tableset import Tables
    from circuitstat.reports.verdicts.verified import verified_lines

    _, comb, plain = runs
    lines = verified_lines(comb)
    assert [ln.split(":")[0] for ln in lines] == ["verified"] * 3
    assert any(f"{COMBINED} verified on 8 of 24 prompts" in ln for ln in lines)
    assert verified_lines(plain) == [ln for ln in lines if COMBINED not in ln]  # the singles' lines unchanged
    page = html.unescape(re.sub(r"<[^>]+>", "", render_report(comb).read_text()))
    c = Tables(comb).get("verified_coefficients").to_pandas()
    from circuitstat.reports.ci import fmt

    medians = ", ".join(f"{m} {fmt(float(np.median(c[c['predictor'] == m]['coefficient'])))}" for m in PAIR)
    assert f"eap and atp-qkfix together as control variates: {c['design'][0]}" in page
    assert f"median coefficient: {medians}" in page and "Σ coefficients" in page
    assert "together as control variates" not in html.unescape(render_report(plain).read_text())


def test_claims_on_single_methods_read_the_same_rows(runs, tmp_path):
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    _, comb, plain = runs
    v = _read(comb, "verified")
    eap = v[v["method"] == "eap"]
    r0 = eap.iloc[int(np.argmax(np.abs(eap["estimate"].to_numpy())))]
    other = float(v[(v["method"] == COMBINED) & (v["edge"] == r0["edge"])]["estimate"].iloc[0])
    assert abs(other - r0["estimate"]) > 1e-6  # the combination's row on this edge holds another number
    codes, outputs = {}, {}
    for run in (comb, plain):
        for bound in (r0["estimate"] - 1e-9, r0["estimate"] + 1e-3):
            f = tmp_path / "claims.yaml"
            f.write_text(yaml.safe_dump({"claims": [{"kind": "verified_edge", "edge": str(r0["edge_name"]),
                                                     "method": "eap", "statistic": "estimate",
                                                     "min": float(bound)}]}))
            res = CliRunner().invoke(app, ["check", str(f), "--run", str(run), "--allow-outside"])
            codes[(run.name, bound)] = res.exit_code
            outputs[(run.name, bound)] = res.output.replace(str(run), "RUN")
    low, high = r0["estimate"] - 1e-9, r0["estimate"] + 1e-3
    assert codes[("comb", low)] == codes[("plain", low)] == 0
    assert codes[("comb", high)] == codes[("plain", high)] not in (0, 2)
    assert outputs[("comb", low)] == outputs[("plain", low)] and "(eap) is" in outputs[("comb", low)]


def test_compare_and_the_service_table_list_read_the_run(runs, monkeypatch):
    from circuitstat.pipelines.service import api_runs
    from circuitstat.reports.compare import compare_runs

    _, comb, plain = runs
    cmp = compare_runs(plain, comb)
    assert any("verify.combine" in n for n in cmp.notes), cmp.notes  # the spec difference is named
    assert cmp.counts()["edges_flagged"] == 0 and cmp.counts()["edges_both"] > 0  # same scores, same intervals
    monkeypatch.setattr(api_runs, "run_dir", lambda svc, job: comb)  # the job's run directory is this run
    listed = api_runs.verified_tables(None, None)
    assert {"verified", "verified_prompts", "verified_pseudo", "verified_coefficients"} <= set(listed)
    monkeypatch.setattr(api_runs, "run_dir", lambda svc, job: plain)
    assert "verified_coefficients" not in api_runs.verified_tables(None, None)


def test_plan_prices_the_same_phase_2_with_combine():
    """The combination reuses the single methods' verified prompts and exact cells: --plan's cost is unchanged."""
    from circuitstat.pipelines.runs.audit.stages import audit_flops
    from circuitstat.pipelines.sources import LOCAL

    cfg = LOCAL.skeleton(MODEL).cfg
    assert audit_flops(_spec(True), cfg) == audit_flops(_spec(False), cfg) > 0
    # negative control: the comparison sees phase 2's size (more verified prompts cost more)
    assert audit_flops(_spec(True, n=12), cfg) > audit_flops(_spec(True), cfg)


def test_an_attribute_spec_cannot_combine():
    """attribute computes one method: a service spec asking it to combine is refused, naming the audit as the fix."""
    from circuitstat.pipelines.runs.attribute.run import attribute_spec

    with pytest.raises(InputError, match="attribute computes one method"):
        attribute_spec({"model": MODEL, "method": "eap", "n": 24, "verify": {"n": 8, "combine": PAIR}}, "<job>")
    assert attribute_spec({"model": MODEL, "method": "eap", "n": 24, "verify": {"n": 8}}, "<job>").verify.n == 8


def test_claims_on_the_combination_read_its_rows(runs, tmp_path):
    """A verified_edge claim may name the combination: it reads the combination's row, and a spec without that
    combine is told what to add (before any work)."""
    from typer.testing import CliRunner

    from circuitstat.pipelines.claims.parsing import parse_claims
    from circuitstat.pipelines.claims.requirements import verified_edge
    from circuitstat.pipelines.cli import app

    _, comb, plain = runs
    v = _read(comb, "verified")
    mine = v[v["method"] == COMBINED]
    r0 = mine.iloc[int(np.argmax(np.abs(mine["estimate"].to_numpy())))]
    single = float(v[(v["method"] == "eap") & (v["edge"] == r0["edge"])]["estimate"].iloc[0])
    assert abs(single - r0["estimate"]) > 1e-3 * abs(r0["estimate"])  # a bound between the two tells them apart
    codes = []
    for bound in (r0["estimate"] - 1e-9, r0["estimate"] + 1e-3):
        f = tmp_path / "claims.yaml"
        doc = {"claims": [{"kind": "verified_edge", "edge": str(r0["edge_name"]), "method": COMBINED,
                           "statistic": "estimate", "min": float(bound)}]}
        f.write_text(yaml.safe_dump(doc))
        res = CliRunner().invoke(app, ["check", str(f), "--run", str(comb), "--allow-outside"])
        assert f"({COMBINED}) is" in res.output, res.output
        codes.append(res.exit_code)
    assert codes[0] == 0 and codes[1] not in (0, 2), codes
    (claim,) = parse_claims(doc).claims
    assert verified_edge(claim, _spec(True)) is None
    assert "combine: [eap, atp-qkfix]" in verified_edge(claim, _spec(False))
    with pytest.raises(InputError, match="neither an approximate method"):
        parse_claims({"claims": [{**doc["claims"][0], "method": "eap+verified"}]})


def test_a_combined_run_resumes_and_refuses_a_changed_combine(runs, tmp_path):
    import shutil

    from circuitstat.core.rundir import StageSpecChangedError

    _, comb, _ = runs
    before = {t: (comb / f"{t}.parquet").read_bytes() for t in ("verified", "verified_coefficients")}
    run_audit(_spec(True), comb)  # resumed: nothing recomputed, the same bytes
    assert all((comb / f"{t}.parquet").read_bytes() == b for t, b in before.items())
    other = tmp_path / "other"
    shutil.copytree(comb, other)
    with pytest.raises(StageSpecChangedError, match="verify.combine"):  # the record tells the runs apart
        run_audit(_spec(False), other)
