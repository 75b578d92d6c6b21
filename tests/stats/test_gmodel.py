"""circuitstat.stats.gmodel: the grid NPMLE of a normal-means prior, checked by its optimality certificate, a
known two-point prior, and its posterior draws against the posterior they sample."""

from __future__ import annotations

import numpy as np

from circuitstat.stats.gmodel import npmle


def _directional(m: np.ndarray, se: np.ndarray, g) -> np.ndarray:
    """Lindsay's gradient mean_e phi_e(grid_j) / mix_e: <= 1 at every grid point, = 1 on g's support, at the NPMLE."""
    L = np.exp(-0.5 * ((m[:, None] - g.grid[None, :]) / se[:, None]) ** 2) / se[:, None]
    return (L / (L @ g.weights)[:, None]).mean(axis=0)


def test_npmle_meets_the_kiefer_wolfowitz_optimality_certificate():
    rng = np.random.default_rng(0)
    mu = np.where(rng.random(300) < 0.7, 0.0, 3.0)
    se = rng.uniform(0.5, 1.5, 300)
    m = mu + se * rng.normal(size=300)
    g = npmle(m, se, n_iter=5000, tol=1e-13)
    d = _directional(m, se, g)
    assert d.max() <= 1.0 + 2e-3  # no grid point would raise the likelihood: the maximum
    assert abs(np.sum(g.weights * d) - 1.0) < 1e-9  # identity at any g: the weights sum the gradient to 1
    # negative control: a uniform prior on the same grid is far from optimal
    uniform = type(g)(g.grid, np.full(g.grid.size, 1.0 / g.grid.size), g.posterior)
    assert _directional(m, se, uniform).max() > 1.2


def test_npmle_recovers_a_two_point_prior_and_shrinks_toward_it():
    rng = np.random.default_rng(1)
    mu = np.where(rng.random(1000) < 0.5, 0.0, 5.0)
    m = mu + rng.normal(size=1000)
    g = npmle(m, np.ones(1000))
    near0 = g.weights[np.abs(g.grid) < 1.0].sum()
    near5 = g.weights[np.abs(g.grid - 5.0) < 1.0].sum()
    assert near0 > 0.4 and near5 > 0.4 and near0 + near5 > 0.93
    # the posterior mean moves an observation at 1.5 toward 0, one at 3.5 toward 5 (the plain mean would not)
    post = g.mean()
    assert np.all(post[(m > 1.2) & (m < 1.8)] < 1.2) and np.all(post[(m > 3.2) & (m < 3.8)] > 3.8)


def test_posterior_draws_sample_the_posterior_and_exact_observations_stay_put():
    rng = np.random.default_rng(2)
    m = np.array([0.0, 0.3, -0.2, 2.0, 7.5])
    se = np.array([1.0, 1.0, 1.0, 1.0, 0.0])  # the last is known exactly
    g = npmle(m, se)
    draws = g.draw(rng, 20000)
    assert np.all(draws[:, 4] == 7.5)
    sd = np.sqrt(g.posterior @ g.grid**2 - g.mean() ** 2)
    assert np.all(np.abs(draws[:, :4].mean(axis=0) - g.mean()[:4]) < 5 * sd[:4] / np.sqrt(20000) + 1e-12)
    np.testing.assert_allclose(draws[:, :4].std(axis=0), sd[:4], rtol=0.05)
