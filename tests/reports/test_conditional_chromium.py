"""A mask-learned method's reported circuit interval (f_conditional_ci_*: the mask fitted on half the prompts, its
Fieller interval on the other half; issue 47) as headless Chromium shows the report page: the faithfulness table's
'reported circuit' column and the first screen's verdict print the numbers the table holds, the same text the
terminal's verdict printed at the end of the audit. Negative control: a page rendered from a table whose estimate
moved shows the moved number, so the comparison reads the page and would catch a page that disagreed."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from builders import small_mask_audit_spec
from page_tools import dump_dom_cmd, table_rows
from report_builders import write_recorded
from typer.testing import CliRunner

from circuitstat.reports.ci import Ci

# the verdict's method alone (the terminal prints the primary method's lines)
SPEC = small_mask_audit_spec(["edge-pruning"], edge_pruning={"steps": 4, "n_refits": 3, "lr": 0.3})
COLUMN = "reported circuit f (mask fit on half, Fieller on the other half) [95% CI]"


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    from circuitstat.pipelines.cli import app

    d = tmp_path_factory.mktemp("cond")
    (d / "spec.yaml").write_text(yaml.safe_dump(SPEC))
    r = CliRunner().invoke(app, ["audit", str(d / "spec.yaml"), "--out", str(d / "run")])
    assert r.exit_code == 0, r.output
    return d / "run", " ".join(r.output.split())


def _conditional(run: Path) -> dict[int, str]:
    """{k: the reported circuit's interval as printed (Ci.text)} from the run's faithfulness_vs_k table."""
    rows = pq.read_table(run / "faithfulness_vs_k.parquet").to_pylist()
    return {r["k"]: Ci.of("faithfulness_vs_k", r, ("method", "k"), "f_conditional_ci", est="f_conditional",
                          decimals=3).text() for r in rows if r["method"] == "edge-pruning"}


def _dom(page: Path, tmp: Path) -> str:
    r = subprocess.run(dump_dom_cmd(tmp) + [page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'data-report-js="ok"' in r.stdout, "the inline script did not run to its end"
    return r.stdout


def _shown(dom: str) -> list[tuple[int, str]]:
    """(k, text) of every f_conditional interval the browser shows, read by the columns it names (data-lo)."""
    out = []
    for m in re.finditer(r'<span class="ci"([^>]*)><span class="v">([^<]*)</span>', dom):
        attrs = dict(re.findall(r'(data-[a-z]+)="([^"]*)"', m.group(1)))
        if attrs.get("data-lo") == "f_conditional_ci_low":
            out.append((json.loads(html.unescape(attrs["data-row"]))["k"], html.unescape(m.group(2))))
    return out


def _table_column(dom: str) -> dict[int, str]:
    """{k: the cell of the faithfulness table's reported-circuit column} as the browser shows it."""
    rows = table_rows(dom, "faithfulness")
    col = [html.unescape(h) for h in rows[0]].index(COLUMN)
    k_col = rows[0].index("k")
    return {int(r[k_col]): html.unescape(r[col]) for r in rows[1:] if r[0] == "edge-pruning"}


def test_chromium_shows_the_tables_conditional_interval_as_the_terminal_did(audited, tmp_path):
    from circuitstat.reports.verdicts import choose_k
    from circuitstat.reports.tableset import Tables

    run, terminal = audited
    want = _conditional(run)
    assert sorted(want) == [3, 6] and all("[" in t for t in want.values())
    dom = _dom(run / "report.html", tmp_path)
    shown = _shown(dom)
    assert {k for k, _ in shown} == {3, 6}
    assert all(text == want[k] for k, text in shown), (shown, want)
    assert all(cell.startswith(want[k]) for k, cell in _table_column(dom).items())  # then its label, if any
    k, _ = choose_k(Tables(run), "edge-pruning")
    assert sum(1 for kk, _ in shown if kk == k) >= 2  # the table's cell and the first screen's verdict
    assert f"reported top-{k} circuit (fitted on half of" in terminal and want[k] in terminal


def test_a_page_from_a_moved_table_shows_the_moved_number(audited, tmp_path):
    from circuitstat.reports.html import render_report

    run, terminal = audited
    moved = tmp_path / "moved"
    shutil.copytree(run, moved)
    d = pq.read_table(moved / "faithfulness_vs_k.parquet").to_pydict()
    d["f_conditional"] = [v + 0.25 if m == "edge-pruning" else v for v, m in zip(d["f_conditional"], d["method"])]
    write_recorded(d, moved / "faithfulness_vs_k.parquet")  # recorded in the manifest, as a run's own table
    page = render_report(moved, moved / "report.html")
    dom = _dom(page, tmp_path)
    before, after = _conditional(run), _conditional(moved)
    assert all(before[k] != after[k] for k in before)
    assert all(text == after[k] and text != before[k] for k, text in _shown(dom))
    assert not any(after[k] in terminal for k in after)  # the terminal printed the original numbers

