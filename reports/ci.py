"""An interval as the summaries and the report show it: its table, row and columns, what it covers, its flag.

Every interval the terminal summary or the HTML report prints is a `Ci` read from one row of one
run table, so the page can say where each number came from (the report writes the table, row and
column names into data attributes and a test reads every interval back from its table). `Ci.of`
takes the estimand from the row's own ``estimand`` column where the table has one, else from the
column's ``covers:`` text in core/schema.py, and gives an interval that is not the calibrated
one of its table the visible label in `LABELLED` (docs/calibration.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from circuitstat.core.schema import schema_for, tail_flag

__all__ = ["Ci", "LABELLED", "FLAGGED", "FEW_PROMPTS", "MONTE_CARLO", "covers", "fmt"]

MONTE_CARLO = "Monte Carlo error of this dataset's statistic"
_ANCHOR = "one anchor refit fixed, not across training seeds"
#: intervals that are not the calibrated one of their table, and the label they are always shown with
LABELLED: dict[tuple[str, str], str] = {
    ("faithfulness_vs_k", "f_ci"): "fixed circuit, selection not included",
    ("stability_vs_k", "jaccard_ci"): MONTE_CARLO,
    ("stability_vs_k", "phi_ci"): MONTE_CARLO,
    ("heads", "ci"): _ANCHOR,
    ("layers", "ci"): _ANCHOR,
}
#: what a row whose flag is false means in each table where the flag is not the tail flag: (badge, hover text)
FLAGGED = {
    "residual": ("! biased kind", "linear and RBF CKA are biased in finite samples: this interval misses the "
                 "population CKA (interval_reliable = false)"),
    "variance_shares": ("! few levels", "the interval rests on the few levels of a non-example factor "
                        "(interval_reliable = false)"),
}
#: (badge, hover text) of a row a few prompts carry; {flag} is the table's column (no_tail_seen in the per-edge mean
#: tables, interval_reliable in the sink and token tables: core.schema.tail_flag)
FEW_PROMPTS = ("! few prompts", "a few prompts carry the estimate ({flag} = false): the interval cannot back a claim; "
               "no mark does not mean the interval covers (a prompt rarer than 1 in N is invisible)")
_COVERS = re.compile(r"\(covers: (.*)\)\s*$")


def fmt(x: object, sig: int = 3) -> str:
    """Return a number rounded for reading: `sig` significant digits, scientific when tiny or huge.

    NaN/None -> '—'; integers stay integers; 0.81234 -> '0.812'; 1234.5 -> '1234'; 1.2e-5 -> '1.20e-05'.
    """
    if x is None:
        return "—"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    v = float(x)  # type: ignore[arg-type]
    if math.isnan(v):
        return "—"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    if v == 0:
        return "0"
    a = abs(v)
    if a < 1e-3 or a >= 1e6:
        return f"{v:.{max(sig - 1, 0)}e}"
    decimals = max(0, sig - 1 - math.floor(math.log10(a)))
    s = f"{v:.{decimals}f}"
    return "0" if s in ("-0", "-0.0") or float(s) == 0 else s


def covers(table: str, column: str) -> str:
    """Return what column `column` of run table `table` covers, from its schema doc ('' when unregistered)."""
    schema = schema_for(table.rsplit("/", 1)[-1])
    if schema is None or column not in schema.names:
        return ""
    m = _COVERS.search(schema.column(column).doc)
    return m.group(1) if m else ""


def _number(v: Any) -> float:
    return math.nan if v is None else float(v)


@dataclass(frozen=True)
class Ci:
    """One interval of one table row: where it is, its ends, what it covers and whether it can be trusted."""

    table: str  # the table's path inside the run directory, without .parquet (e.g. "heads", "model-0/sink_heads")
    key: tuple[tuple[str, Any], ...]  # (column, value) pairs that pick the row
    low: str  # column of the lower end
    high: str  # column of the upper end
    lo: float
    hi: float
    estimand: str  # what the interval covers, in words
    reliable: bool | None = None  # the row's reliability flag (None: the table records none)
    flag: str = ""  # the column the flag was read from
    role: str = ""  # the visible label of an interval that is not its table's calibrated one
    unavailable: str = ""  # why the interval is undefined, said instead of a dash
    est: str = ""  # the column of the point estimate printed before the interval ('' for none)
    value: float = math.nan
    decimals: int | None = None  # fixed decimals (faithfulness is a share of the model: 0.000) or 3 significant

    @classmethod
    def of(cls, table: str, row: Mapping[str, Any], key: Sequence[str], prefix: str = "ci", *, est: str = "",
           estimand: str = "", flag: str | None = None, unavailable: str = "", role: str = "",
           decimals: int | None = None) -> "Ci":
        """Return the interval ``{prefix}_low`` / ``{prefix}_high`` of `row` of `table`, keyed by the columns `key`.

        `est` names the column of the estimate printed before it; `flag` the row's flag column (None: the table's
        tail flag, core.schema.tail_flag, e.g. no_tail_seen of edge_stats; '' or absent: no flag); `unavailable` is said instead of the interval when it is undefined; `role` labels an
        interval the table does not mark (LABELLED does that for the known ones)."""
        low, high = f"{prefix}_low", f"{prefix}_high"
        base = prefix[:-3] if prefix.endswith("_ci") else prefix
        if not estimand:
            for col in (f"{prefix}_estimand", f"{base}_estimand", "estimand"):
                if row.get(col):
                    estimand = str(row[col])
                    break
        estimand = estimand or covers(table, low)
        if flag is None:
            flag = tail_flag(table) or "interval_reliable"
        ok = row.get(flag) if flag else None
        reliable = None if ok is None or (isinstance(ok, float) and math.isnan(ok)) else bool(ok)
        return cls(table, tuple((k, _plain(row[k])) for k in key), low, high, _number(row.get(low)),
                   _number(row.get(high)), estimand, reliable, flag if reliable is not None else "",
                   role or LABELLED.get((table.rsplit("/", 1)[-1], prefix), ""), unavailable, est,
                   _number(row.get(est)) if est else math.nan, decimals)

    @property
    def defined(self) -> bool:
        """Return whether both ends are numbers (an infinite end is printed as ∞: the table says so)."""
        return not (math.isnan(self.lo) or math.isnan(self.hi))

    def bounds(self) -> str:
        """Return the interval as printed: ``[0.763, 0.919]``, why it is undefined (``[needs ≥ 3 seeds]``), or ''."""
        if not self.defined:
            return f"[{self.unavailable}]" if self.unavailable else ""
        return f"[{self.number(self.lo)}, {self.number(self.hi)}]"

    def number(self, x: float) -> str:
        """Return one number of the interval as printed (fixed decimals, or three significant digits)."""
        if self.decimals is None or not math.isfinite(x):  # NaN -> '—', infinities -> ∞
            return fmt(x)
        s = f"{x:.{self.decimals}f}"
        return s[1:] if s.startswith("-") and float(s) == 0 else s

    def text(self) -> str:
        """Return the estimate (when there is one) and the interval: ``0.841 [0.763, 0.919]``; '—' for neither."""
        parts = [self.number(self.value)] if self.est and math.isfinite(self.value) else []
        if self.bounds():
            parts.append(self.bounds())
        return " ".join(parts) or "—"

    def flag_words(self) -> tuple[str, str]:
        """Return (badge, hover text) of a row whose flag is false, as its table means it."""
        badge, hover = FLAGGED.get(self.table.rsplit("/", 1)[-1], FEW_PROMPTS)
        return badge, hover.format(flag=self.flag or "no_tail_seen")

    def where(self) -> str:
        """Return the row key as ``column=value`` pairs (for messages)."""
        return ", ".join(f"{k}={v}" for k, v in self.key)


def _plain(v: Any) -> Any:
    """Return a key value as a JSON-ready Python scalar (numpy integers -> int)."""
    if hasattr(v, "item"):
        return v.item()
    return v
