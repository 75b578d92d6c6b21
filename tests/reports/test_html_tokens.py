"""HTML report of a `circuitstat tokens` run: sinks with the fit, drops, differences, heatmaps, the cross-seed tables.

Every interval on these pages is read back from its table too (tests/interval_check.py).
"""

from __future__ import annotations

import html
import re
import subprocess
from pathlib import Path

import pytest
from interval_check import check_intervals
from page_tools import dump_dom_cmd, parse, section_html, table_rows

from circuitstat.reports.html import render_report
from circuitstat.reports.html.svg import Scale, fmt, fmt_p


def _tiny_model(seed: int):
    import torch

    from circuitstat.circuits.model import CircuitModel, ModelConfig

    cfg = ModelConfig(n_layers=2, n_heads=2, d_model=16, d_head=8, d_mlp=32, vocab_size=50, n_ctx=32, act="relu")
    m = CircuitModel(cfg).init_weights(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(8.0) if p.ndim > 1 else None  # sharper attention than the 0.02 init: some heads sink
    return m.eval()


def _tokens_estimator():
    from circuitstat.pipelines.runs.tokens.run import TokenContributions

    return TokenContributions(n=12, task_options={"seq_len": 5}, ks=(1, 2), n_random=3, n_resamples=999,
                              seed=3)


@pytest.fixture(scope="module")
def tokens_rendered(tmp_path_factory):
    run = tmp_path_factory.mktemp("tokens") / "run"
    _tokens_estimator().run(_tiny_model(0), run, command=["test"])
    return run, render_report(run).read_text(encoding="utf-8")


def _read(run: Path, name: str) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(run / f"{name}.parquet").to_pylist()


def _ci(row: dict, est: str, prefix: str = "ci") -> str:
    """The estimate and its interval as printed: the bounds only where both are defined."""
    lo, hi = row[prefix + "_low"], row[prefix + "_high"]
    bounds = f" [{fmt(lo)}, {fmt(hi)}]" if lo is not None and hi is not None and lo == lo and hi == hi else ""
    return fmt(row[est]) + bounds


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_tokens_section_shows_the_sinks_with_the_fit(tokens_rendered):
    run, page = tokens_rendered
    assert parse(page).h2 == ["Verdict", "Token contributions and attention sinks"]  # no audit: no audit sections
    assert '<a href="#tokens">' in page and "circuit audit" in section_html(page, "verdict")
    sec = _text(section_html(page, "tokens"))
    rows = {r[0]: r for r in table_rows(page, "tokens")}
    for h in _read(run, "sink_heads"):  # every head with its rate, interval and norm, as the table has them
        r = rows[h["node"]]
        assert r[1].startswith(_ci(h, "sink_rate")) and r[2] == _ci(h, "output_norm", "norm_ci"), (r, h)
        assert r[1].endswith("! few prompts") == (not h["interval_reliable"])
        assert f"{h['node']}: sink rate {_ci(h, 'sink_rate')}" in sec
    fit = {r["term"]: r for r in _read(run, "sink_fit")}
    c = fit["curvature"]
    assert f"= {_ci(c, 'estimate')} ({c['interval']}): {c['verdict']}" in sec
    assert f"Spearman ρ = {_ci(fit['spearman'], 'estimate')}" in sec
    assert c["multiplicity"] in sec and "least-squares quadratic" in sec
    check_intervals(run, page)


def test_tokens_fit_curve_is_the_tables_quadratic(tokens_rendered):
    """The dashed curve passes through b0 + b1 s + b2 s^2 at the smallest and largest sink rate (pixel oracle)."""
    run, page = tokens_rendered
    fit = {r["term"]: r["estimate"] for r in _read(run, "sink_fit")}
    rates = [h["sink_rate"] for h in _read(run, "sink_heads")]
    svg = re.search(r'<svg[^>]*aria-label="sink rate vs output norm per head".*?</svg>', page, re.S).group(0)
    path = re.search(r'<path d="M([^"]+)"[^>]*stroke-dasharray="6,3"><title>least-squares quadratic', svg).group(1)
    pts = [tuple(map(float, xy.split(","))) for xy in path.split("L")]
    assert len(pts) == 60
    # the plot's scales: recover them from two x ticks and two y ticks drawn on the axes
    xt = [(float(a), float(b)) for a, b in re.findall(r'<line x1="([\d.]+)" x2="[\d.]+" y1="[\d.]+" y2="[\d.]+" stroke="#333"/>'
                                                      r'<text x="[\d.]+" y="[\d.]+" text-anchor="middle" font-size="\d+">([-\d.]+)<', svg)]
    yt = [(float(b), float(a)) for a, b in re.findall(r'<line x1="[\d.]+" x2="[\d.]+" y1="([\d.]+)" y2="[\d.]+" stroke="#333"/>'
                                                      r'<text x="[\d.]+" y="[\d.]+" text-anchor="end" font-size="\d+">([-\d.]+)<', svg)]
    sx = Scale(xt[0][1], xt[-1][1], xt[0][0], xt[-1][0])
    sy = Scale(yt[0][0], yt[-1][0], yt[0][1], yt[-1][1])
    for s, (px, py) in ((min(rates), pts[0]), (max(rates), pts[-1])):
        want = fit["intercept"] + fit["slope"] * s + fit["curvature"] * s * s
        assert px == pytest.approx(sx(s), abs=0.2) and py == pytest.approx(sy(want), abs=0.2)


def test_tokens_section_shows_drops_differences_and_heatmaps(tokens_rendered):
    run, page = tokens_rendered
    rows = [[html.unescape(c) for c in r] for r in table_rows(page, "tokens")]
    for d in _read(run, "token_importance"):
        cells = [d["measure"], str(d["k"]), _ci(d, "mean_drop") + ("" if d["interval_reliable"] else " ! few prompts"), "12"]
        assert cells in [r[:4] for r in rows], cells
    diffs = _read(run, "token_importance_diffs")
    shown = [r for r in rows if len(r) == 7 and r[6] in ("inconclusive", "verdict") or len(r) == 7 and ">" in r[6] + "<"]
    assert len(shown) == len(diffs) + 1  # the header row, then one row per pair and k
    for d in diffs:
        assert [d["measure_a"], d["measure_b"], str(d["k"]), _ci(d, "difference")] == \
            next(r[:3] + [r[3].replace(" ! few prompts", "")] for r in shown
                 if r[:3] == [d["measure_a"], d["measure_b"], str(d["k"])])
        assert [fmt_p(d["pvalue"]), fmt_p(d["pvalue_holm"]), d["verdict"]] in [r[4:7] for r in shown]
    sec = _text(section_html(page, "tokens"))
    assert diffs[0]["multiplicity"] in sec and f"{sum(d['verdict'] != 'inconclusive' for d in diffs)} of {len(diffs)} decided" in sec
    # heatmaps: three prompts, one cell per measure and real token, the read-out outlined
    weights = _read(run, "token_weights")
    for n in range(3):
        svg = re.search(rf'aria-label="token weights of prompt {n}".*?</svg>', page, re.S).group(0)
        toks = [w for w in weights if w["prompt"] == n]
        assert svg.count("<rect") == 4 * len(toks) and svg.count('stroke="#000"') == 4
        w = toks[-1]
        assert f"contribution, position {w['position']} (token {w['token']}): {fmt(w['contribution'])}" in svg
    assert 'aria-label="token weights of prompt 3"' not in page


def test_a_cross_seed_tokens_run_shows_each_model_and_the_seed_tables(tmp_path):
    run = tmp_path / "seeds"
    _tokens_estimator().cross_seed([_tiny_model(0), _tiny_model(1)], run, command=["test"])
    page = render_report(run).read_text(encoding="utf-8")
    sec = html.unescape(section_html(page, "tokens"))
    assert sec.count("<h3>model-") == 2 and "<h3>Across seeds</h3>" in sec
    assert sec.count("Attention sinks: sink rate vs output norm") == 2
    assert sec.count("Token weights per measure") == 1  # the seeds share the prompts: one model's heatmaps
    rows = [[html.unescape(c) for c in r] for r in table_rows(page, "tokens")]
    for r in _read(run, "sink_stability"):
        where = "model" if r["layer"] < 0 else str(r["layer"])
        assert [where, r["item"], _ci(r, "value")] in [x[:3] for x in rows]
    for r in _read(run, "token_stability"):
        assert [r["measure"], str(r["k"]), _ci(r, "jaccard"), fmt(r["chance"]), _ci(r, "excess", "excess_ci")] in \
            [x[:5] for x in rows]
    assert "Sink heads across seeds, matched by attention pattern" in sec and "first (BOS) column dropped" in sec
    matched = _read(run, "sink_matching")
    assert len(matched) == 3 * 3  # layers 0, 1 and all, three items
    for r in matched:
        where = "all" if r["layer"] < 0 else str(r["layer"])
        assert [where, r["item"], _ci(r, "value"), fmt(r["null"]), _ci(r, "excess", "excess_ci"), r["verdict"],
                str(r["n_pairs"]), str(r["n_pairs_undefined"])] in rows
    text = _text(section_html(page, "tokens"))
    for i in range(2):
        for h in _read(run / f"model-{i}", "sink_heads"):
            assert f"{h['node']}: sink rate {fmt(h['sink_rate'])}" in text
    parse(page)
    shown = check_intervals(run, page)  # model-<i>/ tables are named with their part of the run
    assert {s.attrs["data-table"] for s in shown} >= {"model-0/sink_heads", "model-1/sink_heads", "sink_matching"}


def test_missing_token_tables_give_notes_inside_the_tokens_section(tmp_path):
    run = tmp_path / "run"
    _tokens_estimator().run(_tiny_model(0), run, command=["test"])
    (run / "sink_fit.parquet").unlink()
    (run / "token_importance_diffs.parquet").unlink()
    (run / "manifest.json").unlink()  # tables made by hand: read unchecked, as --trust-unrecorded does
    page = render_report(run, trust_unrecorded=True).read_text(encoding="utf-8")
    sec = section_html(page, "tokens")
    assert "token_importance_diffs.parquet is not in this run directory" in sec
    assert "sink_fit.parquet is missing, so no fit is drawn" in sec and "least-squares quadratic" not in sec
    assert "Token-importance faithfulness" in sec and "Attention sinks: sink rate vs output norm" in sec


def test_tokens_page_renders_in_headless_chromium(tokens_rendered, tmp_path):
    run, _ = tokens_rendered
    cmd = dump_dom_cmd(tmp_path) + [(run / "report.html").resolve().as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and 'data-report-js="ok"' in r.stdout, r.stderr[-3000:]
    assert "<h2>Token contributions and attention sinks</h2>" in r.stdout
    bad = [ln for ln in r.stderr.splitlines() if "Uncaught" in ln or "Content Security Policy" in ln or "Refused to" in ln]
    assert not bad, "\n".join(bad)
