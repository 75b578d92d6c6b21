"""Reading a run directory's tables for the summaries and the HTML report: `Tables` and column helpers.

`Tables` reads each Parquet table once, lazily; `need` raises `Missing` (its message names the
table or column the run lacks). The helpers turn columns into numpy arrays or Python strings with
NaN / '' for nulls, so a summary never trips over a missing value. Torch-free and stats-free: the
report renders where only pyarrow and numpy are installed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from circuitstat.core.tables import read_table

__all__ = ["Missing", "Tables", "num", "ints", "strs", "first", "flag", "sub", "methods_in", "order_methods", "rows", "where"]


class Missing(Exception):
    """A table or column a summary or section needs is not in the run directory; the message says which."""


class Tables:
    """Lazily read, cached Parquet tables of one run directory."""

    def __init__(self, run_dir: Path, prefix: str = "") -> None:
        self.dir = Path(run_dir)
        self.prefix = prefix  # where run_dir sits in the run (e.g. "model-0/" of a cross-seed run), for `name`
        self._cache: dict[str, pa.Table | None] = {}

    def name(self, table: str) -> str:
        """Return table `table`'s path inside the whole run, without .parquet (what an interval names)."""
        return self.prefix + table

    def path(self, name: str) -> Path:
        """Return the path of table `name` in the run directory."""
        return self.dir / f"{name}.parquet"

    def has(self, name: str) -> bool:
        """Return whether the run holds table `name` with at least one row."""
        t = self.get(name)
        return t is not None and t.num_rows > 0

    def get(self, name: str) -> pa.Table | None:
        """Return table `name` (read once, then cached), or None when the run lacks it."""
        if name not in self._cache:
            p = self.path(name)
            self._cache[name] = read_table(p) if p.exists() else None
        return self._cache[name]

    def need(self, name: str, columns: Sequence[str] = ()) -> pa.Table:
        """Return table `name`, raising Missing when it, a column of `columns` or its rows are absent."""
        t = self.get(name)
        if t is None:
            raise Missing(f"{name}.parquet is not in this run directory, so this part is omitted.")
        lacking = [c for c in columns if c not in t.column_names]
        if lacking:
            raise Missing(f"{name}.parquet lacks column(s) {', '.join(lacking)}, so this part is omitted.")
        if t.num_rows == 0:
            raise Missing(f"{name}.parquet is empty, so this part is omitted.")
        return t


def num(t: pa.Table, col: str) -> np.ndarray:
    """Return column `col` as float64 (nulls and absent columns -> NaN; booleans -> 0/1)."""
    if col not in t.column_names:
        return np.full(t.num_rows, np.nan)
    c = t.column(col)
    if pa.types.is_boolean(c.type):
        c = c.cast(pa.int8())
    return c.cast(pa.float64()).to_numpy(zero_copy_only=False)


def ints(t: pa.Table, col: str) -> np.ndarray:
    """Return column `col` as int64 (nulls -> -1)."""
    c = t.column(col)
    return c.cast(pa.int64()).fill_null(-1).to_numpy(zero_copy_only=False)


def strs(t: pa.Table, col: str) -> list[str]:
    """Return column `col` as Python strings (nulls and absent columns -> '')."""
    if col not in t.column_names:
        return [""] * t.num_rows
    return ["" if v is None else str(v) for v in t.column(col).to_pylist()]


def first(t: pa.Table, col: str) -> str:
    """Return the first row of text column `col` ('' for an empty table or an absent column)."""
    if not t.num_rows or col not in t.column_names:
        return ""
    v = t.column(col)[0].as_py()  # one cell: a million-row table is not converted to get it
    return "" if v is None else str(v)


def flag(value: float) -> bool | None:
    """Return a 0/1 flag read by `num` as a bool, None where it is NaN (no flag recorded)."""
    return None if math.isnan(value) else bool(value)


def sub(t: pa.Table, mask: np.ndarray) -> pa.Table:
    """Return the rows of `t` where `mask` is true."""
    return t.filter(pa.array(np.asarray(mask, dtype=bool)))


def methods_in(t: pa.Table | None) -> list[str]:
    """Return the methods of table `t` in order of first appearance ([] without the table or column)."""
    if t is None or "method" not in t.column_names:
        return []
    uniq = pc.unique(t.column("method")).to_pylist()  # in order of first appearance, as dict.fromkeys
    return list(dict.fromkeys("" if v is None else str(v) for v in uniq))


def order_methods(names: Sequence[str]) -> list[str]:
    """Return methods with 'exact' first, then in order of first appearance."""
    uniq = list(dict.fromkeys(n for n in names if n))
    return sorted(uniq, key=lambda m: (m != "exact", uniq.index(m)))


def rows(t: pa.Table | None, **eq: Any) -> list[dict[str, Any]]:
    """Return the rows of `t` whose columns equal `eq` as dicts ([] without the table or a column of `eq`)."""
    return [] if (s := where(t, **eq)) is None else s.to_pylist()


def where(t: pa.Table | None, **eq: Any) -> pa.Table | None:
    """Return the rows of `t` whose columns equal `eq` as a table (None without the table or a column of `eq`)."""
    if t is None or any(col not in t.column_names for col in eq):
        return None
    mask = pa.array(np.ones(t.num_rows, dtype=bool))
    for col, v in eq.items():
        mask = pc.and_(mask, pc.fill_null(pc.equal(t.column(col), v), False))
    return t.filter(mask)
