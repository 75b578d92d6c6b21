"""circuitstat.stats.sample_size: predictions at N from a pilot, checked against brute force, analytic results and
simulation from known populations (the full study: bench/sample_size.py, docs/sample-size.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from circuitstat.core.errors import InputError
from circuitstat.core.seeds import spawn_seeds
from circuitstat.stats import sample_size
from circuitstat.stats.intervals import bootstrap_edges
from circuitstat.stats.pilot_model import deconvolved_means, fit_pilot
from circuitstat.stats.sample_size import (clear_probability, edge_kurtosis, expected_jaccard, half_jaccard,
                                           jackknife_log_sd, kurtosis_growth, log_sd_ratio_upper, median_sd_growth,
                                           predict_stability, predict_widths, satterthwaite_df, self_calibration,
                                           tail_level)
from circuitstat.stats.populations import spiky_population
from circuitstat.stats.stability import chance_jaccard
from circuitstat.stats.stability_halves import halves_stability

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fixture_populations import load_planted_pair  # noqa: E402


def test_jackknife_log_sd_matches_leave_one_out_brute_force():
    rng = np.random.default_rng(0)
    X = rng.standard_t(3, (20, 5)) + 100.0  # a large offset: the closed form must not cancel
    X[:, 3] = 7.0  # constant column: error 0
    X[:, 4] = 0.0
    X[5, 4] = 1.0  # one example carries the column: a leave-one-out SD of 0, floored
    n = X.shape[0]
    want = []
    for e in range(X.shape[1]):
        s = X[:, e].std(ddof=1)
        if s == 0:
            want.append(0.0)
            continue
        loo = np.log([max(np.delete(X[:, e], i).std(ddof=1), 1e-3 * s) for i in range(n)])
        want.append(np.sqrt((n - 1) / n * np.sum((loo - loo.mean()) ** 2)))
    np.testing.assert_allclose(jackknife_log_sd(X), want, rtol=1e-9, atol=1e-12)


def test_deconvolved_means_remove_the_pilots_noise_from_the_spread():
    # E[(m - 0)^2 - s^2/n] = mu^2: where every |mu| is far above the noise the floor never bites, so the
    # deconvolved squares average to mu^2 while the plain means' squares sit sigma^2/n higher
    rng = np.random.default_rng(1)
    mu, n, reps = np.array([3.0, -3.0, 4.0]), 10, 4000
    X = mu + rng.normal(0.0, 1.0, (reps, n, mu.size))
    m, s = X.mean(axis=1), X.std(axis=1, ddof=1)
    d = np.array([deconvolved_means(m[r], s[r], n, "absolute") for r in range(reps)])
    se = (d**2).std(axis=0) / np.sqrt(reps)
    assert np.all(np.abs((d**2).mean(axis=0) - mu**2) < 4 * se)
    assert np.all((m**2).mean(axis=0) - mu**2 > 0.1 - 4 * se)  # sigma^2 / n = 0.1: the bias removed
    assert np.all(np.sign(d) == np.sign(m))
    # signed ranking shrinks towards the mean over edges, not towards 0
    signed = deconvolved_means(np.array([1.0, 1.0, 1.0]), np.array([5.0, 5.0, 5.0]), 4, "signed")
    np.testing.assert_allclose(signed, 1.0)


def test_width_prediction_matches_the_analytic_width_on_a_large_normal_pilot():
    # n0 = 400 normal rows: q -> t quantile, no SD bias; width at N = 2 t_{N-1} sigma / sqrt(N)
    rng = np.random.default_rng(2)
    sigma = np.array([0.5, 1.0, 3.0])
    w = predict_widths(rng.normal(0.0, 1.0, (400, 3)) * sigma, [100, 1000], seed=3)
    for n in (100, 1000):
        sel = w["n"] == n
        want = 2 * sps.t.ppf(0.975, n - 1) * sigma / np.sqrt(n)
        np.testing.assert_allclose(w["width"][sel], want, rtol=0.08)
        # the stated error: jackknife SD of log s ~ sqrt(1 / (2 (n0 - 1))) for normal data, plus the Monte
        # Carlo variance of the two bootstrap quantiles of |t*| (999 resamples; sample-quantile asymptotics)
        mc = [0.95 * 0.05 / (999 * (2 * sps.t.pdf(t, df)) ** 2 * t**2)
              for t, df in ((sps.t.ppf(0.975, n - 1), n - 1), (sps.t.ppf(0.975, 399), 399))]
        want = np.sqrt(1 / 798 * (1 + 400 / n) + mc[0] + min(1, 400 / n) ** 2 * mc[1])
        np.testing.assert_allclose(w["rel_error"][sel], want, rtol=0.25)


def _width_cover(P: np.ndarray, pilots: int, n: int, seed: int) -> np.ndarray:
    """[pilots, E]: whether the realised width of one dataset of n fell in the predicted interval."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(pilots):
        pilot = P[rng.integers(0, P.shape[0], 32)]
        w = predict_widths(pilot, [n], n_resamples=999, seed=r)
        D = P[rng.integers(0, P.shape[0], n)]
        b = bootstrap_edges(D, n_resamples=999, seed=r)
        real = np.asarray(b.confidence_interval.high) - np.asarray(b.confidence_interval.low)
        out.append((real >= w["width_pi_low"]) & (real <= w["width_pi_high"]))
    return np.array(out)


def test_width_error_is_never_below_the_exact_f_interval_on_normal_pilots():
    # analytic oracle: under normality s_N^2 / s_0^2 ~ F(N - 1, n0 - 1), so the 90% prediction interval of
    # log(s_N / s_0) has half-width h = (log F_0.95 - log F_0.05) / 4. The SD part of the stated error
    # must not claim less; the old z-on-jackknife error fell below it on about half the pilots' edges
    rng = np.random.default_rng(11)
    n0, N, zp = 32, 128, sps.norm.ppf(0.95)
    h = (np.log(sps.f.ppf(0.95, N - 1, n0 - 1)) - np.log(sps.f.ppf(0.05, N - 1, n0 - 1))) / 4
    for r in range(5):
        w = predict_widths(rng.normal(0.0, 1.0, (n0, 50)), [N], n_resamples=200, seed=r)
        assert np.all(zp * w["rel_error"] >= 0.97 * h)  # 3%: the delta method against the exact F law


def test_width_prediction_interval_covers_on_a_normal_population_from_both_sides():
    # 30 pilots x 40 edges, nominal 0.90: measured 0.926 (0.888 before the normal-theory floor and the Monte
    # Carlo terms); an interval twice too narrow covers ~0.6, one twice too wide ~0.998
    P = np.random.default_rng(4).normal(0.0, 1.0, (4000, 40))
    cover = _width_cover(P, 30, 128, 5)
    assert 0.895 <= cover.mean() <= 0.96
    assert cover.mean(axis=0).min() >= 0.6  # worst edge of 40, 30 pilots each


def test_width_prediction_on_real_exact_scores_undercovers_as_documented():
    # the planted model's exact scores (heavy tails): documented pooled coverage 0.81-0.83 at nominal 0.90
    P, _, _ = load_planted_pair()
    cover = _width_cover(P, 15, 128, 6)
    assert 0.70 <= cover.mean() <= 0.93


def test_jaccard_prediction_interval_covers_the_true_j_n_without_being_useless():
    P, _, _ = load_planted_pair()
    truth = expected_jaccard(P, 128, [5], ranking="absolute", n_datasets=200, seed=0)[0][0]
    rng = np.random.default_rng(7)
    inside, widths = [], []
    for r in range(12):
        s = predict_stability(P[rng.integers(0, P.shape[0], 32)], [128], [5], ranking="absolute", seed=r,
                              n_outer=20, n_sim=20)
        inside.append(s["jaccard_pi_low"][0] <= truth <= s["jaccard_pi_high"][0])
        widths.append(s["jaccard_pi_high"][0] - s["jaccard_pi_low"][0])
        assert s["jaccard_pi_low"][0] <= s["jaccard"][0] <= s["jaccard_pi_high"][0]
    assert np.mean(inside) >= 0.66  # measured 0.73-0.80 on this cell (docs/sample-size.md)
    assert np.mean(widths) <= 0.8  # an interval [0, 1] would pass the first bound; not this one


def test_expected_jaccard_of_a_population_with_a_clear_gap_and_of_ties():
    P = np.zeros((50, 20))
    P[:, :5] = 10.0  # five edges far above the rest, no noise: every dataset picks them
    J, mc = expected_jaccard(P, 8, [5], ranking="absolute", n_datasets=20, seed=1)
    assert J[0] == 1.0 and mc[0] == 0.0
    # all edges tied: the seeded random tie break picks random 5-sets, whose mean Jaccard is the chance value
    J, mc = expected_jaccard(np.zeros((50, 20)), 8, [5], ranking="absolute", n_datasets=200, seed=1)
    from circuitstat.stats.stability import chance_jaccard

    assert abs(J[0] - chance_jaccard(20, 5)) < 4 * mc[0] + 1e-3


def test_half_jaccard_is_one_on_a_clear_gap_and_the_model_keeps_the_pilots_rows():
    rng = np.random.default_rng(8)
    S = rng.normal(0.0, 1.0, (32, 30))
    S[:, :4] += 50.0
    j, se = half_jaccard(S, [4], ranking="absolute", seed=2)
    assert j[0] == 1.0
    fit = fit_pilot(S, ranking="absolute", means="pilot")
    np.testing.assert_allclose(fit.dataset(np.arange(32)), S)  # plain means: the rows themselves


def test_clear_probability_is_certain_on_a_clear_gap_and_refuses_small_n():
    rng = np.random.default_rng(9)
    S = rng.normal(0.0, 1.0, (32, 30))
    S[:, :5] += 40.0
    p = clear_probability(S, 40, [5], 0.8, ranking="absolute", n_datasets=3, seed=1, n_resamples=100,
                          n_outer=50, n_inner=10)
    assert p["p_clear"][0] == 1.0
    with pytest.raises(InputError, match="N >= 32"):
        clear_probability(S, 20, [5], 0.5, ranking="absolute", n_datasets=2)


@pytest.mark.parametrize("bad, match", [({"ns": [1]}, ">= 2"), ({"S": np.zeros((8, 5))}, "at least 16"),
                                        ({"ks": [30]}, "1..29")])
def test_bad_requests_name_the_fix(bad, match):
    args = {"S": np.random.default_rng(0).normal(size=(20, 30)), "ns": [64], "ks": [5]}
    args.update(bad)
    with pytest.raises(InputError, match=match):
        predict_stability(args["S"], args["ns"], args["ks"], ranking="absolute")


# --- the upper prediction bound for the width (the planning number) ---------------------------------------------
def test_edge_kurtosis_matches_scipy_shrunk_halfway_to_the_pooled_and_floored():
    rng = np.random.default_rng(12)
    X = np.column_stack([rng.standard_t(3, 40), rng.normal(size=40), rng.uniform(size=40), np.full(40, 2.0)])
    b2 = sps.kurtosis(X[:, :3], axis=0, fisher=False, bias=True)  # independent oracle
    kappa, pooled = edge_kurtosis(X)
    assert pooled == pytest.approx(max(b2.mean(), 3.0), rel=1e-12)  # the constant column is left out of the pool
    np.testing.assert_allclose(kappa[:3], np.maximum((b2 + b2.mean()) / 2, 3.0), rtol=1e-12)
    assert kappa[3] == pytest.approx(pooled)
    heavy = X.copy()
    heavy[0, 0] += 100.0  # one outlier: its column's kurtosis near n, and the pool above 3
    k2, p2 = edge_kurtosis(heavy)
    b2h = sps.kurtosis(heavy[:, :3], axis=0, fisher=False, bias=True)
    assert p2 == pytest.approx(b2h.mean(), rel=1e-12) and p2 > 3.0
    np.testing.assert_allclose(k2[:3], np.maximum((b2h + p2) / 2, 3.0), rtol=1e-12)
    assert kappa[2] >= 3.0  # the uniform's 1.8 never claims lighter-than-normal tails


def test_the_bound_is_the_exact_f_law_under_normality_and_widens_with_kurtosis():
    # analytic oracle: kappa = 3 gives df n - 1, and log(s_N / s_0) has the exact upper quantile 0.5 log F_p
    assert satterthwaite_df(32, 3.0) == pytest.approx(31.0)
    want = 0.5 * np.log(sps.f.ppf(0.9, 127, 31))
    assert log_sd_ratio_upper(32, 128, np.array([3.0]), 0.9)[0] == pytest.approx(want, rel=1e-12)
    # moment match: Var(s^2)/sigma^4 = (kappa - (n-3)/(n-1))/n equals 2/d, the scaled chi-square's
    d = satterthwaite_df(32, 9.0)
    assert 2 / d == pytest.approx((9.0 - 29 / 31) / 32)
    assert log_sd_ratio_upper(32, 128, np.array([9.0]), 0.9)[0] > 1.5 * want  # heavier tails, wider bound
    # a normal sample's bound holds at its level (Monte Carlo, 20000 pairs: SE 0.002)
    rng = np.random.default_rng(13)
    r = 0.5 * np.log(rng.chisquare(127, 20000) / 127 / (rng.chisquare(31, 20000) / 31))
    assert abs(np.mean(r <= want) - 0.9) < 0.01


def test_self_calibration_is_one_on_normal_pilots_and_inflates_on_a_spike_it_can_see():
    rng = np.random.default_rng(14)
    cs = [self_calibration(rng.normal(size=(32, 60)), 0.9, seed=r) for r in range(5)]
    assert max(cs) <= 1.25 and min(cs) >= 1.0  # the model holds: the floor 1 or barely above
    X = rng.normal(size=(32, 60))
    X[rng.integers(0, 32, 60), np.arange(60)] += 30.0  # one spike per edge: halves miss it about 60% of the time
    assert self_calibration(X, 0.9, seed=0) > 2.0
    assert kurtosis_growth(X, seed=0) > 1.3 and kurtosis_growth(rng.normal(size=(32, 60)), seed=0) < 1.15


def _upper_cover(P: np.ndarray, pilots: int, n: int, seed: int) -> tuple[float, float, float]:
    """(share of realised widths under width_upper, the same for the bare F bound at the pilot's kurtosis,
    median realised / upper) over pilots of 32 rows x edges."""
    rng = np.random.default_rng(seed)
    under, bare, ratio = [], [], []
    for r in range(pilots):
        pilot = P[rng.integers(0, P.shape[0], 32)]
        w = predict_widths(pilot, [n], n_resamples=999, seed=r)
        b = bootstrap_edges(P[rng.integers(0, P.shape[0], n)], n_resamples=999, seed=r)
        real = np.asarray(b.confidence_interval.high) - np.asarray(b.confidence_interval.low)
        s0 = pilot.std(axis=0, ddof=1)
        raw = 2 * w["q"] * s0 / np.sqrt(n) * np.exp(log_sd_ratio_upper(32, n, edge_kurtosis(pilot)[0], 0.9))
        ok = s0 > 0
        under.append(real[ok] <= w["width_upper"][ok])
        bare.append(real[ok] <= raw[ok])
        ratio.append(real[ok] / w["width_upper"][ok])
    return np.mean(np.concatenate(under)), np.mean(np.concatenate(bare)), np.median(np.concatenate(ratio))


def test_width_upper_bound_holds_on_planted_heavy_tails_and_the_bare_f_bound_does_not():
    # planted3 exact scores, N = 256, nominal 0.90: measured 0.97 (docs/sample-size.md, 60 pilots); the
    # negative control, the F bound at the pilot's own kurtosis with no self-calibration nor growth, ~0.8
    P, _, _ = load_planted_pair()
    cover, bare, ratio = _upper_cover(P, 12, 256, 15)
    assert 0.90 <= cover <= 0.995
    assert bare < 0.88
    assert 0.3 <= ratio <= 0.8  # a bound, not infinity: the realised width is a sizeable share of it


def test_width_upper_bound_on_a_normal_population_is_not_loose():
    # the F law is exact here and the calibration stays ~1: measured 0.95 (the MC term added linearly)
    P = np.random.default_rng(4).normal(0.0, 1.0, (4000, 40))
    cover, bare, ratio = _upper_cover(P, 15, 128, 16)
    assert 0.90 <= cover <= 0.985
    assert ratio >= 0.65


def test_posterior_draws_remove_most_of_the_near_tie_bias_that_deconvolution_keeps():
    # the normal population: every mean 0, true J_512 at k = 5 is the chance level 0.074 (docs/sample-size.md).
    # Deconvolved means keep the pilot's order of tied edges (measured mean prediction 0.68); posterior draws
    # from the NPMLE g-model re-draw it each time (measured 0.24 over these 8 pilots, 0.28 over 40 in the bench)
    P = np.random.default_rng(4).normal(0.0, 1.0, (4000, 40))
    rng = np.random.default_rng(17)
    post, deco = [], []
    for r in range(8):
        S = P[rng.integers(0, P.shape[0], 32)]
        for means, out in (("posterior", post), ("deconvolved", deco)):
            out.append(predict_stability(S, [512], [5], ranking="absolute", seed=r, means=means, n_outer=10,
                                         n_sim=20)["jaccard"][0])
    assert 0.03 <= np.mean(post) <= 0.40
    assert np.mean(deco) >= 0.5  # the negative control: the old point deconvolution's bias


def test_posterior_means_keep_a_clear_gap_and_simulated_datasets_draw_them():
    rng = np.random.default_rng(18)
    S = rng.normal(0.0, 1.0, (32, 30))
    S[:, :4] += 20.0
    s = predict_stability(S, [128], [4], ranking="absolute", seed=1, means="posterior", n_outer=10, n_sim=20)
    assert s["jaccard"][0] == 1.0
    fit = fit_pilot(S, ranking="absolute", means="posterior")
    rows = np.arange(32)
    a, b = fit.dataset(rows, np.random.default_rng(0)), fit.dataset(rows, np.random.default_rng(1))
    assert not np.allclose(a, b)  # two posterior draws of the means
    # the same rows, shifted by one per-edge draw
    np.testing.assert_allclose(a - b, np.broadcast_to((a - b)[0], a.shape), atol=1e-12)


def test_tail_level_splits_the_miss_chance_over_the_doublings_from_the_pilot_and_the_calibration():
    # D + 1 events, D = max(1, log2(n / n0)) doublings and the calibration's own error, each (1 - level) / (D + 1)
    assert tail_level(0.9, 32, 64) == pytest.approx(1 - 0.1 / 2)  # one doubling and the calibration
    assert tail_level(0.9, 32, 40) == pytest.approx(0.95) and tail_level(0.9, 32, 16) == pytest.approx(0.95)
    assert tail_level(0.9, 32, 128) == pytest.approx(1 - 0.1 / 3) and tail_level(0.9, 32, 512) == pytest.approx(0.98)
    assert tail_level(0.8, 100, 800) == pytest.approx(1 - 0.2 / 4)
    rng = np.random.default_rng(19)
    # the model holds on normal pilots at every quantile: read deeper in the tail, the errors are standardised by
    # the model's own bound at that quantile, so no inflation (the 0.975 quantile of the errors standardised at
    # the plain level, a union bound on the whole bound, was 1.57 on normal pilots: bench, not kept)
    cs = [self_calibration(rng.normal(size=(32, 60)), 0.9, quantile=0.975, seed=r) for r in range(5)]
    assert max(cs) <= 1.25 and min(cs) >= 1.0


def _calibration_seed(seed: int) -> np.random.SeedSequence:
    """The seed predict_widths gives self_calibration (its halves), so a test can read the same halves elsewhere."""
    return spawn_seeds(spawn_seeds(seed, 2)[1], 2)[0]


def _spiky_bound_coverage(N: int, pilots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pilot of 32 from the spiky population of seed 32: the share of edges whose realised width at N is within
    width_upper, the same for the same halves read at the plain level (the rule before issue 49's tail level), and
    realised / upper per (pilot, edge)."""
    P = spiky_population(2000, 60, seed=32)
    rng = np.random.default_rng(32)
    new, old, ratio = [], [], []
    for r in range(pilots):
        pilot = P[rng.integers(0, P.shape[0], 32)]
        w = predict_widths(pilot, [N], n_resamples=499, seed=r)
        c_new = self_calibration(pilot, 0.9, quantile=tail_level(0.9, 32, N), seed=_calibration_seed(r))
        assert w["calibration"][0] == c_new  # predict_widths reads these halves at the tail level
        c_old = self_calibration(pilot, 0.9, quantile=0.9, seed=_calibration_seed(r))
        b = bootstrap_edges(P[rng.integers(0, P.shape[0], N)], n_resamples=499, seed=r)
        real = np.asarray(b.confidence_interval.high) - np.asarray(b.confidence_interval.low)
        up = w["width_upper"]
        up_old = up * np.exp((c_old - c_new) * log_sd_ratio_upper(32, N, w["kurtosis"], 0.9))
        new.append(np.mean(real <= up))
        old.append(np.mean(real <= up_old))
        ratio.append(real / up)
    return np.array(new), np.array(old), np.concatenate(ratio)


def test_width_upper_bound_holds_where_pilots_miss_rare_spikes_and_the_one_doubling_rule_does_not():
    # a spiky population (seed 32, not the bench's 9): edges whose spikes are rarer than 1/32 look normal in a
    # pilot of 32 and are seen by N = 512. Nominal 0.90; measured 0.931 over these 20 pilots x 60 edges (tail
    # level 0.98; 0.928 at 0.975, D events alone). Negative control: the same bound calibrated at the plain level,
    # as if N were one doubling away (the rule before issue 49's tail level), measured 0.848; the bound stays a
    # bound (median realised / upper 0.19, not ~0)
    new, old, ratio = _spiky_bound_coverage(512, 20)
    assert 0.90 <= np.mean(new) <= 0.98  # both sides: a bound that holds, and not always
    assert np.mean(old) <= 0.88
    assert np.median(ratio) >= 0.1


def test_width_upper_bound_holds_one_doubling_away_and_the_rule_without_the_calibration_event_does_not():
    # issue 49 item 3: at N = 2 n0 (D = 1) the rule that split the miss chance over the D doublings alone read the
    # halves at the plain level and held 0.895 +- 0.003 on the bench's spiky population (seed 9). Here a spiky
    # population of another seed (32), N = 64, 150 pilots x 60 edges (SE about 0.004 with the pilot as the unit):
    # the kept rule (D + 1 events: quantile 0.95) measured 0.912; negative control, the same halves read at 0.90
    # (D events), 0.889. Both sides: it holds, and it is not the whole width (median realised / upper 0.27; 0.39
    # for the old rule: the price, recorded in docs/sample-size.md).
    new, old, ratio = _spiky_bound_coverage(64, 150)
    assert 0.90 <= np.mean(new) <= 0.95
    assert np.mean(old) <= 0.895
    assert np.mean(new) - np.mean(old) >= 0.01  # paired: the same pilots and datasets
    assert np.median(ratio) >= 0.15


def test_predicted_j_half_is_the_audits_jaccard_half_by_brute_force():
    # the pilot is the population itself with its plain means, so the model is the truth: the predicted J_{N/2}
    # must match the mean jaccard_half that the audit's own halves (stability_halves) report over datasets of N
    # drawn from it (measured 0.419 against 0.433 +- 0.010); the negative control is J_N, which the audit does
    # not report as jaccard_half (predicted 0.56, the truth at 40 prompts 0.59)
    rng = np.random.default_rng(3)
    P = np.array([1.0, 0.9, 0.8, 0.7, 0.6, 0.5] + [0.2] * 6) + rng.standard_t(4, (300, 12))
    brute = np.array([halves_stability(P[rng.integers(0, 300, 40)], [3], ranking="absolute", seed=d)["jaccard_half"][0]
                      for d in range(200)])
    s = predict_stability(P, [40], [3], ranking="absolute", seed=0, means="pilot", n_outer=10, n_sim=200)
    assert s["half_units"][0] == 20
    assert abs(s["jaccard_half"][0] - brute.mean()) < 0.05  # 3 x the brute force's SE (0.010) plus the MC's
    assert s["jaccard"][0] - brute.mean() > 0.08
    assert s["jaccard_half_pi_low"][0] <= brute.mean() <= s["jaccard_half_pi_high"][0]


def _median_sd_ratio(P: np.ndarray, n: int, pilots: int, seed: int) -> float:
    """Median over pilots of 32 of the median over edges of (realised SD of one dataset of n) / (predicted `sd`)."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(pilots):
        w = predict_widths(P[rng.integers(0, P.shape[0], 32)], [n], n_resamples=199, seed=r)
        s = P[rng.integers(0, P.shape[0], n)].std(axis=0, ddof=1)
        ok = w["sd"] > 0
        out.append(np.median(s[ok] / w["sd"][ok]))
    return float(np.median(out))


def test_point_width_follows_the_median_sd_growth_of_heavy_tails_and_the_bootstrap_alone_does_not(monkeypatch):
    # a spiky population (seed 5: not the bench's 9 or 21, on which the rule was chosen and reported): a dataset of
    # 512 holds rare spikes a pilot of 32 rarely does, so the median edge's SD grows beyond the ratio bootstrap's
    # O(1/n) bias. Measured median realised / predicted SD 1.06 (20 pilots); the negative control, the same
    # prediction without median_sd_growth (the rule before), 1.11
    P = spiky_population(2000, 60, seed=5)
    assert 0.9 <= _median_sd_ratio(P, 512, 20, 5) <= 1.1
    monkeypatch.setattr(sample_size, "median_sd_growth", lambda n0, n, kurtosis: 1.0)
    assert _median_sd_ratio(P, 512, 20, 5) > 1.1


def test_median_sd_growth_is_one_on_normal_tails_and_grows_with_n_under_heavy_ones():
    # oracle: at kappa = 3 the law is the exact F(n - 1, n0 - 1), divided by itself
    assert median_sd_growth(32, 512, 3.0) == pytest.approx(1.0)
    assert median_sd_growth(32, 512, 2.0) == pytest.approx(1.0)  # floored at the normal's
    g = [median_sd_growth(32, n, 12.0) for n in (64, 128, 256, 512)]
    assert 1.0 < g[0] < g[1] < g[2] < g[3] < 1.5
    # brute force: the median of s_n / s_0 of independent samples of a kurtosis-9 law (Student t, 5 df) over the
    # normal's, against the Satterthwaite F law's (an approximation: within 3%)
    rng = np.random.default_rng(6)
    def med(draw):
        return np.median(draw((4000, 256)).std(axis=1, ddof=1) / draw((4000, 32)).std(axis=1, ddof=1))
    brute = med(lambda s: rng.standard_t(5, s)) / med(lambda s: rng.normal(size=s))
    assert median_sd_growth(32, 256, 9.0) == pytest.approx(brute, rel=0.03)


def test_the_default_and_posterior_means_meet_the_near_tie_bias_line_where_deconvolution_does_not():
    # the normal population (every mean 0): the true J_{N/2} at N = 128, k = 5 is J at 64 prompts, the chance level
    # 0.074 (bench/sample_size.py, 400 datasets). Issue 49's line: bias below 0.15. Measured over 40 pilots (the
    # bench): the tested default +0.018, posterior draws +0.068, deconvolved means +0.207 (these 8 pilots:
    # posterior +0.108, deconvolved +0.228). The default ties the means when the pilot's homogeneity test cannot
    # reject (docs/sample-size.md, "Tied when the pilot tells no edge apart")
    P = np.random.default_rng(4).normal(0.0, 1.0, (4000, 40))
    truth = float(chance_jaccard(40, [5])[0])  # two independent random 5-sets of 40 (the hypergeometric expectation)
    assert truth == pytest.approx(0.074, abs=0.005)
    rng = np.random.default_rng(21)
    pilots = [P[rng.integers(0, P.shape[0], 32)] for _ in range(8)]
    runs = {means: [predict_stability(S, [128], [5], ranking="absolute", seed=r, means=means, n_outer=10, n_sim=20)
                    for r, S in enumerate(pilots)] for means in ("tested", "posterior", "deconvolved")}
    bias = {m: np.mean([o["jaccard_half"][0] for o in out]) - truth for m, out in runs.items()}
    assert -0.03 <= bias["tested"] < 0.15 and -0.03 <= bias["posterior"] < 0.15
    assert bias["deconvolved"] > 0.15  # the negative control: deconvolution keeps the pilot's order of the ties
    tied = [bool(o["means_tied"][0]) for o in runs["tested"]]
    assert sum(tied) >= 6  # at level 0.05 a normal pilot ties in about 95% of draws
    assert not any(o["means_tied"][0] for o in runs["deconvolved"])  # only the tested default ties


def test_the_homogeneity_test_holds_its_level_and_rejects_real_effects():
    """homogeneity_pvalue against scipy's one-sample t tests combined by hand (a chi-square and a Bonferroni max-|t|
    test, joined by Bonferroni), its rejection rate at 0.05 under H0 bounded from both sides (normal pilots of 32,
    40 independent edges, 2000 draws), signed ranking testing a common non-zero mean on E - 1 df, and a pilot with
    one 2-SD edge among 1000 rejected (the sparse part: the chi-square alone does not reject it)."""
    from scipy import stats as st

    from circuitstat.stats.pilot_model import homogeneity_pvalue

    rng = np.random.default_rng(3)
    S = rng.normal(size=(32, 40))
    def by_hand(X):
        p = st.ttest_1samp(X, 0.0).pvalue
        return min(1.0, 2 * min(st.chi2.sf(np.sum(st.norm.isf(p / 2) ** 2), X.shape[1]), X.shape[1] * p.min()))

    assert homogeneity_pvalue(S.mean(0), S.std(0, ddof=1), 32, "absolute") == pytest.approx(by_hand(S))
    for ranking, shift in (("absolute", 0.0), ("signed", 3.0)):
        ps = np.array([homogeneity_pvalue(X.mean(0), X.std(0, ddof=1), 32, ranking)
                       for X in (rng.normal(size=(32, 40)) + shift for _ in range(2000))])
        # two tests joined by Bonferroni at 0.025 each: the size lies between 0.025 and 0.05 (+- 3 binomial SE)
        assert 0.02 <= (ps <= 0.05).mean() <= 0.065, ranking
    X = rng.normal(size=(32, 1000))
    X[:, 0] += 2.0  # one circuit edge among 1000: the sparse part finds it
    assert homogeneity_pvalue(X.mean(0), X.std(0, ddof=1), 32, "absolute") < 1e-6
    p = st.ttest_1samp(X, 0.0).pvalue
    assert st.chi2.sf(np.sum(st.norm.isf(p / 2) ** 2), 1000) > 1e-3  # the dense test alone is 1000x weaker
    assert homogeneity_pvalue(np.array([0.0, 0.5]), np.array([1.0, 0.0]), 32, "absolute") == 0.0  # a constant edge off 0
