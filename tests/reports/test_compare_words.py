"""What `circuitstat compare` says where the first hour misread it (issue 43 item 3): equal estimates in one
sentence, the spec difference that explains the intervals, edge-row counts that cannot read as a contradiction,
and two names of one model recognised by its weights. The terminal and the page say the same."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from report_builders import make_report_run, write_filled

from circuitstat.core.rundir import RunDir
from circuitstat.reports.compare import RunInfo, compare_runs, compare_tables, read_run
from circuitstat.reports.html.compare import comparison_section

SPEC = {"models": ["zoo:attn2l/seed-0"], "task": {"name": "induction", "n": 64}, "methods": ["exact", "eap"],
        "bootstrap": {"scheme": "examples", "n_resamples": 1000}, "n_jobs": 2}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_report_run(tmp_path_factory.mktemp("cmpw") / "a", seed=0, variance=False, evil=False)


def _tables(run: Path) -> dict:
    return read_run(run)[0]


def _info(label: str, methods=("exact", "eap"), spec=SPEC, models=("zoo:attn2l/seed-0",), digest="ab" * 32):
    return RunInfo(label, tuple(models), tuple(methods), 0, 0.95, digest, spec)


def test_equal_estimates_are_one_sentence_saying_only_the_intervals_differ(base, tmp_path):
    """Before: the 'largest differences' listed +0 rows alphabetically."""
    ta = _tables(base)
    wide = ta["edge_stats"].to_pydict()
    wide["ci_low"] = [v - 0.1 for v in wide["ci_low"]]
    write_filled(wide, tmp_path / "edge_stats.parquet")
    tb = {**ta, "edge_stats": pq.read_table(tmp_path / "edge_stats.parquet")}
    comp = compare_tables(ta, tb, _info("A"), _info("B"))
    n = ta["edge_stats"].num_rows
    want = f"All {n} edge-row estimates are equal in A and B (B - A = 0); only the intervals differ ({n} rows)."
    text = comp.summary()
    assert want in text and "Largest differences" not in text
    assert want in comparison_section(comp)  # the page says the same
    same = compare_tables(ta, ta, _info("A"), _info("B")).summary()
    assert "the intervals are equal too" in same
    other = _tables(make_report_run(tmp_path / "b", seed=1, variance=False, evil=False))
    differ = compare_tables(ta, other, _info("A"), _info("B")).summary()  # negative control
    assert "Largest differences B - A" in differ and "are equal in A and B" not in differ


def test_the_spec_difference_that_explains_the_intervals_is_named(base):
    ta = _tables(base)
    clusters = {**SPEC, "bootstrap": {"scheme": "clusters", "n_resamples": 1000}, "n_jobs": 1}
    comp = compare_tables(ta, ta, _info("A"), _info("B", spec=clusters))
    (note,) = [n for n in comp.notes if n.startswith("the specs differ")]
    assert "bootstrap.scheme (A: examples, B: clusters)" in note and "n_jobs" not in note
    assert note in comp.summary() and "n_resamples" not in note
    assert not [n for n in compare_tables(ta, ta, _info("A"), _info("B")).notes if n.startswith("the specs")]


def test_edge_rows_only_in_one_run_say_which_method_makes_them(base):
    """Before: 'edge rows 110 in both, 110 only in A' read as a contradiction."""
    ta = _tables(base)
    es = ta["edge_stats"]
    exact_only = es.filter(pc.equal(es.column("method"), "exact"))
    tb = {**ta, "edge_stats": exact_only}
    comp = compare_tables(ta, tb, _info("A"), _info("B", methods=("exact",)))
    n = exact_only.num_rows
    head = comp.summary().split("intervals apart")[0]
    assert f"one per method and edge: {n} in both runs, {es.num_rows - n} in A only (method eap, which B has not), " \
           "0 in B only" in " ".join(head.split())
    assert f"{n} in both runs, {es.num_rows - n} in A only (method eap" in comparison_section(comp)


def test_two_names_of_one_model_are_recognised_by_its_weights(base, tmp_path):
    from circuitstat.core.run_check import record_tables

    """Before: the demo against a catalogue run of the same seed-0 model said 'the runs are of different models'."""
    ta = _tables(base)
    same = compare_tables(ta, ta, _info("A"), _info("B", models=("catalogue:zoo-induction",)))
    (note,) = [n for n in same.notes if "model" in n]
    assert "its weights are the same" in note and "different models" not in note
    other = compare_tables(ta, ta, _info("A"), _info("B", models=("x",), digest="cd" * 32))
    assert any("the runs are of different models" in n for n in other.notes)  # negative control
    unknown = compare_tables(ta, ta, _info("A", digest=None), _info("B", models=("x",), digest=None))
    assert any("no weight hash recorded" in n for n in unknown.notes)
    # read from the manifests: the weight hash the audit records in its provenance
    runs = []
    for name, model in (("a", "zoo:attn-only-2l/seed-0"), ("b", "/cache/zoo/attn-only-2l/seed-0")):
        run = tmp_path / name
        with RunDir(run, spec={**SPEC, "models": [model]}, seed=7,
                    provenance={"model": {"source": model, "weight_hash": "ef" * 32}}):
            pass
        for table in base.glob("*.parquet"):  # the tables as make_report_run writes them: after the manifest
            shutil.copy(table, run / table.name)
        record_tables(run, sorted(run.glob("*.parquet")))  # the run's own tables: recorded as RunDir records them
        runs.append(run)
    comp = compare_runs(*runs)
    assert comp.a.weight_hash == "ef" * 32 and any("its weights are the same" in n for n in comp.notes)
