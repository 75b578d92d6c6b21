"""The published-circuit section: a circuit from a file (spec key ``circuit``) audited on this run -- its faithfulness
with the fixed-circuit interval, CPR/CMD of its scores, and per method its edges' support and inclusion."""

from __future__ import annotations

from circuitstat.reports.ci import Ci
from circuitstat.reports.html.common import Tables, ci_html, html_table, note
from circuitstat.reports.html.svg import esc
from circuitstat.reports.tableset import methods_in, rows

__all__ = ["published_section"]


def _summary(r: dict) -> str:
    f = ci_html(Ci.of("published_circuit", r, ("method",), "f_ci", est="f_ratio", flag=""))
    parts = [f"<p>{esc(r['circuit'])} ({esc(r['format'])}): {int(r['n_edges'])} edges, {int(r['n_nodes'])} nodes. "
             f"Faithfulness {f}.</p>",
             note(f"The interval covers: {r['f_ci_estimand']}. The circuit was not selected from these prompts, so "
                  "there is no selection to account for; the selection-aware interval of this run's own top-k "
                  "circuit of the same size is in the faithfulness section.")]
    if r.get("f_ci_note"):  # Fieller's set is no bounded interval: say why instead of printing an exploded one
        parts.append(f'<p class="verdict-warning">Faithfulness: {esc(r["f_ci_note"])}.</p>')
    if r["cpr"] == r["cpr"]:
        cpr = ci_html(Ci.of("published_circuit", r, ("method",), "cpr_ci", est="cpr", flag=""))
        cmd = ci_html(Ci.of("published_circuit", r, ("method",), "cmd_ci", est="cmd", flag=""))
        parts.append(f"<p>CPR {cpr}; CMD {cmd}.</p>")
    else:
        parts.append(note(f"CPR/CMD: {r['area_note']}"))
    return "".join(parts)


def published_section(T: Tables) -> str:
    """Return the section's HTML: the circuit's faithfulness and areas, then per method its edges' support."""
    summary = rows(T.get("published_circuit"))
    if not summary:
        return note("no published circuit in this run")
    parts = [_summary(summary[0])]
    for m in methods_in(T.get("published_circuit")):
        (r,) = rows(T.get("published_circuit"), method=m)
        parts.append(f"<h3>{esc(m)}: {int(r['n_unsupported'])} of {int(r['n_edges'])} edges not supported at "
                     f"q ≤ {r['q_level']:g}; inclusion in resampled top-{int(r['n_edges'])} circuits mean "
                     f"{r['inclusion_mean']:.2f}, least {r['inclusion_min']:.2f}; Jaccard with this run's own "
                     f"top-{int(r['n_edges'])} {r['topk_jaccard']:.2f}</h3>")
        body = [(e["name"], ci_html(Ci.of("published_circuit_edges", e, ("method", "edge"), est="estimate", flag="")),
                 e["q"], "yes" if e["supported"] else "no", e["inclusion"])
                for e in rows(T.get("published_circuit_edges"), method=m)]
        cols = (("edge", "text"), ("mean effect [CI]", "html"), ("q (BH)", "num"), ("supported", "text"),
                ("inclusion", "num"))
        parts.append(html_table(cols, body, shown_note=f"{len(body)} edges of the published circuit"))
    return "".join(parts)
