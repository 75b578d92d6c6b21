"""Faithfulness intervals (circuitstat.stats.faithfulness): the fixed-circuit bootstrap against scipy and a
brute-force loop, the selection-aware interval's held-out discipline and its coverage in an
additive model where faithfulness is exactly computable, and refusal of bad settings."""

import numpy as np
import pytest
from scipy import stats as sps

from circuitstat.core.errors import InputError
from circuitstat.stats import ResamplingPlan
from circuitstat.stats.faithfulness import (ESTIMAND_FIXED, ESTIMAND_SELECTED, fixed_circuit_interval, min_resamples,
                                selection_aware_faithfulness)


def topk_indices(v, k, ranking):
    """Oracle top-k for continuous scores (no ties): the k largest, by a plain sort."""
    assert ranking == "signed"
    return np.argsort(-np.asarray(v), kind="stable")[:k]


def _metrics(n=40, c=3, seed=0):
    """Skewed per-example metrics with m(M) − m(∅) well away from 0."""
    rng = np.random.default_rng(seed)
    m0 = rng.normal(0, 1, n)
    gap = rng.lognormal(0.5, 0.8, n)
    share = rng.uniform(0, 1, (n, c)) * np.linspace(0.3, 1.0, c)
    return m0[:, None] + share * gap[:, None] + rng.standard_t(3, (n, c)) * 0.2, m0 + gap, m0


def _ratio(mc, mM, m0):
    return (mc.mean(0) - m0.mean()) / (mM.mean() - m0.mean())


# --- fixed circuit ---------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["percentile", "basic", "bca"])
def test_fixed_interval_equals_scipy_bootstrap_of_the_ratio(method):
    mc, mM, m0 = _metrics()
    seed, b = 7, 500
    res = fixed_circuit_interval(mc, mM, m0, ResamplingPlan.bootstrap(mc.shape[0], b, seed), method=method)
    assert res.estimand == ESTIMAND_FIXED
    for j in range(mc.shape[1]):
        def ratio(a, c_, z, axis=-1):
            return (a.mean(axis) - z.mean(axis)) / (c_.mean(axis) - z.mean(axis))

        ref = sps.bootstrap((mc[:, j], mM, m0), ratio, paired=True, vectorized=True, n_resamples=b,
                            method="BCa" if method == "bca" else method, rng=np.random.default_rng(seed))
        np.testing.assert_allclose(res.conf_int().to_array()[j], [ref.confidence_interval.low, ref.confidence_interval.high],
                                   rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(res.standard_error[j], ref.standard_error, rtol=1e-10)
    np.testing.assert_allclose(res.estimate, _ratio(mc, mM, m0), rtol=1e-12)


def test_fixed_interval_equals_a_loop_over_resamples_and_honours_bca():
    mc, mM, m0 = _metrics(n=30, c=2, seed=3)
    plan = ResamplingPlan.bootstrap(30, 400, 11)
    res = fixed_circuit_interval(mc, mM, m0, plan, method="bca", methods=["percentile"], keep_distribution=True)
    loop = np.array([_ratio(mc[plan.indices(b)], mM[plan.indices(b)], m0[plan.indices(b)])
                     for b in range(plan.n_resamples)]).T
    np.testing.assert_allclose(res.bootstrap_distribution, loop, rtol=1e-12)
    np.testing.assert_allclose(res.intervals["percentile"].low, np.quantile(loop, 0.025, axis=1), rtol=1e-12)
    np.testing.assert_allclose(res.intervals["percentile"].high, np.quantile(loop, 0.975, axis=1), rtol=1e-12)
    # BCa is honoured: on skewed data it moves away from the percentile interval
    assert not np.allclose(res.conf_int(which="bca").to_array(), res.conf_int(which="percentile").to_array())
    table = res.to_table()
    assert {"ci_low", "ci_high", "ci_percentile_low", "ci_percentile_high", "estimand"} <= set(table.column_names)
    assert table.column("interval_method").to_pylist() == ["bca", "bca"]


def test_fixed_interval_bca_under_cluster_plan_jackknifes_whole_clusters():
    mc, mM, m0 = _metrics(n=36, c=2, seed=5)
    groups = np.repeat(np.arange(9), 4)
    plan = ResamplingPlan.cluster(groups, 300, 2)
    res = fixed_circuit_interval(mc, mM, m0, plan, method="bca", keep_distribution=True)
    jack = np.array([_ratio(mc[groups != g], mM[groups != g], m0[groups != g]) for g in range(9)]).T
    d = jack.mean(1, keepdims=True) - jack
    accel = (d**3).sum(1) / (6 * (d**2).sum(1) ** 1.5)
    from circuitstat.stats.intervals import intervals_from_distribution

    ref = intervals_from_distribution(res.bootstrap_distribution, res.estimate, method="bca", acceleration=accel)
    np.testing.assert_allclose(res.conf_int().to_array(), np.stack([ref["bca"].low, ref["bca"].high], -1), rtol=1e-12)


def test_resamples_with_zero_denominator_are_left_out_and_counted():
    mc, mM, m0 = _metrics(n=20, c=1, seed=1)
    mM = m0.copy()
    mM[0] += 5.0  # only example 0 moves the metric: resamples without it have m(M) = m(∅)
    plan = ResamplingPlan.bootstrap(20, 200, 4)
    res = fixed_circuit_interval(mc, mM, m0, plan, method="percentile")
    assert res.n_undefined_resamples == int((plan.counts[:, 0] == 0).sum()) > 0
    assert np.isfinite(res.conf_int().to_array()).all()


# --- selection-aware: mechanics --------------------------------------------------------------
def _additive(X, base):
    """evaluate() of an additive model: m(C) = m(∅) + Σ_{e∈C} x_e, m(M) = m(∅) + Σ_e x_e."""
    def evaluate(masks, rows):
        return X[rows] @ masks.T.astype(np.float64) + base[rows, None], X[rows].sum(1) + base[rows], base[rows]
    return evaluate


def test_crossfit_evaluates_each_fold_only_with_circuits_selected_without_it():
    rng = np.random.default_rng(0)
    X = rng.normal(np.linspace(1, 0, 15), 1.0, (40, 15))
    base = rng.normal(0, 1, 40)
    calls = []

    def evaluate(masks, rows):
        out = np.ones(40, dtype=bool)
        out[rows] = False
        order = topk_indices(X[out].mean(0), 6, "signed")
        for m in masks:  # every circuit run on these rows is a top-k of the other rows' scores
            assert m.sum() in (2, 6) and set(np.flatnonzero(m)) <= set(order)
            assert set(order[:m.sum()]) == set(np.flatnonzero(m))
        calls.append(len(rows) * len(masks))
        return _additive(X, base)(masks, rows)

    res = selection_aware_faithfulness(X, evaluate, [2, 6], ranking="signed", n_folds=4, n_repeats=3, seed=1)
    assert res.estimand == ESTIMAND_SELECTED and res.method == "corrected-t"
    assert res.extra["evaluated_circuit_rows"][0] == sum(calls) <= 3 * 40 * 2
    lo, hi = res.conf_int()[:2]
    assert np.isfinite(res.estimate).all() and (lo < res.estimate).all() and (res.estimate < hi).all()


def test_corrected_t_matches_a_hand_computation_of_nadeau_bengio():
    rng = np.random.default_rng(4)
    X = rng.normal(np.linspace(1, -0.2, 12), 1.5, (30, 12))
    base = rng.normal(0, 1, 30)
    ev = _additive(X, base)
    res = selection_aware_faithfulness(X, ev, [3], ranking="signed", n_folds=3, n_repeats=2, seed=9)
    # redo the splits from the documented seed derivation and compute everything by hand
    from circuitstat.core.seeds import spawn_seeds

    split = np.random.default_rng(spawn_seeds(np.random.SeedSequence(9), 2)[0])
    d = X.sum(1)
    held, folds = np.zeros(30), []
    for _ in range(2):
        for fold in np.array_split(split.permutation(30), 3):
            train = np.setdiff1d(np.arange(30), fold)
            top = topk_indices(X[train].mean(0), 3, "signed")
            a = X[np.ix_(fold, top)].sum(1)
            held[fold] += a / 2
            folds.append((fold, a))
    theta = held.sum() / d.sum()
    v = [(a - theta * d[f]).mean() / d.mean() for f, a in folds]
    se = np.sqrt((1 / 6 + 10 / 20) * np.var(v, ddof=1))
    q = sps.t.ppf(0.975, 5)
    np.testing.assert_allclose(res.estimate, [theta], rtol=1e-12)
    np.testing.assert_allclose(res.conf_int().to_array()[0], [theta - q * se, theta + q * se], rtol=1e-10)


def test_known_evaluations_are_reused_and_not_run_again():
    rng = np.random.default_rng(2)
    X = rng.normal(np.r_[np.full(4, 3.0), np.zeros(16)], 0.3, (48, 20))  # the top 4 are obvious
    base = np.zeros(48)
    ev = _additive(X, base)
    full = np.zeros((1, 20), dtype=bool)
    full[0, topk_indices(X.mean(0), 4, "signed")] = True
    mc, mM, m0 = ev(full, np.arange(48))
    res = selection_aware_faithfulness(X, ev, [4], ranking="signed", n_folds=4, n_repeats=2, seed=0,
                                       n_resamples=100, known=(full, mc, mM, m0))
    # every fold selects the same four edges, so nothing needs evaluating beyond the fixed path
    assert res.extra["evaluated_circuit_rows"][0] == 0 and res.extra["fold_circuit_jaccard"][0] == 1.0
    np.testing.assert_allclose(res.estimate, _ratio(mc, mM, m0), rtol=1e-12)


# --- refusals --------------------------------------------------------------------------------
def test_too_few_resamples_is_refused_naming_the_minimum():
    mc, mM, m0 = _metrics(n=20)
    assert min_resamples(0.95) == 40 and min_resamples(0.99) == 200
    with pytest.raises(InputError, match="at least 40"):
        fixed_circuit_interval(mc, mM, m0, ResamplingPlan.bootstrap(20, 39, 0), method="bca")
    fixed_circuit_interval(mc, mM, m0, ResamplingPlan.bootstrap(20, 40, 0), method="bca")
    X = np.random.default_rng(0).normal(size=(40, 10))
    with pytest.raises(InputError, match="at least 200"):
        selection_aware_faithfulness(X, _additive(X, np.zeros(40)), [3], ranking="signed", method="percentile",
                                     n_resamples=150, confidence_level=0.99)


def test_too_few_examples_per_fold_is_refused_naming_the_minimum():
    X = np.random.default_rng(0).normal(size=(19, 10))
    with pytest.raises(InputError, match=r"at least 4 examples \(N >= 20\)"):
        selection_aware_faithfulness(X, _additive(X, np.zeros(19)), [3], ranking="signed", n_folds=5)


@pytest.mark.parametrize("kwargs, message", [
    ({"scheme": "reselect", "method": "percentile"}, "offers methods"),
    ({"method": "corrected-t", "plan": ResamplingPlan.bootstrap(40, 100, 0)}, "draws no resamples"),
    ({"scheme": "bagging"}, "unknown scheme"),
    ({"ranking": "both"}, "ranking"),
    ({"ks": [10]}, "every k"),
    ({"n_folds": 1}, "n_folds >= 2"),
])
def test_bad_settings_are_refused(kwargs, message):
    X = np.random.default_rng(0).normal(size=(40, 10))
    args = {"ks": [3], "ranking": "signed", **kwargs}
    with pytest.raises(InputError, match=message):
        selection_aware_faithfulness(X, _additive(X, np.zeros(40)), args.pop("ks"), **args)


def test_subsample_plans_are_refused():
    mc, mM, m0 = _metrics(n=20)
    with pytest.raises(InputError, match="half-size"):
        fixed_circuit_interval(mc, mM, m0, ResamplingPlan.subsample(20, 100, 0), method="percentile")


def test_reselect_interval_is_the_in_sample_estimate_minus_bootstrap_selection_errors():
    rng = np.random.default_rng(6)
    X = rng.normal(np.r_[2.0, 1.0, 0.9, 0.85, np.zeros(6)], 1.0, (30, 10))
    ev = _additive(X, np.zeros(30))
    plan = ResamplingPlan.bootstrap(30, 200, 3)
    res = selection_aware_faithfulness(X, ev, [2], ranking="signed", scheme="reselect", plan=plan)
    f_d = lambda top, w: (X[:, top].sum(1) * w).sum() / (X.sum(1) * w).sum()  # noqa: E731
    ones = np.ones(30)
    f_hat = f_d(topk_indices(X.mean(0), 2, "signed"), ones)
    err = []
    for b in range(200):
        w = plan.counts[b].astype(float)
        top = topk_indices(w @ X / 30, 2, "signed")
        err.append(f_d(top, w) - f_d(top, ones))
    q_lo, q_hi = np.quantile(err, [0.025, 0.975])
    np.testing.assert_allclose(res.conf_int().to_array()[0], [f_hat - q_hi, f_hat - q_lo], rtol=1e-10)
    assert res.extra["distinct_circuits"][0] == len({tuple(sorted(topk_indices(plan.counts[b] @ X, 2, "signed")))
                                                      for b in range(200)})


# --- coverage --------------------------------------------------------------------------------
def _spiky(P, E, seed):
    """A heavy-tailed finite population (not the one the method was chosen on): a few prompts carry
    most of an edge's mean, a shared per-prompt scale, t(2.5) noise; 8 clear edges, the rest near 0."""
    rng = np.random.default_rng(seed)
    a = np.r_[np.geomspace(1.5, 0.3, 8), rng.normal(0, 0.05, E - 8)]
    pi = rng.uniform(0.08, 0.6, E)
    g = rng.lognormal(0, 1.0, P)[:, None]
    return g * a * (rng.random((P, E)) < pi) / pi + 0.25 * np.abs(a).mean() * rng.standard_t(2.5, (P, E))


@pytest.mark.slow
def test_selection_aware_interval_covers_the_selected_circuits_population_faithfulness():
    # Estimand: f_pop(C(D)), the population faithfulness of the top-k circuit selected from the
    # dataset's N prompts; exactly computable in the additive model. The method was chosen on the
    # zoo fixture and another spiky generator; this population was not used to choose it.
    # Measured on it (800 datasets): 0.91 / 0.90 at N = 40 and 0.91 / 0.93 at N = 64 (k = 4 / 8), so
    # the lower bound is the 0.90 target less ~2.5 Monte Carlo SEs of 1000 datasets.
    pop = _spiky(3000, 40, seed=2024)
    mu = pop.mean(0)
    ks, reps, n = [4, 8], 1000, 64
    rng = np.random.default_rng(1)
    hit = {"selected": np.zeros(len(ks)), "fixed": np.zeros(len(ks))}
    for _ in range(reps):
        X = pop[rng.integers(0, len(pop), n)]
        ev = _additive(X, rng.normal(0, 1, n))
        res = selection_aware_faithfulness(X, ev, ks, ranking="signed", seed=int(rng.integers(2**32)))
        order = topk_indices(X.mean(0), max(ks), "signed")
        truth = np.array([mu[order[:k]].sum() / mu.sum() for k in ks])
        lo, hi = res.conf_int()[:2]
        hit["selected"] += (lo <= truth) & (truth <= hi)
        masks = np.zeros((len(ks), X.shape[1]), dtype=bool)
        for j, k in enumerate(ks):
            masks[j, order[:k]] = True
        fx = fixed_circuit_interval(*ev(masks, np.arange(n)), ResamplingPlan.bootstrap(n, 200, int(rng.integers(2**32))),
                                    method="percentile")
        lo, hi = fx.conf_int()[:2]
        hit["fixed"] += (lo <= truth) & (truth <= hi)
    cover = hit["selected"] / reps
    assert ((cover >= 0.875) & (cover <= 0.995)).all(), cover
    # the fixed-circuit interval, read as this estimand, misses it more often (measured 0.868 / 0.901
    # against 0.913 / 0.947)
    assert (hit["fixed"] / reps < cover - 0.02).all(), (hit["fixed"] / reps, cover)


def test_grouped_crossfit_keeps_every_template_on_one_side_of_each_split():
    rng = np.random.default_rng(8)
    groups = np.repeat(np.arange(12), rng.integers(2, 7, 12))
    n = groups.size
    X = rng.normal(np.linspace(1, 0, 10), 1.0, (n, 10))
    seen = []

    def evaluate(masks, rows):
        seen.append(rows)
        return _additive(X, np.zeros(n))(masks, rows)

    selection_aware_faithfulness(X, evaluate, [3], ranking="signed", n_folds=3, n_repeats=2, seed=0, groups=groups)
    assert seen and all(np.isin(groups, groups[r]).sum() == r.size for r in seen)  # whole groups only
    with pytest.raises(InputError, match="at least 4 examples"):
        selection_aware_faithfulness(X, evaluate, [3], ranking="signed", n_folds=3, seed=0,
                                     groups=np.r_[np.zeros(n - 2, int), 1, 2])
