"""The Circuit object: a graph, an edge mask, a node mask, the scores and the rule that chose them."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.results import Result
from ..graph import ComponentGraph
from .export import CircuitExport
from .graph_ops import graph_cfg, prune_edges, touched_nodes
from .interchange import MibJson, jsonable
from .selection import SelectionRules


class Circuit(SelectionRules, MibJson, CircuitExport, Result):
    """A set of edges (and nodes) of a component graph with the rule that chose it (a Result: ``to_table``,
    ``summary``, ``write(run_dir)``)."""

    def __init__(self, graph: ComponentGraph, edges: np.ndarray, nodes: np.ndarray | None = None, *,
                 scores: np.ndarray | None = None, node_scores: np.ndarray | None = None,
                 rule: str = "manual", params: Mapping[str, Any] | None = None, d_model: int | None = None) -> None:
        self.graph = graph
        edges = np.asarray(edges)
        if edges.dtype != bool:
            raise InputError(f"the edge mask must be boolean, got dtype {edges.dtype}")
        if edges.shape != (graph.n_edges,):
            raise InputError(f"edge mask has shape {edges.shape}, the graph has {graph.n_edges} edges")
        self.edges = edges.copy()
        self.edges.flags.writeable = False
        if nodes is None:
            nodes = touched_nodes(graph, self.edges)
        nodes = np.asarray(nodes)
        if nodes.dtype != bool or nodes.shape != (len(graph.nodes),):
            raise InputError(f"node mask must be boolean of shape ({len(graph.nodes)},), got {nodes.dtype} {nodes.shape}")
        self.nodes = nodes.copy()
        self.nodes.flags.writeable = False
        if scores is not None:
            scores = np.ascontiguousarray(scores, dtype=np.float32).reshape(-1)
            if scores.shape != (graph.n_edges,):
                raise InputError(f"edge scores have {scores.shape[0]} entries, the graph has {graph.n_edges} edges")
            scores.flags.writeable = False
        self.scores = scores
        if node_scores is not None:
            node_scores = np.ascontiguousarray(node_scores, dtype=np.float32).reshape(-1)
            if node_scores.shape != (len(graph.nodes),):
                raise InputError(f"node scores must have one entry per node ({len(graph.nodes)}), got {node_scores.shape[0]}")
            node_scores.flags.writeable = False
        self.node_scores = node_scores
        self.rule = rule
        self.params = dict(params or {})
        self.d_model = None if d_model is None else int(d_model)

    # ---- operations --------------------------------------------------------------------------
    def prune(self, mode: str = "complete") -> "Circuit":
        """Drop nodes without a path input -> node -> logits and the edges touching them (``complete``: to a
        fixpoint); ``mode="mib"``: one pass, as MIB's ``apply_topn(..., prune=True)`` (dangling edges kept)."""
        edges, nodes = prune_edges(self.graph, self.edges, mode)
        return Circuit(self.graph, edges, nodes, scores=self.scores, node_scores=self.node_scores, rule=self.rule,
                       params={**self.params, "pruned": True if mode == "complete" else mode}, d_model=self.d_model)

    # ---- views -------------------------------------------------------------------------------
    @property
    def n_edges(self) -> int:
        """Number of edges in the circuit."""
        return int(self.edges.sum())

    @property
    def n_nodes(self) -> int:
        """Number of nodes in the circuit (``logits`` included when it is in)."""
        return int(self.nodes.sum())

    @property
    def fraction(self) -> float:
        """Share of the graph's edges in the circuit."""
        return self.n_edges / self.graph.n_edges

    @property
    def edge_indices(self) -> np.ndarray:
        """Indices of the circuit's edges (graph order)."""
        return np.flatnonzero(self.edges)

    @property
    def edge_names(self) -> list[str]:
        """Names of the circuit's edges (graph order)."""
        names = self.graph.edge_names
        return [names[i] for i in self.edge_indices]

    @property
    def node_names(self) -> list[str]:
        """Names of the circuit's nodes (graph order)."""
        return [n for n, keep in zip(self.graph.nodes, self.nodes) if keep]

    def describe(self) -> dict:
        """Rule, parameters and size, for provenance."""
        return {"rule": self.rule, "params": dict(self.params), "n_edges": self.n_edges, "n_nodes": self.n_nodes,
                "graph_edges": self.graph.n_edges, "graph": graph_cfg(self.graph)}

    def __eq__(self, other: object) -> bool:
        """Same graph shape, masks, scores (NaN equal to NaN), rule, parameters and d_model."""
        if not isinstance(other, Circuit):
            return NotImplemented
        def same(a, b):
            if a is None or b is None:
                return a is None and b is None
            return np.array_equal(a, b, equal_nan=True)
        return (graph_cfg(self.graph) == graph_cfg(other.graph) and np.array_equal(self.edges, other.edges)
                and np.array_equal(self.nodes, other.nodes) and same(self.scores, other.scores)
                and same(self.node_scores, other.node_scores) and self.rule == other.rule
                and jsonable(self.params) == jsonable(other.params) and self.d_model == other.d_model)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.params.items() if k in ("k", "threshold", "ranking", "pruned", "cutoff_ties")}
        return (f"Circuit(rule={self.rule!r}, edges={self.n_edges}/{self.graph.n_edges}, nodes={self.n_nodes}, "
                f"params={shown})")
