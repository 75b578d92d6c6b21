"""The ground-truth study's fixed-circuit faithfulness rows: Fieller's set of the true circuit (the audit's
interval), its share bounded and coverage among bounded sets, and the former BCa interval beside it under its own
name; checked against the two intervals computed directly, on an additive population."""

from __future__ import annotations

import numpy as np

from circuitstat.stats.calibration_kinds import PopulationEvaluations
from circuitstat.stats.faithfulness import fixed_circuit_interval
from circuitstat.stats.fieller import fieller_faithfulness
from circuitstat.stats.groundtruth_scoring import faithfulness_dataset
from circuitstat.stats.resampling import ResamplingPlan, spawn_seeds


def _population(mu: float, p: int = 400, e: int = 6, seed: int = 0):
    """Scores [P, E]: edges 0-2 the true circuit (mean mu each), the rest background with population mean exactly 0,
    and an additive metric m(C) = m(∅) + Σ_{e∈C} s_e, so the true circuit's faithfulness is 1 on the population."""
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((p, e))
    s[:, 3:] -= s[:, 3:].mean(0)
    s[:, :3] += mu - s[:, :3].mean(0)
    base = rng.standard_normal(p)

    def evaluate(masks, rows):
        return base[rows, None] + s[rows] @ masks.T.astype(float), base[rows] + s[rows].sum(1), base[rows]

    truth = np.arange(e) < 3
    return s, truth, PopulationEvaluations(evaluate, p, e)


def _rows(out):
    return {st: v for fam, st, _, v in out if fam == "faithfulness"}


def test_fixed_rows_are_fiellers_set_with_the_former_bca_beside_it():
    s, truth, ev = _population(mu=1.0)
    rows = np.arange(40)
    got = _rows(faithfulness_dataset(s[rows], rows, truth, ev, true_value=1.0, n_resamples=400, seed=5))
    mc, mM, m0 = ev.get(truth[None], rows)
    fie = fieller_faithfulness(mc, mM, m0)
    assert fie.shape[0] == "bounded" and got["fixed_bounded"] == 1.0
    assert got["fixed_covers_truth"] == got["fixed_covers_truth_bounded"] == float(fie.covers(1.0)[0])
    assert np.isclose(got["fixed_width_bounded"], fie.high[0] - fie.low[0], rtol=1e-12)
    assert np.isclose(got["fixed_estimate"], fie.estimate[0], rtol=1e-12)
    plan = ResamplingPlan.bootstrap(40, 400, spawn_seeds(5, 2)[0])  # the plan faithfulness_dataset draws
    bca = fixed_circuit_interval(mc, mM, m0, plan, method="bca").confidence_interval
    assert np.isclose(got["fixed_bca_width"], bca.high[0] - bca.low[0], rtol=1e-12)
    assert got["fixed_bca_covers_truth"] == float(bca.low[0] <= 1.0 <= bca.high[0])
    assert not np.isclose(got["fixed_bca_width"], got["fixed_width_bounded"])  # two intervals, not one twice


def test_an_unbounded_set_covers_trivially_and_is_counted_apart():
    """Where the full model's effect over the empty circuit is indistinguishable from 0 the set is unbounded: it
    covers, and the bounded-only rows are NaN (left out of their means), while BCa still prints a finite interval."""
    s, truth, ev = _population(mu=0.0)
    rows = np.arange(40)
    got = _rows(faithfulness_dataset(s[rows], rows, truth, ev, true_value=1.0, n_resamples=400, seed=5))
    mc, mM, m0 = ev.get(truth[None], rows)
    fie = fieller_faithfulness(mc, mM, m0)
    assert fie.shape[0] != "bounded" and got["fixed_bounded"] == 0.0
    assert got["fixed_covers_truth"] == float(fie.covers(1.0)[0])
    assert np.isnan(got["fixed_covers_truth_bounded"]) and np.isnan(got["fixed_width_bounded"])
    assert np.isfinite(got["fixed_bca_width"])
