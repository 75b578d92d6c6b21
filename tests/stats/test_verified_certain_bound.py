"""The certain bound on a verified interval's width over exact on all N prompts (``width_vs_exact_on_all_max``).

The flag's 20× cap reads an *estimated* width of exact on all N, so it can pass an interval wider than 20× the
dataset's own (docs/verified.md: 5 of 286,500 cells at N = 512, more at N = 2048). The certain bound needs no
estimate: the labelled prompts are among the N, so (N − 1) SD_N² ≥ (n − 1) SD_n². The oracle here is brute force:
exact patching on all N prompts of every simulated dataset, the t interval the docs compare with.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from circuitstat.stats.verified import verified_means
from circuitstat.stats.verified.active import active_probabilities, active_sample
from circuitstat.stats.verified.active_result import active_verified_means
from circuitstat.stats.verified.multi import verified_means_multi

N, n = 256, 16


def _population(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Heavy-tailed exact scores (t with 2.5 df plus rare 40-SD spikes) and a noisy approximation of them."""
    rng = np.random.default_rng(seed)
    X = rng.standard_t(2.5, size=(N, 6)) + 40.0 * (rng.random((N, 6)) < 0.01)
    return X, 0.7 * X + rng.normal(size=X.shape)


def _exact_on_all_width(X: np.ndarray) -> np.ndarray:
    """The brute-force reference: the t interval width of exact on all N prompts."""
    return 2 * special.stdtrit(X.shape[0] - 1, 0.975) * X.std(0, ddof=1) / np.sqrt(X.shape[0])


def test_the_bound_holds_on_every_dataset_and_is_attained() -> None:
    """Over 200 heavy-tailed datasets no cell's realised ratio exceeds the certain bound, the estimated ratio does
    exceed the realised one somewhere (so the bound is not the estimate), and when every unlabelled prompt's exact
    effect equals the labelled mean the bound is the realised ratio exactly (it cannot be made larger)."""
    under_estimated = 0
    for seed in range(200):
        X, A = _population(seed)
        rows = np.random.default_rng(10_000 + seed).choice(N, n, replace=False)
        t = verified_means(A, X[rows], rows).to_table()
        width = t["ci_high"].to_numpy() - t["ci_low"].to_numpy()
        realised = width / _exact_on_all_width(X)
        assert (realised <= t["width_vs_exact_on_all_max"].to_numpy() * (1 + 1e-12)).all(), seed
        under_estimated += int((t["width_vs_exact_on_all"].to_numpy() < realised).sum())
    assert under_estimated > 0  # the estimate is below the truth in some cells: only the bound is certain
    X, A = _population(1)
    rows = np.arange(n)
    X[n:] = X[:n].mean(0)  # the extreme case the bound is attained at
    t = verified_means(A, X[rows], rows).to_table()
    realised = (t["ci_high"].to_numpy() - t["ci_low"].to_numpy()) / _exact_on_all_width(X)
    np.testing.assert_allclose(t["width_vs_exact_on_all_max"].to_numpy(), realised, rtol=1e-10)


def test_the_bound_needs_the_labelled_prompts_among_the_n() -> None:
    """Negative control: labelled exact scores from prompts outside the N (another draw, twice as spread: a wrong
    run's) give a bound that the N prompts' own exact width breaks; the certainty rests on the subset."""
    violated = 0
    for seed in range(50):
        X, A = _population(seed)
        outside, _ = _population(5_000 + seed)
        rows = np.arange(n)
        t = verified_means(A, 2.0 * outside[rows], rows).to_table()
        realised = (t["ci_high"].to_numpy() - t["ci_low"].to_numpy()) / _exact_on_all_width(X)
        violated += int((realised > t["width_vs_exact_on_all_max"].to_numpy() * (1 + 1e-12)).sum())
    assert violated > 0


def test_the_active_and_multi_designs_write_a_bound_that_holds() -> None:
    """The active design's bound reads each edge's sampled cells (distinct prompts among the N), the multi design's
    its labelled prompts; neither is exceeded by the brute-force ratio on 100 datasets."""
    for seed in range(100):
        X, A = _population(seed)
        probs = active_probabilities(A, 24.0)
        S = active_sample(probs, seed)
        t = active_verified_means(A, np.where(S, X, np.nan), S, probs, budget=24.0).to_table()
        realised = (t["ci_high"].to_numpy() - t["ci_low"].to_numpy()) / _exact_on_all_width(X)
        assert (realised <= t["width_vs_exact_on_all_max"].to_numpy() * (1 + 1e-12)).all(), seed
        rows = np.random.default_rng(seed).choice(N, n, replace=False)
        other = A + np.random.default_rng(seed + 1).normal(size=A.shape)
        t = verified_means_multi({"eap": A, "other": other}, X[rows], rows).to_table()
        realised = (t["ci_high"].to_numpy() - t["ci_low"].to_numpy()) / _exact_on_all_width(X)
        assert (realised <= t["width_vs_exact_on_all_max"].to_numpy() * (1 + 1e-12)).all(), seed
