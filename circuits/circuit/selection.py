"""Selection rules: the constructors that choose a circuit's edges (or nodes) from scores or names.

``ranking`` ('signed' or 'absolute') is always an explicit keyword: signed and absolute ranking give
different circuits and different MIB scores (MIB issue #19); ``absolute=True/False``, its old name,
is still read with a warning. Ties follow the one top-k rule (circuitstat.core.topk): at random from ``seed``
(reproducible: same seed, same circuit), never by index, which would favour low-index edges and make
tied edges look stable across resamples. The rule, the seed and the number of edges tied at the
cut-off are recorded in the circuit's ``params``.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, Iterable, Mapping

import numpy as np
from typing_extensions import Self  # the class a constructor is called on (Circuit)

from circuitstat.core.errors import InputError
from circuitstat.core.seeds import as_seed_sequence, seed_record
from circuitstat.core.topk import TIE_RULE, check_ranking, ranking_key, row_seeds, tie_priorities, topk

from ..graph import ComponentGraph
from .graph_ops import graph_cfg, reader_pairs, receivers_read_by, unknown_message



def _key(scores: np.ndarray, ranking: str) -> np.ndarray:
    return ranking_key(scores.astype(np.float64), ranking)


def _top(values: np.ndarray, k: int, ranking: str, ss: np.random.SeedSequence) -> tuple[np.ndarray, dict]:
    """(indices of the top k of ``values`` in rank order, the tie parameters recorded with the circuit).

    The one top-k (circuitstat.core.topk): ties at the cut-off broken by the seed's pseudo-random priorities.
    """
    ties: dict[str, Any] = {"ties": TIE_RULE, "tie_seed": seed_record(ss)}
    if k == 0:
        return np.zeros(0, dtype=np.int64), {**ties, "cutoff_ties": 0, "cutoff_ties_excluded": 0}
    t = topk(values, k, ranking=ranking, seed=ss)
    return t.indices, {**ties, "cutoff_key": float(t.threshold), "cutoff_ties": int(t.n_tied_at_cutoff),
                       "cutoff_ties_excluded": int(t.n_tied_excluded)}


def _score_vector(scores: Any, graph: ComponentGraph | None, level: str) -> tuple[np.ndarray, ComponentGraph, dict, int | None]:
    """(float32 vector, graph, provenance of the scores, d_model) from a ScoreMatrix or a vector."""
    from ..scores import ScoreMatrix, ScoreMeans

    prov: dict = {}
    d_model = None
    if isinstance(scores, (ScoreMatrix, ScoreMeans)):  # ScoreMeans: a table too large to load, read as its means
        if scores.level != level:
            raise InputError(f"this rule needs {level}-level scores, got a ScoreMatrix with level={scores.level!r}; "
                             f"run attribute(..., level={level!r})")
        if graph is not None and graph_cfg(graph) != graph_cfg(scores.graph):
            raise InputError(f"graph {graph_cfg(graph)} does not match the ScoreMatrix's graph {graph_cfg(scores.graph)}")
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


def _check_k(k: Any, n: int, what: str) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise InputError(f"k must be an integer number of {what}, got {k!r}")
    if not 0 <= int(k) <= n:
        raise InputError(f"k={int(k)} is outside [0, {n}] ({n} {what})")
    return int(k)


class SelectionRules:
    """The constructors of :class:`~circuitstat.circuits.circuit.Circuit` (mixed into it; ``cls`` is Circuit)."""

    @classmethod
    def top_k(cls, scores: Any, k: int, *, ranking: str | None = None, seed: Any = 0,
              graph: ComponentGraph | None = None, **renamed: Any) -> Self:
        """The k edges with the largest score (``ranking='absolute'``: largest ``|score|``); ties at the cut-off
        at random from ``seed`` (an int or SeedSequence; circuitstat.core.topk)."""
        ranking = check_ranking(ranking, renamed, "Circuit.top_k")
        vec, graph, prov, d_model = _score_vector(scores, graph, "edge")
        k = _check_k(k, graph.n_edges, "edges")
        idx, ties = _top(vec, k, ranking, as_seed_sequence(seed))
        edges = np.zeros(graph.n_edges, dtype=bool)
        edges[idx] = True
        return cls(graph, edges, scores=vec, rule="top_k", params={"k": k, "ranking": ranking, **ties, **prov},
                   d_model=d_model)

    @classmethod
    def threshold(cls, scores: Any, t: float, *, ranking: str | None = None, graph: ComponentGraph | None = None,
                  **renamed: Any) -> Self:
        """Every edge whose score (``ranking='absolute'``: ``|score|``) is ``>= t``."""
        ranking = check_ranking(ranking, renamed, "Circuit.threshold")
        t = float(t)
        if math.isnan(t):
            raise InputError("the threshold is NaN")
        vec, graph, prov, d_model = _score_vector(scores, graph, "edge")
        edges = _key(vec, ranking) >= t
        return cls(graph, edges, scores=vec, rule="threshold", params={"threshold": t, "ranking": ranking, **prov},
                   d_model=d_model)

    @classmethod
    def greedy(cls, scores: Any, k: int, *, ranking: str | None = None, seed: Any = 0,
               graph: ComponentGraph | None = None, **renamed: Any) -> Self:
        """Grow k edges from the logits, best candidate first (EAP-IG's ``apply_greedy``; not pruned); equal
        candidates in the order of the seed's tie priorities (the top-k's, circuitstat.core.topk)."""
        ranking = check_ranking(ranking, renamed, "Circuit.greedy")
        vec, graph, prov, d_model = _score_vector(scores, graph, "edge")
        k = _check_k(k, graph.n_edges, "edges")
        key = _key(vec, ranking)
        ss = as_seed_sequence(seed)
        pri = tie_priorities(row_seeds(ss, 1), np.arange(graph.n_edges))[0]
        logits_node = len(graph.nodes) - 1
        # in-edges of each node: the edges into its receivers (one receiver, or a head's q, k, v)
        in_edges: list[list[int]] = [[] for _ in graph.nodes]
        for r, node in zip(*reader_pairs(graph)):  # a split MoE layer's input: in-edges of each of its experts
            off, n = int(graph.edge_offset[r]), int(graph.n_upstream[r])
            in_edges[node].extend(range(off, off + n))
        in_circuit = np.zeros(len(graph.nodes), dtype=bool)
        edges = np.zeros(graph.n_edges, dtype=bool)
        heap: list[tuple[float, int]] = []

        def add_node(node: int) -> None:
            in_circuit[node] = True
            for e in in_edges[node]:
                heapq.heappush(heap, (-key[e], int(pri[e]), e))

        add_node(logits_node)
        for _ in range(k):
            *_, e = heapq.heappop(heap)  # every edge is reachable from the logits, so the heap never runs dry
            while edges[e]:  # pushed again by another expert reading the same input (experts as nodes)
                *_, e = heapq.heappop(heap)
            edges[e] = True
            u = int(graph.edge_sender[e])
            if not in_circuit[u]:
                add_node(u)
        return cls(graph, edges, scores=vec, rule="greedy",
                   params={"k": k, "ranking": ranking, "ties": TIE_RULE, "tie_seed": seed_record(ss), **prov},
                   d_model=d_model)

    @classmethod
    def from_node_scores(cls, scores: Any, k: int | None = None, *, ranking: str | None = None,
                         threshold: float | None = None, seed: Any = 0, graph: ComponentGraph | None = None,
                         **renamed: Any) -> Self:
        """Node-level circuit: the top-k senders (or those with score ``>= threshold``) and all edges between them.

        ``scores`` is a node-level ScoreMatrix or a vector over ``graph.senders``.  A NaN score
        marks an unscored node, which is always kept (EAP-IG's convention); ``k`` counts scored
        nodes only.  ``logits`` is always included.
        """
        ranking = check_ranking(ranking, renamed, "Circuit.from_node_scores")
        if (k is None) == (threshold is None):
            raise InputError("give exactly one of k and threshold")
        vec, graph, prov, d_model = _score_vector(scores, graph, "node")
        scored = ~np.isnan(vec)
        key = np.where(scored, _key(np.nan_to_num(vec), ranking), -np.inf)
        keep = ~scored
        if k is not None:
            k = _check_k(k, int(scored.sum()), "scored nodes")
            which = np.flatnonzero(scored)
            idx, ties = _top(vec[which], k, ranking, as_seed_sequence(seed))
            keep[which[idx]] = True
            params = {"k": k, **ties}
        else:
            keep |= scored & (key >= float(threshold))
            params = {"threshold": float(threshold)}
        node_scores = np.append(vec, np.float32(np.nan))
        names = [graph.senders[i] for i in np.flatnonzero(keep)]
        out = cls.from_nodes(graph, names, node_scores=node_scores, d_model=d_model)
        out.rule = "node_top_k" if k is not None else "node_threshold"
        out.params = {**params, "ranking": ranking, **prov}
        return out

    @classmethod
    def from_nodes(cls, graph: ComponentGraph, nodes: Iterable[str], *, node_scores: np.ndarray | None = None,
                   d_model: int | None = None) -> Self:
        """Node-level circuit from node names: all edges whose sender and receiver node are included."""
        lookup = {name: i for i, name in enumerate(graph.nodes)}
        names = list(nodes)
        unknown = [n for n in names if n not in lookup]
        if unknown:
            raise InputError(unknown_message("node", unknown, graph.nodes, graph))
        mask = np.zeros(len(graph.nodes), dtype=bool)
        mask[[lookup[n] for n in names]] = True
        mask[-1] = True  # logits
        edges = mask[graph.edge_sender] & receivers_read_by(graph, mask)[graph.edge_receiver]
        return cls(graph, edges, mask, node_scores=node_scores, rule="nodes", params={"nodes": sorted(set(names))},
                   d_model=d_model)

    @classmethod
    def from_edges(cls, graph: ComponentGraph, edges: Any, *, scores: np.ndarray | None = None,
                   d_model: int | None = None) -> Self:
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
                raise InputError(unknown_message("edge", unknown, graph.edge_names, graph))
            mask[[lookup[str(n)] for n in arr]] = True
        elif arr.size:
            if arr.dtype.kind not in "iu":
                raise InputError(f"edges must be names, indices or a boolean mask, got dtype {arr.dtype}")
            if arr.min() < 0 or arr.max() >= graph.n_edges:
                raise InputError(f"edge indices must lie in [0, {graph.n_edges}), got {arr.min()}..{arr.max()}")
            mask[arr] = True
        return cls(graph, mask, scores=scores, rule="edges", params={"n_edges": int(mask.sum())}, d_model=d_model)

    @classmethod
    def full(cls, graph: ComponentGraph) -> Self:
        """Every edge of the graph (the model itself)."""
        return cls(graph, np.ones(graph.n_edges, dtype=bool), rule="full")

    @classmethod
    def empty(cls, graph: ComponentGraph) -> Self:
        """No edge (everything carries the counterfactual)."""
        return cls(graph, np.zeros(graph.n_edges, dtype=bool), rule="empty")

