"""Views of a circuit for people and other tools: a text summary, its Result tables, a networkx graph."""

from __future__ import annotations

import numpy as np


class CircuitExport:
    """``summary``, the Result tables ``circuit`` and ``circuit_nodes``, and ``to_networkx`` (mixed into Circuit)."""

    main_table = "circuit"

    def summary(self, top: int = 10) -> str:
        """A short text: rule and parameters, size, nodes by layer and the top edges by score."""
        g = self.graph
        lines = [f"Circuit ({self.rule})",
                 f"  parameters : {', '.join(f'{k}={v}' for k, v in self.params.items() if not isinstance(v, dict)) or '-'}",
                 f"  edges      : {self.n_edges} of {g.n_edges} ({100 * self.fraction:.2f}%)",
                 f"  nodes      : {self.n_nodes} of {len(g.nodes)}"]
        if "cutoff_ties" in self.params:
            lines.append(f"  ties       : {self.params['cutoff_ties']} edges tied at the cut-off, "
                         f"{self.params['cutoff_ties_excluded']} left out (seeded random, circuitstat.core.topk)")
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

    def _tables(self) -> dict:
        """``circuit`` (one row per graph edge: index, name, sender, receiver, kind, layers, score, in_circuit)
        and ``circuit_nodes`` (one row per node: name, layer, score, in_circuit)."""
        g = self.graph
        cols = g.edge_table()
        scores = self.scores if self.scores is not None else np.full(g.n_edges, np.nan, dtype=np.float32)
        ns = self.node_scores if self.node_scores is not None else np.full(len(g.nodes), np.nan, dtype=np.float32)
        edges = {c: np.asarray(cols[c]) for c in ("index", "name", "sender", "receiver", "kind", "sender_layer",
                                                 "receiver_layer")}
        edges.update(score=np.asarray(scores, dtype=np.float32), in_circuit=np.asarray(self.edges),
                     tied_at_cutoff=self.tied_at_cutoff())
        nodes = {"name": np.asarray(g.nodes), "layer": np.append(g.sender_layer, g.n_layers).astype(np.int64),
                 "score": np.asarray(ns, dtype=np.float32), "in_circuit": np.asarray(self.nodes)}
        return {"circuit": edges, "circuit_nodes": nodes}

    def tied_at_cutoff(self) -> np.ndarray:
        """Return [E] True for the edges whose score ties the k-th one of a top-k rule (kept or left out at random)."""
        from circuitstat.core.topk import ranking_key

        if self.scores is None or "cutoff_key" not in self.params or self.rule != "top_k":
            return np.zeros(self.graph.n_edges, dtype=bool)
        key = ranking_key(self.scores.astype(np.float64), self.params.get("ranking", "signed"))
        return key == float(self.params["cutoff_key"])

    def to_table(self, name: str | None = None):
        """Return table ``circuit`` (default) or ``circuit_nodes``; the rule, its parameters and the graph are in
        the schema metadata (``circuitstat.provenance``)."""
        from circuitstat.core.results import Result
        from circuitstat.core.tables import with_provenance

        return with_provenance(Result.to_table(self, name), {"circuit": self.describe()})

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
                    # (or a split MoE layer's input m{L}, read by its expert nodes: no sender of its own)
                    layer = layer_of[g.nodes.index(n)] if n in g.nodes else g.receiver_layer[g.edge_receiver[e]]
                    out.add_node(n, layer=int(layer), score=None)
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

