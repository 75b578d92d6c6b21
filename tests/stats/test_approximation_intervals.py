"""The intervals of EAP-against-exact agreement (circuitstat.stats.approximation.agreement_intervals): replicates against a
brute-force loop over the resampled prompts, the R² interval against scipy.stats.bootstrap on the same draws, and
the Spearman interval's coverage of its named estimand (the expected Spearman at N) bounded from both sides."""

import numpy as np
import pytest
from scipy import stats as sps

from circuitstat.stats import ResamplingPlan
from circuitstat.stats.approximation import SPEARMAN_ESTIMAND, agreement_intervals, agreement_replicates


def _scores(rng, n, e, corr=0.6):
    """Heavy-tailed exact scores and an approximation that tracks them with noise and per-edge bias."""
    mu = rng.normal(0, 1, e) * np.linspace(0.05, 1, e)
    ex = mu + rng.standard_t(3, (n, e)) * rng.uniform(0.5, 3, e)
    return ex, corr * ex + (1 - corr) * mu + rng.standard_t(3, (n, e)) + rng.normal(0, 0.3, e)


def test_replicates_are_the_statistics_of_the_resampled_prompts():
    rng = np.random.default_rng(0)
    ex, ap = _scores(rng, 30, 12)
    ap[:, 3] = ap[:, 4]  # ties in the means: average ranks, as scipy
    plan = ResamplingPlan.bootstrap(30, 40, 7)
    reps = agreement_replicates(ex, ap, plan, chunk=7)  # chunks that do not divide B
    for b in range(40):
        i = plan.indices(b)
        assert reps["spearman"][b] == pytest.approx(sps.spearmanr(ex[i].mean(0), ap[i].mean(0)).statistic, abs=1e-12)
        assert reps["r2"][b] == pytest.approx(np.corrcoef(ex[i].ravel(), ap[i].ravel())[0, 1] ** 2, abs=1e-12)


def test_r2_interval_is_scipys_percentile_bootstrap_on_the_same_draws():
    rng = np.random.default_rng(1)
    ex, ap = _scores(rng, 25, 9)
    plan = ResamplingPlan.bootstrap(25, 300, 11)

    def r2(idx):
        idx = np.asarray(idx, dtype=int)
        return np.corrcoef(ex[idx].ravel(), ap[idx].ravel())[0, 1] ** 2

    ref = sps.bootstrap((np.arange(25),), r2, vectorized=False, n_resamples=300, method="percentile",
                        rng=np.random.default_rng(11)).confidence_interval
    ci = agreement_intervals(ex, ap, plan)
    assert (ci["r2_ci_low"], ci["r2_ci_high"]) == pytest.approx((ref.low, ref.high), rel=1e-9)
    assert ci["spearman_estimand"] == SPEARMAN_ESTIMAND and ci["n_resamples"] == 300
    with pytest.raises(ValueError, match="resamples 24 prompts"):
        agreement_intervals(ex, ap, ResamplingPlan.bootstrap(24, 10, 0))


@pytest.mark.parametrize("e,n,corr", [(81, 48, 0.0), (30, 64, 0.6)])
def test_spearman_interval_covers_the_expected_spearman_at_n(e, n, corr):
    """Coverage over 150 datasets of N prompts from a finite heavy-tailed population, bounded from both sides: an
    interval about the population's Spearman (attenuated here: 0.0-0.5 coverage) or a plain percentile one fails."""
    rng = np.random.default_rng(e + n)
    ex, ap = _scores(rng, 20000, e, corr)
    target = np.mean([sps.spearmanr(ex[i].mean(0), ap[i].mean(0)).statistic
                      for i in (rng.choice(20000, n) for _ in range(1000))])
    hits, width = 0, []
    for r in range(150):
        i = rng.choice(20000, n)
        ci = agreement_intervals(ex[i], ap[i], ResamplingPlan.bootstrap(n, 300, r))
        hits += ci["spearman_ci_low"] <= target <= ci["spearman_ci_high"]
        width.append(ci["spearman_ci_high"] - ci["spearman_ci_low"])
    assert 0.88 <= hits / 150 <= 0.99, hits / 150
    assert np.median(width) < 0.5  # not uselessly wide


def test_a_claim_bounds_the_interval_the_verdict_reads(tmp_path):
    """An approximation claim can bound spearman_ci_low, the column the verdict reads: a point estimate above the bar
    with an interval reaching below it holds as a point claim and fails as an interval claim."""
    from circuitstat.pipelines.claims import evaluate_claims, parse_claims
    from circuitstat.core.rundir import RunDir
    from circuitstat.core.schema import fill
    from circuitstat.reports.verdicts import verdict

    cols = {"method": ["eap"], "spearman": [0.6], "spearman_ci_low": [0.42], "spearman_ci_high": [0.74], "k": [10],
            "r2": [0.21], "r2_ci_low": [0.12], "r2_ci_high": [0.33], "spearman_estimand": [SPEARMAN_ESTIMAND]}
    with RunDir(tmp_path / "run", spec={}, seed=0) as run:
        run.write_table("approximation_summary", fill("approximation_summary", cols, 1))
    claims = parse_claims({"claims": [
        {"kind": "approximation", "method": "eap", "statistic": "spearman", "min": 0.5},
        {"kind": "approximation", "method": "eap", "statistic": "spearman_ci_low", "min": 0.5}]})
    assert [r.status for r in evaluate_claims(claims, tmp_path / "run")] == ["pass", "fail"]
    line = next(ln for ln in verdict(tmp_path / "run").lines if ln.label == "approximation")
    assert line.verdict == "eap: inconclusive: a rough guide or worse" and [c.low for c in line.cis] == [
        "spearman_ci_low", "r2_ci_low"]
    assert "0.600 [0.420, 0.740]" in line.text() and line.cis[0].estimand == SPEARMAN_ESTIMAND


def test_spearman_interval_stays_within_the_range_of_a_correlation():
    """Near-perfect agreement on few prompts: re-centring moves the percentile interval up by the bootstrap's
    attenuation, which carried its upper end past 1 (observed in an audit: [0.776, 1.03]); a correlation's
    interval ends at 1, and its lower end is the re-centred one."""
    rng = np.random.default_rng(3)
    ex, _ = _scores(rng, 24, 40)
    ap = ex + rng.normal(0, 0.05, ex.shape)
    plan = ResamplingPlan.bootstrap(24, 200, 5)
    reps = agreement_replicates(ex, ap, plan)
    observed = sps.spearmanr(ex.mean(0), ap.mean(0)).statistic
    shift = observed - reps["spearman"].mean()
    lo, hi = np.quantile(reps["spearman"], [0.025, 0.975]) + shift
    assert hi > 1  # the case: the shifted upper end leaves the range
    ci = agreement_intervals(ex, ap, plan)
    assert ci["spearman_ci_high"] == 1.0
    assert ci["spearman_ci_low"] == pytest.approx(lo, abs=1e-12)
