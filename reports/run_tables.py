"""A finished run directory as a `Result`: the studies return one, and it reads its tables lazily.

A study writes its tables into its run directory as it runs (resumable stages), so its result
does not hold them in memory: ``to_table(name)`` reads ``<run_dir>/<name>.parquet`` when asked,
``summary()`` and ``conf_int()`` read the main table. Same interface as every other result
(stats.results.Result).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from stats.results import ConfidenceInterval, Result

__all__ = ["RunTables"]


@dataclass(repr=False)
class RunTables(Result):
    """Tables of the run directory ``run_dir`` (``names``; ``main_table`` by default), read on demand."""

    run_dir: Path
    names: tuple[str, ...]
    main_table: str = "summary"
    params: dict = field(default_factory=dict)

    def table_names(self) -> list[str]:
        """Return the run's top-level tables."""
        return list(self.names)

    def to_table(self, name: str | None = None) -> pa.Table:
        """Return one table of the run directory (default: the main one), read from disk."""
        from reports.tables import read_table

        name = self.main_table if name is None else name
        path = self.run_dir / f"{name}.parquet"
        if not path.exists():
            raise KeyError(f"the run has no table {name!r}; it has {', '.join(self.names)}")
        return read_table(path)

    def tables(self) -> dict[str, pa.Table]:
        """Return every table of the run by name (each read from disk)."""
        return {n: self.to_table(n) for n in self.names}

    def conf_int(self, name: str | None = None) -> ConfidenceInterval:
        """Return the ``ci_low`` / ``ci_high`` columns of table ``name`` (default: the main one); each
        row's estimand is stated in the table (reports/schema.py)."""
        t = self.to_table(name)
        return ConfidenceInterval(t.column("ci_low").to_numpy(), t.column("ci_high").to_numpy())

    def _summary_items(self) -> list[tuple[str, Any]]:
        t = self.to_table().to_pydict()
        items: list[tuple[str, Any]] = [("run directory", str(self.run_dir))]
        if {"item", "value", "ci_low", "ci_high", "verdict"} <= set(t):
            from stats.intervals import interval_text

            items += [(i, f"{interval_text(v, lo, hi, digits=4)} {vd}".rstrip())
                      for i, v, lo, hi, vd in zip(t["item"], t["value"], t["ci_low"], t["ci_high"], t["verdict"])]
        return items

    def write(self, run_dir: Any = None) -> dict[str, Path]:
        """Return the paths of the tables: a study writes its run directory as it runs (``run_dir`` must be it)."""
        if run_dir is not None and Path(run_dir).resolve() != self.run_dir.resolve():
            raise ValueError(f"the tables are in {self.run_dir}; rerun with --out {run_dir} to write them elsewhere")
        return {n: self.run_dir / f"{n}.parquet" for n in self.names}
