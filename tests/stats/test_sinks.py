"""Sink rates, output norms and their relation across heads, against numpy/scipy oracles."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from circuits.errors import InputError
from stats.resampling import ResamplingPlan
from stats.sinks import confidence_gap, position_means, quadratic_fit, sink_relation, sink_shares

NAMES = [f"a{l}.h{h}" for l in range(2) for h in range(5)]


def test_shares_and_means_over_counted_positions():
    att = np.array([[[0.9, 0.2, 0.5, 0.7]]])  # [N=1, U=1, P=4]
    pos = np.array([[False, True, True, True]])
    assert sink_shares(att, pos, 0.3)[0, 0] == pytest.approx(2 / 3)  # 0.5 and 0.7 of the counted three
    assert sink_shares(att, pos, 0.6)[0, 0] == pytest.approx(1 / 3)
    assert position_means(att, pos)[0, 0] == pytest.approx((0.2 + 0.5 + 0.7) / 3)
    with pytest.raises(InputError, match="no query position"):
        sink_shares(att, np.zeros((1, 4), bool))
    with pytest.raises(InputError, match="threshold"):
        sink_shares(att, pos, 1.5)


def test_quadratic_fit_matches_polyfit_and_is_nan_when_underdetermined():
    rng = np.random.default_rng(0)
    x, y = rng.random((4, 10)), rng.random((4, 10))
    got = quadratic_fit(x, y)
    for i in range(4):
        np.testing.assert_allclose(got[i], np.polyfit(x[i], y[i], 2)[::-1], rtol=1e-8, atol=1e-10)
    assert np.isnan(quadratic_fit(np.array([0.0, 1.0, 0.0, 1.0]), np.arange(4.0))).all()


def _convex_population(n=80, seed=0, curvature=3.0):
    rng = np.random.default_rng(seed)
    level = np.linspace(0.05, 0.95, len(NAMES))  # each head's typical sink rate
    share = np.clip(level[None] + rng.normal(0, 0.05, (n, len(NAMES))), 0, 1)
    norm = 1.0 - 1.5 * share + curvature * share**2 + rng.normal(0, 0.1, share.shape)
    return share, norm


def test_planted_convex_relation_is_found_with_its_interval():
    share, norm = _convex_population()
    r = sink_relation(share, norm, NAMES, n_resamples=999, seed=1)
    fit = r.to_pandas("sink_fit").set_index("term")
    np.testing.assert_allclose(fit.loc[["intercept", "slope", "curvature"], "estimate"],
                               np.polyfit(share.mean(0), norm.mean(0), 2)[::-1], rtol=1e-8)
    assert fit.loc["curvature", "ci_low"] < 3.0 < fit.loc["curvature", "ci_high"]
    assert fit.loc["curvature", "verdict"] == "convex"
    rho = sps.spearmanr(share.mean(0), norm.mean(0)).statistic
    assert fit.loc["spearman", "estimate"] == pytest.approx(rho)
    heads = r.to_pandas("sink_heads")
    np.testing.assert_allclose(heads["sink_rate"], share.mean(0))
    assert (heads["ci_low"] <= heads["sink_rate"]).all() and (heads["sink_rate"] <= heads["ci_high"]).all()
    assert heads["layer"].tolist()[:6] == [0, 0, 0, 0, 0, 1] and heads["head"].tolist()[5] == 0


def test_curvature_replicates_are_refits_on_resampled_prompts():
    """The BCa interval rests on refits of resampled prompts: check one resample by brute force."""
    share, norm = _convex_population(n=30, seed=2)
    plan = ResamplingPlan.bootstrap(30, 999, 3)
    from stats.sinks import _head_level

    s_b, r_b = _head_level(share, norm, plan)
    idx = plan.indices(7)
    expect = np.polyfit(share[idx].mean(0), norm[idx].mean(0), 2)[::-1]
    np.testing.assert_allclose(quadratic_fit(s_b[7], r_b[7]), expect, rtol=1e-8)


def test_linear_relation_is_not_called_convex():
    share, norm = _convex_population(curvature=0.0, seed=4)
    r = sink_relation(share, norm, NAMES, n_resamples=999, seed=5)
    fit = r.to_pandas("sink_fit").set_index("term")
    assert fit.loc["curvature", "ci_low"] < 0 < fit.loc["curvature", "ci_high"]
    assert fit.loc["spearman", "verdict"] == "decreasing"


def test_confidence_gap():
    att = np.array([[[0.0, 0.9, 0.8, 0.1, 0.2]]])
    conf = np.array([[0.5, 0.1, 0.2, 0.9, 0.8]])
    pos = np.array([[False, True, True, True, True]])
    # median of counted confidences 0.5: low = {0.1, 0.2} -> 0.85; high = {0.9, 0.8} -> 0.15
    assert confidence_gap(att, conf, pos)[0, 0] == pytest.approx(0.7)
    assert confidence_gap(att, np.full((1, 5), 0.3), pos)[0, 0] == 0.0  # no contrast when all tie


def test_input_errors():
    share, norm = _convex_population(n=10)
    with pytest.raises(InputError, match="must both be"):
        sink_relation(share, norm[:, :3], NAMES, seed=0)
    bad = norm.copy()
    bad[0, 0] = np.nan
    with pytest.raises(InputError, match="NaN"):
        sink_relation(share, bad, NAMES, seed=0)


def test_sink_stability_matches_heads_by_rank_and_uses_a_seed_t_interval():
    from stats.sinks import sink_stability

    rng = np.random.default_rng(1)
    K, L, H = 5, 2, 4
    rates = rng.uniform(0.0, 0.1, (K, L, H))
    sink_rate = 0.6 + rng.normal(0, 0.03, K)
    rates[np.arange(K), 1, rng.integers(0, H, K)] = sink_rate  # the sink is a different head index per seed
    t = sink_stability(rates, spearman=np.array([0.2, 0.5, 0.1, 0.3, -0.4]), curvature=np.array([-1, -2, 3, -1, -5]))
    rows = {(int(layer), item): i for i, (layer, item) in enumerate(zip(t["layer"], t["item"]))}
    i = rows[(1, "rank 1 sink rate")]
    lo, hi = sps.t.interval(0.95, K - 1, loc=sink_rate.mean(), scale=sps.sem(sink_rate))
    assert t["value"][i] == pytest.approx(sink_rate.mean())
    assert (t["ci_low"][i], t["ci_high"][i]) == pytest.approx((lo, hi))
    j = rows[(1, "heads with sink rate >= 0.3")]
    assert t["value"][j] == 1.0 and t["sd"][j] == 0.0
    assert t["value"][rows[(0, "heads with sink rate >= 0.3")]] == 0.0
    k = rows[(-1, "share of seeds with convex fit (curvature > 0)")]
    assert t["value"][k] == pytest.approx(0.2)
    # Clopper-Pearson by its definition: beta quantiles of 1 success in 5
    assert t["ci_low"][k] == pytest.approx(sps.beta.ppf(0.025, 1, 5))
    assert t["ci_high"][k] == pytest.approx(sps.beta.ppf(0.975, 2, 4))


@pytest.mark.slow
def test_curvature_interval_covers_the_population_curvature():
    """300 datasets of N = 48 prompts from a finite population of 8 heads (skewed norms, heteroscedastic shares)."""
    rng = np.random.default_rng(7)
    n_pop, n, reps, U = 20000, 48, 300, 8
    level = np.array([0.0, 0.02, 0.05, 0.1, 0.2, 0.35, 0.6, 0.8])
    share = np.clip(level[None] + rng.normal(0, 0.08, (n_pop, U)) * (level[None] + 0.05) * 3, 0, 1)
    norm = 8 - 6 * share + 9 * share**2 + rng.gamma(2, 0.8, (n_pop, U)) - 1.6
    truth = quadratic_fit(share.mean(0), norm.mean(0))[2]  # the estimand: heads fixed, prompts from the population
    names = [f"a0.h{h}" for h in range(U)]
    hits = 0
    for rep in range(reps):
        idx = rng.integers(0, n_pop, n)
        fit = sink_relation(share[idx], norm[idx], names, n_resamples=999, seed=rep).fit["curvature"]
        hits += fit["ci_low"] <= truth <= fit["ci_high"]
    assert 0.90 <= hits / reps <= 0.99, hits / reps
