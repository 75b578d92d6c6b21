"""circuitstat.stats.verified.floor: the closed-form variance floor against a brute-force minimum over λ."""

from __future__ import annotations

import numpy as np

from circuitstat.stats.verified.floor import per_prompt_correlation, width_floor


def test_floor_is_the_minimum_over_lambda_of_the_ppi_variance():
    rng = np.random.default_rng(0)
    P, E, n, N = 20000, 5, 16, 512
    A = rng.standard_normal((P, E)) * np.linspace(0.5, 2, E)
    X = np.linspace(0.2, 1.3, E) * A + rng.standard_normal((P, E)) * np.linspace(0.1, 2, E)
    rho = per_prompt_correlation(X, A)
    np.testing.assert_allclose(rho, [np.corrcoef(X[:, e], A[:, e])[0, 1] for e in range(E)], atol=1e-12)
    lam = np.linspace(-1, 3, 40001)[:, None]
    # Var(Y − λŶ) = σ_Y² − 2λσ_YŶ + λ²σ_Ŷ², by brute force on the λ grid
    sy, sa, sya = X.var(0), A.var(0), ((X - X.mean(0)) * (A - A.mean(0))).mean(0)
    var = lam**2 * sa / (N - n) + (sy - 2 * lam * sya + lam**2 * sa) / n
    brute = np.sqrt(var.min(0) / (sy / N))
    np.testing.assert_allclose(width_floor(rho, n, N), brute, rtol=1e-6)
    assert (width_floor(rho, n, N) >= np.sqrt(N / n) * np.sqrt(1 - rho**2) - 1e-12).all()
    np.testing.assert_allclose(width_floor(np.zeros(1), n, N), np.sqrt(N / n))  # no correlation: exact on n
