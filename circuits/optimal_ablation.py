"""Optimal ablation (Li & Janson 2024, "Optimal ablation for interpretability", NeurIPS, arXiv:2409.09951): an
ablated component's output is replaced by a learned constant, fitted to make the ablated model as faithful as a
constant can, instead of a counterfactual prompt's output.

Source of the definition: Li & Janson's implementation, github.com/maxtli/optimalablation (``ablation_type ==
"oa"`` in ``edge_pruning_unif.py``, ``pruners/Pruner.py``, ``pruners/EdgePruner.py``): the constants
``modal_attention`` [layers, heads, d_head] (a value of each head's ``hook_z``, written through W_O) and
``modal_mlp`` [layers + 1, d_model] (the embedding and each MLP), one vector per component shared by every prompt
and position, initialised at the component's mean (``init_modes``, from means computed once by
``compute_means.py``) and trained jointly with the mask from the first step by their own AdamW, weight decay 0,
learning rate ``lr_modes`` (1e-3 in earlier commits of ``utils/MaskConfig.py``, 2e-3 at ac02e85), for 6,000
batches of 5 prompts (3,000 for the other ablations).  Written anew here.

In circuitstat a component is a sender node (input, each head, each MLP): its constant c_u [d_model] is what every
ablated edge u → v carries instead of z_u (the masked model of circuitstat.circuits.edge_pruning with the
counterfactual tensor [1, U, 1, D] = the constants).  A head's constant is the source's: its starting mean plus
δ_h W_O[h], δ_h trained in the head's d_head units (head_directions; only where a post-norm makes the head's write
non-linear in z is it free in d_model, and ``constants_space`` says so).  The constants start at the mean clean
output of each sender over the fit's prompts, weighted as the loss weights them (real tokens, all positions:
``mean`` ablation on the fit's own prompts; the source's means come from a separate pass over the task) and are
trained by Adam (betas 0.9, 0.999, weight decay 0) on the same loss as the mask, one step of each per step of the
fit (the source's schedule: jointly from the first step).  The objective's scale (its value with every edge
ablated) is fixed at the initial constants.  Deviations, stated: full-batch steps, and the fit's own step count
(50 by default against the source's 6,000).

Closed form (tested): for a model whose metric is linear in the ablated senders' outputs at the read-out, the
``metric`` objective's optimum solves the weighted normal equations Σ_n w_n d_n d_nᵀ c = Σ_n w_n d_n d_nᵀ z_n(last)
(d_n the metric's gradient in the sender's output); for one answer direction d it is d·c = the weighted mean of
d·z_n: the constant is the mean of the component's output where the read-out sees it.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from circuitstat.core.errors import InputError

from .ablation import sender_means
from .model import CircuitModel

__all__ = ["OPTIMAL", "OptimalAblation", "PromptRows", "head_directions", "is_optimal"]

OPTIMAL = "optimal"


def is_optimal(ablation) -> bool:
    """Whether ``ablation`` (a name or an ablation object) asks for learned optimal-ablation constants."""
    return (ablation == OPTIMAL) if isinstance(ablation, str) else isinstance(ablation, OptimalAblation)


class PromptRows:
    """The clean prompts of ``rows`` of a dataset (what sender_means reads)."""

    def __init__(self, data, rows: np.ndarray) -> None:
        index = torch.as_tensor(np.asarray(rows))
        self.clean = data.clean[index]
        self.attention_mask = data.attention_mask[index]


def head_directions(model: CircuitModel) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(sender indices of the heads [H_all], their W_O [H_all, d_head, D]): a head's output is z_h W_O[h], so its
    constant is a value z of the head's own d_head space (Li & Janson's ``modal_attention`` on ``hook_z``); None
    where a post-norm makes a head's write non-linear in z (its constant then lives in d_model, labelled)."""
    if model.cfg.post_norm:
        return None
    g = model.graph
    index = [g.head_sender(layer, h) for layer in range(g.n_layers) for h in range(g.n_heads)]
    W = torch.cat([blk.W_O.detach() for blk in model.blocks], dim=0)
    return torch.as_tensor(index, dtype=torch.long, device=W.device), W


class OptimalAblation:
    """Learned constants [1, U, 1, D] (one per sender) that ablated edges carry: ``current()`` is their value (a
    differentiable function of the trainable ``parameters()``), ``senders`` the detached value.

    A head's constant is its starting mean plus δ_h W_O[h], δ_h in the head's d_head space (the source's constant
    on ``hook_z``, trained by Adam in those units); the input's and every MLP's constant is free in d_model (the
    source's ``modal_mlp``).  With a post-norm (no linear z → output map) heads are free in d_model too and
    ``space`` says so."""

    kind = OPTIMAL

    def __init__(self, model: CircuitModel, data, rows: np.ndarray, *, weights: np.ndarray | None = None,
                 batch_size: int = 32, input_node: str = "embeddings") -> None:
        if input_node != "embeddings":
            raise InputError("optimal ablation learns one constant for the whole input embedding; use "
                             "input_node: embeddings with ablation: optimal")
        # the starting means weight each prompt as the fit's loss does (a bootstrap refit's counts)
        init = sender_means(model, PromptRows(data, rows), positional=False, batch_size=batch_size,
                            row_weights=weights)
        self.initial = init.detach().clone()
        self.input_node = input_node
        self.heads = head_directions(model)
        free = torch.ones(1, init.shape[1], 1, 1, dtype=init.dtype, device=init.device)
        if self.heads is not None:
            free[0, self.heads[0]] = 0.0
            self.delta = torch.zeros(len(self.heads[0]), self.heads[1].shape[1], dtype=init.dtype,
                                     device=init.device, requires_grad=True)
        self.free = free  # 1 where the offset is a free d_model vector, 0 on heads moved through W_O
        self.offset = torch.zeros_like(init).requires_grad_(True)
        self.space = ("heads in d_head (through W_O), input and MLPs in d_model" if self.heads is not None
                      else "every sender in d_model (post-norm heads: deviation from the source's d_head)")
        self.init_from = "mean over the fit's prompts (weighted as the loss)"

    @classmethod
    def from_reference(cls, model: CircuitModel, reference, *, batch_size: int = 32) -> "OptimalAblation":
        """An OptimalAblation whose constants start at the mean outputs over every prompt of ``reference`` (the
        source's procedure: means from a separate pass over the task, the same start for every fit and refit)."""
        n = int(reference.clean.shape[0])
        out = cls(model, reference, np.arange(n), batch_size=batch_size)
        out.init_from = f"mean over a reference dataset of {n} prompts"
        return out

    def fresh(self) -> "OptimalAblation":
        """A copy at the starting constants with its own trainable parameters (each fit trains its own: a prepared
        OptimalAblation passed to several fits is never trained in place)."""
        new = copy.copy(self)
        new.offset = torch.zeros_like(self.initial).requires_grad_(True)
        if self.heads is not None:
            new.delta = torch.zeros_like(self.delta).requires_grad_(True)
        return new

    def parameters(self) -> list[torch.Tensor]:
        """The trainable tensors: the free d_model offsets and, where heads move through W_O, their δ."""
        return [self.offset] + ([self.delta] if self.heads is not None else [])

    def current(self) -> torch.Tensor:
        """The constants [1, U, 1, D] now, differentiable in the parameters."""
        c = self.initial + self.offset * self.free
        if self.heads is None:
            return c
        index, W = self.heads
        moved = torch.einsum("he,hed->hd", self.delta, W.to(self.delta.dtype))  # δ_h W_O[h]
        return c.index_add(1, index, moved[None, :, None, :])

    @property
    def constants(self) -> torch.Tensor:
        """The constants (detached) [1, U, 1, D]."""
        return self.current().detach()

    def senders(self, index: torch.Tensor) -> torch.Tensor:
        """The constants (detached) [1, U, 1, D], the same for every example ``index``."""
        return self.constants

    def optimizer(self, lr: float) -> torch.optim.Optimizer:
        """Adam on the parameters (Li & Janson's AdamW with weight decay 0)."""
        return torch.optim.Adam(self.parameters(), lr=lr)

    def describe(self) -> dict:
        """Provenance of the constants: their kind, space and how far training moved them from the mean."""
        moved = float((self.constants - self.initial).norm() / self.initial.norm().clamp_min(1e-30))
        return {"ablation": OPTIMAL, "input_node": self.input_node,
                "constants_init": self.init_from,
                "constants_space": self.space, "constants_relative_change": moved}


def check_lr_constants(lr_constants: float) -> None:
    """InputError unless ``lr_constants`` is a finite non-negative learning rate."""
    if not (isinstance(lr_constants, (int, float)) and np.isfinite(lr_constants) and lr_constants >= 0):
        raise InputError(f"lr_constants must be a finite non-negative learning rate, got {lr_constants!r}")
