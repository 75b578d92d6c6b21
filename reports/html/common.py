"""What every section of the HTML report shares: table access, the `Missing` note, intervals, HTML tables and figures.

Each section reads the tables it needs through `Tables` (circuitstat.reports.tableset); a missing table or column
raises `Missing`, which `part` turns into a short note in place of that part (a section whose
analysis the run lacks is not shown at all: circuitstat.reports.html.sections). Every interval goes through
`ci_html` (or `ci_attrs` in SVG), which writes the table, row and columns it came from into data
attributes, its estimand into the hover text and its reliability flag and label into the page.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from circuitstat.reports.ci import Ci
from circuitstat.reports.html.svg import PALETTE, Plot, data_range, esc, fmt, fmt_p, padded, use_log
from circuitstat.reports.tableset import Missing, Tables, first, flag, ints, methods_in, num, order_methods, strs, sub
from circuitstat.reports.verdicts import BAR  # the bar of the verdicts and of the stability and faithfulness plots

__all__ = ["BAR", "TOP_FOREST", "MAX_ROWS", "Missing", "Tables", "first", "flag", "ints", "methods_in", "num",
           "order_methods", "strs", "sub", "edge_lookup", "note", "part", "figure", "ci_attrs", "ci_html",
           "html_table", "shown", "colours", "k_ticks", "x_domain_k"]

TOP_FOREST = 20  # edges in the forest plot, and the variance plot's and the fallback graph's top edges
MAX_ROWS = 200  # rows a table shows at most


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


# ----- intervals --------------------------------------------------------------------------------
def ci_attrs(ci: Ci) -> str:
    """Return the data attributes naming where interval `ci` came from (table, row key, columns, flag)."""
    key = json.dumps(dict(ci.key), separators=(",", ":"), ensure_ascii=False, default=str)
    a = f' data-table="{esc(ci.table)}" data-row="{esc(key)}" data-lo="{esc(ci.low)}" data-hi="{esc(ci.high)}"'
    if ci.est:
        a += f' data-est="{esc(ci.est)}"'
    if ci.flag:
        a += f' data-flag="{esc(ci.flag)}" data-reliable="{int(bool(ci.reliable))}"'
    return a


def ci_title(ci: Ci) -> str:
    """Return the hover text of an interval: what it covers, its label and its flag."""
    return ("covers " + (ci.estimand or "(no estimand recorded)") + (f" — {ci.role}" if ci.role else "")
            + (f" — {ci.flag_words()[1]}" if ci.reliable is False else ""))


def ci_html(ci: Ci) -> str:
    """Return an interval as the page prints it: estimate and bounds, then its flag and label, visibly."""
    flag_ = f' <b class="flag">{esc(ci.flag_words()[0])}</b>' if ci.reliable is False else ""
    role = f' <span class="role">{esc(ci.role)}</span>' if ci.role else ""
    return (f'<span class="ci"{ci_attrs(ci)} title="{esc(ci_title(ci))}"><span class="v">{esc(ci.text())}</span>'
            f"{flag_}{role}</span>")


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


def figure(svg: str, caption: str, table: str = "", *, html: bool = False, below: bool = False) -> str:
    """Return a plot with its caption (text, or HTML when `html`) and the table of its numbers beside it (or,
    for a wide table, `below` it at the page's width, so no column is cut off)."""
    side = f'<div class="tablebox{" wide" if below else ""}">{table}</div>' if table else ""
    cap = caption if html else esc(caption)
    return f'<div class="row"><figure>{svg}<figcaption>{cap}</figcaption></figure>{side}</div>'


Col = tuple[str, str]  # (header, kind): kind is text | num | int | p | bool | ci (a circuitstat.reports.ci.Ci) | html


def html_table(cols: Sequence[Col], rows: Sequence[Sequence[Any]], *, shown_note: str = "", cls: str = "") -> str:
    """Return a sortable table; numbers are rounded for display and kept exact in data-v for sorting."""
    head = "".join(f'<th class="{"t" if k in ("text", "bool", "html") else "n"}" title="click to sort">{esc(h)}</th>'
                   for h, k in cols)
    body = []
    for r in rows:
        cells = []
        for (_h, kind), v in zip(cols, r):
            if kind == "text":
                cells.append(f"<td>{esc(v)}</td>")
                continue
            if kind == "html":  # already escaped by the section
                cells.append(f"<td>{v}</td>")
                continue
            if kind == "ci":
                dv = f"{v.lo:.6g}" if v.defined else ""
                cells.append(f'<td class="n" data-v="{dv}">{ci_html(v)}</td>')
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


def shown(n_shown: int, n_total: int, what: str, order: str, table: str | None = None) -> str:
    """Return the caption saying how many of the rows a table shows, and in which order; when it shows only some
    and names its ``table``, where the rest are (a million-edge run's page lists the top rows, never all)."""
    if n_shown >= n_total:
        return f"all {n_total:,} {what}"
    rest = (f"; query {table}.parquet for the rest, e.g. circuitstat query \"SELECT * FROM {table}\" RUN_DIR"
            if table else "")
    return f"showing {n_shown:,} of {n_total:,} {what} ({order}){rest}"


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

