"""The one-screen verdict (circuitstat.reports.verdicts): which k, which column, which words, and the same lines twice."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from builders import make_run

from circuitstat.core.rundir import RunDir
from circuitstat.core.schema import fill
from circuitstat.reports.verdicts import BAR, choose_k, verdict, verdict_text
from circuitstat.reports.tableset import Tables

KS = (5, 10, 20, 50)


def _run(tmp: Path, name: str = "run", **tables: dict) -> Path:
    """A run directory holding `tables` ({name: columns}), each completed to its schema."""
    with RunDir(tmp / name, spec={"ranking": "absolute"}, seed=0) as run:
        for t, cols in tables.items():
            run.write_table(t, fill(t, cols, len(next(iter(cols.values())))))
    return tmp / name


def _faith(lows: dict[int, float], col: str = "f_selected_ci_low") -> dict:
    ks = sorted(lows)
    other = "f_ci_low" if col == "f_selected_ci_low" else "f_selected_ci_low"
    return {"method": ["exact"] * len(ks), "k": ks, "f_ratio": [0.9] * len(ks), col: [lows[k] for k in ks],
            col.replace("low", "high"): [min(lows[k] + 0.1, 1.0) for k in ks], other: [math.nan] * len(ks),
            "f_selected": [lows[k] + 0.05 for k in ks] if col == "f_selected_ci_low" else [math.nan] * len(ks)}


def _stab(k: int, lo: float, hi: float, chance: float = 0.1) -> dict:
    return {"method": ["exact"], "k": [k], "jaccard_mean": [0.9], "jaccard_data": [(lo + hi) / 2],
            "jaccard_data_ci_low": [lo], "jaccard_data_ci_high": [hi], "jaccard_chance": [chance],
            "jaccard_ci_low": [0.95], "jaccard_ci_high": [0.97]}  # a narrow Monte Carlo interval the verdict must not read


@pytest.mark.parametrize("lows, want, why", [
    ({5: 0.9, 10: 0.85, 20: 0.7, 50: 0.9}, 50, "fixed-sequence test down from k = 50"),  # stops at the first failure
    ({5: 0.85, 10: 0.81, 20: 0.9, 50: 0.95}, 5, "fixed-sequence test down from k = 50"),
    ({5: 0.1, 10: 0.2, 20: 0.5, 50: 0.79}, 50, "no k reaches a selection-aware faithfulness lower bound of 0.8"),
])
def test_k_is_chosen_by_fixed_sequence_testing_down_the_grid(tmp_path, lows, want, why):
    run = _run(tmp_path, stability_vs_k=_stab(5, 0.5, 0.6), faithfulness_vs_k=_faith(lows))
    k, reason = choose_k(Tables(run), "exact")
    assert k == want and why in reason


def test_k_without_selection_aware_intervals_or_without_faithfulness(tmp_path):
    run = _run(tmp_path, "fixed", faithfulness_vs_k=_faith({5: 0.5, 10: 0.82, 20: 0.9, 50: 0.95}, "f_ci_low"))
    k, reason = choose_k(Tables(run), "exact")
    assert k == 10 and "fixed-circuit" in reason
    line = next(ln for ln in verdict(run).lines if ln.label == "faithfulness")
    assert line.cis[0].low == "f_ci_low" and line.cis[0].role == "fixed circuit, selection not included"
    assert "(fixed circuit, selection not included)" in line.text() and "no selection-aware interval" in line.text()
    run = _run(tmp_path, "nofaith", stability_vs_k={**_stab(20, 0.5, 0.6), "k": [20]})
    assert choose_k(Tables(run), "exact") == (20, "faithfulness was not run, so the smallest k of the grid")


@pytest.mark.parametrize("lo, hi, chance, words, tone", [
    (0.82, 0.95, 0.1, "stable", "good"), (0.5, 0.79, 0.1, "unstable", "bad"), (0.7, 0.9, 0.1, "inconclusive", "unsure"),
    (0.85, 0.95, 0.9, "no better than chance", "bad"),  # above the bar but not above its null
])
def test_stability_verdict_reads_the_data_level_interval_against_the_bar(tmp_path, lo, hi, chance, words, tone):
    run = _run(tmp_path, stability_vs_k=_stab(20, lo, hi, chance))
    line = next(ln for ln in verdict(run).lines if ln.label == "stability")
    assert (line.verdict, line.tone) == (words, tone)
    (ci,) = line.cis
    assert (ci.table, ci.low, ci.high, ci.lo, ci.hi) == ("stability_vs_k", "jaccard_data_ci_low", "jaccard_data_ci_high", lo, hi)
    assert "0.950 [0.950" not in line.text()  # the Monte Carlo interval is not shown


def test_stability_verdict_reads_j_half_where_the_run_has_it_and_j_n_only_in_older_runs(tmp_path):
    stab = {**_stab(20, 0.5, 0.6), "jaccard_half": [0.9], "jaccard_half_ci_low": [0.85], "jaccard_half_ci_high": [0.95]}
    line = next(ln for ln in verdict(_run(tmp_path, stability_vs_k=stab)).lines if ln.label == "stability")
    (ci,) = line.cis
    assert (ci.low, ci.lo, ci.hi) == ("jaccard_half_ci_low", 0.85, 0.95) and line.verdict == "stable"
    assert "two independent halves" in line.text() and "J_N/2" in line.text()
    # negative control: the same row without the J_{N/2} columns is read as J_N (an older run), here unstable
    old = next(ln for ln in verdict(_run(tmp_path, "old", stability_vs_k=_stab(20, 0.5, 0.6))).lines
               if ln.label == "stability")
    assert old.cis[0].low == "jaccard_data_ci_low" and old.verdict == "unstable"


@pytest.mark.parametrize("lo, hi, words", [(0.81, 0.9, "faithful"), (0.4, 0.79, "not faithful"), (0.7, 0.9, "inconclusive")])
def test_faithfulness_verdict_reads_the_selection_aware_interval(tmp_path, lo, hi, words):
    f = _faith({20: lo})
    f["f_selected_ci_high"] = [hi]
    f["f_ci_low"], f["f_ci_high"] = [0.95], [0.99]  # a fixed-circuit interval that would say "faithful"
    run = _run(tmp_path, faithfulness_vs_k=f)
    line = next(ln for ln in verdict(run).lines if ln.label == "faithfulness")
    assert line.verdict == words and line.cis[0].low == "f_selected_ci_low" and not line.cis[0].role


def test_approximation_and_edges_and_heads_lines(tmp_path):
    run = make_run(tmp_path / "audit")  # tests/builders.py: six edges, k 5/10/20, heads over 5 seeds
    v = verdict(run)
    lines = {ln.label: ln for ln in v.lines}
    assert v.k == 10  # selection-aware lower bounds 0.40, 0.81, 0.88 at k = 5, 10, 20
    assert lines["approximation"].verdict == "eap: ranks edges like exact"  # Spearman 0.9
    assert "top-10 overlap 0.600" in lines["approximation"].text()  # the row of the chosen k
    edges = lines["top edges"]
    assert edges.verdict == "4 of 6 significant" and [c.low for c in edges.cis] == ["ci_low"] * 3
    assert edges.cis[2].reliable is False and "0.800 [0.600, 1.00]!" in edges.text()  # a1.h5->logits: few prompts
    heads = lines["heads"]
    assert heads.cis[0].low == "excess_ci_low" and "a1.h5 0.750 [0.650, 0.830]" in heads.text()
    assert heads.verdict == "1 of 16 heads above their null by more than 0.1"  # 16 excess intervals above 0, one above 0.1
    assert [r for r in v.rules if r.startswith("Edges: Benjamini–Hochberg q ≤ 0.05 over all 6 edges")]


def test_claims_lines_come_from_the_claims_table_a_check_writes(tmp_path):
    from circuitstat.pipelines.claims import evaluate_claims, parse_claims, write_claims_table

    run = make_run(tmp_path / "audit")
    claims = parse_claims({"claims": [
        {"kind": "circuit_stability", "method": "exact", "k": 10, "statistic": "jaccard_data_ci_low", "min": 0.5},
        {"kind": "edge_effect", "name": "needed", "edge": "input->a0.h0<q>", "method": "exact", "sign": "negative",
         "max_q": 0.05},
        {"kind": "edge_effect", "edge": "a1.h5->logits", "method": "exact", "sign": "positive", "max_q": 0.05}]})
    write_claims_table(evaluate_claims(claims, run), run)
    lines = [ln for ln in verdict(run).lines if ln.label == "claim"]
    assert [(ln.verdict, ln.tone, ln.section) for ln in lines] == [
        ("holds", "good", "stability"), ("fails", "bad", "forest"), ("cannot be evaluated", "unsure", "forest")]
    assert lines[1].text().startswith("needed: input->a0.h0<q> (exact): estimate 2 [1.8, 2.2] is not negative")
    assert "no_tail_seen = false" in lines[2].text()
    assert "claims check" not in " ".join(a.name for a in verdict(run).not_run)
    # on the page each reason is quoted from claims.parquet (its numbers are what the check read), and checked so
    from interval_check import check_intervals

    from circuitstat.reports.html import render_report

    page = render_report(run).read_text()
    assert page.count('<span class="quote" data-table="claims"') == 3
    check_intervals(run, page)
    with pytest.raises(AssertionError):
        check_intervals(run, page.replace("is not negative", "is negative", 1))


def test_not_in_this_run_names_what_is_missing_and_how_to_run_it(tmp_path):
    audit = make_run(tmp_path / "audit", faithfulness=False, heads=False)
    names = [a.name for a in verdict(audit).not_run]
    assert names == ["faithfulness", "head stability across seeds", "variance study", "calibration of the intervals",
                     "token contributions and attention sinks", "claims check"]
    bare = _run(tmp_path, "tokens", sink_heads={"layer": [0], "head": [0], "sink_rate": [0.3]})
    v = verdict(bare)
    assert v.lines == () and [a.id for a in v.not_run] == ["audit", "variance", "calibration", "claims"]


def test_terminal_text_is_one_screen_and_never_breaks_an_interval(tmp_path):
    v = verdict(make_run(tmp_path / "audit"))
    text = verdict_text(v, Path("runs/x/report.html"))
    lines = text.splitlines()
    assert lines[0] == "Verdict (exact, 95% intervals; sections of runs/x/report.html):"
    assert max(len(x) for x in lines) <= 110 and len(lines) <= 40
    for ln in v.lines:
        for ci in ln.cis:
            assert ci.text() in text  # on one line, whatever the wrapping
        assert f"[#{ln.section}]" in " ".join(text.split())
    assert f"bar {BAR}" in text and "fixed-sequence" in text
    # a verdict never runs into its text: two spaces after it, or a line of its own
    for ln in v.lines:
        row = next(x for x in lines if x.startswith(f"  {ln.label:<14}{ln.verdict}"))
        rest = row[2 + 14 + len(ln.verdict):]
        assert rest == "" or rest.startswith("  "), row


def _heads_run(tmp: Path, spec: dict) -> Path:
    """Eight heads as the demo has them: layer 0's excess intervals just above 0 (+0.02 to +0.04), layer 1's
    induction head well above, one layer-1 head at its null."""
    lows = [0.012, 0.021, 0.018, 0.03, 0.165, 0.0, -0.02, 0.11]
    est = [lo + 0.02 for lo in lows]
    heads = {"layer": [0] * 4 + [1] * 4, "head": [0, 1, 2, 3] * 2, "stability": [0.9] * 8, "null_mean": [0.86] * 8,
             "excess": est, "excess_ci_low": lows, "excess_ci_high": [e + 0.03 for e in est], "n_refits": [5] * 8}
    with RunDir(tmp / "heads", spec=spec, seed=0) as run:
        run.write_table("heads", fill("heads", heads, 8))
    return tmp / "heads"


def test_heads_count_only_excess_above_the_minimum_effect_and_say_the_rule(tmp_path):
    from circuitstat.core.errors import InputError

    run = _heads_run(tmp_path, {"ranking": "absolute"})
    line = next(ln for ln in verdict(run).lines if ln.label == "heads")
    assert line.verdict == "2 of 8 heads above their null by more than 0.1"  # the old rule (low > 0) counted 6
    assert "not adjusted over the 8 heads" in line.text() and "minimum excess 0.1" in line.text()
    assert any("minimum excess 0.1" in r and "not adjusted" in r for r in verdict(run).rules)
    assert next(ln for ln in verdict(run, min_excess=0.0).lines if ln.label == "heads").verdict.startswith("6 of 8")
    # the spec's key is read when no override is given
    run2 = _heads_run(tmp_path / "b", {"heads": {"min_excess": 0.15}})
    assert next(ln for ln in verdict(run2).lines if ln.label == "heads").verdict.startswith("1 of 8")
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(InputError, match=r"min_excess must lie in \[0, 1\]"):
            verdict(run, min_excess=bad)


def test_min_excess_is_a_bounded_spec_key_and_cli_option(tmp_path):
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app
    from circuitstat.pipelines.spec import parse_spec
    from circuitstat.core.errors import InputError

    base = {"model": "random:gpt2", "task": {"name": "induction"}}
    assert parse_spec({**base, "heads": {"min_excess": 0.2}}, "<t>").heads.min_excess == 0.2
    assert parse_spec(base, "<t>").heads.min_excess == 0.1
    with pytest.raises(InputError, match="heads.min_excess"):
        parse_spec({**base, "heads": {"min_excess": 2}}, "<t>")
    run = _heads_run(tmp_path, {})
    res = CliRunner().invoke(app, ["report", str(run), "--min-excess", "0"])
    assert res.exit_code == 0, res.output
    assert "6 of 8 heads above their null by more than 0" in (run / "report.html").read_text()
    assert CliRunner().invoke(app, ["report", str(run), "--min-excess", "1.5"]).exit_code == 2
