"""The missed-edges stage bounds each approximate method from that method's own verified intervals.

A verified run with several approximate methods (an audit's ``methods``, or ``attribute --method``) writes one
missed_edges row per method: its top edges and random sample come from its scores, and the sampled edges are
classified by TOST-Holm on its PPI++ fit. So a user who wants the bound from atp-qkfix's verified intervals runs
atp-qkfix (docs/verified.md, "Missed edges"). Oracles: the bound against a brute-force search over scipy's
hypergeometric CDF, and the classification against per-edge TOST p-values from scipy's t distribution with Holm from
statsmodels; negative control: a predictor that carries nothing about the exact effects leaves the bound at "all
unverified" on the same prompts. tests/pipelines/test_verify_audit.py checks the same wiring through an audit with
eap and atp-qkfix.
"""

from __future__ import annotations

import numpy as np
import pytest

from circuitstat.pipelines import verify as V
from circuitstat.pipelines.spec import VerifyEdgesSpec, VerifySpec
from circuitstat.stats.verified import verified_means
from verified_oracles import brute_upper, tost_holm_above

P, E, TAU, LEVEL = 600, 40, 0.5, 0.95


def _population(seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Exact [P, E] (SD 1 per prompt; 4 edges at |μ| = 2, the rest 0) and two predictors: "good" (exact plus small
    noise) and "blind" (independent noise of the same size with the same means: its mean ranks like the truth,
    its per-prompt values say nothing of the exact ones)."""
    rng = np.random.default_rng(seed)
    mu = np.zeros(E)
    mu[[3, 11, 25, 33]] = [2.0, -2.0, 2.0, -2.0]
    X = mu + rng.standard_normal((P, E))
    return X, {"good": X + 0.05 * rng.standard_normal((P, E)), "blind": mu + rng.standard_normal((P, E))}


@pytest.fixture(scope="module")
def tables():
    X, approx = _population()
    spec = VerifySpec(n=16, seed=5, edges=VerifyEdgesSpec(top=4, random=15), tau=TAU)
    plan = V.verify_plan(approx, spec, seed=5)
    cols = plan.edges()
    out = V.verified_tables(approx, X[np.ix_(plan.rows, cols)], cols, plan, [f"e{i}" for i in range(E)],
                            confidence_level=LEVEL, tau=TAU)
    return X, approx, plan, out["missed_edges"].to_pandas()


@pytest.mark.parametrize("method", ["good", "blind"])
def test_each_row_is_its_own_methods_bound(tables, method):
    X, approx, plan, rows = tables
    row = rows[rows["method"] == method].iloc[0]
    S, sample = approx[method], plan.random[method]
    # the method's own top edges: its largest |mean| (the 4 planted edges for both predictors here)
    assert set(plan.top[method]) == set(np.argsort(-np.abs(S.mean(0)))[:4]) == {3, 11, 25, 33}
    fit = verified_means(S[:, sample], X[np.ix_(plan.rows, sample)], plan.rows)
    alpha = (1 - LEVEL) * (1 - V.MISSED_SPLIT)
    above = tost_holm_above(fit, TAU, alpha)
    x, R, r = int(above.sum()), E - 4, sample.size
    assert row["sampled_above"] == x and row["n_remaining"] == R and row["n_sampled"] == r
    assert row["remaining_above_high"] == brute_upper(x, R, r, 1 - (1 - LEVEL) * V.MISSED_SPLIT)
    assert row["missed_high"] == row["remaining_above_high"] - x and row["level"] == pytest.approx(LEVEL)


def test_a_predictor_that_tracks_exact_makes_the_bound_informative_and_a_blind_one_does_not(tables):
    """Every sampled edge is null (|μ| = 0 < τ): the good predictor's narrow intervals classify them below τ, so the
    bound falls below the unverified count; the blind predictor's (exact on 16 prompts, SD 1) cannot, so its bound is
    every unverified edge. The same stage, the same prompts: only the method differs."""
    _, _, _, rows = tables
    good, blind = (rows[rows["method"] == m].iloc[0] for m in ("good", "blind"))
    assert good["sampled_above"] == 0 and good["missed_high"] < good["n_unverified"]
    assert blind["sampled_above"] == blind["n_sampled"] and blind["missed_high"] == blind["n_unverified"]
