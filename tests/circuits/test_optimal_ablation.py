"""Optimal ablation (learned constants, Li & Janson 2024) for the mask methods: the learned constants against the
closed form of the objective on a model linear in them, labels of what ran, the target-sparsity Lagrangian of
edge pruning (Bhaskar et al. 2024) reaching its target, and bad options refused."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from circuitstat.circuits.ablation import last_index
from circuitstat.circuits.edge_pruning import TargetSparsity, fit_edge_pruning, masked_logits
from circuitstat.circuits.groundtruth.planted import PlantedSpec, planted_induction
from circuitstat.circuits.ugs import fit_ugs
from circuitstat.core.errors import InputError
from circuitstat.stats.groundtruth import auroc


class _LogitDiff64:
    """A task's prompts with the logit difference kept in float64 (task metrics are float32 by contract)."""

    def __init__(self, task) -> None:
        self.task, self.clean, self.corrupted = task, task.clean, task.corrupted
        self.attention_mask = task.attention_mask

    def score(self, logits, indices=None, clean_logits=None):
        idx = torch.arange(self.clean.shape[0]) if indices is None else torch.as_tensor(indices)
        ar = torch.arange(len(idx))
        return logits[ar, self.task.answer[idx].long()] - logits[ar, self.task.wrong_answer[idx].long()]


@pytest.fixture(scope="module")
def linear():
    """The planted model in float64 (no norms: with every edge ablated its metric is affine in the constants)."""
    gt = planted_induction(PlantedSpec(background=0.25))
    model = copy.deepcopy(gt.model).to(torch.float64)
    return gt, model, _LogitDiff64(gt.task(12, 3))


def _affine_parts(model, task):
    """(d [N, D], e [N], m_clean [N]): with every edge ablated to constants c [1, U, 1, D], the metric is
    e_n + d_n · Σ_u c_u (read off by autograd at c = 0, checked at a random c)."""
    ids, am = task.clean, task.attention_mask
    E, U, D = model.graph.n_edges, model.graph.n_senders, model.cfg.d_model
    zero = torch.zeros(1, U, 1, D, dtype=torch.float64, requires_grad=True)
    m0 = task.score(masked_logits(model, ids, am, zero, torch.zeros(E)))
    d = torch.stack([torch.autograd.grad(m0[n], zero, retain_graph=True)[0][0, 0, 0] for n in range(len(m0))])
    c = torch.randn(1, U, 1, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        m_c = task.score(masked_logits(model, ids, am, c, torch.zeros(E)))
        clean = model.run(ids, am, logits_at=last_index(am)).logits
    torch.testing.assert_close(m_c, m0.detach() + d @ c[0, :, 0].sum(0), rtol=1e-10, atol=1e-10)  # affine
    return d, m0.detach(), task.score(clean)


def test_learned_constants_solve_the_weighted_normal_equations_on_a_linear_model(linear) -> None:
    gt, model, task = linear
    N = task.clean.shape[0]
    w = np.array([1, 2, 0, 1, 3, 1, 1, 0, 2, 1, 1, 1], dtype=np.float64)
    # every edge ablated (gates 0 at log α = -20, the mask frozen by lr 0): only the constants learn
    fit = fit_edge_pruning(model, task, weights=w, steps=600, lr=0.0, init=-20.0, sparsity=0.0, objective="metric",
                           ablation="optimal", lr_constants=0.05, stochastic=False, seed=0)
    d, e, m_clean = _affine_parts(model, task)
    W = torch.as_tensor(w)
    # closed form: argmin_S Σ_n w_n (e_n + d_n·S − m_n(clean))², S = Σ_u c_u: (Σ w d dᵀ) S = Σ w d (m_clean − e)
    A = (d * W[:, None]).T @ d
    b = (d * W[:, None]).T @ (m_clean - e)

    def residual(constants) -> float:
        S = torch.as_tensor(constants, dtype=torch.float64)[0, :, 0].sum(0)
        return float((A @ S - b).norm() / b.norm())

    def sse(constants) -> float:
        S = torch.as_tensor(constants, dtype=torch.float64)[0, :, 0].sum(0)
        return float((W * (e + d @ S - m_clean) ** 2).sum())

    # the least-squares minimum from the weighted design itself (A is rank-deficient: only d's span is identified)
    sw = W.sqrt()
    S_star = torch.linalg.lstsq(sw[:, None] * d, (sw * (m_clean - e))[:, None], driver="gelsd").solution[:, 0]
    sse_star = float((W * (e + d @ S_star - m_clean) ** 2).sum())
    assert fit.constants.shape == (1, model.graph.n_senders, 1, model.cfg.d_model)
    # heads moved through W_O (the source's d_head constants), the rest free: measured 9e-15 relative residual and
    # sse 1.0000 × the minimum (the d_model parametrisation before hovered at 2.5e-3 and 1.0008 ×)
    assert residual(fit.constants) < 1e-6 and sse(fit.constants) <= (1 + 1e-6) * sse_star
    # negative control: the starting constants (mean outputs over the prompts, weighted) are not optimal
    from circuitstat.circuits.ablation import sender_means
    from circuitstat.circuits.optimal_ablation import PromptRows
    init = sender_means(model, PromptRows(task, np.flatnonzero(w > 0)), positional=False, row_weights=w[w > 0])
    assert residual(init) > 0.1 and sse(init) > 2 * sse_star
    assert fit.params["ablation"] == "optimal" and fit.params["constants_relative_change"] > 0


def test_labels_say_what_ran_and_counterfactual_learns_no_constants() -> None:
    gt = planted_induction(PlantedSpec(background=0.25))
    task = gt.task(8, 1)
    ugs_o = fit_ugs(gt.model, task, steps=2, n_samples=1, ablation="optimal")
    ugs_c = fit_ugs(gt.model, task, steps=2, n_samples=1)
    ep_o = fit_edge_pruning(gt.model, task, steps=2, ablation="optimal", target=0.5)
    ep_c = fit_edge_pruning(gt.model, task, steps=2)
    assert ugs_o.params["label"] == "UGS (optimal ablation)"
    assert ugs_c.params["label"] == "UGS optimiser, counterfactual ablation" and ugs_c.constants is None
    assert ep_o.params["label"] == "edge pruning, optimal ablation, target sparsity 0.5 (Lagrangian)"
    assert ep_c.params["label"] == "edge pruning, counterfactual ablation, fixed sparsity penalty"
    assert ugs_o.constants is not None and ep_o.constants is not None and ep_c.constants is None


def test_target_schedule_and_multipliers_ascend() -> None:
    lag = TargetSparsity(0.8, 4, lr=0.1)
    assert [lag.target_at(s) for s in range(6)] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 0.8])
    # too sparse (s > t): gradient ascent raises λ₁, so the term then penalises sparsity
    lag.opt.zero_grad()
    lag.term(5, torch.tensor(0.9)).backward()
    lag.opt.step()
    assert lag.lambdas[0] > 0 and lag.lambdas[1] > 0


def test_edge_pruning_reaches_its_target_sparsity_on_a_planted_model() -> None:
    # background 1: every edge carries some effect (at 0.25 many null edges tie exactly and cross the gate
    # threshold together, so the kept count moves in blocks)
    gt = planted_induction(PlantedSpec(background=1.0))
    task = gt.task(16, 5)
    E = gt.truth.size
    for target in (0.5, 0.8):  # measured: 36 and 17 edges kept of 75 (targets 37.5 and 15)
        fit = fit_edge_pruning(gt.model, task, steps=300, lr=0.2, target=target, objective="kl", seed=0)
        kept = int(fit.circuit_mask().sum())
        assert fit.params["warmup"] == 150  # the default: the target warmed up over the first half
        assert abs(kept - (1 - target) * E) <= 0.05 * E, (target, kept, (1 - target) * E)
        assert fit.params["reached_sparsity"] == pytest.approx(1 - kept / E)
    # negative control: the fixed penalty at the same steps lands elsewhere (the check can fail)
    free = fit_edge_pruning(gt.model, task, steps=300, lr=0.2, sparsity=1.0, objective="kl", seed=0)
    assert abs(int(free.circuit_mask().sum()) - 0.2 * E) > 0.05 * E


def test_bad_options_are_refused() -> None:
    gt = planted_induction(PlantedSpec(background=0.25))
    task = gt.task(4, 1)
    for kw in ({"target": 1.0}, {"target": -0.1}, {"warmup": 3}, {"target": 0.5, "warmup": 99},
               {"target": 0.5, "lr_lambda": 0.0}, {"lr_constants": float("nan")}):
        with pytest.raises(InputError):
            fit_edge_pruning(gt.model, task, steps=5, **kw)
    with pytest.raises(InputError, match="lr_constants"):
        fit_ugs(gt.model, task, steps=1, lr_constants=-1.0, ablation="optimal")


def test_options_sections_carry_optimal_ablation_and_the_target_and_refuse_misuse() -> None:
    from circuitstat.pipelines.runs.attribute.run import pruning_options

    ep = pruning_options("edge-pruning", {"ablation": "optimal", "target": 0.9, "warmup": 10}, None)
    assert ep.fit_options() == {"steps": 50, "lr": 0.2, "sparsity": None, "init": 1.0, "objective": "mean_metric",
                                "ablation": "optimal", "lr_constants": 1e-3, "target": 0.9, "warmup": 10,
                                "lr_lambda": None}
    assert "ablation" not in pruning_options("ugs", {}, None).fit_options()  # the run's ablation is passed instead
    assert pruning_options("ugs", {"ablation": "optimal"}, None).fit_options()["ablation"] == "optimal"
    for method, bad in (("ugs", {"target": 0.5}), ("edge-pruning", {"warmup": 5}), ("edge-pruning", {"target": 1.0}),
                        ("edge-pruning", {"ablation": "mean"}), ("edge-pruning", {"target": 0.5, "warmup": 60})):
        with pytest.raises(InputError):
            pruning_options(method, bad, None)


def test_prune_dangling_matches_graph_reachability() -> None:
    import networkx as nx

    from circuitstat.circuits import load_model
    from circuitstat.circuits.ugs import prune_dangling

    g = load_model("random:gpt2?n_layer=3&n_head=2&n_embd=16&vocab_size=31&n_positions=16&seed=1").graph
    E = g.n_edges
    rng = np.random.default_rng(0)
    alpha = torch.as_tensor(rng.random((40, E)) * (rng.random((40, E)) < 0.15), dtype=torch.float64)
    got = prune_dangling(g, alpha)
    changed = 0
    for b in range(alpha.shape[0]):
        G = nx.DiGraph()  # nodes: sender names and logits; a receiver belongs to its node
        kept = np.flatnonzero(alpha[b].numpy() > 0)
        for e in kept:
            G.add_edge(g.senders[g.edge_sender[e]], g.receiver_node(g.edge_receiver[e]))
        ok = np.zeros(E, dtype=bool)
        for e in kept:
            u, v = g.senders[g.edge_sender[e]], g.receiver_node(g.edge_receiver[e])
            ok[e] = (u == "input" or ("input" in G and nx.has_path(G, "input", u))) and \
                (v == "logits" or ("logits" in G and nx.has_path(G, v, "logits")))
        want = np.where(ok, alpha[b].numpy(), 0.0)
        np.testing.assert_array_equal(got[b].numpy(), want)
        changed += int((want != alpha[b].numpy()).any())
    assert changed > 10  # the masks had dangling edges to prune: the comparison can fail


def test_ugs_with_the_papers_options_runs_and_records_them() -> None:
    gt = planted_induction(PlantedSpec(background=1.0))
    fit = fit_ugs(gt.model, gt.task(8, 0), steps=3, n_samples=12, objective="kl", ablation="optimal",
                  prune_dangling_edges=True)
    p = fit.params
    assert (p["n_samples"], p["objective"], p["ablation"], p["prune_dangling_edges"]) == (12, "kl", "optimal", True)
    assert p["label"] == "UGS (optimal ablation)" and np.isfinite(fit.loss).all()


def test_ugs_section_takes_the_papers_dangling_edge_pruning() -> None:
    from circuitstat.pipelines.runs.attribute.run import pruning_options

    opts = pruning_options("ugs", {"prune_dangling_edges": True, "n_samples": 12, "objective": "kl"}, None)
    assert opts.fit_options()["prune_dangling_edges"] is True
    with pytest.raises(InputError):
        pruning_options("edge-pruning", {"prune_dangling_edges": True}, None)


def test_attribute_flags_write_the_label_and_refuse_misuse_with_exit_2(tmp_path) -> None:
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    runner = CliRunner()
    base = ["attribute", "--model", "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=97&n_positions=64&seed=1",
            "--task", "induction", "--n", "4", "--steps", "3"]
    res = runner.invoke(app, base + ["--method", "edge-pruning", "--mask-ablation", "optimal", "--target", "0.5",
                                     "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    t = pq.read_table(tmp_path / "a" / "edge_masks.parquet").to_pandas()
    assert set(t["label"]) == {"edge pruning, optimal ablation, target sparsity 0.5 (Lagrangian)"}
    assert (t["target_sparsity"] == 0.5).all()
    for bad in (["--method", "ugs", "--target", "0.5"], ["--method", "edge-pruning", "--warmup", "2"],
                ["--method", "ugs", "--mask-ablation", "mean"],
                ["--method", "edge-pruning", "--mask-ablation", "optimal", "--input-node", "tokens"]):
        res = runner.invoke(app, base + bad + ["--out", str(tmp_path / "b")])
        assert res.exit_code == 2, (bad, res.exit_code, res.output)


def _off_span(change: torch.Tensor, W: torch.Tensor) -> float:
    """Relative norm of the part of ``change`` [D] outside the row space of ``W`` [d_head, D] (least squares)."""
    coef = torch.linalg.lstsq(W.T, change[:, None]).solution
    return float((W.T @ coef - change[:, None]).norm() / change.norm())


def test_head_constants_move_only_in_their_own_head_space_as_the_source_defines() -> None:
    # Li & Janson's constant for a head is a value of its z (hook_z, d_head): its output z W_O[h]; the input's and
    # the MLPs' constants are free in d_model (their modal_mlp)
    gt = planted_induction(PlantedSpec(background=1.0))
    model = copy.deepcopy(gt.model).to(torch.float64)
    task = _LogitDiff64(gt.task(8, 2))
    fit = fit_edge_pruning(model, task, steps=6, lr=0.0, init=-20.0, sparsity=0.0, objective="metric",
                           ablation="optimal", lr_constants=0.05, stochastic=False, seed=0)
    from circuitstat.circuits.ablation import sender_means
    from circuitstat.circuits.optimal_ablation import PromptRows

    init = sender_means(model, PromptRows(task, np.arange(8)), positional=False)[0, :, 0]
    change = torch.as_tensor(fit.constants)[0, :, 0] - init
    g = model.graph
    heads = {g.head_sender(layer, h): model.blocks[layer].W_O[h] for layer in range(g.n_layers)
             for h in range(g.n_heads)}
    assert model.cfg.d_head < model.cfg.d_model  # a proper subspace: the check can fail
    moved = [u for u in heads if change[u].norm() > 1e-4 * init[u].norm()]
    assert len(moved) >= 2  # heads the objective reads moved (a head its gradient never reaches stays put)
    for u in moved:
        assert _off_span(change[u], heads[u]) < 1e-9, g.senders[u]
    # negative control: the free d_model constants (input, MLPs) leave any head's space
    W0 = next(iter(heads.values()))
    free = [u for u in range(g.n_senders) if u not in heads]
    assert free and all(_off_span(change[u], W0) > 0.1 for u in free)
    assert fit.params["constants_space"] == "heads in d_head (through W_O), input and MLPs in d_model"


def test_post_norm_heads_keep_d_model_constants_and_say_so() -> None:
    from circuitstat.circuits import load_model
    from circuitstat.circuits.optimal_ablation import head_directions

    model = load_model("random:gemma2?hidden_size=32&num_hidden_layers=1&num_attention_heads=2&num_key_value_heads=1"
                       "&intermediate_size=64&head_dim=16&vocab_size=64")
    assert model.cfg.post_norm and head_directions(model) is None
    from circuitstat.circuits.tasks.induction import induction_task

    task = induction_task(n=4, seq_len=5, vocab_size=64, bos_id=0)
    ep = fit_edge_pruning(model, task, steps=2, ablation="optimal")
    ugs = fit_ugs(model, task, steps=2, n_samples=1, ablation="optimal")
    assert ep.params["label"] == "edge pruning, optimal ablation (head constants in d_model), fixed sparsity penalty"
    assert ugs.params["label"] == "UGS (optimal ablation (head constants in d_model))"
    assert ep.params["constants_space"].startswith("every sender in d_model")
    gt = planted_induction(PlantedSpec(background=1.0))
    index, W = head_directions(gt.model)
    assert W.shape == (len(index), gt.model.cfg.d_head, gt.model.cfg.d_model)


def test_weighted_sender_means_equal_the_mean_over_repeated_prompts() -> None:
    # a bootstrap refit's starting constants: prompt n counted w_n times (oracle: the prompts repeated w_n times)
    from circuitstat.circuits.ablation import sender_means
    from circuitstat.circuits.optimal_ablation import PromptRows

    gt = planted_induction(PlantedSpec(background=1.0))
    model = copy.deepcopy(gt.model).to(torch.float64)
    task = gt.task(6, 4)
    w = np.array([2, 0, 1, 3, 1, 1])
    got = sender_means(model, task, positional=False, batch_size=4, row_weights=w)
    want = sender_means(model, PromptRows(task, np.repeat(np.arange(6), w)), positional=False, batch_size=4)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    plain = sender_means(model, task, positional=False, batch_size=4)
    assert (got - plain).abs().max() > 1e-3  # negative control: the weights change the means
    with pytest.raises(InputError, match="row_weights"):
        sender_means(model, task, positional=False, row_weights=w[:3])


def test_a_prepared_reference_ablation_starts_every_fit_at_the_reference_means_and_is_never_trained_in_place():
    from circuitstat.circuits.ablation import sender_means
    from circuitstat.circuits.optimal_ablation import OptimalAblation

    gt = planted_induction(PlantedSpec(background=1.0))
    reference, task = gt.task(16, 9), gt.task(8, 1)
    abl = OptimalAblation.from_reference(gt.model, reference)
    torch.testing.assert_close(abl.constants, sender_means(gt.model, reference, positional=False))
    start = abl.constants.clone()
    a = fit_edge_pruning(gt.model, task, steps=4, ablation=abl, lr_constants=0.05, seed=1)
    b = fit_edge_pruning(gt.model, task, steps=4, ablation=abl, lr_constants=0.05, seed=1)
    assert torch.equal(abl.constants, start)  # the prepared constants untouched
    np.testing.assert_array_equal(a.constants, b.constants)  # so a second fit starts where the first did
    assert not np.allclose(a.constants, start.numpy())  # and each fit did train its copy
    assert a.params["constants_init"] == "mean over a reference dataset of 16 prompts"
