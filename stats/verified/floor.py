"""The variance floor of a verified run: how narrow any PPI++ interval can get against exact on all N prompts.

With λ fixed, the PPI++ estimate λ · mean_U(Ŷ) + mean_L(Y − λŶ) has variance λ² σ_Ŷ² / N_u + Var(Y − λŶ) / n
(n labelled, N_u = N − n unlabelled prompts; Angelopoulos, Duchi & Zrnic 2023, arXiv 2311.01453, §2). Its
minimum over λ (the oracle weight σ_YŶ / (σ_Ŷ² (1 + n / N_u)), which a tuned λ̂ can only approach) is

    σ_Y² / n · (1 − ρ² / (1 + n / N_u)),        ρ = corr(Y, Ŷ) per prompt,

against σ_Y² / N for exact patching on all N prompts. The ratio of standard deviations,

    sqrt(N / n · (1 − ρ² / (1 + n / N_u))),

is a lower bound on the width ratio any PPI estimator with this approximation as its predictor reaches with
intervals of the same quantile (a t quantile at about n − 2 df adds its own factor). It depends on the
population only through the per-prompt correlation ρ of each edge.
"""

from __future__ import annotations

import numpy as np

from circuitstat.core.errors import InputError

__all__ = ["per_prompt_correlation", "multiple_correlation", "width_floor"]


def per_prompt_correlation(exact: np.ndarray, approx: np.ndarray) -> np.ndarray:
    """Return the per-edge correlation over prompts of exact [P, E] and the approximation [P, E] (0 for a constant edge)."""
    X, A = np.asarray(exact, np.float64), np.asarray(approx, np.float64)
    if X.shape != A.shape or X.ndim != 2:
        raise InputError(f"exact and approx must be [prompts, edges] of one shape, got {X.shape} and {A.shape}")
    dx, da = X - X.mean(0), A - A.mean(0)
    den = np.sqrt((dx**2).sum(0) * (da**2).sum(0))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, (dx * da).sum(0) / np.where(den > 0, den, 1.0), 0.0)


def multiple_correlation(exact: np.ndarray, approx: np.ndarray) -> np.ndarray:
    """Return per edge R, the correlation of exact [P, E] with its best linear combination of approx [P, E, p].

    With several predictors the floor above holds with ρ² replaced by R² (the variance of Y − βᵀŶ at the best β
    is σ_Y² (1 − R²)), so ``width_floor(multiple_correlation(X, H), n, N)`` is the floor of multi.py's estimator.
    """
    X, H = np.asarray(exact, np.float64), np.asarray(approx, np.float64)
    if H.ndim != 3 or H.shape[:2] != X.shape or X.ndim != 2:
        raise InputError(f"exact must be [prompts, edges] and approx [prompts, edges, p]; got {X.shape}, {H.shape}")
    dx, dh = X - X.mean(0), H - H.mean(0)
    S, c = np.einsum("iep,ieq->epq", dh, dh), np.einsum("iep,ie->ep", dh, dx)
    explained = np.einsum("ep,ep->e", c, np.einsum("epq,eq->ep", np.linalg.pinv(S), c))
    total = (dx**2).sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(np.clip(np.where(total > 0, explained / np.where(total > 0, total, 1.0), 0.0), 0.0, 1.0))


def width_floor(rho: np.ndarray, n: int, N: int) -> np.ndarray:
    """Return per edge the least SD ratio of a PPI estimate from n of N prompts against exact on all N (see module)."""
    if not 1 <= n < N:
        raise InputError(f"need 1 <= n < N, got n={n}, N={N}")
    rho = np.asarray(rho, np.float64)
    return np.sqrt(N / n * (1.0 - rho**2 / (1.0 + n / (N - n))))
