"""Coverage of the data-level circuit-stability intervals (circuitstat.stats.stability_data).

The default method (bracketed_2n: the halves' value, the split-half extrapolation and plug-in -
|bias| below, the plug-in of size-2N resamples and plug-in + |bias| above, each -+ z se) is
checked on smooth heavy-tailed populations (circuitstat.stats.populations.smooth_tail_population), where
the estimand is computed by Monte Carlo over many pairs of datasets drawn from the population.
Two cells: N = 64, k = 10, and N = 128, k = 5, where a real score gap sits at the cut-off, the
plug-in is biased down by ~0.09 and the former method ("bracketed", upper end plug-in + |bias|)
covers 0.73 on these datasets (0.70 in the grid of stats/stability_data). Not a blind check:
that cell was used to diagnose the failure; the grid there covers six populations, two of them
unseen. Coverage is bounded from both sides and the width against the estimator's own spread
across datasets, so neither an anti-conservative interval (the old Monte Carlo "CI" covered
~0.2) nor a uselessly wide one passes.
"""

import numpy as np
import pytest

from circuitstat.stats.populations import draw_datasets, smooth_tail_population
from circuitstat.stats.stability import circuit_stability
from circuitstat.core.topk import topk

N_DATASETS = 120


def _truth(pop, n, k, n_pairs, seed):
    """Monte Carlo E[Jaccard] of the top-k of two independent size-n datasets, and to the
    population's top-k."""
    rng = np.random.default_rng(seed)
    m1 = pop[rng.integers(0, pop.shape[0], (n_pairs, n))].mean(axis=1)
    m2 = pop[rng.integers(0, pop.shape[0], (n_pairs, n))].mean(axis=1)
    a = topk(m1, k, ranking="absolute", seed=rng).indices
    b = topk(m2, k, ranking="absolute", seed=rng).indices
    p = topk(np.repeat(pop.mean(axis=0)[None], n_pairs, 0), k, ranking="absolute",
             seed=rng).indices
    inter = np.array([np.intersect1d(x, y).size for x, y in zip(a, b)])
    inter_p = np.array([np.intersect1d(x, y).size for x, y in zip(a, p)])
    return np.mean(inter / (2 * k - inter)), np.mean(inter_p / (2 * k - inter_p))


@pytest.mark.slow
@pytest.mark.parametrize("n_edges, pop_seed, n, k", [(60, 2026, 64, 10), (100, 5, 128, 5)])
def test_data_level_jaccard_interval_covers_on_an_unseen_population(n_edges, pop_seed, n, k):
    pop = smooth_tail_population(2000, n_edges, seed=pop_seed)
    truth, truth_pop = _truth(pop, n, k, 4000, seed=1)
    rows = draw_datasets(pop, n, N_DATASETS, seed=7)
    est, lo, hi, mc_lo, mc_hi, p_lo, p_hi = (np.empty(N_DATASETS) for _ in range(7))
    for i, r_i in enumerate(rows):
        r = circuit_stability(pop[r_i], None, [k], ranking="absolute", n_resamples=200,
                              seed=100 + i, n_rank_resamples=0, n_outer=60, n_inner=15)
        est[i] = r.per_k["jaccard_data"][0]
        lo[i], hi[i] = (v[0] for v in r.conf_int(which="jaccard_data_ci")[:2])
        p_lo[i], p_hi[i] = (v[0] for v in r.conf_int(which="jaccard_pop_ci")[:2])
        mc_lo[i], mc_hi[i] = (v[0] for v in r.conf_int(which="jaccard_ci")[:2])
    cover = np.mean((lo <= truth) & (truth <= hi))
    cover_pop = np.mean((p_lo <= truth_pop) & (truth_pop <= p_hi))
    width_sd = np.mean(hi - lo) / est.std(ddof=1)
    print(f"coverage {cover:.3f}, width {np.mean(hi - lo):.3f} = {width_sd:.2f} SD, truth "
          f"{truth:.3f}; to the population: coverage {cover_pop:.3f}, truth {truth_pop:.3f}")
    assert 0.90 <= cover <= 0.995, cover
    assert 0.90 <= cover_pop, cover_pop
    # not uselessly wide: a correct normal interval is 3.92 SD of the estimate across datasets;
    # the bracket adds the bias either way, the halves' value and split extrapolation below and
    # the size-2N plug-in above (measured here: 5.6 SD at N = 128, k = 5; 8.4 at N = 64,
    # k = 10), so the bound is 2.5 times the normal width
    assert width_sd < 2.5 * 3.92, width_sd
    # the Monte Carlo interval is not a data-level interval: it must miss most of the time
    assert np.mean((mc_lo <= truth) & (truth <= mc_hi)) < 0.5
