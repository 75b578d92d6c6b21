"""The verified verdict states the N/n range the tail flag was measured to hold per edge at (issue 48 item 2,
docs/verified.md "The tail rule at N = 2048") when a uniform-design run lies beyond it, and says nothing inside it.

A minimal ``verified`` table is written as Parquet and read back through the verdict's own code (Tables), so the
line is the one ``circuitstat attribute --verify`` prints.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from circuitstat.reports.verdicts.verified import FLAG_MEASURED_MAX_PROMPTS_PER_LABELLED, verified_lines

NOTE = "the tail flag's per-edge coverage was measured only up to N/n = 128"


def _run(tmp_path, n: int, N: int, flag, estimand: str = "mean exact effect (verified)"):
    d = tmp_path / f"run-{n}-{N}-{estimand[-8:].strip('()')}"
    d.mkdir()
    rows = 3
    pq.write_table(pa.table({
        "method": ["eap"] * rows, "edge": list(range(rows)), "edge_name": [f"e{i}" for i in range(rows)],
        "estimate": [0.5, -0.1, 0.02], "ci_low": [0.3, -0.2, -0.1], "ci_high": [0.7, 0.0, 0.1],
        "qvalue": [0.001, 0.2, 0.9], "n_labelled": [n] * rows, "n_prompts": [N] * rows, "estimand": [estimand] * rows,
        "no_tail_seen": pa.array([flag] * rows, pa.bool_()), "width_vs_exact_on_all": [1.0] * rows,
    }), d / "verified.parquet")
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


def test_no_note_where_the_flag_was_not_assessed_or_the_design_is_active(tmp_path):
    (line,) = _run(tmp_path, 16, 8192, None)  # an active-design run from before its flag: nothing assessed
    assert NOTE not in line
    (line,) = _run(tmp_path, 16, 8192, True, estimand="mean exact effect (active sampling)")
    assert NOTE not in line  # the active design's flag was measured at N = 512 only; no range is claimed
