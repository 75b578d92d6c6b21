"""circuitstat.reports.sample_size_bound: the per-N summary of the planning bound that the terminal and the figure
both read, on a spiky pilot (bounds that plan nothing, flagged with the fix), a normal one (none flagged) and a
table written before width_upper_below_pilot existed (said to be not assessed, never recomputed)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from circuitstat.core.schema_core import SchemaError
from circuitstat.core.schema_results import RESULT_TABLES
from circuitstat.core.tables import to_arrow
from circuitstat.reports.html.sample_size import sample_size_svg
from circuitstat.reports.sample_size_bound import bound_notes, bound_rows
from circuitstat.stats.sample_size import predict_stability, predict_widths

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stats"))
from test_sample_size_informative import normal_pilot, spiky_pilot  # noqa: E402


def _widths(S: np.ndarray, ns: list[int]) -> dict:
    w = predict_widths(S, ns, n_resamples=199, seed=0)
    w["name"] = np.array([f"e{i}" for i in w["edge"]], dtype=object)
    return w


def test_spiky_pilot_counts_every_bound_uninformative_and_names_the_fix():
    rows = bound_rows(_widths(spiky_pilot(), [64, 512]))
    assert [(r["n"], r["edges"], r["uninformative"]) for r in rows] == [(64, 6, 6), (512, 6, 6)]
    (note,) = bound_notes(rows, 32)
    assert note.startswith("take a larger pilot") and "6 of 6 at N = 64, 6 of 6 at N = 512" in note
    assert "too heavy-tailed" in note and "32 prompts" in note
    # the all-edge median is reported as it is (a bound, not clipped), beside the count
    assert rows[1]["median_upper"] > 1e3 * rows[1]["median_pilot_width"]


def test_normal_pilot_has_no_note_above_the_pilots_size_and_a_different_one_below_it():
    rows = bound_rows(_widths(normal_pilot(), [16, 128, 512]))
    assert [r["uninformative"] for r in rows] == [6, 0, 0]
    (note,) = bound_notes(rows, 32)  # N = 16 only: not the heavy-tail fix, the reason a smaller run cannot narrow
    assert "at N <= the pilot's 32 prompts" in note and "6 of 6 at N = 16" in note and "larger pilot" not in note
    assert bound_notes(bound_rows(_widths(normal_pilot(), [128, 512])), 32) == []


def test_the_figure_shows_the_same_counts_as_the_rows():
    S = spiky_pilot()
    stab = predict_stability(S, [64, 512], [2], ranking="absolute", seed=0, n_outer=10, n_sim=10)
    svg = sample_size_svg(stab, _widths(S, [64, 512]), target=0.5, level=0.9)
    for n in (64, 512):  # the legend text is escaped (esc)
        assert f"N = {n}: upper bound above the pilot&#x27;s width for 6 of 6 edges" in svg
    calm = sample_size_svg(predict_stability(normal_pilot(), [128], [2], ranking="absolute", seed=0, n_outer=10,
                                             n_sim=10), _widths(normal_pilot(), [128]), target=0.5, level=0.9)
    assert "upper bound above" not in calm and "not assessed" not in calm


def test_a_table_written_before_the_column_reads_and_is_said_to_be_not_assessed():
    schema = RESULT_TABLES["sample_size_widths"]
    w = _widths(spiky_pilot(), [64])
    old = {k: v for k, v in w.items() if k != "width_upper_below_pilot"}
    table = schema.validate(to_arrow(old))  # optional: an old run's table still matches the schema
    assert "width_upper_below_pilot" not in table.column_names
    rows = bound_rows(table.to_pydict())
    assert rows[0]["uninformative"] is None
    (note,) = bound_notes(rows, 32)
    assert "not assessed" in note and "take a larger pilot" not in note  # never recomputed behind the reader's back
    assert schema.validate(to_arrow(w)).column("width_upper_below_pilot").to_pylist() == [False] * 6
    with pytest.raises(SchemaError, match="width_upper"):  # the control: a required column is still required
        schema.validate(to_arrow({k: v for k, v in old.items() if k != "width_upper"}))
