"""Parquet report tables: bit-exact matrices, provenance, atomic writes."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import circuitstat.core.tables as tables
from circuitstat.core.atomic import TMP_SUFFIX, cleanup_temp_files
from circuitstat.core.provenance import provenance
from circuitstat.core.tables import matrix_to_table, read_provenance, read_table, table_to_matrix, write_matrix, write_table

ROOT = Path(__file__).resolve().parents[2]


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def test_matrix_round_trip_bit_exact_with_provenance(tmp_path):
    rng = np.random.default_rng(0)
    m = rng.standard_normal((37, 129)).astype(np.float32)
    m[0, :4] = [np.float32(1e-45), -0.0, np.inf, np.finfo(np.float32).max]  # subnormal, signed zero, inf
    prov = provenance(method="eap", params={"k": 5}, seed=np.random.SeedSequence(7))
    path = write_matrix(m, tmp_path / "scores.parquet", {"example": np.arange(37)}, prov)
    t = read_table(path)
    assert t.schema.field("scores").type == pa.list_(pa.float32(), 129)
    assert t.column("example").to_pylist() == list(range(37))
    back = table_to_matrix(t)
    assert back.dtype == np.float32 and back.shape == (37, 129)
    assert np.array_equal(bits(back), bits(m))
    assert read_provenance(path) == prov
    assert read_provenance(t) == prov


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(0, 20), st.integers(1, 40)),
        elements=st.floats(width=32, allow_nan=True, allow_infinity=True),
    )
)
def test_round_trip_random_shapes_and_values(m):
    with tempfile.TemporaryDirectory() as d:
        path = write_table(matrix_to_table(m, allow_nan=True), Path(d) / "m.parquet", {"n": m.shape[0]})
        back = table_to_matrix(read_table(path))
        assert back.shape == m.shape
        assert np.array_equal(bits(back), bits(m))  # NaN payloads and -0.0 included
        assert read_provenance(path) == {"n": m.shape[0]}


def test_matrix_to_table_shares_memory_and_slices_correctly():
    m = np.arange(20, dtype=np.float32).reshape(5, 4)
    t = matrix_to_table(m)
    assert np.shares_memory(table_to_matrix(t), m)
    assert np.array_equal(table_to_matrix(t.slice(2, 2)), m[2:4])
    chunked = pa.concat_tables([t.slice(0, 2), t.slice(2, 3)])
    assert np.array_equal(table_to_matrix(chunked), m)


def test_nan_refused_with_fix_unless_allowed():
    m = np.zeros((3, 2), np.float32)
    m[1, 1] = np.nan
    with pytest.raises(ValueError, match=r"1 NaN.*example 1, column 1.*allow_nan=True"):
        matrix_to_table(m)
    assert np.isnan(table_to_matrix(matrix_to_table(m, allow_nan=True))[1, 1])


def test_float64_is_cast_to_float32_as_documented():
    m = np.array([[0.1, 1 / 3]], dtype=np.float64)
    t = matrix_to_table(m)
    assert t.schema.field("scores").type.value_type == pa.float32()
    assert np.array_equal(table_to_matrix(t), m.astype(np.float32))


def test_bad_matrices_and_index_columns():
    with pytest.raises(ValueError, match="2-D"):
        matrix_to_table(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="0 columns"):
        matrix_to_table(np.zeros((3, 0), np.float32))
    with pytest.raises(ValueError, match="has 2 values but the matrix has 3 rows"):
        matrix_to_table(np.zeros((3, 1), np.float32), {"example": [0, 1]})
    with pytest.raises(ValueError, match="matrix_to_table"):
        write_table({"scores": np.zeros((3, 2))}, "unused.parquet")


def test_dataframe_and_dict_tables_get_provenance(tmp_path):
    p = write_table(pd.DataFrame({"edge": ["a", "b"], "est": [1.0, 2.0]}), tmp_path / "e.parquet")
    assert read_provenance(p)["package"]["name"] == "circuitstat"  # a default provenance, never none
    assert read_table(p).to_pandas()["edge"].tolist() == ["a", "b"]
    # Rewriting a read table keeps its provenance.
    q = write_table(read_table(p), tmp_path / "f.parquet")
    assert read_provenance(q) == read_provenance(p)


def test_failed_write_keeps_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "t.parquet"
    write_table({"x": [1, 2, 3]}, path, {"v": 1})

    real = pq.write_table

    def crash_half_way(table, where, **kw):
        real(table, where, **kw)
        where.truncate(where.tell() // 2)  # a partial file on disk ...
        raise OSError("disk full")  # ... then the writer dies

    monkeypatch.setattr(tables.pq, "write_table", crash_half_way)
    with pytest.raises(OSError, match="disk full"):
        write_table({"x": [4, 5, 6, 7]}, path, {"v": 2})
    assert read_table(path).column("x").to_pylist() == [1, 2, 3]
    assert read_provenance(path) == {"v": 1}
    assert sorted(os.listdir(tmp_path)) == ["t.parquet"]


KILL_MID_WRITE = textwrap.dedent(
    """
    import io, os, signal, sys
    import numpy as np, pyarrow.parquet as pq
    from circuitstat.core.tables import matrix_to_table, write_table
    real = pq.write_table
    def die_half_way(table, where, **kw):
        buf = io.BytesIO(); real(table, buf, **kw)
        where.write(buf.getvalue()[: len(buf.getvalue()) // 2]); where.flush(); os.fsync(where.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
    pq.write_table = die_half_way
    write_table(matrix_to_table(np.ones((100, 50), np.float32)), sys.argv[1])
    """
)


@pytest.mark.parametrize("existing", [False, True])
def test_sigkill_mid_write_leaves_no_partial_table(tmp_path, existing):
    path = tmp_path / "scores.parquet"
    if existing:
        write_matrix(np.zeros((2, 3), np.float32), path)
    proc = subprocess.run([sys.executable, "-c", KILL_MID_WRITE, str(path)], cwd=ROOT)
    assert proc.returncode == -signal.SIGKILL
    temps = [p for p in tmp_path.iterdir() if p.name.endswith(TMP_SUFFIX)]
    assert len(temps) == 1 and temps[0].name.startswith(".")  # hidden from *.parquet globs
    if existing:
        assert np.array_equal(table_to_matrix(read_table(path)), np.zeros((2, 3), np.float32))
    else:
        assert not path.exists()
    assert cleanup_temp_files(tmp_path) == temps
    assert [p.name for p in tmp_path.iterdir()] == (["scores.parquet"] if existing else [])


@pytest.mark.parametrize("values", [
    np.arange(5, dtype=np.int32), np.arange(5, dtype=np.uint8), np.linspace(0, 1, 7), np.float32([1.5, -2.0]),
    np.array([True, False, True, True, False, False, True, False, True]), np.array(["a", "bé", ""]),
    ["x", "a1.h3<q>", "m0->logits", ""], np.arange(10)[::3], [1, 2, 3], ["a", None], np.array([], dtype=np.int64),
])
def test_arrow_array_equals_pyarrows_own_conversion(values):
    from circuitstat.core.tables import arrow_array

    got, want = arrow_array(values), pa.array(values)
    assert got.type == want.type and got.equals(want)


def test_to_arrow_of_an_edge_table_does_not_import_pandas():
    import subprocess
    import sys

    code = ("import sys; from circuitstat.circuits.graph import ComponentGraph; from circuitstat.core.tables import to_arrow; "
            "t = to_arrow(ComponentGraph(2, 3, True, False).edge_table()); assert t.num_rows > 0; "
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
