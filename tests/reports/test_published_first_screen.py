"""A check-circuit report leads with what was asked (issue 47, item 6): the published circuit's faithfulness and its
edges' support are the verdict's first rows, on the first screen of headless Chromium, with the same words in
the terminal verdict and the claim's reason."""

from __future__ import annotations

import html
import json
import re
import subprocess

import pytest
import yaml
from page_tools import dump_dom_cmd, section_html
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app
from circuitstat.reports.html import render_report
from circuitstat.reports.verdicts import verdict, verdict_text

MODEL = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3"
PROBE = """<script>
(function () {
  var rows = document.querySelectorAll('#verdict table.verdicts tr'), out = [];
  for (var i = 0; i < rows.length; i++) {
    var r = rows[i].getBoundingClientRect();
    out.push([rows[i].cells[0].textContent, r.top, r.bottom]);
  }
  document.documentElement.setAttribute('data-rows', JSON.stringify(out));
})();
</script></body>"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("pubverdict")
    (d / "circuit.txt").write_text("input->a0.h1<v>\na0.h1->a1.h0<k>\na1.h0->logits\nm1->logits\n")
    (d / "claims.yaml").write_text(yaml.safe_dump({"claims": [
        {"kind": "published_circuit", "name": "faithful", "method": "eap", "statistic": "f_ci_low", "min": 0.5}]}))
    r = CliRunner().invoke(app, ["check-circuit", str(d / "circuit.txt"), "--model", MODEL, "--task", "induction",
                                 "--task-option", "seq_len=5", "--n", "12", "--batch-size", "4", "--n-resamples", "40",
                                 "--seed", "1", "--out", str(d / "run"), "--claims", str(d / "claims.yaml")])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    return d / "run", r.output


def _rows(page: str, tmp_path) -> list:
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", PROBE), encoding="utf-8")
    cmd = dump_dom_cmd(tmp_path) + ["--window-size=1400,1000", "--hide-scrollbars", probe.resolve().as_uri()]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    raw = re.search(r'data-rows="([^"]*)"', out.stdout).group(1)
    return json.loads(raw.replace("&quot;", '"').replace("&amp;", "&"))


def test_the_published_circuit_leads_the_verdict_on_the_first_screen(run, tmp_path):
    run_dir, cli_out = run
    v = verdict(run_dir)
    assert [ln.label for ln in v.lines][:3] == ["published", "its edges", "circuit"]
    text = verdict_text(v)
    first = v.lines[0]
    note = "the full model's effect over the empty circuit is not distinguishable from 0 on these prompts"
    assert first.verdict == "no interval" and note in first.text()
    flat = " ".join(text.split())
    assert " ".join(first.text().split()) in flat  # the terminal says what the page says
    assert note in " ".join(cli_out.split())  # and the claim's reason quotes the same words
    page = render_report(run_dir).read_text(encoding="utf-8")
    assert html.escape(note) in section_html(page, "verdict")
    rows = _rows(page, tmp_path)
    assert [r[0] for r in rows][:2] == ["published", "its edges"]
    assert all(0 <= top and bottom <= 1000 for _, top, bottom in rows[:2]), rows
    # negative control: the probe sees it when something pushes the verdict below the first screen
    pushed = _rows(page.replace("<main>", '<main><div style="height:1200px"></div>', 1), tmp_path)
    assert not all(bottom <= 1000 for _, _, bottom in pushed[:2])
