"""Experts as nodes (``moe_nodes='experts'``, circuitstat.circuits.moe_nodes; docs/families.md "Experts as nodes"):
a sparse layer's MLP sender split into one sender per expert (m{L}.e{J}, m{L}.shared), its receiver kept whole.

Oracles: HF's own experts module, called with the router's weights zeroed except expert J's (each expert's
weighted write), its shared expert and gate hooked; autograd on HF for EAP; brute force (a full forward with
the edge patched) for exact; the block graph for everything that must not change."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from families import VOCAB, batch, hf_model

from circuitstat.circuits import Intervention
from circuitstat.circuits.ablation import last_index
from circuitstat.circuits.attribution import attribute
from circuitstat.circuits.convert import from_hf
from circuitstat.circuits.graph import ComponentGraph
from circuitstat.circuits.moe_nodes import set_moe_nodes
from circuitstat.circuits.parity import brute_force_edge_effects
from circuitstat.circuits.tasks import make_task
from circuitstat.core.errors import InputError

MOE = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss"]


def _pair(family: str, seed: int = 2):
    """(HF model, circuitstat model with the block graph, the same with experts as nodes)."""
    hf = hf_model(family, seed=seed)
    return hf, from_hf(hf), set_moe_nodes(from_hf(hf), "experts")


def _task(n: int = 3):
    return make_task("induction", vocab_size=VOCAB, n=n, seed=0, seq_len=4)


def _hf_expert_writes(hf, ids, mask, grad: bool = False):
    """Per sparse layer: (each expert's write [B, n, P, D] from HF's own modules, the block's output [B, P, D]).

    Expert J's write is HF's experts module re-called with the router's top-k weights zeroed except where the
    slot holds J; the shared expert's is sigmoid(shared_expert_gate(x)) * shared_expert(x), both hooked. With
    ``grad`` the block outputs keep their gradient (after a backward of the caller's metric)."""
    got, handles = {}, []
    for i, layer in enumerate(hf.model.layers):
        mlp = layer.mlp
        if not hasattr(mlp, "experts"):
            continue
        got[i] = {}

        def experts_hook(module, args, output, i=i):
            got[i]["experts_args"] = tuple(a.detach() for a in args)

        def block_hook(module, args, output, i=i):
            rest = output[1:] if isinstance(output, tuple) else None  # GPT-OSS returns (hidden, router scores)
            x = (output[0] if rest is not None else output) * 1.0
            if grad:
                x.retain_grad()
            got[i]["block"] = x
            return x if rest is None else (x, *rest)
        handles += [mlp.experts.register_forward_hook(experts_hook), mlp.register_forward_hook(block_hook)]
        if hasattr(mlp, "shared_expert"):
            handles.append(mlp.shared_expert.register_forward_hook(
                lambda mod, a, out, i=i: got[i].__setitem__("shared", out.detach())))
            handles.append(mlp.shared_expert_gate.register_forward_hook(
                lambda mod, a, out, i=i: got[i].__setitem__("gate", out.detach())))
    try:
        with torch.set_grad_enabled(grad):
            logits = hf(ids, attention_mask=mask).logits
    finally:
        for h in handles:
            h.remove()
    out = {}
    B, P = ids.shape
    with torch.no_grad():
        for i, d in got.items():
            h, idx, w = d["experts_args"]
            experts = hf.model.layers[i].mlp.experts
            parts = [experts(h, idx, w * (idx == j)).view(B, P, -1) for j in range(experts.num_experts)]
            if "shared" in d:
                parts.append((torch.sigmoid(d["gate"]) * d["shared"]).view(B, P, -1))
            out[i] = (torch.stack(parts, 1), d["block"])
    return out, logits


@pytest.mark.parametrize("family", MOE)
def test_expert_senders_are_hfs_weighted_expert_outputs_and_sum_to_the_block(family):
    """Sender m{L}.e{J} is w_J(x) expert_J(x) where the router selected J (else exactly 0), m{L}.shared the gated
    shared expert: each equals HF's, and together they are HF's block output; the run's logits are the block
    graph's bit for bit (the layer's write is the block's own output, not the sum of the senders)."""
    hf, block, experts = _pair(family)
    ids, mask = batch()
    real = mask.bool()
    ref, _ = _hf_expert_writes(hf, ids, mask)
    g = experts.graph
    with torch.no_grad():
        ours = experts.run(ids, mask, keep_senders=True)
        base = block.run(ids, mask, keep_senders=True)
    assert torch.equal(ours.logits, base.logits)
    split = [L for L in range(g.n_layers) if g.mlp_count(L) > 1]
    assert split == sorted(ref)
    for L in split:
        parts = ours.senders[:, g.mlp_senders(L)]  # [B, n, P, D]
        hf_parts, hf_block = ref[L]
        assert parts.shape == hf_parts.shape
        scale = float(hf_block[real].abs().max())
        tol = 1e-5 * max(1.0, scale)
        for j in range(parts.shape[1]):
            assert (parts[:, j] - hf_parts[:, j])[real].abs().max() <= tol, (family, L, j)
            # exactly zero where HF's router did not select expert j (the shared expert writes everywhere)
            if not (g.shared_expert and j == g.mlp_count(L) - 1):
                assert torch.equal((parts[:, j] != 0)[real], (hf_parts[:, j] != 0)[real]), (family, L, j)
        assert (parts.sum(1) - hf_block)[real].abs().max() <= tol, (family, L)
        assert (parts.sum(1) - base.senders[:, block.graph.mlp_sender(L)])[real].abs().max() <= tol
        assert (hf_parts != 0).any(-1).sum(1)[real].min() >= experts.cfg.moe["top_k"]  # k experts write per token


def _routing_flips(m, task, layer: int, cf, clean) -> np.ndarray:
    """[X] bool per expert of ``layer``: selected in one run and not the other at some real token."""
    first = m.graph.mlp_sender(layer)
    X = m.cfg.moe["experts"]
    real = task.attention_mask.bool()
    on_cf, on_clean = (cf[:, first:first + X] != 0).any(-1), (clean[:, first:first + X] != 0).any(-1)  # [B, X, P]
    return ((on_cf != on_clean) & real[:, None]).any((0, 2)).numpy()


@pytest.mark.parametrize("family", ["qwen2_moe", "gpt_oss", "mixtral"])
def test_exact_with_expert_senders_equals_brute_force_through_the_router(family):
    """Every edge, by suffix recomputation, equals a full forward with that edge patched, including the out-edges
    of experts whose selection differs between the clean and corrupted prompts and the edges into the split
    block's receiver (which re-run the router); edges not from a split layer score what the block graph gives."""
    hf, block, m = _pair(family)
    task = _task()
    g = m.graph
    with torch.no_grad():
        cf = m.run(task.corrupted, task.attention_mask, keep_senders=True).senders
        clean = m.run(task.clean, task.attention_mask, keep_senders=True).senders
    got = attribute(m, task, "exact", batch_size=2, max_rows=13, progress=False).scores
    ref = brute_force_edge_effects(m, task, cf)
    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() <= 1e-5 * max(1.0, scale), family
    flipped = _routing_flips(m, task, 0, cf, clean)
    assert flipped.any(), family  # some expert of m0 is selected in one run and not the other
    for j in np.flatnonzero(flipped):
        out = g.sender_out_edges(g.mlp_sender(0) + int(j))
        assert np.abs(ref[:, out]).max() > 1e-3, (family, j)  # these edges carry an effect, and it is matched
    base = attribute(block, task, "exact", batch_size=2, max_rows=13, progress=False).scores
    bg = block.graph
    kept = [i for i, name in enumerate(bg.edge_names) if name.split("->")[0] in g.senders]  # not from a split m{L}
    same = got[:, [g.edge_index(bg.edge_names[i]) for i in kept]]
    # the same edges by the same suffix rows (float32 rounding apart: calls hold other row mixes)
    assert np.abs(same - base[:, kept]).max() <= 1e-6 * max(1.0, scale), family


@pytest.mark.parametrize("family", ["qwen2_moe", "mixtral"])
def test_all_edges_give_the_corrupted_run_and_expert_out_edges_give_their_node_patches(family):
    """Every edge patched is the corrupted run; an expert's out-edges patched are that expert patched everywhere
    (also exact's node level); all out-edges of a layer's experts are the block graph's m{L} patched."""
    _, block, m = _pair(family)
    ids, mask = batch(0)
    corrupt, _ = batch(1)
    g, bg = m.graph, block.graph
    with torch.no_grad():
        cf = m.run(corrupt, mask, keep_senders=True).senders
        all_edges = m.run(ids, mask, intervention=Intervention.edges(torch.ones(g.n_edges), cf)).logits
        corrupted = m(corrupt, mask)
        tol = 1e-5 * max(1.0, float(corrupted.abs().max()))
        assert (all_edges - corrupted).abs()[mask.bool()].max() <= tol, family
        layer_edges = torch.zeros(g.n_edges)
        for u in g.mlp_senders(0):
            em = torch.zeros(g.n_edges)
            em[torch.as_tensor(g.sender_out_edges(u))] = 1
            layer_edges += em
            sm = torch.zeros(g.n_senders)
            sm[u] = 1
            by_edges = m.run(ids, mask, intervention=Intervention.edges(em, cf)).logits
            by_node = m.run(ids, mask, intervention=Intervention.nodes(sm, cf)).logits
            assert (by_edges - by_node).abs().max() <= tol, (family, g.senders[u])
        by_experts = m.run(ids, mask, intervention=Intervention.edges(layer_edges, cf)).logits
        cf_block = block.run(corrupt, mask, keep_senders=True).senders
        sm = torch.zeros(bg.n_senders)
        sm[bg.mlp_sender(0)] = 1
        by_block = block.run(ids, mask, intervention=Intervention.nodes(sm, cf_block)).logits
    assert (by_experts - by_block).abs().max() <= tol, family
    assert (by_block - block(ids, mask)).abs().max() > 1e-3
    task = _task()
    nodes = attribute(m, task, "exact", level="node", progress=False).scores
    seen = 0.0
    with torch.no_grad():  # a node patch by hand: the sender's output replaced everywhere, one full forward
        cf_t = m.run(task.corrupted, task.attention_mask, keep_senders=True).senders
        last, ar = last_index(task.attention_mask), torch.arange(task.clean.shape[0])
        base_lo = m.run(task.clean, task.attention_mask, logits_at=last).logits
        for u in g.mlp_senders(0):
            lo = m.run(task.clean, task.attention_mask, logits_at=last,
                       intervention=Intervention.at_sender(u, cf_t[:, u])).logits
            m0 = task.score(base_lo, indices=ar, clean_logits=base_lo)
            ref = task.score(lo, indices=ar, clean_logits=base_lo) - m0
            assert np.abs(nodes[:, u] - ref.numpy()).max() <= 1e-5 * max(1.0, float(ref.abs().max())), (family, u)
            seen = max(seen, float(ref.abs().max()))
    assert seen > 1e-2, family  # some expert's node patch moves the metric


@pytest.mark.parametrize("family", MOE)
def test_eap_on_expert_senders_equals_hf_autograd(family):
    """Node EAP of m{L}.e{J}: Σ_pos Δ(expert J's write) · ∂m/∂(block output), with the writes from HF's experts
    module (clean and corrupted) and the gradient by autograd on HF; the sender's out-edges sum to it; and the
    experts' edge scores sum to the block graph's m{L} edge scores (EAP is linear in the sender's Δ)."""
    hf, block, m = _pair(family)
    task = _task()
    g = m.graph
    cf_parts, _ = _hf_expert_writes(hf, task.corrupted, task.attention_mask)
    clean_parts, logits = _hf_expert_writes(hf, task.clean, task.attention_mask, grad=True)
    ar, last = torch.arange(task.clean.shape[0]), last_index(task.attention_mask)
    lo = logits[ar, last]
    task.score(lo, indices=ar, clean_logits=lo.detach()).sum().backward()
    nodes = attribute(m, task, "eap", level="node", progress=False).scores
    edges = attribute(m, task, "eap", progress=False).scores
    seen = 0.0
    for L, (parts, blk) in clean_parts.items():
        ref = ((cf_parts[L][0] - parts) * blk.grad[:, None]).sum((2, 3)).numpy()  # [N, n]
        cols = list(g.mlp_senders(L))
        tol = 1e-5 * max(1.0, np.abs(ref).max())
        assert np.abs(nodes[:, cols] - ref).max() <= tol, (family, L)
        for j, u in enumerate(cols):
            assert np.abs(edges[:, g.sender_out_edges(u)].sum(1) - ref[:, j]).max() <= tol, (family, L, j)
        seen = max(seen, np.abs(ref).max())
    assert seen > 1e-2, family
    base = attribute(block, task, "eap", progress=False).scores
    split, other = _split_sums(m, block, edges, base)
    scale = max(1.0, float(np.abs(base).max()))
    assert split <= 1e-5 * scale and other <= 1e-6 * scale, (family, split, other)


def _split_sums(m, block, scores: np.ndarray, base: np.ndarray) -> tuple[float, float]:
    """(max |Σ experts' edge scores - block graph's m{L} score| over split layers, same over all other edges)."""
    g, bg = m.graph, block.graph
    split, other = 0.0, 0.0
    for e, name in enumerate(bg.edge_names):
        sender, receiver = name.split("->")
        if sender in g.senders:
            other = max(other, float(np.abs(scores[:, g.edge_index(name)] - base[:, e]).max()))
        else:
            cols = [g.edge_index(f"{s}->{receiver}") for s in g.mlp_names(int(sender[1:]))]
            split = max(split, float(np.abs(scores[:, cols].sum(1) - base[:, e]).max()))
    return split, other


@pytest.mark.parametrize("method", ["eap-ig-activations", "eap-ig-inputs", "clean-corrupted"])
def test_gradient_methods_split_the_block_score_across_its_experts(method):
    """The other gradient methods are linear in each sender's Δ too: a layer's experts' scores add up to the block
    graph's m{L} score (EAP-IG-activations interpolates the layer's experts together, along the block's path)."""
    _, block, m = _pair("qwen2_moe")
    task = _task()
    scores = attribute(m, task, method, ig_steps=3, progress=False).scores
    base = attribute(block, task, method, ig_steps=3, progress=False).scores
    split, other = _split_sums(m, block, scores, base)
    scale = max(1.0, float(np.abs(base).max()))
    assert split <= 1e-5 * scale and other <= 1e-5 * scale, (method, split, other)


def _edges_by_formula(n_layers: int, n_heads: int, mlp_senders: list[int], parallel: bool = False) -> int:
    """Edges of the graph whose layer L has ``mlp_senders[L]`` MLP senders and one MLP receiver: each head's q, k, v
    read every earlier sender, the MLP input also its own layer's heads (not in a parallel block), logits all."""
    total, upstream = 0, 1
    for layer in range(n_layers):
        total += 3 * n_heads * upstream + upstream + (0 if parallel else n_heads)
        upstream += n_heads + mlp_senders[layer]
    return total + upstream  # logits


def test_the_split_graph_names_orders_and_counts_its_senders():
    """Names in topological order (a layer's heads, then its experts and shared expert), one MLP receiver per
    layer, the edge count by formula; without experts the graph is the one it always was."""
    g = ComponentGraph(3, 2, experts=(2, 0, 3), shared_expert=True)
    assert g.senders == ["input", "a0.h0", "a0.h1", "m0.e0", "m0.e1", "m0.shared", "a1.h0", "a1.h1", "m1",
                         "a2.h0", "a2.h1", "m2.e0", "m2.e1", "m2.e2", "m2.shared"]
    assert [r for r in g.receivers if r.startswith("m")] == ["m0", "m1", "m2"]
    assert g.n_edges == _edges_by_formula(3, 2, [3, 1, 4])
    assert g.upstream_of_attention(1) == 6 and g.upstream_of_mlp(2) == 11 and g.head_sender(2, 1) == 10
    assert list(g.sender_layer) == [-1, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 2]
    assert g.edge_index("m0.shared->m1") == g.edge_offset[g.mlp_receiver(1)] + 5
    plain = ComponentGraph(3, 2)
    assert plain.n_edges == _edges_by_formula(3, 2, [1, 1, 1])
    assert plain.senders == ["input"] + [n for L in range(3) for n in (f"a{L}.h0", f"a{L}.h1", f"m{L}")]
    with pytest.raises(ValueError, match="experts"):
        ComponentGraph(2, 2, experts=(1,))


def test_circuits_on_a_split_graph_keep_edges_into_a_block_read_by_a_live_expert():
    """The split block's input is read by all its experts: pruning keeps an edge into it while one expert has an
    out-edge, drops it when none has; circuits and scores round-trip the split graph (JSON, Parquet)."""
    from circuitstat.circuits.circuit import Circuit

    g = ComponentGraph(2, 1, experts=(3, 0))
    chosen = [g.edge_index(n) for n in ("input->m0", "m0.e2->logits", "input->a1.h0<q>", "a1.h0->logits")]
    c = Circuit.from_edges(g, np.isin(np.arange(g.n_edges), chosen)).prune()
    assert sorted(g.edge_names[i] for i in c.edge_indices) == sorted(g.edge_names[i] for i in chosen)
    assert "m0.e2" in c.node_names and "m0.e0" not in c.node_names
    dead = [g.edge_index(n) for n in ("input->m0", "input->a1.h0<q>", "a1.h0->logits")]
    c2 = Circuit.from_edges(g, np.isin(np.arange(g.n_edges), dead)).prune()
    assert "input->m0" not in [g.edge_names[i] for i in c2.edge_indices]
    back = Circuit.from_json(c.to_json(d_model=8))
    assert back.graph == g and np.array_equal(back.edges, c.edges)
    nodes = Circuit.from_nodes(g, ["m0.e1", "a1.h0"])
    assert {g.edge_names[i] for i in nodes.edge_indices} == {"m0.e1->a1.h0<q>", "m0.e1->a1.h0<k>",
                                                            "m0.e1->a1.h0<v>", "m0.e1->logits", "a1.h0->logits"}


def test_score_tables_record_and_rebuild_the_split_graph(tmp_path):
    from circuitstat.circuits.scores import ScoreMatrix

    g = ComponentGraph(2, 2, experts=(4, 0), shared_expert=True)
    sm = ScoreMatrix(np.ones((2, g.n_edges), np.float32), g, "edge", "eap", "counterfactual", "logit_diff")
    sm.write(tmp_path)
    assert ScoreMatrix.read(tmp_path).graph == g
    assert "experts" not in ScoreMatrix(np.ones((2, 13), np.float32), ComponentGraph(1, 2), "edge", "eap",
                                        "counterfactual", "logit_diff").graph_config()


def test_experts_are_refused_on_a_dense_model_and_a_post_norm_one():
    hf = hf_model("llama3")
    with pytest.raises(InputError, match="no mixture-of-experts layer.*moe_nodes 'block'"):
        set_moe_nodes(from_hf(hf), "experts")
    m = from_hf(hf_model("mixtral"))
    with pytest.raises(InputError, match="unknown moe_nodes"):
        set_moe_nodes(m, "expert")
