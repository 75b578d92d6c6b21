"""Index arrays over a component graph that circuits are built from: endpoints, touched nodes, pruning, names."""

from __future__ import annotations

import difflib
from typing import Sequence

import numpy as np

from ..graph import ComponentGraph


def receiver_node_index(graph: ComponentGraph) -> np.ndarray:
    """Index in ``graph.nodes`` of the (first) node reading each receiver: [R] (a split MoE layer's input is read
    by all its experts: :func:`reader_pairs` lists them)."""
    return np.asarray([readers[0] for readers in graph.receiver_readers], dtype=np.int64)


def edge_endpoints(graph: ComponentGraph) -> tuple[np.ndarray, np.ndarray]:
    """(sender node, receiver node) of every edge, as indices into ``graph.nodes`` (see receiver_node_index)."""
    return graph.edge_sender, receiver_node_index(graph)[graph.edge_receiver]


def reader_pairs(graph: ComponentGraph) -> tuple[np.ndarray, np.ndarray]:
    """(receiver, node) index pairs: each receiver with every node reading it (its own node, or all the experts
    of a split MoE layer, which share its input: circuitstat.circuits.moe_nodes)."""
    readers = graph.receiver_readers
    return np.repeat(np.arange(graph.n_receivers), [len(x) for x in readers]), np.concatenate(readers)


def receivers_read_by(graph: ComponentGraph, nodes: np.ndarray) -> np.ndarray:
    """[R] bool: the receivers that some node of the mask ``nodes`` reads."""
    r, n = reader_pairs(graph)
    return np.bincount(r, weights=nodes[n], minlength=graph.n_receivers) > 0


def nodes_reading(graph: ComponentGraph, receivers: np.ndarray) -> np.ndarray:
    """[N] bool: the nodes that read some receiver of the mask ``receivers``."""
    r, n = reader_pairs(graph)
    return np.bincount(n, weights=receivers[r], minlength=len(graph.nodes)) > 0


def graph_cfg(graph: ComponentGraph) -> dict:
    """The graph's shape (layers, heads, MLPs, parallel blocks): two graphs with equal shapes are the same."""
    return {"n_layers": graph.n_layers, "n_heads": graph.n_heads, "has_mlp": graph.has_mlp,
            "parallel": graph.parallel, **split_cfg(graph)}


def split_cfg(graph: ComponentGraph) -> dict:
    """The graph's split MoE layers (experts as nodes) as JSON fields: {} when none is split (the keys of
    graphs written before the option are unchanged)."""
    if not graph.experts:
        return {}
    return {"experts": list(graph.experts), "shared_expert": graph.shared_expert}


def split_from(doc, where: str) -> dict:
    """ComponentGraph's ``experts``/``shared_expert`` keywords from a JSON ``doc`` written by :func:`split_cfg`
    (untrusted: InputError when malformed; the caller bounds the sender count)."""
    from circuitstat.core.errors import InputError

    if "experts" not in doc:
        return {}
    experts, shared = doc["experts"], doc.get("shared_expert", False)
    n = doc.get("n_layers")
    if (not isinstance(experts, list) or len(experts) != n or type(shared) is not bool
            or any(type(x) is not int or not 0 <= x <= 1 << 16 for x in experts) or not any(experts)):
        raise InputError(f"{where}: experts must list one expert count (>= 0, not all 0) per layer and "
                         "shared_expert be a boolean")
    return {"experts": tuple(experts), "shared_expert": shared}


def touched_nodes(graph: ComponentGraph, edges: np.ndarray) -> np.ndarray:
    """Boolean node mask: the endpoints of the chosen edges (an edge into a split MoE layer touches its experts)."""
    nodes = np.zeros(len(graph.nodes), dtype=bool)
    nodes[graph.edge_sender[edges]] = True
    return nodes | nodes_reading(graph, _receivers_fed(graph, edges))


def _receivers_fed(graph: ComponentGraph, edges: np.ndarray) -> np.ndarray:
    """[R] bool: the receivers with a chosen in-edge."""
    return np.bincount(graph.edge_receiver[edges], minlength=graph.n_receivers) > 0


PRUNES = ("complete", "mib")


def prune_edges(graph: ComponentGraph, edges: np.ndarray, mode: str = "complete") -> tuple[np.ndarray, np.ndarray]:
    """``complete``: fixpoint of: keep nodes with an in-edge and an out-edge; drop edges touching dropped nodes.
    ``mib``: one such pass, as MIB's ``Graph.apply_topn(..., prune=True)`` leaves a circuit (EAP-IG at MIB's pinned
    commit: its ``prune`` loop stops when a pass leaves the nodes apply_topn set, i.e. after the first pass), so
    edges whose endpoint lost its last in- or out-edge in that pass stay (dangling).

    A node's in-edges are those into the receivers it reads; an edge into a receiver read by several nodes (a
    split MoE layer's input) stays while one of them does."""
    if mode not in PRUNES:
        raise ValueError(f"prune must be one of {PRUNES}, got {mode!r}")
    src, dst = graph.edge_sender, graph.edge_receiver
    n_nodes = len(graph.nodes)
    logits, inp = n_nodes - 1, 0
    edges = edges.copy()
    while True:
        has_out = np.bincount(src[edges], minlength=n_nodes) > 0
        has_in = nodes_reading(graph, _receivers_fed(graph, edges))
        has_out[logits] = True
        has_in[inp] = True
        alive = has_out & has_in
        new = edges & alive[src] & receivers_read_by(graph, alive)[dst]
        if mode == "mib" or np.array_equal(new, edges):
            return new, alive
        edges = new


def is_mlp(name: str) -> bool:
    """Whether ``name`` is an MLP node name (``m0``, ``m1``, ...)."""
    return len(name) > 1 and name[0] == "m" and name[1:].isdigit()


def unknown_message(kind: str, unknown: Sequence[str], valid: Sequence[str], graph: ComponentGraph) -> str:
    """A message naming unknown node or edge names, with the closest valid names and hints on the naming."""
    unknown = [n if len(n) <= 80 else n[:60] + f"... ({len(n):,} characters)" for n in unknown]  # never a whole file
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

