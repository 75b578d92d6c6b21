"""Sink rates, output norms and their relation across heads, against numpy/scipy oracles."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from circuitstat.core.errors import InputError
from circuitstat.stats.resampling import ResamplingPlan
from circuitstat.stats.sinks import confidence_gap, position_means, quadratic_fit, sink_relation, sink_shares

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
    from circuitstat.stats.sinks import _head_level

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
    from circuitstat.stats.sinks import sink_stability

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
    c = rows[(-1, "curvature of the quadratic fit (norm on sink rate)")]
    curv = np.array([-1, -2, 3, -1, -5], dtype=float)
    assert (t["value"][c], t["ci_low"][c], t["ci_high"][c]) == pytest.approx(
        (curv.mean(), *sps.t.interval(0.95, K - 1, loc=curv.mean(), scale=sps.sem(curv))))
    assert "training seeds" in t["estimand"][c] and "rank" not in t["estimand"][c]  # a per-seed fit, no head matching
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


# --- sink heads across seeds, matched by attention pattern (circuitstat.stats.sink_matching) -------------------
def _causal_patterns(rng, n_layers, n_heads, n_prompts, length, sink_heads=()):
    """Return random causal softmax patterns [L, H, P, T, T]; heads in ``sink_heads`` (layer, head) sink to token 0."""
    logits = rng.normal(scale=2.0, size=(n_layers, n_heads, n_prompts, length, length))
    logits[..., 0] -= 4.0  # ordinary heads hardly attend to the first token
    for layer, head in sink_heads:
        logits[layer, head, :, :, 0] += 8.0
    logits = np.where(np.tril(np.ones((length, length), bool)), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def _permuted_seeds(n_seeds, base, rng):
    """Return (patterns per seed, perms): seed k's head j is base head perms[k][l, j] in layer l."""
    L, H = base.shape[:2]
    perms = [np.stack([rng.permutation(H) for _ in range(L)]) for _ in range(n_seeds)]
    seeds = [np.stack([base[layer, perm[layer]] for layer in range(L)]) + rng.normal(scale=1e-3, size=base.shape)
             for perm in perms]
    return seeds, perms


def _rates_from(patterns, threshold=0.3):
    """Return [L, H] sink rates: share of positions after the first with attention to token 0 above threshold."""
    return (patterns[..., 1:, 0] > threshold).mean((-1, -2))


def test_pattern_matching_recovers_permuted_heads_and_a_planted_sink_agrees_perfectly():
    from circuitstat.stats.sink_matching import pattern_matchings, sink_matching

    rng = np.random.default_rng(5)
    K, L, H = 4, 2, 5
    base = _causal_patterns(rng, L, H, n_prompts=6, length=8, sink_heads=[(1, 2)])
    seeds, perms = _permuted_seeds(K, base, rng)
    match, score = pattern_matchings(seeds)  # BOS column dropped: matched on where else the heads attend
    for a in range(K):
        for b in range(K):
            if a != b:
                for layer in range(L):  # head h of a is base perms[a][h]; that base head sits at argsort(perms[b])
                    np.testing.assert_array_equal(match[a, b, layer], np.argsort(perms[b][layer])[perms[a][layer]])
    assert np.nanmin(score) > 0.99
    rates = np.stack([_rates_from(s) for s in seeds])
    assert ((rates[:, 1] >= 0.3).sum(-1) == 1).all() and (rates[:, 0] < 0.3).all()  # one sink per seed, in layer 1
    t = sink_matching(rates, match, sink_bar=0.3)
    row = {(layer, item): i for i, (layer, item) in enumerate(zip(t["layer"], t["item"]))}
    for item in ("sink-head Jaccard", "share of sink heads matched to a sink"):
        for layer in (1, -1):  # layer 0 has no sink: pooled over layers it is layer 1's
            i = row[(layer, item)]
            assert t["value"][i] == 1.0 and t["null"][i] == pytest.approx(1 / H)  # one sink among H: chance 1/H
            assert t["excess"][i] == pytest.approx(1 - 1 / H) and t["verdict"][i] == "stable"
            assert t["n_pairs"][i] == K * (K - 1) and t["n_pairs_undefined"][i] == 0
        i = row[(0, item)]  # no sink head in any seed: undefined, counted, never dropped
        assert np.isnan(t["value"][i]) and t["verdict"][i] == "undefined" and t["n_pairs_undefined"][i] == K * (K - 1)
    i = row[(1, "mean |sink-rate difference|")]
    assert t["value"][i] < 0.01 and t["excess"][i] > 0.1 and t["verdict"][i] == "stable"
    assert set(t["estimand"]) == {t["estimand"][0]} and "jackknife" in t["estimand"][0]


def test_sinks_at_unrelated_heads_are_not_called_stable():
    from circuitstat.stats.sink_matching import pattern_matchings, sink_matching

    rng = np.random.default_rng(6)
    K, L, H = 4, 1, 4
    seeds, perms = _permuted_seeds(K, _causal_patterns(rng, L, H, 6, 8), rng)
    match, _ = pattern_matchings(seeds)
    # seed k's sink is the head holding base head k: the matched partner of a sink is never a sink
    rates = np.zeros((K, L, H))
    for k in range(K):
        rates[k, 0, np.argsort(perms[k][0])[k]] = 0.8
    t = sink_matching(rates, match, sink_bar=0.3)
    share = {item: i for i, (layer, item) in enumerate(zip(t["layer"], t["item"])) if layer == 0}
    i = share["share of sink heads matched to a sink"]
    assert t["value"][i] == 0.0 and t["null"][i] == pytest.approx(1 / H) and t["verdict"][i] != "stable"
    assert t["verdict"][share["sink-head Jaccard"]] != "stable"
    # random sink heads (independent of the patterns) over many seeds: the excess interval covers 0
    K = 8
    seeds, _ = _permuted_seeds(K, _causal_patterns(rng, L, H, 6, 8), rng)
    match, _ = pattern_matchings(seeds)
    rates = np.zeros((K, L, H))
    rates[np.arange(K), 0, rng.integers(0, H, K)] = 0.8
    t = sink_matching(rates, match, sink_bar=0.3)
    for i in np.flatnonzero(t["layer"] == 0):
        assert t["excess_ci_low"][i] < 0 < t["excess_ci_high"][i] and t["verdict"][i] == "inconclusive"


def test_random_matching_null_is_the_mean_over_every_one_to_one_matching():
    """Oracle: enumerate all H!^L matchings of two layers and average each statistic."""
    import itertools

    from circuitstat.stats.sink_matching import ITEMS, sink_pair_statistics

    rng = np.random.default_rng(7)
    L, H = 2, 4
    rates = rng.random((2, L, H)) * 0.6  # some heads above the 0.3 bar, a varying number per layer and seed
    rates[0, 0, :3] = [0.5, 0.4, 0.35]
    every = list(itertools.permutations(range(H)))
    values = {item: [] for item in ITEMS}
    for p0 in every:
        for p1 in every:
            match = np.full((2, 2, L, H), -1)
            match[0, 1] = [p0, p1]
            match[1, 0] = [np.argsort(p0), np.argsort(p1)]
            stats = sink_pair_statistics(rates, match, 0.3)
            for item in ITEMS:
                values[item].append(stats[item][0][0, 1])
    stats = sink_pair_statistics(rates, match, 0.3)
    for item in ITEMS:
        np.testing.assert_allclose(stats[item][1][0, 1], np.mean(values[item], axis=0), rtol=1e-12, err_msg=item)
        assert np.isnan(stats[item][0][0, 0]).all()


def test_matching_statistics_by_hand_and_input_errors():
    from circuitstat.stats.sink_matching import pattern_matchings, sink_matching, sink_pair_statistics

    rates = np.array([[[0.9, 0.5, 0.0]], [[0.0, 0.8, 0.2]], [[0.4, 0.0, 0.6]]])  # [K=3, L=1, H=3]
    match = np.full((3, 3, 1, 3), -1)
    match[0, 1, 0] = [1, 0, 2]  # a0.h0 -> h1 (sink), a0.h1 -> h0 (not), a0.h2 -> h2
    match[1, 0, 0] = [1, 0, 2]
    for a, b in ((0, 2), (2, 0), (1, 2), (2, 1)):
        match[a, b, 0] = [0, 1, 2]
    s = sink_pair_statistics(rates, match, 0.3)
    # seeds 0 -> 1: sinks {0, 1} map to {1, 0}; seed 1's sinks {1}: one of two matched to a sink
    assert s["share of sink heads matched to a sink"][0][0, 1, 0] == 0.5
    assert s["sink-head Jaccard"][0][0, 1, 0] == pytest.approx(1 / 2)  # {1, 0} vs {1}
    assert s["mean |sink-rate difference|"][0][0, 1, 0] == pytest.approx((0.1 + 0.5 + 0.2) / 3)
    assert s["mean |sink-rate difference|"][1][0, 1, 0] == pytest.approx(np.abs(rates[0, 0][:, None]
                                                                             - rates[1, 0][None]).mean())
    t = sink_matching(rates, match, sink_bar=0.3)
    i = list(t["item"]).index("sink-head Jaccard")
    off = ~np.eye(3, dtype=bool)
    assert t["value"][i] == pytest.approx(s["sink-head Jaccard"][0][off][:, 0].mean())
    with pytest.raises(InputError, match="one-to-one"):
        bad = match.copy()
        bad[0, 1, 0] = [1, 1, 2]
        sink_pair_statistics(rates, bad, 0.3)
    with pytest.raises(InputError, match="at least 2 seeds"):
        pattern_matchings([np.zeros((1, 3, 2, 4, 4))])
    with pytest.raises(InputError, match="mask"):
        pattern_matchings([np.zeros((1, 3, 2, 4, 4))] * 2, mask=np.ones((2, 5), bool))


@pytest.mark.slow
def test_sink_matching_interval_covers_the_seed_population_mean():
    """Seeds drawn from one population of heads (each head's sink rate = its identity's mean + noise, heads shuffled
    within each layer, matching known): the jackknife-over-seeds interval of K = 5 seeds covers the mean over pairs
    of independent seeds. Measured: 0.937-0.967 over the four rows (300 datasets; truth from 2000 seed pairs)."""
    from circuitstat.stats.sink_matching import ITEMS, sink_matching, sink_pair_statistics

    rng = np.random.default_rng(0)
    L, H = 2, 4
    mu = np.array([[0.05, 0.02, 0.1, 0.01], [0.6, 0.35, 0.25, 0.05]])  # layer 1: one sure sink, one borderline

    def draw(K):
        perms = np.stack([[rng.permutation(H) for _ in range(L)] for _ in range(K)])
        rates = np.take_along_axis(np.clip(mu[None] + rng.normal(scale=0.12, size=(K, L, H)), 0, 1), perms, -1)
        match = np.full((K, K, L, H), -1)
        for a in range(K):
            for b in range(K):
                if a != b:
                    match[a, b] = np.argsort(perms[b], -1)[np.arange(L)[:, None], perms[a]]
        return rates, match

    pairs = [sink_pair_statistics(*draw(2), 0.3) for _ in range(2000)]
    truth = {item: np.nanmean([p[item][0][0, 1] for p in pairs], axis=0) for item in ITEMS}
    rows = [(1, ITEMS[0]), (1, ITEMS[1]), (0, ITEMS[2]), (1, ITEMS[2])]
    hits = np.zeros(len(rows))
    n = 300
    for _ in range(n):
        t = sink_matching(*draw(5), sink_bar=0.3)
        index = {(layer, item): i for i, (layer, item) in enumerate(zip(t["layer"], t["item"]))}
        for j, (layer, item) in enumerate(rows):
            i = index[(layer, item)]
            hits[j] += t["ci_low"][i] <= truth[item][layer] <= t["ci_high"][i]
    coverage = hits / n
    assert ((coverage >= 0.87) & (coverage <= 0.99)).all(), coverage
