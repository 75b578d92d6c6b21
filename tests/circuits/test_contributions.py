"""Token read-outs (attention, value norms, contribution weights, gradient x input), token ablation
and sink read-outs, against hand computations in numpy and independent forward passes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuits.contributions import (ablation_drops, candidate_mask, head_weight_matrices, rank_tokens,
                                    random_ranks, sink_readouts, token_weights)
from circuits.errors import InputError
from circuits.model import CircuitModel, ModelConfig
from circuits.tasks import task_from_token_lists


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
                from circuits.interventions import Intervention

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
    from circuits.contributions import ablated_inputs

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
