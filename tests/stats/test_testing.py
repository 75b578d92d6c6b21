"""p-values and FDR control against scipy and statsmodels."""

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from circuitstat.stats.testing import (adjust_pvalues, bh_adjust, by_adjust, resampling_pvalue, t_test_edges,
                           z_test_edges)


@pytest.fixture(scope="module")
def pvals():
    rng = np.random.default_rng(0)
    p = np.concatenate([rng.uniform(size=300), rng.beta(0.2, 8, size=60)])
    p[[5, 6, 7]] = p[4]  # ties
    p[10] = 0.0
    p[11] = 1.0
    return p


@pytest.mark.parametrize("method,sm", [("bh", "fdr_bh"), ("by", "fdr_by")])
@pytest.mark.parametrize("alpha", [0.05, 0.2])
def test_fdr_matches_statsmodels(pvals, method, sm, alpha):
    reject, adj = adjust_pvalues(pvals, method, alpha)
    ref_reject, ref_adj, _, _ = multipletests(pvals, alpha=alpha, method=sm)
    np.testing.assert_allclose(adj, ref_adj, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(reject, ref_reject)
    assert 0 < reject.sum() < pvals.size


def test_fdr_ignores_nan_and_keeps_shape(pvals):
    p = pvals.copy().reshape(20, 18)
    p[0, 0] = np.nan
    adj = bh_adjust(p)
    assert adj.shape == p.shape and np.isnan(adj[0, 0])
    ref = multipletests(p.ravel()[1:], method="fdr_bh")[1]
    np.testing.assert_allclose(adj.ravel()[1:], ref, rtol=1e-12)
    assert (by_adjust(pvals) >= bh_adjust(pvals)).all()
    with pytest.raises(ValueError):
        bh_adjust(np.array([0.1, 1.5]))


@pytest.mark.parametrize("alternative", ["two-sided", "less", "greater"])
def test_t_test_matches_scipy(alternative):
    rng = np.random.default_rng(1)
    S = (rng.standard_normal((25, 40)) + np.linspace(-1, 1, 40)).astype(np.float32)
    res = t_test_edges(S, 0.1, alternative=alternative)
    ref = stats.ttest_1samp(S.astype(np.float64), 0.1, axis=0, alternative=alternative)
    np.testing.assert_allclose(res.statistic, ref.statistic, rtol=1e-10)
    np.testing.assert_allclose(res.pvalue, ref.pvalue, rtol=1e-9, atol=1e-300)
    np.testing.assert_array_equal(res.reject, multipletests(ref.pvalue, method="fdr_bh")[0])
    t = res.to_table()
    assert t.num_rows == 40 and "pvalue_adjusted" in t.column_names


def test_z_test_two_sided():
    res = z_test_edges(np.array([0.0, 1.96, -3.0]), np.array([1.0, 1.0, 1.0]), correction="by")
    np.testing.assert_allclose(res.pvalue, 2 * stats.norm.sf(np.abs([0.0, 1.96, -3.0])))


def test_resampling_pvalue_floor():
    null = np.random.default_rng(0).standard_normal(999)
    assert resampling_pvalue(null, 100.0, "greater") == pytest.approx(1 / 1000)
    assert resampling_pvalue(null, 100.0, "two-sided") == pytest.approx(2 / 1000)
    assert resampling_pvalue(null, -100.0, "greater") == pytest.approx(1.0)
    p = resampling_pvalue(np.stack([null, null + 5]), np.array([0.0, 0.0]), "less")
    assert p.shape == (2,) and p[1] == pytest.approx(1 / 1000)


@pytest.mark.parametrize("alternative", ["two-sided", "less", "greater"])
def test_interval_test_of_the_t_interval_is_the_t_test(alternative):
    from circuitstat.stats.intervals import bootstrap_edges
    from circuitstat.stats.testing import interval_test_edges

    rng = np.random.default_rng(4)
    S = rng.standard_t(3, (30, 50)) + np.linspace(-0.8, 0.8, 50)
    boot = bootstrap_edges(S, n_resamples=50, seed=0, method="t", alternative=alternative)
    got = interval_test_edges(boot, correction="by", alpha=0.1)
    ref = t_test_edges(S, alternative=alternative, correction="by", alpha=0.1)
    np.testing.assert_allclose(got.pvalue, ref.pvalue, rtol=1e-10, atol=1e-300)
    np.testing.assert_array_equal(got.reject, ref.reject)
    assert 0 < got.reject.sum() < 50
