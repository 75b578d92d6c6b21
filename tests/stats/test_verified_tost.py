"""Issue 48: the missed-edges classification as TOST with Holm's step-down (the same family-wise guarantee as
Bonferroni intervals inside (−τ, τ), more power). Oracles: statsmodels' Holm, the TOST / (1 − 2α)-interval
duality, and a simulation with known effects on the boundary |μ| = τ (the least favourable null)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special
from statsmodels.stats.multitest import multipletests

from circuitstat.stats.verified.missed import holm_reject, possibly_above, tost_holm_possibly_above, tost_pvalues


def test_holm_equals_statsmodels(monkeypatch) -> None:
    import gc

    # multipletests calls gc.collect() on every call: 1 s each on a test worker's heap, 200 s for this loop
    monkeypatch.setattr(gc, "collect", lambda *a: 0)
    rng = np.random.default_rng(0)
    for _ in range(200):
        p = rng.beta(0.3, 1.0, rng.integers(1, 30))
        np.testing.assert_array_equal(holm_reject(p, 0.05), multipletests(p, 0.05, method="holm")[0])


def test_tost_rejects_exactly_when_the_1_minus_2alpha_interval_lies_inside() -> None:
    rng = np.random.default_rng(1)
    est, se, df, tau, a = rng.normal(0, 0.5, 5000), rng.uniform(0.05, 0.5, 5000), rng.uniform(2, 40, 5000), 0.5, 0.05
    q = special.stdtrit(df, 1 - a)
    inside = (est - q * se > -tau) & (est + q * se < tau)
    np.testing.assert_array_equal(tost_pvalues(est, se, df, tau) <= a, inside)


def test_tost_holm_classifies_below_tau_wherever_bonferroni_intervals_do_and_more() -> None:
    rng = np.random.default_rng(2)
    r, tau, a = 15, 0.5, 0.025
    more = 0
    for _ in range(300):
        est, se, df = rng.normal(0, 0.3, r), rng.uniform(0.02, 0.2, r), np.full(r, 14.0)
        q = special.stdtrit(df, 1 - a / r / 2)  # the old rule: two-sided Bonferroni interval at 1 − a / r
        old = possibly_above(est - q * se, est + q * se, tau)
        new = tost_holm_possibly_above(est, se, df, tau, a)
        assert not (new & ~old).any()  # everything the old rule classified below τ, TOST-Holm does too
        more += int((old & ~new).sum())
    assert more > 0


@pytest.mark.parametrize("side", [-1.0, 1.0])
def test_family_wise_error_at_the_boundary_is_at_most_alpha(side: float) -> None:
    # every edge exactly at |μ| = τ (the least favourable null): classifying any of them below τ is an error
    rng = np.random.default_rng(3)
    reps, r, n, tau, a = 4000, 10, 16, 0.5, 0.05
    x = side * tau + rng.standard_normal((reps, n, r))
    est, se = x.mean(1), x.std(1, ddof=1) / np.sqrt(n)
    err = np.array([(~tost_holm_possibly_above(est[i], se[i], n - 1, tau, a)).any() for i in range(reps)])
    mc = np.sqrt(a * (1 - a) / reps)
    assert err.mean() <= a + 2 * mc
    # negative control: without the multiplicity correction (each edge at a) the family-wise error exceeds a
    naive = (tost_pvalues(est, se, n - 1, tau) <= a).any(1)
    assert naive.mean() > a + 4 * mc
