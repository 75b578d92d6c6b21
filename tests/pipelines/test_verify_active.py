"""Verified audits with the active design (``verify: {design: active, budget: B}``): the verified table equals the
library's active_verified_means / active_means on the recorded cells bit for bit, the cells are the recorded seed's
draw, exact ran on those cells only, resume, the flag and pseudo-scores the design does not have, and bad specs
and flags refused (exit 2)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from circuitstat.core.errors import InputError
from circuitstat.core.tables import table_to_matrix
from circuitstat.pipelines.runs.audit.run import audit_stages, run_audit
from circuitstat.pipelines.spec import VerifySpec, parse_spec

MODEL = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3"
BASE = {"model": MODEL, "task": {"name": "induction", "n": 24, "options": {"seq_len": 5}}, "batch_size": 4,
        "bootstrap": {"n_resamples": 40}, "k": [3, 6], "faithfulness": False}
ACTIVE = {"design": "active", "budget": 6, "seed": 5}


def _matrix(run, name):
    return np.asarray(table_to_matrix(pq.read_table(run / f"{name}.parquet")), np.float64)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An active audit with exact on every prompt (its cells read from there) and one without (exact on the cells)."""
    root = tmp_path_factory.mktemp("active")
    full, act = root / "full", root / "active"
    run_audit(parse_spec({**BASE, "methods": ["exact", "eap"], "verify": ACTIVE}), full)
    run_audit(parse_spec({**BASE, "methods": ["eap", "eap-ig-inputs"], "verify": ACTIVE}), act)
    return full, act


def _cells(run, method):
    c = pq.read_table(run / "verified_cells.parquet").to_pandas()
    return c[c["method"] == method]


def test_verified_table_equals_the_library_on_the_recorded_cells(runs):
    from circuitstat.stats.verified import active_means, active_probabilities, active_sample
    from circuitstat.stats.verified.active_result import ACTIVE_LABEL, active_verified_means

    full, act = runs
    exact = _matrix(full, "scores_exact")
    got = pq.read_table(act / "verified.parquet")
    table = got.to_pandas()
    assert sorted(set(table["method"])) == ["eap", "eap-ig-inputs"]
    for stream, method in enumerate(("eap", "eap-ig-inputs")):
        approx = _matrix(act, f"scores_{method}")
        N, E = approx.shape
        c = _cells(act, method)
        cells = np.zeros((N, E), bool)
        cells[c["row"], c["edge"]] = True
        probs = np.zeros((N, E))
        probs[c["row"], c["edge"]] = c["probability"]
        # the cells and their π are the recorded seed's draw, reproducible from the table's seed and stream alone
        assert set(c["seed"]) == {5} and set(c["stream"]) == {stream} and set(c["budget"]) == {6.0}
        p = active_probabilities(approx, 6)
        assert np.array_equal(cells, active_sample(p, np.random.SeedSequence([5, stream])))
        assert np.array_equal(probs[cells], p[cells])
        g = table[table["method"] == method]
        assert np.array_equal(g["edge"], np.arange(E))
        # the oracle: the library on the full exact run's cells, bit for bit (exact_cells computed the same bits)
        want = active_means(approx, np.where(cells, exact, np.nan), cells, probs)
        for col, key in (("estimate", "estimate"), ("ci_low", "low"), ("ci_high", "high"), ("standard_error", "se"),
                         ("lam", "lam"), ("n_labelled", "cells")):
            assert np.array_equal(g[col].to_numpy(), want[key]), col
        res = active_verified_means(approx, exact, cells, probs, budget=6)
        for col, ref in (("pvalue", res.pvalue), ("qvalue", res.qvalue), ("approx_mean", approx.mean(0)),
                         ("estimate_crossfit", res.estimate_crossfit), ("rectifier_share", res.rectifier_share)):
            assert np.array_equal(g[col].to_numpy(), ref), col
        # the tail flag is assessed (true or false, never null) and is the library's on the same cells
        assert g["no_tail_seen"].notna().all()
        assert np.array_equal(g["no_tail_seen"].to_numpy(bool), res.reliable)
        # the p-values are the cross-fitted estimate's, not the interval's inverse: they differ somewhere
        assert not np.array_equal(res.estimate_crossfit, want["estimate"])
        few = want["cells"] <= 2  # an edge with 2 cells or fewer has no spread to read: unbounded, p = 1
        assert np.isfinite(g["ci_low"][~few]).all() and (g["ci_high"] > g["ci_low"]).sum() > E // 2
        assert np.isinf(g["ci_low"][few]).all() and (g["pvalue"][few] == 1).all()
        # negative control: the same estimator on the next seed's cells gives other numbers
        other = active_sample(p, np.random.SeedSequence([6, stream]))
        assert not np.array_equal(active_means(approx, exact, other, p)["estimate"], want["estimate"])
    # the design is named: the estimand, the params; with at most ~6 cells per edge (below the flag's 16) no edge
    # is flagged, so no interval here is called reliable
    assert set(table["estimand"]) == {"mean exact effect, verified on 6 expected exact cells per edge of 24 prompts "
                                      "(active sampling)"}
    assert table["no_tail_seen"].notna().all() and not table["no_tail_seen"].astype(bool).any()
    assert json.loads(got.schema.metadata[b"circuitstat.params"])["method"] == ACTIVE_LABEL


def test_exact_on_cells_equals_exact_on_every_prompt(runs):
    """The run without exact computed its cells with exact_cells: the same bits as the run reading them from exact on
    every prompt, so the two verified tables are equal."""
    full, act = runs
    a = pq.read_table(full / "verified.parquet").to_pandas()
    b = pq.read_table(act / "verified.parquet").to_pandas()
    b = b[b["method"] == "eap"].reset_index(drop=True)
    assert np.array_equal(_matrix(full, "scores_eap"), _matrix(act, "scores_eap"))
    for col in ("estimate", "ci_low", "ci_high", "qvalue", "lam"):
        assert np.array_equal(a[col].to_numpy(), b[col].to_numpy()), col


def test_stage_lists_its_tables_resumes_and_selects_no_verified_circuits(runs):
    _, act = runs
    spec = parse_spec({**BASE, "methods": ["eap", "eap-ig-inputs"], "verify": ACTIVE})
    assert audit_stages(spec)[:4] == ["index", "scores_eap", "scores_eap-ig-inputs", "verified"]
    manifest = json.loads((act / "manifest.json").read_text())
    assert manifest["stages"]["verified"]["status"] == "done"
    assert manifest["stages"]["verified"]["params"]["verify"] == {"seed": 5, "design": "active", "budget": 6.0}
    assert not (act / "verified_pseudo.parquet").exists() and not (act / "verified_prompts.parquet").exists()
    # no circuits ranked by verified estimates: the active design has no pseudo-scores
    stab = pq.read_table(act / "stability_vs_k.parquet").to_pandas()
    assert not any(m.endswith("+verified") for m in stab["method"])
    before = {t: (act / f"{t}.parquet").read_bytes() for t in ("verified", "verified_cells")}
    run_audit(spec, act)  # resumed: nothing recomputed, same bytes
    assert all((act / f"{t}.parquet").read_bytes() == b for t, b in before.items())


def test_the_uniform_record_is_unchanged():
    """A uniform spec records no design or budget (runs made before the active design resume), and an active record
    reads back as the same spec."""
    assert VerifySpec(n=8).model_dump() == {"n": 8, "seed": None, "edges": None, "tau": None}
    active = VerifySpec(design="active", budget=6)
    assert VerifySpec.model_validate(active.model_dump()) == active


@pytest.mark.parametrize("verify, words", [
    ({"design": "active"}, "needs verify.budget"),
    ({"budget": 6}, "add design: active"),
    ({"design": "active", "budget": 6, "n": 8}, "remove n"),
    ({"design": "active", "budget": 6, "edges": {"top": 2, "random": 3}, "tau": 0.1}, "remove edges and tau"),
    ({"design": "active", "budget": 3}, "greater than or equal to 4"),
    ({"design": "active", "budget": 25}, "verify.budget <= 24"),
    ({"design": "stratified", "budget": 6}, "'uniform' or 'active'"),
])
def test_bad_active_specs_are_refused_before_any_work(verify, words):
    with pytest.raises(InputError, match=words.replace(".", r"\.")):
        parse_spec({**BASE, "methods": ["eap"], "verify": verify})


def test_verified_circuits_claim_refused_with_the_active_design():
    from circuitstat.pipelines.claims.requirements import method_and_k

    spec = parse_spec({**BASE, "methods": ["eap"], "verify": ACTIVE})
    claim = type("Claim", (), {"method": "eap+verified", "k": 3})()
    assert "use verify: {n: 16} (design: uniform)" in method_and_k(claim, spec)


@pytest.mark.parametrize("flags, words", [
    (["--verify-budget", "6"], "add --verify-design active"),
    (["--verify-design", "active"], "needs --verify-budget"),
    (["--verify-design", "active", "--verify-budget", "6", "--verify", "8"], "remove them"),
    (["--verify-design", "active", "--verify-budget", "30"], "--verify-budget <= 24"),
    (["--verify-design", "uniform"], "needs --verify N"),
    (["--verify-design", "active", "--verify-budget", "6", "--level", "node"], "--verify-design active needs --level edge"),
    (["--verify-design", "active", "--verify-budget", "6", "--method", "exact"], "add eap"),
])
def test_bad_attribute_flags_exit_2(flags, words, tmp_path):
    from circuitstat.pipelines.cli import app

    r = CliRunner().invoke(app, ["attribute", "--model", MODEL, "--n", "24", "--out", str(tmp_path / "r"), *flags])
    assert r.exit_code == 2, r.output
    assert words in r.output, r.output
    assert not (tmp_path / "r").exists()


def test_verdict_page_and_claims_read_the_active_table(runs, tmp_path):
    """The verdict line names the design and its flag ("no tail seen", the intervals not flagged counted with the
    active design's yardstick), the page's flag column says "no" (never "not assessed" or "yes": under 16 cells per
    edge), a verified_edge claim on ci_low is refused (exit 2) naming the budget as the fix, and one on the estimate
    holds at the cell and fails a hair past it."""
    import html
    import re

    import yaml

    from circuitstat.pipelines.cli import app
    from circuitstat.reports.html.page import render_report
    from circuitstat.reports.verdicts import verdict

    _, act = runs
    (line,) = [ln for ln in verdict(act).lines if ln.label == "verified" and ln.verdict.startswith("eap:")]
    text = line.text()
    assert "(active sampling)" in text and "no tail seen" in text and "not assessed" not in text
    assert ("wider than 2× exact on as many prompts as the edge's exact cells or 20× exact on all N prompts "
            "(estimated) (!)") in text
    page = html.unescape(re.sub(r"<[^>]+>", " ", render_report(act).read_text()))
    assert "not assessed" not in page and "≤ 2× exact on as many prompts as the edge's exact cells" in page
    v = pq.read_table(act / "verified.parquet").to_pandas()
    v = v[(v["method"] == "eap") & np.isfinite(v["ci_low"])]
    row = v.iloc[int(np.argmax(np.abs(v["estimate"])))]

    def check(statistic: str, bound: float, i: int):
        f = tmp_path / f"c{i}.yaml"
        f.write_text(yaml.safe_dump({"claims": [{"kind": "verified_edge", "edge": row.edge_name, "method": "eap",
                                                 "statistic": statistic, "min": bound}]}))
        return CliRunner().invoke(app, ["check", str(f), "--run", str(act), "--allow-outside"])

    r = check("ci_low", float(row.ci_low), 0)
    assert r.exit_code == 2 and "no_tail_seen = false" in r.output and "verify.budget" in r.output, r.output
    est = float(row.estimate)
    codes = [check("estimate", b, i + 1).exit_code for i, b in enumerate((est, est + 1e-6 * max(abs(est), 1.0)))]
    assert codes == [0, 1], codes


def test_a_run_made_before_the_cap_is_not_described_as_capped(runs, tmp_path):
    """A verified table without width_vs_exact_on_all (a run made before issue 48 item 1's cap) is read, and its
    verdict and page name only the factor-2 rule; the same run with the column names the cap (the control)."""
    import html
    import re
    import shutil

    from circuitstat.core.run_check import record_tables
    from circuitstat.reports.html.page import render_report
    from circuitstat.reports.verdicts import verdict

    _, act = runs
    old = tmp_path / "old"
    shutil.copytree(act, old)
    path = old / "verified.parquet"
    t = pq.read_table(path)
    pq.write_table(t.drop_columns(["width_vs_exact_on_all"]).replace_schema_metadata(t.schema.metadata), path)
    record_tables(old, [path])  # written by that old run: recorded in its manifest
    for run, capped in ((act, True), (old, False)):
        (line,) = [ln for ln in verdict(run).lines if ln.label == "verified" and ln.verdict.startswith("eap:")]
        page = html.unescape(re.sub(r"<[^>]+>", " ", render_report(run).read_text()))
        assert ("20× exact on all N prompts (estimated)" in line.text()) is capped
        assert ("≤ 20× exact on all N prompts (estimated)" in page) is capped
        assert "wider than 2× exact on as many prompts as the edge's exact cells" in line.text()
