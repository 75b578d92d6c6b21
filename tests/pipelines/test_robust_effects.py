"""Robust effects where users meet them (issue 34 part 3): on a tiny audit whose circuit edges' means rest on a few
prompts, the terminal verdict, the HTML report (its verdict and its edge table) and the claims check show the same
median and trimmed-mean intervals, read from edge_stats' median_ci_* / trimmed_mean_ci_* columns."""

from __future__ import annotations

import math
import re

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app

# a large initialisation makes the random model's softmaxes saturate: a few prompts carry several edges' means
MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=3&initializer_range=2.0"


@pytest.fixture(scope="module")
def audit(tmp_path_factory):
    d = tmp_path_factory.mktemp("robust")
    (d / "spec.yaml").write_text(
        f"model: '{MODEL}'\ntask: {{name: induction, n: 24, options: {{seq_len: 5}}}}\nmethods: [exact]\n"
        "batch_size: 24\nbootstrap: {n_resamples: 200}\nk: [3, 6]\nranking: absolute\nseed: 0\nfaithfulness: false\n")
    r = CliRunner().invoke(app, ["audit", str(d / "spec.yaml"), "--out", str(d / "run")])
    assert r.exit_code == 0, r.output
    return d / "run", r.output


@pytest.mark.slow  # one CLI audit (about 10 s of CPU)
def test_terminal_page_and_claims_agree_on_the_robust_effects(audit, tmp_path):
    from circuitstat.pipelines.claims.checking import check
    from circuitstat.reports.verdicts import verdict, verdict_text

    run, printed = audit
    es = pq.read_table(run / "edge_stats.parquet").to_pandas().set_index("edge")
    v = verdict(run)
    line = next(ln for ln in v.lines if ln.label == "fragile means")  # the run's circuit has fragile means
    text = verdict_text(v)
    assert " ".join(text.split("\n", 1)[1].split()) in " ".join(printed.split())  # the audit printed this verdict
    page = (run / "report.html").read_text("utf-8")
    box = re.search(r'<section id="verdict">(.*?)</section>', page, re.S).group(1)
    forest = re.search(r'<section id="forest">(.*?)</section>', page, re.S).group(1)
    robust = [ci for ci in line.cis if ci.low != "ci_low"]
    assert len(robust) == 2 * len([ci for ci in line.cis if ci.low == "ci_low"]) > 0
    for ci in line.cis:
        assert ci.text() in text and f'<span class="v">{ci.text()}</span>' in box
    for ci in robust:
        assert f'<span class="v">{ci.text()}</span>' in forest  # the report's edge table shows the same interval
        row = es.loc[dict(ci.key)["edge"]]
        assert not row["no_tail_seen"]  # shown only where a few prompts carry the mean
        est = ci.low[:-len("_ci_low")]
        assert ci.text() == f"{ci.number(row[est])} [{ci.number(row[ci.low])}, {ci.number(row[ci.high])}]"
        assert ci.estimand.startswith("the median" if est == "median" else "the 20%-trimmed mean")
        claims = tmp_path / f"{est}{int(row.name)}.yaml"
        claims.write_text("claims:\n" + "".join(
            f"  - kind: edge_effect\n    edge: '{row['name']}'\n    method: exact\n    sign: nonzero\n    max_q: 1.0\n"
            + (f"    estimand: {e}\n" if e else "") for e in (est, "")))
        robust_res, mean_res = check(claims, run).results
        assert mean_res.status == "error" and "no_tail_seen = false" in mean_res.reason  # the mean's interval cannot back it
        assert robust_res.status == ("pass" if row[est] != 0 else "fail"), robust_res.reason
        for key, col in (("estimate", est), ("ci_low", ci.low), ("ci_high", ci.high), ("q", f"{est}_q")):
            assert math.isclose(robust_res.observed[key], row[col])
    assert any("Fragile means" in rule for rule in v.rules)
