"""Selection-aware faithfulness of a refitted selection (circuitstat.stats.faithfulness_refit): arrays only."""

from __future__ import annotations

import numpy as np
import pytest

from circuitstat.core.errors import InputError
from circuitstat.stats.faithfulness import ESTIMAND_SELECTED, selection_aware_faithfulness
from circuitstat.stats.faithfulness_refit import refit_selection_faithfulness


def _additive(X, base):
    """evaluate() of an additive model: m(C) = m(∅) + Σ_{e∈C} x_e, m(M) = m(∅) + Σ_e x_e."""
    def evaluate(masks, rows):
        return X[rows] @ masks.T.astype(np.float64) + base[rows, None], X[rows].sum(1) + base[rows], base[rows]
    return evaluate


def _data(n=40, e=15, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(np.linspace(1, -0.5, e), 1.0, (n, e)), rng.normal(0, 1, n)


@pytest.mark.parametrize("ranking", ["signed", "absolute"])
def test_a_refit_that_takes_the_training_means_is_the_score_based_interval(ranking):
    # the oracle: cross-fitting with the selection re-run is cross-fitting with training-fold means
    X, base = _data()
    calls = []

    def refit(train, seed):
        calls.append(train)
        return X[train].mean(0)

    ref = selection_aware_faithfulness(X, _additive(X, base), [3, 6], ranking=ranking, n_folds=4, n_repeats=2, seed=7)
    res = refit_selection_faithfulness(refit, X.mean(0), _additive(X, base), [3, 6], n_obs=40, ranking=ranking,
                                       n_folds=4, n_repeats=2, seed=7)
    assert res.estimand == ESTIMAND_SELECTED and len(calls) == 8 and (res.extra["refits"] == 8).all()
    np.testing.assert_allclose(res.estimate, ref.estimate, rtol=1e-12)
    np.testing.assert_allclose(res.conf_int().to_array()[:, :2], ref.conf_int().to_array()[:, :2], rtol=1e-12)
    np.testing.assert_allclose(res.extra["fold_circuit_jaccard"], ref.extra["fold_circuit_jaccard"])
    # every fold's held-out rows are exactly the rows its refit did not see, and each repeat covers all rows once
    for rep in range(2):
        held = [np.setdiff1d(np.arange(40), t) for t in calls[4 * rep:4 * rep + 4]]
        assert np.array_equal(np.sort(np.concatenate(held)), np.arange(40))


def test_each_refit_gets_its_own_reproducible_seed_and_the_interval_holds_the_estimate():
    X, base = _data(seed=3)
    noise = np.random.default_rng(11).normal(0, 0.3, (1, 15))
    seen = []

    def refit(train, seed):  # a stochastic selection: the seed changes the scores
        seen.append(tuple(seed.spawn_key))
        return X[train].mean(0) + np.random.default_rng(seed).normal(0, 0.3, 15) + noise[0]

    a = refit_selection_faithfulness(refit, X.mean(0), _additive(X, base), [4], n_obs=40, n_folds=5, seed=2)
    first = list(seen)
    b = refit_selection_faithfulness(refit, X.mean(0), _additive(X, base), [4], n_obs=40, n_folds=5, seed=2)
    assert len(set(first)) == 5 and seen[5:] == first  # 5 distinct seeds, the same on a rerun
    assert np.array_equal(a.estimate, b.estimate)
    lo, hi = a.conf_int().to_array()[0, :2]
    assert lo < a.estimate[0] < hi and a.extra["t_df"][0] == 4


def test_bad_refits_and_settings_are_refused():
    X, base = _data()
    ev = _additive(X, base)
    with pytest.raises(InputError, match="refit returned"):
        refit_selection_faithfulness(lambda t, s: X[t].mean(0)[:3], X.mean(0), ev, [2], n_obs=40, seed=0)
    with pytest.raises(InputError, match="every k"):
        refit_selection_faithfulness(lambda t, s: X[t].mean(0), X.mean(0), ev, [15], n_obs=40, seed=0)
    with pytest.raises(InputError, match="each fold needs"):
        refit_selection_faithfulness(lambda t, s: X[t].mean(0), X.mean(0), ev, [2], n_obs=12, n_folds=4, seed=0)
