"""Shared result convention: every stats estimator returns a `Result` with tables.

A result carries its estimate and uncertainty as attributes (scipy style) and renders them as
one or more named pyarrow tables (`.to_table(name)`), with the parameters that produced them
recorded in the schema metadata, so reports/ can add provenance without knowing each estimator.
"""

from __future__ import annotations

import json
import os
from collections import namedtuple
from typing import Any

import numpy as np
import pyarrow as pa

from reports.provenance import to_jsonable  # the one JSON conversion (the ground floor; no torch)

__all__ = ["ConfidenceInterval", "Result"]

# Same field names as scipy.stats' ConfidenceInterval, so code written for scipy results works.
ConfidenceInterval = namedtuple("ConfidenceInterval", ["low", "high"])

PARAMS_KEY = b"circuitstat.params"
RESULT_KEY = b"circuitstat.result"
TABLE_KEY = b"circuitstat.table"


def _column(values: Any) -> pa.Array:
    """Return a pyarrow array for one column (numpy arrays kept at their dtype)."""
    if isinstance(values, pa.Array):
        return values
    arr = np.asarray(values)
    if arr.dtype.kind in "US":
        return pa.array(arr.tolist(), type=pa.string())
    if arr.dtype.kind == "O":
        return pa.array(arr.tolist())
    return pa.array(arr)


class Result:
    """Base class: subclasses fill `params` and implement `_tables()` and `_summary_items()`."""

    #: name of the table returned by `to_table()` without an argument
    main_table: str = "main"

    params: dict

    def _tables(self) -> dict[str, dict[str, Any]]:
        """Return {table name: {column name: 1-D array}}; subclasses override."""
        raise NotImplementedError

    def _summary_items(self) -> list[tuple[str, Any]]:
        """Return (label, value) pairs shown by `summary()`; subclasses override."""
        return []

    # --- public API, identical for every result -------------------------------------------
    def table_names(self) -> list[str]:
        """Return the names accepted by `to_table`."""
        return list(self._tables().keys())

    def to_table(self, name: str | None = None) -> pa.Table:
        """Return one result table (default: the main one) with params in schema metadata."""
        tables = self._tables()
        name = self.main_table if name is None else name
        if name not in tables:
            raise KeyError(f"unknown table {name!r}; this result has {sorted(tables)}")
        cols = tables[name]
        table = pa.table({k: _column(v) for k, v in cols.items()})
        meta = {
            RESULT_KEY: type(self).__name__.encode(),
            TABLE_KEY: name.encode(),
            PARAMS_KEY: json.dumps(to_jsonable(self.params, repr), sort_keys=True, allow_nan=False).encode(),
        }
        return table.replace_schema_metadata(meta)

    def tables(self) -> dict[str, pa.Table]:
        """Return every table of this result by name."""
        return {name: self.to_table(name) for name in self.table_names()}

    def to_pandas(self, name: str | None = None):
        """Return one result table as a pandas DataFrame."""
        return self.to_table(name).to_pandas()

    def summary(self) -> str:
        """Return a short human-readable text summary (statsmodels style)."""
        items = [("result", type(self).__name__)] + self._summary_items()
        width = max(len(k) for k, _ in items)
        lines = [f"{k:<{width}}  {_fmt(v)}" for k, v in items]
        bar = "=" * max(len(s) for s in lines)
        return "\n".join([bar, *lines, bar])

    def write(self, directory: str | os.PathLike) -> dict[str, str]:
        """Write every table as `<directory>/<ResultName>.<table>.parquet` atomically; return paths."""
        import pyarrow.parquet as pq

        from reports.atomic import atomic_write

        paths = {}
        for name, table in self.tables().items():
            path = os.path.join(directory, f"{type(self).__name__}.{name}.parquet")
            with atomic_write(path) as f:  # a killed run never leaves half a file
                pq.write_table(table, f)
            paths[name] = path
        return paths

    def __repr__(self) -> str:
        return self.summary()


def _fmt(v: Any) -> str:
    """Return a compact string for a summary value."""
    if isinstance(v, (float, np.floating)):
        return f"{v:.6g}"
    return str(v)
