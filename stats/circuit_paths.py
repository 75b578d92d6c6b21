"""Random circuits as unions of random input → logits paths (Shi et al. 2024's reference circuits; issue 47).

A uniformly random k-subset of a model's edges is mostly disconnected: few of its edges lie on a path from the input
to the logits, so it computes about what the empty circuit computes and "better than random" passes trivially.
Shi et al.'s reference circuits are connected: blei-lab/circuitry's ``Circuit.sample_circuit`` adds random paths
until the circuit has at least k edges, each path a walk from the input that takes a uniformly random out-edge of
the current node until it reaches the logits (``_sample_path``); ``sample_inflated`` adds such paths to a circuit
until at least one edge is new. This module follows those definitions on circuitstat's edge names
(``sender->receiver``; a head's q/k/v receiver ``aL.hH<q>`` leads to the sender ``aL.hH``). Own code.

The tests stage's reference circuits (circuitstat.pipelines.circuit_tests.layout_masks): sufficiency and partial
necessity compare against ``sample_circuit`` circuits of the tested circuit's size, minimality against
``sample_inflated`` circuits with one newly added edge knocked out (docs/hypothesis-tests.md has the calibration).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from circuitstat.core.errors import InputError

__all__ = ["PathGraph", "path_graph", "sample_path", "sample_circuit", "sample_inflated", "on_paths"]

_SUFFIX = re.compile(r"<[^<>]*>$")
SOURCE, SINK = "input", "logits"


@dataclass(frozen=True)
class PathGraph:
    """Edges as moves between nodes: edge e leaves node ``src[e]`` and arrives at ``dst[e]`` (-1: the logits)."""

    src: np.ndarray  # [E] int: node index the edge leaves
    dst: np.ndarray  # [E] int: node index the edge arrives at (the receiver's sender node), -1 for the logits
    out: tuple[np.ndarray, ...]  # per node: its out-edges
    source: int  # node index of the input

    @property
    def n_edges(self) -> int:
        """Return the number of edges."""
        return int(self.src.size)


def path_graph(names: Sequence[str]) -> PathGraph:
    """Return the PathGraph of edge names ``sender->receiver`` (EAP-IG / MIB naming)."""
    nodes: dict[str, int] = {}
    src, dst = np.empty(len(names), np.int64), np.empty(len(names), np.int64)
    for i, name in enumerate(names):
        if "->" not in name:
            raise InputError(f"edge name {name!r} is not sender->receiver")
        s, r = name.split("->", 1)
        src[i] = nodes.setdefault(s, len(nodes))
        r = _SUFFIX.sub("", r)
        dst[i] = -1 if r == SINK else nodes.setdefault(r, len(nodes))
    if SOURCE not in nodes:
        raise InputError("the graph has no 'input' sender: random input -> logits paths need one")
    out = tuple(np.flatnonzero(src == n) for n in range(len(nodes)))
    stuck = [n for n, o in zip(nodes, out) if o.size == 0]
    if stuck:
        raise InputError(f"node {stuck[0]!r} has no out-edge: a walk to the logits would stop there")
    return PathGraph(src, dst, out, nodes[SOURCE])


def sample_path(g: PathGraph, rng: np.random.Generator) -> np.ndarray:
    """Return the edge indices of one random walk from the input to the logits (a uniform out-edge at each node)."""
    node, path = g.source, []
    while node != -1:
        e = int(g.out[node][rng.integers(g.out[node].size)])
        path.append(e)
        node = int(g.dst[e])
    return np.asarray(path, dtype=np.int64)


def sample_circuit(g: PathGraph, k: int, rng: np.random.Generator, *, exclude: np.ndarray | None = None) -> np.ndarray:
    """Return a mask [E] of the union of random paths, added until it has at least ``k`` edges (circuitry's
    sample_circuit). ``exclude``: paths through an excluded edge are redrawn (a circuit disjoint from it)."""
    if not 0 <= k <= g.n_edges:
        raise InputError(f"a random circuit of {k} edges cannot be drawn from {g.n_edges}")
    mask = np.zeros(g.n_edges, dtype=bool)
    tries = 0
    while mask.sum() < k:
        p = sample_path(g, rng)
        tries += 1
        if exclude is not None and exclude[p].any():
            if tries > 1000 * max(k, 1):
                raise InputError("no random path avoids the excluded edges; the circuit covers too much of the graph")
            continue
        mask[p] = True
    return mask


def sample_inflated(g: PathGraph, circuit: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Return (the circuit with random paths added until at least one edge is new, the new edges) (circuitry's
    sample_inflated(1))."""
    circuit = np.asarray(circuit, dtype=bool)
    if circuit.all():
        raise InputError("the circuit holds every edge: nothing to inflate it with")
    out = circuit.copy()
    while (out & ~circuit).sum() == 0:
        out[sample_path(g, rng)] = True
    return out, np.flatnonzero(out & ~circuit)


def on_paths(g: PathGraph, mask: np.ndarray) -> np.ndarray:
    """Return [E] bool: live edges that lie on an input -> logits path of live edges (the rest are dead weight)."""
    mask = np.asarray(mask, dtype=bool)
    n = len(g.out)
    reach = np.zeros(n, bool)  # reachable from the input along live edges
    reach[g.source] = True
    for _ in range(n):
        e = np.flatnonzero(mask & reach[g.src] & (g.dst >= 0))
        new = np.zeros(n, bool)
        new[g.dst[e]] = True
        if not (new & ~reach).any():
            break
        reach |= new
    live_to_sink = np.zeros(n, bool)  # reaches the logits along live edges
    for _ in range(n + 1):
        ok = mask & ((g.dst == -1) | live_to_sink[np.maximum(g.dst, 0)] & (g.dst >= 0))
        new = np.zeros(n, bool)
        new[g.src[ok]] = True
        if not (new & ~live_to_sink).any():
            break
        live_to_sink |= new
    return mask & reach[g.src] & ((g.dst == -1) | (live_to_sink[np.maximum(g.dst, 0)] & (g.dst >= 0)))
