"""Issue 48 item 1: the verified tail flag's width rules read a two-phase yardstick and cap the interval at 20× exact
on all N's estimated width.

* ``regression_sd`` against an independent oracle: numpy's lstsq (intercept included) on the labelled rows less the
  most extreme exact score, plus the slope's quadratic form in the approximation's covariance over all N prompts;
  ``yardstick_sd`` is the smaller of it and ``sd_without_extreme``, and the fits carry it.
* an over-spread labelled sample that the approximation shows: the width rule with the new yardstick fails an
  interval that the labelled yardstick alone passes (the negative control).
* a well-behaved population (a uniformly drawn labelled sample): the new yardstick changes no flag.
* a large N: an interval as wide as exact on the 16 labelled prompts passes the factor-2 rule but is more than 20×
  exact on all N; only the cap refuses it, and the same data at N = 512 pass.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special

from circuitstat.stats.verified import verified_means
from circuitstat.stats.verified.crossfit import crossfit_fit
from circuitstat.stats.verified.multi import multi_fit
from circuitstat.stats.verified.ppi import ppi_fit, ppi_intervals, regression_sd, sd_without_extreme, yardstick_sd
from circuitstat.stats.verified.reliability import (RELIABLE_MAX_EXACT_ALL_RATIO, RELIABLE_MAX_WIDTH_RATIO,
                                                    exact_on_all_width, exact_on_labelled_width, verified_reliability)


def _oracle(Y: np.ndarray, H: np.ndarray, H_all: np.ndarray) -> np.ndarray:
    """Per column: lstsq of Y on [1, H] over the rows less the Y farthest from the median; resid SS / (m − 1) +
    βᵀ Cov_N(H) β (np.cov over all N rows), and for one predictor also the identity Var(Y) + β² (Var_N − Var)."""
    out = []
    for e in range(Y.shape[1]):
        keep = np.delete(np.arange(Y.shape[0]), np.abs(Y[:, e] - np.median(Y[:, e])).argmax())
        y, h = Y[keep, e], H[keep, e].reshape(keep.size, -1)
        coef, *_ = np.linalg.lstsq(np.column_stack([np.ones(keep.size), h]), y, rcond=None)
        beta = coef[1:]
        resid = y - coef[0] - h @ beta
        cov_all = np.atleast_2d(np.cov(H_all[:, e].reshape(H_all.shape[0], -1), rowvar=False))
        s2 = resid @ resid / (keep.size - 1) + beta @ cov_all @ beta
        if h.shape[1] == 1:  # the identity the docs state, on the variance scale
            ident = np.var(y, ddof=1) + beta[0] ** 2 * (np.var(H_all[:, e], ddof=1) - np.var(h[:, 0], ddof=1))
            assert s2 == pytest.approx(ident, rel=1e-9)
        out.append(np.sqrt(s2))
    return np.array(out)


def test_regression_sd_equals_lstsq_and_the_covariance_over_all_prompts() -> None:
    rng = np.random.default_rng(0)
    N, n, E = 300, 16, 6
    X = rng.standard_t(4, (N, E))
    A = np.linspace(0.3, 1.4, E) * X + rng.normal(size=(N, E))
    A[:, 5] = 2.0  # a constant approximation: slope 0, the yardstick is the labelled residual SD
    got = regression_sd(X[:n], A[:n], A)
    np.testing.assert_allclose(got[:5], _oracle(X[:n, :5], A[:n, :5], A[:, :5]), rtol=1e-10)
    assert got[5] == pytest.approx(sd_without_extreme(X[:n, 5:])[0], rel=1e-12)
    # two predictors ([n, E, p]): the multivariate regression estimator
    H = np.stack([A, X + rng.normal(size=(N, E))], axis=2)
    np.testing.assert_allclose(regression_sd(X[:n], H[:n], H)[:5], _oracle(X[:n, :5], H[:n, :5], H[:, :5]),
                               rtol=1e-9)
    want = np.minimum(sd_without_extreme(X[:n]), got)
    np.testing.assert_allclose(yardstick_sd(X[:n], A[:n], A), want, rtol=1e-12)
    # the fits carry it, with the approximation over all N = labelled + unlabelled prompts
    np.testing.assert_allclose(ppi_fit(X[:n], A[:n], A[n:]).exact_ref_sd, want, rtol=1e-12)
    np.testing.assert_allclose(crossfit_fit(X[:n], A[:n], A[n:]).exact_ref_sd, want, rtol=1e-12)
    np.testing.assert_allclose(multi_fit(X[:n], H[:n], H[n:]).fit.exact_ref_sd,
                               np.minimum(sd_without_extreme(X[:n]), regression_sd(X[:n], H[:n], H)), rtol=1e-12)


def _tracking(N: int, E: int, seed: int):
    """Exact scores normal per edge and an approximation that tracks them closely."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, E))
    return X, X + 0.1 * rng.normal(size=(N, E))


def test_an_over_spread_labelled_sample_fails_the_new_yardstick_and_passes_the_old() -> None:
    """16 labelled prompts drawn from the population's extremes (SD without the most extreme 2.1-2.8 against 1): the labelled yardstick is
    wide with them, the approximation on all N shows the over-spread, and an interval as wide as the labelled
    yardstick's t interval is more than 2× the new one's. The old rule (labelled SD alone, the negative control) passes it."""
    N, n, E = 512, 16, 20
    X, A = _tracking(N, E, 1)
    Y = np.empty((n, E))
    H, Hu = np.empty((n, E)), np.empty((N - n, E))
    for e in range(E):  # per edge, its 16 most extreme prompts labelled
        order = np.argsort(-np.abs(X[:, e]))
        Y[:, e], H[:, e], Hu[:, e] = X[order[:n], e], A[order[:n], e], A[order[n:], e]
    fit = ppi_fit(Y, H, Hu)
    sd_trim = sd_without_extreme(Y)
    assert (sd_trim > 1.8).all() and (fit.exact_ref_sd < 1.2).all()  # the yardstick reads the population SD
    q = special.stdtrit(n - 1, 0.975)
    old_ref = 2 * q * sd_trim / np.sqrt(n)
    width = old_ref.copy()
    out = verified_reliability(fit, width)
    base = verified_reliability(fit)["reliable"]
    assert base.all()  # the other rules pass: only the width rule can fail these cells
    assert (width / old_ref <= RELIABLE_MAX_WIDTH_RATIO).all()  # the old rule passed every one
    assert (out["width_ratio"] > RELIABLE_MAX_WIDTH_RATIO).all() and not out["reliable"].any()
    assert (out["width_vs_exact_all"] <= RELIABLE_MAX_EXACT_ALL_RATIO).all()  # the cap is not what fails them


def test_a_uniform_labelled_sample_changes_no_flag() -> None:
    """Uniformly drawn labelled prompts, a tracking and an unrelated approximation: the tkb interval is flagged
    exactly as under the labelled yardstick alone, every edge reliable, and the yardstick is within a factor 0.6 of
    the labelled SD (the min can shrink it only where the sample is over-spread)."""
    N, n, E = 512, 32, 200
    X, A = _tracking(N, E, 2)
    A[:, E // 2:] = np.random.default_rng(3).normal(size=(N, E - E // 2))  # half the edges: unrelated
    fit = ppi_fit(X[:n], A[:n], A[n:])
    ci = ppi_intervals(fit, "tkb")
    width = ci["high"] - ci["low"]
    out = verified_reliability(fit, width)
    old = verified_reliability(fit)["reliable"] & (
        width / (2 * special.stdtrit(n - 1, 0.975) * sd_without_extreme(X[:n]) / np.sqrt(n)) <= RELIABLE_MAX_WIDTH_RATIO)
    assert out["reliable"].all() and old.all()
    assert (fit.exact_ref_sd / sd_without_extreme(X[:n]) > 0.6).all()


def test_at_large_n_only_the_cap_refuses_an_interval_as_wide_as_exact_on_the_labelled_prompts() -> None:
    """An approximation unrelated to exact (λ ≈ 0): the interval is about exact on the 16 labelled prompts, so the
    factor-2 rule passes it, but at N = 20000 that is about 35× exact on all N: the cap refuses every edge. The same
    first 512 prompts (the negative control: the 2× rule implies the cap while N <= 85 n) pass."""
    rng = np.random.default_rng(4)
    N, n, E = 20000, 16, 30
    X, A = rng.normal(size=(N, E)), rng.normal(size=(N, E))
    for M, capped in ((N, True), (512, False)):
        fit = ppi_fit(X[:n], A[:n], A[n:M])
        ci = ppi_intervals(fit, "tkb")
        out = verified_reliability(fit, ci["high"] - ci["low"])
        assert (out["width_ratio"] <= RELIABLE_MAX_WIDTH_RATIO).mean() >= 0.9  # the factor-2 rule passes them
        np.testing.assert_allclose(out["width_vs_exact_all"],
                                   (ci["high"] - ci["low"]) / exact_on_all_width(fit.exact_ref_sd, M), rtol=1e-12)
        # the two ratios differ by the widths' ratio, (t / z) sqrt(M / n)
        np.testing.assert_allclose(out["width_vs_exact_all"] / out["width_ratio"],
                                   exact_on_labelled_width(fit.exact_ref_sd, fit.n) / exact_on_all_width(fit.exact_ref_sd, M), rtol=1e-12)
        if capped:
            assert (out["width_vs_exact_all"] > RELIABLE_MAX_EXACT_ALL_RATIO).all() and not out["reliable"].any()
        else:
            assert (out["width_vs_exact_all"] <= RELIABLE_MAX_EXACT_ALL_RATIO).all()
            assert np.array_equal(out["reliable"], out["width_ratio"] <= RELIABLE_MAX_WIDTH_RATIO)


def test_the_verified_table_writes_the_estimated_ratio() -> None:
    """verified_means writes width_vs_exact_on_all (the cap reads it) and the flag verified_reliability computes."""
    rng = np.random.default_rng(5)
    X, A = rng.normal(size=(4000, 3)), rng.normal(size=(4000, 3))
    rows = np.arange(16)
    res = verified_means(A, X[rows], rows)
    t = res.to_table()
    fit = ppi_fit(X[rows], A[rows], A[16:])
    np.testing.assert_allclose(t["width_vs_exact_on_all"].to_numpy(),
                               (res.confidence_interval.high - res.confidence_interval.low)
                               / exact_on_all_width(fit.exact_ref_sd, 4000), rtol=1e-12)
    want = verified_reliability(fit, res.confidence_interval.high - res.confidence_interval.low)
    np.testing.assert_allclose(t["width_vs_exact_on_all"].to_numpy(), want["width_vs_exact_all"], rtol=1e-12)
    assert t["no_tail_seen"].to_pylist() == want["reliable"].tolist()
