"""HTML report: self-contained, every section with its numbers, notes for missing tables, escaping, size, a real browser."""

from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from reports.html import SECTIONS, render_report
from reports.html_svg import Scale, fmt, fmt_p
from reports.rundir import RunDir
from reports.schema import fill, schema_for
from reports.tables import write_table

EVIL = '<script>alert("pwned")</script>&\'"'
KNOWN = {"estimate": 1.23456, "ci_low": 0.987654, "ci_high": 1.48765, "q": 0.000123}


# ----- a synthetic run directory ----------------------------------------------------------------
def graph_edges(n_layers: int, n_heads: int) -> dict[str, list]:
    """Edge table in the EAP-IG/MIB naming (as circuits.graph.ComponentGraph.edge_table builds it)."""
    senders, s_layer = ["input"], [-1]
    for layer in range(n_layers):
        senders += [f"a{layer}.h{h}" for h in range(n_heads)] + [f"m{layer}"]
        s_layer += [layer] * (n_heads + 1)
    cols: dict[str, list] = {k: [] for k in ("index", "name", "sender", "receiver", "sender_layer", "receiver_layer", "kind")}

    def add(receiver: str, r_layer: int, kind: str, n_up: int) -> None:
        for u in range(n_up):
            cols["index"].append(len(cols["index"]))
            cols["name"].append(f"{senders[u]}->{receiver}")
            cols["sender"].append(senders[u])
            cols["receiver"].append(receiver)
            cols["sender_layer"].append(s_layer[u])
            cols["receiver_layer"].append(r_layer)
            cols["kind"].append(kind)

    for layer in range(n_layers):
        up = 1 + layer * (n_heads + 1)
        for kind in "qkv":
            for h in range(n_heads):
                add(f"a{layer}.h{h}<{kind}>", layer, kind, up)
        add(f"m{layer}", layer, "mlp", up + n_heads)
    add("logits", n_layers, "logits", len(senders))
    return cols


def _write_filled(table: dict, path: Path) -> None:
    """Write a fixture table, completing registered tables to their schema (reports/schema.py), so
    the fixture carries every column the audit writes and cannot drift from it."""
    n = len(next(iter(table.values())))
    write_table(fill(path.stem, table, n) if schema_for(path.stem) else table, path)


def make_run(root: Path, n_layers: int = 2, n_heads: int = 4, methods=("exact", "eap"), evil: bool = True, seed: int = 0,
             variance_edges: int = 30) -> Path:
    rng = np.random.default_rng(seed)
    run = root / "run"
    with RunDir(run, spec={"model": "zoo:attn2l", "task": {"name": "induction"}, "methods": list(methods), "n": 64, "seed": 7}, seed=7):
        pass
    edges = graph_edges(n_layers, n_heads)
    E = len(edges["index"])
    names = list(edges["name"])
    effect = np.clip(0.4 * rng.standard_normal(E), -1, 1) * np.exp(-np.arange(E) / 20.0)[rng.permutation(E)]
    top0, second = (int(i) for i in np.argsort(-np.abs(effect))[:2])
    effect[top0] = KNOWN["estimate"] * 3  # the largest edge overall
    effect[second] = KNOWN["estimate"]  # the second largest
    if evil:
        names[second] = EVIL
    edges["name"] = names
    _write_filled(edges, run / "edges.parquet")

    stats = {k: [] for k in ("method", "edge", "name", "estimate", "se", "ci_low", "ci_high", "p", "q", "n")}
    for j, m in enumerate(methods):
        est = effect * (1 + 0.1 * j) + rng.standard_normal(E) * 0.01 * j
        se = 0.05 + 0.02 * rng.random(E)
        lo, hi = est - 1.96 * se, est + 1.96 * se
        p = np.clip(np.exp(-np.abs(est / se)), 1e-12, 1)
        q = np.minimum(p * E / (np.argsort(np.argsort(p)) + 1), 1)
        if m == "exact":
            est[second], lo[second], hi[second], q[second] = KNOWN["estimate"], KNOWN["ci_low"], KNOWN["ci_high"], KNOWN["q"]
        stats["method"] += [m] * E
        stats["edge"] += list(range(E))
        stats["name"] += names
        for k, v in (("estimate", est), ("se", se), ("ci_low", lo), ("ci_high", hi), ("p", p), ("q", q)):
            stats[k] += v.tolist()
        stats["n"] += [64] * E
    _write_filled(stats, run / "edge_stats.parquet")

    ks = [5, 10, 20, 50, 100]
    order = np.argsort(-np.abs(effect))
    inc = {k: [] for k in ("method", "k", "edge", "name", "frequency")}
    stab = {k: [] for k in ("method", "k", "jaccard_mean", "jaccard_sd", "jaccard_ci_low", "jaccard_ci_high", "jaccard_chance",
                            "jaccard_corrected", "phi", "phi_ci_low", "phi_ci_high", "consensus_size", "consensus_jaccard_mean")}
    faith = {k: [] for k in ("method", "k", "edge_fraction", "f_ratio", "f_mean", "f_ci_low", "f_ci_high", "cpr", "cmd")}
    for j, m in enumerate(methods):
        for k in ks:
            cand = order[: min(2 * k, E)]
            freq = np.clip(1.0 - np.arange(cand.size) / (1.5 * k) + rng.normal(0, 0.03, cand.size), 0, 1)
            inc["method"] += [m] * cand.size
            inc["k"] += [k] * cand.size
            inc["edge"] += cand.tolist()
            inc["name"] += [names[i] for i in cand]
            inc["frequency"] += freq.tolist()
            jm = 0.95 - 0.004 * k - 0.2 * j
            stab["method"].append(m)
            stab["k"].append(k)
            for c, v in (("jaccard_mean", jm), ("jaccard_sd", 0.05), ("jaccard_ci_low", jm - 0.04), ("jaccard_ci_high", jm + 0.03),
                         ("jaccard_chance", k / E), ("jaccard_corrected", (jm - k / E) / (1 - k / E)), ("phi", jm - 0.02),
                         ("phi_ci_low", jm - 0.06), ("phi_ci_high", jm + 0.01), ("consensus_jaccard_mean", jm + 0.02)):
                stab[c].append(v)
            stab["consensus_size"].append(int((freq >= 0.5).sum()))
            f = 1 - np.exp(-k / 20) - 0.05 * j
            faith["method"].append(m)
            faith["k"].append(k)
            for c, v in (("edge_fraction", k / E), ("f_ratio", f + 0.01), ("f_mean", f), ("f_ci_low", f - 0.08), ("f_ci_high", f + 0.07),
                         ("cpr", 0.71 - 0.1 * j), ("cmd", 0.29 + 0.1 * j)):
                faith[c].append(v)
    _write_filled(inc, run / "inclusion.parquet")
    _write_filled(stab, run / "stability_vs_k.parquet")
    _write_filled(faith, run / "faithfulness_vs_k.parquet")

    approx = {k: [] for k in ("method", "edge", "name", "exact_mean", "approx_mean", "bias", "error_sd", "slope", "intercept", "r2")}
    summ = {k: [] for k in ("method", "spearman", "kendall", "slope", "r2", "bias_mean", "top_k_overlap", "k")}
    for m in [m for m in methods if m != "exact"]:
        a = 0.8 * effect + rng.normal(0, 0.05, E)
        approx["method"] += [m] * E
        approx["edge"] += list(range(E))
        approx["name"] += names
        approx["exact_mean"] += effect.tolist()
        approx["approx_mean"] += a.tolist()
        approx["bias"] += (a - effect).tolist()
        approx["error_sd"] += (0.1 + 0.05 * rng.random(E)).tolist()
        approx["slope"] += (0.8 + 0.1 * rng.standard_normal(E)).tolist()
        approx["intercept"] += (0.01 * rng.standard_normal(E)).tolist()
        approx["r2"] += rng.random(E).tolist()
        for c, v in (("method", m), ("spearman", 0.912), ("kendall", 0.7654), ("slope", 0.8123), ("r2", 0.9345), ("bias_mean", -0.01),
                     ("top_k_overlap", 0.85), ("k", 20)):
            summ[c].append(v)
    if approx["method"]:
        _write_filled(approx, run / "approximation.parquet")
        _write_filled(summ, run / "approximation_summary.parquet")

    heads = {k: [] for k in ("layer", "head", "stability", "ci_low", "ci_high", "null_mean", "distinctness", "importance", "match", "pairs")}
    for layer in range(n_layers):
        for h in range(n_heads):
            s = float(np.clip(0.5 + 0.4 * rng.random(), 0, 1))
            heads["layer"].append(layer)
            heads["head"].append(h)
            for c, v in (("stability", s), ("ci_low", s - 0.1), ("ci_high", min(s + 0.08, 1)), ("null_mean", 0.3), ("distinctness", 0.4 + 0.1 * h),
                         ("importance", float("nan") if h == 0 else 0.1 * h)):
                heads[c].append(v)
            heads["match"].append("max")
            heads["pairs"].append("anchor")
    _write_filled(heads, run / "heads.parquet")
    _write_filled({"layer": list(range(n_layers)), "stability": [0.61, 0.84][:n_layers] + [0.7] * max(0, n_layers - 2),
                 "ci_low": [0.5] * n_layers, "ci_high": [0.9] * n_layers, "null_mean": [0.32] * n_layers}, run / "layers.parquet")
    res = {k: [] for k in ("layer", "hook", "kind", "cka", "ci_low", "ci_high")}
    for layer in range(n_layers):
        for kind in ("linear", "rbf", "debiased"):
            v = 0.9 - 0.1 * layer - (0.05 if kind == "debiased" else 0)
            for c, x in (("layer", layer), ("hook", "pre-attention"), ("kind", kind), ("cka", v), ("ci_low", v - 0.05), ("ci_high", v + 0.04)):
                res[c].append(x)
    _write_filled(res, run / "residual.parquet")

    sources = ["example", "counterfactual", "estimator", "seed", "residual"]
    vc = {k: [] for k in ("edge", "name", "source", "variance", "share")}
    sel = order[:variance_edges]
    sh = rng.dirichlet(np.ones(len(sources)), size=sel.size)
    vc["edge"] = np.repeat(sel, len(sources))
    vc["name"] = [names[e] for e in sel for _ in sources]
    vc["source"] = sources * sel.size
    vc["variance"] = (sh * 0.5).ravel()
    vc["share"] = sh.ravel()
    _write_filled(vc, run / "variance_components.parquet")
    _write_filled({"factor": ["dataset", "counterfactual", "estimator", "aggregation", "seed"],
                 "jaccard_to_reference": [0.91, 0.72, 0.55, 0.88, 0.643], "ci_low": [0.85, 0.6, 0.41, 0.8, 0.5432],
                 "ci_high": [0.95, 0.8, 0.66, 0.93, 0.75], "bar": [0.8] * 5,
                 "meets_bar": [True, False, False, True, False],
                 "verdict": ["met", "inconclusive", "not met", "met", "inconclusive"], "k": [20] * 5},
                run / "variance_summary.parquet")
    _write_filled({"item": ["mean Jaccard at k=20", "faithfulness lower CI"], "value": [0.872, 0.7], "ci_low": [0.83, 0.65],
                 "ci_high": [0.9, 0.75], "verdict": ["pass", "fail"]}, run / "summary.parquet")
    return run


class _Parse(HTMLParser):
    """Collect tags, attributes, headings and text; fail on badly nested markup."""

    VOID = {"meta", "br", "img", "input", "link", "hr", "col", "source", "wbr", "area", "base", "embed", "param", "track"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[tuple[str, dict]] = []
        self.h2: list[str] = []
        self.text: list[str] = []
        self._in_h2 = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "h2":
            self._in_h2, self._buf = True, ""
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()
        if tag == "h2":
            self._in_h2 = False
            self.h2.append(self._buf)

    def handle_data(self, data):
        self.text.append(data)
        if self._in_h2:
            self._buf += data


def parse(page: str) -> _Parse:
    p = _Parse()
    p.feed(page)
    p.close()
    assert not p.stack, f"unclosed tags {p.stack}"
    return p


def table_rows(page: str, section: str) -> list[list[str]]:
    """Return the text cells of every table row in section `section`."""
    m = re.search(rf'<section id="{section}">(.*?)</section>', page, re.S)
    assert m, section
    rows = []
    for tr in re.findall(r"<tr>(.*?)</tr>", m.group(1), re.S):
        rows.append([re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", tr, re.S)])
    return rows


def section_html(page: str, sid: str) -> str:
    return re.search(rf'<section id="{sid}">(.*?)</section>', page, re.S).group(1)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("html"))
    path = render_report(run)
    return run, path, path.read_text(encoding="utf-8")


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
    assert [h for h in p.h2] == [h for _, h in SECTIONS]


def test_header_shows_the_run(rendered):
    run, _, page = rendered
    header = re.search(r"<header>(.*?)</header>", page, re.S).group(1)
    for text in ("zoo:attn2l", "induction", "exact, eap", ">64<", ">7<", RunDir.read_manifest(run)["run_id"], "0.1.0"):
        assert text in header, text


def test_forest_table_has_the_known_edge_with_its_ci_and_q(rendered):
    _, _, page = rendered
    rows = table_rows(page, "forest")
    header, body = rows[0], rows[1:]
    assert header[:8] == ["edge", "method", "estimate", "SE", "CI low", "CI high", "p", "q (BH)"]
    exact = [r for r in body if r[1] == "exact"]
    assert len(exact) == 20 and len([r for r in body if r[1] == "eap"]) == 20
    # the planted edge is the second largest of 'exact': its CI and q, formatted, in the second row
    assert exact[1][2:6][0] == "1.23" and exact[1][4] == "0.988" and exact[1][5] == "1.49"
    assert exact[1][7] == "1.2e-04"
    # ordered by |estimate| of the reference method, largest first
    est = [abs(float(r[2])) for r in exact]
    assert est == sorted(est, reverse=True)
    assert "showing 20 of" in section_html(page, "forest")
    # the plot draws a CI bar and a q label for every (edge, method)
    forest = section_html(page, "forest")
    assert forest.count("q=") == 40


def test_each_section_shows_its_numbers(rendered):
    _, _, page = rendered
    # summary: verdicts coloured
    summ = section_html(page, "summary")
    assert '<td class="pass">pass</td>' in summ and '<td class="fail">fail</td>' in summ and "0.872" in summ
    # graph: largest k with J >= 0.8 is k = 20 for exact (0.95-0.004k >= 0.8 -> k <= 37.5); eap never reaches it -> smallest k
    graph = section_html(page, "graph")
    assert "at k = 20 (the largest k whose mean Jaccard is ≥ 0.8)" in graph
    assert "at k = 5 (no k reaches mean Jaccard 0.8, so the smallest k)" in graph
    assert graph.count('class="edge"') > 10 and "inclusion frequency" in graph
    # stability: chance line, 0.8 bar, CI band, table with phi
    stab = section_html(page, "stability")
    assert "bar: 0.8" in stab and "<polygon" in stab and "chance" in stab
    rows = table_rows(page, "stability")
    assert rows[0][:3] == ["method", "k", "mean J"]
    assert ["exact", "20", "0.870", "0.0500", "0.830", "0.900"] == rows[3][:6]
    # approximation: caption with slope/R2 from the summary, y=x line
    appr = section_html(page, "approximation")
    assert "Slope 0.812, R² 0.934" in appr and "y = x" in appr and "0.765" in appr
    # faithfulness: CPR/CMD per method in the caption, band
    faith = section_html(page, "faithfulness")
    assert "exact: CPR 0.710, CMD 0.290" in faith and "eap: CPR 0.610, CMD 0.390" in faith and "<polygon" in faith
    # heads: heatmap cells with CI tooltips, layers with null, residual CKA
    heads = section_html(page, "heads")
    assert re.search(r"<title>L1\.H3 head stability [0-9.]+\nstability [0-9.]+ \[[0-9.]+, [0-9.]+\], null 0\.3", heads)
    assert "Gap (max − min) = 0.230" in heads and "debiased" in heads and "<h3>Residual stream</h3>" in heads
    # variance: stacked bars with all sources, per-factor table
    var = section_html(page, "variance")
    for s in ("example", "counterfactual", "estimator", "seed", "residual"):
        assert f">{s}<" in var
    frows = table_rows(page, "variance")
    assert ["seed", "0.643", "0.543", "0.750", "no", "20", "inconclusive"] in [r[:7] for r in frows]
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
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;&amp;&#x27;&quot;" in page
    # and it is really shown (forest is sorted by |estimate|: the planted edge is second)
    assert [r for r in table_rows(page, "forest") if r[1] == "exact"][1][0] == '&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;&amp;&#x27;&quot;'


def test_hostile_method_and_label_names_are_escaped(tmp_path):
    bad = '<img src=x onerror=alert(1)>'
    run = make_run(tmp_path, methods=("exact", bad), evil=False)
    write_table({"layer": [0, 0], "hook": [bad, "post"], "kind": ["linear", bad], "cka": [0.5, 0.6], "ci_low": [0.4, 0.5],
                 "ci_high": [0.6, 0.7]}, run / "residual.parquet")
    write_table({"factor": [bad], "jaccard_to_reference": [0.5], "ci_low": [0.4], "ci_high": [0.6], "bar": [0.8], "meets_bar": [False],
                 "verdict": [bad], "estimand": [bad], "k": [5]},
                run / "variance_summary.parquet")
    page = render_report(run).read_text()
    assert bad not in page
    p = parse(page)
    assert "img" not in {t for t, _ in p.tags}
    assert all(not any(k.startswith("on") for k in a) for _, a in p.tags)
    assert page.count("&lt;img src=x onerror=alert(1)&gt;") >= 10  # shown, escaped, in legends, tables, captions


def test_missing_tables_give_notes_not_errors(tmp_path):
    run = make_run(tmp_path, methods=("exact",), evil=False)
    for name in ("stability_vs_k", "approximation", "approximation_summary", "faithfulness_vs_k", "heads", "variance_components", "summary"):
        (run / f"{name}.parquet").unlink(missing_ok=True)
    (run / "manifest.json").unlink()
    page = render_report(run, tmp_path / "out.html").read_text()
    assert parse(page).h2 == [h for _, h in SECTIONS]
    for name in ("stability_vs_k", "approximation", "faithfulness_vs_k", "heads", "variance_components", "summary"):
        assert f"{name}.parquet is not in this run directory" in page, name
    assert "manifest.json is missing" in page
    # graph falls back to the smallest k without stability, layers and forest still render
    assert "stability_vs_k.parquet is missing, so the smallest k" in page
    assert "Layers</h3>" in page and len(table_rows(page, "forest")) == 21
    # a table lacking a column is a note, too
    write_table({"layer": [0, 1]}, run / "layers.parquet")
    page = render_report(run).read_text()
    assert "layers.parquet lacks column(s) stability" in page
    # without inclusion and edges the graph shows the top edges by |estimate|, placed from their names
    (run / "inclusion.parquet").unlink()
    (run / "edges.parquet").unlink()
    page = render_report(run).read_text()
    graph = section_html(page, "graph")
    assert "top 20 edges by |estimate| (inclusion.parquet is missing" in graph and "edges.parquet is missing" in graph
    assert graph.count('class="edge"') == 20


def test_empty_or_missing_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        render_report(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="no manifest.json and none of the report tables"):
        render_report(tmp_path / "empty")
    # manifest only: every section a note
    with RunDir(tmp_path / "bare", spec={"model": "m"}, seed=1):
        pass
    page = render_report(tmp_path / "bare").read_text()
    assert page.count('<p class="note">') >= len(SECTIONS)


def test_nan_values_render_as_dashes(tmp_path):
    run = make_run(tmp_path, methods=("exact",), evil=False)
    write_table({"layer": [0, 1], "stability": [float("nan"), 0.5], "ci_low": [float("nan"), 0.4], "ci_high": [float("nan"), 0.6],
                 "null_mean": [0.3, float("nan")]}, run / "layers.parquet")
    page = render_report(run).read_text()
    assert "NaN" not in page and "nan" not in re.sub(r"<[^>]+>", "", page).split()
    rows = [r for r in table_rows(page, "heads") if r[:2] == ["0", "—"]]
    assert rows


def test_gpt2_small_sized_run_stays_small_and_fast(tmp_path):
    import time

    run = make_run(tmp_path, n_layers=12, n_heads=12, methods=("exact", "eap", "eap-ig-inputs"), variance_edges=32491)
    n_edges = len(graph_edges(12, 12)["index"])
    assert n_edges == 32491
    t0 = time.perf_counter()
    path = render_report(run)
    elapsed = time.perf_counter() - t0
    size = path.stat().st_size
    assert size < 2_000_000, size
    assert elapsed < 15, elapsed
    page = path.read_text()
    assert "of 32,491" in page and "as a density" in page and "showing 20 of 32,491 edges (largest |estimate|)" in page
    parse(page)


# ----- a real browser ---------------------------------------------------------------------------
def _dump_dom_cmd(tmp_path: Path) -> list[str]:
    """Headless Chromium's --dump-dom command (the page's URI goes last); fails naming the fix when
    Chromium is missing, unless CIRCUITSTAT_ALLOW_NO_BROWSER=1 opts out of the browser tests."""
    from browser import HEADLESS_FLAGS, chromium, require

    require("chromium")
    return [chromium(), *HEADLESS_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
            "--v=0", "--dump-dom"]


def test_renders_in_headless_chromium_without_console_errors(rendered, tmp_path):
    _, path, _ = rendered
    cmd = _dump_dom_cmd(tmp_path) + [path.resolve().as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    dom = r.stdout
    for _, heading in SECTIONS:
        assert f"<h2>{heading.replace('&', '&amp;')}</h2>" in dom, heading
    assert 'data-report-js="ok"' in dom, "the inline script did not run to its end"
    bad = [ln for ln in r.stderr.splitlines() if "Uncaught" in ln or "CONSOLE" in ln or "Content Security Policy" in ln or "Refused to" in ln]
    assert not bad, "\n".join(bad)
    assert dom.count("<svg") >= 10

    # the sorting script works: click 'estimate' in the forest table (ascending), then 'edge' twice (descending)
    probe = path.read_text().replace("</body>", """<script>
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
    forest_order = [row[0] for row in table_rows(path.read_text(), "forest")[1:]]
    assert len(by_edge) == 40 and by_edge != forest_order
    assert all(by_edge.count(e) == 2 and by_edge[by_edge.index(e) + 1] == e for e in by_edge)  # both methods' rows together
    assert not [ln for ln in r.stderr.splitlines() if "Uncaught" in ln]


def test_rendering_needs_no_torch_circuits_or_stats(rendered, tmp_path):
    run, _, _ = rendered
    code = (
        "import sys; from reports.html import render_report; render_report(sys.argv[1], sys.argv[2]); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'circuits', 'stats', 'pipelines', 'matplotlib')); "
        "assert not bad, bad"
    )
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code, str(run), str(tmp_path / "r.html")], capture_output=True, text=True, cwd=root, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "r.html").read_text() == (run / "report.html").read_text()  # deterministic


# ----- token contributions and attention sinks (a `circuitstat tokens` run) ------------------------
def _tiny_model(seed: int):
    import torch

    from circuits.model import CircuitModel, ModelConfig

    cfg = ModelConfig(n_layers=2, n_heads=2, d_model=16, d_head=8, d_mlp=32, vocab_size=50, n_ctx=32, act="relu")
    m = CircuitModel(cfg).init_weights(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(8.0) if p.ndim > 1 else None  # sharper attention than the 0.02 init: some heads sink
    return m.eval()


def _tokens_estimator():
    from pipelines.contributions import TokenContributions

    return TokenContributions(n=12, task_options={"seq_len": 5}, ks=(1, 2), n_random=3, n_resamples=999,
                              random_state=3)


@pytest.fixture(scope="module")
def tokens_rendered(tmp_path_factory):
    run = tmp_path_factory.mktemp("tokens") / "run"
    _tokens_estimator().run(_tiny_model(0), run, command=["test"])
    return run, render_report(run).read_text(encoding="utf-8")


def _read(run: Path, name: str) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(run / f"{name}.parquet").to_pylist()


def test_tokens_section_shows_the_sinks_with_the_fit(tokens_rendered):
    import html

    run, page = tokens_rendered
    p = parse(page)
    assert p.h2 == [h for _, h in SECTIONS] + ["Token contributions and attention sinks"]
    assert '<a href="#tokens">' in page
    sec = html.unescape(section_html(page, "tokens"))
    rows = {r[0]: r for r in table_rows(page, "tokens")}
    for h in _read(run, "sink_heads"):  # every head with its rate, interval and norm, as the table has them
        r = rows[h["node"]]
        assert r[1:7] == [fmt(h[c]) for c in ("sink_rate", "ci_low", "ci_high", "output_norm", "norm_ci_low",
                                              "norm_ci_high")], (r, h)
        assert f"{h['node']}: sink rate {fmt(h['sink_rate'])} [{fmt(h['ci_low'])}, {fmt(h['ci_high'])}]" in sec
    fit = {r["term"]: r for r in _read(run, "sink_fit")}
    c = fit["curvature"]
    assert f"= {fmt(c['estimate'])} [{fmt(c['ci_low'])}, {fmt(c['ci_high'])}] ({c['interval']}): {c['verdict']}" in sec
    s = fit["spearman"]
    assert f"Spearman ρ = {fmt(s['estimate'])} [{fmt(s['ci_low'])}, {fmt(s['ci_high'])}]" in sec
    assert c["multiplicity"] in sec and "least-squares quadratic" in sec


def test_tokens_fit_curve_is_the_tables_quadratic(tokens_rendered):
    """The dashed curve passes through b0 + b1 s + b2 s^2 at the smallest and largest sink rate (pixel oracle)."""
    run, page = tokens_rendered
    from reports.html_svg import Scale

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
    import html

    run, page = tokens_rendered
    rows = [r for r in table_rows(page, "tokens")]
    drops = _read(run, "token_importance")
    for d in drops:
        assert [d["measure"], str(d["k"]), fmt(d["mean_drop"]), fmt(d["ci_low"]), fmt(d["ci_high"]), "12"] in [r[:6] for r in rows]
    diffs = _read(run, "token_importance_diffs")
    shown = [[html.unescape(c) for c in r] for r in rows if len(r) == 10]
    assert len(shown) == len(diffs) + 1  # the header row, then one row per pair and k
    for d in diffs:
        assert [d["measure_a"], d["measure_b"], str(d["k"]), fmt(d["difference"]), fmt(d["ci_low"]), fmt(d["ci_high"]),
                fmt_p(d["pvalue"]), fmt_p(d["pvalue_holm"]), d["verdict"]] in [r[:9] for r in shown]
    sec = html.unescape(section_html(page, "tokens"))
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
    import html

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
        assert [where, r["item"], fmt(r["value"]), fmt(r["ci_low"]), fmt(r["ci_high"])] in [x[:5] for x in rows]
    for r in _read(run, "token_stability"):
        assert [r["measure"], str(r["k"]), fmt(r["jaccard"]), fmt(r["ci_low"]), fmt(r["ci_high"]), fmt(r["chance"])] in \
            [x[:6] for x in rows]
    assert "Sink heads across seeds, matched by attention pattern" in sec and "first (BOS) column dropped" in sec
    matched = _read(run, "sink_matching")
    assert len(matched) == 3 * 3  # layers 0, 1 and all, three items
    for r in matched:
        where = "all" if r["layer"] < 0 else str(r["layer"])
        assert [where, r["item"], fmt(r["value"]), fmt(r["ci_low"]), fmt(r["ci_high"]), fmt(r["null"]), fmt(r["excess"]),
                fmt(r["excess_ci_low"]), fmt(r["excess_ci_high"]), r["verdict"], str(r["n_pairs"]),
                str(r["n_pairs_undefined"])] in rows
    for i in range(2):
        for h in _read(run / f"model-{i}", "sink_heads"):
            assert f"{h['node']}: sink rate {fmt(h['sink_rate'])}" in sec
    parse(page)


def test_an_audit_run_has_no_tokens_section_and_missing_token_tables_give_notes(rendered, tmp_path):
    _, _, page = rendered
    assert 'id="tokens"' not in page and 'href="#tokens"' not in page
    # a tokens run that lost a table: that part is a note, the others render
    run = tmp_path / "run"
    _tokens_estimator().run(_tiny_model(0), run, command=["test"])
    (run / "sink_fit.parquet").unlink()
    (run / "token_importance_diffs.parquet").unlink()
    (run / "manifest.json").unlink()
    page = render_report(run).read_text(encoding="utf-8")
    sec = section_html(page, "tokens")
    assert "token_importance_diffs.parquet is not in this run directory" in sec
    assert "sink_fit.parquet is missing, so no fit is drawn" in sec and "least-squares quadratic" not in sec
    assert "Token-importance faithfulness" in sec and "Attention sinks: sink rate vs output norm" in sec


def test_tokens_page_renders_in_headless_chromium(tokens_rendered, tmp_path):
    run, _ = tokens_rendered
    cmd = _dump_dom_cmd(tmp_path) + [(run / "report.html").resolve().as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and 'data-report-js="ok"' in r.stdout, r.stderr[-3000:]
    assert "<h2>Token contributions and attention sinks</h2>" in r.stdout
    bad = [ln for ln in r.stderr.splitlines() if "Uncaught" in ln or "Content Security Policy" in ln or "Refused to" in ln]
    assert not bad, "\n".join(bad)
