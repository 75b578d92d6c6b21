"""The report's first screen: the run's verdict (circuitstat.reports.verdicts) beside a compact drawing of its circuit.

The lines are the ones `circuitstat audit` and `demo` print, rendered from the same `Verdict`
object: each a plain verdict, its sentence with the intervals the claims check reads (estimand on
hover and in the caption below, reliability flag visible) and a link to its section.
"""

from __future__ import annotations

import json

from circuitstat.core.words import counted
from circuitstat.reports.ci import Ci
from circuitstat.reports.html.common import Tables, ci_html, html_table
from circuitstat.reports.html.graph import circuit_figure, graph_data
from circuitstat.reports.html.graph_draw import minority_sign
from circuitstat.reports.html.svg import esc
from circuitstat.reports.tableset import Missing
from circuitstat.reports.verdicts import Line, Verdict
from circuitstat.reports.verdicts.build import circuit_edges
from circuitstat.reports.verdicts.model import SIGNIFICANT_Q, Name, Quote, run_spec

__all__ = ["verdict_section"]


def _part_html(p: object) -> str:
    """Return one piece of a line: an interval (marked), a quoted table cell (marked), a name, or text."""
    if isinstance(p, Ci):
        return ci_html(p)
    if isinstance(p, Quote):
        key = json.dumps(dict(p.key), separators=(",", ":"), default=str)
        return (f'<span class="quote" data-table="{esc(p.table)}" data-row="{esc(key)}" data-col="{esc(p.column)}">'
                f"{esc(p.text)}</span>")
    return f"<code>{esc(p)}</code>" if isinstance(p, Name) else esc(p)


def _line_html(ln: Line, shown: set[str]) -> str:
    """Return one verdict line as a table row: label, verdict, sentence (intervals marked) and its link."""
    text = "".join(_part_html(p) for p in ln.parts)
    link = f' <a class="more" href="#{ln.section}">details →</a>' if ln.section in shown else ""
    return (f'<tr class="tone-{ln.tone}"><th scope="row">{esc(ln.label)}</th><td class="vd">{esc(ln.verdict)}</td>'
            f'<td class="vt">{text}{link}</td></tr>')


def _estimands(v: Verdict) -> str:
    """Return the caption naming what each kind of interval in the lines covers."""
    seen: dict[str, str] = {}
    for ln in v.lines:
        for ci in ln.cis:
            seen.setdefault(ln.label, ci.estimand)
    parts = [f"{label}: {est}" for label, est in seen.items() if est]
    return f"The {v.level:.0%} intervals cover — " + "; ".join(parts) + "." if parts else ""


def _circuit_thumb(T: Tables, v: Verdict) -> str:
    """Return the compact drawing of the verdict's circuit ('' when the run has none to draw)."""
    if v.method is None or v.k is None:
        return ""
    try:
        g = graph_data(T)
    except Missing:
        return ""
    svg, drawn, _ = circuit_figure(T, g, v.method, width=500, labels=0)
    if not drawn:
        return ""
    odd = "positive" if minority_sign(drawn) > 0 else "negative"
    colour = ("colour: inclusion frequency" if any(d.frequency == d.frequency for d in drawn) else
              "grey: no inclusion frequency at this k, which the circuit choice's search added to the stability grid's")
    cap = (f"{v.method}: the top-{v.k} circuit ({colour}; width: |effect|; dashed: {odd} effect); "
           "its intervals are in place on the full graph below.")
    return f'<figure class="thumb">{svg}<figcaption>{esc(cap)}</figcaption></figure>'


def _circuit_edge_table(T: Tables, v: Verdict) -> str:
    """Return the chosen circuit's edges in rank order with their intervals and q-values, in a box that scrolls
    ('' without a circuit): the first screen names the circuit's edges, not only its three largest."""
    if v.method is None or v.k is None:
        return ""
    ranking = str(run_spec(T.dir).get("ranking") or "absolute")
    edges = circuit_edges(T, v.method, v.k, ranking)
    if not edges:
        return ""
    body = [[i + 1, f"<code>{esc(e['name'])}</code>",
             Ci.of("edge_stats", e, ("method", "edge"), est="estimate"), e.get("q")] for i, e in enumerate(edges)]
    tbl = html_table([("rank", "int"), ("edge", "html"), ("mean effect [95% CI]", "ci"), ("BH q", "num")], body)
    rank = "|effect|" if ranking == "absolute" else "signed effect"
    cap = (f"The top-{v.k} circuit's {counted(len(edges), 'edge')} by {rank} ({v.method}; scroll for all); q ≤ {SIGNIFICANT_Q} is "
           "significant. Each interval covers the edge's mean effect over the task's prompt distribution.")
    return f'<div class="cedges">{tbl}</div><p class="caption">{esc(cap)}</p>'


def verdict_section(T: Tables, v: Verdict, shown: set[str]) -> str:
    """Return the verdict box: its lines, the caption of estimands, what the run lacks, the rules, the circuit."""
    body = "".join(_line_html(ln, shown) for ln in v.lines)
    table = f'<table class="verdicts"><tbody>{body}</tbody></table>' if body else ""
    caption = f'<p class="caption">{esc(_estimands(v))}</p>' if v.lines else ""
    todo = ""
    if v.not_run:
        items = "; ".join(f"{esc(a.name)} (<code>{esc(a.how)}</code>)" for a in v.not_run)
        todo = f'<p class="notrun">Not in this run: {items}.</p>'
    rules = "".join(f"<li>{esc(r)}</li>" for r in v.rules)
    rules = f'<ul class="rules">{rules}</ul>' if rules else ""
    if not body:
        table = '<p class="caption">This run holds no circuit audit; its sections follow.</p>'
    side = _circuit_thumb(T, v) + _circuit_edge_table(T, v)
    side = f'<div class="vside">{side}</div>' if side else ""
    return f'<div class="verdict-grid"><div class="vlines">{table}{caption}{todo}{rules}</div>{side}</div>'
