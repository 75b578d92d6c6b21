"""circuitstat.stats.groundtruth: ROC areas against independent oracles, selections, intervals over datasets, the FDR check."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from circuitstat.stats.groundtruth import (auroc, fdr_check, over_datasets, pessimistic_auroc, roc_points, selection_metrics,
                               topk_metrics)


def _pairs(s: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Brute force over (true, false) pairs: (P(true > false) + P(tie)/2, P(true > false))."""
    d = s[y][:, None] - s[~y][None, :]
    return float(((d > 0) + 0.5 * (d == 0)).mean()), float((d > 0).mean())


@pytest.mark.parametrize("seed", range(5))
def test_auroc_equals_mann_whitney_and_pessimistic_counts_ties_as_losses(seed: int) -> None:
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 6, size=60).astype(float)  # many ties between true and false edges
    y = rng.random(60) < 0.3
    plain, strict = _pairs(s, y)
    u = sps.mannwhitneyu(s[y], s[~y], alternative="two-sided").statistic / (y.sum() * (~y).sum())
    assert auroc(s, y) == pytest.approx(u, abs=1e-12)
    assert auroc(s, y) == pytest.approx(plain, abs=1e-12)
    assert pessimistic_auroc(s, y) == pytest.approx(strict, abs=1e-12)
    assert pessimistic_auroc(s, y) < auroc(s, y)  # ties exist, so the pessimistic area is smaller


def test_roc_points_group_ties_and_perfect_ranking() -> None:
    s = np.array([3.0, 2.0, 2.0, 1.0, 0.0, 0.0])
    y = np.array([True, True, False, False, True, False])
    fpr, tpr = roc_points(s, y)
    np.testing.assert_allclose(fpr, [0, 0, 1 / 3, 2 / 3, 1])
    np.testing.assert_allclose(tpr, [0, 1 / 3, 2 / 3, 2 / 3, 1])
    perfect = np.array([5.0, 4.0, 0.0, 0.0])
    lab = np.array([True, True, False, False])
    assert auroc(perfect, lab) == 1.0 and pessimistic_auroc(perfect, lab) == 1.0
    # every true edge tied with every false one: plain 0.5, pessimistic 0 (InterpBench's point)
    flat = np.zeros(4)
    assert auroc(flat, lab) == 0.5 and pessimistic_auroc(flat, lab) == 0.0
    with pytest.raises(ValueError, match="one true and one false"):
        auroc(perfect, np.ones(4, bool))


def test_a_wrong_truth_label_lowers_the_auroc_below_one() -> None:
    s = np.array([0.9, 0.8, 0.7, 0.0, 0.0, 0.0, 0.0])
    truth = np.array([True, True, True, False, False, False, False])
    assert auroc(s, truth) == 1.0
    wrong = truth.copy()
    wrong[2], wrong[5] = False, True  # one true edge swapped for a false one
    assert auroc(s, wrong) < 0.9 and pessimistic_auroc(s, wrong) < 0.9


def test_selection_metrics_and_topk() -> None:
    y = np.array([True, True, False, False, False])
    m = selection_metrics(np.array([True, False, True, False, False]), y)
    assert (m["n_selected"], m["n_false"], m["fdp"], m["precision"], m["recall"]) == (2, 1, 0.5, 0.5, 0.5)
    assert m["f1"] == pytest.approx(0.5)
    none = selection_metrics(np.zeros(5, bool), y)
    assert none["fdp"] == 0.0 and np.isnan(none["precision"]) and none["recall"] == 0.0 and none["f1"] == 0.0
    s = np.array([-3.0, 2.0, 1.0, 0.5, 0.0])
    t = topk_metrics(s, y, [1, 2, 3], ranking="absolute")
    np.testing.assert_allclose(t["precision"], [1, 1, 2 / 3])
    np.testing.assert_allclose(t["recall"], [0.5, 1, 1])
    signed = topk_metrics(s, y, [1], ranking="signed")
    assert signed["precision"][0] == 1.0 and signed["recall"][0] == 0.5  # the signed top-1 is edge 1


def test_over_datasets_t_interval_covers_its_mean_at_the_nominal_rate() -> None:
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(2000):
        r = over_datasets(rng.exponential(size=12))  # skewed per-dataset values, true mean 1
        covered += r["ci_low"] <= 1.0 <= r["ci_high"]
    # two-sided bound: a t interval on n=12 skewed values covers a little under 0.95, never 0.99 or 0.85
    assert 0.88 <= covered / 2000 <= 0.97
    r = over_datasets(np.array([1.0, np.nan, 3.0]))
    assert r["n_datasets"] == 2 and r["mean"] == 2.0 and r["spread_low"] < r["spread_high"]


def test_fdr_check_bounds_both_sides() -> None:
    assert fdr_check(np.zeros(50), 0.05)["verdict"] == "trivial"
    rng = np.random.default_rng(1)
    ok = fdr_check(np.where(rng.random(200) < 0.5, 0.0, rng.uniform(0, 0.1, 200)), 0.05)
    assert ok["verdict"] == "holds" and 0 < ok["fdr"] < 0.05
    bad = fdr_check(rng.uniform(0.1, 0.3, 200), 0.05)
    assert bad["verdict"] == "exceeded"
