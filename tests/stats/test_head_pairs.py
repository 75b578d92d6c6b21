"""Pair-level head statistics (circuitstat.stats.head_pairs) against brute-force loops, without torch."""

import numpy as np
import pytest

from circuitstat.stats.head_pairs import null_means, pair_similarities, residual_cka, untrained_null_scores
from circuitstat.stats.similarity import linear_cka


def _patterns(rng, n_layers=2, n_heads=3, n_prompts=5, length=6):
    """Random causal attention patterns [L, H, P, T, T] (rows sum to one over the allowed keys)."""
    x = rng.random((n_layers, n_heads, n_prompts, length, length)) * np.tril(np.ones((length, length)))
    return x / x.sum(-1, keepdims=True)


def _cosine(a, b):
    """Cosine of the lower triangles (with diagonal) of two [T, T] patterns."""
    idx = np.tril_indices(a.shape[0])
    u, v = a[idx], b[idx]
    return float(u @ v / np.linalg.norm(u) / np.linalg.norm(v))


def test_pair_similarities_are_per_prompt_cosines_averaged_over_prompts():
    rng = np.random.default_rng(0)
    pats = [_patterns(rng) for _ in range(3)]
    sims = pair_similarities(pats, anchor=1, drop_bos=False, prompt_plan=None, n_resamples=4)
    assert sorted(sims.pairs) == [(a, b) for a in range(3) for b in range(3) if a != b]
    for a, b in sims.pairs:
        for layer in range(2):
            brute = np.array([[np.mean([_cosine(pats[a][layer, h, p], pats[b][layer, g, p]) for p in range(5)])
                               for g in range(3)] for h in range(3)])
            np.testing.assert_allclose(sims.point[sims.index(a, b), layer], brute, rtol=1e-12)
    # (b, a) is the transpose of (a, b); without a plan every replicate is the point estimate
    np.testing.assert_allclose(sims.point[sims.index(0, 2)], sims.point[sims.index(2, 0)].transpose(0, 2, 1))
    assert sims.replicates.shape == (4,) + sims.point.shape and np.all(sims.replicates == sims.point)


def test_null_means_average_the_anchor_pairs_and_every_source_pair():
    rng = np.random.default_rng(1)
    pairs = rng.random((4, 4, 2, 3))
    pairs[np.arange(4), np.arange(4)] = np.nan
    pairs[2, 3, 1, 0] = np.nan  # an undefined head is left out of its pair's layer mean
    head, layer = null_means(pairs, anchor=0, targets=[1, 2, 3], sources=[0, 2])
    np.testing.assert_allclose(head, (pairs[0, 1] + pairs[0, 2] + pairs[0, 3]) / 3)
    cells = [(a, b) for a in (0, 2) for b in range(4) if b != a]
    brute = np.mean([[np.nanmean(pairs[a, b, lay]) for lay in range(2)] for a, b in cells], axis=0)
    np.testing.assert_allclose(layer, brute)


def test_untrained_null_scores_match_each_refit_against_every_untrained_model():
    rng = np.random.default_rng(2)
    refits = [_patterns(rng, n_heads=2) for _ in range(2)]
    untrained = [_patterns(rng, n_heads=2) for _ in range(3)]
    got = untrained_null_scores(refits, untrained, "max", drop_bos=False)
    for a in range(2):
        per_model = []
        for u in untrained:
            sim = np.array([[[np.mean([_cosine(refits[a][lay, h, p], u[lay, g, p]) for p in range(5)])
                              for g in range(2)] for h in range(2)] for lay in range(2)])
            per_model.append(sim.max(-1))  # "max": each head's best match in the other model's layer
        np.testing.assert_allclose(got[a], np.mean(per_model, axis=0), rtol=1e-12)


def test_residual_cka_point_and_refit_level_against_direct_cka():
    rng = np.random.default_rng(3)
    n_refits, n_layers, rows = 4, 2, 24
    base = rng.normal(size=(rows, 5))
    reprs = [{m: base @ rng.normal(size=(5, 6)) + 0.3 * rng.normal(size=(rows, 6)) for m in range(n_refits)}
             for _ in range(n_layers)]
    pairs = [(0, b) for b in range(1, n_refits)]
    weights = np.full((7, len(pairs)), 1.0 / len(pairs))
    r = residual_cka(reprs, pairs, "linear", 1, None, 7, weights, 0.95)
    for layer in range(n_layers):
        direct = [linear_cka(reprs[layer][a], reprs[layer][b]) for a, b in pairs]
        np.testing.assert_allclose(r["point"][layer], direct, rtol=1e-12)
        every = [linear_cka(reprs[layer][a], reprs[layer][b]) for a in range(n_refits) for b in range(a + 1, n_refits)]
        assert r["estimate"][layer] == pytest.approx(np.mean(every), rel=1e-12)
        # leaving refit 0 out averages the pairs among the others
        others = [linear_cka(reprs[layer][a], reprs[layer][b]) for a in range(1, n_refits)
                  for b in range(a + 1, n_refits)]
        assert r["leave_one_out"][0, layer] == pytest.approx(np.mean(others), rel=1e-12)
        assert r["low"][layer] <= r["estimate"][layer] <= r["high"][layer]
    # no prompt plan: the replicates are the point estimate, so the percentile interval is a point
    np.testing.assert_allclose(r["boot_low"], r["point"].mean(1))
    np.testing.assert_allclose(r["boot_high"], r["point"].mean(1))
