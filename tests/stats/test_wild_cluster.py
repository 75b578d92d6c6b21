"""The cluster scheme's default interval: wild cluster bootstrap-t with CR2 standard errors and G - 1 df.

Oracles: the CR2 standard error against the matrix formula (I - H_gg)^(-1/2) built by eigendecomposition, and
against statsmodels' CR0 cluster SE scaled per cluster; the wild t* against bootstrap samples built example by
example; the weight sets against their definition (Webb 2013's six points, Rademacher) and exact enumeration.
Coverage is bounded from both sides on a small templated population of real zoo scores, with the former BCa
default and the example bootstrap as negative controls (they under-cover on the same datasets).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from circuitstat.core.errors import InputError
from circuitstat.stats.calibration import clustered_rate
from circuitstat.stats.intervals import bootstrap_edges
from circuitstat.stats.intervals.wild import ClusterSums, cr2_se, wild_t
from circuitstat.stats.populations import templated_datasets
from circuitstat.stats.resampling import ResamplingPlan, wild_weights

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fixture_populations import load_zoo_fixture  # noqa: E402


def _cr2_by_matrices(x: np.ndarray, groups: np.ndarray) -> float:
    """CR2 SE of the mean of x by the general formula: X = 1, A_g = (I - H_gg)^(-1/2),
    V = sum (X_g' A_g u_g)^2 / N^2."""
    n = x.size
    u = x - x.mean()
    meat = 0.0
    for g in np.unique(groups):
        ug = u[groups == g]
        m = ug.size
        vals, vecs = np.linalg.eigh(np.eye(m) - np.full((m, m), 1.0 / n))
        a = vecs @ np.diag(vals ** -0.5) @ vecs.T
        meat += (np.ones(m) @ a @ ug) ** 2
    return float(np.sqrt(meat) / n)


def test_cr2_matches_the_matrix_formula_and_statsmodels_cr0_scaled():
    import statsmodels.api as sm

    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(6), [2, 3, 5, 7, 4, 9])
    x = rng.standard_t(3, (groups.size, 3)) + rng.normal(size=(6, 3))[groups]
    cs = ClusterSums(groups)
    se = cr2_se(cs.residual_sums(x.T), cs)
    for j in range(3):
        np.testing.assert_allclose(se[j], _cr2_by_matrices(x[:, j], groups), rtol=1e-12)
        fit = sm.OLS(x[:, j], np.ones(groups.size)).fit(cov_type="cluster", cov_kwds={"groups": groups,
                                                                                       "use_correction": False})
        cr0 = float(fit.bse[0])
        # CR2 scales each cluster's squared residual sum by 1 / (1 - n_g / N): between CR0 and CR0 / (1 - max h)
        assert cr0 < se[j] < cr0 / np.sqrt(1 - 9 / groups.size)
    # equal sizes: CR2 = CR0 / sqrt(1 - 1/G) exactly (negative control: CR0 itself is not CR2)
    eq = np.repeat(np.arange(5), 4)
    y = rng.normal(size=eq.size)
    cs = ClusterSums(eq)
    fit = sm.OLS(y, np.ones(eq.size)).fit(cov_type="cluster", cov_kwds={"groups": eq, "use_correction": False})
    got = cr2_se(cs.residual_sums(y[None, :]), cs)[0]
    np.testing.assert_allclose(got, fit.bse[0] / np.sqrt(1 - 1 / 5), rtol=1e-12)
    assert abs(got - fit.bse[0]) > 0.05 * got


def test_wild_t_matches_bootstrap_samples_built_one_by_one():
    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(5), [3, 4, 2, 6, 5])
    x = rng.lognormal(size=(groups.size, 2))
    w = wild_weights(6, 50, seed=2)[:, :5]  # 50 random Webb rows (G = 5 itself is enumerated)
    cs = ClusterSums(groups)
    t = wild_t(cs.residual_sums(x.T), cs, w)
    for j in range(2):
        xbar = x[:, j].mean()
        u = x[:, j] - xbar
        for b in range(0, 50, 7):
            xs = xbar + w[b][groups] * u  # the unrestricted wild sample
            want = (xs.mean() - xbar) / _cr2_by_matrices(xs, groups)
            np.testing.assert_allclose(t[j, b], want, rtol=1e-9)


def test_wild_weights_enumerate_all_patterns_when_few_and_have_unit_variance():
    w = wild_weights(4, 2000, seed=0)  # Webb for G < 12: 6^4 = 1296 patterns, each once
    assert w.shape == (6 ** 4, 4) and np.unique(w, axis=0).shape[0] == 6 ** 4
    np.testing.assert_allclose(np.unique(w), [-np.sqrt(1.5), -1, -np.sqrt(.5), np.sqrt(.5), 1, np.sqrt(1.5)])
    np.testing.assert_allclose(w.mean(axis=0), 0, atol=1e-12)
    np.testing.assert_allclose((w ** 2).mean(axis=0), 1, rtol=1e-12)
    w5 = wild_weights(5, 999, seed=0)  # 7776 > 999 but at most ENUMERATE_UP_TO: still every pattern once
    assert w5.shape == (6 ** 5, 5) and np.unique(w5, axis=0).shape[0] == 6 ** 5
    w6 = wild_weights(6, 2000, seed=0)  # 46,656 patterns: drawn at random
    assert w6.shape == (2000, 6) and np.unique(w6, axis=0).shape[0] > 1900
    r = wild_weights(12, 5000, seed=0)  # Rademacher from G = 12: 4096 patterns, enumerated
    assert r.shape == (4096, 12) and set(np.unique(r)) == {-1.0, 1.0}
    assert np.unique(r, axis=0).shape[0] == 4096
    plan = ResamplingPlan.cluster(np.arange(20) // 5, 200, seed=3)
    assert plan.wild.shape == (1296, 4)  # enumerated even though 200 resamples were asked for
    # the group draws are those a plan drew before the wild weights existed (child seed for the weights)
    rng = np.random.default_rng(np.random.SeedSequence(3))
    idx = rng.integers(0, 4, (200, 4))
    np.testing.assert_array_equal(plan.counts[:, ::5], np.stack([np.bincount(r_, minlength=4) for r_ in idx]))


def test_cluster_default_is_wild_and_its_pvalue_inverts_its_interval():
    rng = np.random.default_rng(4)
    groups = np.repeat(np.arange(5), 6)
    x = rng.normal(0.3, 1, (30, 40)) + rng.normal(0, 0.5, (5, 40))[groups]
    plan = ResamplingPlan.cluster(groups, 999, seed=5)
    res = bootstrap_edges(x, plan, methods=["cr2_t"])
    assert res.method == "wild_cluster_t"
    lo, hi = res.confidence_interval.low, res.confidence_interval.high
    excl = (lo > 0) | (hi < 0)
    np.testing.assert_array_equal(excl, res.pvalue < 0.05)
    assert 0 < excl.sum() < 40  # both kinds of edge present: the equality above is not vacuous
    # never narrower than CR2 with t(G - 1): the interval G templates allow
    cr = res.intervals["cr2_t"]
    assert np.all(hi - lo >= cr.high - cr.low - 1e-12)
    se = res.standard_error
    np.testing.assert_allclose(cr.high - cr.low, 2 * stats.t.ppf(0.975, 4) * se, rtol=1e-10)
    np.testing.assert_allclose(res.pvalues["cr2_t"], 2 * stats.t.sf(np.abs(res.estimate / se), 4), rtol=1e-10)
    for alt in ("greater", "less"):
        one = bootstrap_edges(x, plan, alternative=alt)
        bound = one.confidence_interval.low if alt == "greater" else one.confidence_interval.high
        np.testing.assert_array_equal((bound > 0) if alt == "greater" else (bound < 0), one.pvalue < 0.05)
    note = res.params["method_reason"]
    assert "G = 5 templates only 7,776 distinct weight patterns exist" in note and "cannot be narrower" in note
    assert "Trust it over an example bootstrap" in note


def test_cluster_methods_need_a_cluster_plan():
    x = np.random.default_rng(0).normal(size=(20, 3))
    for m in ("wild_cluster_t", "wcr"):
        with pytest.raises(InputError, match="need a cluster plan"):
            bootstrap_edges(x, n_resamples=200, seed=0, method=m)
    bare = ResamplingPlan.from_counts(ResamplingPlan.cluster(np.arange(20) // 4, 200, seed=0).counts, kind="cluster")
    with pytest.raises(InputError, match="need a cluster plan"):  # counts alone: no groups, no wild weights
        bootstrap_edges(x, bare)
    with pytest.raises(InputError, match="wrong under the cluster bootstrap"):
        bootstrap_edges(x, ResamplingPlan.cluster(np.arange(20) // 4, 200, seed=0), method="t")


@pytest.fixture(scope="module")
def zoo():
    pop = load_zoo_fixture()[0]
    return pop[:, pop.std(axis=0) > 0]


def _coverage(zoo, n_groups, icc, n_datasets, seed, extra=()):
    """{method: (coverage, MC SE)} pooled over edges, datasets the unit, and the datasets' intervals."""
    x, groups = templated_datasets(zoo, n_groups, 8, icc, n_datasets, seed=seed)
    e = zoo.shape[1]
    mu = np.tile(zoo.mean(axis=0), n_datasets)
    cl = bootstrap_edges(x, ResamplingPlan.cluster(groups, 999, seed + 1), methods=["bca", *extra])
    ex = bootstrap_edges(x, ResamplingPlan.bootstrap(x.shape[0], 999, seed + 2))
    ivs = {"wild": cl.confidence_interval, "bca": cl.intervals["bca"], "example": ex.confidence_interval,
           **{m: cl.intervals[m] for m in extra}}
    out = {}
    for m, iv in ivs.items():
        cov = ((iv.low <= mu) & (mu <= iv.high)).reshape(n_datasets, e)
        out[m] = clustered_rate(cov.sum(axis=1), np.full(n_datasets, e))
    return out, ivs


@pytest.mark.parametrize("n_groups,icc", [(5, 0.3), (8, 0.7)])
def test_wild_default_covers_on_templated_zoo_scores_from_both_sides(zoo, n_groups, icc):
    """Measured (bench/cluster_coverage.py, 100 datasets): 0.948 at G = 5 (icc 0.3) and 0.935 at G = 8 (icc 0.7);
    BCa 0.783 and 0.809, the example bootstrap 0.752 and 0.576 in the same cells; at G = 8 the restricted wild
    bootstrap inverted (wcr) 0.906, which is why it is not the default."""
    extra = ("wcr",) if n_groups == 8 else ()
    cov, ivs = _coverage(zoo, n_groups, icc, 60, seed=10 * n_groups, extra=extra)
    rate, se = cov["wild"]
    assert se < 0.012  # the bounds below are about 3 MC SE wide on each side at most
    assert 0.915 <= rate <= 0.985, cov
    # negative controls: the former default and the example bootstrap miss on the same datasets
    assert cov["bca"][0] < 0.9 and cov["example"][0] < 0.9, cov
    assert cov["bca"][0] + 3 * cov["bca"][1] < rate
    if extra:  # the literature's answer for few clusters misses on these heavy-tailed scores
        assert cov["wcr"][0] < 0.925 and cov["wcr"][0] < rate - 0.01, cov


def test_five_correlated_templates_no_longer_give_a_narrower_interval_than_examples(zoo):
    """Issue 49's example: 5 templates, BCa narrower than the example bootstrap; the default is not, on every edge
    whose templates the data show to be correlated (a design effect of 1.5 or more: CR2 variance over the i.i.d.
    variance of the mean) and whose mean no few prompts
    carry (no_tail_seen: where a spike carries it, the example bootstrap-t's own interval is several times wider)."""
    x, groups = templated_datasets(zoo, 5, 20, 0.3, 1, seed=49)
    x = x[:, x.std(axis=0) > 0]
    cl = bootstrap_edges(x, ResamplingPlan.cluster(groups, 2000, seed=1), methods=["bca"])
    ex = bootstrap_edges(x, ResamplingPlan.bootstrap(x.shape[0], 2000, seed=2))
    deff = (cl.standard_error / (x.std(axis=0, ddof=1) / np.sqrt(x.shape[0]))) ** 2
    correlated = (deff >= 1.5) & ex.reliable
    assert correlated.mean() > 0.3  # the population has icc 0.3: many edges show it
    wid = lambda iv: (iv.high - iv.low)[correlated]  # noqa: E731
    ratio = wid(cl.confidence_interval) / wid(ex.confidence_interval)
    assert np.all(ratio >= 1.0), np.sort(ratio)[:5]
    assert np.median(ratio) > 1.5
    # negative control: the former default (BCa over resampled templates) is narrower than the example bootstrap on
    # many of the edges whose means no few prompts carry; the default is narrower on none of those it should not be
    rel = lambda iv: (iv.high - iv.low)[ex.reliable]  # noqa: E731
    assert np.mean(rel(cl.intervals["bca"]) < rel(ex.confidence_interval)) > 0.1
    # and significance is not inflated: no more edges exclude 0 than under the example bootstrap
    sig = lambda iv: (iv.low > 0) | (iv.high < 0)  # noqa: E731
    assert sig(cl.confidence_interval).sum() <= sig(ex.confidence_interval).sum()
    assert sig(cl.confidence_interval).sum() < sig(cl.intervals["bca"]).sum()


# --- data-level stability under the cluster scheme: whole templates resampled ---------------------------------
def test_data_level_stability_resamples_whole_templates():
    """Oracle: templates whose prompts are identical copies; resampling whole templates must give what resampling
    the distinct rows gives (same draws at the template level); resampling the copies one by one must not."""
    from circuitstat.stats.stability_data import DataLevelEstimates, data_level_stability

    rng = np.random.default_rng(7)
    G, m, E = 40, 3, 30
    base = rng.normal(0, 1, (G, E)) + np.linspace(1.0, 0.0, E)
    dup = np.repeat(base, m, axis=0)
    groups = np.repeat(np.arange(G), m)
    est = DataLevelEstimates(*(np.full(2, v) for v in (0.5, 0.01, 0.5, 0.01, 0.4, 0.01)))
    kw = dict(ranking="absolute", seed=3, n_outer=50, n_inner=10)
    whole = data_level_stability(dup, [5, 10], est, groups=groups, **kw)
    distinct = data_level_stability(base, [5, 10], est, **kw)
    for c in ("jaccard_data_ci_low", "jaccard_data_ci_high", "jaccard_data_split", "phi_data_se"):
        np.testing.assert_allclose(whole[c], distinct[c], rtol=1e-9, atol=1e-12)
    copies = data_level_stability(dup, [5, 10], est, **kw)  # negative control: prompts treated as independent
    assert not np.allclose(copies["jaccard_data_split"], distinct["jaccard_data_split"])


def test_cluster_stability_has_data_level_intervals_with_enough_templates():
    from circuitstat.stats import circuit_stability

    rng = np.random.default_rng(8)
    x = rng.normal(0, 1, (96, 20)) + np.linspace(1.0, 0.0, 20)
    res = circuit_stability(x, ResamplingPlan.cluster(np.arange(96) // 3, 100, seed=1), [3, 5], ranking="absolute")
    assert np.isfinite(res.per_k["jaccard_data_ci_low"]).all()
    few = circuit_stability(x, ResamplingPlan.cluster(np.arange(96) // 24, 100, seed=1), [3, 5], ranking="absolute")
    assert np.isnan(few.per_k["jaccard_data_ci_low"]).all()
    why = few.params["data_level"]["reason"]
    assert "at least 32 templates" in why and "G = 4" in why


# --- the restricted wild cluster bootstrap-t (WCR), inverted into a confidence set ----------------------------
def _wcr_by_resamples(x: np.ndarray, groups: np.ndarray, w: np.ndarray, mu0: float) -> int:
    """How many weight rows give a restricted resample at least as extreme as the data at mu0, each resample
    built prompt by prompt (x* = mu0 + w_g (x - mu0)) and studentized by the matrix CR2 formula."""
    t = abs(x.mean() - mu0) / _cr2_by_matrices(x, groups)
    n = 0
    for row in w:
        xs = mu0 + row[groups] * (x - mu0)
        se = _cr2_by_matrices(xs, groups)
        ts = abs(xs.mean() - mu0) / se if se > 0 else 0.0
        # all weights equal: t* = +-t exactly (a tie, extreme); rounding decides it otherwise
        n += bool(ts >= t * (1 - 1e-9))
    return n


def test_wcr_quartics_and_their_roots_count_the_extreme_resamples():
    from circuitstat.stats.intervals.wcr import wcr_quartics, wcr_steps

    rng = np.random.default_rng(11)
    groups = np.repeat(np.arange(5), [3, 4, 2, 6, 5])
    x = rng.lognormal(size=(groups.size, 2)) + rng.normal(0, 1, (5, 2))[groups]
    cs = ClusterSums(groups)
    U = cs.residual_sums(x.T)
    se = cr2_se(U, cs)
    w = wild_weights(6, 60, seed=3)[:, :5]  # 60 random Webb rows
    coef = wcr_quartics(U / se[:, None], cs, w)
    for j in range(2):
        for tau in (-4.0, -1.3, 0.4, 2.2, 6.0):
            mu0 = x[:, j].mean() - tau * se[j]
            direct = (np.polyval(coef[j].T, tau) >= 0).sum()
            assert direct == _wcr_by_resamples(x[:, j], groups, w, mu0)
    # the root sweep's count equals the count of non-negative quartics at every tau (both root finders in use)
    wide = wild_weights(5, 7776, seed=0)
    wide = wide[~np.all(wide == wide[:, :1], axis=1)]
    coef = wcr_quartics(U / se[:, None], cs, wide)
    roots, steps, base = wcr_steps(coef)
    taus = np.linspace(0.01, 12.0, 400)
    for j in range(2):
        swept = base[j] + (np.where(roots[j][None, :] < taus[:, None], steps[j][None, :], 0.0)).sum(axis=1)
        direct = np.array([(np.polyval(coef[j].T, t) >= 0).sum() for t in taus])
        np.testing.assert_array_equal(swept, direct)
    assert (np.isfinite(roots) & (steps > 0)).any()  # quartics with several positive roots occurred


def _brute_force_set(x: np.ndarray, groups: np.ndarray, w: np.ndarray, grid: np.ndarray, need: float) -> np.ndarray:
    """The grid's mu0 that the restricted wild test does not reject (extreme count >= need): every restricted
    resample x* = mu0 + w_g (x - mu0) built in full and studentized by CR2 from its own cluster sums."""
    G, n = groups.max() + 1, x.size
    onehot = np.eye(G)[groups]  # [n, G]
    h = onehot.sum(axis=0) / n
    def t_of(xs):  # noqa: E306 -- the CR2 t of each row's mean about mu0
        u = xs - xs.mean(axis=-1, keepdims=True)
        se = np.sqrt(((u @ onehot) ** 2 / (1 - h)).sum(axis=-1)) / n
        return xs.mean(axis=-1), se
    keep = []
    for m in grid:
        xs = m + w[:, groups] * (x - m)  # [B, n]
        mean_s, se_s = t_of(xs)
        mean0, se0 = t_of(x[None, :])
        with np.errstate(divide="ignore", invalid="ignore"):
            ts = np.where(se_s > 0, np.abs(mean_s - m) / se_s, 0.0)
        t = abs(mean0[0] - m) / se0[0]
        keep.append((ts >= t * (1 - 1e-9)).sum() >= need)
    return np.array(keep)


def test_wcr_interval_is_the_set_of_mu0_a_brute_force_grid_does_not_reject():
    """Oracle: the set of mu0 whose restricted wild test, built resample by resample, does not reject at 5%;
    the interval's ends lie within one grid step of that set's ends, and the p-value inverts the interval."""
    rng = np.random.default_rng(12)
    groups = np.repeat(np.arange(4), [5, 3, 6, 4])
    x = rng.standard_t(3, (groups.size, 3)) + rng.normal(0, 0.8, (4, 3))[groups] + 0.2
    plan = ResamplingPlan.cluster(groups, 2000, seed=2)  # 6^4 = 1,296 Webb patterns: all enumerated
    res = bootstrap_edges(x, plan, method="wcr", methods=["wild_cluster_t"])
    lo, hi = res.confidence_interval.low, res.confidence_interval.high
    need = np.ceil(0.05 * plan.wild.shape[0])
    for j in range(3):
        step = (hi[j] - lo[j]) / 150
        grid = np.linspace(lo[j] - 8 * step, hi[j] + 8 * step, 167)
        keep = _brute_force_set(x[:, j], groups, plan.wild, grid, need)
        assert abs(grid[keep].min() - lo[j]) <= step and abs(grid[keep].max() - hi[j]) <= step
        # negative control: the unrestricted wild interval (the default) is not this set
        wcu = res.intervals["wild_cluster_t"]
        assert max(abs(wcu.low[j] - lo[j]), abs(wcu.high[j] - hi[j])) > 2 * step
    # the p-value at 0 inverts the interval, two-sided and one-sided
    xs = x - np.array([4.0, 0.0, -4.0])  # some edges exclude 0, some do not
    for alt in ("two-sided", "greater", "less"):
        r = bootstrap_edges(np.hstack([xs, x]), plan, method="wcr", alternative=alt)
        excl = (r.confidence_interval.low > 0) | (r.confidence_interval.high < 0)
        np.testing.assert_array_equal(excl, r.pvalue < 0.05)
        if alt == "two-sided":
            assert 0 < excl.sum() < excl.size


def test_wcr_with_two_templates_rejects_nothing():
    """With G = 2, 6 of the 36 Webb patterns (all weights equal) tie with the data at every mu0: p >= 1/6, so the
    95% set is the whole line, not a finite interval that two templates cannot support."""
    rng = np.random.default_rng(13)
    groups = np.repeat(np.arange(2), 5)
    x = rng.normal(1.0, 1.0, (10, 2))
    res = bootstrap_edges(x, ResamplingPlan.cluster(groups, 999, seed=0), method="wcr")
    assert np.all(np.isneginf(res.confidence_interval.low)) and np.all(np.isposinf(res.confidence_interval.high))
    assert np.all(res.pvalue >= 1 / 6)


def test_wcr_does_not_depend_on_the_edge_chunks_and_uses_the_cr2_se():
    rng = np.random.default_rng(14)
    groups = np.repeat(np.arange(6), 4)
    x = rng.lognormal(size=(24, 9)) + rng.normal(0, 1, (6, 9))[groups]
    plan = ResamplingPlan.cluster(groups, 999, seed=1)
    whole = bootstrap_edges(x, plan, method="wcr", methods=["cr2_t"])
    parts = bootstrap_edges(x, plan, method="wcr", chunk_size=2)
    np.testing.assert_array_equal(whole.confidence_interval.low, parts.confidence_interval.low)
    np.testing.assert_array_equal(whole.pvalue, parts.pvalue)
    cs = ClusterSums(groups)
    np.testing.assert_allclose(whole.standard_error, cr2_se(cs.residual_sums(x.T), cs), rtol=1e-12)
    # the restricted set is not symmetric about the mean (the null's residuals carry the skew), unlike cr2_t
    lo, hi, est = whole.confidence_interval.low, whole.confidence_interval.high, whole.estimate
    assert np.abs((hi - est) - (est - lo)).max() > 0.01 * (hi - lo).max()
    cr = whole.intervals["cr2_t"]
    np.testing.assert_allclose(cr.high - est, est - cr.low, rtol=1e-10)
