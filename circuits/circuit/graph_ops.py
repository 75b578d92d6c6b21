"""Index arrays over a component graph that circuits are built from: endpoints, touched nodes, pruning, names."""

from __future__ import annotations

import difflib
from typing import Sequence

import numpy as np

from ..graph import ComponentGraph


def receiver_node_index(graph: ComponentGraph) -> np.ndarray:
    """Index in ``graph.nodes`` of the node each receiver belongs to: [R]."""
    lookup = {name: i for i, name in enumerate(graph.nodes)}
    return np.asarray([lookup[graph.receiver_node(r)] for r in range(graph.n_receivers)], dtype=np.int64)


def edge_endpoints(graph: ComponentGraph) -> tuple[np.ndarray, np.ndarray]:
    """(sender node, receiver node) of every edge, as indices into ``graph.nodes``."""
    return graph.edge_sender, receiver_node_index(graph)[graph.edge_receiver]


def graph_cfg(graph: ComponentGraph) -> dict:
    """The graph's shape (layers, heads, MLPs, parallel blocks): two graphs with equal shapes are the same."""
    return {"n_layers": graph.n_layers, "n_heads": graph.n_heads, "has_mlp": graph.has_mlp,
            "parallel": graph.parallel}


def touched_nodes(graph: ComponentGraph, edges: np.ndarray) -> np.ndarray:
    """Boolean node mask: the endpoints of the chosen edges."""
    src, dst = edge_endpoints(graph)
    nodes = np.zeros(len(graph.nodes), dtype=bool)
    nodes[src[edges]] = True
    nodes[dst[edges]] = True
    return nodes


def prune_edges(graph: ComponentGraph, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fixpoint of: keep nodes with an in-edge and an out-edge; drop edges touching dropped nodes."""
    src, dst = edge_endpoints(graph)
    n_nodes = len(graph.nodes)
    logits, inp = n_nodes - 1, 0
    edges = edges.copy()
    while True:
        has_out = np.bincount(src[edges], minlength=n_nodes) > 0
        has_in = np.bincount(dst[edges], minlength=n_nodes) > 0
        has_out[logits] = True
        has_in[inp] = True
        alive = has_out & has_in
        new = edges & alive[src] & alive[dst]
        if np.array_equal(new, edges):
            return edges, alive
        edges = new


def is_mlp(name: str) -> bool:
    """Whether ``name`` is an MLP node name (``m0``, ``m1``, ...)."""
    return len(name) > 1 and name[0] == "m" and name[1:].isdigit()


def unknown_message(kind: str, unknown: Sequence[str], valid: Sequence[str], graph: ComponentGraph) -> str:
    """A message naming unknown node or edge names, with the closest valid names and hints on the naming."""
    shown = ", ".join(repr(n) for n in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
    hints = []
    first = unknown[0]
    if kind == "edge" and "->" in first and not first.endswith(">") and first.split("->")[-1].startswith("a"):
        hints.append("edges into attention heads name the input: 'a0.h1->a1.h2<q>' (or <k>, <v>)")
    if not graph.has_mlp and any(is_mlp(p) for n in unknown for p in n.replace("<", "->").split("->")):
        hints.append("this model is attention-only and has no m (MLP) nodes")
    close = difflib.get_close_matches(first, list(valid), n=3)
    if close:
        hints.append(f"closest valid names to {first!r}: {close}")
    hints.append(f"the graph has {graph.n_layers} layers of {graph.n_heads} heads"
                 f"{'' if graph.has_mlp else ', no MLPs'}{', parallel blocks' if graph.parallel else ''}")
    return f"{len(unknown)} unknown {kind} name(s) {shown}; " + "; ".join(hints)

