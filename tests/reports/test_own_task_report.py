"""The report of a small audit of one's own task says its reasons (issue 38, "the first hour"): why stability
has no interval, a whole sentence for the chosen k, the templates a cluster bootstrap resampled, and when the
1/(B+1) floor of resampling p-values sets the q-values; the terminal, the page in a browser and the claims
check say the same."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from circuitstat.core.schema import fill

MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=50257&n_positions=64&seed=1"
B = 200
TEMPLATES = {"store": "When {a} and {b} went to the store, {b} gave a drink to",
             "park": "After {a} and {b} met at the park, {b} handed a book to",
             "office": "Then {a} and {b} sat in the office, and {b} passed a note to",
             "school": "While {a} and {b} walked to the school, {b} threw a ball to"}
NAMES = [("Mary", "John", "Alice"), ("Tom", "Anna", "David"), ("Sarah", "James", "Mark"), ("Paul", "Lisa", "Emma")]


def _rows() -> list[dict]:
    """16 IOI-style prompt pairs from 4 templates (the corrupted prompt swaps the repeated name)."""
    out = []
    for group, t in TEMPLATES.items():
        for a, b, c in NAMES:
            clean = t.format(a=a, b=b)
            corrupted = t.format(a=a, b=b).rsplit(f" {b} ", 1)
            out.append({"clean": clean, "corrupted": f" {c} ".join(corrupted), "answer": " " + a,
                        "wrong_answer": " " + b, "group": group})
    return out


@pytest.fixture(scope="module")
def audit(tmp_path_factory):
    """A finished audit of 16 prompts in 4 templates, resampled by template, with its claims checked."""
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    d = tmp_path_factory.mktemp("own")
    (d / "ioi16.jsonl").write_text("\n".join(json.dumps(r) for r in _rows()))
    (d / "spec.yaml").write_text(
        f"models: ['{MODEL}']\ntask: {{name: ioi16.jsonl, n: 16}}\nmethods: [exact]\nk: [3, 6]\n"
        f"bootstrap: {{n_resamples: {B}, scheme: clusters}}\nranking: absolute\nseed: 0\nn_jobs: 1\n")
    r = CliRunner().invoke(app, ["audit", str(d / "spec.yaml"), "--out", str(d / "run")])
    assert r.exit_code == 0, r.output
    return d / "run", r.output


def _edges(run):
    import pyarrow.parquet as pq

    return pq.read_table(run / "edge_stats.parquet").to_pandas()


def test_edge_stats_records_the_clusters_the_method_and_the_p_value_floor(audit):
    run, _ = audit
    es = _edges(run)
    assert (es["n"] == 16).all() and (es["n_clusters"] == 4).all()
    assert (es["ci_method"] == "wild_cluster_t").all() and es["ci_method_note"].str.contains("cluster bootstrap").all()
    # 4 templates: Webb's 6^4 = 1296 weight patterns, all enumerated whatever B asks (G <= 5), so the floor is 1/1297
    assert np.allclose(es["p_floor"], 1 / (6 ** 4 + 1)) and (es["p"] >= es["p_floor"] - 1e-15).all()


def test_the_verdict_says_why_stability_has_no_interval_and_what_was_resampled(audit):
    """Before: '[undefined in stability_vs_k]', nothing about templates or BCa, nothing about the p floor."""
    run, printed = audit
    text = " ".join(printed.split())
    assert "undefined in stability_vs_k" not in text
    assert "data-level intervals need at least 32 examples, got N = 16" in text
    assert "the 4 templates, not the 16 prompts, are the independent units" in text
    assert "interval wild_cluster_t: the default for a cluster bootstrap" in text
    assert "With G = 4 templates only 1,296 distinct weight patterns exist (all enumerated" in text
    assert "cannot be narrower than +-t(3 df) x SE" in text
    es = _edges(run)
    at_floor = int((es["p"] <= es["p_floor"] * (1 + 1e-9)).sum())  # counted from the table, independently
    assert at_floor > 0, "the fixture should have edges at the floor"
    bw = 6 ** 4  # the wild weight patterns, every one used
    assert f"{at_floor} of {len(es)} edges sit at the resampling floor 1/(B+1) = 1/{bw + 1:,}" in text
    lone = min(1.0, len(es) / (bw + 1))
    assert f"an edge alone at the floor would get q = {lone:.2g}" in text or f"q = {lone:.3g}" in text
    # every weight pattern 4 templates allow was used: more resamples cannot lower the floor
    assert "More resamples cannot resolve them: 4 templates allow no more weight patterns" in text
    assert "More resamples (bootstrap.n_resamples) resolve them." not in text


def test_the_stability_table_and_claims_check_say_the_same_reason(audit, tmp_path):
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    run, _ = audit
    st = pq.read_table(run / "stability_vs_k.parquet").to_pandas()
    note = st["data_level_note"].iloc[0]
    assert st["jaccard_data_ci_low"].isna().all() and (st["data_level_note"] == note).all()
    assert "at least 32 examples, got N = 16" in note and "cluster" in note  # both reasons, not the first only
    es = _edges(run)
    edge = es[es["no_tail_seen"] & (es["p"] <= es["p_floor"] * (1 + 1e-9))].iloc[0]["name"]
    claims = tmp_path / "claims.yaml"
    claims.write_text(f"claims:\n  - kind: circuit_stability\n    name: stable\n    method: exact\n    k: 6\n"
                      f"    statistic: jaccard_data_ci_low\n    min: 0.5\n"
                      f"  - kind: edge_effect\n    name: needed\n    edge: '{edge}'\n    method: exact\n"
                      f"    sign: nonzero\n    max_q: 0.5\n")
    r = CliRunner().invoke(app, ["check", str(claims), "--run", str(run)])
    out = " ".join(r.output.split())
    assert r.exit_code == 2, r.output  # a claim that cannot be evaluated
    assert " ".join(note.split()) in out and "too few resamples or a degenerate statistic" not in out
    assert "resampling floor 1/(B+1) = 1/1,297" in out  # the 6^4 wild weight patterns, all enumerated


def test_terminal_page_and_claims_agree_on_the_intervals(audit, tmp_path):
    """The stability interval (undefined, with its reason) and the top edges' intervals: the same in all three."""
    from circuitstat.pipelines.claims.checking import check
    from circuitstat.reports.verdicts import verdict, verdict_text

    run, printed = audit
    page = (run / "report.html").read_text(encoding="utf-8")
    v = verdict(run)
    text = verdict_text(v)
    box = re.search(r'<section id="verdict">(.*?)</section>', page, re.S).group(1)
    stab = next(ln for ln in v.lines if ln.label == "stability")
    assert not stab.cis[0].defined and stab.cis[0].text() == "[not computed]"
    body = text.split("\n", 1)[1]  # the audit's header also names the report
    assert " ".join(body.split()) in " ".join(printed.split())  # the audit printed this verdict
    for ln in v.lines:
        for ci in ln.cis:
            assert ci.text() in text and f'<span class="v">{ci.text()}</span>' in box
    es = _edges(run).set_index("name")
    top = next(ln for ln in v.lines if ln.label == "top edges")
    compared = 0
    for ci in top.cis:  # each edge's interval is the column the edge_effect claim reads
        row = es.loc[[n for n in es.index if es.loc[n, "edge"] == dict(ci.key)["edge"]][0]]
        assert ci.text().endswith(f"[{ci.number(row['ci_low'])}, {ci.number(row['ci_high'])}]")
        claims = tmp_path / f"c{int(row['edge'])}.yaml"
        claims.write_text(f"claims:\n  - kind: edge_effect\n    name: e\n    edge: '{row.name}'\n    method: exact\n"
                          "    sign: nonzero\n    max_q: 1.0\n")
        res = check(claims, run).results[0]
        if not row["no_tail_seen"]:  # the verdict marks it, and the claims check refuses it
            assert res.status == "error" and "no_tail_seen = false" in res.reason and ci.reliable is False
            continue
        compared += 1
        assert res.status == "pass", res.reason
        assert math.isclose(res.observed["ci_low"], row["ci_low"]) and math.isclose(res.observed["ci_high"], row["ci_high"])
    assert compared
    for rule in v.rules:
        assert rule in page or rule.replace("–", "&ndash;") in page  # every note is on the page as in the terminal


def test_the_rendered_page_shows_the_reasons(audit):
    """In headless Chromium: the text a reader sees holds each reason."""
    from browser import chrome

    run, _ = audit
    with chrome() as driver:
        driver.get((run / "report.html").resolve().as_uri())
        verdict = driver.find_element("css selector", "#verdict").text
        stability = driver.find_element("css selector", "#stability").text
        forest = driver.find_element("css selector", "#forest").text
    flat = lambda s: " ".join(s.split())  # noqa: E731
    assert "data-level intervals need at least 32 examples, got N = 16" in flat(verdict)
    assert "No data-level interval: data-level intervals need at least 32 examples" in flat(stability)
    for where in (flat(verdict), flat(forest)):
        assert "the 4 templates, not the 16 prompts, are the independent units" in where
        assert "sit at the resampling floor 1/(B+1) = 1/1,297" in where
    assert "units resampled" in forest and "undefined in stability_vs_k" not in flat(verdict)


def test_no_k_reaching_the_bar_is_a_whole_sentence(tmp_path):
    """Before: '... k = 50: no k reaches a selection-aware faithfulness lower bound of 0.8, so the largest k'."""
    from circuitstat.core.rundir import RunDir
    from circuitstat.reports.verdicts import verdict

    ks = [5, 10]
    cols = {"method": ["exact"] * 2, "k": ks, "f_ratio": [0.5, 0.6], "f_selected": [0.5, 0.6],
            "f_selected_ci_low": [0.3, 0.4], "f_selected_ci_high": [0.7, 0.8]}
    with RunDir(tmp_path / "r", spec={"ranking": "absolute"}, seed=0) as run:
        run.write_table("faithfulness_vs_k", fill("faithfulness_vs_k", cols, 2))
        run.write_table("edge_stats", fill("edge_stats", {"method": ["exact"] * 12, "edge": list(range(12)),
                                                          "estimate": list(np.linspace(-1, 1, 12))}, 12))
    line = next(ln for ln in verdict(tmp_path / "r").lines if ln.label == "circuit")
    assert line.text().endswith("so the circuit shown is the largest k of the grid; no circuit of the grid is "
                                "shown to be faithful")


def test_data_level_reasons_are_all_given():
    from circuitstat.stats.stability_data import check_data_level

    why = check_data_level(16, "cluster", 50, 50, n_groups=4)
    assert "at least 32 examples, got N = 16" in why and "at least 32 templates" in why and "G = 4" in why
    assert check_data_level(64, "cluster", 50, 50, n_groups=32) is None  # whole templates are resampled
    assert check_data_level(64, "bootstrap", 50, 50) is None
    why = check_data_level(64, "subsample", 50, 50)
    assert "subsample" in why and "at least 32" not in why
    why = check_data_level(8, "bootstrap", 50, 50)
    assert "got N = 8" in why and "plan" not in why


def test_the_p_floor_is_the_smallest_p_the_bootstrap_gives():
    """Oracle: an effect far from zero on every prompt gets exactly the floor; the t interval has none."""
    from circuitstat.stats import bootstrap_edges
    from circuitstat.stats.intervals.edges import pvalue_floor

    S = np.random.default_rng(0).normal(5.0, 1.0, (40, 3))
    for method in ("percentile", "bca", "studentized_symmetric"):
        res = bootstrap_edges(S, n_resamples=99, seed=0, method=method)
        assert np.allclose(res.pvalue, 1 / 100) and res.params["pvalue_floor"] == pvalue_floor(method, 99) == 0.01
    assert pvalue_floor("t", 99) == 0.0


def test_the_floor_note_names_the_fix_that_applies(tmp_path):
    """Prompts resampled one by one: more resamples or analytic t p-values help; few templates: only more templates."""
    import itertools

    from circuitstat.core.rundir import RunDir
    from circuitstat.reports.verdicts.build import resampling_notes
    from circuitstat.reports.tableset import Tables

    E, b = 40, 999
    p = np.r_[np.full(30, 1 / (b + 1)), np.linspace(0.01, 0.9, E - 30)]
    cols = {"method": ["exact"] * E, "edge": list(range(E)), "estimate": list(np.linspace(1, 2, E)),
            "p": list(p), "q": list(np.minimum(1, p * E / 30)), "n": [64] * E, "n_clusters": [64] * E,
            "ci_method": ["studentized_symmetric"] * E, "ci_method_note": ["the default"] * E,
            "p_floor": [1 / (b + 1)] * E}
    with RunDir(tmp_path / "r", spec={}, seed=0) as run:
        run.write_table("edge_stats", fill("edge_stats", cols, E))
    (note,) = resampling_notes(Tables(tmp_path / "r").get("edge_stats"))
    assert note.startswith("p-values: 30 of 40 edges sit at the resampling floor 1/(B+1) = 1/1,000")
    assert "resolve them; or bootstrap.ci_method: t" in note and "q = 0.04" in note  # 40 / 1000
    # G templates drawn with replacement: C(2G - 1, G) multisets, counted by brute force for the note's number
    assert len(list(itertools.combinations_with_replacement(range(4), 4))) == math.comb(7, 4) == 35
