"""The one schema of every run table: names, Arrow types and meanings of tables and their columns.

Writers (``RunDir.write_table``) validate a table against its schema before writing it, so a
misspelt or missing column is a bug caught where it is made, not a blank part of a report. Readers
(claims, the HTML report, the demo summary, the query command's documentation, test fixtures)
take table and column names from here; the claimable statistics of each claim kind are the
columns marked ``claimable``. Interval columns say what they cover in ``doc`` (DESIGN.md: every
interval names its estimand).

Tables not registered here (a study's own tables) are written unvalidated. The declarations are split by
concept, each module one family of run tables: core/schema_audit.py (the audit's tables, circuit tests and
what a check writes), core/schema_studies.py (head, variance, calibration and ground-truth studies),
core/schema_tokens.py (``circuitstat tokens``) and core/schema_results.py (the Result classes' tables); the
building blocks (Column, TableSchema, ``table_schema``, ``ci_columns``) are in core/schema_core.py. Registering
a table is adding a ``table_schema(...)`` to its family's module. This module merges them and is the one
lookup every reader and writer uses.

Why the declarations stay in core, not in the layer that writes each table: the readers are in every layer
(the HTML report and ``compare`` in reports/, which imports nothing but core; the claims in pipelines/), and
a lookup filled by registration from stats/ or pipelines/ would be complete only after the right modules
were imported -- a report rendered in a process that never imported the writer would find no schema.
"""

from __future__ import annotations

from typing import Any, Mapping

from circuitstat.core.schema_audit import AUDIT_TABLES, CHECK_TABLES, CIRCUIT_TEST_TABLES, DANGLING_REASON  # noqa: F401 - read from here
from circuitstat.core.schema_core import B, F, I, S, Column, SchemaError, TableSchema
from circuitstat.core.schema_results import RESULT_TABLES
from circuitstat.core.schema_studies import GROUNDTRUTH_TABLES, STUDY_TABLES
from circuitstat.core.schema_tokens import TOKEN_TABLES

__all__ = ["Column", "TableSchema", "SchemaError", "TABLES", "RENAMED_COLUMNS", "schema_for", "claimable", "columns",
           "fill", "renamed", "stored_names", "tail_flag"]

# in the order they were declared before the declarations were split by concept (the registry's order is stable)
_DECLARED = (*AUDIT_TABLES, *STUDY_TABLES, *CHECK_TABLES, *TOKEN_TABLES, *GROUNDTRUTH_TABLES, *CIRCUIT_TEST_TABLES)
TABLES: dict[str, TableSchema] = {t.name: t for t in _DECLARED}
assert len(TABLES) == len(_DECLARED), "a run table is declared twice"

# The tables of the Result classes (Result.write validates against them); their names are unique
assert not set(RESULT_TABLES) & set(TABLES), sorted(set(RESULT_TABLES) & set(TABLES))
TABLES.update(RESULT_TABLES)

SCORES_PREFIX = "scores_"

#: columns renamed since runs were written, {table: {old name: current name}}. A run directory written before a
#: rename still reads: circuitstat.core.tables.read_table, which every reader of run tables goes through, maps the
#: old names to the current ones (:func:`renamed`), so claims, the report and compare see only current names.
RENAMED_COLUMNS: dict[str, dict[str, str]] = {
    # issue 34: no sample statistic can promise that a mean's interval covers (a spike the sample missed is
    # invisible; docs/calibration.md), so the per-edge mean tables' flag says only what it sees
    "edge_stats": {"interval_reliable": "no_tail_seen"},
    "verified": {"interval_reliable": "no_tail_seen"},
    "bootstrap": {"interval_reliable": "no_tail_seen"},
}


def renamed(name: str, table: Any) -> Any:
    """Return pyarrow ``table`` (run table ``name``) with old column names (RENAMED_COLUMNS) replaced by current ones."""
    old = RENAMED_COLUMNS.get(name, {})
    have = set(table.column_names)
    if not old or not have & set(old):
        return table
    # a file holding both the old and the current name keeps both as they are: nothing is overwritten
    out = table.rename_columns([old[c] if c in old and old[c] not in have else c for c in table.column_names])
    return out.replace_schema_metadata(table.schema.metadata)  # rename_columns drops it (the provenance)


def tail_flag(name: str) -> str | None:
    """Return the column of run table ``name`` (``model-<i>/`` prefix allowed) that is false where a few prompts carry
    the estimate: no_tail_seen in the per-edge mean tables, interval_reliable in the others; None if it has none."""
    schema = TABLES.get(name.rsplit("/", 1)[-1])
    return next((c for c in ("no_tail_seen", "interval_reliable") if schema is not None and c in schema.names), None)


def stored_names(name: str, wanted: list[str], stored: list[str]) -> list[str]:
    """Return ``wanted`` (current column names of run table ``name``) as a file with columns ``stored`` spells them."""
    back = {new: old for old, new in RENAMED_COLUMNS.get(name, {}).items()}
    return [back[c] if c not in stored and back.get(c) in stored else c for c in wanted]


def schema_for(name: str) -> TableSchema | None:
    """Return the registered schema of run table ``name`` (None for unregistered and per-method score tables)."""
    return TABLES.get(name)


def columns(name: str) -> tuple[str, ...]:
    """Return the column names of registered table ``name``; KeyError for an unregistered one."""
    return TABLES[name].names


def claimable(name: str) -> tuple[str, ...]:
    """Return the columns of table ``name`` a claim may bound, in schema order."""
    return tuple(c.name for c in TABLES[name].columns if c.claimable)


def fill(name: str, rows: Mapping[str, Any], n: int) -> dict[str, list]:
    """Return ``rows`` completed to the full schema of table ``name`` (NaN, -1, '' or False fill
    the absent columns); KeyError for a column the schema does not know. For test fixtures."""
    schema = TABLES[name]
    for key in rows:
        schema.column(key)
    blank = {F: float("nan"), I: -1, S: "", B: False}
    return {c.name: list(rows[c.name]) if c.name in rows else [blank[c.type]] * n for c in schema.columns}
