"""The run's own top-k faithfulness curve (faithfulness_vs_k.f_ci_*) is Fieller's set, the one function the published
circuit uses (issue 47): the audit's columns equal circuitstat.stats.fieller on the metrics the curve evaluated (the
cluster-robust set under a cluster plan), and where the full model's effect over the empty circuit is not
distinguishable from 0 the table's note, the terminal verdict, the report page and a claim all carry the same
sentence; a bounded row is read against the bar as before (the negative control)."""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np
import pytest

from circuitstat.core.rundir import RunDir
from circuitstat.core.schema import fill
from circuitstat.stats.fieller import UNDISTINGUISHABLE, fieller_faithfulness, fieller_note

MODEL = "random:gpt2?n_layer=2&n_head=2&n_embd=16&vocab_size=64&n_positions=32"
WHOLE_LINE = fieller_note("unbounded")


@pytest.mark.parametrize("clustered", [False, True])
def test_the_audit_columns_are_fieller_of_the_evaluated_metrics(clustered):
    from circuitstat.circuits import load_model
    from circuitstat.pipelines.runs.audit.tables import fixed_faithfulness_columns
    from circuitstat.pipelines.build import build_task
    from circuitstat.pipelines.spec import parse_spec
    from circuitstat.stats import ResamplingPlan

    model = load_model(MODEL)
    task = build_task(model, "induction", n=16, seed=0, seq_len=5)
    spec = parse_spec({"model": "random:gpt2", "task": {"name": "induction", "n": 16}, "k": [3, 8, 30],
                       "bootstrap": {"n_resamples": 40, "confidence_level": 0.8}}, "<t>")
    ranked = np.random.default_rng(0).standard_normal(len(model.graph.edge_names))
    groups = np.repeat(np.arange(8), 2)
    plan = ResamplingPlan.cluster(groups, 40, 0) if clustered else ResamplingPlan.bootstrap(16, 40, 0)
    out, res = fixed_faithfulness_columns(model, task, ranked, "absolute", "exact", [3, 8, 30], plan, spec, 0)
    ref = fieller_faithfulness(res.m_circuit, res.m_clean, res.m_empty, confidence_level=0.8,
                               groups=groups if clustered else None)
    assert ref.df == (7 if clustered else 15)
    assert out["f_ci_method"] == ["fieller"] * 3
    np.testing.assert_allclose(out["f_ci_low"], ref.low, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(out["f_ci_high"], ref.high, rtol=1e-9, atol=1e-12)
    assert out["f_ci_note"] == ref.notes()
    np.testing.assert_allclose(out["f_ratio"], ref.estimate, rtol=1e-6, atol=1e-9)
    # at 80% the denominator's t (≈ 1.9 on this random model) clears the critical t (1.34 on 15 df, 1.41 on 7) by a
    # margin no kernel's rounding moves: bounded sets, so the negative control can compare ends. Negative control:
    # the other treatment of the clusters gives other ends, so the columns above are the plan's own set
    assert list(ref.shape) == ["bounded"] * 3
    other = fieller_faithfulness(res.m_circuit, res.m_clean, res.m_empty, confidence_level=0.8,
                                 groups=None if clustered else groups)
    assert (np.abs(other.low - ref.low) > 0.01 * np.abs(ref.low)).all()


def _run(tmp: Path, name: str, low: float, high: float, note: str) -> Path:
    """A run whose faithfulness_vs_k has one fixed-circuit row at k = 10 (no selection-aware interval)."""
    cols = {"method": ["exact"], "k": [10], "f_ratio": [0.62], "f_ci_low": [low], "f_ci_high": [high],
            "f_ci_method": ["fieller"], "f_ci_note": [note], "k_source": ["grid"],
            "f_selected_note": ["too few prompts per fold"], "connected": [True]}
    with RunDir(tmp / name, spec={"ranking": "absolute"}, seed=0) as run:
        run.write_table("faithfulness_vs_k", fill("faithfulness_vs_k", cols, 1))
    return tmp / name


def _claim(path: Path):
    from circuitstat.pipelines.claims import evaluate_claims, parse_claims

    claims = parse_claims({"claims": [{"kind": "faithfulness", "name": "f", "method": "exact", "k": 10,
                                       "statistic": "f_ci_low", "min": 0.5}]})
    return evaluate_claims(claims, path)[0]


def _everywhere(path: Path) -> tuple[str, str, str]:
    """(the terminal verdict's text, the report page, the claim's reason) of a run, whitespace collapsed."""
    from circuitstat.reports.html import render_report
    from circuitstat.reports.verdicts import verdict, verdict_text

    text = " ".join(verdict_text(verdict(path), Path("r.html")).split())
    page = " ".join(render_report(path).read_text().split())
    return text, page, _claim(path).reason


def test_an_unbounded_set_is_said_in_the_table_terminal_page_and_claim(tmp_path):
    from circuitstat.reports.verdicts import verdict

    path = _run(tmp_path, "unbounded", -math.inf, math.inf, WHOLE_LINE)
    line = next(x for x in verdict(path).lines if x.label == "faithfulness")
    assert line.verdict == "no interval" and line.tone == "unsure"
    text, page, reason = _everywhere(path)
    assert f"this fixed top-10 circuit 0.620, but {WHOLE_LINE}" in text
    assert html.escape(f"fixed circuit: {WHOLE_LINE}") in page  # the table's note column
    assert WHOLE_LINE in reason and _claim(path).status == "fail"
    # the chosen k reads the unbounded set as measured and failing the bar, not as faithfulness never run
    from circuitstat.reports.tableset import Tables
    from circuitstat.reports.verdicts import choose_k

    k, why = choose_k(Tables(path), "exact")
    assert k == 10 and why.startswith("no k reaches a fixed-circuit faithfulness lower bound"), why


def test_a_bounded_set_is_read_against_the_bar_without_the_note(tmp_path):
    from circuitstat.reports.verdicts import verdict

    path = _run(tmp_path, "bounded", 0.55, 0.70, "")
    line = next(x for x in verdict(path).lines if x.label == "faithfulness")
    assert line.verdict == "not faithful" and [c.lo for c in line.cis] == [0.55]
    text, page, reason = _everywhere(path)
    assert UNDISTINGUISHABLE not in text and UNDISTINGUISHABLE not in html.unescape(page)
    assert UNDISTINGUISHABLE not in reason and _claim(path).status == "pass"
