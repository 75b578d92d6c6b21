"""The one report writer: Parquet tables with provenance in their schema metadata, written atomically."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from circuitstat.core.atomic import atomic_write
from circuitstat.core.provenance import provenance as _base_provenance, to_jsonable

PROVENANCE_KEY = b"circuitstat.provenance"
SCORES_COLUMN = "scores"

if TYPE_CHECKING:
    import pandas as pd

TableLike = Union[pa.Table, "pd.DataFrame", Mapping[str, Any]]


def to_arrow(table: TableLike) -> pa.Table:
    """Return `table` (Arrow table, pandas DataFrame or dict of columns) as a pyarrow Table."""
    if isinstance(table, pa.Table):
        return table
    # pandas is not imported here (it costs ~0.4 s); a DataFrame can exist only if it already was.
    pd = sys.modules.get("pandas")
    if pd is not None and isinstance(table, pd.DataFrame):
        # A default RangeIndex carries no information; a named/real index is kept as a column.
        return pa.Table.from_pandas(table, preserve_index=None)
    if isinstance(table, Mapping):
        for name, col in table.items():
            if isinstance(col, np.ndarray) and col.ndim != 1:
                raise ValueError(
                    f"column {name!r} has shape {col.shape}; columns must be 1-D. "
                    "Store a per-example matrix with matrix_to_table(matrix, index_columns=...)"
                )
        return pa.Table.from_pydict({name: arrow_array(col) for name, col in table.items()})
    raise TypeError(f"write_table needs a pyarrow Table, pandas DataFrame or dict of columns, not {type(table).__name__}")


def with_provenance(table: pa.Table, provenance: Mapping[str, Any]) -> pa.Table:
    """Return `table` with `provenance` stored as JSON under schema metadata key b'circuitstat.provenance'."""
    meta = dict(table.schema.metadata or {})
    meta[PROVENANCE_KEY] = json.dumps(to_jsonable(provenance), sort_keys=True, allow_nan=False).encode()
    return table.replace_schema_metadata(meta)


def write_table(
    table: TableLike,
    path: str | os.PathLike[str],
    provenance: Mapping[str, Any] | None = None,
    *,
    compression: str = "zstd",
) -> Path:
    """Write `table` to Parquet at `path` atomically (temp file, fsync, rename) and return the path.

    `provenance` is stored in the schema metadata. When it is None, provenance already in the
    table's metadata is kept, else a minimal provenance() (versions, timestamp) is recorded, so
    every report table carries one.
    """
    path = Path(path)
    t = to_arrow(table)
    if provenance is None:
        existing = (t.schema.metadata or {}).get(PROVENANCE_KEY)
        prov = json.loads(existing) if existing else _base_provenance()
    else:
        prov = dict(provenance)
    t = with_provenance(t, prov)
    with atomic_write(path) as f:
        pq.write_table(t, f, compression=compression, row_group_size=rows_per_group(t))
    return path


ROW_GROUP_BYTES = 64 * 2**20
"""Bytes of one Parquet row group at most (decoded): a reader holds one group at a time, so a score matrix of
1.6 M edges x 512 examples (3.3 GB) is read in bounded memory (circuitstat.core.score_columns)."""


def rows_per_group(table: pa.Table) -> int:
    """Rows per Parquet row group for ``table``: at most :data:`ROW_GROUP_BYTES` each, at least one row (a
    table of small rows stays one group, as pyarrow's default writes it)."""
    if table.num_rows == 0:
        return 1024 * 1024
    per_row = max(1, table.nbytes // table.num_rows)
    return int(max(1, min(1024 * 1024, ROW_GROUP_BYTES // per_row)))


def read_table(path: str | os.PathLike[str], columns: list[str] | None = None) -> pa.Table:
    """Return the Parquet table at `path` (metadata incl. provenance kept in its schema), with the current names
    of columns renamed since it was written (core/schema.py RENAMED_COLUMNS; the table's name is the file's stem)."""
    from circuitstat.core.schema import RENAMED_COLUMNS, renamed, stored_names

    name = Path(path).stem
    if columns is not None and name in RENAMED_COLUMNS:
        columns = stored_names(name, list(columns), pq.read_schema(path).names)
    return renamed(name, pq.read_table(path, columns=columns, memory_map=True))


def read_provenance(source: str | os.PathLike[str] | pa.Table | pa.Schema) -> dict[str, Any]:
    """Return the provenance dict of a Parquet file, Table or Schema; {} if it has none."""
    if isinstance(source, pa.Table):
        schema = source.schema
    elif isinstance(source, pa.Schema):
        schema = source
    else:
        schema = pq.read_schema(source)  # reads only the footer
    raw = (schema.metadata or {}).get(PROVENANCE_KEY)
    return json.loads(raw) if raw else {}


def _as_float32(matrix: np.ndarray, allow_nan: bool) -> np.ndarray:
    m = np.asarray(matrix)
    if m.ndim != 2:
        raise ValueError(f"expected a 2-D [examples, edges] matrix, got shape {m.shape}")
    if m.shape[1] == 0:
        # Arrow cannot represent a fixed-size list of size 0.
        raise ValueError("the matrix has 0 columns (edges/nodes); a score matrix needs at least one")
    if not (np.issubdtype(m.dtype, np.floating) or np.issubdtype(m.dtype, np.integer) or m.dtype == np.bool_):
        raise ValueError(f"score matrix must be real numbers, got dtype {m.dtype}")
    # Documented behaviour: scores are stored as float32 (the project's accumulation type); other
    # dtypes, float64 included, are cast to float32 here (round-to-nearest).
    m = np.ascontiguousarray(m, dtype=np.float32)
    if not allow_nan:
        nan = np.isnan(m)
        if nan.any():
            rows, cols = np.nonzero(nan)
            raise ValueError(
                f"score matrix contains {rows.size} NaN value(s) (first at example {rows[0]}, column {cols[0]}); "
                "fix the metric/inputs that produce them or drop those examples, "
                "or pass allow_nan=True to store NaNs deliberately"
            )
    return m


def arrow_array(values: Any) -> pa.Array | pa.ChunkedArray:
    """Return ``values`` as the Arrow array ``pa.array`` would make, without importing pandas.

    pyarrow's ``pa.array`` imports pandas on its first call to look for pandas types (0.4-0.7 s of
    a command's start-up); 1-D numeric and boolean arrays and lists of strings, the columns our
    tables hold, are wrapped from their buffers instead. Anything else goes to ``pa.array``.
    """
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values
    if isinstance(values, (list, tuple)) and values and all(type(v) is str for v in values):
        return _string_array(values)
    if isinstance(values, np.ndarray) and values.ndim == 1:
        if values.dtype.kind in "iuf" and values.dtype.byteorder in "=|" and values.dtype != np.float16:
            a = np.ascontiguousarray(values)
            return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), len(a), [None, pa.py_buffer(a)])
        if values.dtype.kind == "b":
            bits = np.packbits(values, bitorder="little")  # Arrow booleans are LSB-first bitmaps
            return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])
        if values.dtype.kind == "U":
            return _string_array(values.tolist())
    return pa.array(values)


def _string_array(values: Sequence[str]) -> pa.Array:
    """A utf8 array from Python strings: offsets and data buffers built directly."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    kind, dtype = (pa.string(), np.int32) if offsets[-1] < 2**31 else (pa.large_string(), np.int64)
    return pa.Array.from_buffers(kind, len(encoded), [None, pa.py_buffer(offsets.astype(dtype)),
                                                      pa.py_buffer(b"".join(encoded))])


def _index_array(values: Any) -> pa.Array | pa.ChunkedArray:
    """Return an index column as Arrow, integers as int64 and floats as float64 (see arrow_array)."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values
    a = np.asarray(values)
    if a.ndim == 1 and a.dtype.kind in "iuf" and a.dtype != np.uint64:
        return arrow_array(np.ascontiguousarray(a, np.float64 if a.dtype.kind == "f" else np.int64))
    return arrow_array(values)


def matrix_to_table(
    matrix: np.ndarray,
    index_columns: Mapping[str, Any] | None = None,
    *,
    column: str = SCORES_COLUMN,
    allow_nan: bool = False,
) -> pa.Table:
    """Return a table with one row per example: `index_columns` then `column` as fixed_size_list<float32>[E].

    `matrix` is [N, E]; non-float32 input (float64 included) is cast to float32. NaN raises a
    ValueError unless allow_nan=True. The values buffer is shared with the float32 array (no copy).
    """
    m = _as_float32(matrix, allow_nan)
    n, e = m.shape
    cols: dict[str, pa.Array] = {}
    for name, values in (index_columns or {}).items():
        if name == column:
            raise ValueError(f"index column {name!r} clashes with the matrix column; pass column='...' to rename it")
        arr = _index_array(values)
        if len(arr) != n:
            raise ValueError(f"index column {name!r} has {len(arr)} values but the matrix has {n} rows (examples)")
        cols[name] = arr
    # Wrap the float32 buffer directly: zero-copy, and pa.array would import pandas (~0.4 s).
    flat = pa.Array.from_buffers(pa.float32(), n * e, [None, pa.py_buffer(m)])
    cols[column] = pa.FixedSizeListArray.from_arrays(flat, type=pa.list_(pa.float32(), e))
    return pa.Table.from_pydict(cols)


def table_to_matrix(table: pa.Table, column: str = SCORES_COLUMN) -> np.ndarray:
    """Return the [N, E] float32 matrix stored in `column` (read-only, zero-copy when the column is one chunk).

    Accepts fixed-size lists and equal-length variable lists; other float types are cast to float32.
    """
    if column not in table.column_names:
        raise KeyError(f"table has no column {column!r}; columns are {table.column_names}")
    col = table.column(column)
    arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()  # one chunk: no copy
    t = arr.type
    if pa.types.is_fixed_size_list(t):
        e = t.list_size
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        lengths = np.unique(arr.value_lengths().to_numpy(zero_copy_only=False))
        if lengths.size > 1:
            raise ValueError(f"column {column!r} holds lists of different lengths {lengths.tolist()}; not a matrix")
        e = int(lengths[0]) if lengths.size else 0
    else:
        raise TypeError(f"column {column!r} has type {t}, not a list of floats; was it written by matrix_to_table?")
    if arr.null_count:
        raise ValueError(f"column {column!r} has {arr.null_count} null row(s); a score matrix cannot have missing examples")
    values = arr.flatten()  # respects slice offsets, unlike .values
    if values.null_count:
        raise ValueError(f"column {column!r} has {values.null_count} null value(s); store NaN (allow_nan=True) instead")
    if not pa.types.is_floating(values.type):
        raise TypeError(f"column {column!r} holds {values.type}, not floats")
    if values.type != pa.float32():
        values = values.cast(pa.float32())  # documented: matrices are float32
    return values.to_numpy(zero_copy_only=False).reshape(len(arr), e)


def write_matrix(
    matrix: np.ndarray,
    path: str | os.PathLike[str],
    index_columns: Mapping[str, Any] | None = None,
    provenance: Mapping[str, Any] | None = None,
    *,
    allow_nan: bool = False,
) -> Path:
    """Write an [N, E] matrix as a one-row-per-example table (see matrix_to_table) and return the path."""
    return write_table(matrix_to_table(matrix, index_columns, allow_nan=allow_nan), path, provenance)


__all__ = [
    "PROVENANCE_KEY",
    "matrix_to_table",
    "read_provenance",
    "read_table",
    "table_to_matrix",
    "to_arrow",
    "with_provenance",
    "write_matrix",
    "write_table",
]
