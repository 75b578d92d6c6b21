"""J_{N/2} from disjoint halves (circuitstat.stats.stability_halves) and the gap bound (circuitstat.stats.flip_bound).

Exactness of the split average against brute force on tiny cases, the bootstrap SE against the true SD and
the coverage of its interval bounded from both sides on a fast synthetic population (not one the rule was
chosen on: bench/halves_coverage.py), the Monte Carlo shares of the corrected bootstrap variance, its
asymmetry on a skewed case against the simulated distribution of the estimator, no zero-width interval over a
grid of inputs, negative controls (the naive SD over splits; the bootstrap variance without its bias term; the
Monte Carlo shares left in; a symmetric interval, which misses one-sidedly on the skewed case; the interval
without the gap bound), and the gap bound against a direct evaluation of its formula.
"""

import itertools

import numpy as np
import pytest
from scipy.stats import norm, skew
from scipy.stats import t as student_t

from circuitstat.stats.flip_bound import flip_pair_sums, jaccard_gap_floor
from circuitstat.stats.populations import spiky_population
from circuitstat.stats.stability_halves import (MIN_DF, MIN_EVENTS, HalvesLayout, bootstrap_positions,
                                                corrected_bootstrap_variance, half_interval, halves_from_tops,
                                                halves_plan_rows, halves_stability, half_split_rows, pair_jaccard)


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
    out = halves_stability(X, [4], ranking="absolute", seed=11, layout=HalvesLayout(n_splits=800))
    assert out["jaccard_half_mc_se"][0] > 0
    assert abs(out["jaccard_half"][0] - exact) <= 4 * out["jaccard_half_mc_se"][0]
    assert out["jaccard_half_units"][0] == 6


def test_half_split_rows_are_disjoint_equal_halves():
    rng = np.random.default_rng(0)
    rows = half_split_rows(np.arange(11), 11, 5, rng).reshape(5, 2, 11)
    assert (rows[:, 0] * rows[:, 1]).sum() == 0  # disjoint
    assert (rows.sum(axis=2) == 5).all()  # floor(11 / 2) each, one unit sits out


def test_resampled_positions_are_split_not_their_units():
    # a resample that drew unit 3 at every position: both halves are made of unit 3 (independent draws from the
    # data may coincide), each half has N/2 draws
    rng = np.random.default_rng(1)
    rows = half_split_rows(np.full((1, 8), 3), 8, 4, rng).reshape(4, 2, 8)
    assert (rows[:, :, 3] == 4).all() and rows.sum() == 4 * 8


def test_bootstrap_positions_draw_from_their_own_row_and_stratum():
    rng = np.random.default_rng(2)
    strata = np.r_[np.zeros(5, dtype=np.int64), np.ones(7, dtype=np.int64)]
    outer = bootstrap_positions(np.arange(12), 300, rng, strata)
    assert outer.shape == (300, 12)
    assert (outer[:, :5] < 5).all() and (outer[:, 5:] >= 5).all()  # every resample keeps the stratum sizes
    # each unit of a stratum is drawn at rate 1 / n_s (binomial SE about 0.0036 and 0.0027)
    assert abs(np.mean(outer[:, :5] == 0) - 1 / 5) < 0.02 and abs(np.mean(outer[:, 5:] == 11) - 1 / 7) < 0.015
    inner = bootstrap_positions(outer[:3], 50, rng, strata)
    for r in range(3):  # second-level resamples draw only units that their first-level resample holds
        assert set(inner[r * 50:(r + 1) * 50].ravel()) <= set(outer[r].tolist())


def test_the_plan_starts_with_the_data_splits_and_has_the_layout_rows():
    layout = HalvesLayout(n_splits=6, n_boot=3, boot_splits=2, n_inner=2, inner_splits=2)
    rows = halves_plan_rows(10, layout, seed=4)
    assert rows.shape == (2 * sum(layout.sizes()), 10)
    assert set(np.unique(rows[:12])) <= {0, 1} and (rows[:12].sum(axis=1) == 5).all()
    assert (rows.sum(axis=1) == 5).all()  # every half of every resample has N/2 draws
    np.testing.assert_array_equal(rows, halves_plan_rows(10, layout, seed=4))  # the seed fixes everything


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


def _split_jaccards(X: np.ndarray, k: int, seed: int, layout: HalvesLayout) -> np.ndarray:
    """Independent path: every pair of halves of halves_stability's plan, top-k by numpy's argsort of the means."""
    rows = halves_plan_rows(X.shape[0], layout, seed)
    top = np.argsort(-np.abs(rows @ X), axis=1, kind="stable")[:, :k].reshape(-1, 2, k)
    return pair_jaccard(top[:, 0], top[:, 1])


def test_bootstrap_se_matches_the_true_sd_and_the_interval_covers_without_being_uselessly_wide():
    # not a population the rule was chosen on (bench/halves_coverage.py); truth by simulation from the population
    pop = _population(404)
    n, k, n_datasets = 64, 5, 150
    rng = np.random.default_rng(1)
    a = pop[rng.integers(0, pop.shape[0], (20000, n // 2))].mean(axis=1)
    b = pop[rng.integers(0, pop.shape[0], (20000, n // 2))].mean(axis=1)
    top_a, top_b = (np.argsort(-np.abs(m), axis=1)[:, :k] for m in (a, b))
    truth = pair_jaccard(top_a, top_b).mean()
    layout = HalvesLayout()
    n_s, n_1, _ = layout.sizes()
    est, lo, hi, mc, se, v_plain, v_corr = (np.empty(n_datasets) for _ in range(7))
    for d in range(n_datasets):
        X = pop[rng.integers(0, pop.shape[0], n)]
        out = halves_stability(X, [k], ranking="absolute", seed=100 + d)
        est[d], lo[d], hi[d], mc[d], se[d] = (out[c][0] for c in ("jaccard_half", "jaccard_half_ci_low",
                                                                  "jaccard_half_ci_high", "jaccard_half_mc_se",
                                                                  "jaccard_half_se"))
        j = _split_jaccards(X, k, 100 + d, layout)
        assert j[:n_s].mean() == pytest.approx(est[d], abs=1e-12)  # the same splits on the independent path
        outer = j[n_s:n_s + n_1].reshape(layout.n_boot, layout.boot_splits)
        v_plain[d] = outer.mean(axis=1).var(ddof=1) - outer.var(axis=1, ddof=1).mean() / layout.boot_splits
        v_corr[d] = corrected_bootstrap_variance(outer, j[n_s + n_1:].reshape(layout.n_boot, layout.n_inner,
                                                                             layout.inner_splits))
        assert se[d] == pytest.approx(np.sqrt(max(v_corr[d], 0) + mc[d] ** 2), rel=1e-12)
    sd = est.std(ddof=1)  # the oracle: the estimator's SD across independent datasets
    assert abs(est.mean() - truth) < 3 * sd / np.sqrt(n_datasets) + 0.005  # unbiased
    # the SE against the true SD, from both sides (1.06 measured; sd itself is known to about +-6% here)
    assert 0.85 <= np.median(se) / sd <= 1.25, np.median(se) / sd
    assert 0.85 <= np.mean(v_corr) / sd ** 2 <= 1.3, np.mean(v_corr) / sd ** 2  # 1.13 measured
    # negative control: the plain bootstrap variance, without the bias term, is low (0.86 measured)
    assert np.mean(v_plain) / sd ** 2 < 0.9 and np.mean(v_plain) < 0.85 * np.mean(v_corr)
    cover = np.mean((lo <= truth) & (truth <= hi))
    ratio = np.median(hi - lo) / (2 * 1.96 * sd)  # over a correct normal interval's width for this estimator
    assert 0.92 <= cover <= 0.995, cover  # 0.973 measured; an interval that never misses is too wide
    assert 0.8 <= ratio <= 1.3, ratio  # neither too narrow nor uselessly wide (1.04 measured; the jackknife: 1.15)
    assert (hi - lo > 0).all()
    # negative control: the naive SD over splits (Monte Carlo error of the split average) undercovers badly
    naive = np.mean((est - 1.96 * mc <= truth) & (truth <= est + 1.96 * mc))
    assert naive < 0.5, naive


def test_the_corrected_bootstrap_variance_removes_both_monte_carlo_shares():
    # a two-level model with known parts: resample effect A_b (sd 0.05), split noise (0.2), second-level effect
    # C_bc (0.1) and its split noise (0.2); the bootstrap mean m(D*_b) is A_b, so the target is 2 Var(A)
    rng = np.random.default_rng(8)
    reps, b, p1, c, p2 = 2000, 64, 8, 4, 4
    A = rng.normal(0, 0.05, (reps, b))
    outer = A[:, :, None] + rng.normal(0, 0.2, (reps, b, p1))
    inner = A[:, :, None, None] + rng.normal(0, 0.1, (reps, b, c, 1)) + rng.normal(0, 0.2, (reps, b, c, p2))
    v = np.array([corrected_bootstrap_variance(outer[r], inner[r]) for r in range(reps)])
    target = 2 * 0.05 ** 2
    assert abs(v.mean() - target) < 4 * v.std(ddof=1) / np.sqrt(reps), (v.mean(), target)
    # negative control: the raw spreads, with the Monte Carlo shares left in, are 3 x the target
    raw = np.mean([outer[r].mean(1).var(ddof=1) + inner[r].mean(axis=(1, 2)).var(ddof=1) for r in range(reps)])
    assert raw > 2.5 * target
    with pytest.raises(ValueError, match="inner resamples"):
        corrected_bootstrap_variance(outer[0], inner[0, :, :1])


def test_no_zero_width_interval_where_every_split_agrees_and_the_gap_bound_is_what_prevents_it():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 30)) * 0.1 + np.r_[np.full(3, 10.0), np.zeros(27)]
    out = halves_stability(X, [3], ranking="absolute", seed=2)
    assert out["jaccard_half"][0] == 1.0 and out["jaccard_half_se"][0] == 0.0
    assert out["jaccard_half_ci_low"][0] < out["jaccard_half_ci_high"][0] == 1.0
    assert out["jaccard_half_ci_low"][0] == out["jaccard_half_floor"][0]
    # negative control: the resamples alone have zero spread here
    layout = HalvesLayout()
    tops = np.tile(np.arange(3), (2 * sum(layout.sizes()), 1))
    r = halves_from_tops(tops, layout)
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


def test_the_gap_bound_is_required_and_read_wherever_no_split_of_the_data_disagrees():
    for est, se in ((1.0, 0.0), (1.0, 0.01), (0.97, 0.01)):  # se 0 or not: events 0 needs the bound
        with pytest.raises(ValueError, match="gap bound"):
            half_interval(est, se, 0, float("nan"), 0.95)
    # where splits disagree it is not read (NaN accepted); events 0 and 1 share the df floor, so the same q
    lo1, hi1 = half_interval(0.97, 0.01, 1, float("nan"), 0.95)
    assert lo1 < 0.97 < hi1
    lo, hi = half_interval(0.97, 0.01, 0, 0.5, 0.95)
    assert lo == 0.5 and hi == hi1  # a bound below the resamples' end lowers it; the upper end is untouched
    assert half_interval(0.97, 0.01, 0, 0.999, 0.95) == (lo1, hi1)  # a bound above it changes nothing
    lo, hi = half_interval(1.0, 0.002, 0, 0.9, 0.95)
    assert (lo, hi) == (0.9, 1.0)  # T = 1 with a little resample spread: [1 - q se, 1] would be far shorter


def test_the_interval_is_symmetric_on_the_arcsine_scale_below_one_half_with_the_stated_critical_value():
    g = lambda j: np.arcsin(np.sqrt(j))  # noqa: E731
    est, se = 0.3, 0.04
    no_bind = 1 - np.finfo(float).eps  # a gap bound above the lower end (read at events 0, never binding here)
    slope = 1 / (2 * np.sqrt(est * (1 - est)))  # d asin(sqrt(J)) / dJ: the delta method's factor
    cases = ((MIN_EVENTS, norm.ppf(0.975)), (64, norm.ppf(0.975)),
             (MIN_EVENTS - 1, student_t.ppf(0.975, MIN_EVENTS - 2)), (5, student_t.ppf(0.975, 4)),
             (4, student_t.ppf(0.975, MIN_DF)), (1, student_t.ppf(0.975, MIN_DF)), (0, student_t.ppf(0.975, MIN_DF)))
    for events, q in cases:
        lo, hi = half_interval(est, se, events, no_bind, 0.95)
        # unclipped: the two arms are equal on the arcsine scale, each q se slope
        assert g(hi) - g(est) == pytest.approx(g(est) - g(lo), rel=1e-10)
        assert (g(hi) - g(lo)) / 2 == pytest.approx(q * se * slope, rel=1e-10)
        assert hi - est > q * se > est - lo  # below 1/2 the arcsine arm toward 1/2 is the longer one
    # fewer disagreeing splits, a wider interval for the same se, down to the df floor and no further
    widths = [np.subtract(*half_interval(est, se, e, no_bind, 0.95)[::-1]) for e in (0, 1, 2, 4, 5, 10, MIN_EVENTS)]
    assert widths[0] == widths[1] == widths[2] == widths[3]
    assert all(a > b for a, b in zip(widths[3:], widths[4:]))
    # negative control: the former floor of 1 df would be 12.7 / 3.18 = 4 x as wide on the arcsine scale
    assert student_t.ppf(0.975, 1) > 3.9 * student_t.ppf(0.975, MIN_DF)


def test_above_one_half_the_upper_arm_is_the_raw_scale_q_se_and_the_lower_the_arcsine_arm():
    g = lambda j: np.arcsin(np.sqrt(j))  # noqa: E731
    q = norm.ppf(0.975)
    for est, se in ((0.7, 0.05), (0.9, 0.03), (0.97, 0.01)):
        lo, hi = half_interval(est, se, 64, 0.0, 0.95)
        assert hi == pytest.approx(est + q * se, rel=1e-12)
        slope = 1 / (2 * np.sqrt(est * (1 - est)))
        assert g(est) - g(lo) == pytest.approx(q * se * slope, rel=1e-10)
        # negative control: the pure arcsine interval's upper arm is shorter than q se there, the lower longer
        hi_g = np.sin(g(est) + q * se * slope) ** 2
        assert hi_g < hi and est - lo > q * se
    assert half_interval(0.99, 0.05, 64, 0.0, 0.95)[1] == 1.0  # clipped to the range


def test_on_a_right_skewed_case_the_interval_leans_up_and_a_symmetric_one_misses_one_sidedly():
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
    # negative control: a symmetric interval misses on one side here even with the correct width (sd: the
    # estimator's SD across the datasets): below, where T sits in its long upper tail (7 below, none above
    # measured; the arcsine interval with the bootstrap SE: 3 below, none above). With the former jackknife SE,
    # small where T is small, the symmetric T -+ 1.96 se missed above instead (16 of 200 on spiky-1, N = 32)
    sd = est.std(ddof=1)
    s_above, s_below = np.sum(truth > est + 1.96 * sd), np.sum(truth < est - 1.96 * sd)
    assert s_below >= 5 and s_above == 0, (s_above, s_below)
    assert below < s_below, (below, s_below)


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
    rows = half_split_rows(np.arange(41), 41, 20, rng, strata).reshape(20, 2, 41)
    for s, want in ((0, 5), (1, 15)):  # floor(n_s / 2) of each stratum in each half (31: one sits out)
        assert (rows[:, :, strata == s].sum(axis=2) == want).all()
    X = rng.normal(size=(41, 12)) + np.linspace(1, 0, 12)
    out = halves_stability(X, [3], ranking="absolute", seed=0, strata=strata)
    assert out["jaccard_half_units"][0] == 20 and 0 <= out["jaccard_half_ci_low"][0] < out["jaccard_half_ci_high"][0]
