"""The summary section: the run's summary table (item, value, interval, verdict)."""

from __future__ import annotations

from reports.html.common import Tables, num, strs
from reports.html.svg import esc, fmt


def summary_section(T: Tables) -> str:
    """Return the summary table (item, value, interval, verdict coloured pass/fail)."""
    t = T.need("summary", ["item", "value"])
    items, verdicts = strs(t, "item"), strs(t, "verdict")
    v, lo, hi = num(t, "value"), num(t, "ci_low"), num(t, "ci_high")
    body = []
    for i in range(t.num_rows):
        vd = verdicts[i]
        cls = "pass" if vd.lower() in ("pass", "passed", "holds", "ok", "stable", "yes", "true", "met") else (
            "fail" if vd.lower() in ("fail", "failed", "violated", "unstable", "no", "false", "not met") else "")
        body.append(f'<tr><td>{esc(items[i])}</td><td class="n">{esc(fmt(v[i]))}</td><td class="n">{esc(fmt(lo[i]))}</td>'
                    f'<td class="n">{esc(fmt(hi[i]))}</td><td class="{cls}">{esc(vd)}</td></tr>')
    return ('<table class="summary"><thead><tr><th>item</th><th class="n">value</th><th class="n">CI low</th><th class="n">CI high</th>'
            f'<th>verdict</th></tr></thead><tbody>{"".join(body)}</tbody></table>')

