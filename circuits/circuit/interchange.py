"""The EAP-IG / MIB JSON graph format: export (``to_json``) and validated import (``from_json``)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from typing_extensions import Self  # the class a constructor is called on (Circuit)

from circuitstat.core.errors import InputError
from ..graph import ComponentGraph
from .graph_ops import graph_cfg, is_mlp, split_cfg, split_from, unknown_message


EAPIG_FORMAT_VERSION = 1


class MibJson:
    """Export and import in the EAP-IG / MIB JSON graph format (mixed into Circuit)."""

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
        cfg.update(split_cfg(g))  # experts as nodes (circuitstat's own keys; EAP-IG has no such nodes)
        nodes: dict[str, dict] = {}
        for i, name in enumerate(g.nodes):
            entry: dict[str, Any] = {"in_graph": bool(self.nodes[i])}
            if self.node_scores is not None and not np.isnan(self.node_scores[i]):
                entry["score"] = float(self.node_scores[i])
            nodes[name] = entry
        scores = self.scores if self.scores is not None else np.zeros(g.n_edges, dtype=np.float32)
        edges = {name: {"score": float(scores[i]), "in_graph": bool(self.edges[i])} for i, name in enumerate(g.edge_names)}
        doc = {"cfg": cfg, "nodes": nodes, "edges": edges,
               "circuitstat": {"format_version": EAPIG_FORMAT_VERSION, "rule": self.rule, "params": jsonable(self.params),
                               "edge_scores": self.scores is not None, "node_scores": self.node_scores is not None}}
        if path is not None:
            _write_json_file(path, json.dumps(doc).encode())
        return doc

    @classmethod
    def from_json(cls, source: str | os.PathLike | Mapping, graph: ComponentGraph | None = None) -> Self:
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
            doc, where = parse_graph_json(p.read_text(), str(p)), str(p)
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
            has_mlp = any(is_mlp(n) for n in jnodes) or any(is_mlp(n.split("->")[-1]) for n in jedges) or not jnodes
        split = split_from(cfg, where) if has_mlp else {}
        built = ComponentGraph(int(cfg["n_layers"]), int(cfg["n_heads"]), has_mlp, bool(cfg.get("parallel_attn_mlp", False)),
                               **split)
        if graph is None:
            graph = built
        elif graph_cfg(graph) != graph_cfg(built):
            raise InputError(f"{where} describes a graph {graph_cfg(built)} but the model's graph is {graph_cfg(graph)}; "
                             "load it with the model it was made for")
        # nodes
        node_lookup = {n: i for i, n in enumerate(graph.nodes)}
        unknown = [n for n in jnodes if n not in node_lookup]
        if unknown:
            raise InputError(f"{where}: " + unknown_message("node", unknown, graph.nodes, graph))
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
            raise InputError(f"{where}: " + unknown_message("edge", unknown, graph.edge_names, graph))
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


def _unique_keys(pairs: list) -> dict:
    """A JSON object's pairs as a dict; InputError when a key repeats (JSON would keep the last silently)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            shown = key if len(key) <= 60 else key[:57] + "..."
            raise InputError(f"key {shown!r} appears more than once in one JSON object; give each key once "
                             "(which value was meant is not knowable)")
        out[key] = value
    return out


def parse_graph_json(text: str, where: str) -> Any:
    """The parsed JSON of a circuit file ``where``; InputError (never the file's text) when it is not JSON, nests
    deeper than the parser recurses, repeats a key in one object, or holds a number Python will not convert."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except InputError as exc:  # a repeated key
        raise InputError(f"{where}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{where} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); expected an "
                         "EAP-IG/MIB graph file") from None
    except RecursionError:
        raise InputError(f"{where} nests arrays or objects too deeply to read; an EAP-IG/MIB graph file nests 3 deep "
                         "(cfg, nodes, edges)") from None
    except ValueError:  # an integer of more digits than Python converts
        raise InputError(f"{where} holds a number too long to read (over 4,300 digits); a score is a float") from None


def _in_graph(entry: Any, what: str) -> bool:
    if not isinstance(entry, Mapping) or "in_graph" not in entry:
        raise InputError(f"{what}: expected an object with 'in_graph' (and 'score'), got a {type(entry).__name__}")
    v = entry["in_graph"]
    if isinstance(v, bool):
        return v
    raise InputError(f"{what}: in_graph must be true or false (a JSON boolean), got a {type(v).__name__}")


def _score(v: Any, what: str) -> float:
    if v is None:
        return float("nan")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InputError(f"{what}: score must be a number, got a {type(v).__name__}")
    if not math.isfinite(float(v)):  # a huge integer becomes inf: not a score
        raise InputError(f"{what}: score must be a finite number")
    return float(v)


def jsonable(obj: Any) -> Any:
    """Parameters as plain JSON types (so equality survives a JSON round trip)."""
    from circuitstat.core.provenance import to_jsonable  # the one JSON conversion (torch-free writer layer)

    return to_jsonable(obj, repr)


def _write_json_file(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` atomically to the file `path`; InputError (one line) when that cannot be a file."""
    from circuitstat.core.atomic import atomic_write_bytes

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
