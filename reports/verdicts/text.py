"""The verdict in the terminal: the one screen `circuitstat audit` and `circuitstat demo` end with."""

from __future__ import annotations

import textwrap
from pathlib import Path

from circuitstat.reports.verdicts.model import NBSP, Verdict

__all__ = ["verdict_text"]

WIDTH = 110
LABEL = 14  # width of the label column
VERDICT = 28  # width of the verdict column


def verdict_text(v: Verdict, report: Path | None = None, width: int = WIDTH) -> str:
    """Return the verdict as lines of at most `width` characters: one per finding, then what the run lacks and the rules."""
    where = f"; sections of {report}" if report is not None else ""
    about = f" ({v.method}, {v.level:.0%} intervals{where})" if v.method else where
    out = [f"Verdict{about}:"]
    indent = " " * (2 + LABEL + VERDICT)
    for ln in v.lines:
        head = f"  {ln.label:<{LABEL}}{ln.verdict:<{VERDICT - 2}}  "
        if len(head) > len(indent):  # a long verdict takes its own line, so it never runs into its text
            out.append(head.rstrip())
            head = indent
        body = f"{ln.text(hold=True)}  [#{ln.section}]"  # an interval is never broken across lines
        wrapped = textwrap.wrap(body, width, initial_indent=head, subsequent_indent=indent, break_on_hyphens=False)
        out += [w.replace(NBSP, " ") for w in wrapped]
    if v.not_run:
        todo = "; ".join(f"{a.name} ({a.how})" for a in v.not_run)
        out += textwrap.wrap(f"Not in this run: {todo}.", width, initial_indent="  ", subsequent_indent="    ")
    for rule in v.rules:
        out += textwrap.wrap(rule, width, initial_indent="  · ", subsequent_indent="    ", break_on_hyphens=False)
    return "\n".join(out)
