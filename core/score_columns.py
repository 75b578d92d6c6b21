"""A score matrix [N examples, E edges] read from Parquet in blocks of edge columns, never whole.

Score tables hold one row per example with a fixed-size list of E float32 (circuitstat.core.tables); at
1.6 M edges x 512 examples that is 3.3 GB, and float64 copies or [E, B] resample arrays of it do not fit a
laptop. :class:`ParquetColumns` is an array-like the resampling engine (circuitstat.stats.resampling) slices
as ``S[:, a:b]``: it reads the file one row group at a time (at most circuitstat.core.tables.ROW_GROUP_BYTES
each, as write_table writes them) and keeps one block of at most ``max_bytes`` of columns, so the engine's
consecutive edge chunks cost one pass over the file per block. Converting it to a whole array is refused
(``__array__`` raises), so no caller loads it by accident. :func:`column_blocks` and :func:`column_means`
walk an in-memory array or a ParquetColumns the same way.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Iterator

import numpy as np

from .tables import SCORES_COLUMN

__all__ = ["ParquetColumns", "column_blocks", "column_means", "DEFAULT_BLOCK_BYTES"]

DEFAULT_BLOCK_BYTES = 1 * 2**30
"""float32 bytes of edge columns a ParquetColumns keeps at once (1.6 M x 512: four passes over the file)."""


class ParquetColumns:
    """The [N, E] float32 matrix in ``column`` of a Parquet score table, read in blocks of edge columns."""

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(self, path: "str | os.PathLike[str]", column: str = SCORES_COLUMN, *,
                 max_bytes: int = DEFAULT_BLOCK_BYTES) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path = Path(path)
        self.column = column
        self._file = pq.ParquetFile(self.path)
        schema = self._file.schema_arrow
        if column not in schema.names:
            raise KeyError(f"{self.path.name} has no column {column!r}; columns are {schema.names}")
        t = schema.field(column).type
        if not pa.types.is_fixed_size_list(t) or not pa.types.is_floating(t.value_type):
            raise TypeError(f"column {column!r} has type {t}, not a fixed-size list of floats (one row per example)")
        self.shape = (int(self._file.metadata.num_rows), int(t.list_size))
        self.block = max(1, int(max_bytes) // (4 * max(1, self.shape[0])))  # edges per kept block
        self._kept: tuple[int, int, np.ndarray] | None = None
        self._lock = threading.Lock()
        self.passes = 0  # passes over the file so far (each reads every row group once)

    def __array__(self, *args, **kwargs):
        raise TypeError(f"ParquetColumns of {self.shape[0]} x {self.shape[1]} is read in blocks of edges "
                        "(S[:, a:b], column_blocks); converting it whole would load every score")

    def __getitem__(self, key) -> np.ndarray:
        rows, cols = key if isinstance(key, tuple) and len(key) == 2 else (None, None)
        if rows != slice(None) or not isinstance(cols, slice) or cols.step not in (None, 1):
            raise IndexError("ParquetColumns takes S[:, a:b] (all examples, a contiguous range of edges)")
        start, stop, _ = cols.indices(self.shape[1])
        stop = max(start, stop)
        with self._lock:
            kept = self._kept
            if kept is None or not (kept[0] <= start and stop <= kept[1]):
                hi = max(stop, min(self.shape[1], start + self.block))
                kept = self._kept = (start, hi, self._read(start, hi))
            return kept[2][:, start - kept[0]:stop - kept[0]]

    def _read(self, start: int, stop: int) -> np.ndarray:
        """Columns start..stop-1 of every example, one row group decoded at a time (float32 [N, stop-start])."""
        out = np.empty((self.shape[0], stop - start), dtype=np.float32)
        row = 0
        for g in range(self._file.metadata.num_row_groups):
            col = self._file.read_row_group(g, columns=[self.column]).column(0)
            for chunk in col.chunks:
                if chunk.null_count:
                    raise ValueError(f"column {self.column!r} has null rows; a score matrix cannot miss examples")
                values = chunk.flatten().to_numpy(zero_copy_only=False).reshape(len(chunk), self.shape[1])
                out[row:row + len(chunk)] = values[:, start:stop]
                row += len(chunk)
        self.passes += 1
        return out

    def blocks(self) -> Iterator[tuple[slice, np.ndarray]]:
        """Yield (edge slice, float32 [N, c] columns) over all edges, one kept block at a time."""
        for s in range(0, self.shape[1], self.block):
            sl = slice(s, min(s + self.block, self.shape[1]))
            yield sl, self[:, sl]


def column_blocks(S, max_bytes: int = DEFAULT_BLOCK_BYTES) -> Iterator[tuple[slice, np.ndarray]]:
    """Yield (edge slice, [N, c] columns) covering S [N, E]: a ParquetColumns' blocks, or slices of an array
    of at most ``max_bytes`` as float64."""
    if hasattr(S, "blocks"):
        yield from S.blocks()
        return
    n, e = S.shape
    step = max(1, int(max_bytes) // (8 * max(1, n)))
    for s in range(0, e, step):
        sl = slice(s, min(s + step, e))
        yield sl, S[:, sl]


def column_means(S) -> np.ndarray:
    """The float64 mean over examples of every edge of S [N, E], block by block (never a float64 copy of S; a
    column's sum runs over the examples in the same order as ``S.astype(float64).mean(0)``: the same bits)."""
    return np.concatenate([np.asarray(b, dtype=np.float64).mean(axis=0) for _, b in column_blocks(S, 2**28)])
