"""The reported circuit's conditional faithfulness interval (circuitstat.stats.faithfulness_refit.conditional_faithfulness):
one fit on half the prompts, Fieller on the other half (issue 47, item 8). Arrays only: the audit's columns are tested in
tests/pipelines/test_audit_edge_pruning.py."""

from __future__ import annotations

import numpy as np
import pytest

from circuitstat.core.errors import InputError
from circuitstat.core.topk import topk_mask
from circuitstat.stats.fieller import fieller_faithfulness
from circuitstat.stats.faithfulness_refit import ESTIMAND_CONDITIONAL, conditional_faithfulness

# the population: per-example edge scores s_e = mu_e + 0.6 t_5 noise, a background effect b = 1 + 0.5 z that no edge
# carries, m(∅) = 0, m(C) = Σ_{e∈C} s_e, m(M) = Σ_e s_e + b; so the population faithfulness of a circuit C is exactly
# Σ_{e∈C} mu_e / (Σ_e mu_e + 1), here between 0.2 and 0.4: neither 0 nor 1
E, K, N = 24, 8, 40
MU = np.linspace(0.05, 0.3, E)


def _dataset(r: int, n: int = N):
    rng = np.random.default_rng(r)
    return MU + rng.standard_t(5, size=(n, E)) * 0.6, 1.0 + rng.normal(size=n) * 0.5


def _f_pop(mask: np.ndarray) -> float:
    return float(MU[mask].sum() / (MU.sum() + 1.0))


def _evaluate(s, b):
    def evaluate(masks, rows):
        return s[rows] @ masks.T.astype(np.float64), s[rows].sum(1) + b[rows], np.zeros(len(rows))
    return evaluate


def _refit(s, calls=None):
    """A mask fit's stand-in: the training rows' mean scores plus the optimisation's own seed-driven jitter."""
    def refit(rows, seed):
        if calls is not None:
            calls.append(np.asarray(rows))
        return s[rows].mean(0) + np.random.default_rng(seed).normal(size=E) * 0.01
    return refit


def test_one_fit_on_one_half_and_fieller_on_the_other_half():
    s, b = _dataset(0)
    calls: list = []
    r = conditional_faithfulness(_refit(s, calls), _evaluate(s, b), [3, K], n_obs=N, seed=11)
    assert len(calls) == 1 and np.array_equal(calls[0], r.fit_rows)  # one refit, on the fit half only
    assert np.intersect1d(r.fit_rows, r.eval_rows).size == 0
    assert np.array_equal(np.sort(np.concatenate([r.fit_rows, r.eval_rows])), np.arange(N))
    assert abs(r.fit_rows.size - r.eval_rows.size) <= 1
    # the oracle: the circuits are the top-k of that fit, and the interval is Fieller's on the held-out rows only
    scores = _refit(s)(r.fit_rows, np.random.SeedSequence(11).spawn(3)[1])
    for i, k in enumerate([3, K]):
        assert r.masks[i].sum() == k and set(np.flatnonzero(r.masks[i])) == set(np.argsort(-scores)[:k])
    e = r.eval_rows
    ref = fieller_faithfulness(s[e] @ r.masks.T.astype(float), s[e].sum(1) + b[e], np.zeros(e.size))
    np.testing.assert_allclose(r.interval.low, ref.low, rtol=1e-12)
    np.testing.assert_allclose(r.interval.high, ref.high, rtol=1e-12)
    np.testing.assert_allclose(r.estimate, (s[e] @ r.masks.T).mean(0) / (s[e].sum(1) + b[e]).mean(), rtol=1e-12)
    assert "fitted on 20 prompts" in r.note(0) and "other 20" in r.note(0) and "Fieller" in ESTIMAND_CONDITIONAL
    # the same seed gives the same split and circuit; another seed another split
    again = conditional_faithfulness(_refit(s), _evaluate(s, b), [3, K], n_obs=N, seed=11)
    assert np.array_equal(again.fit_rows, r.fit_rows) and np.array_equal(again.masks, r.masks)
    other = conditional_faithfulness(_refit(s), _evaluate(s, b), [3, K], n_obs=N, seed=12)
    assert not np.array_equal(other.fit_rows, r.fit_rows)


def test_groups_stay_whole_and_the_interval_is_cluster_robust():
    s, b = _dataset(1)
    groups = np.repeat(np.arange(8), 5)
    r = conditional_faithfulness(_refit(s), _evaluate(s, b), [K], n_obs=N, seed=3, groups=groups)
    assert not set(groups[r.fit_rows]) & set(groups[r.eval_rows])
    e = r.eval_rows
    ref = fieller_faithfulness(s[e] @ r.masks.T.astype(float), s[e].sum(1) + b[e], np.zeros(e.size), groups=groups[e])
    np.testing.assert_allclose([r.interval.low, r.interval.high], [ref.low, ref.high], rtol=1e-12)
    assert r.interval.df == len(np.unique(groups[e])) - 1


def test_conditional_interval_covers_the_reported_circuit_and_the_in_sample_one_does_not():
    # dataset as unit: R fresh datasets of N prompts; the truth is the half-fit circuit's exact population faithfulness
    R, level = 1500, 0.95
    cov, bounded, in_sample, truths = 0, 0, 0, []
    for r in range(R):
        s, b = _dataset(r)
        c = conditional_faithfulness(_refit(s), _evaluate(s, b), [K], n_obs=N, seed=r, confidence_level=level)
        t = _f_pop(c.masks[0])
        truths.append(t)
        cov += bool(c.interval.low[0] <= t <= c.interval.high[0])
        bounded += c.interval.shape[0] == "bounded"
        # negative control: the circuit fitted on all N prompts, its fixed-circuit interval on the same N prompts
        m = topk_mask(s.mean(0), K, ranking="signed", seed=r)
        fi = fieller_faithfulness(s @ m.astype(float), s.sum(1) + b, np.zeros(N), confidence_level=level)
        in_sample += bool(fi.low[0] <= _f_pop(m) <= fi.high[0])
    se = np.sqrt(level * (1 - level) / R)  # Monte Carlo SE of a coverage at the nominal level
    assert 0.1 < min(truths) and max(truths) < 0.6  # faithfulness is neither 0 nor 1 on this population
    assert bounded / R > 0.99  # the coverage is not bought with unbounded sets
    # bounded from both sides: 3 MC SE, plus 0.01 for Fieller's t approximation at 20 heavy-tailed prompts
    assert level - 3 * se - 0.01 <= cov / R <= level + 3 * se + 0.01, cov / R
    assert in_sample / R < 0.5, in_sample / R  # the winner's curse: evaluating where it was fitted undercovers


def test_too_few_prompts_or_a_bad_refit_is_an_input_error():
    s, b = _dataset(2)
    with pytest.raises(InputError, match="two halves"):
        conditional_faithfulness(_refit(s), _evaluate(s, b), [K], n_obs=5, seed=0)
    with pytest.raises(InputError, match="one finite score per edge"):
        conditional_faithfulness(lambda rows, seed: np.full(E, np.nan), _evaluate(s, b), [K], n_obs=N, seed=0)
    with pytest.raises(InputError, match="every k"):
        conditional_faithfulness(_refit(s), _evaluate(s, b), [E], n_obs=N, seed=0)
