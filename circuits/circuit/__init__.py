"""Circuits: a subset of a component graph's edges, chosen from scores by an explicit, recorded rule.

A :class:`Circuit` is a :class:`~circuitstat.circuits.graph.ComponentGraph`, a boolean edge mask ``[E]``, a
boolean node mask over ``graph.nodes`` (senders, then ``logits``), the scores it was chosen from
and the rule with its parameters (provenance).  Circuits are immutable in spirit: every operation
(``prune``) returns a new one.

Selection rules (``ranking``, 'signed' or 'absolute', is always an explicit keyword: signed and absolute
ranking give different circuits and different MIB scores, MIB issue #19):

* :meth:`Circuit.top_k` -- the k edges with the largest score (or ``|score|``); ties at the cut-off
  are broken at random from ``seed`` by the one top-k of circuitstat (circuitstat.core.topk), the rule the
  stability and selection-aware faithfulness estimators use too; the number of tied edges is recorded.
* :meth:`Circuit.threshold` -- every edge with score (or ``|score|``) ``>= t``.
* :meth:`Circuit.greedy` -- grow from the logits as the EAP-IG library's ``Graph.apply_greedy``:
  the candidates are the in-edges of nodes already in the circuit (initially ``logits``); the best
  candidate is added, its sender joins the circuit and the sender's in-edges become candidates
  (a head's in-edges are its q, k and v inputs).  Equal candidates go in the order of the seed's
  tie priorities (the top-k's).
* :meth:`Circuit.from_node_scores` / :meth:`Circuit.from_nodes` -- node-level circuits: a set of
  senders, and every edge between included nodes (``logits`` always counts as included).
* :meth:`Circuit.from_edges` -- an explicit edge set.

The node set of an edge-selected circuit is the set of nodes its edges touch.  :meth:`prune`
removes every node that has no path from ``input`` to ``logits`` inside the circuit, and every
edge touching a removed node, iterated to a fixpoint (``input`` always counts as having inputs,
``logits`` as having outputs; a head counts as having inputs if any of its q/k/v inputs has an
in-edge).  It is the EAP-IG library's ``Graph.prune`` as it completes (what MIB's evaluation patches);
afterwards every edge lies on an input -> logits path.  ``prune("mib")`` stops after the first pass, as
``Graph.apply_topn(..., prune=True)`` does at the EAP-IG commit MIB pins (dangling edges kept; docs/mib.md).

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

Modules: :mod:`.core` (the Circuit object, ``prune``, views), :mod:`.selection` (the selection
rules), :mod:`.interchange` (the EAP-IG / MIB JSON format), :mod:`.export` (summary, pyarrow
tables, networkx) and :mod:`.graph_ops` (index arrays, pruning and name checks on the graph).
"""

from __future__ import annotations

from .core import Circuit
from .interchange import EAPIG_FORMAT_VERSION

__all__ = ["Circuit", "EAPIG_FORMAT_VERSION"]
