"""Statistics from a score table read in blocks of edge columns (issue 36, item 4): per-edge intervals,
q-values, stability and its data-level intervals from a ParquetColumns equal, bit for bit, those of the same
matrix in memory, while no read ever holds more than one block of columns (bench/scale.py measures the memory
at 1.6 M edges x 512 examples)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from circuitstat.core import tables
from circuitstat.core.score_columns import ParquetColumns, column_means
from circuitstat.core.tables import write_matrix
from circuitstat.stats.intervals import bootstrap_edges
from circuitstat.stats.resampling import check_score_matrix
from circuitstat.stats.stability import circuit_stability

N, E = 40, 301


@pytest.fixture()
def stored(tmp_path, monkeypatch):
    """(S in memory, its scores.parquet) written in row groups of under 4 rows."""
    rng = np.random.default_rng(3)
    S = (rng.standard_t(3, (N, E)) * rng.gamma(1.0, 1.0, E)).astype(np.float32)
    S[:, 7] = S[:, 8]  # exact ties between edges: the tie rule must agree across blocks
    monkeypatch.setattr(tables, "ROW_GROUP_BYTES", 4 * E * 4)
    path = write_matrix(S, tmp_path / "scores.parquet", {"example": np.arange(N)})
    assert pq.ParquetFile(path).metadata.num_row_groups >= 10  # rows of E floats and an example id
    return S, path


class Recording(ParquetColumns):
    """ParquetColumns recording the width of every block it decodes."""

    def _read(self, start, stop):
        self.widths = getattr(self, "widths", []) + [stop - start]
        return super()._read(start, stop)


def test_blocks_equal_the_matrix_and_it_is_never_loaded_whole(stored):
    S, path = stored
    cols = Recording(path, max_bytes=4 * N * 64)  # 64 edges per block
    assert cols.shape == (N, E) and cols.block == 64
    got = np.concatenate([b for _, b in cols.blocks()], axis=1)
    np.testing.assert_array_equal(got, S)
    assert max(cols.widths) == 64 and cols.passes == 5  # ceil(301 / 64) passes, one block each
    with pytest.raises(TypeError, match="read in blocks"):
        np.asarray(cols)
    np.testing.assert_array_equal(column_means(cols), S.astype(np.float64).mean(axis=0))
    np.testing.assert_array_equal(column_means(S), S.astype(np.float64).mean(axis=0))


def test_bootstrap_edges_from_blocks_is_bit_identical(stored):
    S, path = stored
    kw = dict(n_resamples=199, seed=11, methods=["bca", "percentile", "t"], chunk_size=17)
    mem = bootstrap_edges(S, **kw)
    cols = Recording(path, max_bytes=4 * N * 50)
    disk = bootstrap_edges(cols, **kw)
    for m in mem.intervals:
        np.testing.assert_array_equal(disk.intervals[m].low, mem.intervals[m].low)
        np.testing.assert_array_equal(disk.intervals[m].high, mem.intervals[m].high)
        np.testing.assert_array_equal(disk.pvalues[m], mem.pvalues[m])
    np.testing.assert_array_equal(disk.qvalue, mem.qvalue)
    np.testing.assert_array_equal(disk.standard_error, mem.standard_error)
    assert max(cols.widths) <= 50 + 17  # a block, or a chunk straddling its end: never all 301 edges


def test_stability_with_data_level_from_blocks_is_bit_identical(stored):
    S, path = stored
    kw = dict(ks=(5, 20, 60), ranking="absolute", n_resamples=40, seed=5, n_outer=50, n_inner=10,
              n_rank_resamples=5, chunk_size=23)
    mem = circuit_stability(S, **kw)
    cols = Recording(path, max_bytes=4 * N * 70)
    disk = circuit_stability(cols, **kw)
    assert mem.params["data_level"]["computed"] and np.isfinite(mem.per_k["jaccard_data_ci_low"]).all()
    assert set(disk.per_k) == set(mem.per_k)
    for c in mem.per_k:
        np.testing.assert_array_equal(disk.per_k[c], mem.per_k[c], err_msg=c)
    np.testing.assert_array_equal(disk.inclusion_counts, mem.inclusion_counts)
    assert max(cols.widths) <= 70 + 23


def test_a_nan_edge_in_the_file_is_named_before_any_resampling(stored, tmp_path):
    S, _ = stored
    bad = S.copy()
    bad[3, 250] = np.nan
    path = write_matrix(bad, tmp_path / "bad.parquet", allow_nan=True)
    cols = ParquetColumns(path, max_bytes=4 * N * 64)
    with pytest.raises(ValueError, match=r"NaN/inf in 1 edge\(s\) \(first: \[250\]\)"):
        check_score_matrix(cols)
    with pytest.raises(IndexError, match="S\\[:, a:b\\]"):
        cols[0]
