"""The HTML of a run comparison (circuitstat.reports.compare): one section, and a self-contained page around it.

The section prints the same rows as ``RunComparison.summary`` (intervals apart, the largest differences,
stability and faithfulness against k, claims), each interval with the estimand its run names in the
hover text; every value is escaped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from circuitstat.core.interval_words import interval_text
from circuitstat.reports.html.assets import CSP, CSS
from circuitstat.reports.html.common import MAX_ROWS, html_table, note
from circuitstat.reports.html.svg import esc

RunComparison = Any  # circuitstat.reports.compare.RunComparison (not imported: it imports this module)

__all__ = ["comparison_section", "render_comparison"]


def _num(v) -> float:
    return float("nan") if v is None or isinstance(v, str) else float(v)


def _ci(row: dict, est: str, lo: str, hi: str, side: str, estimand: str) -> str:
    if not row[f"in_{side}"]:
        return '<span class="note">not in run</span>'
    text = interval_text(_num(row[f"{est}_{side}"]), _num(row[f"{lo}_{side}"]), _num(row[f"{hi}_{side}"]), digits=4)
    return f'<span class="ci" title="covers {esc(estimand)}">{esc(text)}</span>'


def _edge_table(rows: list[dict]) -> str:
    cols = [("method", "text"), ("edge", "text"), ("A estimate [interval]", "html"), ("B estimate [interval]", "html"),
            ("B − A", "num"), ("intervals overlap", "bool")]
    body = [[r["method"], r["name"], _ci(r, "estimate", "ci_low", "ci_high", "a", str(r.get("estimand_a") or "")),
             _ci(r, "estimate", "ci_low", "ci_high", "b", str(r.get("estimand_b") or "")), r["difference"],
             r["overlap"]] for r in rows]
    return html_table(cols, body)


def _k_table(rows: list[dict], est: str, lo: str, hi: str, estimand: str) -> str:
    cols = [("method", "text"), ("k", "int"), ("A", "html"), ("B", "html"), ("B − A", "num"),
            ("intervals overlap", "bool")]
    return html_table(cols, [[r["method"], r["k"], _ci(r, est, lo, hi, "a", estimand), _ci(r, est, lo, hi, "b", estimand),
                              r["difference"], r["overlap"]] for r in rows])


def comparison_section(comp: RunComparison, top: int = MAX_ROWS) -> str:
    """Return the comparison as one HTML ``<section>``: runs, notes, edges apart, largest differences, stability,
    faithfulness and claims."""
    from circuitstat.reports.compare_text import all_equal_text, biggest, edge_rows_text, stability_lead

    equal = all_equal_text(comp)  # the terminal's words, so both say the same
    lead = stability_lead(comp)  # the column the terminal compares, so both compare the same
    facts = (f"A: {comp.a.label} ({', '.join(comp.a.models) or '?'}) · B: {comp.b.label} "
             f"({', '.join(comp.b.models) or '?'}) · edge rows, {edge_rows_text(comp)}")
    parts = [f'<section id="compare"><h2>Comparison: B minus A</h2>{note(facts, "facts")}',
             *(note(n) for n in comp.notes),
             note("Non-overlapping intervals are a flag to look at, not a test: with many edges some are apart by "
                  "chance."),
             f"<h3>Edges whose intervals do not overlap ({len(comp.flagged_edges)})</h3>",
             _edge_table(comp.flagged_edges[:top]) if comp.flagged_edges else note("none"),
             f"<h3>Largest differences of the mean edge effect (top {top})</h3>",
             note(equal) if equal is not None else _edge_table(biggest(comp, top)),
             f"<h3>Circuit stability against k ({lead}, data level)</h3>",
             _k_table(comp.stability, lead, f"{lead}_ci_low", f"{lead}_ci_high",
                      comp.estimands["stability"]) if comp.stability else note("neither run has stability_vs_k"),
             "<h3>Faithfulness against k (f_selected, selection included)</h3>",
             _k_table(comp.faithfulness, "f_selected", "f_selected_ci_low", "f_selected_ci_high",
                      comp.estimands["faithfulness"]) if comp.faithfulness else note("neither run has faithfulness_vs_k")]
    if comp.claims is not None:
        parts += ["<h3>Claims verdicts</h3>",
                  html_table([("claim", "text"), ("A", "text"), ("B", "text"), ("changed", "bool")],
                             [[r["name"], r["status_a"] or "absent", r["status_b"] or "absent", r["changed"]]
                              for r in comp.claims])]
    return "".join(parts) + "</section>"


def render_comparison(comp: RunComparison, out: str | os.PathLike[str]) -> Path:
    """Write the comparison as a self-contained HTML page at ``out`` and return its path."""
    from circuitstat.core.atomic import atomic_write_bytes

    title = f"circuitstat comparison — {comp.a.label} vs {comp.b.label}"
    page = ("<!DOCTYPE html>\n"
            f'<html lang="en"><head><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body><header><h1>{esc(title)}</h1></header>"
            f"<main>{comparison_section(comp)}</main></body></html>\n")
    path = Path(out)
    try:
        atomic_write_bytes(path, page.encode("utf-8"))
    except OSError as e:
        from circuitstat.core.errors import InputError

        raise InputError(f"cannot write {path}: {e.strerror or e}; give an --html file you can write to") from None
    return path
