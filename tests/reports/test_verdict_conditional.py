"""The verdict of a mask-learned method's faithfulness reads the reported circuit's conditional interval
(f_conditional_ci_*: fit on half the prompts, Fieller on the other half), with the procedure-level interval beside it
(issue 47, item 8); a score method's line, without the column, reads the procedure-level one as before."""

from __future__ import annotations

import math
from pathlib import Path

from circuitstat.core.rundir import RunDir
from circuitstat.core.schema import fill
from circuitstat.reports.verdicts import verdict, verdict_text


def _run(tmp: Path, cond: tuple[float, float, float] | None) -> Path:
    f, lo, hi = cond if cond else (math.nan,) * 3
    cols = {"method": ["edge-pruning"], "k": [10], "f_ratio": [0.9], "f_ci_low": [0.85], "f_ci_high": [0.95],
            "f_selected": [0.9], "f_selected_ci_low": [0.85], "f_selected_ci_high": [0.95],
            "f_conditional": [f], "f_conditional_ci_low": [lo], "f_conditional_ci_high": [hi],
            "f_conditional_shape": ["bounded" if cond else ""]}
    name = "cond" if cond else "plain"
    with RunDir(tmp / name, spec={"ranking": "signed"}, seed=0) as run:
        run.write_table("faithfulness_vs_k", fill("faithfulness_vs_k", cols, 1))
    return tmp / name


def _line(path: Path):
    return next(x for x in verdict(path).lines if x.label == "faithfulness")


def test_the_reported_circuit_decides_and_the_procedure_level_interval_is_named(tmp_path):
    cond = _line(_run(tmp_path, (0.5, 0.3, 0.7)))
    # the procedure-level interval is above the bar, the reported circuit's is below: the latter decides
    assert cond.verdict == "not faithful" and cond.tone == "bad"
    assert [c.lo for c in cond.cis] == [0.3, 0.85]  # the reported circuit's interval first, the procedure's after
    text = verdict_text(verdict(tmp_path / "cond"), Path("r.html"))
    assert "reported top-10 circuit (fitted on half" in " ".join(text.split())
    assert "procedure-level interval (averaged over refits)" in " ".join(text.split())
    # negative control: without the conditional column the same row reads the procedure-level interval
    plain = _line(_run(tmp_path, None))
    assert plain.verdict == "faithful" and [c.lo for c in plain.cis][0] == 0.85
    assert "averaged over refits" in " ".join(verdict_text(verdict(tmp_path / "plain"), Path("r.html")).split())


def test_an_unbounded_fieller_set_is_inconclusive_not_faithful(tmp_path):
    line = _line(_run(tmp_path, (0.9, -math.inf, math.inf)))
    assert line.verdict == "inconclusive" and line.tone == "unsure"
