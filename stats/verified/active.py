"""Active verification: exact (prompt, edge) cells sampled with probabilities from the approximation, weighted back.

Zrnic & Candès 2024, "Active statistical inference" (arXiv 2403.03208): label unit i with probability π_i chosen
from the predictions (Poisson sampling, ξ_i ~ Bernoulli(π_i) independently), and estimate the mean by

    θ̂ = (1/N) Σ_i [ λ Ŷ_i + (Y_i − λ Ŷ_i) ξ_i / π_i ],

unbiased for the mean of Y over the N prompts for any λ fixed in advance, since E[ξ_i / π_i] = 1 (Horvitz–Thompson).
Its SE is the SD of the N summands over √N (the summands are i.i.d. when the prompts are); the optimal π_i is
proportional to the size of the residual |Y_i − λ Ŷ_i|, which phase 1 can only predict. Here, per edge:

* the prediction of the residual's size is |Ŷ_i − mean(Ŷ)| + c · SD(Ŷ) (large approximations carry large errors on
  heavy-tailed edges; c keeps every prompt's prediction positive);
* π mixes it with the uniform design: π_i = B [(1 − mix) / N + mix · u_i / Σ u], capped at 1 with the excess
  redistributed over the others (B = the expected number of exact cells per edge); the uniform half is the
  paper's defensive mixture, so no prompt's weight 1/π exceeds N / ((1 − mix) B);
* λ is the Horvitz–Thompson-weighted regression slope of Y on Ŷ over the sampled cells, clipped to [0, 1] (the
  paper's plug-in tuning; fitted on the sampled cells, so θ̂ is not exactly unbiased, as in ppi.py;
  ``active_crossfit`` fits each fold's λ on the other fold's cells, exactly unbiased: the p-values' estimate);
* the interval uses Student-t quantiles with (sampled cells − 2) degrees of freedom (as ppi.py's n − 2: λ is
  fitted), the paper's normal quantile being too narrow at tens of cells per edge.

This module computes the design and the estimate; which cells phase 2 computes is the caller's
(circuitstat.circuits.verify.exact_cells computes chosen cells; circuitstat.pipelines.verify.active_tables runs the
design in an audit). Measured in docs/verified.md ("Active verification").
"""

from __future__ import annotations

import numpy as np
from scipy import special

from circuitstat.core.errors import InputError

__all__ = ["ACTIVE_MIX", "ACTIVE_FLOOR", "active_probabilities", "active_sample", "active_means", "ht_weights",
           "ht_slope", "active_crossfit", "check_active_inputs"]

#: share of the budget spent by the residual prediction (the rest is uniform: the defensive mixture)
ACTIVE_MIX = 0.5
#: c in the residual-size prediction |Ŷ − mean Ŷ| + c · SD(Ŷ)
ACTIVE_FLOOR = 0.1


def active_probabilities(approx: np.ndarray, budget: float, *, mix: float = ACTIVE_MIX,
                         floor: float = ACTIVE_FLOOR) -> np.ndarray:
    """Return π [N, E]: each cell's probability of exact patching, summing to ``budget`` per edge (module docstring)."""
    A = np.asarray(approx, np.float64)
    if A.ndim != 2 or A.shape[0] < 2:
        raise InputError(f"approximation must be [N, E] with N >= 2 prompts, got shape {A.shape}")
    N = A.shape[0]
    if not 0 < budget <= N:
        raise InputError(f"budget {budget!r} must be in (0, N = {N}]: the expected exact cells per edge")
    if not 0 <= mix < 1:
        raise InputError(f"mix {mix!r} must be in [0, 1): a uniform share of 1 - mix keeps every weight bounded")
    u = np.abs(A - A.mean(0)) + floor * A.std(0)
    u = np.where(u.sum(0) > 0, u, 1.0)  # a constant approximation predicts nothing: uniform
    p = budget * ((1 - mix) / N + mix * u / u.sum(0))
    for _ in range(N):  # cap at 1 and hand the excess to the uncapped cells in proportion
        if not (p > 1).any():
            break
        p = np.minimum(p, 1.0)
        free = p < 1
        short = budget - p.sum(0)
        p = np.where(free, p * (1 + short / np.maximum((p * free).sum(0), 1e-300)), p)
    return np.minimum(p, 1.0)


def active_sample(probs: np.ndarray, seed: int | np.random.SeedSequence) -> np.ndarray:
    """Return the Poisson sample [N, E] (True: patch this cell exactly), each cell drawn independently with its π."""
    return np.random.default_rng(seed).random(np.shape(probs)) < probs


def ht_weights(sampled: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Return the Horvitz–Thompson weights [N, E]: 1/π on the sampled cells, 0 elsewhere."""
    S = np.asarray(sampled, bool)
    return np.where(S, 1.0 / np.where(S, np.asarray(probs, np.float64), 1.0), 0.0)


def ht_slope(A: np.ndarray, Y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Return λ per edge: the w-weighted least-squares slope of Y on A over the cells with w > 0, clipped to [0, 1]."""
    W = np.maximum(w.sum(0), 1e-300)
    ma, my = (w * A).sum(0) / W, (w * Y).sum(0) / W
    var = (w * (A - ma) ** 2).sum(0) / W
    cov = (w * (A - ma) * (Y - my)).sum(0) / W
    return np.clip(np.where(var > 0, cov / np.where(var > 0, var, 1.0), 0.0), 0.0, 1.0)


def check_active_inputs(approx: np.ndarray, exact: np.ndarray, sampled: np.ndarray, probs: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return (A, Y, S, P) as float64/bool [N, E], Y zero off the sampled cells; InputError naming a bad input."""
    A, S, P = np.asarray(approx, np.float64), np.asarray(sampled, bool), np.asarray(probs, np.float64)
    if not (A.shape == S.shape == P.shape == np.shape(exact)):
        raise InputError(f"approx, exact, sampled and probs must share one shape [N, E]; got {A.shape}, "
                         f"{np.shape(exact)}, {S.shape}, {P.shape}")
    if np.any(S & ~(P > 0)):
        raise InputError("a sampled cell has probability 0; its weight 1/π is undefined (draw with active_sample)")
    Y = np.where(S, np.asarray(exact, np.float64), 0.0)
    if not np.isfinite(Y).all():
        raise InputError("a sampled cell's exact score is not finite")
    return A, Y, S, P


def active_means(approx: np.ndarray, exact: np.ndarray, sampled: np.ndarray, probs: np.ndarray,
                 confidence_level: float = 0.95) -> dict[str, np.ndarray]:
    """Return {estimate, low, high, se, lam, cells} per edge; ``exact`` is read only where ``sampled`` (NaN elsewhere is fine)."""
    A, Y, S, P = check_active_inputs(approx, exact, sampled, probs)
    N = A.shape[0]
    w = ht_weights(S, P)
    lam = ht_slope(A, Y, w)
    z = lam * A + w * (Y - lam * A)
    est, se = z.mean(0), z.std(0, ddof=1) / np.sqrt(N)
    cells = S.sum(0)
    with np.errstate(invalid="ignore"):
        q = np.where(cells > 2, special.stdtrit(np.maximum(cells - 2, 1), 0.5 + confidence_level / 2), np.inf)
    with np.errstate(invalid="ignore"):  # 2 cells or fewer: unbounded, even where se is 0 (inf * 0 would be NaN)
        half = np.where(cells > 2, q * se, np.inf)
    return {"estimate": est, "low": est - half, "high": est + half, "se": se, "lam": lam, "cells": cells}


def active_crossfit(approx: np.ndarray, exact: np.ndarray, sampled: np.ndarray, probs: np.ndarray
                    ) -> dict[str, np.ndarray]:
    """Return {estimate, se, lam} per edge with 2-fold cross-fitted λ (``lam`` [2, E]: the λ applied to each fold).

    Prompt i is in fold i mod 2; the cells of fold k are weighted back with λ fitted (``ht_slope``) on the sampled
    cells of the other fold only. Given the N prompts, λ for fold k is then independent of fold k's draws ξ, so
    E[λ A_i + ξ_i/π_i (Y_i − λ A_i) | λ] = Y_i and the estimate is exactly unbiased for the mean of Y over the N
    prompts (the cross-fitting of Chernozhukov et al. 2018, "Double/debiased machine learning"; Zrnic & Candès
    2024, arXiv 2403.03208, fit their active design's predictor the same way). The in-sample λ of ``active_means``
    moves with the draws it weights (a cell drawn with a large residual pulls λ toward itself), so its estimate
    is not. The cost: λ from about half the cells, a noisier λ (docs/verified.md measures it). The SE is the SD of
    the N summands over √N, as in ``active_means``.
    """
    A, Y, S, P = check_active_inputs(approx, exact, sampled, probs)
    N = A.shape[0]
    w = ht_weights(S, P)
    fold = (np.arange(N) % 2)[:, None]
    lam = np.stack([ht_slope(A, Y, np.where(fold != k, w, 0.0)) for k in (0, 1)])  # λ applied to fold k
    lam_cell = np.where(fold == 0, lam[0], lam[1])
    z = lam_cell * A + w * (Y - lam_cell * A)
    return {"estimate": z.mean(0), "se": z.std(0, ddof=1) / np.sqrt(N), "lam": lam}
