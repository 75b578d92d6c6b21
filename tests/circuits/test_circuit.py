"""Circuits: selection rules, pruning and EAP-IG/MIB JSON exchange, against independent oracles."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pytest

from circuitstat.circuits.circuit import Circuit
from circuitstat.core.errors import DeprecatedNameWarning, InputError
from circuitstat.circuits.graph import ComponentGraph
from circuitstat.circuits.scores import ScoreMatrix


# ---- independent helpers (parse names; never use the module's own index arithmetic) ----------
def _ends(name: str) -> tuple[str, str]:
    """(sender node, receiver node) of an edge name such as 'a0.h1->a1.h2<k>'."""
    u, r = name.split("->")
    return u, r.split("<")[0]


def _eapig_edge_names(n_layers: int, n_heads: int, parallel: bool) -> list[str]:
    """Edge names built the way the EAP-IG library's Graph.from_model builds them."""
    names, stream = [], ["input"]
    for layer in range(n_layers):
        heads = [f"a{layer}.h{h}" for h in range(n_heads)]
        mlp = f"m{layer}"
        for node in stream:
            for head in heads:
                for letter in "qkv":
                    names.append(f"{node}->{head}<{letter}>")
            if parallel:
                names.append(f"{node}->{mlp}")
        stream = stream + heads
        if not parallel:
            for node in stream:
                names.append(f"{node}->{mlp}")
        stream.append(mlp)
    names += [f"{node}->logits" for node in stream]
    return names


def _path_oracle(edge_names: list[str]) -> set[str]:
    """Edges on some input -> logits path of the node graph (networkx reachability)."""
    g = nx.DiGraph()
    g.add_nodes_from(["input", "logits"])
    g.add_edges_from(_ends(n) for n in edge_names)
    from_input = nx.descendants(g, "input") | {"input"}
    to_logits = nx.ancestors(g, "logits") | {"logits"}
    return {n for n in edge_names if _ends(n)[0] in from_input and _ends(n)[1] in to_logits}


def _naive_greedy(graph: ComponentGraph, scores: np.ndarray, k: int, absolute: bool, seed: int = 0) -> set[int]:
    """O(k·E) greedy: best edge whose receiver node is already in; ties by the seed's priorities (circuitstat.core.topk)."""
    from circuitstat.core.topk import row_seeds, tie_priorities

    key = np.abs(scores) if absolute else scores
    pri = tie_priorities(row_seeds(np.random.SeedSequence(seed), 1), np.arange(graph.n_edges))[0]
    names = graph.edge_names
    nodes, chosen = {"logits"}, set()
    for _ in range(k):
        best = None
        for e, name in enumerate(names):
            u, v = _ends(name)
            if e in chosen or v not in nodes:
                continue
            if best is None or key[e] > key[best] or (key[e] == key[best] and pri[e] < pri[best]):
                best = e
        chosen.add(best)
        nodes.add(_ends(names[best])[0])
    return chosen


@pytest.fixture
def graph():
    return ComponentGraph(3, 2, has_mlp=True)


# ---- selection rules ---------------------------------------------------------------------------
def test_top_k_signed_vs_absolute(graph):
    rng = np.random.default_rng(0)
    s = rng.uniform(0, 1, graph.n_edges).astype(np.float32)
    big_neg = [3, 17, 40]
    s[big_neg] = -10.0
    signed = Circuit.top_k(s, 5, ranking="signed", graph=graph)
    absolute = Circuit.top_k(s, 5, ranking="absolute", graph=graph)
    assert set(signed.edge_indices) == set(np.argsort(-s)[:5])
    assert set(big_neg) <= set(absolute.edge_indices)
    assert not set(big_neg) & set(signed.edge_indices)
    assert signed.params["ranking"] == "signed" and absolute.params["ranking"] == "absolute"
    assert signed.n_edges == absolute.n_edges == 5


def test_top_k_ties_at_random_from_the_seed_and_explicit_ranking(graph):
    from circuitstat.core.topk import topk

    s = np.zeros(graph.n_edges, dtype=np.float32)
    s[[50, 7, 30, 2]] = 1.0
    c = Circuit.top_k(s, 3, ranking="signed", graph=graph)
    # the floor's top-k is the oracle: same seed, same circuit
    assert set(c.edge_indices) == set(topk(s, 3, ranking="signed", seed=0).indices) < {2, 7, 30, 50}
    assert (c.params["cutoff_ties"], c.params["cutoff_ties_excluded"]) == (4, 1) and "random" in c.params["ties"]
    assert np.flatnonzero(c.to_table().column("tied_at_cutoff").to_numpy()).tolist() == [2, 7, 30, 50]
    assert c == Circuit.top_k(s, 3, ranking="signed", graph=graph, seed=0)
    assert "4 edges tied at the cut-off, 1 left out" in c.summary()
    assert Circuit.top_k(s, 5, ranking="signed", graph=graph).params["cutoff_ties_excluded"] == graph.n_edges - 5
    c0 = Circuit.top_k(s, 4, ranking="signed", graph=graph)
    assert set(c0.edge_indices) == {2, 7, 30, 50} and c0.params["cutoff_ties_excluded"] == 0
    with pytest.raises(InputError, match="explicit"):
        Circuit.top_k(s, 3, graph=graph)  # ranking has no default
    with pytest.raises(InputError, match="explicit"):
        Circuit.top_k(s, 3, ranking="abs", graph=graph)
    with pytest.raises(InputError, match="True or False"):
        Circuit.top_k(s, 3, absolute="yes", graph=graph)  # the old name, still read
    with pytest.warns(DeprecatedNameWarning, match="ranking='signed'"):
        old = Circuit.top_k(s, 3, absolute=False, graph=graph)
    assert old == Circuit.top_k(s, 3, ranking="signed", graph=graph)
    with pytest.raises(TypeError, match="absolut"):
        Circuit.top_k(s, 3, ranking="signed", absolut=True, graph=graph)
    with pytest.raises(InputError, match="outside"):
        Circuit.top_k(s, graph.n_edges + 1, ranking="absolute", graph=graph)
    with pytest.raises(InputError, match="graph="):
        Circuit.top_k(s, 3, ranking="absolute")


def test_tied_edges_are_kept_with_equal_probability_not_by_index(graph):
    # all edges tied (e.g. structurally zero edges): the index rule would keep edges 0..3 every time, so
    # two resamples' circuits would always agree; the seeded rule keeps each edge with probability k/E
    E, k, n = graph.n_edges, 4, 3000
    flat = np.zeros(E, dtype=np.float32)
    counts = np.zeros(E)
    for seed in range(n):
        counts[Circuit.top_k(flat, k, ranking="absolute", graph=graph, seed=seed).edges] += 1
    freq, p = counts / n, k / E
    se = np.sqrt(p * (1 - p) / n)
    assert np.abs(freq - p).max() < 5 * se and freq.min() > 0  # every tied edge, none favoured
    assert counts[:k].sum() / n < 2 * k * p  # the index rule's edges are kept at chance, not always
    a, b = (set(Circuit.top_k(flat, k, ranking="absolute", graph=graph, seed=s).edge_indices) for s in (1, 2))
    assert len(a & b) < k  # two seeds do not agree by construction


def test_threshold(graph):
    s = np.random.default_rng(1).normal(size=graph.n_edges).astype(np.float32)
    assert set(Circuit.threshold(s, 1.0, ranking="absolute", graph=graph).edge_indices) == set(np.flatnonzero(np.abs(s) >= 1.0))
    assert set(Circuit.threshold(s, 1.0, ranking="signed", graph=graph).edge_indices) == set(np.flatnonzero(s >= 1.0))


@pytest.mark.parametrize("absolute", [False, True])
def test_greedy_connected_to_logits_and_matches_naive(graph, absolute):
    rng = np.random.default_rng(2)
    s = np.round(rng.normal(size=graph.n_edges), 1).astype(np.float32)  # many ties
    for k in (1, 7, 25, 60):
        c = Circuit.greedy(s, k, ranking="absolute" if absolute else "signed", graph=graph)
        assert c.n_edges == k
        assert set(c.edge_indices) == _naive_greedy(graph, s, k, absolute)
        g = nx.DiGraph()
        g.add_edges_from(_ends(n) for n in c.edge_names)
        for name in c.edge_names:
            v = _ends(name)[1]
            assert v == "logits" or nx.has_path(g, v, "logits"), name


# ---- pruning -----------------------------------------------------------------------------------
def test_prune_removes_dangling_heads():
    g = ComponentGraph(2, 2, has_mlp=False)
    keep = ["input->a0.h0<q>", "a0.h0->logits"]
    dangling = [
        "input->a0.h1<v>", "a0.h1->a1.h1<k>",  # a1.h1 has no output; then a0.h1 loses its only output
        "a1.h0->logits",  # a1.h0 has no input
    ]
    c = Circuit.from_edges(g, keep + dangling)
    p = c.prune()
    assert sorted(p.edge_names) == sorted(keep)
    assert p.node_names == ["input", "a0.h0", "logits"]
    assert "a1.h0" in c.node_names and "a1.h1" in c.node_names  # the unpruned circuit touched them
    assert p.params["pruned"] is True and c.prune() == p and p.prune() == p


@pytest.mark.parametrize("parallel", [False, True])
def test_prune_matches_path_oracle(parallel):
    g = ComponentGraph(3, 2, has_mlp=True, parallel=parallel)
    rng = np.random.default_rng(3)
    for p_edge in (0.03, 0.08, 0.2):
        for _ in range(10):
            mask = rng.random(g.n_edges) < p_edge
            c = Circuit.from_edges(g, mask).prune()
            expect = _path_oracle([g.edge_names[i] for i in np.flatnonzero(mask)])
            assert set(c.edge_names) == expect
            touched = {x for n in expect for x in _ends(n)}
            assert set(c.node_names) == touched


def test_head_is_in_via_any_qkv_input():
    g = ComponentGraph(2, 1, has_mlp=False)
    c = Circuit.from_edges(g, ["input->a1.h0<k>", "a1.h0->logits"]).prune()
    assert c.n_edges == 2


# ---- node-level circuits -----------------------------------------------------------------------
def test_node_level_circuit(graph):
    s = np.zeros(graph.n_senders, dtype=np.float32)
    names = graph.senders
    s[names.index("a0.h1")] = 5.0
    s[names.index("m1")] = -7.0
    s[names.index("a2.h0")] = np.nan  # unscored: always kept
    c = Circuit.from_node_scores(s, 2, ranking="absolute", graph=graph)
    chosen = {"a0.h1", "m1", "a2.h0"}
    assert set(c.node_names) == chosen | {"logits"}
    expect = {n for n in graph.edge_names if _ends(n)[0] in chosen and _ends(n)[1] in chosen | {"logits"}}
    assert set(c.edge_names) == expect
    signed = Circuit.from_node_scores(s, 1, ranking="signed", graph=graph)
    assert set(signed.node_names) == {"a0.h1", "a2.h0", "logits"}


# ---- ScoreMatrix input, exports ----------------------------------------------------------------
def _score_matrix(graph, seed=0, n=5):
    S = np.random.default_rng(seed).normal(size=(n, graph.n_edges)).astype(np.float32)
    return ScoreMatrix(scores=S, graph=graph, level="edge", method="eap", ablation="counterfactual",
                       metric="logit_diff", provenance={"model": {"d_model": 16, "source": "test"}})


def test_from_score_matrix_uses_mean_and_records_provenance(graph):
    sm = _score_matrix(graph)
    c = Circuit.top_k(sm, 10, ranking="absolute")
    mean = sm.scores.astype(np.float64).mean(0)
    assert set(c.edge_indices) == set(np.argsort(-np.abs(mean), kind="stable")[:10])
    assert c.d_model == 16 and c.params["scores"]["method"] == "eap"
    with pytest.raises(InputError, match="vector"):
        Circuit.top_k(sm.scores, 3, ranking="absolute", graph=graph)


def test_to_networkx_and_table(graph):
    s = np.arange(graph.n_edges, dtype=np.float32)
    names = ["input->a1.h0<q>", "input->a1.h0<v>", "a1.h0->logits", "input->m0"]
    c = Circuit.from_edges(graph, names, scores=s)
    G = c.to_networkx()
    assert set(G.nodes) == {"input", "a1.h0", "m0", "logits"}
    d = G["input"]["a1.h0"]
    assert sorted(d["qkv"]) == ["q", "v"] and sorted(d["receivers"]) == ["a1.h0<q>", "a1.h0<v>"]
    assert d["score"] == pytest.approx(sum(s[graph.edge_index(n)] for n in names[:2]))
    assert G.number_of_edges() == 3
    t = c.to_table()
    assert t.num_rows == graph.n_edges and sum(t.column("in_circuit").to_pylist()) == 4
    from circuitstat.core.tables import read_provenance
    assert read_provenance(t)["circuit"]["rule"] == "edges"
    text = c.summary()
    assert "4 of" in text and "a1.h0->logits" in text


# ---- EAP-IG / MIB JSON -------------------------------------------------------------------------
@pytest.mark.parametrize("has_mlp,parallel", [(True, False), (True, True), (False, False)])
def test_json_round_trip(tmp_path, has_mlp, parallel):
    g = ComponentGraph(2, 3, has_mlp=has_mlp, parallel=parallel)
    sm = _score_matrix(g, seed=4)
    circuits = [Circuit.top_k(sm, 12, ranking="signed"), Circuit.greedy(sm, 9, ranking="absolute").prune(),
                Circuit.threshold(sm, 0.3, ranking="absolute")]
    node_sm = ScoreMatrix(scores=np.random.default_rng(5).normal(size=(4, g.n_senders)), graph=g, level="node",
                          method="exact", ablation="mean", metric="kl", provenance={"model": {"d_model": 16}})
    circuits.append(Circuit.from_node_scores(node_sm, 3, ranking="absolute"))
    for i, c in enumerate(circuits):
        path = tmp_path / f"c{i}.json"
        c.to_json(path, d_model=16)
        back = Circuit.from_json(path, graph=g)
        assert back.edge_names == c.edge_names and back.node_names == c.node_names
        if c.scores is not None:
            np.testing.assert_array_equal(back.scores, c.scores)
        if c.node_scores is not None:
            np.testing.assert_array_equal(back.node_scores, c.node_scores)
        assert back == c
        doc = json.loads(path.read_text())
        assert set(doc["edges"]) == set(g.edge_names) and len(doc["nodes"]) == len(g.nodes)
        assert Circuit.from_json(doc) == c  # graph rebuilt from cfg


@pytest.mark.parametrize("parallel", [False, True])
def test_hand_built_eapig_json_imports(parallel):
    names = _eapig_edge_names(2, 2, parallel)
    g = ComponentGraph(2, 2, has_mlp=True, parallel=parallel)
    assert sorted(names) == sorted(g.edge_names)  # same edge set as the EAP-IG library
    chosen = {"input->a0.h1<k>": 0.5, "a0.h1->a1.h0<q>": -1.25, "a1.h0->logits": 3.0, "a0.h1->m1": 2.0,
              "m1->logits": 0.75}
    doc = {
        "cfg": {"n_layers": 2, "n_heads": 2, "parallel_attn_mlp": parallel, "d_model": 8},
        "nodes": {n: {"in_graph": n in {"input", "a0.h1", "a1.h0", "m1", "logits"}}
                  for n in ["input", "a0.h0", "a0.h1", "m0", "a1.h0", "a1.h1", "m1", "logits"]},
        "edges": {n: {"score": chosen.get(n, 0.0), "in_graph": n in chosen} for n in names},
    }
    c = Circuit.from_json(json.loads(json.dumps(doc)))
    assert set(c.edge_names) == set(chosen)
    for name, score in chosen.items():
        assert c.scores[g.edge_index(name)] == score
    assert set(c.node_names) == {"input", "a0.h1", "a1.h0", "m1", "logits"}
    assert c.rule == "json" and c.d_model == 8 and c.prune().n_edges == 5
    # only the in-graph edges listed: the rest are out, with unknown (NaN) scores
    small = {**doc, "edges": {n: {"score": s, "in_graph": True} for n, s in chosen.items()}}
    c2 = Circuit.from_json(small, graph=g)
    assert set(c2.edge_names) == set(chosen) and np.isnan(c2.scores).sum() == g.n_edges - 5
    assert c2.params["edges_missing_from_json"] == g.n_edges - 5


def test_json_import_errors():
    g = ComponentGraph(2, 2, has_mlp=False)
    base = {"cfg": {"n_layers": 2, "n_heads": 2, "parallel_attn_mlp": False, "d_model": 8, "has_mlp": False},
            "nodes": {"input": {"in_graph": True}}, "edges": {}}
    with pytest.raises(InputError, match="<q>"):
        Circuit.from_json({**base, "edges": {"a0.h1->a1.h0": {"score": 1.0, "in_graph": True}}}, graph=g)
    with pytest.raises(InputError, match="no m \\(MLP\\) nodes"):
        Circuit.from_json({**base, "edges": {"m0->logits": {"score": 1.0, "in_graph": True}}}, graph=g)
    with pytest.raises(InputError, match="closest valid names"):
        Circuit.from_json({**base, "nodes": {"a0.h7": {"in_graph": True}}}, graph=g)
    with pytest.raises(InputError, match="model's graph"):
        Circuit.from_json({**base, "cfg": {**base["cfg"], "n_heads": 3}}, graph=g)
    with pytest.raises(InputError, match="missing key"):
        Circuit.from_json({"cfg": base["cfg"], "nodes": {}}, graph=g)
    with pytest.raises(InputError, match="in_graph"):
        Circuit.from_json({**base, "edges": {"input->logits": {"score": 1.0, "in_graph": "yes"}}}, graph=g)
    with pytest.raises(InputError, match="d_model"):
        Circuit.full(g).to_json()
