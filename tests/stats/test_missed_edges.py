"""circuitstat.stats.verified.missed: the bound on unverified edges above τ, against scipy and over simulated datasets."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from circuitstat.stats.verified.missed import (hypergeometric_cdf, hypergeometric_upper, missed_edges_bound,
                                   possibly_above)


@pytest.mark.parametrize("R, r", [(20, 20), (30, 10), (200, 37), (1000, 100), (2850, 200)])
def test_upper_bound_is_scipys_largest_plausible_count(R: int, r: int) -> None:
    for x in sorted({0, 1, 2, r // 3, r // 2, r}):
        K = np.arange(x, R - (r - x) + 1)
        np.testing.assert_allclose(hypergeometric_cdf(x, R, K, r), sps.hypergeom.cdf(x, R, K, r), atol=1e-9)
        for level in (0.9, 0.975):
            plausible = K[sps.hypergeom.cdf(x, R, K, r) > 1 - level]
            assert hypergeometric_upper(x, R, r, level) == plausible.max()


def test_large_population_limit_is_clopper_pearson() -> None:
    # drawing 50 of a million edges is binomial: K_U / R tends to the one-sided Clopper-Pearson bound
    R, r = 1_000_000, 50
    for x in (0, 3, 20):
        cp = sps.beta.ppf(0.95, x + 1, r - x)
        assert hypergeometric_upper(x, R, r, 0.95) / R == pytest.approx(cp, rel=2e-3)


def test_possibly_above_counts_unless_the_interval_is_inside_minus_tau_tau() -> None:
    low = np.array([-0.05, 0.2, -0.5, -0.05, -0.2])
    high = np.array([0.05, 0.4, -0.3, 0.15, 0.05])
    np.testing.assert_array_equal(possibly_above(low, high, 0.1), [False, True, True, True, True])


def _simulate(n_datasets: int, seed: int, exact_classification: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (truth, bound, naive) per dataset: unverified edges above τ, the bound and a plug-in count."""
    rng = np.random.default_rng(seed)
    E, m, r, n, tau = 3000, 150, 200, 32, 0.1
    truth, bound, naive = [], [], []
    for _ in range(n_datasets):
        big = rng.random(E) < 0.06
        mu = np.where(big, rng.choice([-1, 1], E) * rng.uniform(0.12, 0.6, E), rng.normal(0, 0.02, E))
        approx = 0.7 * mu + rng.normal(0, 0.12, E)  # a biased, noisy ranking: the top m miss large edges
        rest = np.argsort(-np.abs(approx))[m:]
        sample = rng.choice(rest, r, replace=False)
        if exact_classification:
            above = np.abs(mu[sample]) > tau
            res = missed_edges_bound(above, rest.size, tau=tau, n_top=m, confidence_level=0.95)
        else:  # t intervals from n prompts, Bonferroni over the r sampled edges at 1 - 0.025 / r
            x = mu[sample] + 0.05 * rng.standard_t(5, (n, r))
            half = sps.t.ppf(1 - 0.025 / r / 2, n - 1) * x.std(0, ddof=1) / np.sqrt(n)
            above = possibly_above(x.mean(0) - half, x.mean(0) + half, tau)
            res = missed_edges_bound(above, rest.size, tau=tau, n_top=m, confidence_level=0.975,
                                     classification_level=0.975)
            assert res.level == pytest.approx(0.95)
        unverified = np.setdiff1d(rest, sample)
        truth.append(int((np.abs(mu[unverified]) > tau).sum()))
        bound.append(res.bound)
        naive.append(int(round(res.sampled_above * (rest.size - r) / r)))
    return np.array(truth), np.array(bound), np.array(naive)


@pytest.mark.parametrize("exact_classification", [True, False])
def test_bound_holds_at_its_level_and_is_not_vacuous(exact_classification: bool) -> None:
    D = 300
    truth, bound, naive = _simulate(D, 11 + exact_classification, exact_classification)
    held = truth <= bound
    rate, se = held.mean(), np.sqrt(0.95 * 0.05 / D)
    print(f"\nmissed-edge bound held in {rate:.3f} of {D} datasets (level 0.95, MC SE {se:.3f}); "
          f"median truth {np.median(truth):.0f}, median bound {np.median(bound):.0f}")
    assert rate >= 0.95 - 2 * se
    assert (truth > 0).mean() > 0.9  # the nulls are not trivially empty
    # not vacuous: far below the trivial bound (every one of the 2650 unverified edges)
    assert np.median(bound) < 0.2 * 2650
    if exact_classification:  # the exact hypergeometric part is not needlessly conservative either
        assert rate <= 0.995 and np.median(bound) < 3 * np.median(truth)
        # a plug-in estimate of the count is no bound: the same check rejects it
        assert (truth <= naive).mean() < 0.8
