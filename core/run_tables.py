"""A finished run directory as a `Result`: the studies return one, and it reads its tables lazily.

A study writes its tables into its run directory as it runs (resumable stages), so its result
does not hold them in memory: ``to_table(name)`` reads ``<run_dir>/<name>.parquet`` when asked,
``summary()`` and ``conf_int()`` read the tables it needs. Same interface as every other result
(circuitstat.core.results.Result); ``write(run_dir)`` copies the tables into another run directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from circuitstat.core.results import Result

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
        from circuitstat.core.tables import read_table

        name = self.main_table if name is None else name
        path = self.run_dir / f"{name}.parquet"
        if not path.exists():
            raise KeyError(f"the run has no table {name!r}; it has {', '.join(self.names)}")
        return read_table(path)

    def tables(self) -> dict[str, pa.Table]:
        """Return every table of the run by name (each read from disk)."""
        return {n: self.to_table(n) for n in self.names}

    def _interval_tables(self) -> dict[str, pa.Table]:
        return self.tables()

    def _summary_items(self) -> list[tuple[str, Any]]:
        t = self.to_table().to_pydict()
        items: list[tuple[str, Any]] = [("run directory", str(self.run_dir))]
        if {"item", "value", "ci_low", "ci_high", "verdict"} <= set(t):
            from circuitstat.core.interval_words import interval_text

            items += [(i, f"{interval_text(v, lo, hi, digits=4)} {vd}".rstrip())
                      for i, v, lo, hi, vd in zip(t["item"], t["value"], t["ci_low"], t["ci_high"], t["verdict"])]
        return items

    def write(self, run_dir: Any, *, under: str | None = None) -> dict[str, Path]:
        """Return the paths of the tables when ``run_dir`` is this run (a study writes its tables as it runs);
        otherwise copy every table into ``run_dir`` (a path or an open RunDir) through RunDir, validated."""
        from circuitstat.core.rundir import RunDir

        here = Path(run_dir.path if isinstance(run_dir, RunDir) else run_dir)
        if under is None and here.resolve() == self.run_dir.resolve():
            return {n: self.run_dir / f"{n}.parquet" for n in self.names}
        return super().write(run_dir, under=under)
