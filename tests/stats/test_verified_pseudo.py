"""Pseudo-scores of a verified run (circuitstat.stats.verified.pseudo) and the stratified resampling they need.

Oracles: the PPI++ estimate of ``verified_means`` (column means), its plug-in ("z") SE (the stratified
bootstrap's variance equals it exactly as B → ∞), and the PPI++ estimator recomputed by hand on
training subsets (cross-fitting's selection).
"""

from __future__ import annotations

import numpy as np
import pytest

from circuitstat.core.topk import topk_mask
from circuitstat.stats.faithfulness import selection_aware_faithfulness
from circuitstat.stats.folds import fold_split
from circuitstat.stats.resampling import ResamplingPlan, resampled_means
from circuitstat.stats.stability import circuit_stability
from circuitstat.stats.strata import stratum_weighted_means
from circuitstat.stats.verified import verified_means, verified_pseudo_scores
from circuitstat.stats.verified.ppi import ppi_fit, ppi_intervals

N, n, E = 240, 16, 12


def _run(seed: int = 0, close: bool = False):
    """approx [N, E] on all prompts, exact [n, E] on ``rows``: slopes ≠ 1 and offsets, so λ̂ is inside (0, 1).
    ``close``: offsets that bring every edge's mean exact effect near 2, from different mixes of the two parts."""
    rng = np.random.default_rng(seed)
    mu, slope = np.linspace(-2, 3, E), np.linspace(0.3, 1.5, E)
    A = rng.standard_t(6, (N, E)) + mu
    off = 2 - slope * mu + 0.05 * np.arange(E) if close else 0.5
    exact_all = slope * A + off + rng.normal(0, 1.0, (N, E))
    rows = np.sort(rng.choice(N, n, replace=False))
    return A, exact_all[rows], rows


def test_column_means_are_the_ppi_estimates() -> None:
    A, Y, rows = _run()
    ps = verified_pseudo_scores(A, Y, rows)
    res = verified_means(A, Y, rows)
    np.testing.assert_allclose(ps.scores.mean(0), res.estimate, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(ps.lam, res.lam)
    assert ((ps.lam > 0.05) & (ps.lam < 0.95)).any()  # the tuning is exercised
    assert ps.estimand == f"mean exact effect, verified on {n} of {N} prompts"
    assert ps.strata.sum() == n and (ps.strata[rows] == 1).all()


def test_stratified_bootstrap_reproduces_the_ppi_plugin_se_and_ordinary_does_not() -> None:
    A, Y, rows = _run(1)
    ps = verified_pseudo_scores(A, Y, rows)
    unl = ps.strata == 0
    z = ppi_intervals(ppi_fit(Y, A[rows], A[unl]), "z")["standard_error"]
    B = 4000
    plan = ResamplingPlan.stratified(ps.strata, B, seed=3)
    assert (plan.counts[:, rows].sum(1) == n).all() and (plan.counts[:, unl].sum(1) == N - n).all()
    boot = resampled_means(ps.scores, plan)  # [E, B]
    # E*[var*] is the plug-in variance λ² Var_U(Ŷ)/N_u + Var_L(Y − λŶ)/n (divisor-n variances) exactly;
    # B resamples estimate the SD with relative SD ≈ 1/sqrt(2B) = 0.011 (near-normal means): 4 of those
    np.testing.assert_allclose(boot.std(1), z, rtol=4 / np.sqrt(2 * B))
    # the bootstrap mean is the estimate to within 4 Monte Carlo SE
    assert (np.abs(boot.mean(1) - ps.scores.mean(0)) < 4 * z / np.sqrt(B)).all()
    # an ordinary bootstrap of all N rows lets the labelled count vary: its SD is far off on most edges
    wrong = resampled_means(ps.scores, ResamplingPlan.bootstrap(N, B, seed=3)).std(1)
    assert np.mean(np.abs(wrong / z - 1) > 0.2) > 0.5


def test_stratum_weighted_means_on_a_subset_are_the_ppi_estimate_there() -> None:
    A, Y, rows = _run(2)
    ps = verified_pseudo_scores(A, Y, rows)
    rng = np.random.default_rng(0)
    sub = np.sort(rng.choice(N, 150, replace=False))
    lab = np.isin(rows, sub)  # labelled prompts in the subset, in rows' order
    unl_sub = np.setdiff1d(sub, rows)
    by_hand = ps.lam * A[unl_sub].mean(0) + (Y[lab] - ps.lam * A[rows[lab]]).mean(0)
    np.testing.assert_allclose(stratum_weighted_means(ps.scores, sub, ps.strata), by_hand, rtol=0, atol=1e-10)
    assert not np.allclose(ps.scores[sub].mean(0), by_hand)  # the plain subset mean is not it


def test_stratified_folds_balance_each_stratum() -> None:
    strata = np.zeros(103, np.int64)
    strata[np.random.default_rng(1).choice(103, 17, replace=False)] = 1
    folds = fold_split(np.random.default_rng(0), 103, 5, None, strata)
    assert sorted(np.concatenate(folds).tolist()) == list(range(103))
    assert sorted(f.size for f in folds) == sorted(len(f) for f in np.array_split(np.arange(103), 5))
    per = [int(strata[f].sum()) for f in folds]
    assert max(per) - min(per) <= 1, per


def test_crossfit_selects_each_fold_circuit_from_the_training_ppi_estimate() -> None:
    A, Y, rows = _run(3, close=True)
    ps = verified_pseudo_scores(A, Y, rows)
    calls = []
    true = A.mean(0)

    def evaluate(masks, r):  # additive model: m(C) = Σ_{e in C} effect_e per prompt
        calls.append((masks.copy(), r.copy()))
        return A[r] @ masks.T.astype(float), A[r].sum(1), np.zeros(r.size)

    ks = [3, 6]  # 5 folds: 3 or 4 of the 16 labelled prompts each, so plain training means weigh the parts wrongly
    selection_aware_faithfulness(ps.scores, evaluate, ks, ranking="absolute", n_folds=5, n_repeats=2, seed=5,
                                 strata=ps.strata)
    checked = 0
    for masks, r in calls:
        train = np.setdiff1d(np.arange(N), r)
        if train.size == N:  # the full-data circuits
            continue
        lab = np.isin(rows, train)
        est = ps.lam * A[np.setdiff1d(train, rows)].mean(0) + (Y[lab] - ps.lam * A[rows[lab]]).mean(0)
        for m in masks:
            np.testing.assert_array_equal(m, np.asarray(topk_mask(est, int(m.sum()), ranking="absolute")).reshape(-1))
            checked += 1
    assert checked >= 8 and true.size == E


def test_data_level_stability_runs_on_a_stratified_plan() -> None:
    A, Y, rows = _run(4)
    ps = verified_pseudo_scores(A, Y, rows)
    plan = ResamplingPlan.stratified(ps.strata, 60, seed=1)
    res = circuit_stability(ps.scores, plan, [3, 5], ranking="absolute", n_outer=50, n_inner=10)
    assert res.params["data_level"]["computed"], res.params["data_level"]
    assert np.isfinite(res.per_k["jaccard_data_ci_low"]).all()
    assert res.params["plan"]["stratum_sizes"] == [N - n, n]


def test_data_level_draws_keep_stratum_sizes() -> None:
    from circuitstat.stats.stability_data import N_SPLITS, _draws

    strata = np.zeros(N, np.int64)
    strata[:n] = 1
    outer, inner, splits, double = _draws(N, 6, 3, 4, (None, None, None), strata)
    for counts, share in ((outer, 1), (inner, 1), (double, 2)):
        assert (counts[:, :n].sum(1) == share * n).all() and (counts[:, n:].sum(1) == share * (N - n)).all()
    halves = splits.reshape(N_SPLITS, 6, N)[:, :2]
    assert (halves[..., :n].sum(-1) == n // 2).all() and (halves[..., n:].sum(-1) == (N - n) // 2).all()


def test_bad_strata_are_refused() -> None:
    from circuitstat.core.errors import InputError
    from circuitstat.stats.strata import check_strata

    with pytest.raises(InputError, match="one label per example"):
        check_strata(np.zeros(5), 6)
    with pytest.raises(InputError, match="at least 4"):
        check_strata(np.r_[np.zeros(10), np.ones(2)], 12, min_size=4)


def test_a_stratum_too_small_for_data_level_draws_gives_nan_with_the_reason() -> None:
    rng = np.random.default_rng(5)
    S = rng.standard_normal((40, 10))
    strata = np.r_[np.ones(3, np.int64), np.zeros(37, np.int64)]
    res = circuit_stability(S, ResamplingPlan.stratified(strata, 30, seed=1), [3], ranking="absolute")
    assert not res.params["data_level"]["computed"]
    assert "at least 4 examples in every stratum" in res.params["data_level"]["reason"]
    assert np.isnan(res.per_k["jaccard_data_ci_low"]).all()
