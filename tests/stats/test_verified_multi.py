"""circuitstat.stats.verified.multi: several approximations as control variates, cross-fitted and shrunk across edges.

* oracles: with one predictor and no shrinkage it is ppi.py's PPI++ (in-sample, K = 1) and crossfit.py's (K = n),
  estimate and interval; with two, the in-sample slope is numpy's least squares; m = inf is the pooled least squares
  over edges solved by lstsq; p = 1 shrinkage is the convex combination the docstring states;
* a fold's coefficients do not move when the fold's own prompts change (on any edge), and do move for the others;
* unbiasedness of the cross-fitted estimate by Monte Carlo, with β fitted in-sample as the negative control (biased);
* coverage bounded from both sides, with a halved and a tripled interval as the negative controls;
* narrower than the better single predictor where the predictors' errors differ.
"""

from __future__ import annotations

import numpy as np
import pytest

from circuitstat.core.errors import InputError
from circuitstat.stats.verified import verified_means
from circuitstat.stats.verified.coverage import multi_population, simulate_designs
from circuitstat.stats.verified.crossfit import crossfit_fit
from circuitstat.stats.verified.multi import (MULTI_FOLDS, MULTI_SHRINK, multi_design, multi_fit, pooled_slope,
                                              shrunk_slopes, single_design, verified_means_multi)
from circuitstat.stats.verified.ppi import ppi_fit, ppi_intervals


def _gaussian(n: int, N_u: int, E: int, p: int, seed: int = 0):
    """Y [n, E], H [n, E, p], Hu [N_u, E, p]: each predictor 1.3 Y + noise, so every slope lies inside (0, 1)."""
    rng = np.random.default_rng(seed)

    def draw(m):
        y = rng.standard_t(6, (m, E)) + np.linspace(-1, 1, E)
        return y, 1.3 * y[:, :, None] + rng.normal(0, 0.8, (m, E, p))
    Y, H = draw(n)
    return Y, H, draw(N_u)[1]


def _same_interval(a, b) -> None:
    for k in ("low", "high", "standard_error", "df", "pvalue"):
        np.testing.assert_allclose(a[k], b[k], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["t2", "tkb"])
def test_one_predictor_without_shrinkage_is_ppi_fit_in_sample_and_crossfit_leave_one_out(method: str) -> None:
    Y, H, Hu = _gaussian(16, 496, 7, 1)
    ref = ppi_fit(Y, H[:, :, 0], Hu[:, :, 0])
    assert ((ref.lam > 0.05) & (ref.lam < 0.95)).all()  # ppi.py's clip to [0, 1] is inactive
    got = multi_fit(Y, H, Hu, folds=1, shrink=0.0)
    np.testing.assert_allclose(got.fit.estimate, ref.estimate, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.lam[:, 0], ref.lam, rtol=0, atol=1e-12)
    _same_interval(ppi_intervals(got.fit, method), ppi_intervals(ref, method))
    loo = crossfit_fit(Y, H[:, :, 0], Hu[:, :, 0])
    got = multi_fit(Y, H, Hu, folds=None, shrink=0.0)
    np.testing.assert_allclose(got.fit.estimate, loo.estimate, rtol=0, atol=1e-12)
    _same_interval(ppi_intervals(got.fit, method), ppi_intervals(loo, method))
    assert "leave-one-out" in got.label and "β per edge" in got.label


def test_verified_means_multi_with_one_predictor_is_verified_means() -> None:
    Y, H, Hu = _gaussian(16, 496, 5, 1, seed=3)
    A = np.concatenate([H[:, :, 0], Hu[:, :, 0]])
    rows = np.arange(16)
    ref = verified_means(A, Y, rows)
    got = verified_means_multi({"eap": A}, Y, rows, folds=1, shrink=0.0)
    for k in ("estimate", "standard_error", "df", "lam", "pvalue", "qvalue", "estimate_crossfit", "approx_mean"):
        np.testing.assert_allclose(getattr(got, k), getattr(ref, k), rtol=1e-10, atol=1e-12, err_msg=k)
    np.testing.assert_array_equal(got.reliable, ref.reliable)
    assert got.to_table().column_names == ref.to_table().column_names  # one result contract, one table schema


def test_two_predictors_in_sample_slope_is_least_squares() -> None:
    Y, H, Hu = _gaussian(40, 300, 4, 2, seed=1)
    got = multi_fit(Y, H, Hu, folds=1, shrink=0.0)
    n, N_u = Y.shape[0], Hu.shape[0]
    for e in range(Y.shape[1]):
        design = np.c_[np.ones(n), H[:, e, :]]
        beta = np.linalg.lstsq(design, Y[:, e], rcond=None)[0][1:]
        lam = beta / (1 + n / N_u)
        np.testing.assert_allclose(got.lam[e], lam, rtol=1e-10)
        by_hand = lam @ Hu[:, e, :].mean(0) + (Y[:, e] - H[:, e, :] @ lam).mean()
        assert got.fit.estimate[e] == pytest.approx(by_hand, rel=1e-12)


def test_pooled_slope_is_weighted_least_squares_over_edges_and_shrinkage_interpolates() -> None:
    Y, H, _ = _gaussian(30, 10, 6, 2, seed=2)
    Y = Y * np.linspace(0.5, 5, 6)  # edges on different scales: the pool weighs each edge by 1 / Var(Y_e)
    H = H * np.linspace(0.5, 5, 6)[None, :, None]
    Yc, Hc = Y - Y.mean(0), H - H.mean(0)
    w = 1 / np.sqrt(Yc.var(0))
    ref = np.linalg.lstsq((Hc * w[None, :, None]).reshape(-1, 2), (Yc * w).ravel(), rcond=None)[0]
    beta_inf = shrunk_slopes(Y, H, np.inf)
    np.testing.assert_allclose(beta_inf, np.broadcast_to(ref, (6, 2)), rtol=1e-10)
    # one predictor: β_e = (n β̂_e + m β_pool) / (n + m), the docstring's pseudo-prompts reading of m
    b0, bp = shrunk_slopes(Y, H[:, :, :1], 0.0)[:, 0], shrunk_slopes(Y, H[:, :, :1], np.inf)[:, 0]
    np.testing.assert_allclose(shrunk_slopes(Y, H[:, :, :1], 10.0)[:, 0], (30 * b0 + 10 * bp) / 40, rtol=1e-10)
    assert not np.allclose(b0, bp)  # the edges' own slopes differ, so the interpolation is exercised
    # an edge with constant exact scores stays out of the pool
    Y2 = Y.copy()
    Y2[:, 0] = 1.0
    S = np.einsum("iep,ieq->epq", Hc, Hc) / 30
    c = np.einsum("iep,ie->ep", Hc, Y2 - Y2.mean(0)) / 30
    np.testing.assert_allclose(pooled_slope(S, c, (Y2 - Y2.mean(0)).var(0)),
                               pooled_slope(S[1:], c[1:], Yc[:, 1:].var(0)), rtol=1e-10)


def test_a_fold_coefficients_never_see_its_own_prompts_on_any_edge() -> None:
    Y, H, Hu = _gaussian(12, 100, 5, 2, seed=4)
    base = multi_fit(Y, H, Hu, folds=3, shrink=MULTI_SHRINK).lam_folds
    Y2, H2 = Y.copy(), H.copy()
    fold0 = np.arange(12) % 3 == 0
    Y2[fold0] += 50 * np.random.default_rng(0).normal(size=Y2[fold0].shape)  # every edge of fold 0's prompts
    H2[fold0] *= -3
    moved = multi_fit(Y2, H2, Hu, folds=3, shrink=MULTI_SHRINK).lam_folds
    np.testing.assert_array_equal(moved[0], base[0])       # fold 0's coefficients: from folds 1 and 2 only
    assert np.abs(moved[1:] - base[1:]).min() > 1e-6     # the others use fold 0, on every edge (negative control)
    # the pooled slope is what carries other edges' prompts in: without shrinkage fold 0 is still untouched
    np.testing.assert_array_equal(multi_fit(Y2, H2, Hu, folds=3, shrink=0.0).lam_folds[0],
                                  multi_fit(Y, H, Hu, folds=3, shrink=0.0).lam_folds[0])


def _estimates(X: np.ndarray, H: np.ndarray, n: int, D: int, folds, shrink: float, seed: int) -> np.ndarray:
    """Estimates [D, E] on D datasets of N = 256 drawn with replacement from the population (truth: X.mean(0))."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(D):
        rows = rng.integers(0, X.shape[0], 256)
        out.append(multi_fit(X[rows[:n]], H[rows[:n]], H[rows[n:]], folds=folds, shrink=shrink).fit.estimate)
    return np.asarray(out)


def test_cross_fitted_estimate_is_unbiased_and_in_sample_is_not() -> None:
    # a heavy-tailed synthetic population whose in-sample bias is large at n = 16 (measured: up to ~0.5 SD)
    X, H = multi_population(4000, 12, seed=7)
    truth, D = X.mean(0), 1500
    for folds, shrink in ((2, 0.0), (MULTI_FOLDS, MULTI_SHRINK)):
        est = _estimates(X, H, 16, D, folds, shrink, seed=5)
        z = (est.mean(0) - truth) / (est.std(0, ddof=1) / np.sqrt(D))
        assert np.abs(z).max() < 4.0, (folds, shrink, z)
    est = _estimates(X, H, 16, D, 1, 0.0, seed=5)  # negative control: β fitted on the prompts it is applied to
    z = (est.mean(0) - truth) / (est.std(0, ddof=1) / np.sqrt(D))
    assert np.abs(z).max() > 6.0 and (np.abs(z) > 4.0).sum() >= 3, z  # several edges, far past the bound above


def test_coverage_is_bounded_from_both_sides_and_narrower_than_either_predictor() -> None:
    X, H = multi_population(4000, 30, seed=3)
    truth, D = X.mean(0), 200
    designs = {"eap": single_design(0), "other": single_design(1), "multi": multi_design([0, 1])}
    r = simulate_designs(X, H, 512, 32, D, seed=9, designs=designs)
    m = r["multi"]
    assert 0.93 <= m["covered"].mean() <= 0.98
    for scale, fails in ((0.5, "low"), (3.0, "high")):  # negative controls: the same intervals, halved or tripled
        cov = (np.abs(m["estimate"] - truth) <= scale * m["width"] / 2).mean()
        assert (cov < 0.93) if fails == "low" else (cov > 0.98), (scale, cov)
    wall = r["exact_all"]["width"]
    med = {k: np.median(np.median(r[k]["width"] / wall, 0)) for k in designs}
    assert med["multi"] < 0.8 * min(med["eap"], med["other"]), med


def test_identical_predictors_gain_nothing() -> None:
    # negative control for the width claim: a second copy of the same errors adds no information
    X, H = multi_population(4000, 30, seed=3)
    H2 = np.stack([H[:, :, 0], H[:, :, 0] * 1.0001], axis=2)
    r = simulate_designs(X, H2, 512, 32, 100, seed=9, designs={"one": multi_design([0]), "two": multi_design([0, 1])})
    ratio = np.median(r["two"]["width"] / r["one"]["width"])
    assert ratio >= 0.97, ratio


def test_result_names_the_design_and_keeps_each_coefficient() -> None:
    Y, H, Hu = _gaussian(16, 496, 4, 2, seed=6)
    A = np.concatenate([H, Hu])
    r = verified_means_multi({"eap": A[:, :, 0], "atp-qkfix": A[:, :, 1]}, Y, np.arange(16), folds=2)
    assert r.params["method"] == "PPI++, 2 predictors, cross-fitted β (K = 2), shrunk across edges (m = 4)"
    assert r.predictors == ("eap", "atp-qkfix") and r.coefficients.shape == (4, 2)
    np.testing.assert_allclose(r.lam, r.coefficients.sum(1))
    np.testing.assert_allclose(r.estimate_crossfit, r.estimate)  # the interval's fit is already cross-fitted
    assert "median λ (atp-qkfix)" in r.summary()
    lo, hi = r.conf_int().low, r.conf_int().high
    assert ((lo < r.estimate) & (r.estimate < hi)).all()


@pytest.mark.parametrize("kwargs, match", [
    ({"folds": 0}, "folds must lie"), ({"folds": 17}, "folds must lie"), ({"shrink": -1.0}, "shrink must be"),
])
def test_bad_design_is_refused_by_name(kwargs: dict, match: str) -> None:
    Y, H, Hu = _gaussian(16, 100, 3, 2)
    with pytest.raises(InputError, match=match):
        multi_fit(Y, H, Hu, **kwargs)


def test_bad_inputs_are_refused_by_name() -> None:
    Y, H, Hu = _gaussian(16, 100, 3, 2)
    with pytest.raises(InputError, match="training prompts per fold"):
        multi_fit(Y[:6], H[:6], Hu, folds=2)  # 3 training prompts cannot fit 2 slopes and a mean
    H[0, 0, 1] = np.nan
    with pytest.raises(InputError, match="NaN"):
        multi_fit(Y, H, Hu)
    with pytest.raises(InputError, match="one shape"):
        verified_means_multi({"a": np.zeros((50, 3)), "b": np.zeros((50, 4))}, Y, np.arange(16))


def test_multiple_correlation_is_the_fitted_values_correlation_and_bounds_the_floor() -> None:
    from circuitstat.stats.verified.floor import multiple_correlation, per_prompt_correlation, width_floor

    X, H = multi_population(2000, 6, seed=5)
    R = multiple_correlation(X, H)
    for e in range(6):
        design = np.c_[np.ones(2000), H[:, e, :]]
        fitted = design @ np.linalg.lstsq(design, X[:, e], rcond=None)[0]
        assert R[e] == pytest.approx(np.corrcoef(fitted, X[:, e])[0, 1], abs=1e-10)
    np.testing.assert_allclose(multiple_correlation(X, H[:, :, :1]), np.abs(per_prompt_correlation(X, H[:, :, 0])),
                               atol=1e-12)
    # two predictors never raise the floor, and with independent errors they lower it
    one = np.maximum(np.abs(per_prompt_correlation(X, H[:, :, 0])), np.abs(per_prompt_correlation(X, H[:, :, 1])))
    assert (R >= one - 1e-12).all() and np.median(width_floor(R, 16, 512)) < np.median(width_floor(one, 16, 512))
