"""circuitstat.stats.verified: PPI++ per-edge means of the exact effect against ppi_py, its p/q-values and input checks.

The coverage study is tests/stats/test_verified_coverage.py; the missed-edges bound tests/stats/test_missed_edges.py.
"""

from __future__ import annotations

import numpy as np
import ppi_py  # ppi-python, a dev dependency (pyproject's dev extras): the reference implementation
import pytest

from circuitstat.core.errors import InputError
from circuitstat.stats.verified import verified_means
from circuitstat.stats.verified.ppi import INTERVALS, ppi_fit, ppi_intervals, power_tuning


def _pair(n: int, N: int, E: int, seed: int = 0):
    """Labelled exact/approx and unlabelled approx with per-edge slopes, so λ̂ lies strictly inside (0, 1)."""
    rng = np.random.default_rng(seed)
    slope = np.linspace(0.4, 1.6, E)

    def draw(m):
        x = rng.standard_t(5, (m, E)) + np.linspace(-1, 1, E)
        return x, slope * x + rng.normal(0, 1.0, (m, E))
    Y, H = draw(n)
    _, Hu = draw(N)
    return Y, H, Hu


def test_z_interval_and_estimate_equal_ppi_py() -> None:
    Y, H, Hu = _pair(2000, 6000, 6)
    fit = ppi_fit(Y, H, Hu, tuning="pooled")
    assert ((fit.lam > 0.05) & (fit.lam < 0.95)).all()  # the tuning is exercised, not clipped
    ref_est = ppi_py.ppi_mean_pointestimate(Y, H, Hu, lam_optim_mode="element")
    np.testing.assert_allclose(fit.estimate, ref_est, rtol=0, atol=1e-8)
    for alpha in (0.1, 0.05):
        ci = ppi_intervals(fit, "z", 1 - alpha)
        lo, hi = ppi_py.ppi_mean_ci(Y, H, Hu, alpha=alpha, lam_optim_mode="element")
        np.testing.assert_allclose(ci["low"], lo, rtol=0, atol=1e-8)
        np.testing.assert_allclose(ci["high"], hi, rtol=0, atol=1e-8)
    for e in range(Y.shape[1]):  # one edge at a time: ppi_py's own (overall) tuning of a 1-D mean
        lo, hi = ppi_py.ppi_mean_ci(Y[:, e], H[:, e], Hu[:, e], alpha=0.05)
        ci = ppi_intervals(ppi_fit(Y[:, e], H[:, e], Hu[:, e], tuning="pooled"), "z", 0.95)
        np.testing.assert_allclose([ci["low"][0], ci["high"][0]], [np.ravel(lo)[0], np.ravel(hi)[0]], atol=1e-8)


@pytest.mark.parametrize("lam", [0.0, 0.37, 1.0])
def test_fixed_lambda_equals_ppi_py(lam: float) -> None:
    Y, H, Hu = _pair(300, 900, 3, seed=1)
    fit = ppi_fit(Y, H, Hu, lam=lam)
    np.testing.assert_allclose(fit.estimate, ppi_py.ppi_mean_pointestimate(Y, H, Hu, lam=lam), atol=1e-10)
    lo, hi = ppi_py.ppi_mean_ci(Y, H, Hu, alpha=0.05, lam=lam)
    ci = ppi_intervals(fit, "z", 0.95)
    np.testing.assert_allclose(np.c_[ci["low"], ci["high"]], np.c_[lo, hi], atol=1e-10)


def test_verified_means_is_ppi_py_on_the_labelled_rows_and_their_complement() -> None:
    Y_all, H_all, _ = _pair(3000, 2, 4, seed=2)
    rows = np.random.default_rng(3).choice(3000, 1500, replace=False)
    res = verified_means(H_all, Y_all[rows], rows, interval="z", tuning="pooled")
    rest = np.setdiff1d(np.arange(3000), rows)
    lo, hi = ppi_py.ppi_mean_ci(Y_all[rows], H_all[rows], H_all[rest], alpha=0.05, lam_optim_mode="element")
    np.testing.assert_allclose(res.conf_int().to_array(), np.c_[lo, hi], atol=1e-8)
    # a boolean mask means the same prompts
    mask = np.zeros(3000, dtype=bool)
    mask[rows] = True
    order = np.argsort(rows)
    same = verified_means(H_all, Y_all[rows][order], mask, interval="z", tuning="pooled")
    np.testing.assert_allclose(same.estimate, res.estimate, atol=1e-12)


def test_small_n_forms_converge_to_ppi_py_at_large_n() -> None:
    # every small-n correction (df, λ's variance from the labelled prompts) must vanish as n grows
    Y, H, Hu = _pair(4000, 8000, 5, seed=4)
    lo, hi = ppi_py.ppi_mean_ci(Y, H, Hu, alpha=0.05, lam_optim_mode="element")
    for m in INTERVALS:
        ci = ppi_intervals(ppi_fit(Y, H, Hu), m, 0.95)
        np.testing.assert_allclose(ci["high"] - ci["low"], hi - lo, rtol=0.03)
        np.testing.assert_allclose((ci["high"] + ci["low"]) / 2, (hi + lo) / 2, atol=0.02 * np.max(hi - lo))


def test_labelled_tuning_is_the_labelled_regression_slope() -> None:
    Y, H, Hu = _pair(40, 400, 4, seed=5)
    lam = power_tuning(Y, H, Hu, clip=False, tuning="labelled")
    slope = np.array([np.polyfit(H[:, e], Y[:, e], 1)[0] for e in range(4)])
    np.testing.assert_allclose(lam, slope / (1 + 40 / 400), rtol=1e-10)
    assert (power_tuning(Y, H, Hu, tuning="labelled") <= 1).all()


@pytest.mark.parametrize("interval", INTERVALS)
def test_pvalue_inverts_the_interval_and_qvalues_are_bh(interval: str) -> None:
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(6)
    E = 40
    X = rng.standard_t(4, (512, E)) + np.r_[np.zeros(20), np.linspace(0.05, 1.0, 20)]
    A = 0.9 * X + rng.normal(0, 0.5, X.shape)
    rows = rng.choice(512, 16, replace=False)
    res = verified_means(A, X[rows], rows, interval=interval, crossfit_pvalues=False)
    lo, hi = res.confidence_interval
    excludes = (lo > 0) | (hi < 0)
    assert excludes.any() and not excludes.all()
    np.testing.assert_array_equal(excludes, res.pvalue < 0.05)
    np.testing.assert_allclose(res.qvalue, multipletests(res.pvalue, method="fdr_bh")[1], atol=1e-12)


def test_table_names_the_estimand_with_n_and_N() -> None:
    rng = np.random.default_rng(7)
    A = rng.normal(size=(64, 3))
    res = verified_means(A, A[:10] + 0.1, np.arange(10), edge_names=["a", "b", "c"])
    t = res.to_table()
    assert set(t.column("estimand").to_pylist()) == {"mean exact effect, verified on 10 of 64 prompts"}
    ci = res.conf_int(alpha=0.05)
    assert ci.estimand == "mean exact effect, verified on 10 of 64 prompts" and ci.level == 0.95
    assert "verified on 10 of 64 prompts" in res.summary()


@pytest.mark.parametrize("bad, match", [
    (dict(labelled=np.array([0, 0, 1, 2])), "repeat"),
    (dict(labelled=np.array([0, 1, 2, 99])), r"\[0, 64\)"),
    (dict(labelled=np.arange(3)), "exact must be"),
    (dict(exact=np.full((4, 3), np.nan)), "NaN"),
    (dict(labelled=np.arange(63), exact=np.zeros((63, 3))), "unlabelled"),
    (dict(interval="bca"), "interval must be one of"),
])
def test_bad_input_is_refused_naming_the_problem(bad: dict, match: str) -> None:
    A = np.random.default_rng(8).normal(size=(64, 3))
    kw = dict(approx=A, exact=A[:4], labelled=np.arange(4))
    kw.update(bad)
    with pytest.raises(InputError, match=match):
        verified_means(kw.pop("approx"), kw.pop("exact"), kw.pop("labelled"), **kw)


def test_heavier_tails_widen_the_interval_forms_in_order() -> None:
    # t2 charges λ a degree of freedom, tk the rectifier's kurtosis, tka the approximation's: each form is at
    # least as wide as the one before, and tka is wider where the unlabelled approximation is heavy-tailed
    rng = np.random.default_rng(9)
    n, N, E = 16, 496, 4
    Y = rng.normal(size=(n, E))
    H = 0.9 * Y + 0.3 * rng.normal(size=(n, E))
    Hu = rng.normal(size=(N, E))
    Hu[:, 2:] = rng.standard_t(2.5, (N, 2))  # heavy tails the 16 labelled prompts do not show
    fit = ppi_fit(Y, H, Hu)
    w = {m: (lambda c: c["high"] - c["low"])(ppi_intervals(fit, m)) for m in ("t", "t2", "tk", "tkb", "tka")}
    assert (w["t"] < w["t2"]).all() and (w["t2"] <= w["tk"] + 1e-12).all() and (w["tk"] <= w["tkb"] + 1e-12).all()
    assert (w["tkb"] <= w["tka"] + 1e-12).all()
    assert (w["tka"][2:] > 1.05 * w["tk"][2:]).all() and np.allclose(w["tka"][:2], w["tk"][:2], rtol=0.05)


def test_flag_marks_a_rectifier_carried_by_one_prompt_and_a_heavy_tailed_approximation() -> None:
    rng = np.random.default_rng(10)
    N, n, E = 400, 16, 3
    X = rng.normal(size=(N, E))
    A = X + 0.1 * rng.normal(size=(N, E))
    rows = np.arange(n)
    exact = X[rows].copy()
    exact[0, 1] += 50.0  # edge 1: one labelled prompt where the approximation misses by far
    A[n:n + 3, 2] += 400.0  # edge 2: three unlabelled prompts carry the approximation's mean
    res = verified_means(A, exact, rows)
    np.testing.assert_array_equal(res.reliable, [True, False, False])
    assert res.rectifier_share[1] > 0.5 and res.approx_tail_share[2] > 0.6


def test_pooled_tuning_collapses_lambda_on_the_zoos_spiky_edges() -> None:
    # docs/verified.md: where EAP tracks exact (per-example correlation 0.999) but one rare prompt carries
    # the mean, ppi_py's pooled λ̂ falls to ~0 at n = 16; the labelled tuning keeps it near 1
    from fixture_populations import load_zoo_pair
    from circuitstat.stats.verified.coverage import simulate_verified

    X, A, names = load_zoo_pair()
    e = [names.index("a0.h3->a1.h2<q>")]
    lam = {t: np.median(simulate_verified(X[:, e], A[:, e], 512, 16, 100, seed=3, methods=("t2",),
                                          tuning=t)["t2"]["lam"]) for t in ("pooled", "labelled")}
    assert lam["pooled"] < 0.3 < 0.9 < lam["labelled"]
