"""Uniform Gradient Sampling (UGS): a circuit found by learning one Bernoulli keep-probability per edge (Li & Janson
2024, "Optimal ablation for interpretability", NeurIPS; one of the mask-optimisation methods MIB ranks best).

Source of the definition.  MIB's circuit-track repository as stored here has no UGS code, so this follows Li &
Janson's own implementation, github.com/maxtli/optimalablation (read as alestolfo/optimalablation):
``mask_samplers/EdgeMaskSampler.py``, class ``EdgeMaskUnifSampler`` (``sample_modified_unif``, ``complexity_loss``,
``get_mask_loss``), driven by ``edge_pruning_unif_dynamic.py`` (the main UGS script: AdamW with betas (0.9, 0.995),
gradient norm clipped at 5, logits initialised at 1) with ``utils/MaskConfig.py`` (12 mask samples per prompt).

Objective.  Each edge e has a logit θ_e and keep probability p_e = sigmoid(θ_e); a circuit is a random mask
α ∈ [0, 1]^E, edge e carrying the clean flow times α_e and the counterfactual times 1 − α_e (the masked model of
circuitstat.circuits.edge_pruning, ``masked_logits``: α = 1 is the clean model, α = 0 the fully patched one, a
0/1 vector exactly the circuit evaluation of faithfulness).  UGS minimises

    E_α[ F(α) ]  +  sparsity · mean_e p_e,        α_e ~ Bernoulli(p_e) independently,

F the faithfulness term of edge pruning (``objective``: ``mean_metric``, ``metric`` or ``kl``; Li & Janson use
KL) on the prompts, each prompt with its own ``n_samples`` draws of α.

Gradient estimator (``sample_modified_unif`` with its default scale 1).  The derivative of a Bernoulli expectation
in p_e is a difference, d/dp_e E[F] = E[F(α_e=1) − F(α_e=0)] = E[∫_0^1 ∂F/∂α_e dα_e]: the partial derivative at a
*uniform* α_e.  So each draw puts a window of width w_e = p_e(1 − p_e) (held constant) around p_e: with
u ~ U(0, 1),

    α_e = clamp((p_e − u) / w_e + 1/2, 0, 1)

is 1 with probability p_e − w_e/2, 0 with probability 1 − p_e − w_e/2 and uniform on (0, 1) with probability w_e
(mean p_e), and its derivative is 1[0 < α_e < 1] · sigmoid'(θ_e) (the source's ``probs`` reparameterisation:
value p_e, gradient w_e sigmoid'(θ_e), divided by w_e).  Autograd through F then gives per edge

    g_e = 1[0 < α_e < 1] · sigmoid'(θ_e) · ∂F/∂α_e(α)  +  sparsity · sigmoid'(θ_e) / E,

whose expectation is w_e · sigmoid'(θ_e) · E[F(α_e=1) − F(α_e=0)] + the sparsity term: the Bernoulli objective's
gradient with the faithfulness part scaled per edge by w_e (Adam's per-coordinate steps absorb such scales).
tests/circuits/test_ugs.py checks this expectation against the closed form on a multilinear F, where
E[F(α)] = F(p) exactly.

Deviations from the source, stated: a fixed sparsity weight on the *mean* of p_e (the source sums, λ · Σ_e p_e:
the same with λ = sparsity / E), full-batch steps over the prompts (the source streams batches of 5), no dangling-
edge pruning of the sampled masks by default (``prune_dangling_edges=True`` is the source's), and a fixed
window (the source's optional dynamic window is off by default).
The paper's other choices are options: ``n_samples=12`` (default 4), ``objective="kl"`` (default ``mean_metric``)
and ``ablation="optimal"`` (learned constants fitted jointly with the mask, circuitstat.circuits.optimal_ablation;
Li & Janson's method).  With any other ablation the fit is labelled "UGS optimiser, <kind> ablation", not UGS
(``params["label"]``).
The ranking score of an edge is θ_e (``log_alpha`` in the shared tables), its deterministic gate p_e; the circuit
is {e : p_e > 1/2}.  Example weights refit on a bootstrap resample, as for edge pruning.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from circuitstat.core.errors import InputError
from circuitstat.core.params import LR_CONSTANTS, PRUNING_INIT, PRUNING_LR, PRUNING_SPARSITY, PRUNING_STEPS, SEED, UGS_SAMPLES

from .ablation import Ablation, PairData
from .edge_pruning import EdgePruningFit, ablation_label, check_fit_options, constants_optimizer, fit_setup, pruning_loss
from .model import CircuitModel
from .optimal_ablation import check_lr_constants, is_optimal

__all__ = ["UGSFit", "fit_ugs", "ugs_sample", "ugs_gates", "ugs_loss", "ADAM_BETAS", "CLIP_NORM"]

ADAM_BETAS = (0.9, 0.995)  # edge_pruning_unif_dynamic.py's AdamW (weight decay 0)
CLIP_NORM = 5.0  # edge_pruning_unif_dynamic.py: mask_sampler.clip_grad(5)


def ugs_gates(theta: torch.Tensor) -> torch.Tensor:
    """The keep probabilities p = sigmoid(θ) [E] (the mean of UGS's sampled mask; the circuit is p > 1/2)."""
    return torch.sigmoid(theta)


def ugs_sample(theta: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """UGS masks α [..., E] for uniform draws ``u`` [..., E]: Bernoulli(p) mixed with a uniform window of width
    p(1 − p) around p, differentiable in θ inside the window (EdgeMaskUnifSampler.sample_modified_unif)."""
    p = torch.sigmoid(theta)
    w = (p * (1.0 - p)).detach()
    p_grad = w * p - (w - 1.0) * p.detach()  # value p, derivative w · sigmoid'(θ)
    return torch.clamp((p_grad - u) / w + 0.5, 0.0, 1.0)


def ugs_loss(model, data: PairData, batches, masks: list[list[torch.Tensor]], objective: str, total_w: float,
             scale: float, cf: torch.Tensor | None = None) -> torch.Tensor:
    """The scale-free faithfulness term F averaged over the draws: ``masks[s][b]`` [B_b, E] is draw s's mask of
    batch b's prompts (one mask per prompt); ablated edges carry ``cf`` (optimal-ablation constants) when given."""
    S = len(masks)
    total = sum(pruning_loss(model, data, b, keep, objective, cf) for draw in masks for b, keep in zip(batches, draw))
    total = total / (S * total_w)
    return (total ** 2 if objective == "mean_metric" else total) / scale


def dangling_structure(graph) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(reads [R, U]: receiver r feeds sender u's node, to_logits [R], edge_sender [E], edge_receiver [E] as one
    tuple's parts) of ``graph``, what prune_dangling walks."""
    U, R = graph.n_senders, graph.n_receivers
    reads = torch.zeros(R, U)
    for r, readers in enumerate(graph.receiver_readers):
        for node in readers:
            if node < U:  # nodes list the senders first, then logits
                reads[r, node] = 1.0
    to_logits = torch.zeros(R)
    to_logits[graph.logits_receiver] = 1.0
    return reads, to_logits, (torch.as_tensor(graph.edge_sender), torch.as_tensor(graph.edge_receiver))


def prune_dangling(graph, alpha: torch.Tensor) -> torch.Tensor:
    """``alpha`` [..., E] with dangling edges set to 0: an edge is kept only while alpha > 0, its sender is reached
    from the input through kept edges and its receiver's node reaches the logits through kept edges (Li & Janson's
    ``prune_dangling_edges`` applied to each sampled mask; the 0/1 factor carries no gradient)."""
    reads, to_logits, (es, er) = dangling_structure(graph)
    on = (alpha.detach() > 0).to(reads.dtype)
    U, R = reads.shape[1], reads.shape[0]
    shape = on.shape[:-1]
    alive = torch.zeros(*shape, U)
    alive[..., 0] = 1.0  # the input
    for _ in range(U):  # reached from the input: a node is alive when a kept edge from an alive sender feeds it
        fed = torch.zeros(*shape, R).index_add_(-1, er, on * alive[..., es])
        new = torch.maximum(alive, ((fed > 0).to(reads.dtype) @ reads).clamp(max=1.0))
        if torch.equal(new, alive):
            break
        alive = new
    useful_r = to_logits.expand(*shape, R).clone()  # receivers that reach the logits
    for _ in range(U + 1):
        useful_u = torch.zeros(*shape, U).index_add_(-1, es, on * useful_r[..., er]).gt(0).to(reads.dtype)
        new = torch.maximum(to_logits.expand(*shape, R), (useful_u @ reads.T).clamp(max=1.0))
        if torch.equal(new, useful_r):
            break
        useful_r = new
    return alpha * (on * alive[..., es] * useful_r[..., er]).to(alpha.dtype)


class UGSFit(EdgePruningFit):
    """One UGS fit: ``log_alpha`` [E] the learned logits θ (the ranking scores), ``keep`` [E] = sigmoid(θ), the
    loss per step and the options it ran with."""


def _check_samples(n_samples: int) -> None:
    if not (isinstance(n_samples, int) and not isinstance(n_samples, bool) and n_samples >= 1):
        raise InputError(f"n_samples must be a positive integer (mask draws per prompt and step), got {n_samples!r}")


def _draw(model, theta: torch.Tensor, u: torch.Tensor, dangling: bool) -> torch.Tensor:
    """One batch's sampled masks, dangling edges pruned when asked, on the model's device."""
    alpha = ugs_sample(theta, u)
    return (prune_dangling(model.graph, alpha) if dangling else alpha).to(model.device)


def fit_ugs(model: CircuitModel, data: PairData, *, rows=None, weights=None, steps: int = PRUNING_STEPS.default,
            lr: float = PRUNING_LR.default_for("ugs"), sparsity: float = PRUNING_SPARSITY.default,
            init: float = PRUNING_INIT.default, objective: str = "mean_metric", n_samples: int = UGS_SAMPLES.default,
            ablation: "str | Ablation" = "counterfactual", seed: int | np.random.SeedSequence = SEED.default,
            batch_size: int = 64, lr_constants: float = LR_CONSTANTS.default,
            prune_dangling_edges: bool = False) -> UGSFit:
    """The UGSFit of ``steps`` Adam steps on ``data``'s examples ``rows`` (all by default) weighted by ``weights``
    (counts), each step drawing ``n_samples`` masks per prompt from the fit's seed (deterministic given it); with
    ``ablation="optimal"`` the ablated edges carry constants learned jointly (Li & Janson's optimal ablation)."""
    check_fit_options(steps, lr, sparsity, objective, batch_size)
    _check_samples(n_samples)
    check_lr_constants(lr_constants)
    t0 = time.perf_counter()
    rows, ss, gen, abl, batches, total_w, scale = fit_setup(model, data, rows, weights, ablation, seed, objective,
                                                            batch_size)
    E = model.graph.n_edges
    theta = torch.full((E,), float(init), dtype=torch.float32, requires_grad=True)
    opt = torch.optim.Adam([theta], lr=lr, betas=ADAM_BETAS)
    cf, opt_c = constants_optimizer(abl, lr_constants)
    losses = np.empty(steps)
    for step in range(steps):
        opt.zero_grad()
        if opt_c is not None:
            opt_c.zero_grad()
        masks = [[_draw(model, theta, torch.rand(len(b.index), E, generator=gen), prune_dangling_edges)
                  for b in batches] for _ in range(n_samples)]
        loss = ugs_loss(model, data, batches, masks, objective, total_w, scale, cf()).cpu() \
            + sparsity * ugs_gates(theta).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([theta], CLIP_NORM)
        opt.step()
        if opt_c is not None:
            opt_c.step()
        losses[step] = float(loss.detach())
    th = theta.detach()
    label = f"UGS ({ablation_label(abl)})" if is_optimal(abl) else f"UGS optimiser, {ablation_label(abl)}"
    params = {"method": "ugs", "label": label, "steps": steps, "lr": lr, "sparsity": sparsity, "init": init, "objective": objective,
              "n_samples": n_samples, "prune_dangling_edges": bool(prune_dangling_edges), "batch_size": batch_size, "n_examples": int(len(rows)),
              "weights": "given" if weights is not None else "uniform", "ablation": getattr(abl, "kind", "custom"),
              "seed_entropy": str(ss.entropy), "seed_spawn_key": list(ss.spawn_key),
              "seconds": time.perf_counter() - t0,
              "sampler": "uniform gradient sampling (window p(1-p); Adam betas 0.9, 0.995; grad norm clip 5)"}
    if is_optimal(abl):
        params.update(abl.describe(), lr_constants=lr_constants)
    return UGSFit(th.numpy().copy(), ugs_gates(th).numpy().copy(), losses, params,
                  abl.constants.cpu().numpy().copy() if is_optimal(abl) else None)
