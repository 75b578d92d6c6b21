"""A one-sided bound on the missed effect mass: Σ |μ_e| over the edges a verified run did not verify.

The R edges outside the top m are ranked by the approximation's |mean| and cut into ``n_strata`` blocks of
(nearly) equal size. The random sample of r edges is a simple random sample of the R (the hypergeometric count
bound of circuitstat.stats.verified.missed needs that); conditional on how many sampled edges fall in each
block (r_h), it is a stratified simple random sample with those sizes (post-stratification; Holt & Smith 1979,
"Post stratification", JRSS A 142(1)), so the Horvitz–Thompson weights R_h / r_h and the stratified variance
estimator hold conditionally and hence unconditionally. Blocks where fewer than 2 edges were sampled are merged
into a neighbour before anything is computed (a rule on the r_h only, so the conditioning stays valid).

Per sampled edge the value is |θ̂_e|, the absolute cross-fitted PPI++ estimate (unbiased for μ_e:
circuitstat.stats.verified.crossfit), with its standard error se_e; with known effects, |μ_e| and se 0. By Jensen
E|θ̂_e| ≥ |μ_e|, so the prediction of the unverified edges' mass, M̂ = Σ_h (R_h − r_h) ȳ_h (ȳ_h: the block's mean
|θ̂|), has expectation at least the mass M = Σ_unverified |μ_e| (over the edge sample and the prompts). Its SD is at
most the square root of the edge-sampling part, v = Σ_h R_h (R_h − r_h) s_h² / r_h (Cochran 1977, *Sampling
Techniques*, 3rd ed., eq. 5.6, the variance of the stratified estimate of a total with the finite population
correction; the same for the prediction of the unsampled part), plus the square of the measurement part, at most
Σ_s ((R_h − r_h) / r_h) se_e whatever the correlation of the edges' errors (Minkowski: the SD of a sum is at most
the sum of the SDs; |·| is 1-Lipschitz, so SD|θ̂_e| ≤ se_e). The bound is M̂ + k √(v + (Σ_s ((R_h − r_h)/r_h) se_e)²).

k is Cantelli's one-sided Chebyshev factor sqrt((1 − α) / α) by default (``method="cantelli"``: P(M̂ − E M̂ ≤
−k SD) ≤ 1 / (1 + k²) for any distribution of M̂; Cantelli 1928), or the Student t quantile at Satterthwaite's
degrees of freedom ν = (Σ g_h s_h²)² / Σ (g_h s_h²)² / (r_h − 1), g_h = R_h (R_h − r_h) / r_h (Cochran eq. 5.16;
``"t"``, the normal-theory bound). Edge effects are heavy-tailed, and the t bound undercovered on such populations
(0.77–0.89 at level 0.95 on lognormal effects with known values, tests/stats/test_missed_mass.py and
docs/verified.md); the Cantelli bound did not. Neither is distribution-free: both plug in the estimated SDs, which
are small when the sample misses the few large edges, so neither sees an edge the approximation ranks low and the
sample misses (the planted model's two true edges that EAP reads as 0 are the measured counter-example,
docs/verified.md). The output says "approximate". Measured with the sampled effects known (the bound's only
randomness the edge sample; docs/make_missed_mass_table.py): 0.98-1.00 at level 0.95 with 60 of 1000 synthetic
edges, but 0.67-0.95 with 15 sampled edges on the planted, zoo and next-token populations, and 0.82-1.00 with
40-60; with the effects estimated from 16 or 64 prompts (the verified run's case) 0.94-1.00 on all five, the
measurement term's slack carrying it. Ranking by the approximation puts the edges it reads as large in their own
block, where they are not rare; it cannot help where the approximation ranks a large edge last. Σ μ² (an even
heavier tail) undercovered with either factor and is not offered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from circuitstat.core.errors import InputError

__all__ = ["MASS_METHODS", "MissedMass", "sampled_effects", "default_strata", "rank_strata", "merge_small_strata",
           "unsampled_total_upper", "missed_mass_bound",
           "MASS_ESTIMAND"]

MASS_METHODS = ("cantelli", "t")
MASS_ESTIMAND = "sum of |mean exact effect| over the unverified edges (upper bound)"


@dataclass(frozen=True)
class MissedMass:
    """The missed-mass bound: ``high`` on the unverified edges' Σ|μ|, its point prediction, SD and how it was made."""

    high: float
    estimate: float
    standard_error: float
    df: float
    n_strata: int
    method: str
    level: float


def rank_strata(score: np.ndarray, n_strata: int) -> np.ndarray:
    """Return each edge's block (0 = largest |score|) when the edges are ranked by |score| and cut into
    ``n_strata`` blocks of nearly equal size (ties broken by edge index, so the blocks are fixed before sampling)."""
    score = np.abs(np.asarray(score, np.float64))
    if n_strata < 1 or n_strata > max(score.size, 1):
        raise InputError(f"n_strata must lie in 1..{score.size} (the edges ranked), got {n_strata}")
    order = np.lexsort((np.arange(score.size), -score))
    out = np.empty(score.size, np.int64)
    out[order] = np.arange(score.size) * n_strata // max(score.size, 1)
    return out


def merge_small_strata(strata: np.ndarray, sampled: np.ndarray, minimum: int = 2) -> np.ndarray:
    """Return ``strata`` (labels over all edges) relabelled 0..H'-1 with every block holding < ``minimum`` of the
    ``sampled`` edges merged into its next (else previous) neighbour by rank: a rule on the sample sizes only."""
    labels = np.unique(strata)
    counts = {int(h): int(np.sum(strata[sampled] == h)) for h in labels}
    if sum(counts.values()) < minimum:
        raise InputError(f"the missed-mass bound needs at least {minimum} sampled edges, got {sum(counts.values())}")
    groups: list[list[int]] = []
    carry: list[int] = []
    for h in labels:  # sweep from the top block down: a short block joins the next one
        carry.append(int(h))
        if sum(counts[g] for g in carry) >= minimum:
            groups.append(carry)
            carry = []
    if carry:  # the last blocks were short: they join the previous group
        groups[-1].extend(carry)
    new = np.empty_like(strata)
    for i, g in enumerate(groups):
        new[np.isin(strata, g)] = i
    return new


def unsampled_total_upper(values: np.ndarray, errors: np.ndarray, sample_strata: np.ndarray, sizes: np.ndarray,
                          confidence_level: float, method: str = "cantelli") -> tuple[float, float, float, float]:
    """Return (prediction of the unsampled units' total, its SD bound, Satterthwaite df, one-sided upper bound) from a
    stratified simple random sample: the sampled units' ``values`` (estimates), their SEs ``errors``, their block
    ``sample_strata`` (0..H-1) and the blocks' population ``sizes``; ``method`` "cantelli" or "t"."""
    if method not in MASS_METHODS:
        raise InputError(f"method must be one of {MASS_METHODS}, got {method!r}")
    y, se = np.asarray(values, np.float64), np.asarray(errors, np.float64)
    H = len(sizes)
    r = np.bincount(sample_strata, minlength=H).astype(np.float64)
    if (r < 2).any():
        raise InputError("every block needs at least 2 sampled units (merge_small_strata first)")
    Rh = np.asarray(sizes, np.float64)
    mean = np.bincount(sample_strata, weights=y, minlength=H) / r
    s2 = np.bincount(sample_strata, weights=(y - mean[sample_strata]) ** 2, minlength=H) / (r - 1)
    g = Rh * (Rh - r) / r
    v_edges = float(np.sum(g * s2))
    sd_meas = float(np.sum(((Rh - r) / r)[sample_strata] * se))
    sd = float(np.sqrt(v_edges + sd_meas ** 2))
    total = float(np.sum((Rh - r) * mean))
    df = v_edges ** 2 / float(np.sum((g * s2) ** 2 / (r - 1))) if v_edges > 0 else float("inf")
    if method == "t":
        factor = float(sps.t.ppf(confidence_level, df))
    else:  # Cantelli: P(T - E T <= -k SD) <= 1 / (1 + k²) for any distribution with that SD
        factor = float(np.sqrt(confidence_level / (1.0 - confidence_level)))
    return total, sd, df, total + factor * sd


def sampled_effects(approx: np.ndarray, exact: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (|cross-fitted PPI++ estimate|, its standard error) per sampled edge: ``approx`` [N, r] on all prompts,
    ``exact`` [n, r] on the prompts ``rows`` (the default interval form's SE; circuitstat.stats.verified.crossfit)."""
    from circuitstat.stats.verified.crossfit import crossfit_fit
    from circuitstat.stats.verified.ppi import DEFAULT_INTERVAL, DEFAULT_TUNING, ppi_intervals

    A, rows = np.asarray(approx, np.float64), np.asarray(rows, np.int64)
    unlabelled = np.ones(A.shape[0], dtype=bool)
    unlabelled[rows] = False
    cf = crossfit_fit(np.asarray(exact, np.float64), A[rows], A[unlabelled], tuning=DEFAULT_TUNING)
    return np.abs(cf.estimate), np.asarray(ppi_intervals(cf, DEFAULT_INTERVAL)["standard_error"], np.float64)


def default_strata(n_sampled: int) -> int:
    """Return the number of rank blocks for ``n_sampled`` sampled edges: one per 10 sampled edges, at least 1."""
    # chosen on two synthetic edge populations (a 10% mixture and lognormal effects; tests/stats/test_missed_mass.py),
    # reported on the planted models (docs/verified.md): more blocks starve each one's variance estimate
    return max(1, int(n_sampled) // 10)


def missed_mass_bound(values: np.ndarray, errors: np.ndarray, sampled: np.ndarray, rank_score: np.ndarray, *,
                      n_strata: int | None = None, confidence_level: float = 0.95,
                      method: str = "cantelli") -> MissedMass:
    """Return the MissedMass bound on Σ|μ| over the unsampled edges from the sampled edges' |estimates| ``values``
    and their SEs ``errors`` (zeros with known effects), their positions ``sampled`` among the R remaining edges,
    and the approximation's ``rank_score`` over those R edges (the blocks are its |score| ranks; by default
    ``default_strata`` of them)."""
    y, se = np.asarray(values, np.float64), np.asarray(errors, np.float64)
    sampled = np.asarray(sampled, np.int64)
    if y.shape != se.shape or y.shape != sampled.shape or np.unique(sampled).size != sampled.size:
        raise InputError("values, errors and sampled must be 1-D arrays of one entry per distinct sampled edge")
    if not (np.isfinite(y).all() and np.isfinite(se).all()) or (y < 0).any() or (se < 0).any():
        raise InputError("the sampled edges' |estimates| and standard errors must be finite and non-negative")
    R = np.asarray(rank_score).size
    H = default_strata(sampled.size) if n_strata is None else int(n_strata)
    strata = merge_small_strata(rank_strata(rank_score, min(H, R)), sampled)
    total, sd, df, up = unsampled_total_upper(y, se, strata[sampled], np.bincount(strata), confidence_level, method)
    return MissedMass(high=up, estimate=total, standard_error=sd, df=df, n_strata=int(strata.max()) + 1,
                      method=method, level=float(confidence_level))
