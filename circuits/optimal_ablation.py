"""Optimal ablation (Li & Janson 2024, "Optimal ablation for interpretability", NeurIPS, arXiv:2409.09951): an
ablated component's output is replaced by a learned constant, fitted to make the ablated model as faithful as a
constant can, instead of a counterfactual prompt's output.

Source of the definition: Li & Janson's implementation, github.com/maxtli/optimalablation (``ablation_type ==
"oa"`` in ``edge_pruning_unif_dynamic.py``: the constants ``modal_attention`` [layers, heads, d_model] and
``modal_mlp`` [layers, d_model], one vector per component shared by every prompt and position, initialised at
the component's mean output (``init_modes``) and trained jointly with the mask by their own AdamW, learning rate
``lr_modes`` = 1e-3 in ``utils/MaskConfig.py``, weight decay 0).  Written anew here.

In circuitstat a component is a sender node (input, each head, each MLP): its constant c_u [d_model] is what every
ablated edge u → v carries instead of z_u (the masked model of circuitstat.circuits.edge_pruning with the
counterfactual tensor [1, U, 1, D] = the constants).  The constants start at the mean clean output of each sender
over the fit's prompts (real tokens, all positions: ``mean`` ablation on the fit's own prompts) and are trained by
Adam (betas 0.9, 0.999, weight decay 0) on the same loss as the mask, one step of each per step of the fit.  The
objective's scale (its value with every edge ablated) is fixed at the initial constants.

Closed form (tested): for a model whose metric is linear in the ablated senders' outputs at the read-out, the
``metric`` objective's optimum solves the weighted normal equations Σ_n w_n d_n d_nᵀ c = Σ_n w_n d_n d_nᵀ z_n(last)
(d_n the metric's gradient in the sender's output); for one answer direction d it is d·c = the weighted mean of
d·z_n: the constant is the mean of the component's output where the read-out sees it.
"""

from __future__ import annotations

import numpy as np
import torch

from circuitstat.core.errors import InputError

from .ablation import sender_means
from .model import CircuitModel

__all__ = ["OPTIMAL", "OptimalAblation", "is_optimal"]

OPTIMAL = "optimal"


def is_optimal(ablation) -> bool:
    """Whether ``ablation`` (a name or an ablation object) asks for learned optimal-ablation constants."""
    return (ablation == OPTIMAL) if isinstance(ablation, str) else isinstance(ablation, OptimalAblation)


class _Rows:
    """The clean prompts of ``rows`` of a dataset (what sender_means reads)."""

    def __init__(self, data, rows: np.ndarray) -> None:
        index = torch.as_tensor(np.asarray(rows))
        self.clean = data.clean[index]
        self.attention_mask = data.attention_mask[index]


class OptimalAblation:
    """Learned constants [1, U, 1, D] (one per sender) that ablated edges carry; ``senders`` gives their
    current value (the masked model's counterfactual), ``constants`` the trainable tensor itself."""

    kind = OPTIMAL

    def __init__(self, model: CircuitModel, data, rows: np.ndarray, *, batch_size: int = 32,
                 input_node: str = "embeddings") -> None:
        if input_node != "embeddings":
            raise InputError("optimal ablation learns one constant for the whole input embedding; use "
                             "input_node: embeddings with ablation: optimal")
        init = sender_means(model, _Rows(data, rows), positional=False, batch_size=batch_size)
        self.initial = init.detach().clone()
        self.constants = init.detach().clone().requires_grad_(True)
        self.input_node = input_node

    def senders(self, index: torch.Tensor) -> torch.Tensor:
        """The constants (detached) [1, U, 1, D], the same for every example ``index``."""
        return self.constants.detach()

    def optimizer(self, lr: float) -> torch.optim.Optimizer:
        """Adam on the constants (Li & Janson's AdamW with weight decay 0)."""
        return torch.optim.Adam([self.constants], lr=lr)

    def describe(self) -> dict:
        """Provenance of the constants: their kind and how far training moved them from the mean."""
        moved = float((self.constants.detach() - self.initial).norm() / self.initial.norm().clamp_min(1e-30))
        return {"ablation": OPTIMAL, "input_node": self.input_node, "constants_init": "mean over the fit's prompts",
                "constants_relative_change": moved}


def check_lr_constants(lr_constants: float) -> None:
    """InputError unless ``lr_constants`` is a finite non-negative learning rate."""
    if not (isinstance(lr_constants, (int, float)) and np.isfinite(lr_constants) and lr_constants >= 0):
        raise InputError(f"lr_constants must be a finite non-negative learning rate, got {lr_constants!r}")
