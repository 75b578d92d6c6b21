"""circuitstat.stats.approximation against independent computations (scipy, numpy.polyfit, brute-force sets)."""

import numpy as np
import pytest
from scipy import stats as sps

from circuitstat.stats.approximation import approximation_agreement


def test_agreement_matches_independent_computations():
    rng = np.random.default_rng(3)
    exact = rng.standard_t(3, (40, 25)) + np.linspace(-2, 2, 25)
    approx = 0.7 * exact + rng.normal(0, 0.5, exact.shape) + 0.1
    res = approximation_agreement(exact, approx, 5, ranking="absolute")
    per = res.to_table("approximation_edges").to_pydict()
    for e in (0, 7, 24):
        slope, intercept = np.polyfit(exact[:, e], approx[:, e], 1)
        assert per["slope"][e] == pytest.approx(slope) and per["intercept"][e] == pytest.approx(intercept)
        assert per["r2"][e] == pytest.approx(np.corrcoef(exact[:, e], approx[:, e])[0, 1] ** 2)
        assert per["error_sd"][e] == pytest.approx(np.std(approx[:, e] - exact[:, e], ddof=1))
    s = res.summary_row
    assert s["spearman"] == pytest.approx(sps.spearmanr(exact.mean(0), approx.mean(0))[0])
    assert s["kendall"] == pytest.approx(sps.kendalltau(exact.mean(0), approx.mean(0))[0])
    assert s["r2"] == pytest.approx(np.corrcoef(exact.ravel(), approx.ravel())[0, 1] ** 2)
    top = lambda v: set(np.argsort(-np.abs(v))[:5])  # noqa: E731 - no ties in continuous data
    assert s["top_k_overlap"] == len(top(exact.mean(0)) & top(approx.mean(0))) / 5


def test_identical_scores_agree_perfectly_and_shapes_are_checked():
    x = np.random.default_rng(0).normal(size=(10, 6))
    s = approximation_agreement(x, x, 3, ranking="signed").summary_row
    assert s["spearman"] == pytest.approx(1) and s["top_k_overlap"] == 1 and s["bias_mean"] == 0
    with pytest.raises(ValueError, match="same shape"):
        approximation_agreement(x, x[:, :5], 3, ranking="signed")
