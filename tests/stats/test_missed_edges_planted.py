"""The missed-edges bound over 200 datasets of the planted background-3 model (known nulls: its population means).

Oracles: the exact failure probability of the hypergeometric bound given (R, K, r), checked against math.comb,
and its mean over datasets (the hold rate to expect). The bound must hold at 0.95 − 2 MC SE, match that
expectation, and be able to fail (expected failure rate > 1%), with a bound below the unverified count.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fixture_populations import load_planted_pair
from circuitstat.core.errors import InputError
from circuitstat.stats.verified.missed import hypergeometric_upper
from circuitstat.stats.verified.missed_study import failure_probability, missed_edges_study

D = 200


@pytest.fixture(scope="module")
def planted():
    X, A, _ = load_planted_pair()
    return X, A


def test_failure_probability_is_the_hypergeometric_sum():
    R, K, r = 45, 12, 15
    want = sum(math.comb(K, x) * math.comb(R - K, r - x) / math.comb(R, r)
               for x in range(0, min(K, r) + 1) if hypergeometric_upper(x, R, r, 0.95) < K)
    assert failure_probability(R, K, r, 0.95) == pytest.approx(want, abs=1e-12)
    assert 0.01 < want <= 0.05  # exact bound: at most α, and not far below it here
    assert failure_probability(45, 2, 15, 0.95) == 0.0  # K = 2: K_U(0) >= 2, the bound cannot fail


def test_bound_holds_at_its_level_with_known_sampled_effects(planted):
    X, A = planted
    s = missed_edges_study(X, A, tau=0.1, n_top=5, n_random=15, n_datasets=D, seed=1, known=True)
    out = s.summary()
    assert out["hold_rate"] >= 0.95 - 2 * out["mc_se"], out
    # not true by construction: the bound could fail in about 2% of datasets, and it is below R − r in all
    assert out["expected_hold_rate"] < 0.99 and (s.bound < s.n_unverified).all() and (s.truth > 0).all(), out
    # the hold count is a sum of independent Bernoullis with the exact failure probabilities: within 3 SD
    sd = np.sqrt(np.sum(s.fail_probability * (1 - s.fail_probability))) / D
    assert abs(out["hold_rate"] - out["expected_hold_rate"]) <= 3 * sd + 1e-12, out


def test_bound_holds_with_estimated_sampled_effects(planted):
    X, A = planted
    s = missed_edges_study(X, A, tau=0.5, n_top=5, n_random=15, n_labelled=16, n_datasets=D, seed=2, known=False)
    out = s.summary()
    assert out["hold_rate"] >= 0.95 - 2 * out["mc_se"], out
    # the two true edges EAP reads as 0 are above τ and unverified in most datasets; the bound is below the
    # unverified count in a fair share of them (at n = 16 the Bonferroni intervals often count every sampled edge)
    assert out["share_truth_positive"] > 0.8 and out["share_bound_below_unverified"] > 0.25, out
    # the missed-mass bound from the same sample (|cross-fitted estimates| and their SEs) holds too
    assert out["mass_hold_rate"] >= 0.95 - 2 * out["mass_mc_se"], out


def test_missed_mass_cannot_see_the_edges_eap_reads_as_zero(planted):
    """The missed-mass bound's stated limitation, measured: with the sampled effects known, the two true edges EAP
    reads as 0 sit in the lowest rank block and a sample of 15 of 45 misses both in 44% of datasets; there the bound
    (which plugs in the sample's spread) falls below the truth, so it undercovers on this population."""
    X, A = planted
    out = missed_edges_study(X, A, tau=0.1, n_top=5, n_random=15, n_datasets=D, seed=1, known=True).summary()
    assert out["mass_hold_rate"] < 0.95 - 2 * out["mass_mc_se"], out


def test_several_predictors_see_the_same_datasets_and_the_first_ranks(planted):
    """The prompts, labelled rows and edge-sample stream do not depend on the predictor: ranked by EAP, EAP alone and
    EAP with a second predictor leave the same edges unverified in every dataset (the same truth and top mass), and
    [P, E], [P, E, 1] and {name: [P, E]} are one study; ranked by the second predictor, the top edges change. A
    predictor that tracks exact (exact plus small noise) classifies more sampled edges below τ than EAP does, so
    the predictors enter the classification, and the bound still holds in every dataset."""
    X, A = planted
    Q = X + 0.05 * X.std(0) * np.random.default_rng(0).standard_normal(X.shape)
    kw = dict(tau=0.5, n_top=5, n_random=15, n_labelled=16, n_datasets=40, seed=3, known=False)
    eap = missed_edges_study(X, A, **kw)
    for same in (A[:, :, None], {"eap": A}):
        s = missed_edges_study(X, same, **kw)
        assert np.array_equal(s.bound, eap.bound) and np.array_equal(s.mass_high, eap.mass_high)
    both = missed_edges_study(X, {"eap": A, "close": Q}, **kw)
    assert np.array_equal(both.truth, eap.truth) and np.array_equal(both.top_mass, eap.top_mass)
    close_first = missed_edges_study(X, {"close": Q, "eap": A}, **kw)
    assert not np.array_equal(close_first.top_mass, eap.top_mass)  # the close predictor finds the EAP-0 edges
    assert both.summary()["share_bound_below_unverified"] > eap.summary()["share_bound_below_unverified"] + 0.2
    assert both.holds.all() and close_first.holds.all() and (both.misclassified == 0).all()
    with pytest.raises(InputError, match="shape"):
        missed_edges_study(X, A[:, :-1], **kw)


def test_classification_error_is_counted_and_bounded_at_the_least_favourable_null():
    """One sampled-edge candidate sits just above τ (|μ| = 1.001 τ, the TOST's least favourable null), the others far
    below or far above: TOST-Holm wrongly calls it below τ at most at its family-wise level α_e (here 0.1: level 0.8,
    split 0.5), and does so in a clear share of the datasets where it is sampled (the count is not trivially 0)."""
    rng = np.random.default_rng(5)
    P, E, tau = 4000, 30, 0.5
    mu = np.zeros(E)
    mu[:5] = 6.0                      # the top edges
    mu[5] = 1.001 * tau               # the least favourable null, sampled in 15 of 25 draws
    X = mu + rng.standard_normal((P, E))
    A = X + 0.02 * rng.standard_normal((P, E))  # PPI++ nearly exact: the TOST is close to its nominal size
    s = missed_edges_study(X, A, tau=tau, n_top=5, n_random=15, n_labelled=16, n_datasets=300, seed=9, known=False,
                           confidence_level=0.8)
    out = s.summary()
    assert 0.02 < out["classification_error"] <= 0.1 + 2 * out["classification_mc_se"], out
    assert out["hold_rate"] >= 0.8 - 2 * out["mc_se"], out
