"""How a table's schema is written down and checked: Column, TableSchema and the helpers that declare them.

The registries (core/schema.py: run tables; core/schema_results.py: the tables of every
Result class) are built from these. An interval is a ``<prefix>_low`` / ``<prefix>_high`` column
pair declared with :func:`ci_columns`, whose doc says what it covers (DESIGN.md: every interval names its
estimand); :meth:`TableSchema.intervals` finds them, so ``Result.conf_int`` needs no per-class code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

__all__ = ["Column", "TableSchema", "SchemaError", "S", "I", "F", "B", "MATRIX", "EDGE_ESTIMAND", "MC_JACCARD",
           "DATA_JACCARD", "HALF_JACCARD", "POP_JACCARD", "DATA_PHI", "FIXED_F", "SELECTED_F", "CONDITIONAL_F", "REFIT",
           "METHOD_COLUMN", "K_COLUMN", "table_schema", "ci_columns"]

S, I, F, B = pa.string(), pa.int64(), pa.float64(), pa.bool_()
#: registered type of a per-example matrix column: fixed-size lists of float32 (one row per example)
MATRIX = pa.list_(pa.float32())
_COVERS = re.compile(r"\(covers: (.*)\)$")

# What the intervals cover, shared by the run tables and the result tables
EDGE_ESTIMAND = "the mean effect over the task's prompt distribution"
#: the robust estimands beside the mean (circuitstat.stats.robust takes its words from here)
MEDIAN_ESTIMAND = "the median effect over the task's prompt distribution (the effect on a typical prompt)"
TRIMMED_ESTIMAND = "the 20%-trimmed mean effect over the task's prompt distribution (mean of the middle 60%)"
MC_JACCARD = "Monte Carlo spread of resample circuits of this dataset, not a data-level interval"
DATA_JACCARD = "the expected Jaccard between the top-k circuits of two independent size-N datasets"
HALF_JACCARD = ("J_{N/2}: the expected Jaccard between the top-k circuits of two independent datasets of N/2 "
                "prompts (disjoint halves, exactly estimable; bias-corrected bootstrap SE, arcsine-scale interval)")
POP_JACCARD = "the Jaccard between this dataset's top-k circuit and the population's"
DATA_PHI = "the expected Phi between the top-k circuits of two independent size-N datasets"
FIXED_F = "faithfulness of this fixed circuit on the prompt distribution (selection not included)"
SELECTED_F = ("faithfulness of the selection procedure at N, averaged over refits: the expected faithfulness on the "
              "prompt distribution of the top-k circuit selected from N prompts")
#: the reported circuit's own interval: a mask-learned method fitted on half the prompts, Fieller on the other half
CONDITIONAL_F = ("faithfulness on the prompt distribution of the reported circuit (fitted on half the prompts, "
                 "evaluated on the other half)")
REFIT = "stability over the distribution of training seeds (every refit an anchor)"

# the key columns most run tables share (a column is a (name, type, doc[, claimable, optional]) tuple)
METHOD_COLUMN = ("method", S, "discovery method: attribution (exact, eap, eap-ig-inputs, eap-ig-activations, clean-corrupted, "
           "atp-qkfix, atp-graddrop, atpstar, ensemble) or mask-learned (edge-pruning, ugs)")
K_COLUMN = ("k", I, "circuit size: number of edges (or nodes) kept")


class SchemaError(ValueError):
    """A table written to a run directory does not match its registered schema (a bug in the writer)."""


@dataclass(frozen=True)
class Column:
    """One column: its name, Arrow type, meaning and whether a claim may bound it."""

    name: str
    type: pa.DataType
    doc: str
    claimable: bool = False
    optional: bool = False  # written by some runs only (e.g. the head study's summary adds p-values)


@dataclass(frozen=True)
class TableSchema:
    """One run table: its name, meaning and columns (in order)."""

    name: str
    doc: str
    columns: tuple[Column, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """Return the column names in order."""
        return tuple(c.name for c in self.columns)

    def arrow(self) -> pa.Schema:
        """Return the pyarrow schema."""
        return pa.schema([pa.field(c.name, c.type) for c in self.columns])

    def column(self, name: str) -> Column:
        """Return column ``name``; KeyError naming the table's columns if it has none such."""
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no column {name!r}; its columns: {', '.join(self.names)}")

    def intervals(self) -> dict[str, str]:
        """Return {prefix: what it covers} of the declared intervals (``<prefix>_low/_high``, doc with covers)."""
        out = {}
        for c in self.columns:
            m = _COVERS.search(c.doc)
            if c.name.endswith("_low") and m and f"{c.name[:-4]}_high" in self.names:
                out[c.name[:-4]] = m.group(1)
        return out

    def validate(self, table: pa.Table) -> pa.Table:
        """Return ``table`` with its columns in schema order and types; SchemaError on any mismatch."""
        got = list(table.column_names)
        missing = [c.name for c in self.columns if c.name not in got and not c.optional]
        extra = [n for n in got if n not in self.names]
        if missing or extra:
            raise SchemaError(f"table {self.name!r} does not match core/schema.py: missing {missing}, "
                              f"unregistered {extra}; fix the writer or register the column")
        cols, fields = [], []
        for c in self.columns:
            if c.name not in got:
                continue
            col = table.column(c.name)
            if c.type == MATRIX and _is_float32_list(col.type):  # a per-example matrix: [N] lists of E floats
                cols.append(col)
                fields.append(pa.field(c.name, col.type))
                continue
            if col.type != c.type and not _castable(col.type, c.type):
                raise SchemaError(f"column {self.name}.{c.name} is {col.type}, registered as {c.type}")
            cols.append(col if col.type == c.type else col.cast(c.type))
            fields.append(pa.field(c.name, c.type))
        return pa.Table.from_arrays(cols, schema=pa.schema(fields, metadata=table.schema.metadata))


def _is_float32_list(t: pa.DataType) -> bool:
    return (pa.types.is_fixed_size_list(t) or pa.types.is_list(t)) and t.value_type == pa.float32()


def _castable(got: pa.DataType, want: pa.DataType) -> bool:
    # all-null columns (an empty list of rows) and integers in float columns are the only casts
    # allowed: anything else (a float k, a string estimate) is a writer bug worth failing on.
    if pa.types.is_null(got):
        return True
    return pa.types.is_integer(got) and pa.types.is_floating(want)


def table_schema(name: str, doc: str, *cols: tuple) -> TableSchema:
    """Return the TableSchema of table ``name`` from column tuples (name, type, doc[, claimable, optional])."""
    return TableSchema(name, doc, tuple(Column(*c) for c in cols))


def ci_columns(prefix: str, of: str, covers: str, claimable: bool = True) -> tuple[tuple, tuple]:
    """Return the column tuples of an interval ``<prefix>_low/_high`` for ``of``, whose docs say what it covers."""
    return ((f"{prefix}_low", F, f"lower end of the interval for {of} (covers: {covers})", claimable),
            (f"{prefix}_high", F, f"upper end of the interval for {of} (covers: {covers})", claimable))
