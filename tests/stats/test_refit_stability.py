"""Stability of refitted score vectors (mask-learning methods): the same statistics as the per-example path."""

from __future__ import annotations

import numpy as np
import pytest

from circuitstat.stats import ResamplingPlan
from circuitstat.stats.resampling import resampled_means
from circuitstat.stats.stability import circuit_stability, refit_stability


def test_refits_equal_to_resampled_means_give_circuit_stabilitys_values() -> None:
    rng = np.random.default_rng(0)
    S = rng.standard_t(3, size=(40, 60)) + np.linspace(0, 1.5, 60)
    plan = ResamplingPlan.bootstrap(40, 30, 7)
    ks = [5, 12]
    ref = circuit_stability(S, plan, ks, ranking="absolute", data_level=False)
    got = refit_stability(resampled_means(S, plan).T, plan, ks, ranking="absolute")
    np.testing.assert_array_equal(got.inclusion_counts, ref.inclusion_counts)
    np.testing.assert_allclose(got.per_k["jaccard_mean"], ref.per_k["jaccard_mean"], rtol=1e-12)
    # brute force: each refit's own top-k, counted per edge
    V = resampled_means(S, plan).T
    counts = np.zeros(60, dtype=int)
    for v in V:
        counts[np.argsort(-np.abs(v))[:5]] += 1
    np.testing.assert_array_equal(got.inclusion_counts[0], counts)
    assert got.params["plan"]["kind"] == "bootstrap" and got.params["estimator"] == "refit_stability"
    assert 0 < got.per_k["jaccard_mean"][0] < 1  # neither identical nor disjoint circuits: a real check


def test_refit_stability_refuses_a_vector_count_unlike_the_plan() -> None:
    plan = ResamplingPlan.bootstrap(10, 4, 0)
    with pytest.raises(ValueError, match=r"\[4, E\]"):
        refit_stability(np.zeros((3, 8)), plan, [2], ranking="absolute")
