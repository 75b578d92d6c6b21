"""HTML report: self-contained, sections with their numbers, only the analyses a run has, escaping, size, a real browser.

The synthetic run is tests/report_builders.py's (the demo's tables plus a variance study's); every interval
the page prints is also read back from its table by tests/interval_check.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from interval_check import check_intervals
from page_tools import dump_dom_cmd, parse, section_html, table_rows
from report_builders import EVIL, KNOWN, graph_edges, make_report_run, write_recorded

from circuitstat.reports.html import SECTIONS, render_report
from circuitstat.reports.html.svg import Scale, colour_legend, fmt, fmt_p
from circuitstat.core.rundir import RunDir
from circuitstat.core.tables import write_table

ESCAPED_EVIL = "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;&amp;&#x27;&quot;"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    run = make_report_run(tmp_path_factory.mktemp("html"))
    path = render_report(run)
    return run, path, path.read_text(encoding="utf-8")


def shown_headings(page: str) -> list[str]:
    return parse(page).h2


# ----- tests ------------------------------------------------------------------------------------
def test_formatting_rounds_sensibly():
    assert fmt(0.987654) == "0.988"
    assert fmt(12.345) == "12.3"
    assert fmt(1234.5) == "1234"  # no spurious decimals, no 1.23e+03
    assert fmt(-0.0004567) == "-4.57e-04"
    assert fmt(float("nan")) == "—" and fmt(None) == "—"
    assert fmt(np.int64(32491)) == "32491"
    assert fmt(-1e-12 * 0) == "0"
    assert fmt_p(0.000123) == "1.2e-04" and fmt_p(0.04567) == "0.046"
    s = Scale(5, 500, 0, 100, log=True)
    assert s(5) == pytest.approx(0) and s(50) == pytest.approx(50) and s(500) == pytest.approx(100)
    assert s.ticks() == [5, 10, 20, 50, 100, 200, 500]
    assert Scale(0, 1, 0, 1).ticks() == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    # a colour bar whose ends come from the data reads rounded, not 0.287981
    bar = colour_legend(0, 0, ("#000000", "#ffffff"), 0.287981, 0.934417, "x")
    assert re.findall(r">([-\d.]+)</text>", bar) == ["0.29", "0.61", "0.93"]


def test_report_is_one_self_contained_well_formed_file(rendered):
    run, path, page = rendered
    assert path == run / "report.html" and path.exists()
    p = parse(page)
    for tag, attrs in p.tags:
        for a in ("src", "href", "xlink:href", "action", "data"):
            v = attrs.get(a)
            assert v is None or v.startswith("#") or v.startswith("data:"), f"<{tag} {a}={v!r}> loads something"
        assert not (tag == "script" and "src" in attrs)
        assert tag not in ("link", "iframe", "img", "object", "embed")
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert page.count("<script>") == 1
    # this run has the audit, heads and a variance study, not calibration, tokens, a published circuit, circuit tests or a claims check
    assert p.h2 == [h for s, h in SECTIONS if s not in ("calibration", "tokens", "groundtruth", "verified", "published", "circuit_tests")]
    check_intervals(run, page)


def test_header_shows_the_run(rendered):
    run, _, page = rendered
    header = re.search(r"<header>(.*?)</header>", page, re.S).group(1)
    facts = re.search(r'<p class="facts">(.*?)</p>', header).group(1)
    for text in ("zoo:attn2l/seed-0 and 2 more seeds", "induction", "exact, eap", "</b> 64<", "</b> 7<"):
        assert text in facts, text
    for text in (RunDir.read_manifest(run)["run_id"], "0.1.0", "edge_stats (220)"):  # folded under "run details"
        assert text in re.search(r"<details>(.*?)</details>", header).group(1), text


def test_forest_table_has_the_known_edge_with_its_ci_flag_and_q(rendered):
    _, _, page = rendered
    rows = table_rows(page, "forest")
    header, body = rows[0], rows[1:]
    assert header == ["edge", "method", "estimate [95% CI]", "SE", "p", "q (BH)", "n", "units resampled",
                      "median [95% CI]", "20%-trimmed mean [95% CI]"]
    exact = [r for r in body if r[1] == "exact"]
    assert len(exact) == 20 and len([r for r in body if r[1] == "eap"]) == 20
    # the planted edge is the second largest of 'exact': its interval and q, formatted, in the second row
    assert exact[1][2] == f"{KNOWN['estimate']:.3g} [{fmt(KNOWN['ci_low'])}, {fmt(KNOWN['ci_high'])}]" and exact[1][5] == "1.2e-04"
    # the third rests on a few prompts: flagged in the table, hollow and marked in the plot
    assert exact[2][2].endswith("! few prompts") and "! few prompts" not in exact[0][2]
    forest = section_html(page, "forest")
    assert forest.count("q=") == 40 and forest.count("! few prompts</text>") == 2
    est = [abs(float(r[2].split()[0])) for r in exact]  # ordered by |estimate| of the reference method
    assert est == sorted(est, reverse=True)
    assert "showing 20 of" in forest


def test_graph_draws_the_verdicts_circuit_with_intervals_in_place(rendered):
    run, _, page = rendered
    graph = section_html(page, "graph")
    # selection-aware lower bounds 0.11, 0.28, 0.52, 0.81, 0.88 at k = 5..100: fixed sequence down stops at k = 20
    assert graph.count("k = 50: the smallest k whose selection-aware faithfulness lower bound") == 2
    svg = re.search(r'<svg[^>]*aria-label="circuit graph, method exact".*?</svg>', graph, re.S).group(0)
    assert svg.count('<path class="edge"') == 50 and 'viewBox="0 0 1180' in svg
    labels = re.findall(r'<g class="label"[^>]*>.*?<text[^>]*>([^<]+)</text>', svg)
    assert 8 <= len(labels) <= 12 and labels[0] == "1: 3.70 [3.60, 3.80]" or labels[0].startswith("1: ")
    assert any(lab.endswith("!") for lab in labels)  # the flagged edge is marked in place
    rows = table_rows(page, "graph")
    assert rows[0] == ["rank", "edge", "estimate [95% CI]", "q (BH)", "inclusion"] and rows[2][1] == ESCAPED_EVIL


def test_each_section_shows_its_numbers(rendered):
    _, _, page = rendered
    stab = section_html(page, "stability")
    assert "bar 0.8" in stab and "<polygon" in stab and "chance" in stab and "Monte Carlo spread" in stab
    rows = table_rows(page, "stability")
    assert rows[0][:7] == ["method", "k", "J_N/2, halves [95% CI]", "J_N (extrapolated, bracketed) [95% CI]", "chance",
                           "Jaccard to population [95% CI]", "Φ, data level [95% CI]"]
    assert rows[3][:7] == ["exact", "20", "0.830 [0.770, 0.890]", "0.860 [0.750, 0.910]", "0.182",
                           "0.870 [0.770, 0.920]", "0.840 [0.720, 0.890]"]
    appr = section_html(page, "approximation")
    assert "Slope 0.812, R² 0.934" in appr and "y = x" in appr and "0.765" in appr
    faith = section_html(page, "faithfulness")
    assert "exact: CPR 0.710, CMD 0.290" in faith and "eap: CPR 0.610, CMD 0.390" in faith and "<polygon" in faith
    frow = [r for r in table_rows(page, "faithfulness") if r[:2] == ["exact", "50"]][0]
    assert frow[3] == "0.888 [0.808, 0.958]" and frow[4] == "0.928 [0.878, 0.968] fixed circuit, selection not included"
    heads = section_html(page, "heads")
    assert re.search(r"<title>a1\.h3 excess over the shuffled null [-0-9.]+\nexcess [-0-9.]+ \[[-0-9.]+, [-0-9.]+\]", heads)
    hrows = [r for r in table_rows(page, "heads") if r and r[0].startswith("a")]
    excess = [float(r[1].split()[0]) for r in hrows[:8]]
    assert excess == sorted(excess, reverse=True)  # ranked by excess over the null
    assert "Gap (max − min) = 0.230" in heads and "debiased" in heads and "! biased kind" in heads
    assert "Head-stability summary: all 2 items" in heads
    var = section_html(page, "variance")
    for s in ("example", "counterfactual", "estimator", "seed", "residual"):
        assert f">{s}<" in var
    assert ["seed", "0.643 [0.543, 0.750]", "no", "20", "inconclusive"] in [r[:5] for r in table_rows(page, "variance")]
    assert "showing 20 of 30 edges" in var


def test_every_plot_has_axis_ticks_and_labels(rendered):
    _, _, page = rendered
    for sid in ("stability", "forest", "approximation", "faithfulness", "variance"):
        html = section_html(page, sid)
        for svg in re.findall(r"<svg.*?</svg>", html, re.S):
            assert 'class="axes"' in svg, sid
            assert svg.count('text-anchor="end"') >= 2 and 'rotate(-90)' in svg or "estimate" in svg or "share" in svg or "Jaccard" in svg


def test_hostile_names_are_escaped(rendered):
    _, _, page = rendered
    assert EVIL not in page and "<script>alert" not in page
    assert ESCAPED_EVIL in page
    assert [r for r in table_rows(page, "forest") if r[1] == "exact"][1][0] == ESCAPED_EVIL


def test_hostile_method_and_label_names_are_escaped(tmp_path):
    bad = '<img src=x onerror=alert(1)>'
    run = make_report_run(tmp_path, methods=("exact", bad), evil=False)
    write_recorded({"layer": [0, 0], "hook": [bad, "post"], "kind": ["linear", bad], "cka": [0.5, 0.6], "ci_low": [0.4, 0.5],
                 "ci_high": [0.6, 0.7]}, run / "residual.parquet")
    write_recorded({"factor": [bad], "jaccard_to_reference": [0.5], "ci_low": [0.4], "ci_high": [0.6], "bar": [0.8], "meets_bar": [False],
                 "verdict": [bad], "estimand": [bad], "k": [5]},
                run / "variance_summary.parquet")
    page = render_report(run).read_text()
    assert bad not in page
    p = parse(page)
    assert "img" not in {t for t, _ in p.tags}
    assert all(not any(k.startswith("on") for k in a) for _, a in p.tags)
    assert page.count("&lt;img src=x onerror=alert(1)&gt;") >= 10  # shown, escaped, in legends, tables, captions


def test_sections_a_run_lacks_are_not_shown_and_a_broken_table_is_a_note(tmp_path):
    run = make_report_run(tmp_path, methods=("exact",), evil=False, variance=False)
    for name in ("approximation", "approximation_summary", "faithfulness_vs_k", "heads", "layers", "residual", "summary"):
        (run / f"{name}.parquet").unlink(missing_ok=True)  # a run with one method has no approximation
    (run / "manifest.json").unlink()  # tables made by hand: read with trust_unrecorded, unchecked
    page = render_report(run, tmp_path / "out.html", trust_unrecorded=True).read_text()
    assert shown_headings(page) == [h for s, h in SECTIONS if s in ("verdict", "graph", "forest", "stability")]
    assert "omitted" not in page and "manifest.json is missing" in page
    assert "read unchecked (--trust-unrecorded" in page and "edge_stats.parquet" in page  # named on the page too
    notrun = re.search(r'<p class="notrun">(.*?)</p>', page).group(1)
    for text in ("faithfulness", "approximation error", "head stability across seeds", "variance study"):
        assert text in notrun, text
    # without faithfulness the verdict and the graph take the smallest k of the grid
    assert section_html(page, "graph").count("k = 5: faithfulness was not run, so the smallest k of the grid") == 1
    # a table that is there but lacks a column is a note in its section
    write_table({"layer": [0, 1]}, run / "layers.parquet")
    page = render_report(run, trust_unrecorded=True).read_text()
    assert "layers.parquet lacks column(s) stability" in section_html(page, "heads")
    # without inclusion and edges the circuit is drawn grey from the edge names
    (run / "inclusion.parquet").unlink()
    (run / "edges.parquet").unlink()
    graph = section_html(render_report(run, trust_unrecorded=True).read_text(), "graph")
    assert "edges.parquet is missing" in graph and graph.count('<path class="edge"') == 5 and "#888888" in graph


def test_empty_or_missing_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        render_report(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="no manifest.json and none of the report tables"):
        render_report(tmp_path / "empty")
    with RunDir(tmp_path / "bare", spec={"model": "m"}, seed=1):  # manifest only: the verdict, and how to run the rest
        pass
    page = render_report(tmp_path / "bare").read_text()
    assert shown_headings(page) == ["Verdict"] and "circuitstat audit SPEC --out DIR" in page


def test_nan_values_render_as_dashes_or_say_why(tmp_path):
    run = make_report_run(tmp_path, methods=("exact",), evil=False, variance=False)
    write_recorded({"layer": [0, 1], "stability": [float("nan"), 0.5], "ci_low": [float("nan"), 0.4], "ci_high": [float("nan"), 0.6],
                 "null_mean": [0.3, float("nan")], "stability_all_anchors": [0.4, 0.5], "refit_ci_low": [float("nan")] * 2,
                 "refit_ci_high": [float("nan")] * 2, "n_refits": [2, 2]}, run / "layers.parquet")
    page = render_report(run).read_text()
    assert "NaN" not in page and "nan" not in re.sub(r"<[^>]+>", "", page).split()
    rows = [r for r in table_rows(page, "heads") if r[:1] == ["0"]]
    assert rows and rows[0][2] == "0.400 [needs ≥ 3 seeds]"  # two seeds: no interval over seeds, said so
    check_intervals(run, page)


def test_gpt2_small_sized_run_stays_small(tmp_path):
    run = make_report_run(tmp_path, n_layers=12, n_heads=12, methods=("exact", "eap", "eap-ig-inputs"), variance_edges=32491)
    assert len(graph_edges(12, 12)["index"]) == 32491
    path = render_report(run)
    size = path.stat().st_size
    assert size < 2_000_000, size
    page = path.read_text()
    assert "of 32,491" in page and "as a density" in page and "showing 20 of 32,491 edges (largest |estimate|)" in page
    parse(page)


def test_renders_in_headless_chromium_without_console_errors(rendered, tmp_path):
    _, path, page = rendered
    cmd = dump_dom_cmd(tmp_path) + [path.resolve().as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    dom = r.stdout
    for heading in shown_headings(page):
        assert f"<h2>{heading.replace('&', '&amp;')}</h2>" in dom, heading
    assert 'data-report-js="ok"' in dom, "the inline script did not run to its end"
    bad = [ln for ln in r.stderr.splitlines() if "Uncaught" in ln or "CONSOLE" in ln or "Content Security Policy" in ln or "Refused to" in ln]
    assert not bad, "\n".join(bad)
    assert dom.count("<svg") >= 10

    # the sorting script works: click 'estimate' in the forest table (ascending, by the lower end), then 'edge' twice
    probe = page.replace("</body>", """<script>
      var t = document.querySelector('#forest table.sortable'), th = t.tHead.rows[0].cells;
      function col(i) { return Array.prototype.map.call(t.tBodies[0].rows, function (r) { return r.cells[i].getAttribute('data-v') || r.cells[i].textContent; }).join('|'); }
      th[2].click(); document.body.setAttribute('data-by-estimate', col(2));
      th[0].click(); th[0].click(); document.body.setAttribute('data-by-edge', col(0));
    </script></body>""")
    (tmp_path / "probe.html").write_text(probe)
    r = subprocess.run(cmd[:-1] + [(tmp_path / "probe.html").as_uri()], capture_output=True, text=True, timeout=120)
    by_est = [float(v) for v in re.search(r'data-by-estimate="([^"]*)"', r.stdout).group(1).split("|")]
    assert by_est == sorted(by_est) and len(by_est) == 40
    by_edge = re.search(r'data-by-edge="([^"]*)"', r.stdout).group(1).split("|")
    forest_order = [row[0] for row in table_rows(page, "forest")[1:]]
    assert len(by_edge) == 40 and by_edge != forest_order
    assert all(by_edge.count(e) == 2 and by_edge[by_edge.index(e) + 1] == e for e in by_edge)  # both methods' rows together
    assert not [ln for ln in r.stderr.splitlines() if "Uncaught" in ln]


def test_rendering_needs_no_torch_circuits_or_stats(rendered, tmp_path):
    run, _, _ = rendered
    code = (
        "import sys; from circuitstat.reports.html import render_report; render_report(sys.argv[1], sys.argv[2]); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'circuits', 'stats', 'pipelines', 'matplotlib')); "
        "assert not bad, bad"
    )
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code, str(run), str(tmp_path / "r.html")], capture_output=True, text=True, cwd=root, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "r.html").read_text() == (run / "report.html").read_text()  # deterministic


def test_expert_nodes_sit_on_their_layers_mlp_row_in_expert_order():
    """Experts as nodes (m{L}.e{J}, m{L}.shared) are drawn on layer L's MLP row beside the block's input m{L}, in
    expert order with the shared expert last, not on a row of unknown nodes at layer 0."""
    from circuitstat.reports.html.graph_draw import node_key, row_label

    names = ["m1.shared", "m1.e10", "m1", "m1.e2", "m0.e1", "a1.h0"]
    keys = {n: node_key(n, {}) for n in names}
    assert {row_label(keys[n][:2]) for n in ("m1", "m1.e2", "m1.e10", "m1.shared")} == {"L1 mlp"}
    assert row_label(keys["m0.e1"][:2]) == "L0 mlp"
    assert [n for n in sorted(names, key=lambda n: keys[n]) if n.startswith("m1")] == ["m1", "m1.e2", "m1.e10",
                                                                                          "m1.shared"]
