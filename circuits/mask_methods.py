"""The mask-learned methods by name: edge pruning (circuitstat.circuits.edge_pruning) and UGS
(circuitstat.circuits.ugs), one fit contract (an EdgePruningFit: logits ranked signed, deterministic gates, the
loss per step) so that every caller (attribute, the audit's masks stage and refits, the ground-truth study) treats
them alike."""

from __future__ import annotations

import numpy as np
import torch

from .edge_pruning import EdgePruningFit
from .methods import MASK_METHODS, runner

__all__ = ["MASK_FITS", "fit_mask", "mask_gates"]

#: method name -> (its fit function, its deterministic gates of the logits), from the methods' records
MASK_FITS = {name: (runner(name, 0), runner(name, 1)) for name in MASK_METHODS}


def fit_mask(method: str, model, data, **options) -> EdgePruningFit:
    """The fit of mask-learned ``method`` (its fit function's keyword arguments as ``options``)."""
    return MASK_FITS[method][0](model, data, **options)


def mask_gates(method: str, log_alpha: np.ndarray) -> np.ndarray:
    """The deterministic gates of ``method``'s logits [..., E] (a circuit keeps the edges whose gate is > 1/2)."""
    return MASK_FITS[method][1](torch.as_tensor(log_alpha)).numpy()
