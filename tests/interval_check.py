"""Reading every interval of a rendered report back from its table (the report's drift check).

Every interval the page prints sits in an element carrying ``data-table``, ``data-row`` (the key of
its row as JSON), ``data-lo`` / ``data-hi`` (its columns) and optionally ``data-est`` and
``data-flag`` (circuitstat.reports.html.common.ci_attrs). `check_intervals` parses the page with the standard
library's HTML parser, looks each interval up in its Parquet table with pyarrow (not through the
report's own readers) and checks the printed numbers against the table to their printed precision,
the reliability flag, the label of an interval that is not its table's calibrated one, and that no
other ``[number, number]`` is printed anywhere on the page.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pyarrow.parquet as pq

from circuitstat.reports.ci import LABELLED
from circuitstat.core.schema import claimable, schema_for

NUM = r"(?:−?∞|-?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)"
INTERVAL = re.compile(rf"(?:({NUM})\s+)?\[({NUM}), ({NUM})\]")
VOID = {"meta", "br", "img", "input", "link", "hr", "col", "source", "wbr", "area", "base", "embed", "param", "track"}


@dataclass
class Shown:
    """One printed interval: its element's attributes, its text, whether it is SVG, its label and flag text."""

    attrs: dict
    text: str = ""
    svg: bool = False
    role: str = ""
    flag: str = ""
    parts: list = field(default_factory=list)


class _Parser(HTMLParser):
    """Collect the interval elements with their text, and the page's text outside them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, Shown | None, str]] = []  # (tag, interval opened here, class)
        self.found: list[Shown] = []
        self.outside: list[str] = []
        self.in_svg = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg":
            self.in_svg += 1
        shown = Shown(a, svg=self.in_svg > 0) if "data-lo" in a or "data-col" in a else None
        if shown:
            self.found.append(shown)
        if tag not in VOID:
            self.stack.append((tag, shown, a.get("class") or ""))

    def handle_endtag(self, tag):
        t, _, _ = self.stack.pop()
        assert t == tag, f"</{tag}> closes <{t}>"
        if tag == "svg":
            self.in_svg -= 1

    def handle_data(self, data):
        if any(tag in ("script", "style") for tag, _, _ in self.stack):
            return
        owners = [s for _, s, _ in self.stack if s is not None]
        classes = [c for _, _, c in self.stack]
        if not owners:
            self.outside.append(data)
            return
        for s in owners:
            s.text += data
            if "role" in classes:
                s.role += data
            if "flag" in classes:
                s.flag += data


def _value(s: str) -> float:
    return {"∞": math.inf, "−∞": -math.inf}.get(s) or float(s)


def _precision(s: str) -> float:
    """Half a unit of the last printed digit of number `s` (the rounding it may carry)."""
    mant, _, exp = s.lower().partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    return 0.5 * 10.0 ** (-decimals + (int(exp) if exp else 0))


def _close(shown: str, true: float) -> bool:
    if "∞" in shown or math.isinf(true):
        return _value(shown) == true
    return abs(float(shown) - true) <= _precision(shown) * (1 + 1e-9) + 1e-12


def _row(run: Path, table: str, key: dict, cache: dict) -> dict:
    if table not in cache:  # each table read once per page, with pyarrow (not the report's readers)
        cache[table] = pq.read_table(run / f"{table}.parquet").to_pylist()
    hits = [r for r in cache[table] if all(r.get(k) == v for k, v in key.items())]
    assert len(hits) == 1, f"{table} has {len(hits)} rows with {key}"
    return hits[0]


def check_interval(run: Path, s: Shown, cache: dict | None = None) -> None:
    """Assert that one printed interval is its table row's, to the digits printed, with its flag and label
    (or, for a quoted cell, data-col, that the text is the cell's)."""
    a = s.attrs
    if "data-col" in a:
        row = _row(run, a["data-table"], json.loads(a["data-row"]), {} if cache is None else cache)
        assert s.text == row[a["data-col"]], (a, s.text)
        return
    table, lo_col, hi_col = a["data-table"], a["data-lo"], a["data-hi"]
    row = _row(run, table, json.loads(a["data-row"]), {} if cache is None else cache)
    base = table.rsplit("/", 1)[-1]
    prefix = lo_col[: -len("_low")]
    lo, hi = row.get(lo_col), row.get(hi_col)
    m = INTERVAL.search(s.text)
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        assert m is None, f"{table} {a['data-row']}: {lo_col} is undefined but the page prints {s.text!r}"
    else:
        assert m, f"{table} {a['data-row']}: no interval printed in {s.text!r}"
        assert _close(m.group(2), lo) and _close(m.group(3), hi), (table, a["data-row"], lo_col, lo, hi, s.text)
        if "data-est" in a and row.get(a["data-est"]) is not None and math.isfinite(row[a["data-est"]]):
            assert m.group(1) is not None and _close(m.group(1), row[a["data-est"]]), (table, a["data-est"], s.text)
    if "data-flag" in a:
        assert int(a["data-reliable"]) == int(bool(row[a["data-flag"]])), (table, a["data-row"])
        if not s.svg:
            assert bool(s.flag.strip()) == (not row[a["data-flag"]]), f"flag of {table} {a['data-row']} not shown: {s.text!r}"
    label = LABELLED.get((base, prefix))
    if label:
        assert label in (s.text if s.svg else s.role), f"{table}.{prefix} is printed without its label {label!r}"
    schema = schema_for(base)
    if schema is not None and claimable(base) and lo_col in schema.names:
        assert lo_col in claimable(base) or label, f"{table}.{lo_col}: not what a claim reads, and not labelled"


def check_intervals(run: Path, page: str) -> list[Shown]:
    """Check every interval `page` prints against its table; return them (at least one)."""
    p = _Parser()
    p.feed(page)
    p.close()
    assert any("data-lo" in s.attrs for s in p.found), "the page prints no interval"
    cache: dict = {}
    for s in p.found:
        check_interval(run, s, cache)
    stray = INTERVAL.findall(" ".join(p.outside))
    assert not stray, f"intervals printed without the data attributes that name their table: {stray[:5]}"
    return p.found
