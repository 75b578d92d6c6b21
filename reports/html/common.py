"""What every section of the HTML report shares: table access, the `Missing` note, HTML tables and figures.

Each section reads the tables it needs through `Tables`; a missing table or column raises
`Missing`, which `part` turns into a short note in place of that section (or sub-section).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from reports.html.svg import PALETTE, Plot, data_range, esc, fmt, fmt_p, padded, use_log
from reports.tables import read_table

BAR = 0.8  # the mean-Jaccard bar of the stability section (the variance section reads its bar from its table)
TOP_FOREST = 20  # edges in the forest plot, and the variance plot's and the fallback graph's top edges
MAX_ROWS = 200  # rows a table shows at most


class Missing(Exception):
    """A table or column a section needs is not in the run directory; the message is the note shown."""


# ----- data access ------------------------------------------------------------------------------
class Tables:
    """Lazily read, cached Parquet tables of one run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        self._cache: dict[str, pa.Table | None] = {}

    def path(self, name: str) -> Path:
        """Return the path of table `name` in the run directory."""
        return self.dir / f"{name}.parquet"

    def get(self, name: str) -> pa.Table | None:
        """Return table `name` (read once, then cached), or None when the run lacks it."""
        if name not in self._cache:
            p = self.path(name)
            self._cache[name] = read_table(p) if p.exists() else None
        return self._cache[name]

    def need(self, name: str, columns: Sequence[str] = ()) -> pa.Table:
        """Return table `name`, raising Missing (the note shown) when it, a column of `columns` or its rows are absent."""
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
    """Return column `col` as float64 (nulls and absent columns -> NaN)."""
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
    return strs(t, col)[0] if t.num_rows else ""


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
    return list(dict.fromkeys(strs(t, "method")))


def order_methods(names: Sequence[str]) -> list[str]:
    """Return methods with 'exact' first, then in order of first appearance."""
    uniq = list(dict.fromkeys(n for n in names if n))
    return sorted(uniq, key=lambda m: (m != "exact", uniq.index(m)))


def edge_lookup(T: Tables, method: str | None = None) -> dict[int, tuple[float, float, float, float]]:
    """Return {edge: (estimate, ci_low, ci_high, q)} from edge_stats for `method` ({} when absent)."""
    t = T.get("edge_stats")
    if t is None or "edge" not in t.column_names or "estimate" not in t.column_names:
        return {}
    if method is not None and "method" in t.column_names:
        t = sub(t, np.array(strs(t, "method")) == method)
    e = ints(t, "edge")
    cols = [num(t, c) for c in ("estimate", "ci_low", "ci_high", "q")]
    return {int(k): (a, b, c, d) for k, a, b, c, d in zip(e, *cols)}


# ----- HTML pieces ------------------------------------------------------------------------------
def note(text: str, cls: str = "note") -> str:
    """Return a note paragraph (escaped text)."""
    return f'<p class="{cls}">{esc(text)}</p>'


def part(fn: Callable[[], str]) -> str:
    """Return fn()'s HTML, or the note of the `Missing` it raised (that part's tables are absent)."""
    try:
        return fn()
    except Missing as e:
        return note(str(e))


def figure(svg: str, caption: str, table: str = "") -> str:
    """Return a plot with its caption and, beside it, the table of its numbers."""
    side = f'<div class="tablebox">{table}</div>' if table else ""
    return f'<div class="row"><figure>{svg}<figcaption>{esc(caption)}</figcaption></figure>{side}</div>'


Col = tuple[str, str]  # (header, kind): kind is text | num | int | p | bool


def html_table(cols: Sequence[Col], rows: Sequence[Sequence[Any]], *, shown_note: str = "", cls: str = "") -> str:
    """Return a sortable table; numbers are rounded for display and kept exact in data-v for sorting."""
    head = "".join(f'<th class="{"t" if k in ("text", "bool") else "n"}" title="click to sort">{esc(h)}</th>' for h, k in cols)
    body = []
    for r in rows:
        cells = []
        for (_h, kind), v in zip(cols, r):
            if kind == "text":
                cells.append(f"<td>{esc(v)}</td>")
                continue
            if kind == "bool":
                ok = bool(v) if v is not None and not (isinstance(v, float) and math.isnan(v)) else None
                txt = "—" if ok is None else ("yes" if ok else "no")
                c = "" if ok is None else (' class="pass"' if ok else ' class="fail"')
                cells.append(f'<td{c} data-v="{"" if ok is None else int(ok)}">{txt}</td>')
                continue
            try:
                f = float(v)
            except (TypeError, ValueError):
                f = math.nan
            dv = "" if math.isnan(f) else (str(int(f)) if kind == "int" else f"{f:.6g}")
            txt = fmt_p(f) if kind == "p" else (str(int(f)) if kind == "int" and not math.isnan(f) else fmt(f))
            cells.append(f'<td class="n" data-v="{dv}">{esc(txt)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    extra = f'<p class="shown">{esc(shown_note)}</p>' if shown_note else ""
    return f'<table class="sortable {cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>{extra}'


def shown(n_shown: int, n_total: int, what: str, order: str) -> str:
    """Return the caption saying how many of the rows a table shows, and in which order."""
    if n_shown >= n_total:
        return f"all {n_total:,} {what}"
    return f"showing {n_shown:,} of {n_total:,} {what} ({order})"


def colours(methods: Sequence[str]) -> dict[str, str]:
    """Return one palette colour per method, in order."""
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(methods)}


def k_ticks(ks: np.ndarray, plot: Plot) -> list[float] | None:
    """Return the k grid itself as ticks when it is short (reads better than generic ticks)."""
    u = np.unique(ks[np.isfinite(ks)])
    if 1 < u.size <= 9:
        # drop ticks that would overlap on the axis
        out, last = [], -1e9
        for v in u:
            px = plot.x(float(v))
            if px - last >= 24:
                out.append(float(v))
                last = px
        return out
    return None


def x_domain_k(ks: np.ndarray) -> tuple[tuple[float, float], bool]:
    """Return (x domain, log scale?) of a k (or N) axis: log when the values span decades."""
    lo, hi = data_range(ks)
    log = use_log(ks)
    if log:
        return (lo / 1.15, hi * 1.15), True
    return padded(lo, hi, 0.04), False

