"""J_{N/2} from disjoint halves (circuitstat.stats.stability_halves) and the gap bound (circuitstat.stats.flip_bound).

Exactness of the split average against brute force on tiny cases, coverage of the jackknife interval bounded
from both sides on a fast synthetic population (not one the rule was chosen on: bench/halves_coverage.py), its
asymmetry on a skewed case against the simulated distribution of the estimator, no zero-width interval over a
grid of inputs, negative controls (the naive SD over splits; the symmetric interval, which misses one-sidedly on
the skewed case; the interval without the gap bound), and the gap bound against a direct evaluation of its formula.
"""

import itertools

import numpy as np
import pytest
from scipy.stats import norm, skew
from scipy.stats import t as student_t

from circuitstat.stats.flip_bound import flip_pair_sums, jaccard_gap_floor
from circuitstat.stats.populations import spiky_population
from circuitstat.stats.stability_halves import (MIN_EVENTS, half_interval, halves_from_tops, halves_stability,
                                                half_split_rows, pair_jaccard)


def _top(means: np.ndarray, k: int) -> frozenset:
    return frozenset(np.argsort(-np.abs(means), kind="stable")[:k].tolist())


def _jac(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b)


def _all_splits_average(X: np.ndarray, k: int) -> float:
    """Brute force: mean Jaccard of the halves' top-k over every split of the rows into two equal halves."""
    n = X.shape[0]
    vals = [_jac(_top(X[list(a)].mean(0), k), _top(X[[i for i in range(n) if i not in a]].mean(0), k))
            for a in itertools.combinations(range(n), n // 2)]
    return float(np.mean(vals))


def test_pair_jaccard_matches_sets():
    rng = np.random.default_rng(0)
    a = np.array([rng.choice(30, 6, replace=False) for _ in range(50)])
    b = np.array([rng.choice(30, 6, replace=False) for _ in range(50)])
    want = [_jac(frozenset(x), frozenset(y)) for x, y in zip(a.tolist(), b.tolist())]
    np.testing.assert_allclose(pair_jaccard(a, b), want, rtol=0, atol=1e-15)


def test_split_average_is_exactly_unbiased_for_j_half_on_a_tiny_population():
    # population of 3 prompts, datasets of N = 4 drawn with replacement: every dataset (81, equally likely)
    # and every pair of independent size-2 datasets (81 x ... ) enumerated; E[split average] must equal J_2
    rng = np.random.default_rng(3)
    pop = rng.normal(size=(3, 6)) * np.array([3, 2.5, 2, 1.5, 1, 0.5])
    k = 2
    halves = list(itertools.product(range(3), repeat=2))
    j2 = np.mean([_jac(_top(pop[list(a)].mean(0), k), _top(pop[list(b)].mean(0), k))
                  for a in halves for b in halves])
    datasets = list(itertools.product(range(3), repeat=4))
    e_split = np.mean([_all_splits_average(pop[list(d)], k) for d in datasets])
    assert e_split == pytest.approx(j2, abs=1e-12)
    # negative control: the plug-in Jaccard of two halves drawn with replacement from one dataset is biased
    plug = np.mean([np.mean([_jac(_top(pop[[d[i] for i in a]].mean(0), k), _top(pop[[d[i] for i in b]].mean(0), k))
                             for a in itertools.product(range(4), repeat=2)
                             for b in itertools.product(range(4), repeat=2)]) for d in datasets])
    assert abs(plug - j2) > 0.01


def test_random_splits_estimate_the_all_splits_average_within_their_monte_carlo_error():
    rng = np.random.default_rng(5)
    X = rng.standard_t(3, size=(12, 20)) + np.linspace(1.5, 0, 20)
    exact = _all_splits_average(X, 4)
    out = halves_stability(X, [4], ranking="absolute", seed=11, n_batches=8, perms_per_batch=100)
    assert out["jaccard_half_mc_se"][0] > 0
    assert abs(out["jaccard_half"][0] - exact) <= 4 * out["jaccard_half_mc_se"][0]
    assert out["jaccard_half_units"][0] == 6


def test_half_split_rows_are_disjoint_equal_halves_and_blocks_are_removed():
    rng = np.random.default_rng(0)
    blocks = np.arange(11) % 4
    rows = half_split_rows(11, 5, blocks, rng).reshape(5, 5, 2, 11)
    assert (rows[:, 0, 0] * rows[:, 0, 1]).sum() == 0  # disjoint
    assert (rows[:, 0].sum(axis=2) == 5).all()  # floor(11 / 2) each, one unit sits out
    for g in range(4):
        np.testing.assert_array_equal(rows[:, g + 1], rows[:, 0] * (blocks != g))


def test_cluster_plan_halves_whole_templates():
    rng = np.random.default_rng(2)
    base = rng.normal(size=(40, 30)) + np.linspace(1, 0, 30)
    dup = np.repeat(base, 3, axis=0)  # each template three identical prompts
    groups = np.repeat(np.arange(40), 3)
    whole = halves_stability(dup, [5], ranking="absolute", seed=1, groups=groups)
    distinct = halves_stability(base, [5], ranking="absolute", seed=1)
    # with whole templates the halves see the same means as halving the 40 distinct prompts
    assert whole["jaccard_half"][0] == pytest.approx(distinct["jaccard_half"][0], abs=1e-12)
    assert whole["jaccard_half_units"][0] == 20
    # negative control: copies treated as independent land on both sides and inflate the agreement
    copies = halves_stability(dup, [5], ranking="absolute", seed=1)
    assert copies["jaccard_half"][0] > whole["jaccard_half"][0] + 0.05


def _population(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n_pop, n_edges = 3000, 40
    effects = 1.2 * np.exp(-np.arange(n_edges) / 6.0)
    noise = rng.standard_t(4, size=(n_pop, n_edges)) * rng.uniform(0.8, 2.0, n_edges)
    return effects + noise


def test_jackknife_interval_covers_j_half_and_is_not_uselessly_wide():
    pop = _population(404)
    n, k, n_datasets = 64, 5, 150
    rng = np.random.default_rng(1)
    a = pop[rng.integers(0, pop.shape[0], (20000, n // 2))].mean(axis=1)
    b = pop[rng.integers(0, pop.shape[0], (20000, n // 2))].mean(axis=1)
    top_a, top_b = (np.argsort(-np.abs(m), axis=1)[:, :k] for m in (a, b))
    truth = pair_jaccard(top_a, top_b).mean()
    est, lo, hi, mc = (np.empty(n_datasets) for _ in range(4))
    for d in range(n_datasets):
        out = halves_stability(pop[rng.integers(0, pop.shape[0], n)], [k], ranking="absolute", seed=100 + d)
        est[d], lo[d], hi[d], mc[d] = (out[c][0] for c in ("jaccard_half", "jaccard_half_ci_low",
                                                          "jaccard_half_ci_high", "jaccard_half_mc_se"))
    cover = np.mean((lo <= truth) & (truth <= hi))
    correct = 2 * 1.96 * est.std(ddof=1)  # a correct normal interval's width for this estimator
    ratio = np.median(hi - lo) / correct
    assert abs(est.mean() - truth) < 3 * est.std(ddof=1) / np.sqrt(n_datasets) + 0.005  # unbiased
    assert 0.92 <= cover <= 0.995, cover  # 0.973 measured; an interval that never misses is too wide
    assert 0.8 <= ratio <= 1.5, ratio  # neither too narrow nor uselessly wide (1.15 measured)
    assert (hi - lo > 0).all()
    # negative control: the naive SD over splits (Monte Carlo error of the split average) undercovers badly
    naive = np.mean((est - 1.96 * mc <= truth) & (truth <= est + 1.96 * mc))
    assert naive < 0.5, naive


def test_no_zero_width_interval_where_every_split_agrees_and_the_gap_bound_is_what_prevents_it():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 30)) * 0.1 + np.r_[np.full(3, 10.0), np.zeros(27)]
    out = halves_stability(X, [3], ranking="absolute", seed=2)
    assert out["jaccard_half"][0] == 1.0 and out["jaccard_half_se"][0] == 0.0
    assert out["jaccard_half_ci_low"][0] < out["jaccard_half_ci_high"][0] == 1.0
    assert out["jaccard_half_ci_low"][0] == out["jaccard_half_floor"][0]
    # negative control: the jackknife alone has zero spread here
    tops = np.tile(np.arange(3), ((16 + 1) * 2 * 64, 1))
    r = halves_from_tops(tops, 64, 16, 8)
    assert r["se"] == 0.0 and r["events"] == 0


def test_the_gap_bound_is_computed_only_where_no_split_disagrees():
    rng = np.random.default_rng(3)
    X = rng.standard_t(3, size=(64, 40)) + np.linspace(1.5, 0, 40)  # no clear cut-off: splits disagree
    out = halves_stability(X, [5, 10], ranking="absolute", seed=4)
    assert np.isnan(out["jaccard_half_floor"]).all()
    assert (out["jaccard_half_se"] > 0).all()


@pytest.mark.parametrize("events", [0, 1, 5, MIN_EVENTS - 1, MIN_EVENTS, 64])
def test_no_interval_has_zero_width_and_each_contains_its_estimate(events):
    # the estimate at and near both bounds, with and without spread, a floor above and below it
    for est in (0.0, 1e-9, 0.05, 0.5, 2 / 3, 0.97, 1 - 1e-9, 1.0):
        for se in (0.0, 1e-12, 1e-4, 0.05, 0.6):
            for floor in (0.0, 0.5, 1 - np.finfo(float).eps):
                lo, hi = half_interval(est, se, events, floor, 0.95)
                assert 0.0 <= lo < hi <= 1.0, (est, se, events, floor, lo, hi)
                assert lo <= est <= hi, (est, se, events, floor, lo, hi)


def test_an_interval_without_the_gap_bound_where_no_split_disagrees_is_refused():
    with pytest.raises(ValueError, match="gap bound"):
        half_interval(1.0, 0.0, 0, float("nan"), 0.95)  # would be [1, 1]
    lo, hi = half_interval(0.5, 0.1, 5, float("nan"), 0.95)  # the bound is not read where splits disagree
    assert lo < 0.5 < hi


def test_the_interval_is_symmetric_on_the_arcsine_scale_with_the_stated_critical_value():
    g = lambda j: np.arcsin(np.sqrt(j))  # noqa: E731
    est, se = 0.3, 0.04
    slope = 1 / (2 * np.sqrt(est * (1 - est)))  # d asin(sqrt(J)) / dJ: the delta method's factor
    cases = ((MIN_EVENTS, norm.ppf(0.975)), (64, norm.ppf(0.975)),
             (MIN_EVENTS - 1, student_t.ppf(0.975, MIN_EVENTS - 2)), (4, student_t.ppf(0.975, 3)),
             (1, student_t.ppf(0.975, 1)))
    for events, q in cases:
        lo, hi = half_interval(est, se, events, 0.0, 0.95)
        if events > 1:  # unclipped: the two arms are equal on the arcsine scale, each q se slope
            assert g(hi) - g(est) == pytest.approx(g(est) - g(lo), rel=1e-10)
            assert (g(hi) - g(lo)) / 2 == pytest.approx(q * se * slope, rel=1e-10)
        assert hi - est > est - lo  # below 1/2 the arm toward 1/2 is the longer one
    # fewer disagreeing splits, a wider interval for the same se
    widths = [np.subtract(*half_interval(est, se, e, 0.0, 0.95)[::-1]) for e in (2, 5, 10, MIN_EVENTS)]
    assert all(a > b for a, b in zip(widths, widths[1:]))


def test_on_a_right_skewed_case_the_interval_leans_up_and_the_symmetric_one_misses_one_sidedly():
    # small J_{N/2} (top-5 of 60 heavy-tailed edges, halves of 16 prompts): not a population the rule was chosen on
    pop = spiky_population(2000, 60, seed=21)
    n, k, n_datasets = 32, 5, 200
    rng = np.random.default_rng(21)
    a = pop[rng.integers(0, pop.shape[0], (10000, n // 2))].mean(axis=1)
    b = pop[rng.integers(0, pop.shape[0], (10000, n // 2))].mean(axis=1)
    truth = pair_jaccard(np.argsort(-np.abs(a), 1)[:, :k], np.argsort(-np.abs(b), 1)[:, :k]).mean()
    est, lo, hi, se = (np.empty(n_datasets) for _ in range(4))
    for d in range(n_datasets):
        out = halves_stability(pop[rng.integers(0, pop.shape[0], n)], [k], ranking="absolute", seed=d)
        est[d], lo[d], hi[d], se[d] = (out[c][0] for c in ("jaccard_half", "jaccard_half_ci_low",
                                                          "jaccard_half_ci_high", "jaccard_half_se"))
    # the oracle: the simulated distribution of the estimator is right-skewed (a long upper tail)
    assert truth < 0.3 and skew(est) > 0.5, (truth, skew(est))
    assert np.mean(hi - est > est - lo) > 0.95  # the interval's longer arm points the same way
    above, below = np.sum(truth > hi), np.sum(truth < lo)
    assert 0.93 <= 1 - (above + below) / n_datasets <= 0.995 + 1e-12, (above, below)
    assert above <= 3, (above, below)
    # negative control: the symmetric T -+ 1.96 se misses on one side, with the truth above it
    s_above, s_below = np.sum(truth > est + 1.96 * se), np.sum(truth < est - 1.96 * se)
    assert s_above >= 6 and s_above >= 3 * s_below, (s_above, s_below)


def test_flip_pair_sums_match_the_formula_pair_by_pair():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(40, 8)) + np.array([2.0, -1.5, 1.2, 0.9, -0.5, 0.3, 0.1, 0.0])
    order = np.argsort(-np.abs(X.mean(0)), kind="stable")
    ks, m, z = np.array([2, 3]), 20, norm.ppf(0.95)
    mean, sign = X.mean(0), np.sign(X.mean(0))
    want = []
    for k in ks:
        total = 0.0
        for t in order[:k]:
            for u in order[k:]:
                d = sign[t] * X[:, t] - sign[u] * X[:, u]
                sd = d.std(ddof=1)
                gap = abs(mean[t]) - abs(mean[u])
                total += norm.cdf(-(gap - z * sd / np.sqrt(40)) / (sd / np.sqrt(m)))
        want.append(total)
    np.testing.assert_allclose(flip_pair_sums(X, order, ks, m, "absolute", 0.95), want, rtol=1e-10)


def test_gap_floor_is_a_valid_lower_bound_and_tightens_with_the_gap():
    rng = np.random.default_rng(9)
    for gap, want_above in ((3.0, 0.9), (0.3, None)):
        pop = rng.normal(size=(4000, 20)) + np.r_[np.full(4, 1.0 + gap), np.linspace(1.0, 0, 16)]
        n, k = 64, 4
        a = pop[rng.integers(0, 4000, (5000, n // 2))].mean(axis=1)
        b = pop[rng.integers(0, 4000, (5000, n // 2))].mean(axis=1)
        truth = pair_jaccard(np.argsort(-np.abs(a), 1)[:, :k], np.argsort(-np.abs(b), 1)[:, :k]).mean()
        floors = []
        for _ in range(40):
            X = pop[rng.integers(0, 4000, n)]
            order = np.argsort(-np.abs(X.mean(0)), kind="stable")
            floors.append(jaccard_gap_floor(X, order, np.array([k]), n // 2, "absolute", 0.95)[0])
        floors = np.array(floors)
        assert np.mean(floors <= truth) >= 0.95, (gap, truth, floors)
        assert (floors < 1).all()
        if want_above is not None:
            assert np.median(floors) > want_above  # a clear gap gives a tight bound, not a vacuous one


def test_a_stratified_plan_halves_every_stratum():
    rng = np.random.default_rng(4)
    strata = np.r_[np.zeros(10, dtype=np.int64), np.ones(31, dtype=np.int64)]
    blocks = np.arange(41) % 8
    rows = half_split_rows(41, 20, blocks, rng, strata).reshape(20, 9, 2, 41)[:, 0]
    for s, want in ((0, 5), (1, 15)):  # floor(n_s / 2) of each stratum in each half (31: one sits out)
        assert (rows[:, :, strata == s].sum(axis=2) == want).all()
    X = rng.normal(size=(41, 12)) + np.linspace(1, 0, 12)
    out = halves_stability(X, [3], ranking="absolute", seed=0, strata=strata)
    assert out["jaccard_half_units"][0] == 20 and 0 <= out["jaccard_half_ci_low"][0] < out["jaccard_half_ci_high"][0]
