"""Circuits: a subset of a component graph's edges, chosen from scores by an explicit, recorded rule.

A :class:`Circuit` is a :class:`~circuits.graph.ComponentGraph`, a boolean edge mask ``[E]``, a
boolean node mask over ``graph.nodes`` (senders, then ``logits``), the scores it was chosen from
and the rule with its parameters (provenance).  Circuits are immutable in spirit: every operation
(``prune``) returns a new one.

Selection rules (``absolute`` is always an explicit keyword: signed and absolute ranking give
different circuits and different MIB scores, MIB issue #19):

* :meth:`Circuit.top_k` -- the k edges with the largest score (or ``|score|``); ties at the cut-off
  go to the smaller edge index, so the result never depends on the sort algorithm.
* :meth:`Circuit.threshold` -- every edge with score (or ``|score|``) ``>= t``.
* :meth:`Circuit.greedy` -- grow from the logits as the EAP-IG library's ``Graph.apply_greedy``:
  the candidates are the in-edges of nodes already in the circuit (initially ``logits``); the best
  candidate is added, its sender joins the circuit and the sender's in-edges become candidates
  (a head's in-edges are its q, k and v inputs).  Ties go to the smaller edge index.
* :meth:`Circuit.from_node_scores` / :meth:`Circuit.from_nodes` -- node-level circuits: a set of
  senders, and every edge between included nodes (``logits`` always counts as included).
* :meth:`Circuit.from_edges` -- an explicit edge set.

The node set of an edge-selected circuit is the set of nodes its edges touch.  :meth:`prune`
removes every node that has no path from ``input`` to ``logits`` inside the circuit, and every
edge touching a removed node, iterated to a fixpoint (``input`` always counts as having inputs,
``logits`` as having outputs; a head counts as having inputs if any of its q/k/v inputs has an
in-edge).  It is the EAP-IG library's ``Graph.prune``; afterwards every edge lies on an
input -> logits path.

Exchange format: the EAP-IG / MIB JSON graph format (:meth:`to_json`, :meth:`from_json`)::

    {"cfg": {"n_layers", "n_heads", "parallel_attn_mlp", "d_model"},
     "nodes": {"a0.h1": {"in_graph": bool, "score"?: float}, ...},
     "edges": {"a0.h1->a1.h2<k>": {"score": float, "in_graph": bool}, ...}}

Export writes every node and edge of the graph (as EAP-IG does).  Two additions, both ignored by
EAP-IG's ``Graph.from_json``: ``cfg["has_mlp"] = false`` for attention-only models (which have no
``m`` nodes) and a top-level ``"circuitstat"`` block with the rule, its parameters and whether the
circuit has edge / node scores, so that export followed by import gives an identical circuit.
Import validates every name against the graph and reports unknown ones with the closest valid
names; edges absent from the JSON are out of the circuit with score NaN.
"""

from __future__ import annotations

import difflib
import heapq
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .errors import InputError
from .graph import ComponentGraph

__all__ = ["Circuit", "EAPIG_FORMAT_VERSION"]

EAPIG_FORMAT_VERSION = 1


# ---- small graph helpers ------------------------------------------------------------------------
def _receiver_node(graph: ComponentGraph) -> np.ndarray:
    """Index in ``graph.nodes`` of the node each receiver belongs to: [R]."""
    lookup = {name: i for i, name in enumerate(graph.nodes)}
    return np.asarray([lookup[graph.receiver_node(r)] for r in range(graph.n_receivers)], dtype=np.int64)


def _edge_endpoints(graph: ComponentGraph) -> tuple[np.ndarray, np.ndarray]:
    """(sender node, receiver node) of every edge, as indices into ``graph.nodes``."""
    return graph.edge_sender, _receiver_node(graph)[graph.edge_receiver]


def _graph_cfg(graph: ComponentGraph) -> dict:
    return {"n_layers": graph.n_layers, "n_heads": graph.n_heads, "has_mlp": graph.has_mlp,
            "parallel": graph.parallel}


def _touched_nodes(graph: ComponentGraph, edges: np.ndarray) -> np.ndarray:
    """Boolean node mask: the endpoints of the chosen edges."""
    src, dst = _edge_endpoints(graph)
    nodes = np.zeros(len(graph.nodes), dtype=bool)
    nodes[src[edges]] = True
    nodes[dst[edges]] = True
    return nodes


def _prune(graph: ComponentGraph, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fixpoint of: keep nodes with an in-edge and an out-edge; drop edges touching dropped nodes."""
    src, dst = _edge_endpoints(graph)
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


def _key(scores: np.ndarray, absolute: bool) -> np.ndarray:
    return np.abs(scores.astype(np.float64)) if absolute else scores.astype(np.float64)


def _check_absolute(absolute: Any) -> bool:
    if not isinstance(absolute, (bool, np.bool_)):
        raise InputError(f"absolute must be True or False (an explicit choice: signed and absolute ranking give "
                         f"different circuits), got {absolute!r}")
    return bool(absolute)


def _score_vector(scores: Any, graph: ComponentGraph | None, level: str) -> tuple[np.ndarray, ComponentGraph, dict, int | None]:
    """(float32 vector, graph, provenance of the scores, d_model) from a ScoreMatrix or a vector."""
    from .scores import ScoreMatrix

    prov: dict = {}
    d_model = None
    if isinstance(scores, ScoreMatrix):
        if scores.level != level:
            raise InputError(f"this rule needs {level}-level scores, got a ScoreMatrix with level={scores.level!r}; "
                             f"run attribute(..., level={level!r})")
        if graph is not None and _graph_cfg(graph) != _graph_cfg(scores.graph):
            raise InputError(f"graph {_graph_cfg(graph)} does not match the ScoreMatrix's graph {_graph_cfg(scores.graph)}")
        graph = scores.graph
        prov = {"scores": scores.describe(), "reduction": "mean over examples"}
        model = scores.provenance.get("model") if isinstance(scores.provenance, Mapping) else None
        if isinstance(model, Mapping):
            d_model = model.get("d_model")
            prov["model"] = {k: model[k] for k in ("source", "weight_hash") if k in model}
        vec = scores.mean()
    else:
        if hasattr(scores, "detach"):  # torch tensor
            scores = scores.detach().float().cpu().numpy()
        vec = np.asarray(scores)
        if vec.ndim == 2:
            raise InputError(f"pass a score vector, not a matrix {vec.shape}: e.g. ScoreMatrix.mean() or the ScoreMatrix itself")
    if graph is None:
        raise InputError("pass graph=model.graph with a plain score vector (a ScoreMatrix carries its graph)")
    vec = np.asarray(vec)
    if not np.issubdtype(vec.dtype, np.number):
        raise InputError(f"scores must be numbers, got dtype {vec.dtype}")
    vec = np.ascontiguousarray(vec, dtype=np.float32).reshape(-1)
    n = graph.n_edges if level == "edge" else graph.n_senders
    what = "edges" if level == "edge" else "senders (graph.senders)"
    if vec.shape[0] != n:
        raise InputError(f"score vector has {vec.shape[0]} entries, the graph has {n} {what}")
    if level == "edge" and np.isnan(vec).any():
        bad = np.flatnonzero(np.isnan(vec))
        raise InputError(f"edge scores are NaN for {bad.size} edges (first: {graph.edge_names[bad[0]]}); "
                         "fix the attribution run or drop them explicitly")
    return vec, graph, prov, d_model


class Circuit:
    """A set of edges (and nodes) of a component graph with the rule that chose it."""

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
            nodes = _touched_nodes(graph, self.edges)
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

    # ---- constructors ------------------------------------------------------------------------
    @classmethod
    def top_k(cls, scores: Any, k: int, *, absolute: bool, graph: ComponentGraph | None = None) -> "Circuit":
        """The k edges with the largest score (``absolute=True``: largest ``|score|``); ties by edge index."""
        absolute = _check_absolute(absolute)
        vec, graph, prov, d_model = _score_vector(scores, graph, "edge")
        k = _check_k(k, graph.n_edges, "edges")
        order = np.lexsort((np.arange(vec.size), -_key(vec, absolute)))
        edges = np.zeros(graph.n_edges, dtype=bool)
        edges[order[:k]] = True
        return cls(graph, edges, scores=vec, rule="top_k",
                   params={"k": k, "absolute": absolute, "ties": "smaller edge index first", **prov}, d_model=d_model)

    @classmethod
    def threshold(cls, scores: Any, t: float, *, absolute: bool, graph: ComponentGraph | None = None) -> "Circuit":
        """Every edge whose score (``absolute=True``: ``|score|``) is ``>= t``."""
        absolute = _check_absolute(absolute)
        t = float(t)
        if math.isnan(t):
            raise InputError("the threshold is NaN")
        vec, graph, prov, d_model = _score_vector(scores, graph, "edge")
        edges = _key(vec, absolute) >= t
        return cls(graph, edges, scores=vec, rule="threshold", params={"threshold": t, "absolute": absolute, **prov},
                   d_model=d_model)

    @classmethod
    def greedy(cls, scores: Any, k: int, *, absolute: bool, graph: ComponentGraph | None = None) -> "Circuit":
        """Grow k edges from the logits, best candidate first (EAP-IG's ``apply_greedy``; not pruned)."""
        absolute = _check_absolute(absolute)
        vec, graph, prov, d_model = _score_vector(scores, graph, "edge")
        k = _check_k(k, graph.n_edges, "edges")
        key = _key(vec, absolute)
        logits_node = len(graph.nodes) - 1
        # in-edges of each node: the edges into its receivers (one receiver, or a head's q, k, v)
        rnode = _receiver_node(graph)
        in_edges: list[list[int]] = [[] for _ in graph.nodes]
        for r in range(graph.n_receivers):
            off, n = int(graph.edge_offset[r]), int(graph.n_upstream[r])
            in_edges[rnode[r]].extend(range(off, off + n))
        in_circuit = np.zeros(len(graph.nodes), dtype=bool)
        edges = np.zeros(graph.n_edges, dtype=bool)
        heap: list[tuple[float, int]] = []

        def add_node(node: int) -> None:
            in_circuit[node] = True
            for e in in_edges[node]:
                heapq.heappush(heap, (-key[e], e))

        add_node(logits_node)
        for _ in range(k):
            _, e = heapq.heappop(heap)  # every edge is reachable from the logits, so the heap never runs dry
            edges[e] = True
            u = int(graph.edge_sender[e])
            if not in_circuit[u]:
                add_node(u)
        return cls(graph, edges, scores=vec, rule="greedy",
                   params={"k": k, "absolute": absolute, "ties": "smaller edge index first", **prov}, d_model=d_model)

    @classmethod
    def from_node_scores(cls, scores: Any, k: int | None = None, *, absolute: bool, threshold: float | None = None,
                         graph: ComponentGraph | None = None) -> "Circuit":
        """Node-level circuit: the top-k senders (or those with score ``>= threshold``) and all edges between them.

        ``scores`` is a node-level ScoreMatrix or a vector over ``graph.senders``.  A NaN score
        marks an unscored node, which is always kept (EAP-IG's convention); ``k`` counts scored
        nodes only.  ``logits`` is always included.
        """
        absolute = _check_absolute(absolute)
        if (k is None) == (threshold is None):
            raise InputError("give exactly one of k and threshold")
        vec, graph, prov, d_model = _score_vector(scores, graph, "node")
        scored = ~np.isnan(vec)
        key = np.where(scored, _key(np.nan_to_num(vec), absolute), -np.inf)
        keep = ~scored
        if k is not None:
            k = _check_k(k, int(scored.sum()), "scored nodes")
            order = np.lexsort((np.arange(vec.size), -key))
            keep[order[:k]] = True
            params = {"k": k}
        else:
            keep |= scored & (key >= float(threshold))
            params = {"threshold": float(threshold)}
        node_scores = np.append(vec, np.float32(np.nan))
        names = [graph.senders[i] for i in np.flatnonzero(keep)]
        out = cls.from_nodes(graph, names, node_scores=node_scores, d_model=d_model)
        out.rule = "node_top_k" if k is not None else "node_threshold"
        out.params = {**params, "absolute": absolute, "ties": "smaller node index first", **prov}
        return out

    @classmethod
    def from_nodes(cls, graph: ComponentGraph, nodes: Iterable[str], *, node_scores: np.ndarray | None = None,
                   d_model: int | None = None) -> "Circuit":
        """Node-level circuit from node names: all edges whose sender and receiver node are included."""
        lookup = {name: i for i, name in enumerate(graph.nodes)}
        names = list(nodes)
        unknown = [n for n in names if n not in lookup]
        if unknown:
            raise InputError(_unknown_message("node", unknown, graph.nodes, graph))
        mask = np.zeros(len(graph.nodes), dtype=bool)
        mask[[lookup[n] for n in names]] = True
        mask[-1] = True  # logits
        src, dst = _edge_endpoints(graph)
        edges = mask[src] & mask[dst]
        return cls(graph, edges, mask, node_scores=node_scores, rule="nodes", params={"nodes": sorted(set(names))},
                   d_model=d_model)

    @classmethod
    def from_edges(cls, graph: ComponentGraph, edges: Any, *, scores: np.ndarray | None = None,
                   d_model: int | None = None) -> "Circuit":
        """A circuit from edge names, edge indices or a boolean mask [E]."""
        arr = np.asarray(list(edges) if not isinstance(edges, np.ndarray) else edges)
        mask = np.zeros(graph.n_edges, dtype=bool)
        if arr.dtype == bool:
            if arr.shape != (graph.n_edges,):
                raise InputError(f"edge mask has shape {arr.shape}, the graph has {graph.n_edges} edges")
            mask = arr.copy()
        elif arr.size and arr.dtype.kind in "US":
            lookup = {n: i for i, n in enumerate(graph.edge_names)}
            unknown = [str(n) for n in arr if str(n) not in lookup]
            if unknown:
                raise InputError(_unknown_message("edge", unknown, graph.edge_names, graph))
            mask[[lookup[str(n)] for n in arr]] = True
        elif arr.size:
            if arr.dtype.kind not in "iu":
                raise InputError(f"edges must be names, indices or a boolean mask, got dtype {arr.dtype}")
            if arr.min() < 0 or arr.max() >= graph.n_edges:
                raise InputError(f"edge indices must lie in [0, {graph.n_edges}), got {arr.min()}..{arr.max()}")
            mask[arr] = True
        return cls(graph, mask, scores=scores, rule="edges", params={"n_edges": int(mask.sum())}, d_model=d_model)

    @classmethod
    def full(cls, graph: ComponentGraph) -> "Circuit":
        """Every edge of the graph (the model itself)."""
        return cls(graph, np.ones(graph.n_edges, dtype=bool), rule="full")

    @classmethod
    def empty(cls, graph: ComponentGraph) -> "Circuit":
        """No edge (everything carries the counterfactual)."""
        return cls(graph, np.zeros(graph.n_edges, dtype=bool), rule="empty")

    # ---- operations --------------------------------------------------------------------------
    def prune(self) -> "Circuit":
        """Drop nodes without a path input -> node -> logits and the edges touching them (to a fixpoint)."""
        edges, nodes = _prune(self.graph, self.edges)
        return Circuit(self.graph, edges, nodes, scores=self.scores, node_scores=self.node_scores, rule=self.rule,
                       params={**self.params, "pruned": True}, d_model=self.d_model)

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
                "graph_edges": self.graph.n_edges, "graph": _graph_cfg(self.graph)}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Circuit):
            return NotImplemented
        def same(a, b):
            if a is None or b is None:
                return a is None and b is None
            return np.array_equal(a, b, equal_nan=True)
        return (_graph_cfg(self.graph) == _graph_cfg(other.graph) and np.array_equal(self.edges, other.edges)
                and np.array_equal(self.nodes, other.nodes) and same(self.scores, other.scores)
                and same(self.node_scores, other.node_scores) and self.rule == other.rule
                and _jsonable(self.params) == _jsonable(other.params) and self.d_model == other.d_model)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Circuit(rule={self.rule!r}, edges={self.n_edges}/{self.graph.n_edges}, nodes={self.n_nodes}, "
                f"params={ {k: v for k, v in self.params.items() if k in ('k', 'threshold', 'absolute', 'pruned')} })")

    def summary(self, top: int = 10) -> str:
        """A short text: rule and parameters, size, nodes by layer and the top edges by score."""
        g = self.graph
        lines = [f"Circuit ({self.rule})",
                 f"  parameters : {', '.join(f'{k}={v}' for k, v in self.params.items() if not isinstance(v, dict)) or '-'}",
                 f"  edges      : {self.n_edges} of {g.n_edges} ({100 * self.fraction:.2f}%)",
                 f"  nodes      : {self.n_nodes} of {len(g.nodes)}"]
        layer_of = list(g.sender_layer) + [g.n_layers]
        by_layer: dict[int, list[str]] = {}
        for i in np.flatnonzero(self.nodes):
            by_layer.setdefault(int(layer_of[i]), []).append(g.nodes[i])
        for layer in sorted(by_layer):
            label = "input" if layer < 0 else ("output" if layer == g.n_layers else f"layer {layer}")
            lines.append(f"    {label:<8} {' '.join(by_layer[layer])}")
        idx = self.edge_indices
        if idx.size:
            if self.scores is not None:
                idx = idx[np.lexsort((idx, -np.abs(self.scores[idx].astype(np.float64))))]
            lines.append(f"  top edges{' by |score|' if self.scores is not None else ''}:")
            for e in idx[:top]:
                s = "" if self.scores is None else f"{float(self.scores[e]):+.4g}  "
                lines.append(f"    {s}{g.edge_names[e]}")
            if idx.size > top:
                lines.append(f"    ... {idx.size - top} more")
        return "\n".join(lines)

    def to_table(self):
        """pyarrow table, one row per graph edge: index, name, sender, receiver, kind, layers, score, in_circuit.

        The rule, its parameters and the graph are in the schema metadata (``circuitstat.provenance``).
        """
        import pyarrow as pa

        from reports.tables import with_provenance

        cols = self.graph.edge_table()
        scores = self.scores if self.scores is not None else np.full(self.graph.n_edges, np.nan, dtype=np.float32)
        table = pa.table({
            "index": pa.array(cols["index"]), "name": pa.array(cols["name"]), "sender": pa.array(cols["sender"]),
            "receiver": pa.array(cols["receiver"]), "kind": pa.array(cols["kind"]),
            "sender_layer": pa.array(cols["sender_layer"]), "receiver_layer": pa.array(cols["receiver_layer"]),
            "score": pa.array(scores, type=pa.float32()), "in_circuit": pa.array(self.edges),
        })
        return with_provenance(table, {"circuit": self.describe()})

    def nodes_table(self):
        """pyarrow table, one row per node: name, layer, score, in_circuit."""
        import pyarrow as pa

        g = self.graph
        ns = self.node_scores if self.node_scores is not None else np.full(len(g.nodes), np.nan, dtype=np.float32)
        return pa.table({"name": g.nodes, "layer": pa.array(np.append(g.sender_layer, g.n_layers)),
                         "score": pa.array(ns, type=pa.float32()), "in_circuit": pa.array(self.nodes)})

    def to_networkx(self):
        """networkx DiGraph of the circuit on node names.

        Nodes carry ``layer`` and ``score`` (node score or None).  A head's q, k and v inputs
        collapse onto one node edge ``u -> head`` that lists them: ``receivers`` (e.g.
        ``["a1.h0<q>", "a1.h0<k>"]``), ``qkv`` (``["q", "k"]``; empty for MLP and logits),
        ``names``, ``scores`` (one per receiver) and ``score`` (their sum; None without scores).
        """
        import networkx as nx

        g = self.graph
        out = nx.DiGraph()
        layer_of = list(g.sender_layer) + [g.n_layers]
        for i in np.flatnonzero(self.nodes):
            s = None if self.node_scores is None or np.isnan(self.node_scores[i]) else float(self.node_scores[i])
            out.add_node(g.nodes[i], layer=int(layer_of[i]), score=s)
        for e in self.edge_indices:
            u = g.senders[g.edge_sender[e]]
            r = g.receivers[g.edge_receiver[e]]
            v = g.receiver_node(g.edge_receiver[e])
            for n in (u, v):
                if n not in out:  # an edge of an unpruned circuit may touch a node outside the node set
                    out.add_node(n, layer=int(layer_of[g.nodes.index(n)]), score=None)
            s = None if self.scores is None else float(self.scores[e])
            if not out.has_edge(u, v):
                out.add_edge(u, v, receivers=[], qkv=[], names=[], scores=[], score=None)
            d = out[u][v]
            d["receivers"].append(r)
            d["names"].append(g.edge_names[e])
            d["scores"].append(s)
            if r.endswith(">"):
                d["qkv"].append(r[-2])
            if s is not None:
                d["score"] = s if d["score"] is None else d["score"] + s
        return out

    # ---- EAP-IG / MIB JSON -------------------------------------------------------------------
    def to_json(self, path: str | os.PathLike | None = None, *, d_model: int | None = None) -> dict:
        """The circuit in the EAP-IG / MIB JSON graph format; written atomically to ``path`` if given.

        ``d_model`` (needed by EAP-IG's loader) defaults to the one recorded with the scores.
        Circuits without edge scores export score 0.0 (EAP-IG's default).
        """
        g = self.graph
        d_model = d_model if d_model is not None else self.d_model
        if d_model is None:
            raise InputError("EAP-IG's graph format needs d_model: pass to_json(..., d_model=model.cfg.d_model)")
        cfg: dict[str, Any] = {"n_layers": g.n_layers, "n_heads": g.n_heads, "parallel_attn_mlp": bool(g.parallel),
                               "d_model": int(d_model)}
        if not g.has_mlp:
            cfg["has_mlp"] = False
        nodes: dict[str, dict] = {}
        for i, name in enumerate(g.nodes):
            entry: dict[str, Any] = {"in_graph": bool(self.nodes[i])}
            if self.node_scores is not None and not np.isnan(self.node_scores[i]):
                entry["score"] = float(self.node_scores[i])
            nodes[name] = entry
        scores = self.scores if self.scores is not None else np.zeros(g.n_edges, dtype=np.float32)
        edges = {name: {"score": float(scores[i]), "in_graph": bool(self.edges[i])} for i, name in enumerate(g.edge_names)}
        doc = {"cfg": cfg, "nodes": nodes, "edges": edges,
               "circuitstat": {"format_version": EAPIG_FORMAT_VERSION, "rule": self.rule, "params": _jsonable(self.params),
                               "edge_scores": self.scores is not None, "node_scores": self.node_scores is not None}}
        if path is not None:
            _write_json_file(path, json.dumps(doc).encode())
        return doc

    @classmethod
    def from_json(cls, source: str | os.PathLike | Mapping, graph: ComponentGraph | None = None) -> "Circuit":
        """A circuit from an EAP-IG / MIB JSON graph (a path or the parsed dict), validated against ``graph``.

        Without ``graph`` the graph is built from the JSON's ``cfg``.  Unknown node or edge names,
        a ``cfg`` that does not match ``graph`` and malformed entries raise InputError naming them.
        """
        if isinstance(source, Mapping):
            doc, where = source, "the JSON graph"
        else:
            p = Path(source)
            if not p.exists():
                raise InputError(f"circuit file {p} not found")
            try:
                doc = json.loads(p.read_text())
            except json.JSONDecodeError as exc:
                raise InputError(f"{p} is not valid JSON ({exc}); expected an EAP-IG/MIB graph file") from None
            where = str(p)
        if not isinstance(doc, Mapping):
            raise InputError(f"{where}: expected a JSON object with keys cfg, nodes, edges")
        missing = [k for k in ("cfg", "nodes", "edges") if k not in doc]
        if missing:
            raise InputError(f"{where}: missing key(s) {missing}; an EAP-IG/MIB graph has 'cfg', 'nodes' and 'edges'")
        cfg, jnodes, jedges = doc["cfg"], doc["nodes"], doc["edges"]
        if not isinstance(cfg, Mapping) or not isinstance(jnodes, Mapping) or not isinstance(jedges, Mapping):
            raise InputError(f"{where}: 'cfg', 'nodes' and 'edges' must be JSON objects")
        for key in ("n_layers", "n_heads"):
            if not isinstance(cfg.get(key), int) or isinstance(cfg.get(key), bool) or cfg[key] < 1:
                raise InputError(f"{where}: cfg.{key} must be a positive integer, got {cfg.get(key)!r}")
        if "has_mlp" in cfg:
            has_mlp = bool(cfg["has_mlp"])
        else:  # EAP-IG graphs always have MLPs; a foreign attention-only export may just lack m nodes
            has_mlp = any(_is_mlp(n) for n in jnodes) or any(_is_mlp(n.split("->")[-1]) for n in jedges) or not jnodes
        built = ComponentGraph(int(cfg["n_layers"]), int(cfg["n_heads"]), has_mlp, bool(cfg.get("parallel_attn_mlp", False)))
        if graph is None:
            graph = built
        elif _graph_cfg(graph) != _graph_cfg(built):
            raise InputError(f"{where} describes a graph {_graph_cfg(built)} but the model's graph is {_graph_cfg(graph)}; "
                             "load it with the model it was made for")
        # nodes
        node_lookup = {n: i for i, n in enumerate(graph.nodes)}
        unknown = [n for n in jnodes if n not in node_lookup]
        if unknown:
            raise InputError(f"{where}: " + _unknown_message("node", unknown, graph.nodes, graph))
        nodes = np.zeros(len(graph.nodes), dtype=bool)
        node_scores = np.full(len(graph.nodes), np.nan, dtype=np.float32)
        any_node_score = False
        for name, entry in jnodes.items():
            nodes[node_lookup[name]] = _in_graph(entry, f"{where}: node {name!r}")
            if "score" in entry:
                node_scores[node_lookup[name]] = _score(entry["score"], f"{where}: node {name!r}")
                any_node_score = True
        # edges
        edge_lookup = graph._edge_lookup
        unknown = [n for n in jedges if n not in edge_lookup]
        if unknown:
            raise InputError(f"{where}: " + _unknown_message("edge", unknown, graph.edge_names, graph))
        edges = np.zeros(graph.n_edges, dtype=bool)
        scores = np.full(graph.n_edges, np.nan, dtype=np.float32)
        for name, entry in jedges.items():
            i = edge_lookup[name]
            edges[i] = _in_graph(entry, f"{where}: edge {name!r}")
            if "score" in entry:
                scores[i] = _score(entry["score"], f"{where}: edge {name!r}")
        meta = doc.get("circuitstat") if isinstance(doc.get("circuitstat"), Mapping) else None
        has_edge_scores = meta.get("edge_scores", True) if meta else bool(np.isfinite(scores).any())
        has_node_scores = meta.get("node_scores", any_node_score) if meta else any_node_score
        n_missing = graph.n_edges - len(jedges)
        if meta:
            rule, params = str(meta.get("rule", "json")), dict(meta.get("params", {}))
        else:
            rule = "json"
            params = {"source": where if where != "the JSON graph" else None, "format": "EAP-IG/MIB"}
            if n_missing:
                params["edges_missing_from_json"] = n_missing
        d_model = cfg.get("d_model")
        return cls(graph, edges, nodes, scores=scores if has_edge_scores else None,
                   node_scores=node_scores if has_node_scores else None, rule=rule, params=params,
                   d_model=int(d_model) if isinstance(d_model, int) else None)


# ---- validation helpers ---------------------------------------------------------------------------
def _check_k(k: Any, n: int, what: str) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise InputError(f"k must be an integer number of {what}, got {k!r}")
    if not 0 <= int(k) <= n:
        raise InputError(f"k={int(k)} is outside [0, {n}] ({n} {what})")
    return int(k)


def _is_mlp(name: str) -> bool:
    return len(name) > 1 and name[0] == "m" and name[1:].isdigit()


def _in_graph(entry: Any, what: str) -> bool:
    if not isinstance(entry, Mapping) or "in_graph" not in entry:
        raise InputError(f"{what}: expected an object with 'in_graph' (and 'score'), got {entry!r}")
    v = entry["in_graph"]
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise InputError(f"{what}: in_graph must be true or false, got {v!r}")


def _score(v: Any, what: str) -> float:
    if v is None:
        return float("nan")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InputError(f"{what}: score must be a number, got {v!r}")
    return float(v)


def _unknown_message(kind: str, unknown: Sequence[str], valid: Sequence[str], graph: ComponentGraph) -> str:
    shown = ", ".join(repr(n) for n in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
    hints = []
    first = unknown[0]
    if kind == "edge" and "->" in first and not first.endswith(">") and first.split("->")[-1].startswith("a"):
        hints.append("edges into attention heads name the input: 'a0.h1->a1.h2<q>' (or <k>, <v>)")
    if not graph.has_mlp and any(_is_mlp(p) for n in unknown for p in n.replace("<", "->").split("->")):
        hints.append("this model is attention-only and has no m (MLP) nodes")
    close = difflib.get_close_matches(first, list(valid), n=3)
    if close:
        hints.append(f"closest valid names to {first!r}: {close}")
    hints.append(f"the graph has {graph.n_layers} layers of {graph.n_heads} heads"
                 f"{'' if graph.has_mlp else ', no MLPs'}{', parallel blocks' if graph.parallel else ''}")
    return f"unknown {kind} name(s) {shown}; " + "; ".join(hints)


def _jsonable(obj: Any) -> Any:
    """Parameters as plain JSON types (so equality survives a JSON round trip)."""
    from reports.provenance import to_jsonable  # the one JSON conversion (torch-free writer layer)

    return to_jsonable(obj, repr)


def _write_json_file(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` atomically to the file `path`; InputError (one line) when that cannot be a file."""
    from reports.atomic import atomic_write_bytes

    p = Path(path)
    if p.is_dir() or str(path).endswith(("/", os.sep)):
        raise InputError(f"{path} is a directory; give a file path for the circuit's JSON, such as {p / 'circuit.json'}")
    parent = next(a for a in p.parents if a.exists())
    if not parent.is_dir():
        raise InputError(f"{parent} is a file, so {path} cannot be written; give another path for the JSON")
    try:
        return atomic_write_bytes(p, data)
    except OSError as e:
        raise InputError(f"cannot write {path}: {e.strerror or e}; give a path in a directory you can write to") from None
