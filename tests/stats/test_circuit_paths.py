"""Random circuits as unions of random input -> logits paths (circuitstat.stats.circuit_paths; circuitry's
sample_circuit / sample_inflated): connected by construction, the path distribution against brute-force
enumeration, and uniform edge subsets (the reference used before) as the negative control."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from circuitstat.stats.circuit_paths import on_paths, path_graph, sample_circuit, sample_inflated, sample_path


def _names(n_layers=2, n_heads=2, mlp=True):
    """Edge names of a small EAP-IG-style graph (every sender to every receiver downstream)."""
    senders, names = ["input"], []
    for layer in range(n_layers):
        heads = [f"a{layer}.h{h}" for h in range(n_heads)]
        for h in heads:
            for c in "qkv":
                names += [f"{s}->{h}<{c}>" for s in senders]
        senders = senders + heads
        if mlp:
            names += [f"{s}->m{layer}" for s in senders]
            senders = senders + [f"m{layer}"]
    names += [f"{s}->logits" for s in senders]
    return names


def _all_paths(names):
    """Every input -> logits path with its probability under the uniform-out-edge walk (exact fractions)."""
    g = path_graph(names)
    out = {}

    def walk(node, path, prob):
        if node == -1:
            out[tuple(path)] = prob
            return
        for e in g.out[node]:
            walk(int(g.dst[e]), path + [int(e)], prob * Fraction(1, g.out[node].size))

    walk(g.source, [], Fraction(1))
    return out


def test_a_path_follows_the_walk_distribution():
    names = _names(n_layers=1, n_heads=2, mlp=True)
    exact = _all_paths(names)
    assert sum(exact.values()) == 1
    g, rng, R = path_graph(names), np.random.default_rng(0), 20000
    counts = {}
    for _ in range(R):
        p = tuple(sample_path(g, rng).tolist())
        counts[p] = counts.get(p, 0) + 1
    assert set(counts) <= set(exact)
    for p, prob in exact.items():  # each path's frequency within 4 binomial SE of its probability
        pr = float(prob)
        assert abs(counts.get(p, 0) / R - pr) <= 4 * np.sqrt(pr * (1 - pr) / R) + 1e-9, (p, pr)


def test_random_circuits_are_connected_and_uniform_subsets_are_not():
    names = _names(n_layers=3, n_heads=4)
    g, rng = path_graph(names), np.random.default_rng(1)
    k = 8
    frac_uniform = []
    for _ in range(200):
        m = sample_circuit(g, k, rng)
        assert m.sum() >= k and (on_paths(g, m) == m).all()  # every edge lies on an input -> logits path
        u = np.zeros(g.n_edges, bool)
        u[rng.choice(g.n_edges, k, replace=False)] = True
        frac_uniform.append(on_paths(g, u).sum() / k)
    assert np.mean(frac_uniform) < 0.2  # the old reference: most of its edges are dead weight


def test_on_paths_against_brute_force_and_inflation_adds_a_whole_path():
    names = _names(n_layers=1, n_heads=1, mlp=False)  # 7 edges: small enough to enumerate every subset
    g = path_graph(names)
    paths = [set(p) for p in _all_paths(names)]
    for bits in itertools.product([False, True], repeat=g.n_edges):
        m = np.array(bits)
        want = np.zeros(g.n_edges, bool)
        for p in paths:
            if all(m[e] for e in p):
                want[list(p)] = True
        np.testing.assert_array_equal(on_paths(g, m), want)
    rng = np.random.default_rng(2)
    g = path_graph(_names())
    circuit = sample_circuit(g, 3, rng)
    for _ in range(50):
        big, new = sample_inflated(g, circuit, rng)
        assert new.size >= 1 and (big & circuit).sum() == circuit.sum() and (on_paths(g, big) == big).all()


def test_malformed_graphs_are_refused():
    from circuitstat.core.errors import InputError

    with pytest.raises(InputError, match="no 'input'"):
        path_graph(["a0.h0->logits"])
    with pytest.raises(InputError, match="sender->receiver"):
        path_graph(["input"])
