"""`circuitstat compare` and circuitstat.reports.compare on two synthetic audit runs (tests/report_builders.py).

The oracle of the join is pandas: an outer merge of the two edge_stats tables on (method, name), with the
differences and the overlap of the intervals computed from the merged columns.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from report_builders import EVIL, make_report_run, write_filled

from circuitstat.core.errors import InputError
from circuitstat.pipelines.cli import app
from circuitstat.reports.compare import compare_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """Two runs of the same graph with different numbers, one stability row of B moved far from A's."""
    root = tmp_path_factory.mktemp("compare")
    a = make_report_run(root / "a", seed=0, variance=False)
    b = make_report_run(root / "b", seed=1, variance=False)
    stab = pq.read_table(b / "stability_vs_k.parquet").to_pydict()
    i = next(j for j, (m, k) in enumerate(zip(stab["method"], stab["k"])) if (m, k) == ("exact", 10))
    stab["jaccard_half"][i], stab["jaccard_half_ci_low"][i], stab["jaccard_half_ci_high"][i] = 0.1, 0.05, 0.15
    # J_N (extrapolated) moved at another k: the comparison leads with J_{N/2}, so this row is not flagged
    j = next(j for j, (m, k) in enumerate(zip(stab["method"], stab["k"])) if (m, k) == ("exact", 5))
    stab["jaccard_data"][j], stab["jaccard_data_ci_low"][j], stab["jaccard_data_ci_high"][j] = 0.1, 0.05, 0.15
    write_filled(stab, b / "stability_vs_k.parquet")
    return a, b


def _oracle(a: Path, b: Path) -> pd.DataFrame:
    cols = ["method", "name", "estimate", "ci_low", "ci_high", "estimand"]
    ea = pd.read_parquet(a / "edge_stats.parquet")[cols]
    eb = pd.read_parquet(b / "edge_stats.parquet")[cols]
    m = ea.merge(eb, on=["method", "name"], how="outer", suffixes=("_a", "_b"), indicator=True)
    m["difference"] = m["estimate_b"] - m["estimate_a"]
    both = m["_merge"] == "both"
    apart = (m["ci_high_a"] < m["ci_low_b"]) | (m["ci_high_b"] < m["ci_low_a"])
    m["flagged"] = both & apart
    return m.set_index(["method", "name"])


def test_edges_are_joined_on_method_and_name_with_differences_and_overlap_flags(runs) -> None:
    a, b = runs
    comp = compare_runs(a, b)
    want = _oracle(a, b)
    got = {(r["method"], r["name"]): r for r in comp.edges}
    assert set(got) == set(want.index)  # every edge of either run, once
    for key, w in want.iterrows():
        r = got[key]
        assert r["in_a"] == (w["_merge"] != "right_only") and r["in_b"] == (w["_merge"] != "left_only")
        if w["_merge"] == "both":
            assert r["difference"] == pytest.approx(w["difference"], abs=1e-12)
            assert r["overlap"] is (not w["flagged"])
            assert r["estimand_a"] == w["estimand_a"] and r["estimand_b"] == w["estimand_b"]
        else:
            assert r["difference"] is None and r["overlap"] is None
    assert {(r["method"], r["name"]) for r in comp.flagged_edges} == set(want.index[want["flagged"]])
    assert comp.counts()["edges_flagged"] == int(want["flagged"].sum()) > 0
    # the EVIL edge is the second largest of A but not of B: one edge each run alone has, said in a note
    assert comp.counts()["edges_only_a"] == comp.counts()["edges_only_b"] > 0
    assert any("edge sets differ" in n for n in comp.notes)


def test_stability_and_faithfulness_are_joined_on_method_and_k(runs) -> None:
    a, b = runs
    comp = compare_runs(a, b)
    sa, sb = pd.read_parquet(a / "stability_vs_k.parquet"), pd.read_parquet(b / "stability_vs_k.parquet")
    assert [(r["method"], r["k"]) for r in comp.stability] == sorted(zip(sa["method"], sa["k"]))
    apart = [(r["method"], r["k"]) for r in comp.stability if r["overlap"] is False]
    assert apart == [("exact", 10)]  # the one row moved, and only it
    row = next(r for r in comp.stability if (r["method"], r["k"]) == ("exact", 10))
    want = sb.set_index(["method", "k"]).loc[("exact", 10), "jaccard_half"] - \
        sa.set_index(["method", "k"]).loc[("exact", 10), "jaccard_half"]
    assert row["difference"] == pytest.approx(want) and row["jaccard_mean_a"] is not None
    assert row["jaccard_data_b"] is not None  # J_N travels beside it, labelled as the extrapolation
    assert comp.estimands["stability"].startswith("jaccard_half: J_{N/2}")
    assert "jaccard_data: " in comp.estimands["stability"] and "(extrapolated)" in comp.estimands["stability"]
    assert len(comp.faithfulness) == len(pd.read_parquet(a / "faithfulness_vs_k.parquet"))
    assert all(r["overlap"] is True and r["difference"] == pytest.approx(0) for r in comp.faithfulness)
    assert comp.claims is None and any("no claims verdicts" in n for n in comp.notes)


def test_claims_verdicts_are_compared_when_both_runs_have_them(tmp_path) -> None:
    a = make_report_run(tmp_path / "a", seed=0, evil=False, variance=False)
    b = make_report_run(tmp_path / "b", seed=0, evil=False, variance=False)
    base = {"index": [0, 1], "name": ["stable", "faithful"], "kind": ["circuit_stability", "faithfulness"],
            "observed": ["0.9", "0.8"], "bound": [">= 0.5", ">= 0.5"], "reason": ["", ""], "description": ["", ""]}
    write_filled({**base, "status": ["pass", "pass"]}, a / "claims.parquet")
    write_filled({**base, "status": ["pass", "fail"]}, b / "claims.parquet")
    comp = compare_runs(a, b)
    assert [(r["name"], r["status_a"], r["status_b"], r["changed"]) for r in comp.claims] == [
        ("faithful", "pass", "fail", True), ("stable", "pass", "pass", False)]
    assert comp.counts()["edges_flagged"] == 0 and all(r["difference"] == 0 for r in comp.edges)  # same seed
    assert "CHANGED" in comp.summary()


def test_runs_sharing_no_edge_are_refused_with_exit_2(tmp_path, runs) -> None:
    a, _ = runs
    other = make_report_run(tmp_path / "other", seed=0, variance=False)
    for name in ("edges", "edge_stats"):
        t = pq.read_table(other / f"{name}.parquet").to_pydict()
        t["name"] = ["other:" + n for n in t["name"]]
        write_filled(t, other / f"{name}.parquet")
    with pytest.raises(InputError, match="share no edge"):
        compare_runs(a, other)
    r = CliRunner().invoke(app, ["compare", str(a), str(other)])
    assert r.exit_code == 2 and "share no edge" in r.output and "different models or graphs" in r.output
    smaller = make_report_run(tmp_path / "smaller", n_layers=1, n_heads=2, variance=False)  # another graph, shared edges
    comp = compare_runs(a, smaller)
    assert comp.counts()["edges_both"] > 0 and comp.counts()["edges_only_a"] > comp.counts()["edges_only_b"]


def test_the_command_prints_text_json_and_an_escaped_html_page(tmp_path, runs) -> None:
    a, b = runs
    r = CliRunner().invoke(app, ["compare", str(a), str(b), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == json.loads(json.dumps(compare_runs(a, b).to_dict()))
    page = tmp_path / "cmp.html"
    r = CliRunner().invoke(app, ["compare", str(a), str(b), "--top", "3", "--html", str(page)])
    assert r.exit_code == 0, r.output
    assert "Edges whose intervals do not overlap" in r.output and "NO" in r.output
    text = page.read_text()
    assert EVIL not in text and "&lt;script&gt;" in text and 'id="compare"' in text
    assert text.count("<table") == 4  # edges apart, largest differences, stability, faithfulness (no claims)


def test_stability_falls_back_to_j_n_with_a_note_when_a_run_lacks_j_half(runs, tmp_path) -> None:
    """A run written before J_{N/2} existed is compared on J_N, and a note names it; the text and the page say
    which column they compare (negative control for the lead: here the J_N row moved at k = 5 is the one apart)."""
    import shutil

    from circuitstat.reports.html.compare import comparison_section

    a, b = runs
    old = tmp_path / "old"
    shutil.copytree(b, old)
    stab = pq.read_table(old / "stability_vs_k.parquet").to_pydict()
    for col in ("jaccard_half", "jaccard_half_ci_low", "jaccard_half_ci_high"):
        stab[col] = [float("nan")] * len(stab[col])
    write_filled(stab, old / "stability_vs_k.parquet")
    comp = compare_runs(a, old)
    assert [(r["method"], r["k"]) for r in comp.stability if r["overlap"] is False] == [("exact", 5)]
    assert comp.estimands["stability"].startswith("jaccard_data: ")
    assert any("compared on J_N" in n and str(old) in n for n in comp.notes)
    text = comp.summary()
    assert "Circuit stability against k: jaccard_data [interval]" in text
    assert "Circuit stability against k (jaccard_data, data level)" in comparison_section(comp)
    lead = compare_runs(a, b)
    from circuitstat.core.schema_core import DATA_JACCARD, HALF_JACCARD

    # the heading quotes the compared column's estimand whole (it holds a ';' of its own)
    assert f"Circuit stability against k: jaccard_half [interval] ({HALF_JACCARD}):" in lead.summary()
    assert f"Circuit stability against k: jaccard_data [interval] ({DATA_JACCARD}):" in text
    assert "Circuit stability against k (jaccard_half, data level)" in comparison_section(lead)
    assert not any("compared on J_N" in n for n in lead.notes)
