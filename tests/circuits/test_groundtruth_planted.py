"""The planted induction model: its truth labels hold, its nulls have mean zero but per-example effects,
and its knobs do what they say."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from circuitstat.circuits.attribution import attribute
from circuitstat.core.errors import InputError
from circuitstat.circuits.faithfulness import faithfulness
from circuitstat.circuits.groundtruth import load_groundtruth, parse_planted
from circuitstat.circuits.groundtruth.planted import TRUE_EDGES, PlantedSpec, planted_induction
from circuitstat.stats import ResamplingPlan
from circuitstat.stats.faithfulness import fixed_circuit_interval
from circuitstat.stats.groundtruth import auroc


@pytest.fixture(scope="module")
def planted():
    gt = planted_induction(PlantedSpec())
    task = gt.task(600, 5)
    S = attribute(gt.model, task, "exact", progress=False, batch_size=64).scores.astype(np.float64)
    return gt, task, S


def test_true_edges_have_large_effects_and_nulls_mean_zero(planted) -> None:
    gt, _, S = planted
    n = S.shape[0]
    mean, se = S.mean(0), S.std(0, ddof=1) / np.sqrt(n)
    assert sorted(gt.truth_names()) == sorted(TRUE_EDGES)
    assert (np.abs(mean[gt.truth]) > 0.5).all() and (np.abs(mean[gt.truth]) / se[gt.truth] > 10).all()
    nulls = gt.per_example_nulls
    assert nulls.sum() > 20
    assert (S[:, nulls].std(0) > 0.1).all()  # per-example effects far from zero ...
    z = mean[nulls] / se[nulls]
    assert np.abs(z).max() < 4.0  # ... with means indistinguishable from 0 (4 SE over ~50 edges: Bonferroni)
    exact_zero = gt.null_edges & ~nulls
    assert np.abs(S[:, exact_zero]).max() < 1e-4  # edges between signal and background carry nothing read
    assert auroc(np.abs(mean), gt.truth) == 1.0


def test_truth_faithful_complement_not_and_additive() -> None:
    # a quiet background: with background=1 the whole background's effect has SD 3.5 against a signal gap
    # of 1, and f's ratio of means has a bootstrap SE of 0.25 at N = 600 (the study measures that regime)
    gt = planted_induction(PlantedSpec(background=0.25))
    task = gt.task(400, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        f = faithfulness(gt.model, task, np.stack([gt.truth, ~gt.truth]), progress=False, batch_size=64)
    # signal and background add up in the logits: f(C) + f(complement) = 1 per example, exactly
    np.testing.assert_allclose(f.m_circuit.sum(1) - f.m_clean - f.m_empty, 0, atol=1e-4)
    fixed = fixed_circuit_interval(f.m_circuit, f.m_clean, f.m_empty, ResamplingPlan.bootstrap(task.n, 400, 0))
    est, se = fixed.estimate, fixed.standard_error
    # the known values f(C) = 1 and f(complement) = 0 (E[background effect] = 0), within 4 bootstrap SEs
    assert abs(est[0] - 1.0) < 4 * se[0] and abs(est[1]) < 4 * se[1]
    assert 0.005 < se[0] < 0.1  # an informative check, neither degenerate nor vacuous


def test_background_knob_scales_the_null_effects_exactly() -> None:
    task = None
    sd = {}
    for bg in (0.0, 1.0, 2.0):
        gt = planted_induction(PlantedSpec(background=bg))
        task = task or gt.task(64, 2)
        S = attribute(gt.model, task, "exact", progress=False, batch_size=64).scores.astype(np.float64)
        sd[bg] = S[:, gt.per_example_nulls].std(0)
        if bg == 0.0:
            truth_scores = S[:, gt.truth]
        else:
            np.testing.assert_allclose(S[:, gt.truth], truth_scores, atol=1e-4)  # the signal is untouched
    assert sd[0.0].max() < 1e-5  # without background read-out the nulls are exact zeros
    np.testing.assert_allclose(sd[2.0], 2 * sd[1.0], rtol=1e-3, atol=1e-6)  # linear in the knob


def test_planted_sources_parse_and_refuse_bad_options() -> None:
    gt = load_groundtruth("planted:induction?background=2&seed=3")
    assert gt.meta["spec"]["background"] == 2.0 and gt.meta["spec"]["seed"] == 3
    with pytest.raises(InputError, match="unknown option"):
        parse_planted("planted:induction?colour=red")
    with pytest.raises(InputError, match="unknown planted circuit"):
        parse_planted("planted:ioi")
    with pytest.raises(InputError, match="n_signal >= 2 \\* seq_len"):
        parse_planted("planted:induction?seq_len=8")
