"""No zero-width data-level stability interval where the estimate is not exact (issue 34, part 3).

A population whose top-2 circuit is nearly, but not perfectly, stable at N = 32 (a dataset's
top-2 differs from the population's in about 0.1% of datasets, E[J] = 0.998): in many datasets
every bootstrap resample gives the same top-2, the bracket's spread is 0 and the former interval
was [1, 1], a miss. The lower end must now reach below the truth in every such dataset (2 of these 7 datasets gave [1, 1] before).
"""

import numpy as np
from scipy import stats

from circuitstat.stats.stability import circuit_stability
from circuitstat.stats.stability_data import resolution_floor

E, N, K = 12, 32, 2


def _population() -> np.ndarray:
    rng = np.random.default_rng(0)
    means = np.r_[3.0, 2.5, 1.75, np.linspace(0.5, 0.0, E - 3)]
    pop = means + rng.standard_normal((4000, E))
    return pop - (pop.mean(axis=0) - means)


def _truth(pop: np.ndarray, n_pairs: int = 50_000) -> float:
    """Monte Carlo E[Jaccard(top-2 of D1, top-2 of D2)] over independent size-N datasets (no ties: continuous)."""
    rng = np.random.default_rng(1)
    tops = [np.sort(np.argsort(-pop[rng.integers(0, len(pop), (n_pairs, N))].mean(axis=1), axis=1)[:, :K], axis=1)
            for _ in range(2)]
    inter = (tops[0][:, :, None] == tops[1][:, None, :]).sum(axis=(1, 2))
    return float(np.mean(inter / (2 * K - inter)))


def test_nearly_stable_circuit_gets_a_lower_end_below_one_that_covers():
    pop = _population()
    truth = _truth(pop)
    assert 0.995 < truth < 0.9999  # nearly, not perfectly, stable
    rng = np.random.default_rng(5)
    all_same, covered = 0, 0
    for i in range(7):  # datasets 3 and 6 gave [1, 1] before
        r = circuit_stability(pop[rng.integers(0, len(pop), N)], None, [K], ranking="signed", n_resamples=200,
                              seed=i, n_rank_resamples=0, n_outer=50, n_inner=10)
        lo, hi = (v[0] for v in r.conf_int(which="jaccard_data_ci")[:2])
        p_lo, p_hi = (v[0] for v in r.conf_int(which="phi_data_ci")[:2])
        all_same += r.per_k["jaccard_data"][0] == 1.0
        assert lo < hi and p_lo < p_hi  # never zero width: the estimate is not exact
        covered += lo <= truth <= hi
    assert all_same >= 3  # the case the issue reports: every resample gave the same circuit
    assert covered == 7


def test_resolution_floor_is_the_clopper_pearson_bound_when_every_resample_agrees():
    tops = np.tile([4, 7, 1], (550, 1))
    j, phi = resolution_floor(tops, 2, 12, 0.95)
    q = 1 - 0.025 ** (1 / 550)  # Clopper-Pearson upper bound for 0 of 550, closed form
    assert np.isclose(q, stats.binomtest(0, 550).proportion_ci(0.95, "exact").high)
    assert np.isclose(j, 1 - 2 * q) and np.isclose(phi, 1 - 2 * q * 12 / 10)


def test_resolution_floor_with_differing_resamples_is_a_metric_bound():
    rng = np.random.default_rng(3)
    tops = np.tile([0, 1], (400, 1))
    tops[:9, 1] = 2  # 9 resamples swap one edge: Jaccard 1/3 to the mode, distance 2/3
    j, _ = resolution_floor(tops, 2, 12, 0.95)
    q = stats.binomtest(9, 400).proportion_ci(0.95, "exact").high  # two-sided 95% upper = one-sided 97.5%
    assert np.isclose(j, 1 - 2 * q * 2 / 3)
    # the bound holds for the resamples' own mean pairwise Jaccard (triangle inequality), here by brute force
    rows = tops[rng.permutation(400)]
    inter = (rows[:, None, :, None] == rows[None, :, None, :]).sum(axis=(2, 3))
    jac = inter / (4 - inter)
    assert j <= (jac.sum() - 400) / (400 * 399)
    tops[9, 1] = 3  # from MIN_EVENTS = 10 differing resamples on, the bracket's standard error resolves them
    assert np.isnan(resolution_floor(tops, 2, 12, 0.95)).all()
