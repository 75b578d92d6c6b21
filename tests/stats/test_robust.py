"""Robust estimands beside the mean (circuitstat.stats.robust): scipy as the oracle, coverage per edge."""

import numpy as np
import pytest
from scipy import stats
from scipy.stats import mstats

from circuitstat.stats.populations import draw_datasets, single_spike_population, spiky_population
from circuitstat.stats.robust import median_interval, median_ranks, trimmed_mean_interval


@pytest.mark.parametrize("n", [6, 7, 20, 31, 64, 129])
def test_median_interval_matches_scipy_quantile_test_and_its_binomial_level(n):
    x = np.random.default_rng(n).standard_t(2, (n, 4))
    r = median_interval(x)
    for j in range(4):
        ci = stats.quantile_test(x[:, j], q=np.median(x[:, j]), p=0.5).confidence_interval(0.95)
        assert (r.low[j], r.high[j]) == (ci.low, ci.high)
    lo, hi, level = median_ranks(n)
    # the exact level: P(X_(l) <= m <= X_(u)) = P(l <= Bin(n, 1/2) <= u - 1)
    assert np.isclose(level, stats.binom.cdf(hi - 1, n, 0.5) - stats.binom.cdf(lo - 1, n, 0.5))
    assert level >= 0.95 and (lo == 1 or 1 - 2 * stats.binom.cdf(lo, n, 0.5) < 0.95)  # the narrowest such pair


def test_median_interval_below_six_examples_is_infinite_not_falsely_narrow():
    r = median_interval(np.arange(10.0).reshape(5, 2))
    assert np.isneginf(r.low).all() and np.isposinf(r.high).all() and r.achieved_level == 1.0


@pytest.mark.parametrize("n, trim", [(20, 0.2), (33, 0.2), (64, 0.1), (128, 0.25)])
def test_trimmed_mean_interval_matches_scipy_tukey_mclaughlin(n, trim):
    x = np.random.default_rng(n).lognormal(0, 1, (n, 3))
    r = trimmed_mean_interval(x, trim=trim)
    for j in range(3):
        lo, hi = mstats.trimmed_mean_ci(x[:, j], limits=(trim, trim), alpha=0.05)
        assert np.allclose((r.low[j], r.high[j]), (lo, hi))
        assert np.isclose(r.estimate[j], stats.trim_mean(x[:, j], trim))


def _per_edge_coverage(pop, n, n_datasets, fn, truth):
    hits = np.array([(lambda r: (r.low <= truth) & (truth <= r.high))(fn(pop[rows]))
                     for rows in draw_datasets(pop, n, n_datasets, seed=11)])
    return hits.mean(axis=0)


@pytest.mark.parametrize("make", [lambda: spiky_population(2000, 40, seed=9),
                                  lambda: single_spike_population(2048, 30, seed=3)], ids=["spiky", "one-spike"])
def test_robust_intervals_cover_their_own_estimand_on_every_edge(make):
    """Per edge, 400 datasets of N = 64: the median's interval covers at least its exact binomial level less
    3.5 MC SE on every edge (and not far above it); the trimmed mean's covers 0.91-0.99 on every edge, where the
    mean's own interval misses the one-spike edges (a dataset that missed the spike cannot see it)."""
    pop = make()
    n, d = 64, 400
    level = median_ranks(n)[2]  # 0.967
    cov = _per_edge_coverage(pop, n, d, median_interval, np.median(pop, axis=0))
    mc = np.sqrt(level * (1 - level) / d)
    assert cov.min() >= level - 3.5 * mc and cov.mean() <= level + 2 * mc / np.sqrt(pop.shape[1]) + 0.01, cov
    cov_t = _per_edge_coverage(pop, n, d, trimmed_mean_interval, stats.trim_mean(pop, 0.2, axis=0))
    assert 0.91 <= cov_t.min() and cov_t.max() <= 0.99 and 0.93 <= cov_t.mean() <= 0.97, cov_t


@pytest.mark.parametrize("n", [9, 32, 64])
def test_robust_pvalues_invert_their_intervals_and_match_scipy(n):
    rng = np.random.default_rng(n)
    x = rng.standard_t(3, (n, 200)) + rng.normal(0, 0.4, 200)  # effects near zero: both sides of the cut
    x[:, :5] = np.round(x[:, :5])  # ties at zero count on both sides
    med, tm = median_interval(x), trimmed_mean_interval(x)
    excl = (med.low > 0) | (med.high < 0)
    assert 0 < excl.sum() < 200 and np.array_equal(excl, med.pvalue <= 0.05)
    excl_t = (tm.low > 0) | (tm.high < 0)
    assert 0 < excl_t.sum() < 200 and np.array_equal(excl_t, tm.pvalue < 0.05)
    for j in range(5, 10):  # no zeros: the sign test is scipy's binomial test
        assert np.isclose(med.pvalue[j], stats.binomtest(int((x[:, j] > 0).sum()), n).pvalue)


def test_single_spike_population_puts_most_of_a_spiky_edges_mean_on_one_prompt():
    pop = single_spike_population(2048, 30, seed=3)
    dev = pop - np.median(pop, axis=0)
    top = np.abs(dev).max(axis=0)
    spiky = top > 50  # a spike of c m 2048 with |m| >= 0.3, c >= 0.5 is >= 307; the N(0, 1) body stays below 6
    assert 5 <= spiky.sum() <= 25 and (top[~spiky] < 6).all()
    share = (dev[np.abs(dev).argmax(axis=0), np.arange(30)] / 2048)[spiky] / pop.mean(axis=0)[spiky]
    assert ((0.5 <= share) & (share <= 0.96)).all()  # the one prompt carries c_e in [0.5, 0.95] of the mean
    assert (stats.kurtosis(pop[:, spiky]) > 1500).all()
