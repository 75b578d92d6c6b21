"""Circuit hypothesis tests against independent oracles: scipy's binomtest, brute-force HSIC, statsmodels."""

import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from circuitstat.core.errors import InputError
from circuitstat.stats.circuit_tests import (equivalence_pvalue, equivalence_test, hsic_statistic, independence_test,
                                             minimality_from_effects, minimality_test, partial_necessity_test,
                                             sufficiency_test)


def _paper_pvalue(n, eps, proportion):
    """The reference code's _compute_pval (blei-lab/circuitry non_equivalence.py), with the proportion it documents."""
    t_obs = abs(proportion - 0.5)
    return sum(math.comb(n, k) * (0.5 + eps) ** k * (0.5 - eps) ** (n - k)
               for k in range(n + 1) if abs(k / n - 0.5) >= t_obs - 1e-15)


@pytest.mark.parametrize("n", [1, 7, 20, 51])
@pytest.mark.parametrize("margin", [0.0, 0.1, 0.3])
def test_equivalence_pvalue_matches_binomtest_and_the_paper_sum(n, margin):
    for k in range(n + 1):
        d = abs(2 * k - n)
        hi, lo = (n + d) // 2, (n - d) // 2
        p0 = 0.5 + margin
        ref = 1.0 if d == 0 else (stats.binomtest(hi, n, p0, alternative="greater").pvalue
                                  + stats.binomtest(lo, n, p0, alternative="less").pvalue)
        got = equivalence_pvalue(k, n, margin)
        assert got == pytest.approx(min(ref, 1.0), abs=1e-12)
        assert got == pytest.approx(min(_paper_pvalue(n, margin, k / n), 1.0), abs=1e-12)


def test_equivalence_uses_the_proportion_not_the_mean_difference():
    # the circuit is higher on 45 of 50 prompts by a tiny amount: the mean difference is ~0 (the reference
    # code's statistic would pass), the proportion 0.9 is far from 1/2 ± 0.1
    full = np.linspace(0, 1, 50)
    circuit = full + 1e-6
    circuit[:5] -= 1e-5
    res = equivalence_test(full, circuit, margin=0.1)
    assert res.statistic == pytest.approx(45 / 50)
    assert res.pvalue == pytest.approx(equivalence_pvalue(45, 50, 0.1), abs=1e-12)
    assert res.reject(0.05)


def test_equivalence_ties():
    full = np.arange(40.0)
    same = equivalence_test(full, full.copy(), margin=0.1, random_state=3)
    assert same.details["n_ties"] == 40 and not same.reject(0.05)
    k = np.random.default_rng(3).binomial(40, 0.5)
    assert same.details["k"] == k and same.pvalue == pytest.approx(equivalence_pvalue(k, 40, 0.1), abs=1e-12)
    dropped = equivalence_test(full, full.copy(), ties="drop")
    assert dropped.pvalue == 1.0 and dropped.details["n_used"] == 0
    lower = equivalence_test(full, full - 1.0)
    assert lower.statistic == 0.0 and lower.reject(1e-6)
    with pytest.raises(InputError, match="same prompts"):
        equivalence_test(full, full[:-1])
    with pytest.raises(InputError, match="margin"):
        equivalence_test(full, full + 1, margin=0.5)


def test_equivalence_size_is_at_most_alpha_at_the_boundary_and_close_to_its_exact_value():
    # the null's boundary P(Δ > 0) = 1/2 + margin: simulated rejection rate equals the exact size of the
    # rejection region within 3 MC SE, and that exact size is <= alpha (bounded from both sides)
    n, margin, alpha, R = 60, 0.1, 0.05, 1200
    p0 = 0.5 + margin
    region = [k for k in range(n + 1) if equivalence_pvalue(k, n, margin) <= alpha]
    size = float(sum(stats.binom.pmf(k, n, p0) for k in region))
    assert 0.02 < size <= alpha
    rng = np.random.default_rng(11)
    rejections = 0
    for _ in range(R):
        delta = np.where(rng.uniform(size=n) < p0, 1.0, -1.0) * rng.exponential(size=n)
        rejections += equivalence_test(np.zeros(n), delta).reject(alpha)
    se = math.sqrt(size * (1 - size) / R)
    assert abs(rejections / R - size) <= 3 * se


def _brute_hsic(x, y):
    """HSIC by explicit loops: Gaussian kernels, median of pairwise distances, trace(KHLH)/(n-1)^2."""
    n = len(x)

    def gram(v):
        dists = sorted(abs(v[i] - v[j]) for i in range(n) for j in range(i + 1, n) if v[i] != v[j])
        m = len(dists)
        s = dists[m // 2] if m % 2 else 0.5 * (dists[m // 2 - 1] + dists[m // 2])
        return [[math.exp(-(v[i] - v[j]) ** 2 / (2 * s * s)) for j in range(n)] for i in range(n)]

    K, L = gram(x), gram(y)

    def centre(A):
        r = [sum(row) / n for row in A]
        c = [sum(A[i][j] for i in range(n)) / n for j in range(n)]
        g = sum(r) / n
        return [[A[i][j] - r[i] - c[j] + g for j in range(n)] for i in range(n)]

    Kc, Lc = centre(K), centre(L)
    return sum(Kc[i][j] * Lc[j][i] for i in range(n) for j in range(n)) / (n - 1) ** 2


def test_hsic_statistic_and_permutation_pvalue_match_brute_force():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(14)
    y = np.sin(2 * x) + 0.3 * rng.standard_normal(14)
    assert hsic_statistic(x, y) == pytest.approx(_brute_hsic(list(x), list(y)), abs=1e-12)
    B = 60
    res = independence_test(x, y, n_permutations=B, random_state=9)
    assert res.statistic == pytest.approx(_brute_hsic(list(x), list(y)), abs=1e-12)
    perm_rng = np.random.default_rng(9)
    null = [_brute_hsic(list(x), list(y[perm_rng.permutation(14)])) for _ in range(B)]
    np.testing.assert_allclose(res.details["null"], null, rtol=0, atol=1e-12)
    ref_p = (1 + sum(v >= res.statistic - 1e-12 for v in null)) / (B + 1)
    assert res.pvalue == pytest.approx(ref_p, abs=1e-12)


def test_independence_detects_dependence_and_holds_its_level():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(80)
    assert independence_test(x, x ** 2 + 0.1 * rng.standard_normal(80), n_permutations=199, random_state=1).reject(0.01)
    # under independence the permutation p-value is exactly uniform on {1/(B+1), ...}: P(p <= 0.1) = 0.1
    R, B = 300, 19
    hits = sum(independence_test(rng.standard_normal(25), rng.exponential(size=25), n_permutations=B,
                                 random_state=r).pvalue <= 0.1 for r in range(R))
    se = math.sqrt(0.1 * 0.9 / R)
    assert abs(hits / R - 0.1) <= 3 * se
    const = independence_test(x, np.ones(80))
    assert const.statistic == 0.0 and const.pvalue == 1.0


@pytest.mark.parametrize("correction,sm", [("holm", "holm"), ("bh", "fdr_bh")])
def test_minimality_family_matches_binomtest_and_multipletests(correction, sm):
    rng = np.random.default_rng(4)
    edge = np.concatenate([rng.uniform(0.5, 2.0, 12), rng.uniform(0, 0.05, 4)])
    ref = rng.exponential(0.1, size=40)
    res = minimality_from_effects(edge, ref, quantile=0.9, alpha=0.05, correction=correction)
    counts = np.array([(e > ref).sum() for e in edge])
    np.testing.assert_array_equal(res.statistic, counts)
    raw = np.array([stats.binomtest(int(c), 40, 0.9, alternative="less").pvalue for c in counts])
    np.testing.assert_allclose(res.pvalue, raw, rtol=0, atol=1e-12)
    reject, adjusted, _, _ = multipletests(raw, alpha=0.05, method=sm)
    np.testing.assert_allclose(res.pvalue_adjusted, adjusted, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(res.reject, reject)
    assert reject[12:].all() and not reject[:12].any() and not res.minimal


def test_minimality_from_per_prompt_metrics():
    rng = np.random.default_rng(8)
    circuit = rng.standard_normal(30)
    minus = circuit[:, None] + rng.normal(0, [1.0, 1.5, 0.001], size=(30, 3))  # the third edge does nothing
    inflated = circuit[:, None] + rng.normal(0, 1.0, size=(30, 50))
    inflated_minus = inflated + rng.normal(0, 0.05, size=(30, 50))  # knocking a new edge out moves it a little
    res = minimality_test(circuit, minus, inflated, inflated_minus)
    np.testing.assert_allclose(res.edge_effect, ((minus - circuit[:, None]) ** 2).mean(0), rtol=1e-12)
    # the reference is loss(C + path, C + path - r), not loss(C, C + path): the inflated columns' distance from
    # the circuit (~1) would make every edge look redundant
    np.testing.assert_allclose(res.reference_effect, ((inflated - inflated_minus) ** 2).mean(0), rtol=1e-12)
    assert list(res.reject) == [False, False, True]
    assert minimality_test(circuit, minus[:, :2], inflated, inflated_minus).minimal
    with pytest.raises(InputError, match="pair column by column"):
        minimality_test(circuit, minus, inflated, inflated_minus[:, :-1])


def test_float_ties_count_against_the_edge_and_the_circuit():
    # losses equal in exact arithmetic, apart by float32 rounding: an inert edge (effect ~1e-14) against inert
    # references (~1e-13 and exact 0) beats none of them, however rounding orders them
    rng = np.random.default_rng(12)
    circuit = rng.standard_normal(40).astype(np.float32).astype(np.float64)
    ulp = np.spacing(np.float32(4.0))
    noise = lambda shape: rng.integers(-2, 3, size=shape) * ulp  # a few ulps of the metric
    minus = circuit[:, None] + noise((40, 1))
    inflated = circuit[:, None] + rng.standard_normal((40, 30))
    inflated_minus = inflated + noise((40, 30))
    inflated_minus[:, :3] = inflated[:, :3]  # exact zeros
    res = minimality_test(circuit, minus, inflated, inflated_minus, quantile=0.9)
    assert res.statistic[0] == 0 and res.reject[0]
    # negative control: with no tolerance, rounding noise decides the count
    raw = minimality_from_effects(res.edge_effect, res.reference_effect, quantile=0.9)
    assert raw.statistic[0] > 0
    # sufficiency: random circuits that compute the circuit's function up to rounding are ties, not beaten
    full = circuit + rng.standard_normal(40)
    same = circuit[:, None] + noise((40, 19))
    tied = sufficiency_test(full, circuit, same, quantile=None)
    assert tied.details["count"] == 0 and tied.pvalue == 1.0
    assert (tied.details["random_losses"] > tied.details["loss"]).sum() > 0  # what exact comparison would count
    # and a random circuit that is worse by more than rounding is still beaten
    worse = sufficiency_test(full, circuit, np.column_stack([same, circuit + 1e-3 * np.sign(circuit - full)]), quantile=None)
    assert worse.details["count"] == 1


def test_sufficiency_and_partial_necessity_rank_and_quantile_pvalues():
    rng = np.random.default_rng(6)
    full = rng.standard_normal(50)
    circuit = full + 0.01 * rng.standard_normal(50)
    rand = full[:, None] + rng.normal(0, 1, size=(50, 99))
    rand[:, 0] = circuit  # a tie counts against the circuit
    res = sufficiency_test(full, circuit, rand, quantile=None)
    assert res.details["count"] == 98 and res.pvalue == pytest.approx(2 / 100)
    q = sufficiency_test(full, circuit, rand)  # the paper's q = 0.9 is the default
    assert q.pvalue == pytest.approx(stats.binomtest(98, 99, 0.9, alternative="greater").pvalue, abs=1e-12)
    ci = stats.binomtest(98, 99).proportion_ci(confidence_level=0.95, method="exact")
    assert q.statistic == pytest.approx(98 / 99) and q.details["g_hat"] == pytest.approx(98 / 99)
    assert (q.details["ci_low"], q.details["ci_high"]) == pytest.approx((ci.low, ci.high), abs=1e-12)
    worse = sufficiency_test(full, full + 5.0, rand, quantile=None)
    assert worse.pvalue == 1.0 and worse.statistic == 0.0
    # partial necessity: the complement far from the model, random complements close to it
    nec = partial_necessity_test(full, full + 3.0, full[:, None] + rng.normal(0, 0.5, (50, 19)), quantile=None)
    assert nec.details["count"] == 19 and nec.pvalue == pytest.approx(1 / 20)
    with pytest.raises(InputError, match="random_circuits"):
        sufficiency_test(full, circuit, rand[:-1])


def test_rank_pvalue_is_uniform_under_exchangeability():
    # a circuit drawn like the random ones: P(p <= 0.2) = 0.2 exactly (R = 9, continuous losses)
    rng = np.random.default_rng(7)
    reps, hits = 400, 0
    for _ in range(reps):
        full = rng.standard_normal(10)
        all_c = full[:, None] + rng.normal(0, 1, size=(10, 10))
        hits += sufficiency_test(full, all_c[:, 0], all_c[:, 1:], quantile=None).pvalue <= 0.2
    se = math.sqrt(0.2 * 0.8 / reps)
    assert abs(hits / reps - 0.2) <= 3 * se


@pytest.mark.parametrize("n", [5, 24, 80])
@pytest.mark.parametrize("margin", [0.05, 0.1, 0.25])
def test_tost_matches_two_binomtests_and_the_clopper_pearson_interval(n, margin):
    from circuitstat.stats.circuit_tests import tost_pvalue

    alpha = 0.05
    for k in range(n + 1):
        ref = max(stats.binomtest(k, n, 0.5 - margin, alternative="greater").pvalue,
                  stats.binomtest(k, n, 0.5 + margin, alternative="less").pvalue)
        got = tost_pvalue(k, n, margin)
        assert got == pytest.approx(min(ref, 1.0), abs=1e-12)
        # duality: TOST at alpha rejects exactly when the (1 - 2 alpha) Clopper-Pearson interval lies in the margin
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=1 - 2 * alpha, method="exact")
        inside = 0.5 - margin < ci.low and ci.high < 0.5 + margin
        assert (got <= alpha) == inside, (k, got, ci)


def test_tost_affirms_equivalence_where_the_papers_direction_only_fails_to_reject():
    from circuitstat.stats.circuit_tests import equivalence_tost

    rng = np.random.default_rng(21)
    full = rng.standard_normal(400)
    close = full + rng.normal(0, 0.1, 400)  # P(Δ > 0) = 1/2
    res = equivalence_tost(full, close, margin=0.1)
    assert res.reject(0.05) and 0.4 < res.details["ci_low"] < res.details["p_hat"] < res.details["ci_high"]
    # negative control: few prompts -> the paper's direction passes (no rejection), the TOST cannot affirm
    few_paper = equivalence_test(full[:12], close[:12], margin=0.1)
    few_tost = equivalence_tost(full[:12], close[:12], margin=0.1)
    assert not few_paper.reject(0.05) and not few_tost.reject(0.05)
    # a circuit that is worse on 70% of prompts is not affirmed equivalent at any n
    worse = full - np.where(rng.uniform(size=400) < 0.7, 1.0, -1.0) * 0.1
    assert not equivalence_tost(full, worse, margin=0.1).reject(0.05)
    # ties: both directions split them with the same coin, so they report the same P-hat and interval
    same_p = equivalence_test(full, full.copy(), margin=0.1, random_state=5)
    same_t = equivalence_tost(full, full.copy(), margin=0.1, random_state=5)
    assert same_p.details["k"] == same_t.details["k"] and same_p.details["ci_low"] == same_t.details["ci_low"]


def test_tost_size_at_the_margin_is_at_most_alpha_and_matches_its_exact_value():
    from circuitstat.stats.circuit_tests_calibration import tost_size

    from circuitstat.stats.circuit_tests import equivalence_tost

    n, margin, alpha, R = 120, 0.1, 0.05, 1200
    q = 0.5 + margin  # the least favourable point of the TOST's null
    exact = tost_size(n, q, margin, alpha)
    assert 0.02 < exact <= alpha
    rng = np.random.default_rng(13)
    hits = 0
    for _ in range(R):
        delta = np.where(rng.uniform(size=n) < q, 1.0, -1.0) * rng.exponential(size=n)
        hits += equivalence_tost(np.zeros(n), delta, margin=margin).reject(alpha)
    assert abs(hits / R - exact) <= 3 * math.sqrt(exact * (1 - exact) / R)
