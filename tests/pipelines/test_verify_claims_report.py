"""Verified runs where users meet them: the claims kinds (verified_edge, missed_edges), the terminal verdict and the
HTML report agree on the same table rows; `circuitstat check` end to end on a verified audit; attribute --verify
and --plan; the service's spec."""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app as APP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fixture_populations import load_zoo_pair  # noqa: E402

N, TAU = 512, 0.05


def _invoke(*args):
    r = CliRunner().invoke(APP, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    return r


@pytest.fixture(scope="module")
def zoo_run(tmp_path_factory) -> Path:
    """A run directory holding a verified EAP run on the zoo induction model's real paired scores (exact known on
    every prompt; exact for the verified prompts and edges taken from it), written by pipelines.verify."""
    from circuitstat.circuits.graph import ComponentGraph
    from circuitstat.circuits.scores import ScoreMatrix
    from circuitstat.core.rundir import RunDir
    from circuitstat.pipelines import verify as V
    from circuitstat.pipelines.spec import VerifySpec

    exact, eap, names = load_zoo_pair()
    exact, eap = exact[:N], eap[:N]
    g = ComponentGraph(2, 4, has_mlp=False)
    assert g.edge_names == names
    vs = VerifySpec(n=16, edges={"top": 10, "random": 30}, tau=TAU)
    plan = V.verify_plan({"eap": eap}, vs, seed=7)
    cols = plan.edges()
    tables = V.verified_tables({"eap": eap}, exact[np.ix_(plan.rows, cols)], cols, plan, names, confidence_level=0.95,
                               tau=TAU)
    out = tmp_path_factory.mktemp("zoo") / "run"
    edges = ScoreMatrix(np.zeros((1, g.n_edges), np.float32), g, "edge", "none", "counterfactual", "none").tables()
    with RunDir(out, spec={"model": "zoo:attn-only-2l/seed-0", "methods": ["eap"], "verify": vs.model_dump()},
                command=["test"], seed=0) as run:
        run.stage("index", lambda: {"edges": edges["edges"]}, ["edges"])
        run.stage("verified", lambda: tables, list(tables))
    return out


def _claims(run: Path, claims: list[dict], tmp: Path):
    f = tmp / f"claims-{len(list(tmp.iterdir()))}.yaml"
    f.write_text(yaml.safe_dump({"claims": claims}, sort_keys=False))
    return _invoke("check", f, "--run", run, "--allow-outside")


def test_terminal_page_and_claims_agree(zoo_run, tmp_path):
    """The verdict line's count of edges whose mean exact effect excludes 0 is the number of verified_edge claims
    (q <= 0.05) that hold; its missed-edges bound B is the smallest max a missed_edges claim passes with; the page
    shows the same line."""
    from circuitstat.reports.html.page import render_report
    from circuitstat.reports.verdicts import verdict, verdict_text

    v = pq.read_table(zoo_run / "verified.parquet").to_pandas()
    m = pq.read_table(zoo_run / "missed_edges.parquet").to_pandas()
    (line,) = [ln for ln in verdict(zoo_run).lines if ln.label == "verified"]
    text = line.text()
    k = int(re.search(r"prompts: (\d+) of (\d+) edges", text).group(1))
    bound = int(re.search(r"≤ (\d+) of (\d+) at level", text).group(1))
    assert "eap verified on 16 of 512 prompts" in text and f"of {len(v)} edges" in text
    # an independent count from the table: q <= 0.05 with no tail seen
    assert k == int(((v.qvalue <= 0.05) & v.no_tail_seen).sum()) and k > 0
    assert bound == int(m.missed_high[0])
    claims = [{"kind": "verified_edge", "edge": e, "method": "eap", "statistic": "qvalue", "max": 0.05}
              for e in v.edge_name]
    r = _claims(zoo_run, claims, tmp_path)
    assert f"{len(v)} claims: {k} hold," in r.output, r.output
    ok = _claims(zoo_run, [{"kind": "missed_edges", "method": "eap", "max": bound}], tmp_path)
    bad = _claims(zoo_run, [{"kind": "missed_edges", "method": "eap", "max": bound - 1}], tmp_path)
    assert ok.exit_code == 0 and bad.exit_code == 1, (ok.output, bad.output)
    # the count of flagged intervals certainly within 20x exact on all N, against the table and a claim on the bound
    c, f = map(int, re.search(r"; (\d+) of (\d+) with no tail seen are certainly within 20×", text).groups())
    flagged = v[v.no_tail_seen]
    assert (c, f) == (int((flagged.width_vs_exact_on_all_max <= 20).sum()), len(flagged)) and 0 < c < f
    e_in = flagged.edge_name[flagged.width_vs_exact_on_all_max <= 20].iloc[0]
    e_out = flagged.edge_name[flagged.width_vs_exact_on_all_max > 20].iloc[0]
    width = [{"kind": "verified_edge", "edge": e, "method": "eap", "statistic": "width_vs_exact_on_all_max",
              "max": 20} for e in (e_in, e_out)]
    r = _claims(zoo_run, width, tmp_path)
    assert r.exit_code == 1 and "2 claims: 1 hold," in r.output, r.output
    # the terminal and the page carry the same sentence
    assert " ".join(text.split()) in " ".join(verdict_text(verdict(zoo_run), width=10_000).split())
    page = html.unescape(re.sub(r"<[^>]+>", "", render_report(zoo_run).read_text()))
    assert " ".join(text.split()) in " ".join(page.split())


def test_missed_mass_in_the_verdict_and_claims(zoo_run, tmp_path):
    """The missed-mass bound (Σ|mean exact effect| over the unverified edges) is in the table, the verdict line and
    the page, and a missed_edges claim on mass_high passes at the cell and fails a hair below it."""
    from circuitstat.reports.ci import fmt
    from circuitstat.reports.html.page import render_report
    from circuitstat.reports.verdicts import verdict

    m = pq.read_table(zoo_run / "missed_edges.parquet").to_pandas()
    high = float(m.mass_high[0])
    assert np.isfinite(high) and high > 0 and m.mass_level[0] == pytest.approx(0.95)
    (line,) = [ln for ln in verdict(zoo_run).lines if ln.label == "verified"]
    assert f"their summed |mean exact effect| ≤ {fmt(high)} at level {fmt(0.95)} (approximate)" in line.text()
    page = html.unescape(re.sub(r"<[^>]+>", "", render_report(zoo_run).read_text()))
    assert f"summed |mean exact effect| is at most {fmt(high)}" in page
    ok = _claims(zoo_run, [{"kind": "missed_edges", "method": "eap", "statistic": "mass_high", "max": high}], tmp_path)
    bad = _claims(zoo_run, [{"kind": "missed_edges", "method": "eap", "statistic": "mass_high",
                             "max": high * (1 - 1e-6)}], tmp_path)
    assert ok.exit_code == 0 and bad.exit_code == 1, (ok.output, bad.output)
    assert "summed |mean exact effect|" in bad.output


def test_verified_claims_read_the_exact_cell(zoo_run, tmp_path):
    """A bound equal to the table's cell holds; one a hair past it fails; an unverified edge is an error."""
    v = pq.read_table(zoo_run / "verified.parquet").to_pandas()
    row = v[v.no_tail_seen].iloc[int(np.argmax(np.abs(v[v.no_tail_seen].estimate)))]
    lo = float(row.ci_low)
    ok = _claims(zoo_run, [{"kind": "verified_edge", "edge": row.edge_name, "method": "eap", "statistic": "ci_low",
                            "min": lo, "max": lo}], tmp_path)
    assert ok.exit_code == 0, ok.output
    bad = _claims(zoo_run, [{"kind": "verified_edge", "edge": row.edge_name, "method": "eap", "statistic": "ci_low",
                             "min": lo + 1e-6 * max(abs(lo), 1.0)}], tmp_path)
    assert bad.exit_code == 1 and "1 fail" in bad.output
    from circuitstat.circuits.graph import ComponentGraph

    missing = sorted(set(ComponentGraph(2, 4, has_mlp=False).edge_names) - set(v.edge_name))[0]
    err = _claims(zoo_run, [{"kind": "verified_edge", "edge": missing, "method": "eap", "statistic": "estimate",
                             "min": 0}], tmp_path)
    assert err.exit_code == 2 and "was not verified" in err.output


MODEL = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3"


def test_check_end_to_end_on_a_verified_audit(tmp_path):
    """`circuitstat check` runs the verified audit from the spec and evaluates the claims: a structurally zero edge
    (input -> a1.h1<q> cannot reach the read-out of a 2-layer model) cannot be significant, so its claim fails."""
    spec = {"model": MODEL, "task": {"name": "induction", "n": 32, "options": {"seq_len": 5}}, "methods": ["eap"],
            "batch_size": 4, "bootstrap": {"n_resamples": 20}, "k": [3], "faithfulness": False,
            "verify": {"n": 16, "seed": 3}}  # the flag passes no interval below 16 verified prompts
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    claims = {"spec": "spec.yaml", "run": "run", "claims": [
        {"kind": "verified_edge", "edge": "a1.h1->logits", "method": "eap", "statistic": "qvalue", "max": 1.0}]}
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(claims, sort_keys=False))
    r = _invoke("check", f, "--run-audit")  # check runs the audit only when asked to
    assert r.exit_code == 0, r.output
    run = tmp_path / "run"
    v = pq.read_table(run / "verified.parquet").to_pandas()
    zero = v[(v.estimate == 0) & (v.standard_error == 0)]
    assert len(zero), "the model has structurally zero edges among the verified ones"
    some = v[v.standard_error > 0].iloc[0]
    claims["claims"] = [{"kind": "verified_edge", "edge": zero.edge_name.iloc[0], "method": "eap",
                         "statistic": "qvalue", "max": 0.5, "name": "zero-is-significant"},
                        {"kind": "verified_edge", "edge": some.edge_name, "method": "eap", "statistic": "estimate",
                         "min": float(some.estimate), "max": float(some.estimate), "name": "read"}]
    f.write_text(yaml.safe_dump(claims, sort_keys=False))
    r = _invoke("check", f)
    assert r.exit_code == 1 and "2 claims: 1 hold, 1 fail" in r.output, r.output


def test_verified_claims_refused_by_a_spec_without_verify():
    from circuitstat.pipelines.claims.checking import spec_problem
    from circuitstat.pipelines.claims.parsing import parse_claims
    from circuitstat.pipelines.spec import parse_spec

    c = parse_claims({"claims": [{"kind": "missed_edges", "method": "eap", "max": 3}]}).claims[0]
    base = {"model": MODEL, "methods": ["eap"]}
    assert "add verify" in spec_problem(c, parse_spec(base))
    assert "edge subset" in spec_problem(c, parse_spec({**base, "verify": {"n": 8}}))
    assert spec_problem(c, parse_spec({**base, "verify": {"n": 8, "edges": {"top": 1, "random": 2}, "tau": 1}})) is None
