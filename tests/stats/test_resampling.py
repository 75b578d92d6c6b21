"""Resampling plans and the chunked engine: sizes, seeds, chunk-size and n_jobs invariance."""

import numpy as np
import pytest

from circuitstat.stats.intervals import bootstrap_edges
from circuitstat.stats.resampling import (PoissonBootstrapAccumulator, ResamplingPlan, map_edge_chunks, resample_statistic, resampled_means)
from circuitstat.core.seeds import spawn_seeds


@pytest.fixture(scope="module")
def scores():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((40, 257)) + rng.standard_normal(257)).astype(np.float32)


def test_bootstrap_plan_matches_scipy_index_draw():
    plan = ResamplingPlan.bootstrap(30, 50, seed=7)
    idx = np.random.default_rng(7).integers(0, 30, (50, 30))
    expect = np.stack([np.bincount(r, minlength=30) for r in idx])
    np.testing.assert_array_equal(plan.counts, expect)
    assert (plan.totals == 30).all()
    assert plan.seed["entropy"] == 7


def test_plans_have_the_promised_structure():
    sub = ResamplingPlan.subsample(21, 40, seed=1)
    assert set(np.unique(sub.counts)) <= {0, 1} and (sub.counts.sum(1) == 10).all()
    assert sub.is_half_subsample
    cp = ResamplingPlan.complementary_pairs(21, 15, seed=1)
    assert cp.n_resamples == 30 and cp.n_pairs == 15
    both = cp.counts[0::2] + cp.counts[1::2]
    assert both.max() == 1 and (both.sum(1) == 20).all()  # disjoint halves
    groups = np.repeat(np.arange(6), [1, 2, 3, 4, 5, 6])
    cl = ResamplingPlan.cluster(groups, 25, seed=2)
    for g in range(6):  # every member of a group is drawn equally often
        assert (cl.counts[:, groups == g] == cl.counts[:, groups == g][:, :1]).all()
    assert not ResamplingPlan.bootstrap(10, 5, seed=0).is_half_subsample


def test_seeds_reproduce_and_spawn_is_stable():
    a = ResamplingPlan.bootstrap(20, 10, seed=np.random.SeedSequence(3))
    b = ResamplingPlan.bootstrap(20, 10, seed=np.random.SeedSequence(3))
    np.testing.assert_array_equal(a.counts, b.counts)
    s1, s2 = spawn_seeds(5, 3), spawn_seeds(5, 3)
    assert [s.generate_state(1)[0] for s in s1] == [s.generate_state(1)[0] for s in s2]
    assert len({s.generate_state(1)[0] for s in s1}) == 3
    fresh = ResamplingPlan.bootstrap(20, 4)  # OS entropy, but recorded so it can be replayed
    again = ResamplingPlan.bootstrap(20, 4, seed=fresh.seed["entropy"])
    np.testing.assert_array_equal(fresh.counts, again.counts)


def test_poisson_weights_do_not_depend_on_stream_batching():
    rng = np.random.default_rng(1)
    S = rng.standard_normal((700, 9))
    acc1 = PoissonBootstrapAccumulator(9, 16, seed=4)
    acc1.update(S)
    acc2 = PoissonBootstrapAccumulator(9, 16, seed=4)
    for lo, hi in [(0, 3), (3, 300), (300, 301), (301, 700)]:
        acc2.update(S[lo:hi])
    np.testing.assert_allclose(acc1.resampled_means(), acc2.resampled_means(), rtol=1e-12)
    plan = ResamplingPlan.poisson(700, 16, seed=4)
    np.testing.assert_array_equal(plan.counts, acc1.plan().counts)
    np.testing.assert_allclose(resampled_means(S, plan), acc1.resampled_means(), rtol=1e-12)
    assert abs(plan.counts.mean() - 1) < 0.05


def test_resampled_means_equal_explicit_weighted_means(scores):
    plan = ResamplingPlan.cluster(np.arange(40) // 4, 30, seed=3)
    got = resampled_means(scores, plan)
    w = plan.counts.astype(np.float64)
    expect = (w @ scores.astype(np.float64) / w.sum(1, keepdims=True)).T
    np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_results_do_not_depend_on_chunk_size_or_jobs(scores, n_jobs):
    plan = ResamplingPlan.bootstrap(40, 120, seed=11)
    ref = bootstrap_edges(scores, plan, method="bca", methods=["percentile", "basic"], chunk_size=257)
    for chunk in (1, 13, 100):
        got = bootstrap_edges(scores, plan, method="bca", methods=["percentile", "basic"], chunk_size=chunk,
                              n_jobs=n_jobs)
        for m in ("bca", "percentile", "basic"):
            np.testing.assert_array_equal(got.intervals[m].low, ref.intervals[m].low)
            np.testing.assert_array_equal(got.intervals[m].high, ref.intervals[m].high)
        np.testing.assert_array_equal(got.standard_error, ref.standard_error)


def test_chunks_arrive_in_order_with_threads(scores):
    plan = ResamplingPlan.bootstrap(40, 8, seed=0)
    starts = [sl.start for sl in map_edge_chunks(scores, plan, lambda r, s, sl: sl,
                                                 chunk_size=10, n_jobs=2)]
    assert starts == list(range(0, 257, 10))


def test_resample_statistic_matches_a_loop():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((25, 3))
    plan = ResamplingPlan.bootstrap(25, 40, seed=5)
    got = resample_statistic(x, np.median, plan)  # vectorised path
    loop = np.stack([np.median(x[plan.indices(b)], axis=0) for b in range(40)], axis=-1)
    np.testing.assert_allclose(got, loop)
    nonvec = resample_statistic(x[:, 0], lambda v: np.median(v), plan, vectorized=False)
    np.testing.assert_allclose(nonvec, loop[0])
    par = resample_statistic(x, np.median, plan, batch=7, n_jobs=2)
    np.testing.assert_array_equal(par, got)


def test_bad_input_is_refused_with_a_named_fix():
    S = np.ones((10, 4))
    S[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_edges(S, n_resamples=10, seed=0)
    with pytest.raises(ValueError, match="empty"):
        bootstrap_edges(np.zeros((0, 3)), n_resamples=10, seed=0)
    with pytest.raises(ValueError, match="rows"):
        bootstrap_edges(np.ones((10, 3)), ResamplingPlan.bootstrap(9, 5, seed=0))
    with pytest.raises(ValueError, match="not both"):
        bootstrap_edges(np.ones((10, 3)), ResamplingPlan.bootstrap(10, 5, seed=0), seed=1)
    with pytest.raises(TypeError, match="SeedSequence"):
        ResamplingPlan.bootstrap(10, 5, seed=np.random.default_rng(0))


def test_stats_does_not_import_torch_or_circuits():
    import subprocess
    import sys

    # stats raises circuitstat.core.errors.InputError (the ground floor's; the CLI's exit-2 error) and imports nothing of circuits
    code = ("import sys, stats; import circuitstat.stats.similarity, circuitstat.stats.variance, circuitstat.stats.faithfulness, circuitstat.stats.topk_stream; "
            "import circuitstat.stats.stability_data, circuitstat.stats.head_stability, circuitstat.stats.calibration; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'circuits')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
