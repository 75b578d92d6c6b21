"""Edge pruning: a circuit found by learning one continuous mask per edge (Bhaskar et al. 2024, "Finding
Transformer Circuits with Edge Pruning", NeurIPS; one of the mask-optimisation methods MIB ranks best).

Each edge e has a gate z_e in [0, 1] and a logit log α_e.  The masked model is exact patching's edge
intervention made continuous: receiver v reads ``z_u(current) + (1 − z_e)(z_u(counterfactual) − z_u(current))``
for every edge e = u → v (circuitstat.circuits.interventions ``edge_mask`` = 1 − z), so z = 1 everywhere is the
clean model, z = 0 everywhere the fully patched model (faithfulness's m(∅)), and a 0/1 gate vector is
exactly the circuit evaluation of circuitstat.circuits.faithfulness.

Gates are hard-concrete (Louizos, Welling & Kingma 2018, as Bhaskar et al.): during fitting
z = clamp(sigmoid((log u − log(1 − u) + log α) / β) (ζ − γ) + γ, 0, 1), u ~ U(0, 1) drawn per step and edge
from the fit's seed; deterministic gates (``gates(log α)``, u = 1/2) otherwise.  β = 2/3, γ = −0.1,
ζ = 1.1.  The loss is

    faithfulness  +  sparsity · mean_e P(z_e ≠ 0),     P(z_e ≠ 0) = sigmoid(log α_e − β log(−γ / ζ))

with faithfulness one of

* ``"mean_metric"`` (default): (1 − f)², f the ratio-of-means faithfulness of circuitstat.circuits.faithfulness
  (MIB's): (mean m(masked) − mean m(clean))² / (mean m(clean) − mean m(∅))², means weighted over examples;
  an edge whose per-example effects average to zero costs nothing to cut, as the mean effect defines it;
* ``"metric"``: the weighted mean over examples of (m_n(masked) − m_n(clean))² over that of
  (m_n(clean) − m_n(∅))² (per-example faithfulness: keeps edges that move single examples);
* ``"kl"``: the mean KL(clean ‖ masked) of the next-token distributions at the read-out (Bhaskar et al.'s
  objective).

Bhaskar et al.'s sparsity control is ``target``: the fixed penalty is replaced by the Lagrangian
λ₁ (s − t) + λ₂ (s − t)², s = 1 − mean_e P(z_e ≠ 0), the target t warmed up linearly from 0 over ``warmup``
steps (default half of them), the multipliers trained by gradient ascent (TargetSparsity); the reached sparsity
(share of deterministic gates ≤ 1/2) is recorded beside the target.  ``ablation="optimal"`` makes ablated edges
carry learned constants (circuitstat.circuits.optimal_ablation).  ``node_masks=True`` adds the paper's node
(writer) gates, one per sender on all its outgoing edges (NodeMasks), with a fixed penalty ``node_sparsity`` or,
with ``node_target``, the paper's second Lagrangian λ₃ (s_n − t_n) + λ₄ (s_n − t_n)² on the node sparsity s_n = 1 −
mean_u P(z_u ≠ 0) (princeton-nlp/Edge-Pruning's ``node_loss`` in modeling_fpt2.py, ``target_layer_sparsity`` in
src/prune/fpt2_ioi.py; its target warmed up over the same steps, its multipliers at the edges' rate).
Deviations from the paper, stated: node gates off by default, full-batch Adam steps, the default 50 steps
against their thousands, and the default objective ``mean_metric`` (``kl`` is theirs); ``params["label"]`` names
the ablation, the sparsity control and node masks.

The ranking score of an edge is its learned log α (one vector per fit: there are no per-example scores).
Example weights (``weights``: integer counts, e.g. one row of a circuitstat.stats ResamplingPlan) refit on a
resample: how the stability layer applies to a mask-learned circuit (bootstrap over prompts, a fresh seed
per refit).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from circuitstat.core.errors import InputError
from circuitstat.core.params import LR_CONSTANTS, PRUNING_INIT, PRUNING_LR, PRUNING_STEPS, SEED

from .ablation import Ablation, PairData, last_index
from .interventions import Intervention
from .model import CircuitModel
from .optimal_ablation import OptimalAblation, check_lr_constants, is_optimal

__all__ = ["EdgePruningFit", "NodeMasks", "OBJECTIVES", "fit_edge_pruning", "gates", "expected_l0", "masked_logits",
           "pruning_loss"]

BETA, GAMMA, ZETA = 2.0 / 3.0, -0.1, 1.1  # hard-concrete constants (Louizos et al. 2018; Bhaskar et al. 2024)
OBJECTIVES = ("mean_metric", "metric", "kl")


def gates(log_alpha: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
    """Hard-concrete gates in [0, 1]: stochastic with uniform noise ``u``, deterministic (u = 1/2) without."""
    logits = log_alpha if u is None else log_alpha + torch.log(u) - torch.log1p(-u)
    s = torch.sigmoid(logits / (1.0 if u is None else BETA))
    return torch.clamp(s * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


def expected_l0(log_alpha: torch.Tensor) -> torch.Tensor:
    """P(gate ≠ 0) per edge (Louizos et al. 2018, eq. 12): the expected share of edges kept."""
    return torch.sigmoid(log_alpha - BETA * math.log(-GAMMA / ZETA))


def _wide(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, or float64 when it already is (metrics never in a lower precision)."""
    return x if x.dtype == torch.float64 else x.float()


def masked_logits(model: CircuitModel, ids: torch.Tensor, attention_mask: torch.Tensor, cf: torch.Tensor,
                  keep: torch.Tensor) -> torch.Tensor:
    """Logits [B, V] at each row's read-out with edge e carrying the clean flow times ``keep[e]`` (or per row
    ``keep[b, e]``) and the counterfactual ``cf`` [B | 1, U, P | 1, D] times 1 − keep."""
    patch = 1.0 - keep.to(model.dtype)
    return model.run(ids, attention_mask, intervention=Intervention.edges(patch, cf),
                     logits_at=last_index(attention_mask)).logits


@dataclass
class _Batch:
    """One batch's inputs, counterfactual, clean and empty metric values and clean logits (all fixed)."""

    index: torch.Tensor
    ids: torch.Tensor
    mask: torch.Tensor
    cf: torch.Tensor
    clean_logits: torch.Tensor
    m_clean: torch.Tensor
    m_empty: torch.Tensor
    weight: torch.Tensor


@torch.no_grad()
def _batches(model, data: PairData, rows: np.ndarray, weights: np.ndarray, abl: Ablation, batch_size: int):
    """The fit's batches (rows of weight 0 left out: they add nothing to the loss or its gradient)."""
    out, dev = [], model.device
    live = rows[weights > 0]
    w_live = weights[weights > 0]
    all_senders = torch.ones(model.graph.n_senders, device=dev, dtype=model.dtype)
    for s in range(0, len(live), batch_size):
        index = torch.as_tensor(live[s:s + batch_size])
        ids, am = data.clean[index].to(dev), data.attention_mask[index].to(dev)
        last = last_index(am)
        cf = abl.senders(index).to(device=dev, dtype=model.dtype)
        clean = _wide(model.run(ids, am, logits_at=last).logits)
        empty = _wide(model.run(ids, am, intervention=Intervention.nodes(all_senders, cf), logits_at=last).logits)
        m_clean = _wide(data.score(clean, indices=index, clean_logits=clean))
        m_empty = _wide(data.score(empty, indices=index, clean_logits=clean))
        out.append(_Batch(index, ids, am, cf, clean, m_clean, m_empty,
                          torch.as_tensor(w_live[s:s + batch_size], dtype=m_clean.dtype, device=dev)))
    return out


def pruning_loss(model, data: PairData, batch: _Batch, keep: torch.Tensor, objective: str,
                 cf: torch.Tensor | None = None) -> torch.Tensor:
    """The batch's weighted sum over examples of m_n(masked) − m_n(clean) (``mean_metric``), its square
    (``metric``) or KL(clean ‖ masked) (``kl``) under gates ``keep`` (ablated edges carrying ``cf``, the
    learned optimal-ablation constants, instead of the batch's fixed counterfactual when given)."""
    logits = _wide(masked_logits(model, batch.ids, batch.mask, batch.cf if cf is None else cf, keep))
    if objective == "kl":
        logp = torch.log_softmax(batch.clean_logits, -1)
        per = (logp.exp() * (logp - torch.log_softmax(logits, -1))).sum(-1)
    else:
        gap = _wide(data.score(logits, indices=batch.index, clean_logits=batch.clean_logits)) - batch.m_clean
        per = gap if objective == "mean_metric" else gap ** 2
    return (batch.weight * per).sum()


def _scale(batches: list[_Batch], objective: str, total_w: float) -> float:
    """What the faithfulness term is divided by: the empty circuit's value of it (1 for KL)."""
    if objective == "kl":
        return 1.0
    gaps = [b.weight * (b.m_clean - b.m_empty) for b in batches]
    if objective == "mean_metric":
        scale = (float(sum(g.sum() for g in gaps)) / total_w) ** 2
    else:
        scale = float(sum((g * (b.m_clean - b.m_empty)).sum() for g, b in zip(gaps, batches))) / total_w
    if not scale > 0:
        raise InputError("the ablation leaves the metric unchanged (m(M) = m(∅)): there is no circuit to fit")
    return scale


def _faithfulness(model, data, batches, keep, objective: str, total_w: float, scale: float,
                  cf: torch.Tensor | None = None) -> torch.Tensor:
    """The scale-free faithfulness term of the loss on every batch (graphs kept until the one backward)."""
    total = sum(pruning_loss(model, data, b, keep, objective, cf) for b in batches) / total_w
    return (total ** 2 if objective == "mean_metric" else total) / scale


@dataclass
class EdgePruningFit:
    """One edge-pruning fit: ``log_alpha`` [E] (the ranking scores), its deterministic ``keep`` gates [E],
    the loss per step and the options it ran with."""

    log_alpha: np.ndarray
    keep: np.ndarray
    loss: np.ndarray
    params: dict = field(default_factory=dict)
    constants: np.ndarray | None = None  # [1, U, 1, D] the learned optimal-ablation constants (None otherwise)

    def circuit_mask(self) -> np.ndarray:
        """[E] bool: the edges whose deterministic gate is open (> 1/2)."""
        return self.keep > 0.5


def check_fit_options(steps: int, lr: float, sparsity: float, objective: str, batch_size: int) -> None:
    """None when a mask fit's common options are valid; InputError naming the bad one otherwise."""
    if objective not in OBJECTIVES:
        raise InputError(f"unknown objective {objective!r}; use one of {', '.join(OBJECTIVES)}")
    if not (isinstance(steps, int) and steps >= 1 and isinstance(batch_size, int) and batch_size >= 1):
        raise InputError(f"steps and batch_size must be positive integers, got {steps!r} and {batch_size!r}")
    if not (lr >= 0 and math.isfinite(lr)) or not (sparsity >= 0 and math.isfinite(sparsity)):
        raise InputError(f"lr must be non-negative and sparsity non-negative, got {lr!r} and {sparsity!r}")


def _rows_and_weights(n: int, rows, weights) -> tuple[np.ndarray, np.ndarray]:
    rows = np.arange(n) if rows is None else np.asarray(rows, dtype=np.int64)
    if rows.size == 0 or rows.min() < 0 or rows.max() >= n:
        raise InputError(f"rows must be a non-empty list of example indices in [0, {n})")
    w = np.ones(len(rows)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != rows.shape or (w < 0).any() or w.sum() <= 0:
        raise InputError(f"weights must be {len(rows)} non-negative counts, not all zero (one per row)")
    return rows, w


def fit_setup(model: CircuitModel, data: PairData, rows, weights, ablation: "str | Ablation", seed, objective: str,
              batch_size: int):
    """(rows, seed sequence, torch generator, ablation, weighted batches, total weight, objective scale): what
    every mask fit (edge pruning, UGS) prepares before its first step, checked."""
    rows, w = _rows_and_weights(int(data.clean.shape[0]), rows, weights)
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(int(seed))
    gen = torch.Generator().manual_seed(int(ss.generate_state(1)[0]))
    if is_optimal(ablation) and isinstance(ablation, str):
        abl = OptimalAblation(model, data, rows[w > 0], weights=w[w > 0], batch_size=batch_size)
    elif is_optimal(ablation):  # a prepared one (e.g. from_reference): this fit trains its own copy
        abl = ablation.fresh()
    else:
        abl = ablation if not isinstance(ablation, str) else Ablation(ablation, model, data, batch_size=batch_size)
    batches = _batches(model, data, rows, w, abl, batch_size)
    total_w = float(sum(b.weight.sum() for b in batches))
    return rows, ss, gen, abl, batches, total_w, _scale(batches, objective, total_w)


class TargetSparsity:
    """Bhaskar et al.'s target-sparsity Lagrangian λ₁ (s − t) + λ₂ (s − t)², s the expected share of edges removed,
    t the target warmed up linearly from 0 over ``warmup`` steps then held; the multipliers λ start at 0 and are
    trained by gradient *ascent* (Adam, maximize) with learning rate ``lr``: princeton-nlp/Edge-Pruning (its
    trainers' ``get_current_target_sparsity``, ``--start_edge_sparsity 0 --warmup_type linear``; the CoFi-style
    Lagrangian with its regularisation learning rate)."""

    def __init__(self, target: float, warmup: int, lr: float) -> None:
        self.target, self.warmup = float(target), int(warmup)
        self.lambdas = torch.zeros(2, dtype=torch.float64, requires_grad=True)
        self.opt = torch.optim.Adam([self.lambdas], lr=lr, maximize=True)

    def target_at(self, step: int) -> float:
        """The warmed-up target at ``step`` (0-based)."""
        return self.target if step >= self.warmup else self.target * step / self.warmup

    def term(self, step: int, sparsity: torch.Tensor) -> torch.Tensor:
        """λ₁ (s − t) + λ₂ (s − t)² at ``step`` for expected sparsity ``sparsity``."""
        gap = sparsity.double() - self.target_at(step)
        return self.lambdas[0] * gap + self.lambdas[1] * gap ** 2


def check_target(target, warmup, steps: int, lr_lambda) -> None:
    """InputError unless the target sparsity is in [0, 1), the warm-up in [0, steps] and the multipliers' rate
    positive."""
    if target is None:
        if warmup is not None or lr_lambda is not None:
            raise InputError("warmup and lr_lambda belong to the target-sparsity Lagrangian: give target too")
        return
    if not (isinstance(target, (int, float)) and 0 <= target < 1):
        raise InputError(f"target (the share of edges to remove) must be in [0, 1), got {target!r}")
    if warmup is not None and not (isinstance(warmup, int) and 0 <= warmup <= steps):
        raise InputError(f"warmup must be an integer number of steps in [0, steps={steps}], got {warmup!r}")
    if lr_lambda is not None and not (math.isfinite(lr_lambda) and lr_lambda > 0):
        raise InputError(f"lr_lambda must be a positive learning rate, got {lr_lambda!r}")


def resolve_sparsity(sparsity, target) -> float:
    """The fixed penalty's weight: as given, else 1.0 without a target and 0 with one (Bhaskar et al.'s loss has
    only the Lagrangian)."""
    return float(sparsity) if sparsity is not None else (1.0 if target is None else 0.0)


def ablation_label(abl) -> str:
    """What ablated edges carry, for a fit's label: 'optimal ablation' or '<kind> ablation'."""
    if is_optimal(abl):  # post-norm heads: constants in d_model, not the source's d_head (a deviation, named)
        return "optimal ablation" + ("" if abl.heads is not None else " (head constants in d_model)")
    return f"{getattr(abl, 'kind', 'custom')} ablation"


def constants_optimizer(abl, lr_constants: float):
    """(a function giving the live constants [1, U, 1, D] (differentiable, recomputed every step), their
    optimiser) of an optimal ablation; (a function giving None, None) for a fixed counterfactual."""
    if not is_optimal(abl):
        return (lambda: None), None
    return abl.current, abl.optimizer(lr_constants)


class NodeMasks:
    """Bhaskar et al.'s node masks: one hard-concrete gate z_u per sender (their writer masks,
    princeton-nlp/Edge-Pruning ``attn_write_log_alphas``, ``mlp_write_log_alphas``, ``token_write_log_alpha``)
    that multiplies every edge leaving u: the sender writes z_u x_u + (1 − z_u) x̃_u and each reader gates that
    by z_e, so edge e = u → v carries z_e z_u of the clean flow.  Their noise comes from the fit's seed's child 1
    (its own stream: the edge gates' noise is the same with and without node masks)."""

    def __init__(self, graph, init: float, ss: np.random.SeedSequence) -> None:
        self.log_alpha = torch.full((graph.n_senders,), float(init), dtype=torch.float32, requires_grad=True)
        self.edge_sender = torch.as_tensor(np.asarray(graph.edge_sender), dtype=torch.long)
        # child 1 of the fit's seed, made without spawning (the fit's own seed sequence stays untouched)
        child = np.random.SeedSequence(ss.entropy, spawn_key=tuple(ss.spawn_key) + (1,))
        self.gen = torch.Generator().manual_seed(int(child.generate_state(1)[0]))

    def edge_gates(self, stochastic: bool) -> torch.Tensor:
        """Each edge's sender gate [E] (stochastic: fresh uniform noise per sender from the masks' stream)."""
        u = torch.rand(len(self.log_alpha), generator=self.gen).clamp(1e-6, 1 - 1e-6) if stochastic else None
        return gates(self.log_alpha, u)[self.edge_sender]

    def l0(self) -> torch.Tensor:
        """Expected share of senders kept, mean_u P(z_u ≠ 0)."""
        return expected_l0(self.log_alpha).mean()


def check_node_options(node_masks: bool, node_sparsity: float, node_init: float | None = None,
                       node_target: float | None = None) -> None:
    """InputError unless node_masks is a bool, node_sparsity a finite non-negative weight, node_init finite and
    node_target (which needs node masks) in [0, 1)."""
    if not isinstance(node_masks, bool):
        raise InputError(f"node_masks must be true or false, got {node_masks!r}")
    if node_target is not None:
        if not node_masks:
            raise InputError("node_target is the node gates' target sparsity: give node_masks too")
        if not (isinstance(node_target, (int, float)) and 0 <= node_target < 1):
            raise InputError(f"node_target (the share of nodes to remove) must be in [0, 1), got {node_target!r}")
    if node_init is not None and not (isinstance(node_init, (int, float)) and math.isfinite(node_init)):
        raise InputError(f"node_init must be a finite logit, got {node_init!r}")
    if not (isinstance(node_sparsity, (int, float)) and math.isfinite(node_sparsity) and node_sparsity >= 0):
        raise InputError(f"node_sparsity must be a finite non-negative weight, got {node_sparsity!r}")


def nodes_init(init: float, node_init: float | None) -> float:
    """The node logits' starting value: ``node_init``, else the edges' ``init``."""
    return init if node_init is None else node_init


def _ep_label(abl, target, nodes: "NodeMasks | None" = None, node_target: float | None = None) -> str:
    how = "fixed sparsity penalty" if target is None else f"target sparsity {target:g} (Lagrangian)"
    node = "" if nodes is None else ", node masks" + ("" if node_target is None else f" (target {node_target:g})")
    return f"edge pruning, {ablation_label(abl)}, {how}{node}"


def _final_logits(log_alpha: torch.Tensor, nodes: "NodeMasks | None") -> torch.Tensor:
    """The ranking logits [E]: log α_e, or with node masks min(log α_e, log α_u) (an edge ranks no higher than
    its sender's gate, and its deterministic gate is open only where both are)."""
    la = log_alpha.detach()
    return la if nodes is None else torch.minimum(la, nodes.log_alpha.detach()[nodes.edge_sender])


def fit_edge_pruning(model: CircuitModel, data: PairData, *, rows=None, weights=None,
                     steps: int = PRUNING_STEPS.default, lr: float = PRUNING_LR.default,
                     sparsity: float | None = None, init: float = PRUNING_INIT.default,
                     objective: str = "mean_metric", ablation: "str | Ablation" = "counterfactual",
                     seed: int | np.random.SeedSequence = SEED.default, batch_size: int = 64, stochastic: bool = True,
                     target: float | None = None, warmup: int | None = None, lr_lambda: float | None = None,
                     lr_constants: float = LR_CONSTANTS.default, node_masks: bool = False,
                     node_sparsity: float | None = None, node_init: float | None = None,
                     node_target: float | None = None) -> EdgePruningFit:
    """The EdgePruningFit of ``steps`` Adam steps on ``data``'s examples ``rows`` (all by default), each
    weighted by ``weights`` (counts; a bootstrap resample is one row of a ResamplingPlan's counts); with
    ``target`` the sparsity is driven to it by Bhaskar et al.'s Lagrangian (TargetSparsity); with ``ablation=
    "optimal"`` the ablated edges carry learned constants (circuitstat.circuits.optimal_ablation); with
    ``node_masks`` every sender also gets a gate on all its outgoing edges (NodeMasks), penalised by
    ``node_sparsity`` · mean_u P(z_u ≠ 0) (default 1, 0 with ``node_target``) and, with ``node_target``, driven to
    that node sparsity by the second Lagrangian; their logits start at ``node_init`` (default ``init``)."""
    sparsity = resolve_sparsity(sparsity, target)
    node_sparsity = resolve_sparsity(node_sparsity, node_target)
    check_node_options(node_masks, node_sparsity, node_init, node_target)
    check_fit_options(steps, lr, sparsity, objective, batch_size)
    check_target(target, warmup, steps, lr_lambda)
    check_lr_constants(lr_constants)
    t0 = time.perf_counter()
    rows, ss, gen, abl, batches, total_w, scale = fit_setup(model, data, rows, weights, ablation, seed, objective,
                                                            batch_size)
    E = model.graph.n_edges
    log_alpha = torch.full((E,), float(init), dtype=torch.float32, requires_grad=True)
    nodes = NodeMasks(model.graph, nodes_init(init, node_init), ss) if node_masks else None
    opt = torch.optim.Adam([log_alpha] + ([nodes.log_alpha] if nodes is not None else []), lr=lr)
    warmup = steps // 2 if warmup is None and target is not None else warmup
    lr_lambda = lr if lr_lambda is None else lr_lambda
    lag = None if target is None else TargetSparsity(target, warmup, lr_lambda)
    # the node target warms up over the edges' warm-up (half the steps by default), as the paper's trainer does
    node_lag = None if node_target is None else TargetSparsity(node_target, steps // 2 if warmup is None else warmup,
                                                               lr_lambda)
    cf, opt_c = constants_optimizer(abl, lr_constants)
    losses = np.empty(steps)
    optimisers = [o for o in (opt, opt_c, lag and lag.opt, node_lag and node_lag.opt) if o is not None]
    for step in range(steps):
        for o in optimisers:
            o.zero_grad()
        u = torch.rand(E, generator=gen).clamp(1e-6, 1 - 1e-6) if stochastic else None
        keep = gates(log_alpha, u) if nodes is None else gates(log_alpha, u) * nodes.edge_gates(stochastic)
        l0 = expected_l0(log_alpha).mean()
        loss = _faithfulness(model, data, batches, keep.to(model.device), objective, total_w, scale, cf()).cpu() \
            + sparsity * l0
        if nodes is not None:
            loss = loss + node_sparsity * nodes.l0()
        if lag is not None:
            loss = loss + lag.term(step, 1.0 - l0)
        if node_lag is not None:
            loss = loss + node_lag.term(step, 1.0 - nodes.l0())
        loss.backward()
        for o in optimisers:
            o.step()
        losses[step] = float(loss.detach())
    la = _final_logits(log_alpha, nodes)
    keep = gates(la)
    params = {"method": "edge-pruning", "label": _ep_label(abl, target, nodes, node_target), "steps": steps, "lr": lr,
              "sparsity": sparsity, "init": init, "objective": objective, "stochastic": stochastic,
              "batch_size": batch_size, "n_examples": int(len(rows)),
              "weights": "given" if weights is not None else "uniform", "ablation": getattr(abl, "kind", "custom"),
              "seed_entropy": str(ss.entropy), "seed_spawn_key": list(ss.spawn_key),
              "seconds": time.perf_counter() - t0, "gates": "hard-concrete (beta 2/3, gamma -0.1, zeta 1.1)",
              "target": target, "warmup": warmup, "reached_sparsity": float((keep <= 0.5).double().mean()),
              "expected_sparsity": float(1.0 - expected_l0(la).double().mean()),
              "lambdas": None if lag is None else lag.lambdas.detach().tolist()}
    if is_optimal(abl):
        params.update(abl.describe(), lr_constants=lr_constants)
    if nodes is not None:
        params.update(node_masks=True, node_sparsity=float(node_sparsity), node_init=float(nodes_init(init, node_init)),
                      node_log_alpha=nodes.log_alpha.detach().tolist(),
                      expected_node_sparsity=float(1.0 - nodes.l0().detach()), node_target=node_target,
                      reached_node_sparsity=float((gates(nodes.log_alpha.detach()) <= 0.5).double().mean()),
                      node_lambdas=None if node_lag is None else node_lag.lambdas.detach().tolist())
    return EdgePruningFit(la.numpy().copy(), keep.numpy().copy(), losses, params,
                          abl.constants.cpu().numpy().copy() if is_optimal(abl) else None)
