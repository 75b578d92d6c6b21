"""The component graph: named senders, receivers and edges in the EAP-IG / MIB naming.

Senders are ``input``, every head ``a{L}.h{H}`` and every MLP ``m{L}``, in topological order.
Receivers are each head's query, key and value input (``a{L}.h{H}<q>`` ...), each MLP input and
``logits``.  An edge runs from every sender to every receiver downstream of it.

Two orderings make everything else cheap:

* senders are topologically sorted, so the senders upstream of any receiver are a *prefix* of the
  sender list (``n_upstream[r]`` of them);
* edges are grouped by receiver (receiver order, then sender order), so the edges into receiver
  ``r`` are the contiguous slice ``edge_offset[r] : edge_offset[r] + n_upstream[r]``.

Within a layer the receivers are ordered all q inputs, then all k, then all v, then the MLP, so
a layer's attention receivers reshape to ``[3, H]``.  In a parallel block (GPT-NeoX/Pythia) the
MLP reads the layer's input, so the same layer's heads do not feed it.

Mixture-of-experts models may split a sparse layer's MLP *sender* into one sender per routed expert
(``experts``: ``m{L}.e{J}``, then ``m{L}.shared`` with ``shared_expert``; docs/families.md, "Experts as
nodes").  The layer keeps ONE MLP receiver ``m{L}`` (the experts share their input), so only the
number of senders of such a layer changes; without ``experts`` every layer has one MLP sender.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

QKV = ("q", "k", "v")


@dataclass(frozen=True)
class ComponentGraph:
    """Sender/receiver/edge index for a transformer with ``n_layers`` layers of ``n_heads`` heads."""

    n_layers: int
    n_heads: int
    has_mlp: bool = True
    parallel: bool = False
    experts: tuple[int, ...] = ()  # per layer: routed-expert senders of a split MoE MLP (0: one sender m{L})
    shared_expert: bool = False  # split layers also have the shared-expert sender m{L}.shared

    def __post_init__(self) -> None:
        if self.experts and (len(self.experts) != self.n_layers or not self.has_mlp
                             or any(type(x) is not int or x < 0 for x in self.experts) or not any(self.experts)):
            raise ValueError(f"experts must give, for each of the {self.n_layers} MLP layers, a count >= 0 "
                             f"(not all 0), got {self.experts!r}")
        if self.shared_expert and not self.experts:
            raise ValueError("shared_expert needs split layers (experts)")

    # ---- per-layer MLP senders -------------------------------------------------------------
    def mlp_count(self, layer: int) -> int:
        """Number of MLP senders of ``layer``: 0 without MLPs, 1, or a split layer's experts (+ shared)."""
        if not self.has_mlp:
            return 0
        x = self.experts[layer] if self.experts else 0
        return x + int(self.shared_expert) if x else 1

    def mlp_names(self, layer: int) -> list[str]:
        """Names of ``layer``'s MLP senders: ``m{L}``, or ``m{L}.e0`` ... (``m{L}.shared``) when split."""
        if not self.has_mlp:
            return []
        x = self.experts[layer] if self.experts else 0
        if not x:
            return [f"m{layer}"]
        return [f"m{layer}.e{j}" for j in range(x)] + ([f"m{layer}.shared"] if self.shared_expert else [])

    def mlp_senders(self, layer: int) -> range:
        """Indices of ``layer``'s MLP senders in the sender list (one, or a split layer's several)."""
        first = self.mlp_sender(layer)
        return range(first, first + self.mlp_count(layer))

    @cached_property
    def _layer_first(self) -> np.ndarray:
        """Index of each layer's first sender (its head 0); one more entry: the number of senders."""
        per = [self.n_heads + self.mlp_count(layer) for layer in range(self.n_layers)]
        return np.concatenate([[1], 1 + np.cumsum(per)]).astype(np.int64)

    # ---- senders ---------------------------------------------------------------------------
    @cached_property
    def senders(self) -> list[str]:
        """Sender names in topological order."""
        names = ["input"]
        for layer in range(self.n_layers):
            names += [f"a{layer}.h{h}" for h in range(self.n_heads)]
            names += self.mlp_names(layer)
        return names

    @property
    def n_senders(self) -> int:
        """Number of senders."""
        return len(self.senders)

    def head_sender(self, layer: int, head: int) -> int:
        """Index of head (layer, head) in the sender list."""
        return int(self._layer_first[layer]) + head

    def mlp_sender(self, layer: int) -> int:
        """Index of MLP ``layer`` in the sender list (a split layer: its first expert)."""
        if not self.has_mlp:
            raise KeyError("this model has no MLP layers")
        return int(self._layer_first[layer]) + self.n_heads

    @property
    def senders_per_layer(self) -> int:
        """Heads plus the MLP (if any) of one layer (ValueError where split layers make it vary)."""
        if self.experts:
            raise ValueError("layers have different sender counts here (experts as nodes); use mlp_count(layer)")
        return self.n_heads + (1 if self.has_mlp else 0)

    def upstream_of_attention(self, layer: int) -> int:
        """Number of senders (a prefix) feeding the heads of ``layer``."""
        return int(self._layer_first[layer])

    def upstream_of_mlp(self, layer: int) -> int:
        """Number of senders (a prefix) feeding MLP ``layer``."""
        base = self.upstream_of_attention(layer)
        return base if self.parallel else base + self.n_heads

    # ---- receivers -------------------------------------------------------------------------
    @cached_property
    def receivers(self) -> list[str]:
        """Receiver names: per layer q, k, v inputs of every head, then the MLP; then logits."""
        names = []
        for layer in range(self.n_layers):
            for kind in QKV:
                names += [f"a{layer}.h{h}<{kind}>" for h in range(self.n_heads)]
            if self.has_mlp:
                names.append(f"m{layer}")
        names.append("logits")
        return names

    @property
    def n_receivers(self) -> int:
        """Number of receivers."""
        return len(self.receivers)

    @property
    def receivers_per_layer(self) -> int:
        """3 H attention inputs plus the MLP input (if any)."""
        return 3 * self.n_heads + (1 if self.has_mlp else 0)

    def attention_receiver(self, layer: int, kind: str, head: int) -> int:
        """Index of head (layer, head)'s ``kind`` (q/k/v) input in the receiver list."""
        return layer * self.receivers_per_layer + QKV.index(kind) * self.n_heads + head

    def mlp_receiver(self, layer: int) -> int:
        """Index of MLP ``layer``'s input in the receiver list."""
        if not self.has_mlp:
            raise KeyError("this model has no MLP layers")
        return layer * self.receivers_per_layer + 3 * self.n_heads

    def mlp_receiver_safe(self, layer: int) -> int:
        """Index of MLP ``layer``'s input, or -1 when the model has no MLPs."""
        return self.mlp_receiver(layer) if self.has_mlp else -1

    @property
    def logits_receiver(self) -> int:
        """Index of the logits receiver."""
        return self.n_receivers - 1

    @cached_property
    def receiver_layer(self) -> np.ndarray:
        """Layer of each receiver (``n_layers`` for logits)."""
        out = np.repeat(np.arange(self.n_layers), self.receivers_per_layer)
        return np.append(out, self.n_layers).astype(np.int64)

    @cached_property
    def n_upstream(self) -> np.ndarray:
        """Number of senders upstream of each receiver (they are a prefix of the senders)."""
        out = []
        for layer in range(self.n_layers):
            out += [self.upstream_of_attention(layer)] * (3 * self.n_heads)
            if self.has_mlp:
                out.append(self.upstream_of_mlp(layer))
        out.append(self.n_senders)
        return np.asarray(out, dtype=np.int64)

    @cached_property
    def edge_offset(self) -> np.ndarray:
        """First edge index of each receiver's contiguous block of in-edges."""
        return np.concatenate([[0], np.cumsum(self.n_upstream)[:-1]]).astype(np.int64)

    # ---- edges -----------------------------------------------------------------------------
    @property
    def n_edges(self) -> int:
        """Number of edges."""
        return int(self.n_upstream.sum())

    @cached_property
    def edge_sender(self) -> np.ndarray:
        """Sender index of each edge."""
        return np.concatenate([np.arange(n) for n in self.n_upstream]).astype(np.int64)

    @cached_property
    def edge_receiver(self) -> np.ndarray:
        """Receiver index of each edge."""
        return np.repeat(np.arange(self.n_receivers), self.n_upstream).astype(np.int64)

    @cached_property
    def edge_names(self) -> list[str]:
        """Edge names ``sender->receiver`` (EAP-IG naming)."""
        s, r = self.senders, self.receivers
        return [f"{s[u]}->{r[v]}" for u, v in zip(self.edge_sender, self.edge_receiver)]

    @cached_property
    def _edge_lookup(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.edge_names)}

    def edge_index(self, name: str) -> int:
        """Index of the edge called ``name`` (e.g. ``a0.h1->a1.h3<k>``)."""
        try:
            return self._edge_lookup[name]
        except KeyError:
            raise KeyError(
                f"no edge {name!r} in this graph; edges are named 'sender->receiver' such as "
                f"{self.edge_names[0]!r} or {self.edge_names[-1]!r}"
            ) from None

    def edge_id(self, sender: int, receiver: int) -> int:
        """Index of the edge from sender index ``sender`` into receiver index ``receiver``."""
        if sender >= self.n_upstream[receiver]:
            raise KeyError(f"{self.senders[sender]} is not upstream of {self.receivers[receiver]}")
        return int(self.edge_offset[receiver] + sender)

    def receiver_node(self, receiver: int) -> str:
        """Node name a receiver belongs to (``a0.h1<q>`` -> ``a0.h1``)."""
        return self.receivers[receiver].split("<")[0]

    @cached_property
    def receiver_readers(self) -> list[np.ndarray]:
        """Per receiver, the indices in ``nodes`` of the nodes reading it: its own node, or, for a split
        layer's MLP input ``m{L}``, all of that layer's expert senders (they share the input)."""
        lookup = {name: i for i, name in enumerate(self.nodes)}
        out = []
        for r in range(self.n_receivers):
            layer = int(self.receiver_layer[r])
            if layer < self.n_layers and self.has_mlp and r == self.mlp_receiver(layer):
                out.append(np.asarray(self.mlp_senders(layer), dtype=np.int64))
            else:
                out.append(np.asarray([lookup[self.receiver_node(r)]], dtype=np.int64))
        return out

    @cached_property
    def nodes(self) -> list[str]:
        """Node names: the senders, then ``logits``."""
        return self.senders + ["logits"]

    @cached_property
    def sender_layer(self) -> np.ndarray:
        """Layer of each sender (-1 for input)."""
        out = [-1]
        for layer in range(self.n_layers):
            out += [layer] * (self.n_heads + self.mlp_count(layer))
        return np.asarray(out, dtype=np.int64)

    def sender_out_edges(self, sender: int) -> np.ndarray:
        """Indices of all edges leaving sender ``sender``."""
        return np.flatnonzero(self.edge_sender == sender)

    def edge_table(self) -> dict[str, np.ndarray | list]:
        """Columns describing every edge: index, name, sender, receiver, layers, receiver kind."""
        kinds = []
        for name in self.receivers:
            kinds.append(name[-2] if name.endswith(">") else ("logits" if name == "logits" else "mlp"))
        return {
            "index": np.arange(self.n_edges, dtype=np.int64),
            "name": self.edge_names,
            "sender": [self.senders[u] for u in self.edge_sender],
            "receiver": [self.receivers[v] for v in self.edge_receiver],
            "sender_layer": self.sender_layer[self.edge_sender],
            "receiver_layer": self.receiver_layer[self.edge_receiver],
            "kind": [kinds[v] for v in self.edge_receiver],
        }

    def to_networkx(self, scores: np.ndarray | None = None, edges: np.ndarray | None = None):
        """The graph as a networkx DiGraph on node names; edges carry ``name``, ``receiver``, ``score``."""
        import networkx as nx

        g = nx.DiGraph()
        g.add_nodes_from(self.nodes)
        chosen = np.arange(self.n_edges) if edges is None else np.asarray(edges)
        for e in chosen:
            u = self.senders[self.edge_sender[e]]
            r = self.receivers[self.edge_receiver[e]]
            v = self.receiver_node(self.edge_receiver[e])
            score = None if scores is None else float(scores[e])
            # Several receivers (q/k/v) of one head collapse to one node edge; keep them listed.
            if g.has_edge(u, v):
                g[u][v]["receivers"].append(r)
                g[u][v]["names"].append(self.edge_names[e])
                if score is not None:
                    g[u][v]["score"] += score
            else:
                g.add_edge(u, v, receivers=[r], names=[self.edge_names[e]], score=score if score is not None else 0.0)
        return g
