"""The circuit graph: the top-k circuit at the verdict's k drawn over the model's layers, intervals in place.

The circuit is the top-k of each method's mean scores (edge_stats) at the k the verdict chose
(circuitstat.reports.verdicts.choose_k), so the graph, the first screen and the faithfulness numbers are about
the same circuit. Colour is the edge's inclusion frequency in resample circuits at that k (its
stability), width its |effect|, dashed a negative effect; the edges with the largest |effect| carry
their estimate and interval as labels on the curve, and every edge is in the table beside it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from circuitstat.reports.ci import Ci
from circuitstat.reports.html.common import Missing, Tables, figure, html_table, ints, methods_in, note, shown, strs
from circuitstat.reports.tableset import rows
from circuitstat.reports.html.graph_draw import Drawn, draw_circuit
from circuitstat.reports.html.svg import esc
from circuitstat.reports.verdicts import choose_k, circuit_edges, primary_method, run_spec

__all__ = ["GraphData", "graph_data", "graph_section", "circuit_figure", "receiver_node"]

N_LABELS = 12  # edges labelled with their interval on the full graph
TOP_TABLE = 60  # circuit edges listed beside the graph
_PORT = re.compile(r"^(.*)<([^<>]*)>$")


def receiver_node(receiver: str) -> tuple[str, str]:
    """Return (node, port) of a receiver name: 'a1.h3<k>' -> ('a1.h3', 'k'), 'm2' -> ('m2', '')."""
    m = _PORT.match(receiver)
    return (m.group(1), m.group(2)) if m else (receiver, "")


@dataclass
class GraphData:
    """What every circuit drawing of a run shares: edge endpoints, all nodes, layer hints, k and ranking."""

    ends: dict[int, tuple[str, str]]  # edge index -> (sender, receiver) from edges.parquet
    nodes: set[str]
    layer_hint: dict[str, int]
    n_edges: int | None
    k: int
    why_k: str
    ranking: str
    notes: list[str] = field(default_factory=list)


def graph_data(T: Tables) -> GraphData:
    """Return the run's edge endpoints and the verdict's k (Missing when the run has no edge_stats)."""
    T.need("edge_stats", ["method", "edge", "estimate"])
    method = primary_method(T)
    k, why = choose_k(T, method) if method else (None, "")
    if k is None:
        k, why = 20, "the run has no k grid, so the 20 largest"
    edges = T.get("edges")
    ends: dict[int, tuple[str, str]] = {}
    nodes: set[str] = set()
    hint: dict[str, int] = {}
    notes = []
    if edges is not None and {"index", "sender", "receiver"} <= set(edges.column_names):
        senders, receivers = strs(edges, "sender"), strs(edges, "receiver")
        ends = {int(i): (s, r) for i, s, r in zip(ints(edges, "index"), senders, receivers)}
        if "sender_layer" in edges.column_names:
            hint.update(zip(senders, ints(edges, "sender_layer").tolist()))
        nodes = set(senders) | {receiver_node(r)[0] for r in set(receivers)}
    else:
        notes.append("edges.parquet is missing: node positions come from the edge names (sender->receiver).")
    spec = run_spec(T.dir)
    return GraphData(ends, nodes, hint, len(ends) or None, k, why, str(spec.get("ranking") or "absolute"), notes)


def _frequencies(T: Tables, method: str, k: int) -> dict[int, float]:
    """Return {edge: inclusion frequency at k} ({} without inclusion.parquet; absent edges never entered)."""
    return {int(r["edge"]): float(r["frequency"]) for r in rows(T.get("inclusion"), method=method, k=k)}


def _drawn(T: Tables, g: GraphData, method: str) -> tuple[list[Drawn], bool]:
    """Return the method's circuit edges as drawn (endpoints, interval, frequency), and whether frequencies exist."""
    freq = _frequencies(T, method, g.k)
    out = []
    for e in circuit_edges(T, method, g.k, g.ranking):
        idx, name = int(e["edge"]), str(e.get("name") or e["edge"])
        ends = g.ends.get(idx) or (tuple(name.split("->", 1)) if "->" in name else None)
        if ends is None:
            continue
        ci = Ci.of("edge_stats", e, ("method", "edge"), est="estimate")
        out.append(Drawn(idx, name, ends[0], ends[1], ci, freq.get(idx, 0.0) if freq else math.nan, e.get("q")))
    return out, bool(freq)


def circuit_figure(T: Tables, g: GraphData, method: str, *, width: int, labels: int) -> tuple[str, list[Drawn], str]:
    """Return (svg, the drawn edges, a note on nodes left out) of `method`'s circuit at the verdict's k."""
    drawn, has_freq = _drawn(T, g, method)
    svg, info = draw_circuit(drawn, g.nodes, g.layer_hint, f"circuit graph, method {method}", width=width,
                             labels=labels, coloured=has_freq)
    return svg, drawn, info


def graph_section(T: Tables, methods: list[str]) -> str:
    """Return per method the top-k circuit at the verdict's k, drawn large with its intervals, beside its table."""
    g = graph_data(T)
    stats = T.get("edge_stats")
    meths = [m for m in methods if m in methods_in(stats)] or methods_in(stats)
    out = [note(n) for n in g.notes]
    for method in meths[:4]:
        svg, drawn, info = circuit_figure(T, g, method, width=1180, labels=N_LABELS)
        if not drawn:
            continue
        cols = [("rank", "int"), ("edge", "text"), ("estimate [95% CI]", "ci"), ("q (BH)", "p"), ("inclusion", "num")]
        rows_ = [[i + 1, d.name, d.ci, d.q, d.frequency] for i, d in enumerate(drawn[:TOP_TABLE])]
        tbl = html_table(cols, rows_, shown_note=shown(len(rows_), len(drawn), "circuit edges", "by rank"))
        n_lab = min(N_LABELS, len(drawn))
        cap = (f"Method {method}: the top {g.k} edges by {'|mean effect|' if g.ranking == 'absolute' else 'signed mean effect'}"
               + (f" of {g.n_edges:,}" if g.n_edges else "") + f"; k = {g.k}: {g.why_k}. Colour: inclusion frequency "
               f"(share of resamples whose top-{g.k} circuit has the edge); width: |effect|; dashed: the sign fewer edges have (see the legend); "
               f"labels: effect [95% CI] of the {n_lab} largest |effect| (! = a few prompts carry it). q/k/v inputs of a "
               "head enter at its left, middle and right." + info)
        out.append(f"<h3>{esc(method)}</h3>" + figure(svg, cap, tbl))
    if not any(o.startswith("<h3>") for o in out):
        raise Missing("edge_stats.parquet has no edges for any method, so the circuit graph is omitted.")
    return "".join(out)
