"""circuitstat.stats.verified.missed_mass: the bound on Σ|μ| over the unverified edges.

Oracles: exhaustive enumeration of every stratified sample of a small population (the prediction is unbiased and the
variance estimator's expectation is the exact design variance), and simulated populations with known μ (numpy):
coverage bounded from both sides and its median ratio to the truth. Negative controls: the normal-theory (t) factor
undercovers on heavy-tailed effects, wrong Horvitz-Thompson weights undercover, dropping the measurement errors
undercovers when the edges' errors are shared, and a large edge the approximation ranks last is invisible when the
sample misses it (the stated limitation).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from circuitstat.core.errors import InputError
from circuitstat.stats.verified.missed_mass import (default_strata, merge_small_strata, missed_mass_bound,
                                                    rank_strata, unsampled_total_upper)


def test_rank_strata_cut_the_ranking_into_equal_blocks():
    score = np.array([0.1, -5.0, 0.3, 2.0, 0.0, -0.2, 1.0, 0.05, 0.5])
    s = rank_strata(score, 3)
    order = np.argsort(-np.abs(score), kind="stable")
    np.testing.assert_array_equal(s[order], [0, 0, 0, 1, 1, 1, 2, 2, 2])
    with pytest.raises(InputError):
        rank_strata(score, 10)


def test_short_blocks_merge_into_a_neighbour():
    strata = np.repeat(np.arange(4), 5)  # 4 blocks of 5 edges
    sampled = np.array([0, 1, 5, 10, 11, 12, 19])  # blocks hold 2, 1, 3, 1 sampled edges
    new = merge_small_strata(strata, sampled)
    # block 1 (1 sampled) joins block 2; block 3 (1 sampled, last) joins the previous group
    np.testing.assert_array_equal(new, np.repeat([0, 1, 1, 1], 5))
    assert all(np.sum(new[sampled] == h) >= 2 for h in np.unique(new))


def test_prediction_and_variance_estimator_by_enumerating_every_sample():
    """Over every stratified sample of 2 blocks (sizes 6 and 5, 3 and 2 drawn): the mean of the prediction of the
    unsampled total equals that total's mean, and the mean of the variance estimator the exact design variance."""
    y = np.array([5.0, 3.0, 2.5, 2.0, 1.0, 0.7, 0.4, 0.3, 0.1, 0.05, 0.0])
    strata = np.array([0] * 6 + [1] * 5)
    sizes = np.array([6, 5])
    errs, vs = [], []
    for a in itertools.combinations(range(6), 3):
        for b in itertools.combinations(range(6, 11), 2):
            s = np.array(a + b)
            total, sd, _, _ = unsampled_total_upper(y[s], np.zeros(s.size), strata[s], sizes, 0.95)
            errs.append(total - (y.sum() - y[s].sum()))
            vs.append(sd ** 2)
    errs, vs = np.array(errs), np.array(vs)
    assert errs.mean() == pytest.approx(0.0, abs=1e-12)
    assert vs.mean() == pytest.approx(np.mean(errs ** 2), rel=1e-12)  # unbiased for the exact design variance
    S2 = [y[strata == h].var(ddof=1) for h in (0, 1)]
    assert np.mean(errs ** 2) == pytest.approx(6 * 3 * S2[0] / 3 + 5 * 3 * S2[1] / 2, rel=1e-12)  # Cochran eq. 5.6


def _population(kind: str, R: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (μ, approximation's mean) of R edges: ``mix`` 10% large edges, ``logn`` lognormal magnitudes."""
    rng = np.random.default_rng(seed)
    if kind == "mix":
        big = rng.random(R) < 0.1
        mu = np.where(big, rng.choice([-1, 1], R) * rng.uniform(0.2, 1.0, R), rng.normal(0, 0.03, R))
        return mu, 0.8 * mu + rng.normal(0, 0.1, R)
    mu = rng.choice([-1, 1], R) * np.exp(rng.normal(-3, 1.2, R))
    return mu, mu * rng.uniform(0.3, 1.5, R) + rng.normal(0, 0.05, R)


def _coverage(mu, approx, r, D, seed, **kw) -> tuple[float, float, float]:
    """Return (hold rate, its MC SE, median bound / truth) over D uniform samples of r edges, effects known."""
    rng = np.random.default_rng(seed)
    holds, ratio = [], []
    for _ in range(D):
        s = rng.choice(mu.size, r, replace=False)
        m = missed_mass_bound(np.abs(mu[s]), np.zeros(r), s, approx, confidence_level=0.95, **kw)
        truth = np.abs(mu).sum() - np.abs(mu[s]).sum()
        holds.append(truth <= m.high)
        ratio.append(m.high / truth)
    p = float(np.mean(holds))
    return p, float(np.sqrt(max(p * (1 - p), 1 / D) / D)), float(np.median(ratio))


@pytest.mark.parametrize("kind", ["mix", "logn"])
@pytest.mark.parametrize("seed", [3, 4])
def test_bound_holds_its_level_and_is_not_trivial(kind, seed):
    """60 of 1000 edges sampled (6 rank blocks), each population drawn afresh: the bound holds at 0.95 and its
    median is at most 2.5x the truth (measured 0.98-1.00 and 1.4-2.1 over 4 draws of each kind)."""
    mu, approx = _population(kind, 1000, seed)
    p, se, ratio = _coverage(mu, approx, 60, 300, 5)
    assert p >= 0.95 - 2 * se, (p, se)
    assert ratio <= 2.5, ratio


def test_few_sampled_edges_can_undercover():
    """The bound plugs in the sample's spread: with 15 of 45 edges (one block) a draw of the 10% mixture whose few
    large edges the sample often misses undercovers badly; this is why the label says approximate."""
    mu, approx = _population("mix", 45, 2)
    p, se, _ = _coverage(mu, approx, 15, 500, 5)
    assert p < 0.95 - 3 * se, (p, se)


def test_negative_control_t_factor_undercovers_heavy_tails():
    mu, approx = _population("logn", 300, 2)
    p, se, _ = _coverage(mu, approx, 40, 1000, 5, method="t")
    assert _coverage(mu, approx, 40, 1000, 5)[0] >= 0.95  # the Cantelli factor on the same samples
    assert p < 0.95 - 3 * se, (p, se)


def test_negative_control_wrong_weights_undercover():
    """Blocks declared half their size (weights (R_h − r_h) / r_h too small): the bound misses."""
    mu, approx = _population("mix", 1000, 2)
    rng = np.random.default_rng(6)
    blocks = rank_strata(approx, default_strata(60))
    holds = []
    for _ in range(500):
        s = rng.choice(mu.size, 60, replace=False)
        strata = merge_small_strata(blocks, s)
        sizes = np.bincount(strata)
        wrong = np.maximum(sizes // 2, np.bincount(strata[s], minlength=sizes.size))
        _, _, _, up = unsampled_total_upper(np.abs(mu[s]), np.zeros(60), strata[s], wrong, 0.95)
        holds.append(np.abs(mu).sum() - np.abs(mu[s]).sum() <= up)
    assert np.mean(holds) < 0.5


def test_measurement_errors_count_when_the_edges_share_them():
    """Estimated effects whose errors share one prompt-level component: the bound with the SEs holds; with them
    set to 0 (known effects assumed) it fails about half the time."""
    rng = np.random.default_rng(8)
    R, r, se = 200, 40, 0.3
    mu = 1.0 + rng.normal(0, 0.05, R)
    with_se, without = [], []
    for _ in range(400):
        s = rng.choice(R, r, replace=False)
        est = np.abs(mu[s] + se * rng.standard_normal())  # one shared error: perfectly correlated edges
        truth = mu.sum() - mu[s].sum()
        with_se.append(truth <= missed_mass_bound(est, np.full(r, se), s, mu, confidence_level=0.95).high)
        without.append(truth <= missed_mass_bound(est, np.zeros(r), s, mu, confidence_level=0.95).high)
    assert np.mean(with_se) >= 0.95 and 0.3 < np.mean(without) < 0.7, (np.mean(with_se), np.mean(without))


def test_a_large_edge_ranked_last_is_invisible_when_missed():
    """The stated limitation: an edge the approximation reads as 0 but with |μ| far above the rest breaks the bound
    in the samples that miss it, and the bound exceeds it in those that catch it."""
    mu, approx = _population("mix", 300, 3)
    last = int(np.argmin(np.abs(approx)))
    mu[last] = 200.0
    rng = np.random.default_rng(9)
    caught, missed = [], []
    for _ in range(300):
        s = rng.choice(mu.size, 40, replace=False)
        m = missed_mass_bound(np.abs(mu[s]), np.zeros(40), s, approx, confidence_level=0.95)
        truth = np.abs(mu).sum() - np.abs(mu[s]).sum()
        (caught if last in s else missed).append((truth <= m.high, m.high))
    assert caught and missed
    assert np.mean([h for h, _ in missed]) < 0.05  # misses the 200 it never saw
    assert all(b > 200.0 for _, b in caught)  # an edge seen is weighted up, never hidden


def test_bad_input_is_refused():
    with pytest.raises(InputError):
        missed_mass_bound(np.array([0.1, -0.2]), np.zeros(2), np.array([0, 1]), np.zeros(5))
    with pytest.raises(InputError):
        missed_mass_bound(np.array([0.1]), np.zeros(1), np.array([0]), np.zeros(5))
    with pytest.raises(InputError):
        missed_mass_bound(np.array([0.1, 0.2]), np.zeros(2), np.array([0, 1]), np.zeros(5), method="normal")
