"""Nulls and refit-level contrasts of head stability (circuitstat.stats.head_nulls) against brute force and scipy."""

import numpy as np
import pytest
from scipy import stats as sps

from circuitstat.stats.head_nulls import (GAP_SHUFFLES, importance_correlations, layer_summaries_with_shuffled_gap,
                              prompt_null_pairs, residual_minus_head_jackknife, untrained_null_pairs)
from circuitstat.stats.head_stability import refit_jackknife


def _patterns(rng, n_layers=2, n_heads=3, n_prompts=6, length=5):
    """Random causal attention patterns [L, H, P, T, T]."""
    x = rng.random((n_layers, n_heads, n_prompts, length, length)) * np.tril(np.ones((length, length)))
    return x / x.sum(-1, keepdims=True)


def test_untrained_null_pairs_repeat_each_refits_null_along_its_row():
    per_refit = np.random.default_rng(0).random((3, 2, 4))
    out = untrained_null_pairs(per_refit)
    assert out.shape == (3, 3, 2, 4)
    for a in range(3):
        assert np.isnan(out[a, a]).all()
        for b in range(3):
            if b != a:
                np.testing.assert_array_equal(out[a, b], per_refit[a])
    out[0, 1, 0, 0] = -1.0  # a copy: writing one pair changes neither the input nor another pair
    assert per_refit[0, 0, 0] != -1.0 and out[0, 2, 0, 0] != -1.0


def test_prompt_null_of_the_anchor_pairs_does_not_depend_on_the_other_pairs():
    rng = np.random.default_rng(1)
    pats = [_patterns(rng) for _ in range(3)]
    seed = np.random.SeedSequence(7)
    anchor_only = prompt_null_pairs(pats, 1, [(1, 0), (1, 2)], "max", False, 6, seed)
    every = prompt_null_pairs(pats, 1, [(a, b) for a in range(3) for b in range(3) if a != b], "max", False, 6, seed)
    for b in (0, 2):
        np.testing.assert_array_equal(anchor_only[1, b], every[1, b])
        assert np.isfinite(every[1, b]).all()
    assert np.isnan(anchor_only[0, 2]).all() and np.isfinite(every[0, 2]).all()
    # shuffled prompts pair unrelated patterns: matched cosines below 1, above 0
    assert 0 < np.nanmin(every) and np.nanmax(every) < 1


def test_shuffled_gap_is_the_mean_gap_over_shuffles_of_heads_across_layers():
    rng = np.random.default_rng(2)
    heads = rng.random((3, 2))
    head_reps = rng.random((4, 3, 2))
    seed = np.random.SeedSequence(3)
    point, reps = layer_summaries_with_shuffled_gap(heads.mean(-1), head_reps.mean(-1), heads, head_reps, seed)
    perms = np.argsort(np.random.default_rng(seed).random((GAP_SHUFFLES, 6)), axis=1)

    def brute(h):
        gaps = [np.ptp(h.ravel()[p].reshape(3, 2).mean(-1)) for p in perms]
        return np.mean(gaps)

    assert point["gap"] == pytest.approx(np.ptp(heads.mean(-1)))
    assert point["gap_shuffled"] == pytest.approx(brute(heads), rel=1e-12)
    assert point["gap_excess"] == pytest.approx(point["gap"] - brute(heads), rel=1e-12)
    np.testing.assert_allclose(reps["gap_shuffled"], [brute(h) for h in head_reps], rtol=1e-12)
    # a shuffle of heads that are equal within each layer but differ across layers shrinks the gap
    layered = np.repeat(np.array([[0.1], [0.5], [0.9]]), 2, axis=1)
    p2, _ = layer_summaries_with_shuffled_gap(layered.mean(-1), layered.mean(-1)[None], layered, layered[None], seed)
    assert p2["gap"] == pytest.approx(0.8) and p2["gap_shuffled"] < 0.8


def test_importance_correlations_are_pearson_per_layer_and_within_refit_over_deep_layers():
    rng = np.random.default_rng(4)
    K, L, H = 3, 4, 5
    matched = rng.random((K, K, L, H))
    matched[np.arange(K), np.arange(K)] = np.nan
    importance = {0: rng.random((L, H)), 2: rng.random((L, H))}
    rows = importance_correlations(matched, importance, method="pearson", n_permutations=199,
                                   seed=np.random.SeedSequence(5), confidence_level=0.95)
    assert [(r["scope"], r["layer"]) for r in rows] == [("layer", 0), ("layer", 1), ("layer", 2), ("layer", 3),
                                                        ("deep", -1)]
    stability = {a: np.nanmean(matched[a], axis=0) for a in importance}
    for row in rows[:L]:
        layer = row["layer"]
        x = np.concatenate([stability[a][layer] for a in importance])
        y = np.concatenate([importance[a][layer] for a in importance])
        # two refits: centred within refit, so the pooled r is that of the within-refit deviations
        xc = np.concatenate([stability[a][layer] - stability[a][layer].mean() for a in importance])
        yc = np.concatenate([importance[a][layer] - importance[a][layer].mean() for a in importance])
        assert row["r"] == pytest.approx(sps.pearsonr(xc, yc)[0], rel=1e-10)
        assert row["n"] == x.size == y.size and row["n_eff"] == x.size - 1 and row["refits"] == 2
        assert 1 / 200 <= row["pvalue"] <= 1 and row["ci_low"] < row["r"] < row["ci_high"]
    deep = rows[-1]
    cells = [(a, layer) for a in importance for layer in (2, 3)]
    xc = np.concatenate([stability[a][layer] - stability[a][layer].mean() for a, layer in cells])
    yc = np.concatenate([importance[a][layer] - importance[a][layer].mean() for a, layer in cells])
    assert deep["r"] == pytest.approx(sps.pearsonr(xc, yc)[0], rel=1e-10)
    assert deep["n_eff"] == 4 * H - 3


def test_importance_correlation_of_a_planted_relation_is_detected():
    rng = np.random.default_rng(6)
    matched = rng.random((2, 2, 2, 30))
    stability = np.nanmean(np.where(np.eye(2, dtype=bool)[:, :, None, None], np.nan, matched)[0], axis=0)
    importance = {0: -3 * stability + 0.01 * rng.standard_normal(stability.shape)}
    rows = importance_correlations(np.where(np.eye(2, dtype=bool)[:, :, None, None], np.nan, matched), importance,
                                   method="spearman", n_permutations=499, seed=np.random.SeedSequence(1),
                                   confidence_level=0.9)
    for row in rows:
        assert row["r"] < -0.95 and row["pvalue"] == pytest.approx(1 / 500) and row["method"] == "spearman"


def test_residual_minus_head_jackknife_is_the_jackknife_of_the_difference():
    rng = np.random.default_rng(7)
    resid, resid_loo = rng.random(3), rng.random((5, 3))
    head, head_loo = 0.4, rng.random(5)
    diff, low, high = residual_minus_head_jackknife(resid, resid_loo, head, head_loo, 0.9)
    assert diff == pytest.approx(resid.mean() - head)
    want_low, want_high, _ = refit_jackknife(resid.mean() - head, resid_loo.mean(-1) - head_loo, 0.9)
    assert (low, high) == (pytest.approx(want_low), pytest.approx(want_high))
    # the jackknife by hand: pseudo-values' t interval on K - 1 df
    loo = resid_loo.mean(-1) - head_loo
    k = loo.size
    se = np.sqrt((k - 1) / k * np.sum((loo - loo.mean()) ** 2))
    q = sps.t.ppf(0.95, k - 1)
    assert low <= diff <= high and high - low == pytest.approx(2 * q * se, rel=1e-10)
