"""Similarity measures: invariances, oracles (Song et al. HSIC, scipy Procrustes), matching, nulls."""

import numpy as np
import pytest
from scipy.linalg import orthogonal_procrustes
from scipy.stats import ortho_group

from circuitstat.stats.similarity import (attention_similarity, attention_vectors, debiased_cka,
                              head_distinctness, head_matching, linear_cka, match_heads,
                              per_prompt_cosine, procrustes_distance, rbf_cka, similarity_test)


@pytest.fixture(scope="module")
def reps():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 12)) @ rng.standard_normal((12, 12))
    Q = ortho_group.rvs(12, random_state=1)
    return X, Q, rng


def test_cka_invariant_to_orthogonal_transform_and_isotropic_scaling(reps):
    X, Q, _ = reps
    Y = 3.7 * X @ Q + 2.0  # rotation, isotropic scale and shift
    assert linear_cka(X, Y) == pytest.approx(1.0, abs=1e-12)
    assert debiased_cka(X, Y) == pytest.approx(1.0, abs=1e-12)
    assert rbf_cka(X, Y) == pytest.approx(1.0, abs=1e-12)
    assert procrustes_distance(X, Y) == pytest.approx(0.0, abs=1e-10)
    # not invariant to anisotropic scaling: the measure can detect a change
    Z = X * np.linspace(0.1, 3, 12)
    assert linear_cka(X, Z) < 0.99


def test_debiased_cka_near_zero_for_independent_wide_data():
    rng = np.random.default_rng(3)
    n, p = 40, 400  # more features than samples: biased CKA is far from 0 here
    X, Y = rng.standard_normal((n, p)), rng.standard_normal((n, p))
    assert abs(debiased_cka(X, Y)) < 0.05
    assert linear_cka(X, Y) > 0.5


def _hsic_song(K, L):
    # Song et al. (2012) unbiased HSIC, written out directly
    n = K.shape[0]
    K, L = K.copy(), L.copy()
    np.fill_diagonal(K, 0)
    np.fill_diagonal(L, 0)
    one = np.ones(n)
    return (np.trace(K @ L) + (one @ K @ one) * (one @ L @ one) / ((n - 1) * (n - 2))
            - 2 / (n - 2) * one @ K @ L @ one) / (n * (n - 3))


def test_debiased_cka_equals_song_unbiased_hsic(reps):
    X, _, rng = reps
    Y = X[:, :5] + rng.standard_normal((60, 5))
    K, L = X @ X.T, Y @ Y.T
    expect = _hsic_song(K, L) / np.sqrt(_hsic_song(K, K) * _hsic_song(L, L))
    assert debiased_cka(X, Y) == pytest.approx(expect, rel=1e-10)


def test_linear_cka_feature_and_gram_forms_agree(reps):
    X, _, rng = reps
    Y = rng.standard_normal((60, 7))
    H = np.eye(60) - 1 / 60
    K, L = H @ X @ X.T @ H, H @ Y @ Y.T @ H
    assert linear_cka(X, Y) == pytest.approx(np.sum(K * L) / np.sqrt(np.sum(K * K) * np.sum(L * L)))


def test_procrustes_matches_scipy(reps):
    X, _, rng = reps
    Y = rng.standard_normal((60, 12))
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    Xc, Yc = Xc / np.linalg.norm(Xc), Yc / np.linalg.norm(Yc)
    R, _ = orthogonal_procrustes(Xc, Yc)
    assert procrustes_distance(X, Y) == pytest.approx(np.linalg.norm(Xc @ R - Yc) ** 2, rel=1e-10)


def _patterns(rng, H, P, T, bos=0.0):
    logits = rng.standard_normal((H, P, T, T)) * 2
    logits[..., 0] += bos
    mask = np.tril(np.ones((T, T), dtype=bool))
    a = np.where(mask, np.exp(logits), 0.0)
    return a / a.sum(-1, keepdims=True)


def test_attention_cosine_brute_force():
    rng = np.random.default_rng(4)
    A, B = _patterns(rng, 3, 5, 6), _patterns(rng, 2, 5, 6)
    sim = attention_similarity(A, B)
    for h in range(3):
        for g in range(2):
            cos = []
            for p in range(5):
                a = A[h, p][np.tril_indices(6)]
                b = B[g, p][np.tril_indices(6)]
                cos.append(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
            assert sim[h, g] == pytest.approx(np.mean(cos), rel=1e-12)
    assert attention_vectors(A, drop_bos=True).shape[-1] == 6 * 7 // 2 - 6
    assert per_prompt_cosine(A, B).shape == (5, 3, 2)
    assert head_distinctness(A).shape == (3,)


def test_hungarian_recovers_a_known_permutation_and_max_is_many_to_one():
    rng = np.random.default_rng(5)
    A = _patterns(rng, 8, 20, 10)
    perm = rng.permutation(8)
    B = A[perm] + 0.01 * rng.random(A[perm].shape)  # refit: same heads, shuffled order, noisy
    res = head_matching(A, B, method="hungarian", n_permutations=50, n_resamples=50, seed=0)
    np.testing.assert_array_equal(res.match, np.argsort(perm))
    assert res.estimate > 0.99 and res.pvalue == pytest.approx(1 / 51)
    assert res.confidence_interval.low <= res.estimate <= res.confidence_interval.high + 1e-12
    assert (res.null_head_mean < res.score).all()
    sim = np.array([[0.9, 0.8], [0.85, 0.1], [0.7, 0.2]])
    m, s = match_heads(sim, "max")
    np.testing.assert_array_equal(m, [0, 0, 0])  # many-to-one
    m, s = match_heads(sim, "hungarian")
    assert sorted(m[m >= 0].tolist()) == [0, 1] and np.isnan(s).sum() == 1


def test_bos_sinks_inflate_similarity_and_the_null_shows_it():
    rng = np.random.default_rng(6)
    A, B = _patterns(rng, 4, 30, 12, bos=4.0), _patterns(rng, 4, 30, 12, bos=4.0)
    with_bos = head_matching(A, B, n_permutations=30, n_resamples=0, seed=1)
    without = head_matching(A, B, drop_bos=True, n_permutations=30, n_resamples=0, seed=1)
    assert with_bos.estimate > without.estimate + 0.2  # unrelated heads look similar via BOS
    assert with_bos.pvalue > 0.05  # but no more similar than shuffled prompts


def test_similarity_null_is_seeded_and_job_independent(reps):
    X, _, rng = reps
    Y = X[:, :4] + 0.5 * rng.standard_normal((60, 4))
    for measure in ("linear_cka", "debiased_cka", "rbf_cka", "procrustes"):
        r1 = similarity_test(X, Y, measure, n_permutations=40, seed=3)
        r2 = similarity_test(X, Y, measure, n_permutations=40, seed=3, n_jobs=2)
        np.testing.assert_array_equal(r1.null_distribution, r2.null_distribution)
        assert r1.pvalue == pytest.approx(1 / 41)  # related data beat every shuffle
        assert r1.to_table().num_rows == 1
    indep = similarity_test(X, rng.standard_normal((60, 4)), "debiased_cka", n_permutations=200,
                            seed=4)
    assert indep.pvalue > 0.01 and abs(indep.null_mean) < 0.05


def test_head_matching_bootstrap_equals_matching_on_each_resample_of_prompts():
    from circuitstat.stats.resampling import ResamplingPlan
    from circuitstat.core.seeds import spawn_seeds

    rng = np.random.default_rng(7)
    A, B = _patterns(rng, 3, 9, 5), _patterns(rng, 3, 9, 5)
    res = head_matching(A, B, method="hungarian", n_permutations=0, n_resamples=40, seed=3)
    plan = ResamplingPlan.bootstrap(9, 40, spawn_seeds(np.random.SeedSequence(3), 2)[0])
    cos = per_prompt_cosine(A, B)  # [P, H, H]
    scores = np.stack([match_heads(cos[plan.indices(b)].mean(0), "hungarian")[1] for b in range(40)])
    np.testing.assert_allclose(res.head_interval.low, np.quantile(scores, 0.025, axis=0), rtol=1e-12)
    np.testing.assert_allclose(res.confidence_interval.high, np.quantile(scores.mean(1), 0.975), rtol=1e-12)
