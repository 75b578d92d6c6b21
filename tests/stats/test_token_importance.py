"""Token-importance faithfulness: mean drops, paired differences, Holm verdicts, and the coverage of
the paired-difference interval in a simulation."""

from __future__ import annotations

import numpy as np
import pytest

from statsmodels.stats.multitest import multipletests

from circuitstat.core.errors import InputError
from circuitstat.stats.resampling import ResamplingPlan
from circuitstat.stats.token_importance import token_importance_faithfulness

MEASURES = ("contribution", "attention", "random")


def _drops(n=60, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.lognormal(0, 0.8, (n, 1, 3)) * np.array([1, 2, 3])[None, None, :]
    noise = rng.normal(0, 0.3, (n, 3, 3))
    effect = np.array([1.0, 0.7, 0.0])[None, :, None]  # contribution > attention > random
    return base * effect + noise


def test_estimates_are_means_and_differences_are_paired():
    d = _drops()
    r = token_importance_faithfulness(d, MEASURES, (1, 2, 3), n_resamples=999, seed=1)
    for mi, m in enumerate(MEASURES):
        for ki, k in enumerate((1, 2, 3)):
            est, lo, hi = r.mean_drop(m, k)
            assert est == pytest.approx(d[:, mi, ki].mean())
            assert lo < est < hi
    row = r.difference("contribution", "attention", 2)
    paired = d[:, 0, 1] - d[:, 1, 1]
    assert row["difference"] == pytest.approx(paired.mean())
    # the paired interval is narrower than what unpaired standard errors would give
    unpaired_se = np.sqrt(d[:, 0, 1].var(ddof=1) / 60 + d[:, 1, 1].var(ddof=1) / 60)
    assert row["standard_error"] < unpaired_se
    tables = r.tables()
    assert tables["token_importance"].num_rows == 9 and tables["token_importance_diffs"].num_rows == 9


def test_holm_adjustment_and_verdicts():
    d = _drops(n=80, seed=3)
    r = token_importance_faithfulness(d, MEASURES, (1, 2, 3), n_resamples=999, seed=2)
    diffs = r.to_pandas("token_importance_diffs")
    expect = multipletests(diffs["pvalue"].to_numpy(), method="holm")[1]
    np.testing.assert_allclose(diffs["pvalue_holm"].to_numpy(), expect, rtol=1e-12)
    # the p-value inverts the interval (before adjustment)
    excludes = (diffs["ci_low"] > 0) | (diffs["ci_high"] < 0)
    assert ((diffs["pvalue"] < 0.05) == excludes).all()
    strong = diffs[(diffs.measure_a == "contribution") & (diffs.measure_b == "random")]
    assert (strong.verdict == "contribution > random").all()
    for _, row in diffs.iterrows():
        if row.pvalue_holm > 0.05:
            assert row.verdict == "inconclusive"
    assert "Holm" in diffs["multiplicity"].iloc[0]


def test_same_plan_for_every_table_and_input_errors():
    d = _drops(n=20)
    plan = ResamplingPlan.bootstrap(20, 999, 5)
    r = token_importance_faithfulness(d, MEASURES, (1, 2, 3), plan=plan, pairs=[("attention", "random")])
    assert r.params["plan"] == plan.describe()
    assert r.to_table("token_importance_diffs").num_rows == 3
    with pytest.raises(InputError, match="drops must be"):
        token_importance_faithfulness(d[:, :2], MEASURES, (1, 2, 3), seed=0)
    with pytest.raises(InputError, match="not two different measures"):
        token_importance_faithfulness(d, MEASURES, (1, 2, 3), pairs=[("attention", "attention")], seed=0)
    bad = d.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(InputError, match="NaN"):
        token_importance_faithfulness(bad, MEASURES, (1, 2, 3), seed=0)


@pytest.mark.slow
def test_paired_difference_interval_covers_the_population_difference():
    """400 datasets of N = 48 prompts from a finite skewed population with correlated measures."""
    rng = np.random.default_rng(20261201)
    n_pop, n, reps = 20000, 48, 400
    hardness = rng.lognormal(0, 0.75, n_pop)  # prompts differ in how much any ablation hurts
    a = hardness * 1.0 + rng.gamma(2.0, 0.25, n_pop)
    b = hardness * 0.8 + rng.gamma(2.0, 0.25, n_pop) + rng.normal(0, 0.2, n_pop)
    pop = np.stack([a, b], axis=1)[:, :, None]  # [pop, 2 measures, 1 k]
    truth = (a - b).mean()
    hits = 0
    for rep in range(reps):
        sample = pop[rng.integers(0, n_pop, n)]
        r = token_importance_faithfulness(sample, ("a", "b"), (1,), n_resamples=999, seed=rep)
        row = r.difference("a", "b", 1)
        hits += row["ci_low"] <= truth <= row["ci_high"]
    coverage = hits / reps
    assert 0.90 <= coverage <= 0.99, coverage


def test_token_stability_identical_random_and_brute_force():
    from circuitstat.stats.stability import chance_jaccard
    from circuitstat.stats.token_importance import token_stability

    rng = np.random.default_rng(0)
    N, P, S = 30, 12, 4
    cand = np.ones((N, P), bool)
    cand[:, -2:] = False  # 10 candidates per prompt
    base = np.argsort(np.where(cand, rng.random((N, P)), 2.0), axis=1)
    rand = np.stack([np.argsort(np.where(cand, rng.random((N, P)), 2.0), axis=1) for _ in range(S)])
    r = token_stability({"same": np.stack([base] * S), "random": rand}, cand, (1, 3))
    r = r.to_pandas().set_index(["measure", "k"])
    assert r.loc[("same", 3), "jaccard"] == 1.0 and r.loc[("same", 3), "ci_low"] == 1.0
    assert r.loc[("random", 3), "chance"] == pytest.approx(chance_jaccard(10, 3))
    assert r.loc[("random", 3), "excess_ci_low"] < 0 < r.loc[("random", 3), "excess_ci_high"]
    # one seed pair by brute force: sets of the first k positions
    pairs = [len(set(rand[0, n, :3]) & set(rand[1, n, :3])) / len(set(rand[0, n, :3]) | set(rand[1, n, :3]))
             for n in range(N)]
    from circuitstat.stats.token_importance import _topk_jaccard

    np.testing.assert_allclose(_topk_jaccard(rand[0], rand[1], np.full(N, 3), P), pairs)
    with pytest.raises(InputError, match="at least 2 seeds"):
        token_stability({"x": base[None]}, cand, (1,))
