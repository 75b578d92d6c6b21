"""The audit at a large graph's size (issue 36, item 4): its statistics stages read the score tables in blocks of
edge columns (circuitstat.pipelines.runs.audit.scores), writing the tables the in-memory path writes, bit for bit; the
stages that need whole matrices are refused, before the run, when they would load more than the bound."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from circuitstat.core.errors import InputError
from circuitstat.core.score_columns import ParquetColumns
from circuitstat.pipelines.runs.audit import scores as audit_scores
from circuitstat.pipelines.runs.audit.run import run_audit
from circuitstat.pipelines.spec import parse_spec

SPEC = {
    "model": "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3",
    "task": {"name": "induction", "n": 12, "options": {"seq_len": 5}},
    "methods": ["eap", "clean-corrupted"], "batch_size": 4, "bootstrap": {"n_resamples": 40}, "k": [3, 6, 20],
    "faithfulness": False,
}
STREAMED = ["edge_stats", "stability_vs_k", "inclusion"]
N = 12
BLOCK = 6  # edges per kept block in the streamed run
CHUNK = 4  # edges per resampling chunk in both runs (so chunks straddle the blocks' ends)


def _small_chunks(monkeypatch) -> None:
    """Resample in chunks of CHUNK edges (the engine's results do not depend on the chunk size)."""
    import circuitstat.stats.intervals.edges as edges_mod
    import circuitstat.stats.resampling as resampling

    monkeypatch.setattr(resampling, "default_chunk_size", lambda *a, **k: CHUNK)
    monkeypatch.setattr(edges_mod, "default_chunk_size", lambda *a, **k: CHUNK)


def _record_reads(monkeypatch) -> dict:
    """Count whole loads of a score table and the widths of every block ParquetColumns decodes."""
    seen: dict = {"whole": 0, "widths": []}
    read, load = ParquetColumns._read, audit_scores.RunScores._load

    def recording_read(self, start, stop):
        seen["widths"].append(stop - start)
        return read(self, start, stop)

    def counting_load(self, method):
        seen["whole"] += 1
        return load(self, method)

    monkeypatch.setattr(ParquetColumns, "_read", recording_read)
    monkeypatch.setattr(audit_scores.RunScores, "_load", counting_load)
    return seen


def test_streamed_statistics_stages_equal_the_in_memory_path_column_by_column(tmp_path, monkeypatch):
    _small_chunks(monkeypatch)
    monkeypatch.setattr(audit_scores, "STREAM_BYTES", 2**40)  # every matrix whole: the in-memory path
    run_audit(parse_spec(SPEC), tmp_path / "memory")

    seen = _record_reads(monkeypatch)
    monkeypatch.setattr(audit_scores, "STREAM_BYTES", 0)
    monkeypatch.setattr(audit_scores, "BLOCK_BYTES", 4 * N * BLOCK)
    monkeypatch.setattr(audit_scores, "WHOLE_BYTES", 1)  # no stage may load a matrix whole
    run_audit(parse_spec(SPEC), tmp_path / "blocks")

    E = pq.ParquetFile(tmp_path / "blocks" / "scores_eap.parquet").schema_arrow.field("scores").type.list_size
    assert E > 5 * BLOCK
    assert seen["whole"] == 0 and seen["widths"], "the streamed run loaded a score table whole"
    assert max(seen["widths"]) <= BLOCK + CHUNK < E  # a block, or a chunk straddling its end: never all edges
    for name in STREAMED:
        a = pq.read_table(tmp_path / "memory" / f"{name}.parquet")
        b = pq.read_table(tmp_path / "blocks" / f"{name}.parquet")
        assert a.column_names == b.column_names and a.num_rows == b.num_rows > 0, name
        for col in a.column_names:
            x, y = a.column(col).to_numpy(zero_copy_only=False), b.column(col).to_numpy(zero_copy_only=False)
            if x.dtype.kind == "f":
                np.testing.assert_array_equal(x.view(np.int64), y.view(np.int64), err_msg=f"{name}.{col}")
            else:
                assert x.tolist() == y.tolist(), f"{name}.{col}"


def test_a_stage_that_needs_whole_matrices_is_refused_before_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(audit_scores, "WHOLE_BYTES", 1000)
    out = tmp_path / "run"
    with pytest.raises(InputError) as e:
        run_audit(parse_spec({**SPEC, "faithfulness": True}), out)
    msg = str(e.value)
    assert "faithfulness (" in msg and "set faithfulness: false" in msg and "--allow-large" in msg
    assert "12 examples x" in msg and "read them in blocks" in msg
    assert not out.exists()  # refused before the run directory was made


def test_whole_stages_count_the_matrices_each_stage_holds():
    spec = parse_spec({**SPEC, "methods": ["exact", "eap"], "faithfulness": True,
                       "tests": {"k": 3}})
    one = 4 * 100 * 1000
    assert audit_scores.whole_stages(spec, 100, 1000) == {"faithfulness": one, "approximation": 2 * one,
                                                           "circuit_tests": one}
    assert audit_scores.whole_stages(parse_spec(SPEC), 100, 1000) == {}  # intervals and stability only: none
    audit_scores.check_whole_scores(spec, 100, 1000)  # 0.8 MB: well within the default bound
    with pytest.raises(InputError, match=r"approximation \(.*audit exact and the approximations in separate runs"):
        audit_scores.check_whole_scores(spec, 100_000, 30_000)
    audit_scores.check_whole_scores(spec, 100_000, 30_000, allow_large=True)


def test_circuit_command_selects_from_column_means_without_loading_the_scores(tmp_path, monkeypatch):
    """`circuitstat circuit` reads a run's scores as column means in blocks (ScoreMatrix.read_means): the same
    circuit and export as from the whole matrix, and no whole load."""
    import json

    from typer.testing import CliRunner

    import circuitstat.core.tables as tables
    from circuitstat.circuits.circuit import Circuit
    from circuitstat.circuits.graph import ComponentGraph
    from circuitstat.circuits.scores import ScoreMatrix
    from circuitstat.pipelines.cli import app

    run, g = tmp_path / "run", ComponentGraph(2, 2)
    S = np.random.default_rng(4).standard_normal((9, g.n_edges)).astype(np.float32)
    S[:, 3] = S[:, 4]  # a tie: the seeded tie rule must see the same means
    ScoreMatrix(S, g, "edge", "eap", "counterfactual", "logit_diff",
                provenance={"model": {"d_model": 16, "source": "random:test"}}).write(run)
    whole = ScoreMatrix.read(run)
    means = ScoreMatrix.read_means(run)
    assert means.mean().tobytes() == whole.mean().tobytes() and means.describe() == whole.describe()
    Circuit.top_k(whole, 5, ranking="absolute", seed=3).to_json(tmp_path / "expected.json")

    def whole_load(*a, **k):
        raise AssertionError("the circuit command loaded the score matrix whole")

    monkeypatch.setattr(tables, "table_to_matrix", whole_load)
    r = CliRunner().invoke(app, ["circuit", str(run), "--k", "5", "--ranking", "absolute", "--seed", "3", "--no-prune",
                                 "--json", str(tmp_path / "got.json")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "got.json").read_text()) == json.loads((tmp_path / "expected.json").read_text())
