"""Token read-outs (attention, value norms, contribution weights, gradient x input), token ablation
and sink read-outs, against hand computations in numpy and independent forward passes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitstat.circuits.contributions import (ablation_drops, candidate_mask, head_weight_matrices, rank_tokens,
                                    random_ranks, sink_readouts, token_weights)
from circuitstat.core.errors import InputError
from circuitstat.circuits.model import CircuitModel, ModelConfig
from circuitstat.circuits.tasks import task_from_token_lists


def _bare(n_layers=1, n_heads=2, d=8, e=4, vocab=11, seed=0, mlp="none", norm="none", positional="none"):
    cfg = ModelConfig(n_layers=n_layers, n_heads=n_heads, d_model=d, d_head=e, d_mlp=16 if mlp != "none" else 0,
                      vocab_size=vocab, n_ctx=16, norm=norm, positional=positional, mlp=mlp, act="relu")
    m = CircuitModel(cfg).init_weights(seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():  # weights large enough that patterns are far from uniform
        for blk in m.blocks:
            for p in (blk.W_Q, blk.W_K, blk.W_V, blk.W_O, blk.b_V, blk.b_Q, blk.b_K):
                p.copy_(torch.randn(p.shape, generator=g) * 0.7)
        m.W_E.copy_(torch.randn(m.W_E.shape, generator=g))
        if not cfg.tied_embeddings:
            m.W_U.copy_(torch.randn(m.W_U.shape, generator=g))
    return m.eval()


def _numpy_head(x, W_Q, b_Q, W_K, b_K, W_V, b_V, W_O):
    """Hand computation of one causal head: pattern a, token values u, output o, contribution c."""
    q, k, v = x @ W_Q + b_Q, x @ W_K + b_K, x @ W_V + b_V
    s = q @ k.T / np.sqrt(W_Q.shape[1])
    P = x.shape[0]
    s = np.where(np.tril(np.ones((P, P), bool)), s, -np.inf)
    a = np.exp(s - s.max(1, keepdims=True))
    a /= a.sum(1, keepdims=True)
    u = v @ W_O
    o = a @ u
    c = np.array([[a[i, j] * (u[j] @ o[i]) / (o[i] @ o[i]) for j in range(P)] for i in range(P)])
    kob = np.array([[a[i, j] * np.linalg.norm(u[j]) for j in range(P)] for i in range(P)])
    return a, u, o, c, kob


def _task(ids, answer, wrong, metric="logit_diff"):
    return task_from_token_lists("t", [list(r) for r in ids], [list(r) for r in ids], answer, wrong, metric=metric)


def test_contribution_weights_equal_a_hand_computation():
    m = _bare()
    ids = torch.tensor([[1, 4, 2, 7, 3, 9]])
    got = head_weight_matrices(m, ids)
    blk = m.blocks[0]
    x = m.W_E[ids[0]].detach().double().numpy()
    for h in range(2):
        W = lambda t: t[h].detach().double().numpy()  # noqa: E731
        a, u, o, c, kob = _numpy_head(x, W(blk.W_Q), W(blk.b_Q), W(blk.W_K), W(blk.b_K), W(blk.W_V), W(blk.b_V),
                                      W(blk.W_O))
        np.testing.assert_allclose(got["attention"][0, 0, h], a, atol=1e-5)
        np.testing.assert_allclose(got["contribution"][0, 0, h], c, atol=1e-4)
        np.testing.assert_allclose(got["value_norm"][0, 0, h], kob, atol=1e-4)
        # every row of contribution weights sums to one (o_i is the sum of the projected pieces)
        np.testing.assert_allclose(got["contribution"][0, 0, h].sum(-1), 1.0, atol=1e-4)
        assert not np.allclose(c, a, atol=0.05)  # the measures really differ on this layer


def test_readout_rows_match_the_full_matrices_and_layer_level_by_hand():
    m = _bare(n_layers=2, mlp="standard", norm="layernorm", positional="learned", seed=3)
    rows = [[1, 4, 2, 7, 3, 9, 5], [2, 2, 8, 1, 6]]  # right padding: the read-out is the last real token
    task = task_from_token_lists("t", rows, rows, [3, 4], [5, 6])
    w = token_weights(m, task)
    full = head_weight_matrices(m, task.clean, task.attention_mask)
    for n, last in enumerate((6, 4)):
        assert w.readout[n] == last and w.mask[n].sum() == last + 1
        np.testing.assert_allclose(w.attention[n], full["attention"][n, :, :, last], atol=1e-5)
        np.testing.assert_allclose(w.contribution[n], full["contribution"][n, :, :, last], atol=1e-4)
        np.testing.assert_allclose(w.contribution[n].sum(-1), 1.0, atol=1e-4)
        np.testing.assert_allclose(w.projection[n].sum(-1), w.head_output_norm[n], rtol=1e-4)
        np.testing.assert_allclose(w.layer_contribution[n].sum(-1), 1.0, atol=1e-4)
    # layer level by hand: sum over heads of a u, projected on the summed output
    run = m.run(task.clean, task.attention_mask, keep_patterns=True, keep_qkv=True, keep_senders=True)
    for layer in range(2):
        a = run.patterns[layer][0, :, 6].double()  # [H, P]
        u = (run.qkv[layer][2][0].double() @ m.blocks[layer].W_O.double())  # [H, P, D]
        piece = (a[..., None] * u).sum(0)  # [P, D]
        o = piece.sum(0)
        expect = (piece @ o / (o @ o)).detach().numpy()
        np.testing.assert_allclose(w.layer_contribution[0, layer], expect, atol=1e-4)
        np.testing.assert_allclose(w.layer_value_norm[0, layer], piece.norm(dim=-1).detach().numpy(), rtol=1e-4)


def _sink_model(sink_token=0, big=30.0):
    """One head whose queries all attend to token ``sink_token``, whose value vector is zero."""
    m = _bare(n_heads=2)
    with torch.no_grad():
        m.W_E[:, 0] = 1.0  # every other token shares a direction the keys read negatively
        m.W_E[sink_token] = 0.0
        blk = m.blocks[0]
        blk.W_Q[0].zero_()
        blk.b_Q[0].zero_()
        blk.b_Q[0, 0] = big
        blk.W_K[0].zero_()
        blk.W_K[0, 0, 0] = -1.0  # k_j = -x_j[0] e_0 + b_K
        blk.b_K[0].zero_()
        blk.b_V.zero_()  # the sink token's value vector is then exactly zero
        blk.W_Q[1].zero_()  # head 1 attends uniformly: 1 / (i + 1) to each visible token
        blk.b_Q[1].zero_()
    return m


def test_high_attention_zero_value_gets_zero_contribution():
    m = _sink_model()
    ids = [[0, 3, 5, 2, 7, 4], [0, 6, 1, 8, 2, 9]]
    task = _task(ids, [1, 2], [3, 4])
    w = token_weights(m, task)
    assert (w.attention[:, 0, 0, 0] > 0.99).all()  # head 0 attends to token 0 almost entirely
    np.testing.assert_allclose(w.value_norm[:, 0, 0, 0], 0.0, atol=1e-6)
    np.testing.assert_allclose(w.contribution[:, 0, 0, 0], 0.0, atol=1e-6)
    imp_att, imp_con = w.importance("attention"), w.importance("contribution")
    assert (np.nanargmax(imp_att, axis=1) == 0).all()
    assert (np.nanargmax(imp_con, axis=1) != 0).all()


def test_grad_input_is_the_directional_derivative():
    m = _bare(n_layers=2, mlp="standard", norm="layernorm", positional="learned", seed=5).double()
    ids = [[1, 4, 2, 7, 3, 9], [2, 5, 8, 1, 6, 3]]
    task = _task(ids, [1, 2], [3, 4])
    w = token_weights(m, task)
    eps = 1e-2  # the metric is cast to float32: a larger step keeps rounding below the tolerance
    for n in range(2):
        row = task.select([n])
        base = m.embed(row.clean, m.positions(row.attention_mask)).detach()
        for j in range(6):
            delta = torch.zeros_like(base)
            delta[0, j] = m.W_E[row.clean[0, j]].detach()  # zero ablation removes the token embedding

            def metric(t):
                from circuitstat.circuits.interventions import Intervention

                logits = m.run(row.clean, intervention=Intervention.at_sender(0, base + t * delta)).logits
                return float(row.score(logits).detach())
            fd = (metric(eps) - metric(-eps)) / (2 * eps)
            assert w.grad_input[n, j] == pytest.approx(fd, rel=1e-3, abs=2e-4)


def test_ablation_drops_equal_a_forward_with_a_null_token():
    m = _bare(n_layers=2, mlp="standard", norm="layernorm", positional="learned", seed=7)
    null = m.cfg.vocab_size - 1
    with torch.no_grad():
        m.W_E[null] = 0.0  # zero ablation == replacing the token by a token with a zero embedding
    ids = [[1, 4, 2, 7, 3, 9], [2, 5, 8, 1, 6, 3], [3, 3, 1, 2, 8, 4]]
    task = _task(ids, [1, 2, 3], [4, 5, 6])
    w = token_weights(m, task)
    cand = candidate_mask(w)
    order = rank_tokens(w.importance("contribution"), cand)[None]
    ks = (1, 2, 4)
    drops = ablation_drops(m, task, order, ks, cand)
    clean = task.score(m(task.clean)).detach().numpy()
    for n in range(3):
        for ki, k in enumerate(ks):
            edited = task.clean[n].clone()
            edited[torch.as_tensor(order[0, n, :k])] = null
            logits = m(edited[None])
            expect = clean[n] - float(task.select([n]).score(logits).detach())
            assert drops[n, 0, ki] == pytest.approx(expect, abs=1e-4)


def test_ranks_and_random_orders_respect_candidates():
    w_mask = np.array([[True, True, True, False], [True, True, True, True]])
    score = np.array([[0.1, 0.5, 0.5, 9.0], [np.nan, 0.2, 0.3, 0.1]])
    order = rank_tokens(score, w_mask)
    assert order[0].tolist()[:3] == [1, 2, 0]  # ties in position order, the non-candidate last
    assert order[0, 3] == 3
    assert order[1, -1] == 0  # NaN ranks last among candidates
    rr = random_ranks(w_mask, 50, np.random.default_rng(0))
    assert (rr[:, 0, 3] == 3).all()
    assert {int(x) for x in rr[:, 1, 0]} == {0, 1, 2, 3}  # every candidate can come first


def test_candidate_exclusions_and_errors():
    m = _bare()
    task = _task([[1, 2]], [3], [4])
    w = token_weights(m, task)
    assert candidate_mask(w, exclude_first=True)[0].tolist() == [False, True]
    with pytest.raises(InputError, match="no token left"):
        candidate_mask(w, exclude_first=True, exclude_readout=True)
    with pytest.raises(InputError, match="unknown token-importance measure"):
        w.importance("saliency")


def test_planted_sink_readouts():
    m = _sink_model(sink_token=0)
    ids = torch.tensor([[0, 3, 5, 2, 7, 4]])
    r = sink_readouts(m, ids)
    assert r.sink_position.tolist() == [0]
    assert not r.positions[0, 0] and r.positions[0, 1:].all()
    assert (r.sink_attention[0, 0, 0, 1:] > 0.99).all()  # head 0 is a sink at every query
    np.testing.assert_allclose(r.sink_attention[0, 0, 1, 1:], 1 / np.arange(2, 7), rtol=1e-5)  # head 1 is not
    np.testing.assert_allclose(r.output_norm[0, 0, 0, 1:], 0.0, atol=1e-3)  # it writes (almost) nothing
    # a sink token placed later is found by the detection rule
    m2 = _sink_model(sink_token=5)
    ids2 = torch.tensor([[1, 5, 3, 2, 7, 4, 8]])
    r2 = sink_readouts(m2, ids2, sink="detected")
    assert r2.sink_position.tolist() == [1]
    assert (r2.sink_attention[0, 0, 0, 2:] > 0.99).all()
    with pytest.raises(InputError, match="sink token rule"):
        sink_readouts(m2, ids2, sink="last")


def test_mean_ablation_replaces_the_token_embedding_by_the_mean_row():
    from circuitstat.circuits.contributions import ablated_inputs

    m = _bare(positional="learned")
    ids = torch.tensor([[1, 4, 2]])
    mask = torch.ones_like(ids)
    which = torch.tensor([[False, True, False]])
    x = ablated_inputs(m, ids, mask, which, "mean")
    expect = m.W_E[ids] + m.W_pos[:3][None]
    expect[0, 1] = m.W_E.mean(0) + m.W_pos[1]
    torch.testing.assert_close(x, expect)
    torch.testing.assert_close(ablated_inputs(m, ids, mask, which, "zero")[0, 1], m.W_pos[1])
    with pytest.raises(InputError, match="unknown token ablation"):
        ablated_inputs(m, ids, mask, which, "blank")


# --- mask ablation: the token leaves attention, every position id stays --------------------------------
HF_SMALL = {  # random-weight HF models (learned and rotary positions), as in test_model
    "gpt2": "random:gpt2?n_layer=2&n_head=4&n_embd=32&vocab_size=97&n_positions=32&seed=1",
    "llama": "random:llama?hidden_size=32&num_hidden_layers=2&num_attention_heads=4&num_key_value_heads=2"
    "&intermediate_size=64&vocab_size=97&seed=4",
}


@pytest.fixture(scope="module", params=list(HF_SMALL))
def hf_pair(request):
    from circuitstat.circuits import load_hf
    from circuitstat.circuits.convert import from_hf

    hf = load_hf(HF_SMALL[request.param])
    return request.param, hf.eval(), from_hf(hf).eval()


def _hf_readout(hf, ids: torch.Tensor, keep: torch.Tensor, positions: torch.Tensor, last: int) -> torch.Tensor:
    """HF logits [1, V] at ``last`` with the keys where ``keep`` is 0 masked and explicit position ids."""
    with torch.no_grad():
        return hf(ids[None], attention_mask=keep[None], position_ids=positions[None]).logits[:, last]


def test_mask_ablation_drops_equal_hf_with_the_keys_masked_and_positions_kept(hf_pair):
    name, hf, m = hf_pair
    rows = [[5, 17, 42, 8, 63, 21, 9, 30], [11, 3, 77, 52, 6, 40], [90, 2, 14, 14, 71, 33, 25]]
    task = _task(rows, [7, 8, 9], [10, 11, 12])  # right padding: read-outs at 7, 5, 6
    w = token_weights(m, task, ablation="mask")
    cand = candidate_mask(w, exclude_readout=True)
    orders = np.concatenate([rank_tokens(w.importance("contribution"), cand)[None],
                             random_ranks(cand, 2, np.random.default_rng(0))])
    ks = (1, 3)
    drops = ablation_drops(m, task, orders, ks, cand, ablation="mask")
    err, shifted = 0.0, 0.0  # largest error; largest change if later positions shifted (must be told apart)
    for n in range(3):
        last = int(task.last_pos[n])
        ids, real = task.clean[n], task.attention_mask[n]
        pos = torch.arange(ids.shape[0])
        row = torch.tensor([n])
        clean = float(task.score(_hf_readout(hf, ids, real, pos, last), indices=row))
        for r in range(orders.shape[0]):
            for ki, k in enumerate(ks):
                keep = real.clone()
                keep[torch.as_tensor(orders[r, n, :k])] = 0
                assert keep[last] == 1 and keep.sum() == last + 1 - k
                expect = clean - float(task.score(_hf_readout(hf, ids, keep, pos, last), indices=row))
                err = max(err, abs(drops[n, r, ki] - expect))
                moved = (keep.cumsum(0) - 1).clamp(min=0)  # positions counted from the mask: later tokens shift
                shift = clean - float(task.score(_hf_readout(hf, ids, keep, moved, last), indices=row))
                shifted = max(shifted, abs(shift - expect))
    tol = 1e-5  # float32 rounding (measured ~1e-7)
    assert err <= tol, name
    assert shifted > 20 * tol, name  # shifting the positions would fail the check above


def test_masking_equals_deleting_the_token_with_positions_kept(hf_pair):
    name, hf, m = hf_pair
    ids = torch.tensor([[4, 19, 61, 7, 33, 80, 12, 50, 2]])
    P, gone = ids.shape[1], 3
    keep = torch.ones_like(ids)
    keep[0, gone] = 0
    pos = torch.arange(P)[None]
    with torch.no_grad():
        masked = m.run(ids, keep, positions=pos).logits
        rest = torch.arange(P) != gone
        # the token deleted from the sequence, the others at their old positions (a gap at 3)
        deleted = m.run(ids[:, rest], positions=pos[:, rest]).logits
        hf_deleted = hf(ids[:, rest], position_ids=pos[:, rest]).logits
        unmasked_default = m.run(ids).logits
    torch.testing.assert_close(masked[:, rest], deleted, atol=1e-5, rtol=0)
    torch.testing.assert_close(masked[:, rest], hf_deleted, atol=1e-4, rtol=0)
    torch.testing.assert_close(masked[:, :gone], unmasked_default[:, :gone], atol=1e-5, rtol=0)  # causal
    assert (masked[:, gone + 1:] - unmasked_default[:, gone + 1:]).abs().max() > 1e-3  # the mask acted
    # positions=None is the old behaviour: ids counted from the mask
    with torch.no_grad():
        torch.testing.assert_close(m.run(ids, keep, positions=m.positions(keep)).logits, m.run(ids, keep).logits)


def test_masking_a_zero_value_token_renormalises_the_others_analytically():
    """One attention-only layer without norms: hiding a key whose value vector is zero leaves every
    other key's weighted value as it was and divides each head's output o_i by 1 - a_i,sink."""
    m = _sink_model(sink_token=0, big=2.0)
    ids = [[3, 0, 5, 2, 7, 4], [6, 1, 0, 8, 2, 9]]
    task = _task(ids, [1, 2], [3, 4])
    sink_at = np.array([1, 2])
    cand = np.zeros((2, 6), bool)
    cand[np.arange(2), sink_at] = True
    drops = ablation_drops(m, task, rank_tokens(cand.astype(float), cand)[None], (1,), cand, ablation="mask")
    blk = m.blocks[0]
    with torch.no_grad():
        values = torch.einsum("d,hde->he", m.W_E[0], blk.W_V) + blk.b_V  # the sink's value vector per head
        assert values.abs().max() == 0
        run = m.run(task.clean, keep_patterns=True, keep_senders=True)
        for n in range(2):
            a = run.patterns[0][n, :, 5, sink_at[n]].double()  # [H] attention of the read-out to the sink
            assert ((a > 0.05) & (a < 0.95)).all()  # the renormalisation is far from trivial
            o = run.blocks[1][n, :, 5].double()  # [H, D] head outputs at the read-out (without b_O)
            resid = m.W_E[task.clean[n, 5]].double() + (o / (1 - a)[:, None]).sum(0) + blk.b_O.double()
            logits = resid @ m.W_U.double() + m.b_U.double()  # no norm, no positions: the residual is read out
            clean = run.logits[n, 5].double()
            expect = float((clean[1 + n] - clean[3 + n]) - (logits[1 + n] - logits[3 + n]))
            assert drops[n, 0, 0] == pytest.approx(expect, abs=1e-4)


def test_mask_ablation_guards_and_grad_input_baseline():
    from circuitstat.circuits.contributions import ablated_inputs

    m = _bare(n_layers=2, mlp="standard", norm="layernorm", positional="learned", seed=2)
    task = _task([[1, 4, 2, 7], [2, 5, 8, 1]], [1, 2], [3, 4])
    w_mask, w_zero = token_weights(m, task, ablation="mask"), token_weights(m, task, ablation="zero")
    np.testing.assert_array_equal(w_mask.grad_input, w_zero.grad_input)  # documented: the zero baseline
    cand = candidate_mask(w_mask)  # the read-out is a candidate
    order = rank_tokens(w_mask.importance("attention"), cand)[None]
    with pytest.raises(InputError, match="read-out token"):
        ablation_drops(m, task, order, (1,), cand, ablation="mask")
    with pytest.raises(InputError, match="changes no embedding"):
        ablated_inputs(m, task.clean, task.attention_mask, cand, "mask")
    with pytest.raises(InputError, match="unknown token ablation"):
        ablation_drops(m, task, order, (1,), cand, ablation="delete")
    with pytest.raises(InputError, match="shape of input_ids"):
        m.run(task.clean, positions=torch.arange(3)[None])
    with pytest.raises(InputError, match="n_ctx"):
        m.run(task.clean, positions=torch.full_like(task.clean, m.cfg.n_ctx))
