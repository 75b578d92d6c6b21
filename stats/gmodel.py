"""Empirical-Bayes g-model of means observed with noise: the NPMLE of the prior on a grid, and posterior draws.

Each of E estimates m_e ~ N(mu_e, se_e^2), the mu_e drawn from an unknown prior g. The nonparametric maximum
likelihood estimate of g (Kiefer & Wolfowitz 1956) restricted to a fixed grid is a convex problem, solved by
EM on the grid weights (Jiang & Zhang 2009, "General maximum likelihood empirical Bayes estimation of normal
means", sec. 2; Koenker & Mizera 2014 solve the same problem by interior point). The posterior of each mu_e is
then the grid weights times its likelihood, normalised; posterior draws sample each edge independently (the
edges are independent given g).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GModel", "npmle"]


@dataclass
class GModel:
    """The fitted prior (grid, weights) and each observation's posterior over the grid [E, G]."""

    grid: np.ndarray
    weights: np.ndarray
    posterior: np.ndarray

    def mean(self) -> np.ndarray:
        """Return each observation's posterior mean."""
        return self.posterior @ self.grid

    def draw(self, rng: np.random.Generator, n_draws: int) -> np.ndarray:
        """Return [n_draws, E] means drawn from each observation's posterior (inverse CDF on the grid)."""
        cdf = np.cumsum(self.posterior, axis=1)
        u = rng.random((int(n_draws), cdf.shape[0], 1)) * cdf[None, :, -1:]
        idx = np.minimum((cdf[None] < u).sum(axis=-1), self.grid.size - 1)
        return self.grid[idx]


def npmle(m: np.ndarray, se: np.ndarray, *, grid_size: int = 200, n_iter: int = 500, tol: float = 1e-9) -> GModel:
    """Return the grid NPMLE of the prior of m_e ~ N(mu_e, se_e^2) and each posterior.

    The grid spans [min m, max m] (the NPMLE's support lies there). An observation with se_e = 0 is known
    exactly: its posterior is the grid point nearest m_e plus its offset, so it is returned as a point mass
    at m_e itself (grid column added), and it does not shape g. EM stops when the log-likelihood gains
    less than tol per observation.
    """
    m = np.asarray(m, dtype=np.float64)
    se = np.asarray(se, dtype=np.float64)
    exact = ~(se > 0)
    grid = np.linspace(m.min(), m.max(), int(grid_size)) if m.max() > m.min() else np.array([m.min()])
    w = np.full(grid.size, 1.0 / grid.size)
    mv, sv = m[~exact], se[~exact]
    if mv.size:
        z = (mv[:, None] - grid[None, :]) / sv[:, None]
        logL = -0.5 * z * z - np.log(sv)[:, None]
        L = np.exp(logL - logL.max(axis=1, keepdims=True))  # per-row scale: cancels in the posterior
        prev = -np.inf
        for _ in range(int(n_iter)):
            mix = L @ w
            ll = float(np.mean(np.log(mix)))
            w = w * (L / mix[:, None]).mean(axis=0)
            if ll - prev < tol:
                break
            prev = ll
        post_v = L * w
        post_v /= post_v.sum(axis=1, keepdims=True)
    full_grid = np.concatenate([grid, m[exact]])
    post = np.zeros((m.size, full_grid.size))
    if mv.size:
        post[np.flatnonzero(~exact), :grid.size] = post_v
    post[np.flatnonzero(exact), grid.size + np.arange(int(exact.sum()))] = 1.0
    return GModel(full_grid, np.concatenate([w, np.zeros(int(exact.sum()))]), post)
