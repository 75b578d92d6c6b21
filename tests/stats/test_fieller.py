"""Fieller's set for a ratio of means (faithfulness of a fixed circuit): against a brute-force inversion of the
t-test of a − θ b (scipy; statsmodels' cluster-robust t for clusters), and its coverage on a population whose
denominator is small, bounded from both sides, with the delta-method interval as the negative control."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from circuitstat.stats.fieller import UNDISTINGUISHABLE, fieller_faithfulness, fieller_interval


def _sample(rng, n, mu_b, sd_b=1.0, theta=0.8, sd_e=0.5, c=1):
    b = mu_b + sd_b * rng.standard_normal(n)
    a = theta * b[:, None] + sd_e * rng.standard_normal((n, c)) + 0.1 * np.arange(c)
    return a, b


def _brute(a, b, grid, level):
    """Membership of each θ in grid: the one-sample t-test of a − θ b does not reject at 1 − level."""
    return sps.ttest_1samp(a[None, :] - grid[:, None] * b[None, :], 0.0, axis=1).pvalue > 1 - level


def _inside(res, j, grid):
    return res.covers(grid[:, None])[:, j]  # FiellerInterval.covers: the membership every coverage count uses


@pytest.mark.parametrize("mu_b, want", [(1.5, "bounded"), (0.05, "union"), (0.0, "unbounded")])
def test_the_set_is_the_inversion_of_the_t_test(mu_b, want):
    rng = np.random.default_rng(7)
    grid = np.linspace(-40, 40, 4001)
    seen = set()
    for _ in range(15):
        a, b = _sample(rng, 24, mu_b, c=2, sd_e=0.5 if want != "unbounded" else 3.0)
        if want == "union":
            a = a + 1.0  # numerator clearly non-zero, denominator not: two rays
        if want == "unbounded":
            b = b - b.mean() + 0.01  # denominator indistinguishable, numerator too: the whole line
            a[:, 0] = 0.2 * rng.standard_normal(24)
        res = fieller_interval(a, b, confidence_level=0.9)
        seen |= set(res.shape)
        for j in range(2):
            got, ref = _inside(res, j, grid), _brute(a[:, j], b, grid, 0.9)
            # boundaries fall between grid points: allow the grid points next to the set's ends to differ
            assert (got != ref).sum() <= 2, (res.shape[j], res.low[j], res.high[j])
            if res.shape[j] == "union":  # the gap between the rays is in the hull (−inf, inf) but not in the set
                gap = (res.inner_low[j] + res.inner_high[j]) / 2
                assert res.low[j] <= gap <= res.high[j] and not res.covers(gap)[j]
                assert not _brute(a[:, j], b, np.array([gap]), 0.9)[0]
    assert want in seen, seen


def test_cluster_robust_set_matches_statsmodels():
    import statsmodels.api as sm

    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(8), 5)
    a, b = _sample(rng, 40, 1.0)
    a[:, 0] += np.repeat(rng.standard_normal(8), 5)  # cluster effects
    res = fieller_interval(a, b, groups=groups, confidence_level=0.95)
    assert res.df == 7
    for th, inside in ((res.low[0] - 1e-6, False), (res.low[0] + 1e-6, True), (res.high[0] - 1e-6, True),
                       (res.high[0] + 1e-6, False)):
        fit = sm.OLS(a[:, 0] - th * b, np.ones(40)).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)
        assert (abs(fit.tvalues[0]) <= sps.t.ppf(0.975, 7)) == inside


def test_shapes_and_the_verdict_words():
    rng = np.random.default_rng(0)
    a, b = _sample(rng, 30, 0.02)
    res = fieller_faithfulness(a[:, 0] + b, b + 0.0, np.zeros(30))  # m_circuit, m_clean, m_empty
    assert res.shape[0] in ("union", "unbounded") and res.low[0] == -np.inf and res.high[0] == np.inf
    assert res.notes()[0].startswith(UNDISTINGUISHABLE)
    assert abs(res.denominator_t) < res.critical_t
    a, b = _sample(rng, 30, 3.0)
    res = fieller_interval(a, b)
    assert res.shape[0] == "bounded" and res.notes() == [""] and res.low[0] < res.estimate[0] < res.high[0]


def _delta(a, b, level):
    n = b.size
    th = a.mean() / b.mean()
    se = np.sqrt(np.var(a - th * b, ddof=1) / n) / abs(b.mean())
    t = sps.t.ppf(0.5 + level / 2, n - 1)
    return th - t * se, th + t * se


def _coverage(mu_b, reps, n=32, seed=11, bca_reps=0):
    """(Fieller's coverage, BCa's coverage over the first bca_reps draws, share bounded, width ratio to the delta
    method where bounded) on a = θ b + e, b ~ N(mu_b, 1.5²), e ~ N(0, 0.7²), θ = 0.8."""
    from circuitstat.stats.faithfulness import fixed_circuit_interval
    from circuitstat.stats.resampling import ResamplingPlan

    rng = np.random.default_rng(seed)
    theta = 0.8
    fie = bca = wid_f = wid_d = bounded = 0
    for r in range(reps):
        a, b = _sample(rng, n, mu_b, sd_b=1.5, theta=theta, sd_e=0.7)
        f = fieller_interval(a, b)
        fie += bool(_inside(f, 0, np.array([theta]))[0])
        if r < bca_reps:  # today's interval: BCa of the bootstrap ratio (m_empty = 0, m_clean = b, m_circuit = a)
            res = fixed_circuit_interval(a[:, 0], b, np.zeros(n), ResamplingPlan.bootstrap(n, 399, r), method="bca")
            bca += bool(res.confidence_interval.low[0] <= theta <= res.confidence_interval.high[0])
        if f.shape[0] == "bounded":
            bounded += 1
            lo, hi = _delta(a[:, 0], b, 0.95)
            wid_f += f.high[0] - f.low[0]
            wid_d += hi - lo
    return fie / reps, bca / max(bca_reps, 1), bounded / reps, wid_f / max(wid_d, 1e-300)


def test_coverage_where_the_denominator_is_small_and_width_where_it_is_not():
    """Small denominator (mean 0.3, sd 1.5, N = 32: its t is 1.1 on average, 83% of the sets unbounded): Fieller
    covers at 0.95 ± 3 MC SE (2000 draws: SE 0.005); today's BCa interval of the bootstrap ratio (the negative
    control) undercovers there (0.85 measured, 600 draws: SE 0.015). Where the denominator is clear (mean 3: t ≈ 11)
    every set is bounded and about as wide as the delta method's interval (not uselessly wide)."""
    fie, bca, bounded, _ = _coverage(0.3, reps=2000, bca_reps=600)
    assert 0.935 <= fie <= 0.965, fie
    assert bca < 0.90, bca
    assert 0.05 < bounded < 0.5  # bounded and unbounded sets are both exercised
    fie, _, bounded, ratio = _coverage(3.0, reps=1000)
    assert bounded == 1.0 and 0.925 <= fie <= 0.975 and 0.98 < ratio < 1.15, (fie, bounded, ratio)


def test_over_plan_is_the_set_per_column_with_the_plans_clusters():
    """fieller_over_plan (the audit's top-k curve and the published circuit): each column of a curve over one shared
    denominator is that column's own set, cluster-robust exactly when the plan resamples clusters."""
    from circuitstat.stats.fieller import fieller_over_plan
    from circuitstat.stats.resampling import ResamplingPlan

    rng = np.random.default_rng(5)
    groups = np.repeat(np.arange(10), 4)
    a, b = _sample(rng, 40, 1.5, c=3)
    a += np.repeat(rng.standard_normal((10, 1)), 4, axis=0)  # a cluster effect: the two variances differ
    m0 = rng.standard_normal(40)  # m_empty; the numerator is m_circuit - m_empty, the denominator m_clean - m_empty
    for plan, g in ((ResamplingPlan.bootstrap(40, 50, 0), None), (ResamplingPlan.cluster(groups, 50, 0), groups)):
        got = fieller_over_plan(a, b + m0, m0, plan, confidence_level=0.9)
        for j in range(3):
            one = fieller_interval(a[:, j], b, groups=g, confidence_level=0.9)
            assert got.low[j] == pytest.approx(one.low[0], rel=1e-9) and got.high[j] == pytest.approx(one.high[0], rel=1e-9)
        assert got.df == (39 if g is None else 9)
    iid = fieller_over_plan(a, b + m0, m0, ResamplingPlan.bootstrap(40, 50, 0), confidence_level=0.9)
    assert not np.allclose(iid.low, got.low)  # negative control: the clusters change the set
