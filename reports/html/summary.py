"""The run's own summary table (summary.parquet: the head study's or the variance study's items), in its section."""

from __future__ import annotations

from circuitstat.reports.ci import Ci
from circuitstat.reports.html.common import Tables, html_table
from circuitstat.reports.html.svg import esc
from circuitstat.reports.tableset import rows

__all__ = ["summary_items_part"]

ACROSS_SEEDS = "every refit an anchor"  # the items whose interval is over training seeds say so
ANCHOR = "one anchor refit fixed, not across training seeds"


def summary_items_part(T: Tables, title: str) -> str:
    """Return the summary items (folded: the verdict and the sections show the claimable ones), intervals labelled."""
    rs = rows(T.need("summary", ["item", "value"]))
    across = any(ACROSS_SEEDS in str(r["item"]) for r in rs)
    body = []
    for r in rs:
        item = str(r["item"])
        # a run with intervals over seeds: the others resample prompts with one anchor refit fixed; label them
        role = ANCHOR if across and ACROSS_SEEDS not in item and "CKA" not in item else ""
        ci = Ci.of(T.name("summary"), r, ("item",), "ci", est="value", role=role,
                   estimand=str(r.get("interval") or "what its item states"))
        body.append([item, ci, str(r.get("verdict") or "")])
    cols = [("item", "text"), ("value [interval]", "ci"), ("verdict", "text")]
    if not any(b[2] for b in body):  # no item has a verdict: no empty column
        cols, body = cols[:2], [b[:2] for b in body]
    tbl = html_table(cols, body, cls="summary")
    cap = (f"All {len(rs)} items of the run's summary.parquet as its analysis wrote them; each interval covers what its "
           "item states." + (f" Items without '({ACROSS_SEEDS} …)' are labelled: their intervals resample prompts "
                             "and refits with one anchor fixed." if across else ""))
    return (f'<details class="more"><summary>{esc(title)}: all {len(rs)} items</summary><p class="caption">{esc(cap)}</p>'
            f'<div class="tablebox wide">{tbl}</div></details>')
