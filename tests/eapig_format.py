"""EAP-IG's graph JSON written from its definitions (hannamw/EAP-IG eap/graph.py ``Graph.from_model`` and
``Graph.to_json``), independent of circuitstat's own exporter: the tests' oracle for the exchange format."""

from __future__ import annotations

import json
from pathlib import Path


def eapig_graph(cfg: dict) -> tuple[list[str], list[str]]:
    """(node names, edge names) of EAP-IG's Graph.from_model(cfg), in its insertion order: input, per layer
    heads then an MLP, logits; a head's q/k/v and the MLP read every earlier node (the MLP also the same
    layer's heads unless parallel_attn_mlp)."""
    stream, edges, nodes = ["input"], [], ["input"]
    for layer in range(cfg["n_layers"]):
        heads = [f"a{layer}.h{h}" for h in range(cfg["n_heads"])]
        mlp = f"m{layer}"
        nodes += heads + [mlp]
        edges += [f"{u}->{h}<{x}>" for u in stream for h in heads for x in "qkv"]
        readers = stream if cfg["parallel_attn_mlp"] else stream + heads
        edges += [f"{u}->{mlp}" for u in readers]
        stream = stream + heads + [mlp]
    edges += [f"{u}->logits" for u in stream]
    return nodes + ["logits"], edges


def write_eapig_json(path: Path, cfg: dict, in_graph: set[str], scores: dict[str, float] | None = None) -> Path:
    """Write a graph as EAP-IG's Graph.to_json does: cfg, every node {in_graph}, every edge {score, in_graph};
    a node is in the graph when an in-graph edge touches it."""
    nodes, edges = eapig_graph(cfg)
    touched = {p for e in in_graph for p in (e.split("->")[0], e.split("->")[1].split("<")[0])}
    doc = {"cfg": dict(cfg), "nodes": {n: {"in_graph": n in touched} for n in nodes},
           "edges": {e: {"score": float((scores or {}).get(e, 0.0)), "in_graph": e in in_graph} for e in edges}}
    path.write_text(json.dumps(doc))
    return path
