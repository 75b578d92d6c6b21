"""Circuit stability: brute-force oracles for every per-k quantity, ties, bounds, invariance."""

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from scipy.spatial.distance import pdist

from circuitstat.stats.resampling import ResamplingPlan, resampled_means
from circuitstat.stats.stability import (chance_jaccard, circuit_stability, nogueira_stability,
                             rank_biased_overlap, selection_error_bounds, topk_indices)
from circuitstat.core.errors import InputError
from circuitstat.stats.resampling import nested_bootstrap
from circuitstat.stats.stability_data import (_double_statistics, _outer_statistics, _split_statistics,
                                  double_size_counts, pop_upper_from_data, split_counts)
from circuitstat.core.topk import row_seeds, tie_priorities, topk

KS = [3, 10, 40]


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(0)
    N, E = 40, 120
    effect = np.r_[np.linspace(1.5, 0.2, 30), np.zeros(E - 30)] * np.where(np.arange(E) % 3, 1, -1)
    S = (rng.standard_normal((N, E)) + effect).astype(np.float32)
    S[:, 60:75] = 0.0  # exactly tied edges
    plan = ResamplingPlan.bootstrap(N, 60, seed=5)
    R = resampled_means(S, plan)  # [E, B]
    res = circuit_stability(S, plan, KS, ranking="absolute", n_rank_resamples=12)
    return S, plan, R, res


def _sets(R, k, ranking):
    return np.stack([topk_indices(R[:, b], k, ranking) for b in range(R.shape[1])])


def _indicator(tops, E):
    Z = np.zeros((tops.shape[0], E), dtype=bool)
    np.put_along_axis(Z, tops, True, axis=1)
    return Z


def test_chance_jaccard_exact_and_monte_carlo():
    E, k = 6, 3  # exact: average over all pairs of 3-subsets
    subs = [set(c) for c in itertools.combinations(range(E), k)]
    exact = np.mean([len(a & b) / len(a | b) for a in subs for b in subs])
    assert chance_jaccard(E, k) == pytest.approx(exact, rel=1e-12)
    rng = np.random.default_rng(1)
    E, k, n = 80, 12, 20000
    a = np.argsort(rng.random((n, E)), axis=1)[:, :k]
    b = np.argsort(rng.random((n, E)), axis=1)[:, :k]
    inter = (_indicator(a, E) & _indicator(b, E)).sum(1)
    j = inter / (2 * k - inter)
    assert abs(j.mean() - chance_jaccard(E, k)) < 4 * j.std() / np.sqrt(n)


def test_inclusion_frequency_and_pairwise_jaccard_brute_force(setup):
    S, plan, R, res = setup
    E, B = S.shape[1], plan.n_resamples
    for i, k in enumerate(KS):
        Z = _indicator(_sets(R, k, "absolute"), E)
        np.testing.assert_array_equal(res.inclusion_counts[i], Z.sum(0))
        J = 1 - pdist(Z, "jaccard")
        assert res.per_k["jaccard_mean"][i] == pytest.approx(J.mean(), rel=1e-12)
        assert res.per_k["jaccard_sd"][i] == pytest.approx(J.std(ddof=1), rel=1e-9)
        # U-statistic jackknife by brute force: drop each resample, recompute the mean
        loo = np.array([(1 - pdist(np.delete(Z, r, 0), "jaccard")).mean() for r in range(B)])
        se = np.sqrt((B - 1) / B * np.sum((loo - loo.mean()) ** 2))
        assert res.per_k["jaccard_se"][i] == pytest.approx(se, rel=1e-9)
        ch = chance_jaccard(E, k)
        assert res.per_k["jaccard_corrected"][i] == pytest.approx((J.mean() - ch) / (1 - ch))
        f = Z.mean(0)
        cons = f >= 0.5
        cj = (Z & cons).sum(1) / (Z | cons).sum(1)
        assert res.per_k["consensus_size"][i] == cons.sum()
        assert res.per_k["consensus_jaccard_mean"][i] == pytest.approx(cj.mean())
        np.testing.assert_array_equal(res.consensus(k), np.flatnonzero(cons))


def _phi_brute(Z):
    M, d = Z.shape
    s2 = np.array([np.var(Z[:, f].astype(float), ddof=1) for f in range(d)])
    kbar = Z.sum(1).mean()
    return 1 - s2.mean() / (kbar / d * (1 - kbar / d))


def _phi_var_reference(Z):
    # Nogueira, Sechidis & Brown (2018), the variance of their Phi estimate, as in their code
    M, d = Z.shape
    hatPF = Z.mean(0)
    kbar = hatPF.sum()
    k = Z.sum(1)
    denom = kbar / d * (1 - kbar / d)
    stab = 1 - M / (M - 1) * np.mean(hatPF * (1 - hatPF)) / denom
    phi = np.zeros(M)
    for i in range(M):
        phi[i] = (1 / denom) * (np.mean(Z[i] * hatPF) - k[i] * kbar / d**2
                                + stab / 2 * (2 * k[i] * kbar / d**2 - k[i] / d - kbar / d + 1))
    return 4 / M**2 * np.sum((phi - phi.mean()) ** 2)


def test_phi_against_brute_force_formula_and_kuncheva(setup):
    S, plan, R, res = setup
    E = S.shape[1]
    for i, k in enumerate(KS):
        Z = _indicator(_sets(R, k, "absolute"), E)
        assert res.phi[i] == pytest.approx(_phi_brute(Z), rel=1e-10)
        # with a constant set size Phi equals the mean pairwise Kuncheva index
        inter = (Z[:, None, :] & Z[None, :, :]).sum(-1)[np.triu_indices(len(Z), 1)]
        assert res.phi[i] == pytest.approx(np.mean((inter * E - k * k) / (k * (E - k))), rel=1e-9)
        assert res.per_k["phi_variance"][i] == pytest.approx(_phi_var_reference(Z), rel=1e-9)
        z = stats.norm.ppf(0.975)
        sd = np.sqrt(res.per_k["phi_variance"][i])
        assert res.per_k["phi_ci_low"][i] == pytest.approx(res.phi[i] - z * sd)
    # variable set sizes through the general function
    rng = np.random.default_rng(3)
    Z = rng.random((25, 30)) < np.linspace(0.9, 0.05, 30)
    phi, var, lo, hi = nogueira_stability(Z)
    assert phi == pytest.approx(_phi_brute(Z), rel=1e-10)
    assert var == pytest.approx(_phi_var_reference(Z), rel=1e-10)


def _rbo_brute(a, b, p):
    k = len(a)
    s = sum(len(set(a[:d]) & set(b[:d])) / d * p**d for d in range(1, k + 1))
    return len(set(a) & set(b)) / k * p**k + (1 - p) / p * s


def test_rbo_against_definition(setup):
    rng = np.random.default_rng(2)
    for _ in range(5):
        a, b = rng.permutation(40)[:15], rng.permutation(40)[:15]
        assert rank_biased_overlap(a, b, 0.9) == pytest.approx(_rbo_brute(list(a), list(b), 0.9))
    assert rank_biased_overlap(a, a, 0.95) == pytest.approx(1.0)
    S, plan, R, res = setup
    tops = _sets(R, 10, "absolute")[:12]
    vals = [_rbo_brute(list(tops[i]), list(tops[j]), 0.9)
            for i, j in itertools.combinations(range(12), 2)]
    got = circuit_stability(S, plan, [10], ranking="absolute", n_rank_resamples=12, rbo_p=0.9)
    assert got.per_k["rbo_mean"][0] == pytest.approx(np.mean(vals))


def test_rank_correlations_match_scipy(setup):
    S, plan, R, res = setup
    key = np.abs(R[:, :12]).T
    rho = [stats.spearmanr(key[i], key[j]).statistic
           for i, j in itertools.combinations(range(12), 2)]
    np.testing.assert_allclose(res.spearman, rho, rtol=1e-10)
    tau = [stats.kendalltau(key[2 * i], key[2 * i + 1]).statistic for i in range(6)]
    np.testing.assert_allclose(res.kendall, tau, rtol=1e-12)
    assert res.to_table("rank_correlation").num_rows == 66


def test_ties_broken_at_random_and_counted():
    # was test_ties_broken_by_index_and_counted: ties are now broken at random from the run's
    # seed (issue 13 item 6); the counts are unchanged and the choice is chunk-size free
    N, E = 10, 30
    S = np.zeros((N, E))
    S[:, :5] = 3.0
    S[:, 25] = 1.0  # the ties at 0 span 24 edges below it
    plan = ResamplingPlan.bootstrap(N, 8, seed=0)
    ref = None
    for chunk in (1, 4, 7, 30):
        res = circuit_stability(S, plan, [3, 5, 6, 8], ranking="signed", chunk_size=chunk,
                                n_rank_resamples=0)
        assert res.per_k["cutoff_ties_excluded_mean"].tolist() == [2, 0, 0, 22]
        assert res.per_k["cutoff_ties_mean"].tolist() == [5, 5, 1, 24]
        assert res.per_k["resamples_with_cutoff_ties"].tolist() == [8, 0, 0, 8]
        # k=3 keeps 3 of the five tied leaders in every resample, which 3 decided by the seed
        assert res.inclusion_counts[0, :5].sum() == 3 * 8 and res.inclusion_counts[0, 5:].sum() == 0
        np.testing.assert_array_equal(res.inclusion_counts[1, :5], 8)
        np.testing.assert_array_equal(res.inclusion_counts[3, [0, 1, 2, 3, 4, 25]], 8)
        if ref is None:
            ref = res.inclusion_counts
        np.testing.assert_array_equal(res.inclusion_counts, ref)
    assert len(set(map(tuple, np.sort(_stream_sets(S, plan, 3, "signed", res), axis=1)))) > 1
    assert res.per_k["jaccard_mean"][0] < 1.0  # index tie-breaking gave exactly 1.0 here


def _jaccard_random_fill(E, n_fixed, k):
    """E[J] of two top-k sets that share n_fixed edges and fill k - n_fixed slots at random."""
    free, slots = E - n_fixed, k - n_fixed
    x = np.arange(0, slots + 1)
    pmf = stats.hypergeom.pmf(x, free, slots, slots)
    return float(np.sum(pmf * (n_fixed + x) / (2 * k - n_fixed - x)))


def test_ties_regression_ten_nonzero_edges_at_k20():
    # 10 non-zero edges and 71 exactly-zero ones: top-20 must fill 10 slots at random, so two
    # resamples agree on the 10 plus a hypergeometric share of the rest (index ties gave J = 1)
    N, E, k = 30, 81, 20
    rng = np.random.default_rng(4)
    S = np.zeros((N, E))
    S[:, :10] = rng.uniform(1, 2, (N, 10))
    res = circuit_stability(S, None, [k], ranking="absolute", n_resamples=400, seed=9,
                            n_rank_resamples=0)
    expect = _jaccard_random_fill(E, 10, k)
    mc = res.per_k["jaccard_se"][0]
    assert abs(res.per_k["jaccard_mean"][0] - expect) < 4 * mc + 0.01
    assert expect < 0.6
    # Phi for random fill: E|A & B| = 10 + 10 * 10 / 71 in Kuncheva's index (E-free form)
    inter = 10 + 10 * 10 / (E - 10)
    assert res.phi[0] == pytest.approx((inter * E - k * k) / (k * (E - k)), abs=0.02)
    assert res.per_k["cutoff_ties_mean"][0] == E - 10
    assert res.per_k["cutoff_ties_excluded_mean"][0] == E - 20


def _stream_sets(S, plan, k, ranking, res):
    """Brute-force oracle: per resample, a full sort by (key desc, the result's tie priority)."""
    R = resampled_means(S, plan)
    key = R if ranking == "signed" else np.abs(R)
    seeds = np.asarray(res.tie_seeds[:plan.n_resamples], dtype=np.uint64)
    pri = tie_priorities(seeds, np.arange(S.shape[1]))
    return np.stack([np.lexsort((pri[b], -key[:, b]))[:k] for b in range(plan.n_resamples)])


def test_topk_equals_brute_force_sort_with_its_priorities():
    rng = np.random.default_rng(7)
    X = rng.integers(-3, 4, (50, 40)).astype(float)  # few distinct values: ties everywhere
    for ranking in ("signed", "absolute"):
        for k in (1, 7, 20, 40):
            got = topk(X, k, ranking=ranking, seed=11)
            pri = tie_priorities(row_seeds(11, 50), np.arange(40))
            key = X if ranking == "signed" else np.abs(X)
            for r in range(50):
                order = sorted(range(40), key=lambda e: (-key[r, e], pri[r, e]))
                np.testing.assert_array_equal(got.indices[r], order[:k])
                t = key[r, order[k - 1]]
                assert got.threshold[r] == t
                assert got.n_tied_at_cutoff[r] == np.sum(key[r] == t)
                kept = np.sum(key[r, order[:k]] == t)
                assert got.n_tied_excluded[r] == np.sum(key[r] == t) - kept
    one = topk(X[0], 5, ranking="signed", seed=11)
    np.testing.assert_array_equal(one.indices, topk(X[:1], 5, ranking="signed", seed=11).indices[0])
    with pytest.raises(ValueError, match="k must lie"):
        topk(X, 41, ranking="signed", seed=0)
    with pytest.raises(ValueError, match="NaN"):
        topk(np.array([1.0, np.nan]), 1, ranking="signed", seed=0)


def test_topk_ties_chosen_uniformly():
    # 2 of 5 tied edges (spread over the index range) are kept per row: each tied edge must be
    # kept with probability 2/5 (chi-square), and each of the 10 pairs with probability 1/10
    rows, E = 20000, 50
    x = np.zeros((rows, E))
    x[:, [3, 11]] = 5.0
    tied = np.array([0, 17, 18, 33, 49])
    x[:, tied] = 1.0
    x[:, [5, 6]] = -2.0
    res = topk(x, 4, ranking="signed", seed=2024)
    picked = res.indices[:, 2:]
    assert np.isin(picked, tied).all()
    counts = np.array([(picked == e).sum() for e in tied])
    assert stats.chisquare(counts).pvalue > 1e-3
    pairs = np.sort(picked, axis=1) @ np.array([100, 1])
    _, pc = np.unique(pairs, return_counts=True)
    assert pc.size == 10 and stats.chisquare(pc).pvalue > 1e-3
    assert (res.n_tied_at_cutoff == 5).all() and (res.n_tied_excluded == 3).all()
    # different seeds give different choices; the same seed gives the same
    again = topk(x[:100], 4, ranking="signed", seed=2024).indices
    np.testing.assert_array_equal(again, topk(x[:100], 4, ranking="signed", seed=2024).indices)
    assert not np.array_equal(again, topk(x[:100], 4, ranking="signed", seed=2025).indices)


@pytest.mark.parametrize("ranking", ["signed", "absolute"])
def test_chunk_size_and_jobs_invariance(setup, ranking):
    S, plan, R, _ = setup
    small = dict(n_outer=50, n_inner=10)  # data-level columns are compared too
    ref = circuit_stability(S, plan, KS, ranking=ranking, n_rank_resamples=6, **small)
    for chunk, jobs in [(1, 1), (17, 2), (50, 1)]:
        got = circuit_stability(S, plan, KS, ranking=ranking, n_rank_resamples=6,
                                chunk_size=chunk, n_jobs=jobs, **small)
        np.testing.assert_array_equal(got.inclusion_counts, ref.inclusion_counts)
        for c, v in ref.per_k.items():
            np.testing.assert_array_equal(got.per_k[c], v)
        np.testing.assert_array_equal(got.spearman, ref.spearman)


def test_signed_and_absolute_differ_and_are_recorded(setup):
    S, plan, R, res = setup
    signed = circuit_stability(S, plan, KS, ranking="signed", n_rank_resamples=4)
    assert not np.array_equal(signed.inclusion_counts, res.inclusion_counts)
    meta = json.loads(signed.to_table().schema.metadata[b"circuitstat.params"])
    assert meta["ranking"] == "signed"
    with pytest.raises(TypeError):
        circuit_stability(S, plan, KS)  # ranking has no default: the choice must be explicit
    with pytest.raises(ValueError, match="signed"):
        circuit_stability(S, plan, KS, ranking="abs")


def test_selection_bounds_only_on_half_subsamples(setup):
    S, plan, R, res = setup
    with pytest.raises(ValueError, match="ResamplingPlan.subsample"):
        res.selection_bounds()
    with pytest.raises(ValueError, match="half-size"):
        circuit_stability(S, plan, KS, ranking="absolute", selection_thresholds=[0.7])
    cp = ResamplingPlan.complementary_pairs(S.shape[0], 25, seed=1)
    out = circuit_stability(S, cp, KS, ranking="absolute", selection_thresholds=[0.6, 0.9])
    tab = out.to_table("selection_bounds").to_pandas()
    E = S.shape[1]
    row = tab[(tab.k == 10) & (tab.threshold == 0.9)].iloc[0]
    assert row.pfer_mb == pytest.approx(100 / (0.8 * E))
    # Shah & Samworth unimodal constant for tau > 3/4 (as in R package stabs' um_const)
    b = 25
    assert row.pfer_cpss_unimodal == pytest.approx(100 / E / ((1 + 1 / b) / (4 * (1 - 0.9 + 1 / (2 * b)))))
    f = out.inclusion_frequency(10)
    assert row.n_selected == int(np.sum(f >= 0.9))
    sub = ResamplingPlan.subsample(S.shape[0], 30, seed=2)
    assert "selection_bounds" in circuit_stability(S, sub, [5], ranking="signed").table_names()


def test_selection_bound_validity_range():
    out = selection_error_bounds([40], 100, [0.55, 0.7], n_pairs=50)
    # tau=0.55 is below 1/2 + min(theta^2, 1/(2B) + 3 theta^2 / 4) for theta=0.4: no bound
    assert np.isnan(out["pfer_cpss_unimodal"][0]) and np.isfinite(out["pfer_cpss_unimodal"][1])
    with pytest.raises(ValueError):
        selection_error_bounds([5], 100, [0.5])


def test_tables_and_summary(setup):
    *_, res = setup
    t = res.to_table()
    assert t.num_rows == len(KS) and "phi_ci_high" in t.column_names
    inc = res.to_table("stability_inclusion")
    assert inc.num_rows == int(np.count_nonzero(res.inclusion_counts))
    assert "k=10" in res.summary()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), n_edges=st.integers(5, 40), chunk=st.integers(1, 45),
       ranking=st.sampled_from(["signed", "absolute"]))
def test_streaming_topk_equals_brute_force_on_tie_heavy_data(seed, n_edges, chunk, ranking):
    rng = np.random.default_rng(seed)
    N = 6
    S = rng.integers(-2, 3, (N, n_edges)).astype(np.float64)  # few distinct values: many ties
    plan = ResamplingPlan.bootstrap(N, 7, seed=seed)
    ks = sorted({1, max(1, n_edges // 3), n_edges - 1})
    res = circuit_stability(S, plan, ks, ranking=ranking, chunk_size=chunk, n_rank_resamples=0)
    R = resampled_means(S, plan)
    key = R if ranking == "signed" else np.abs(R)
    for i, k in enumerate(ks):
        tops = _stream_sets(S, plan, k, ranking, res)
        np.testing.assert_array_equal(res.inclusion_counts[i], _indicator(tops, n_edges).sum(0))
        excluded = [np.sum(key[:, b] == key[tops[b, -1], b]) - np.sum(key[tops[b], b]
                                                                      == key[tops[b, -1], b])
                    for b in range(7)]
        assert res.per_k["cutoff_ties_excluded_mean"][i] == pytest.approx(np.mean(excluded))
        assert res.per_k["cutoff_ties_excluded_max"][i] == max(excluded)


# --- data-level intervals (circuitstat.stats.stability_data) -------------------------------------------
def test_nested_bootstrap_draws_inner_from_outer():
    outer, inner = nested_bootstrap(30, 4, 500, seed=3)
    assert inner.n_resamples == 4 * 500 and (inner.totals == 30).all()
    for o in range(4):
        block = inner.counts[o * 500:(o + 1) * 500]
        assert ((block > 0) <= (outer.counts[o] > 0)).all()  # only the outer's examples
        # an inner draw picks each of the outer's N slots with probability 1/N
        np.testing.assert_allclose(block.mean(0), outer.counts[o], atol=0.35)
    again = nested_bootstrap(30, 4, 500, seed=3)[1]
    np.testing.assert_array_equal(again.counts, inner.counts)


def test_outer_statistics_against_pdist_and_kuncheva():
    rng = np.random.default_rng(5)
    n_outer, n_inner, E, k = 3, 12, 25, 6
    idx = np.stack([rng.permutation(E)[:k] for _ in range(n_outer * (n_inner + 1))])
    got = _outer_statistics(idx, n_outer, n_inner, k, E)
    for o in range(n_outer):
        inner = idx[n_outer + o * n_inner:n_outer + (o + 1) * n_inner]
        Z = _indicator(inner, E)
        J = 1 - pdist(Z, "jaccard")
        assert got[o, 0] == pytest.approx(J.mean())
        loo = np.array([(1 - pdist(np.delete(Z, r, 0), "jaccard")).mean() for r in range(n_inner)])
        assert got[o, 1] == pytest.approx(np.sqrt((n_inner - 1) / n_inner
                                                  * np.sum((loo - loo.mean()) ** 2)))
        assert got[o, 4] == pytest.approx(_phi_brute(Z))  # Phi = mean Kuncheva, equal sizes
        zo = _indicator(idx[o:o + 1], E)[0]
        jo = (Z & zo).sum(1) / (Z | zo).sum(1)
        assert got[o, 2] == pytest.approx(jo.mean())
        assert got[o, 3] == pytest.approx(jo.std(ddof=1) / np.sqrt(n_inner))


def test_data_level_columns_intervals_and_estimands(setup):
    S, plan, R, res = setup
    pk = res.per_k
    assert res.params["data_level"]["method"] == "bracketed_2n"  # the default
    np.testing.assert_array_equal(pk["jaccard_data"], pk["jaccard_mean"])  # same plug-in
    z = stats.norm.ppf(0.975)
    for name in ("jaccard_data", "jaccard_pop", "phi_data"):
        lo, hi = res.conf_int(which=f"{name}_ci")[:2]
        est, bias, se = pk[name], pk[f"{name}_bias"], pk[f"{name}_se"]
        lb = -1.0 if name == "phi_data" else 0.0
        # bracketed_2n: low end the plug-in shifted down by |bias| or (where there is one) the
        # split-half extrapolation; high end the plug-in shifted up by |bias| or the plug-in of
        # size-2N resamples; each +- z se
        low_end, high_end = est - np.abs(bias), est + np.abs(bias)
        if name != "jaccard_pop":
            low_end = np.minimum(low_end, pk[f"{name}_split"])
            high_end = np.maximum(high_end, pk[f"{name}_2n"])
            # more data per resample, so the 2N circuits agree more than the N ones
            assert (pk[f"{name}_2n"] >= est - 0.05).all()
        low = np.clip(low_end - z * se, lb, 1)
        high = np.clip(high_end + z * se, lb, 1)
        if name == "jaccard_pop":  # bounded by the data-level interval on both sides too
            low = np.minimum(low, pk["jaccard_data_ci_low"])
            high = np.maximum(high, pop_upper_from_data(pk["jaccard_data_ci_high"]))
        np.testing.assert_allclose(lo, low)
        np.testing.assert_allclose(hi, high)
        assert (se > 0).all() and (lo <= hi).all()
    # data-level intervals are wider than the Monte Carlo ones they replace as the claimable bound
    assert (np.subtract(*res.conf_int(which="jaccard_data_ci")[1::-1])
            > np.subtract(*res.conf_int(which="jaccard_ci")[1::-1])).all()
    meta = json.loads(res.to_table().schema.metadata[b"circuitstat.estimands"])
    assert "Monte Carlo" in meta["jaccard_ci"] and "independent datasets" in meta["jaccard_data_ci"]
    assert "data level" in res.summary()


def test_data_level_refusals_and_skips():
    rng = np.random.default_rng(0)
    S = rng.standard_normal((12, 30))
    few = circuit_stability(S, None, [5], ranking="signed", n_resamples=50, seed=1)
    assert np.isnan(few.per_k["jaccard_data_ci_low"]).all()
    assert not few.params["data_level"]["computed"] and "at least 32" in few.summary()
    with pytest.raises(InputError, match="at least 32 examples"):
        circuit_stability(S, None, [5], ranking="signed", n_resamples=50, seed=1, data_level=True)
    S = rng.standard_normal((40, 30))
    with pytest.raises(InputError, match="at least 50 outer"):
        circuit_stability(S, None, [5], ranking="signed", n_resamples=50, seed=1, n_outer=10)
    with pytest.raises(InputError, match="at least 10 inner"):
        circuit_stability(S, None, [5], ranking="signed", n_resamples=50, seed=1, n_inner=3)
    sub = ResamplingPlan.subsample(40, 30, seed=2)
    with pytest.raises(InputError, match="ordinary bootstrap"):
        circuit_stability(S, sub, [5], ranking="signed", data_level=True)
    assert np.isnan(circuit_stability(S, sub, [5], ranking="signed").per_k["phi_data"]).all()


def test_split_counts_and_split_statistics_against_brute_force():
    counts = split_counts(22, 5, seed=1).reshape(5, 6, 22)
    assert (counts.sum(2) == [11, 11, 5, 5, 5, 5]).all()
    assert (counts[:, 0] + counts[:, 1] <= 1).all()  # disjoint halves
    assert (counts[:, 2:].sum(1) <= 1).all()  # disjoint quarters
    rng = np.random.default_rng(8)
    n_splits, E, k = 4, 20, 5
    idx = np.stack([rng.permutation(E)[:k] for _ in range(n_splits * 6)])
    jh, ph, jq, pq = _split_statistics(idx, n_splits, k, E)
    sets = [set(r) for r in idx.reshape(n_splits, 6, k).reshape(-1, k).tolist()]
    sets = [sets[6 * s:6 * s + 6] for s in range(n_splits)]
    jac = lambda a, b: len(a & b) / len(a | b)  # noqa: E731
    kun = lambda a, b: (len(a & b) * E - k * k) / (k * (E - k))  # noqa: E731
    pairs = [(a, b) for a in range(2, 6) for b in range(a + 1, 6)]
    assert jh == pytest.approx(np.mean([jac(s[0], s[1]) for s in sets]))
    assert ph == pytest.approx(np.mean([kun(s[0], s[1]) for s in sets]))
    assert jq == pytest.approx(np.mean([jac(s[a], s[b]) for s in sets for a, b in pairs]))
    assert pq == pytest.approx(np.mean([kun(s[a], s[b]) for s in sets for a, b in pairs]))


def test_bracketed_method_unchanged_by_the_2n_rows(setup):
    """The former method keeps its intervals: [min(T - |b|, split), T + |b|] +- z se."""
    S, plan, R, _ = setup
    res = circuit_stability(S, plan, KS, ranking="absolute", n_rank_resamples=0,
                            data_level_method="bracketed")
    pk, z = res.per_k, stats.norm.ppf(0.975)
    est, bias, se = pk["jaccard_data"], pk["jaccard_data_bias"], pk["jaccard_data_se"]
    np.testing.assert_allclose(res.conf_int(which="jaccard_data_ci").high,
                               np.clip(est + np.abs(bias) + z * se, 0, 1))
    assert np.isnan(pk["jaccard_data_2n"]).all()


def test_double_size_counts_and_statistics_against_brute_force():
    counts = double_size_counts(15, 7, seed=3)
    assert counts.shape == (7, 15) and (counts.sum(1) == 30).all() and (counts >= 0).all()
    rng = np.random.default_rng(4)
    E, k = 25, 6
    idx = np.stack([rng.permutation(E)[:k] for _ in range(9)])
    sets = [set(r) for r in idx.tolist()]
    pairs = list(itertools.combinations(range(9), 2))
    jac, kun = _double_statistics(idx, k, E)
    assert jac == pytest.approx(np.mean([len(sets[a] & sets[b]) / len(sets[a] | sets[b])
                                         for a, b in pairs]))
    assert kun == pytest.approx(np.mean([(len(sets[a] & sets[b]) * E - k * k) / (k * (E - k))
                                         for a, b in pairs]))


def test_pop_upper_bound_holds_for_exact_inclusion_probabilities():
    """Oracle: exact E|D1 & D2| and E|D & P| for top-k sets drawn from a known distribution."""
    rng = np.random.default_rng(11)
    E, k = 12, 4
    subsets = np.array(list(itertools.combinations(range(E), k)))
    for _ in range(50):
        w = rng.dirichlet(np.full(len(subsets), rng.uniform(0.05, 2.0)))  # law of a top-k
        Z = np.zeros((len(subsets), E))
        Z[np.repeat(np.arange(len(subsets)), k), subsets.ravel()] = 1
        pi = w @ Z  # inclusion probabilities
        pop = rng.permutation(E)[:k]
        r_data = np.sum(pi**2) / k  # expected overlap share of two independent draws
        r_pop = pi[pop].sum() / k
        j_data = r_data / (2 - r_data)  # Jaccard at that overlap share
        bound = pop_upper_from_data(np.array([j_data]))[0]
        assert r_pop / (2 - r_pop) <= bound + 1e-12
    assert pop_upper_from_data(np.array([1.0, 0.0]))[0] == pytest.approx(1.0)
    assert pop_upper_from_data(np.array([0.0]))[0] == 0.0
