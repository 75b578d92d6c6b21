"""Every command that reads a finished run verifies its tables against the sha256 its stages recorded
(issue 38 adversarial 2): an edited scores table is refused, never printed as a wrong number."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app

MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1"
runner = CliRunner()


@pytest.fixture(scope="module")
def attribute_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("attr") / "run"
    res = runner.invoke(app, ["attribute", "--model", MODEL, "--method", "eap", "--n", "4", "--out", str(out)])
    assert res.exit_code == 0, res.output + res.stderr
    return out


def _edited_copy(run: Path, dest: Path) -> Path:
    """A copy of ``run`` whose scores.parquet is x1000, written as a valid Parquet file with its metadata."""
    import shutil

    shutil.copytree(run, dest)
    t = pq.read_table(dest / "scores.parquet")
    i = t.column_names.index("scores")
    col = t.column("scores")
    values = np.asarray(col.to_pylist(), dtype=np.float32) * 1000
    t = t.set_column(i, t.field(i), pa.array(list(values), type=col.type))
    pq.write_table(t, dest / "scores.parquet")
    return dest


def test_circuit_refuses_an_edited_scores_table(attribute_run, tmp_path):
    ok = runner.invoke(app, ["circuit", str(attribute_run), "--k", "3"])
    assert ok.exit_code == 0, ok.output + ok.stderr
    bad = _edited_copy(attribute_run, tmp_path / "edited")
    res = runner.invoke(app, ["circuit", str(bad), "--k", "3"])
    assert res.exit_code == 2, res.output + res.stderr
    assert "scores.parquet" in res.stderr and "changed since the run wrote them" in res.stderr
    assert res.stdout == ""  # no circuit, no number printed from the edited table


def test_query_refuses_an_edited_table(attribute_run, tmp_path):
    sql = "SELECT count(*) AS n FROM scores"
    ok = runner.invoke(app, ["query", sql, str(attribute_run)])
    assert ok.exit_code == 0 and "(1 row)" in ok.output, ok.output + ok.stderr
    bad = _edited_copy(attribute_run, tmp_path / "edited")
    res = runner.invoke(app, ["query", sql, str(attribute_run), str(bad)])
    assert res.exit_code == 2, res.output + res.stderr
    assert f"{bad}: 1 table(s) changed" in res.stderr and "scores.parquet" in res.stderr


def test_query_refuses_a_memory_limit_beyond_the_machine(attribute_run):
    """Issue 38 (Low): `query --max-memory 100TiB` was accepted."""
    import os

    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    res = runner.invoke(app, ["query", "SELECT 1 AS one", str(attribute_run), "--max-memory", "100TiB"])
    assert res.exit_code == 2 and "more than this machine's memory" in res.stderr, res.output + res.stderr
    fits = f"{max(physical // 2**20 // 2, 1)}MiB"
    assert runner.invoke(app, ["query", "SELECT 1 AS one", str(attribute_run), "--max-memory", fits]).exit_code == 0
