"""The published circuit's faithfulness interval is Fieller's set (issue 47, item 7): the table holds the set
recomputed from an independent re-evaluation, and where the full model's effect over the empty circuit is not
distinguishable from 0 (a random model) the terminal, the page and the claim all say so instead of printing a
finite interval."""

from __future__ import annotations

import html

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app
from circuitstat.stats.fieller import UNDISTINGUISHABLE, fieller_faithfulness

MODEL = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3"
CIRCUIT = ["input->a0.h1<v>", "a0.h1->a1.h0<k>", "a1.h0->logits", "m1->logits"]


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    d = tmp_path_factory.mktemp("fieller")
    (d / "circuit.txt").write_text("\n".join(CIRCUIT) + "\n")
    (d / "claims.yaml").write_text(yaml.safe_dump({"claims": [
        {"kind": "published_circuit", "name": "faithful", "method": "eap", "statistic": "f_ci_low", "min": 0.5}]}))
    r = CliRunner().invoke(app, ["check-circuit", str(d / "circuit.txt"), "--model", MODEL, "--task", "induction",
                                 "--task-option", "seq_len=5", "--n", "12", "--batch-size", "4", "--n-resamples", "40",
                                 "--seed", "1", "--out", str(d / "run"), "--claims", str(d / "claims.yaml")])
    assert "Traceback" not in r.output
    return d, r


def test_the_table_holds_fieller_of_the_re_evaluated_metrics(checked):
    from circuitstat.circuits.circuit import Circuit
    from circuitstat.circuits.faithfulness import faithfulness
    from circuitstat.pipelines.build import build_task
    from circuitstat.pipelines.sources import LOCAL

    d, _ = checked
    s = pq.read_table(d / "run" / "published_circuit.parquet").to_pylist()[0]
    model = LOCAL.load(MODEL)
    task = build_task(model, "induction", n=12, seed=1, seq_len=5)
    f = faithfulness(model, task, Circuit.from_edges(model.graph, CIRCUIT), batch_size=4, seed=1, progress=False)
    ref = fieller_faithfulness(f.m_circuit, f.m_clean, f.m_empty)
    assert s["f_ci_method"] == "fieller"
    assert s["f_ci_low"] == pytest.approx(float(ref.low[0]), rel=1e-6, abs=1e-9)
    assert s["f_ci_high"] == pytest.approx(float(ref.high[0]), rel=1e-6, abs=1e-9)
    assert s["f_ci_note"] == ref.notes()[0]


def test_an_indistinguishable_denominator_is_said_everywhere(checked):
    """A random model: m(full) − m(empty) is noise, so the set is unbounded; the terminal, the page and the claim
    all carry the same sentence, and the claim on f_ci_low fails (exit 1) instead of passing on an exploded interval."""
    from circuitstat.reports.html import render_report

    d, r = checked
    s = pq.read_table(d / "run" / "published_circuit.parquet").to_pylist()[0]
    assert s["f_ci_low"] == -np.inf and s["f_ci_high"] == np.inf, s
    assert s["f_ci_note"].startswith(UNDISTINGUISHABLE)
    assert r.exit_code == 1, r.output
    out = " ".join(r.output.split())
    assert f"faithfulness: {s['f_ci_note']}" in out
    line = next(ln for ln in r.output.splitlines() if ln.startswith("faithful "))
    assert " FAIL " in line and UNDISTINGUISHABLE in " ".join(r.output.split())
    page = render_report(d / "run").read_text()
    assert html.escape(s["f_ci_note"]) in page
