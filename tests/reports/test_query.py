"""DuckDB queries over the tables of several run directories."""

import numpy as np
import pytest

from circuitstat.core.query import list_tables, query
from circuitstat.core.rundir import RunDir
from circuitstat.core.tables import matrix_to_table, table_to_matrix


def _make_run(path, n_edges, est, extra_col=False):
    edges = {"edge": [f"e{i}" for i in range(n_edges)], "estimate": [est + i for i in range(n_edges)]}
    if extra_col:
        edges["q"] = [0.01] * n_edges
    with RunDir(path, seed=0) as run:
        run.stage("effects", lambda: {"effects": edges}, ["effects"])  # not a registered table: any columns
        run.stage("scores", lambda: {"scores": matrix_to_table(np.full((4, n_edges), est, np.float32))}, ["scores"])


def test_query_unions_runs_with_run_column(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _make_run(a, 3, 1.0)
    _make_run(b, 2, 10.0, extra_col=True)
    (a / ".scores.parquet.123.deadbeef.circuitstat-tmp").write_bytes(b"partial")  # in-flight write: ignored

    t = query("SELECT run, count(*) AS n, sum(estimate) AS s FROM effects GROUP BY run ORDER BY run", [a, b])
    assert t.to_pydict() == {"run": [str(a), str(b)], "n": [3, 2], "s": [6.0, 21.0]}
    # Columns missing in one run come back as NULL (union by name).
    q = query("SELECT run, q FROM effects ORDER BY run, edge", [a, b]).to_pydict()
    assert q["q"] == [None, None, None, 0.01, 0.01]
    # Per-example matrices are queryable and come back as matrices.
    s = query(f"SELECT scores FROM scores WHERE run = '{b}'", [a, b])
    assert np.array_equal(table_to_matrix(s), np.full((4, 2), 10.0, np.float32))
    assert sorted(list_tables([a, b])) == ["effects", "scores"]


def test_unknown_table_lists_available(tmp_path):
    _make_run(tmp_path / "a", 2, 0.0)
    with pytest.raises(ValueError, match=r"(?s)edge_stats.*Tables available.*effects, scores"):
        query("SELECT * FROM edge_stats", [tmp_path / "a"])


def test_missing_run_dir_and_run_column_clash(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        query("SELECT 1", [tmp_path / "nope"])
    with RunDir(tmp_path / "r") as run:
        run.stage("runs", lambda: {"runs": {"run": [1]}}, ["runs"])
    with pytest.raises(ValueError, match="run_column="):
        query("SELECT * FROM runs", [tmp_path / "r"])
    assert query("SELECT run, run_dir FROM runs", [tmp_path / "r"], run_column="run_dir").num_rows == 1
