"""Reading a rendered report in tests: a strict HTML parse, a section's HTML and table rows, headless Chromium."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path


class _Parse(HTMLParser):
    """Collect tags, attributes, headings and text; fail on badly nested markup."""

    VOID = {"meta", "br", "img", "input", "link", "hr", "col", "source", "wbr", "area", "base", "embed", "param", "track"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[tuple[str, dict]] = []
        self.h2: list[str] = []
        self.text: list[str] = []
        self._in_h2 = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "h2":
            self._in_h2, self._buf = True, ""
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()
        if tag == "h2":
            self._in_h2 = False
            self.h2.append(self._buf)

    def handle_data(self, data):
        self.text.append(data)
        if self._in_h2:
            self._buf += data


def parse(page: str) -> _Parse:
    """Return the page parsed strictly (badly nested or unclosed tags fail)."""
    p = _Parse()
    p.feed(page)
    p.close()
    assert not p.stack, f"unclosed tags {p.stack}"
    return p


def table_rows(page: str, section: str) -> list[list[str]]:
    """Return the text cells of every table row in section `section`."""
    m = re.search(rf'<section id="{section}">(.*?)</section>', page, re.S)
    assert m, section
    rows = []
    for tr in re.findall(r"<tr>(.*?)</tr>", m.group(1), re.S):
        rows.append([re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", tr, re.S)])
    return rows


def section_html(page: str, sid: str) -> str:
    """Return the HTML inside section `sid`."""
    return re.search(rf'<section id="{sid}">(.*?)</section>', page, re.S).group(1)


# ----- a real browser ---------------------------------------------------------------------------
def dump_dom_cmd(tmp_path: Path) -> list[str]:
    """Headless Chromium's --dump-dom command (the page's URI goes last); fails naming the fix when
    Chromium is missing, unless CIRCUITSTAT_ALLOW_NO_BROWSER=1 opts out of the browser tests."""
    from browser import HEADLESS_FLAGS, chromium, require

    require("chromium")
    return [chromium(), *HEADLESS_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
            "--v=0", "--dump-dom"]
