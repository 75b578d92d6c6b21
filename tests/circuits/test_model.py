"""CircuitModel against Hugging Face (the oracle), the edge graph, interventions and gradients."""

from __future__ import annotations

import pytest
import torch

from circuitstat.circuits import Intervention, RunState, load_hf, load_model
from circuitstat.core.errors import InputError
from circuitstat.circuits.convert import from_hf
from circuitstat.circuits.model import CircuitModel, ModelConfig

SMALL = {
    "gpt2": "random:gpt2?n_layer=2&n_head=4&n_embd=32&vocab_size=97&n_positions=32&seed=1",
    "neox-parallel": "random:gpt_neox?hidden_size=32&num_hidden_layers=2&num_attention_heads=4"
    "&intermediate_size=64&vocab_size=97&seed=2",
    "neox-sequential": "random:gpt_neox?hidden_size=32&num_hidden_layers=2&num_attention_heads=4"
    "&intermediate_size=64&vocab_size=97&use_parallel_residual=false&seed=3",
    "llama-gqa": "random:llama?hidden_size=32&num_hidden_layers=2&num_attention_heads=4&num_key_value_heads=2"
    "&intermediate_size=64&vocab_size=97&seed=4",
    "qwen2-gqa": "random:qwen2?hidden_size=32&num_hidden_layers=2&num_attention_heads=4&num_key_value_heads=1"
    "&intermediate_size=64&vocab_size=97&seed=5",
}


@pytest.fixture(scope="module", params=list(SMALL))
def pair(request):
    hf = load_hf(SMALL[request.param])
    return request.param, hf, from_hf(hf)


def _batch(seed: int = 0, vocab: int = 97, B: int = 3, P: int = 9):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, P), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding on one example
    mask[2, 8:] = 0
    return ids, mask


def test_logits_equal_hf(pair):
    name, hf, m = pair
    ids, mask = _batch()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).logits
        ours = m(ids, mask)
    real = mask.bool()
    assert (ref - ours).abs()[real].max() <= 1e-4, name
    # and without any padding
    with torch.no_grad():
        assert (hf(ids).logits - m(ids)).abs().max() <= 1e-4


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-gqa"])
def test_gqa_heads_are_ungrouped(name):
    m = from_hf(load_hf(SMALL[name]))
    group = m.cfg.n_heads // m.cfg.n_kv_heads
    W = m.blocks[0].W_K
    assert torch.equal(W[0], W[group - 1]) and (group == m.cfg.n_heads or not torch.equal(W[0], W[group]))


def test_gpt2_small_edge_count_from_the_graph_alone():
    """32,491 edges (EAP-IG / MIB), from the component graph without building the 124M-parameter model,
    against the count by hand: every receiver is fed by every sender upstream of it."""
    from circuitstat.circuits.graph import ComponentGraph

    g = ComponentGraph(n_layers=12, n_heads=12, has_mlp=True)
    per_layer = 12 + 1  # heads and the MLP
    by_hand = sum(3 * 12 * (1 + per_layer * layer) for layer in range(12))  # q, k, v of every head
    by_hand += sum(1 + per_layer * layer + 12 for layer in range(12))  # each MLP also reads its own layer's heads
    by_hand += 1 + per_layer * 12  # logits
    assert by_hand == 32491
    assert g.n_edges == by_hand and len(set(g.edge_names)) == by_hand


def test_parallel_block_mlp_not_fed_by_same_layer_heads():
    _, _, m = "x", None, from_hf(load_hf(SMALL["neox-parallel"]))
    g = m.graph
    assert "a0.h0->m0" not in g._edge_lookup and "a0.h0->m1" in g._edge_lookup
    seq = from_hf(load_hf(SMALL["neox-sequential"])).graph
    assert "a0.h0->m0" in seq._edge_lookup


def _senders(m, ids, mask):
    with torch.no_grad():
        return m.run(ids, mask, keep_senders=True)


def test_edge_interventions_reproduce_clean_and_corrupted(pair):
    name, _, m = pair
    ids, mask = _batch(0)
    corrupt, _ = _batch(1)
    clean = _senders(m, ids, mask)
    cor = _senders(m, corrupt, mask)
    E = m.graph.n_edges
    with torch.no_grad():
        all_edges = m.run(ids, mask, intervention=Intervention.edges(torch.ones(E), cor.senders)).logits
        no_edges = m.run(ids, mask, intervention=Intervention.edges(torch.zeros(E), cor.senders)).logits
    real = mask.bool()
    assert (all_edges - cor.logits).abs()[real].max() <= 1e-5, name
    assert (no_edges - clean.logits).abs()[real].max() <= 1e-5, name


@pytest.mark.parametrize("which", ["input", "head", "mlp"])
def test_out_edges_of_a_sender_equal_node_patch(pair, which):
    name, _, m = pair
    g = m.graph
    ids, mask = _batch(0)
    corrupt, _ = _batch(1)
    cf = _senders(m, corrupt, mask).senders
    u = {"input": 0, "head": g.head_sender(0, 2), "mlp": g.mlp_sender(0)}[which]
    em = torch.zeros(g.n_edges)
    em[torch.as_tensor(g.sender_out_edges(u))] = 1
    sm = torch.zeros(g.n_senders)
    sm[u] = 1
    with torch.no_grad():
        by_edges = m.run(ids, mask, intervention=Intervention.edges(em, cf)).logits
        by_node = m.run(ids, mask, intervention=Intervention.nodes(sm, cf)).logits
    assert (by_edges - by_node).abs().max() <= 1e-5
    assert (by_node - m(ids, mask)).abs().max() > 1e-4  # the patch did something


def test_per_example_masks_act_per_example(pair):
    _, _, m = pair
    ids, mask = _batch(0)
    corrupt, _ = _batch(1)
    cf = _senders(m, corrupt, mask).senders
    E = m.graph.n_edges
    em = torch.zeros(3, E)
    em[1] = 1
    with torch.no_grad():
        out = m.run(ids, mask, intervention=Intervention.edges(em, cf)).logits
        cor = m(corrupt, mask)
        cle = m(ids, mask)
    assert torch.allclose(out[0], cle[0], atol=1e-5) and torch.allclose(out[1][:6], cor[1][:6], atol=1e-5)


def test_suffix_run_equals_full_run_with_receiver_delta(pair):
    _, _, m = pair
    g = m.graph
    ids, mask = _batch(0)
    corrupt, _ = _batch(1)
    with torch.no_grad():
        clean = m.run(ids, mask, keep_senders=True, keep_resid=True)
        cf = _senders(m, corrupt, mask).senders
        for r in (g.attention_receiver(1, "k", 3), g.mlp_receiver(1), g.logits_receiver):
            u = 2  # a0.h1
            delta = cf[:, u] - clean.senders[:, u]
            full = m.run(ids, mask, intervention=Intervention.at_receiver(r, delta)).logits
            layer = int(g.receiver_layer[r])
            start = clean.resid_pre[layer] if layer < m.cfg.n_layers else clean.final_resid
            suffix = m.run(ids, mask, state=RunState(layer, start), intervention=Intervention.at_receiver(r, delta)).logits
            em = torch.zeros(g.n_edges)
            em[g.edge_id(u, r)] = 1
            edge = m.run(ids, mask, intervention=Intervention.edges(em, cf)).logits
            assert (full - suffix).abs().max() <= 1e-5
            assert (full - edge).abs().max() <= 1e-5


def _attn_input_module(hf, layer):
    kind = hf.config.model_type
    if kind == "gpt2":
        return hf.transformer.h[layer].ln_1
    if kind == "gpt_neox":
        return hf.gpt_neox.layers[layer].input_layernorm
    return hf.model.layers[layer].input_layernorm


def test_receiver_gradients_sum_to_attention_input_gradient(pair):
    name, hf, m = pair
    ids, mask = _batch(0)
    target = torch.arange(3)
    # oracle: autograd on the HF model at the attention block's (normalised) input
    layer = 1
    captured = {}

    def pre_hook(module, args):
        x = args[0] * 1.0
        x.retain_grad()
        captured["x"] = x
        return (x,)

    handle = _attn_input_module(hf, layer).register_forward_pre_hook(pre_hook)
    try:
        logits = hf(ids, attention_mask=mask).logits
        (logits[torch.arange(3), 4, target]).sum().backward()
    finally:
        handle.remove()
    ref = captured["x"].grad

    out = m.run(ids, mask, receiver_grads=True)
    metric = out.logits[torch.arange(3), 4, target].sum()
    grads = torch.autograd.grad(metric, out.grad_inputs)
    per_layer = grads[layer * (2 if m.cfg.has_mlp else 1)]  # [B, 3, H, P, D]
    assert per_layer.shape[1:3] == (3, m.cfg.n_heads)
    assert torch.allclose(per_layer.sum((1, 2)), ref, atol=1e-5), name
    if m.cfg.has_mlp:  # the logits receiver's gradient is the unembedding path only
        assert grads[-1].shape == (3, ids.shape[1], m.cfg.d_model)


@pytest.mark.parametrize("positional", ["learned", "rotary"])
def test_own_model_save_load_roundtrip(tmp_path, positional):
    cfg = ModelConfig(n_layers=2, n_heads=2, d_model=16, d_head=8, d_mlp=0, mlp="none", vocab_size=50, n_ctx=16,
                      positional=positional)
    m = CircuitModel(cfg).init_weights(7)
    m.save(tmp_path / "m", meta={"seed": 7})
    back = load_model(tmp_path / "m")  # built on the meta device and assigned the stored tensors
    assert all(t.device.type == "cpu" for t in [*back.parameters(), *back.buffers()])
    assert not any(p.requires_grad for p in back.parameters())
    if positional == "rotary":
        assert torch.equal(back.inv_freq, m.inv_freq)  # the non-persistent buffer is rebuilt
    ids = torch.randint(0, 50, (2, 8))
    assert torch.equal(m(ids), back(ids))
    assert back.weight_hash() == m.weight_hash()
    assert back.graph.n_edges == m.graph.n_edges and "m0" not in back.graph.senders
    assert back.meta["seed"] == 7


def test_init_is_deterministic_and_seed_dependent():
    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_head=8, d_mlp=32, vocab_size=50, n_ctx=16)
    a, b, c = (CircuitModel(cfg).init_weights(s) for s in (1, 1, 2))
    assert a.weight_hash() == b.weight_hash() != c.weight_hash()


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("random:bert?hidden_size=8", "gpt2, gpt_neox, llama, qwen2"),
        ("random:gpt2?n_layer", "key=value"),
        ("random:gpt2?no_such_key=3", "unknown config keys"),
        ("/no/such/dir", "not found"),
    ],
)
def test_bad_sources_give_clear_errors(source, fragment):
    with pytest.raises(InputError, match=fragment):
        load_model(source)


def test_patched_receiver_logits_equal_full_intervened_run(pair):
    name, _, m = pair
    g = m.graph
    ids, mask = _batch(0)
    corrupt, _ = _batch(1)
    last = mask.sum(-1) - 1
    with torch.no_grad():
        clean = m.run(ids, mask, keep_senders=True, keep_resid=True, keep_qkv=True)
        cf = _senders(m, corrupt, mask).senders
        rows = torch.tensor([2, 0, 1, 2])
        for r in range(g.n_receivers):
            u = torch.tensor([0, 1, 2, 0]) % int(g.n_upstream[r])
            delta = cf[rows, u] - clean.senders[rows, u]
            fast = m.patched_receiver_logits(clean, ids, mask, r, rows, delta, last[rows])
            full = m.run(ids[rows], mask[rows], intervention=Intervention.at_receiver(r, delta), logits_at=last[rows]).logits
            assert (fast - full).abs().max() <= 1e-5, (name, g.receivers[r])


def test_last_layer_shortcut_equals_full_logits(pair):
    _, _, m = pair
    ids, mask = _batch(0)
    last = mask.sum(-1) - 1
    with torch.no_grad():
        full = m(ids, mask)[torch.arange(3), last]
        short = m.run(ids, mask, logits_at=last).logits
    assert (full - short).abs().max() <= 1e-5


def test_weight_hash_is_cached_but_follows_in_place_changes():
    m = load_model(SMALL["gpt2"])
    h0 = m.weight_hash()
    assert m.weight_hash() == h0
    with torch.no_grad():
        m.blocks[0].W_Q[0, 0, 0] += 1.0  # in place: same storage, new version
    h1 = m.weight_hash()
    assert h1 != h0
    with torch.no_grad():
        m.blocks[0].W_Q[0, 0, 0] -= 1.0
        m.blocks[1].W_O.data = m.blocks[1].W_O.data.clone()  # new storage, same values
    assert m.weight_hash() == CircuitModel._hash_weights(sorted(m.state_dict().items()))
    m2 = load_model(SMALL["gpt2"])
    assert m2.weight_hash() == h0


def test_projected_receiver_grads_equal_input_probes(pair):
    """Probes on q/k/v mapped back through W and the norm's VJP = probes on every receiver input."""
    name, _, m = pair
    ids, mask = _batch()
    last = mask.long().sum(-1) - 1
    grads = []
    for mode in (True, "projected"):
        out = m.run(ids, mask, receiver_grads=mode, logits_at=last, keep_senders=True)
        metric = out.logits[:, 3].sum() - out.logits[:, 5].pow(2).sum()
        grads.append(m.receiver_input_grads(out, torch.autograd.grad(metric, out.grad_inputs)))
    per_layer = 2 if m.cfg.has_mlp else 1
    assert len(grads[0]) == len(grads[1]) == m.cfg.n_layers * per_layer + 1
    for a, b in zip(*grads):
        assert a.shape == b.shape
        assert (a - b).abs().max() <= 1e-5 * max(1.0, float(a.abs().max())), name


@pytest.mark.parametrize("norm,mlp", [("none", "none"), ("none", "standard"), ("rmsnorm", "none")])
def test_projected_receiver_grads_equal_input_probes_own_models(norm, mlp):
    cfg = ModelConfig(n_layers=2, n_heads=2, d_model=16, d_head=8, d_mlp=32, vocab_size=50, n_ctx=16, norm=norm, mlp=mlp)
    m = CircuitModel(cfg).init_weights(3)
    ids, mask = _batch(vocab=50)
    last = mask.long().sum(-1) - 1
    grads = []
    for mode in (True, "projected"):
        out = m.run(ids, mask, receiver_grads=mode, logits_at=last)
        grads.append(m.receiver_input_grads(out, torch.autograd.grad(out.logits[:, 7].sum(), out.grad_inputs)))
    for a, b in zip(*grads):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, float(a.abs().max()))
