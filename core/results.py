"""The one result contract: every analysis returns a `Result` (the ground floor; circuits/ and stats/ build on it).

A result carries its estimate and uncertainty as attributes (scipy style) and answers, whatever
produced it (statsmodels style):

* ``to_table(name=None)`` / ``tables()`` / ``table_names()``: its tables as pyarrow tables, with the
  parameters that produced them in the schema metadata; every table name is registered in
  core/schema.py (the Result tables in core/schema_results.py);
* ``summary()``: a short text;
* ``conf_int(alpha=None, which=None) -> ConfInt``: one interval of the result (``which``; default
  its primary one) with the estimand it covers and its level; ``interval_names()`` lists them.
  The intervals are the ``<prefix>_low/_high`` column pairs its tables' schemas declare, so every
  result with an interval answers the same way and the estimand is the one its table states;
* ``write(run_dir)``: its tables into a run directory, always through
  :class:`circuitstat.core.rundir.RunDir`, so each is checked against its schema and carries provenance.
"""

from __future__ import annotations

import json
import os
from collections import namedtuple
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa

from circuitstat.core.errors import InputError
from circuitstat.core.provenance import to_jsonable  # the one JSON conversion (the ground floor; no torch)

if TYPE_CHECKING:
    from circuitstat.core.rundir import RunDir

__all__ = ["ConfidenceInterval", "ConfInt", "MethodIntervals", "Result"]

# Same field names as scipy.stats' ConfidenceInterval, so code written for scipy results works.
ConfidenceInterval = namedtuple("ConfidenceInterval", ["low", "high"])

PARAMS_KEY = b"circuitstat.params"
RESULT_KEY = b"circuitstat.result"
TABLE_KEY = b"circuitstat.table"


class ConfInt(NamedTuple):
    """What ``conf_int`` returns: bounds per row, what they cover, their level and which interval they are."""

    low: np.ndarray
    high: np.ndarray
    estimand: str
    level: float
    name: str

    def to_array(self) -> np.ndarray:
        """Return the bounds as an [n, 2] array (statsmodels' ``conf_int()`` shape)."""
        return np.stack([np.asarray(self.low, dtype=np.float64), np.asarray(self.high, dtype=np.float64)], axis=-1)


def _column(values: Any) -> pa.Array:
    """Return a pyarrow array for one column (numpy arrays kept at their dtype)."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values
    arr = np.asarray(values)
    if arr.dtype.kind in "US":
        return pa.array(arr.tolist(), type=pa.string())
    if arr.dtype.kind == "O":
        return pa.array(arr.tolist())
    return pa.array(arr)


def _columns(table: Any) -> list[str]:
    return list(table.column_names) if isinstance(table, pa.Table) else list(table)


def _values(table: Any, column: str) -> np.ndarray:
    if isinstance(table, pa.Table):
        return np.asarray(table.column(column).to_numpy(zero_copy_only=False))
    return np.asarray(table[column])


def _estimand(table: Any, covers: str) -> str:
    """The estimand of a table's interval: its ``estimand`` column when it has one, else what the schema says."""
    if "estimand" in _columns(table):
        values = list(dict.fromkeys(str(v) for v in _values(table, "estimand").tolist()))
        if values:
            return " | ".join(values)
    return covers


class Result:
    """Base class: subclasses fill `params` and implement `_tables()` and `_summary_items()`."""

    #: name of the table returned by `to_table()` without an argument
    main_table: str = "main"
    #: the interval ``conf_int()`` returns without ``which`` (None: the main table's first declared one)
    primary_interval: str | None = None
    #: the run kind a run directory ``write`` creates records in its manifest (None: not a command's run)
    run_kind: str | None = None

    params: dict

    def _tables(self) -> dict[str, dict[str, Any]]:
        """Return {table name: {column name: 1-D array}}; subclasses override."""
        raise NotImplementedError

    def _summary_items(self) -> list[tuple[str, Any]]:
        """Return (label, value) pairs shown by `summary()`; subclasses override."""
        return []

    # --- tables -----------------------------------------------------------------------------
    def table_names(self) -> list[str]:
        """Return the names accepted by `to_table`."""
        return list(self._tables().keys())

    def to_table(self, name: str | None = None) -> pa.Table:
        """Return one result table (default: the main one) with params in schema metadata."""
        tables = self._tables()
        name = self.main_table if name is None else name
        if name not in tables:
            raise KeyError(f"unknown table {name!r}; this result has {sorted(tables)}")
        table = pa.table({k: _column(v) for k, v in tables[name].items()})
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

    # --- intervals ----------------------------------------------------------------------------
    def interval_level(self) -> float:
        """Return the level of this result's intervals (its ``confidence_level``, else ``params``')."""
        level = getattr(self, "confidence_level", None)
        if not isinstance(level, (float, int, np.floating)):
            level = self.params.get("confidence_level")
        if level is None:
            raise TypeError(f"{type(self).__name__} records no confidence_level; put it in its params")
        return float(level)

    def _interval_tables(self) -> dict[str, Any]:
        """Return {table name: columns} the intervals are read from (default: ``_tables()``, no Arrow)."""
        return self._tables()

    def _intervals(self) -> dict[str, ConfInt]:
        """Return {name: interval} of every declared interval of the tables (``<table>.<prefix>``; the main
        table's also by ``<prefix>`` alone). Subclasses add names (e.g. one per interval method)."""
        from circuitstat.core.schema import schema_for

        tables = self._interval_tables()
        out: dict[str, ConfInt] = {}
        for name in sorted(tables, key=lambda n: n != self.main_table):  # the main table first
            schema = schema_for(name)
            if schema is None:
                continue
            table, present = tables[name], set(_columns(tables[name]))
            for prefix, covers in schema.intervals().items():
                if f"{prefix}_low" not in present:
                    continue
                ci = ConfInt(_values(table, f"{prefix}_low"), _values(table, f"{prefix}_high"),
                             _estimand(table, covers), self.interval_level(), f"{name}.{prefix}")
                out[ci.name] = ci
                if name == self.main_table:
                    out.setdefault(prefix, ci)
        return out

    def interval_names(self) -> list[str]:
        """Return the names ``conf_int(which=...)`` accepts (empty: this result carries no interval)."""
        return list(self._intervals())

    def conf_int(self, alpha: float | None = None, which: str | None = None) -> ConfInt:
        """Return one interval (``which``; default the primary one) as a :class:`ConfInt`.

        ``alpha``: 1 - the confidence level, checked against the level the intervals were computed at
        (refit with ``confidence_level=1 - alpha`` for another level; None accepts the computed one).
        """
        intervals = self._intervals()
        if not intervals:
            raise TypeError(f"{type(self).__name__} carries no interval (its tables declare none)")
        key = which if which is not None else (self.primary_interval or next(iter(intervals)))
        if key not in intervals:
            raise InputError(f"{type(self).__name__} has no interval {key!r}; use one of {', '.join(intervals)}")
        ci = intervals[key]
        if alpha is not None and not np.isclose(1.0 - float(alpha), ci.level, rtol=0, atol=1e-9):
            raise InputError(f"the intervals of this {type(self).__name__} were computed at level {ci.level:g} "
                             f"(alpha={1 - ci.level:g}), not alpha={alpha:g}; refit with "
                             f"confidence_level={1 - float(alpha):g}")
        return ci

    # --- writing ------------------------------------------------------------------------------
    def table_provenance(self) -> dict:
        """Return what every written table records beyond its parameters (subclasses add models, probes...)."""
        return {}

    def run_spec(self) -> dict:
        """Return the spec recorded in the manifest of a run directory ``write`` creates."""
        return {"result": type(self).__name__, "params": to_jsonable(self.params, repr)}

    def write(self, run_dir: "RunDir | str | os.PathLike", *, under: str | None = None) -> dict[str, Path]:
        """Write every table as ``<run_dir>/[<under>/]<name>.parquet`` through RunDir; return {name: path}.

        ``run_dir``: an open :class:`circuitstat.core.rundir.RunDir` (e.g. inside a stage of a larger run) or a
        path, opened as one (manifest.json, lock, atomic writes). Every table is validated against its
        registered schema; a table without one is refused (register it in core/schema_results.py).
        """
        from circuitstat.core.rundir import RunDir
        from circuitstat.core.schema import SchemaError, schema_for

        tables = self.tables()
        missing = [n for n in tables if schema_for(n) is None]
        if missing:
            raise SchemaError(f"{type(self).__name__} tables {missing} have no registered schema; register them in "
                              "core/schema_results.py so write can check them")
        if not isinstance(run_dir, RunDir):
            with RunDir(run_dir, spec=self.run_spec(), kind=self.run_kind) as run:
                return self.write(run, under=under)
        prov = self.table_provenance()
        return {n: run_dir.write_table(f"{under}/{n}" if under else n, t, provenance=prov or None)
                for n, t in tables.items()}

    def __repr__(self) -> str:
        return self.summary()


class MethodIntervals:
    """Mixin of a Result whose one estimate has an interval per method (``intervals``: {method: interval},
    ``method`` the primary one, ``estimand``, ``confidence_level``): ``conf_int(which="bca")`` and the like."""

    @property
    def primary_interval(self) -> str:
        """Return the name of the primary interval: its method."""
        return self.method

    def _intervals(self) -> dict[str, ConfInt]:
        """Every computed interval by method name, then the table's."""
        by_method = {m: ConfInt(np.atleast_1d(ci.low), np.atleast_1d(ci.high), self.estimand,
                                float(self.confidence_level), m) for m, ci in self.intervals.items()}
        return {**by_method, **super()._intervals()}


def _fmt(v: Any) -> str:
    """Return a compact string for a summary value."""
    if isinstance(v, (float, np.floating)):
        return f"{v:.6g}"
    return str(v)
