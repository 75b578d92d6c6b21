"""The verified verdict states the range the tail flag was measured at per edge when a run lies beyond it, and says
nothing inside it: N/n for the uniform design (issue 48 item 2, docs/verified.md "The tail rule at N = 2048"), N/B
for the active design, B its expected exact cells per edge (docs/verified.md "The active design's flag at N = 2048").

A minimal ``verified`` table is written as Parquet and read back through the verdict's own code (Tables), so the
line is the one ``circuitstat attribute --verify`` prints.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from circuitstat.reports.verdicts.verified import (FLAG_MEASURED_MAX_PROMPTS_PER_CELL,
                                                   FLAG_MEASURED_MAX_PROMPTS_PER_LABELLED, active_budget,
                                                   verified_lines)
from circuitstat.stats.verified.active_result import active_estimand

NOTE = "the tail flag's per-edge coverage was measured only up to N/n = 128"
ACTIVE_NOTE = "the tail flag's per-edge coverage was measured only up to N/B = 128"


def _run(tmp_path, n, N: int, flag, estimand: str = "mean exact effect (verified)", budget: float | None = None):
    """The verdict line of a 3-edge verified table; ``n``: n_labelled, one int or one per edge (the active design's
    realised cells differ by edge); ``budget``: also write the active design's verified_cells with that B."""
    rows = 3
    cells = list(n) if isinstance(n, (list, tuple)) else [n] * rows
    d = tmp_path / f"run-{'-'.join(map(str, cells))}-{N}-{abs(hash(estimand))}"
    d.mkdir()
    pq.write_table(pa.table({
        "method": ["eap"] * rows, "edge": list(range(rows)), "edge_name": [f"e{i}" for i in range(rows)],
        "estimate": [0.5, -0.1, 0.02], "ci_low": [0.3, -0.2, -0.1], "ci_high": [0.7, 0.0, 0.1],
        "qvalue": [0.001, 0.2, 0.9], "n_labelled": cells, "n_prompts": [N] * rows, "estimand": [estimand] * rows,
        "no_tail_seen": pa.array([flag] * rows, pa.bool_()), "width_vs_exact_on_all": [1.0] * rows,
    }), d / "verified.parquet")
    if budget is not None:  # one sampled cell per edge is enough: B is what the verdict reads from it
        pq.write_table(pa.table({"method": ["eap"] * rows, "row": [0] * rows, "edge": list(range(rows)),
                                 "probability": [0.5] * rows, "seed": [0] * rows, "stream": [0] * rows,
                                 "budget": [float(budget)] * rows, "n_prompts": [N] * rows}),
                       d / "verified_cells.parquet")
    return verified_lines(d)


@pytest.mark.parametrize("n, N", [(16, 512), (32, 2048), (16, 2048)])
def test_no_note_inside_the_measured_range(tmp_path, n, N):
    (line,) = _run(tmp_path, n, N, True)
    assert f"verified on {n} of {N} prompts" in line and NOTE not in line


def test_the_note_names_the_range_and_the_run_beyond_it(tmp_path):
    (line,) = _run(tmp_path, 16, 2064, True)  # N/n = 129: just past the measured 128
    assert NOTE in line and "N/n = 129 is beyond it" in line and "verify more prompts" in line
    (line,) = _run(tmp_path, 8, 8192, False)
    assert "N/n = 1024 is beyond it" in line
    assert FLAG_MEASURED_MAX_PROMPTS_PER_LABELLED == 128  # N = 2048, n = 16: the largest ratio measured


def test_no_note_where_the_flag_was_not_assessed(tmp_path):
    (line,) = _run(tmp_path, 16, 8192, None)  # an active-design run from before its flag: nothing assessed
    assert NOTE not in line
    (line,) = _run(tmp_path, 16, 8192, None, estimand=active_estimand(16, 8192))
    assert ACTIVE_NOTE not in line and NOTE not in line


@pytest.mark.parametrize("B, N", [(16, 512), (51, 512), (16, 2048), (32, 2048)])
def test_active_no_note_inside_the_measured_range(tmp_path, B, N):
    # realised cells per edge scatter around B: the first edge's 12 would put N / cells past 128 at N = 2048
    (line,) = _run(tmp_path, [12, B, B + 5], N, True, estimand=active_estimand(B, N), budget=B)
    assert active_estimand(B, N) in line and ACTIVE_NOTE not in line and NOTE not in line


def test_active_note_reads_n_over_the_budget_not_an_edges_cells(tmp_path):
    (line,) = _run(tmp_path, [20, 16, 14], 2064, True, estimand=active_estimand(16, 2064), budget=16)  # N/B = 129
    # the first edge's 20 cells give N / cells = 103, inside: a note keyed on n_labelled would stay silent here
    assert ACTIVE_NOTE in line and "N/B = 129 is beyond it" in line and "raise the budget" in line
    assert NOTE not in line  # the uniform design's N/n is not what an active run is measured by
    (line,) = _run(tmp_path, [300, 256, 280], 65536, False, estimand=active_estimand(256, 65536),
                   budget=256)  # N/B = 256
    assert "N/B = 256 is beyond it" in line
    assert FLAG_MEASURED_MAX_PROMPTS_PER_CELL == 128  # N = 2048, B = 16: the largest ratio measured


def test_active_budget_from_the_cells_table_or_the_realised_cells(tmp_path):
    from circuitstat.reports.tableset import Tables

    # the run's verified_cells records B (the one record of it); the realised cells per edge scatter around it
    (line,) = _run(tmp_path, [20, 16, 14], 2064, True, estimand=active_estimand(16, 2064), budget=16)
    d = next(p for p in tmp_path.iterdir() if (p / "verified_cells.parquet").exists())
    assert active_budget(Tables(d), "eap", [20, 16, 14]) == 16.0
    assert active_budget(Tables(d), "atp", [20, 16, 14]) == pytest.approx(50 / 3)  # no cells of that method
    # a run without verified_cells (a hand-made table): the mean realised cells, 16.67 here, so N/B = 124, no note
    (line,) = _run(tmp_path, [20, 16, 14], 2064, True, estimand=active_estimand(16, 2064) + " ")
    assert ACTIVE_NOTE not in line


def _certain_run(tmp_path, bounds, flags):
    """The verdict line of a 3-edge uniform verified table with width_vs_exact_on_all_max = ``bounds``."""
    d = tmp_path / f"certain-{abs(hash((tuple(bounds), tuple(flags))))}"
    d.mkdir()
    pq.write_table(pa.table({
        "method": ["eap"] * 3, "edge": [0, 1, 2], "edge_name": ["e0", "e1", "e2"], "estimate": [0.5, -0.1, 0.02],
        "ci_low": [0.3, -0.2, -0.1], "ci_high": [0.7, 0.0, 0.1], "qvalue": [0.001, 0.2, 0.9], "n_labelled": [16] * 3,
        "n_prompts": [512] * 3, "estimand": ["mean exact effect (verified)"] * 3,
        "no_tail_seen": pa.array(flags, pa.bool_()), "width_vs_exact_on_all": [1.0] * 3,
        "width_vs_exact_on_all_max": bounds}), d / "verified.parquet")
    return verified_lines(d)


def test_the_verdict_counts_flagged_intervals_certainly_within_20x(tmp_path):
    """Of the flagged intervals, those whose certain bound is at most 20 are counted; an unflagged one is not, and a
    run without the column (before the bound) says nothing rather than recomputing it."""
    (line,) = _certain_run(tmp_path, [19.9, 20.0, 5.0], [True, True, False])
    assert "2 of 2 with no tail seen are certainly within 20× exact on all N prompts" in line
    (line,) = _certain_run(tmp_path, [25.0, 20.5, 5.0], [True, True, False])
    assert "0 of 2 with no tail seen are certainly within 20×" in line
    (line,) = _run(tmp_path, 16, 512, True)  # no width_vs_exact_on_all_max column
    assert "certainly" not in line
