"""The input node convention: token + position embeddings (default) or token embeddings only (EAP-IG / MIB)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitstat.circuits import Intervention, load_model
from circuitstat.circuits.ablation import Ablation, last_index
from circuitstat.circuits.attribution import attribute
from circuitstat.core.errors import InputError
from circuitstat.circuits.tasks import make_task

GPT2 = "random:gpt2?n_layer=2&n_head=4&n_embd=32&vocab_size=97&n_positions=64&seed=1"


@pytest.fixture(scope="module")
def gpt2():
    return load_model(GPT2)


def _task(n=4):
    task = make_task("induction", vocab_size=97, n=n, seed=0, seq_len=5)
    mask = task.attention_mask.clone()
    mask[1, -2:] = 0  # one padded row: positions come from the mask
    return task.__class__(name="t", clean=task.clean, corrupted=task.corrupted, attention_mask=mask,
                          answer=task.answer, wrong_answer=task.wrong_answer)


@pytest.mark.parametrize("method", ["exact", "eap"])
def test_counterfactual_patching_is_the_same_under_both_conventions(gpt2, method):
    task = _task()
    a = attribute(gpt2, task, method, input_node="embeddings", progress=False).scores
    b = attribute(gpt2, task, method, input_node="tokens", progress=False).scores
    assert np.array_equal(a, b)


def test_zero_ablation_keeps_the_position_embedding_by_hand(gpt2):
    task = _task()
    idx = torch.arange(4)
    cf = Ablation("zero", gpt2, task, input_node="tokens").senders(idx)
    pos = (task.attention_mask.cumsum(-1) - 1).clamp(min=0)  # position ids, counted by hand
    assert torch.equal(cf[:, 0], gpt2.W_pos.detach()[pos])
    assert not cf[:, 1:].any()
    # exact scores = one full run per edge with that value patched in
    g = gpt2.graph
    last = last_index(task.attention_mask)
    got = attribute(gpt2, task, "exact", ablation="zero", input_node="tokens", progress=False).scores
    with torch.no_grad():
        base = gpt2.run(task.clean, task.attention_mask, logits_at=last).logits
        m0 = task.score(base, indices=idx, clean_logits=base)
        for e in g.sender_out_edges(0)[::3]:
            mask = torch.zeros(g.n_edges)
            mask[e] = 1
            lo = gpt2.run(task.clean, task.attention_mask, intervention=Intervention.edges(mask, cf), logits_at=last).logits
            ref = (task.score(lo, indices=idx, clean_logits=base) - m0).numpy()
            assert np.abs(got[:, e] - ref).max() <= 1e-5, g.edge_names[e]


def test_zero_ablation_conventions_differ_by_the_position_part_only():
    """EAP is linear in the counterfactual: the input edges' scores differ by Σ_pos W_pos · ∂m/∂in_v."""
    gpt2 = load_model(GPT2).double()  # float64, so small differences are compared tightly
    task = _task()
    g = gpt2.graph
    emb = attribute(gpt2, task, "eap", ablation="zero", progress=False).scores
    tok = attribute(gpt2, task, "eap", ablation="zero", input_node="tokens", progress=False).scores
    others = np.flatnonzero(g.edge_sender != 0)
    assert np.allclose(emb[:, others], tok[:, others], atol=1e-6)
    idx = torch.arange(4)
    last = last_index(task.attention_mask)
    out = gpt2.run(task.clean, task.attention_mask, receiver_grads=True, logits_at=last)
    metric = task.score(out.logits, indices=idx, clean_logits=out.logits.detach()).sum()
    grads = torch.autograd.grad(metric, out.grad_inputs)
    wpos = gpt2.W_pos.detach()[(task.attention_mask.cumsum(-1) - 1).clamp(min=0)]  # [B, P, D]
    by_hand = {
        "a0.h2<q>": grads[0][:, 0, 2], "a1.h1<k>": grads[2][:, 1, 1], "a1.h3<v>": grads[2][:, 2, 3],
        "m0": grads[1], "logits": grads[-1],
    }
    for receiver, grad in by_hand.items():
        e = g.edge_index(f"input->{receiver}")
        expected = (wpos * grad).sum((1, 2)).detach().numpy()
        diff = tok[:, e].astype(np.float64) - emb[:, e]
        assert np.allclose(diff, expected, rtol=1e-3, atol=1e-9), receiver
        assert np.abs(expected).min() > 1e-7  # not vacuous


def test_mean_ablation_tokens_averages_token_embeddings(gpt2):
    task = _task()
    idx = torch.arange(4)
    a = Ablation("mean", gpt2, task).senders(idx)
    b = Ablation("mean", gpt2, task, input_node="tokens").senders(idx)
    m = task.attention_mask
    pos = (m.cumsum(-1) - 1).clamp(min=0)
    W = gpt2.W_pos.detach()
    mean_pos = (W[pos] * m[..., None]).sum((0, 1)) / m.sum()  # mean position embedding over real tokens
    assert torch.allclose(b[:, 0] - a[:, 0], W[pos] - mean_pos, atol=1e-6)
    assert torch.equal(b[:, 1:], a[:, 1:].expand_as(b[:, 1:]))


def test_conventions_coincide_without_learned_positions():
    model = load_model("random:gpt_neox?hidden_size=32&num_hidden_layers=2&num_attention_heads=4"
                       "&intermediate_size=64&vocab_size=97&seed=2")
    task = _task(n=3)
    a = attribute(model, task, "eap", ablation="zero", progress=False).scores
    b = attribute(model, task, "eap", ablation="zero", input_node="tokens", progress=False).scores
    assert np.array_equal(a, b)


def test_input_node_is_recorded_and_checked(gpt2):
    task = _task(n=2)
    sm = attribute(gpt2, task, "eap", ablation="zero", input_node="tokens", progress=False)
    assert sm.params["input_node"] == "tokens"
    with pytest.raises(InputError, match="input_node"):
        attribute(gpt2, task, "eap", input_node="positions", progress=False)
    with pytest.raises(InputError, match="differs"):
        attribute(gpt2, task, "eap", ablation=Ablation("zero", gpt2, task), input_node="tokens", progress=False)
