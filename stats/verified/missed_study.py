"""How often the missed-edges bound holds, over datasets drawn from a population whose exact effects are known.

A population is a paired matrix: exact effects X [P, E] and the approximation A [P, E] of the same P prompts
(e.g. a planted ground-truth model's, tests/fixtures/groundtruth-verified-planted3.parquet); its mean exact
effect per edge μ_e is the truth, so the edges above the threshold (|μ_e| > τ) and the nulls are known. Each
dataset draws N prompts with replacement, verifies n of them uniformly at random, takes the top m edges by
|approximation mean| plus a uniformly random r of the other R, and computes the bound of
circuitstat.stats.verified.missed as a verified run does (circuitstat.pipelines.verify: half the error rate on
the hypergeometric bound, half on classifying the sampled edges: TOST with Holm over them, or Bonferroni intervals). The bound holds when
the unverified edges (R − r) hold at most ``missed_high`` edges with |μ_e| > τ.

With the sampled edges' effects known (``known=True``) the only randomness is the sample, and the failure
probability given (R, K, r) is computable exactly: P(K_U(X) < K), X ~ Hypergeometric(R, K, r)
(:func:`failure_probability`); its mean over datasets is the hold rate to expect, and shows whether the
bound could fail at all on this population (it cannot where K is small: K_U(0) ≥ K for every sample).

Several approximations ([P, E, p], or {name: [P, E]}) are the predictor of a multi-predictor verified run
(circuitstat.stats.verified.multi.verified_means_multi, its defaults): the first one ranks the edges (the top m,
the missed-mass strata, and the missed-mass values, which stay single-predictor), all of them classify the sampled
edges. The prompts, the labelled rows and the edge sample's random stream do not depend on the approximation, so
studies of several predictors with one seed see the same datasets (the sample is drawn from each one's own rest).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.params import SEED
from circuitstat.core.topk import topk
from circuitstat.stats.verified.missed import (log_choose, hypergeometric_upper, missed_edges_bound, possibly_above,
                                              tost_holm_possibly_above)
from circuitstat.stats.verified.missed_mass import missed_mass_bound, sampled_effects
from circuitstat.stats.verified.multi import stack_predictors

__all__ = ["MissedStudy", "failure_probability", "missed_edges_study"]


@lru_cache(maxsize=4096)
def failure_probability(R: int, K: int, r: int, confidence_level: float) -> float:
    """Return P(K_U(X) < K) for X ~ Hypergeometric(R, K, r): the exact chance the bound misses K (known effects)."""
    x = np.arange(0, min(K, r) + 1)
    upper = np.array([hypergeometric_upper(int(v), R, r, confidence_level) for v in x])
    pmf = np.exp(log_choose(K, x) + log_choose(R - K, r - x) - log_choose(R, r))
    return float(pmf[upper < K].sum())


@dataclass
class MissedStudy:
    """Per dataset: the truth (unverified edges above τ), the bound, the unverified count, whether it held,
    and (known effects) its exact failure probability; ``summary()`` the hold rate with its MC SE."""

    truth: np.ndarray
    bound: np.ndarray
    n_unverified: np.ndarray
    holds: np.ndarray
    fail_probability: np.ndarray  # NaN with estimated effects
    level: float
    mass_truth: np.ndarray  # Σ|μ_e| over the unverified edges
    mass_high: np.ndarray  # the missed-mass bound (circuitstat.stats.verified.missed_mass)
    top_mass: np.ndarray  # Σ|μ_e| over the top m edges: the mass the verified candidates carry
    misclassified: np.ndarray  # sampled edges with |μ_e| > τ classified below τ (the error α_e bounds; 0 if known)

    def summary(self) -> dict:
        """Return hold rate, its MC SE (dataset as the unit), the expected hold rate and medians."""
        D = self.holds.size
        p = float(self.holds.mean())
        return {"datasets": D, "level": self.level, "hold_rate": p, "mc_se": float(np.sqrt(max(p * (1 - p), 1.0 / D) / D)),
                "expected_hold_rate": float(1 - np.nanmean(self.fail_probability)) if np.isfinite(
                    self.fail_probability).any() else float("nan"),
                "median_truth": float(np.median(self.truth)), "median_bound": float(np.median(self.bound)),
                "median_unverified": float(np.median(self.n_unverified)),
                "share_bound_below_unverified": float(np.mean(self.bound < self.n_unverified)),
                "share_truth_positive": float(np.mean(self.truth > 0)), **self.classification_summary(),
                **self.mass_summary()}

    def classification_summary(self) -> dict:
        """Return the share of datasets where a sampled edge above τ was classified below it (family-wise error of
        the classification, at most 1 − classification level), with its MC SE."""
        D = self.holds.size
        p = float(np.mean(self.misclassified > 0))
        return {"classification_error": p, "classification_mc_se": float(np.sqrt(max(p * (1 - p), 1.0 / D) / D))}

    def mass_summary(self) -> dict:
        """Return the missed-mass bound's hold rate with its MC SE, its median ratio to the truth, and the shares
        of datasets where it is below τ × the unverified count (the count's scale) and below the top edges' mass."""
        D = self.holds.size
        p = float(np.mean(self.mass_truth <= self.mass_high))
        return {"mass_hold_rate": p, "mass_mc_se": float(np.sqrt(max(p * (1 - p), 1.0 / D) / D)),
                "mass_median_ratio": float(np.median(self.mass_high / np.maximum(self.mass_truth, 1e-300))),
                "mass_median_high": float(np.median(self.mass_high)), "mass_median_truth": float(np.median(self.mass_truth)),
                "mass_below_top": float(np.mean(self.mass_high < self.top_mass))}


def _one(X: np.ndarray, H: np.ndarray, mu: np.ndarray, rng: np.random.Generator, *, tau: float, n_top: int,
         n_random: int, N: int, n: int, level: float, split: float, known: bool,
         classify: str = "tost-holm") -> tuple[int, int, int, float, float, float, float, int]:
    """Return (truth, bound, unverified count, failure probability or NaN, missed mass, its bound, top mass,
    misclassified sampled edges) of one dataset."""
    from circuitstat.stats.verified import verified_means, verified_means_multi

    idx = rng.integers(0, X.shape[0], N)
    Hd = H[idx]
    Ad = Hd[:, :, 0]  # the first approximation ranks the edges
    E = X.shape[1]
    top = np.asarray(topk(Ad.mean(0), n_top, ranking="absolute", seed=rng).indices).reshape(-1)
    rest = np.setdiff1d(np.arange(E), top)
    sample = rng.choice(rest, size=n_random, replace=False)
    alpha = 1.0 - level
    rank = np.abs(Ad.mean(0)[rest])
    at = np.searchsorted(rest, sample)
    if known:
        above = np.abs(mu[sample]) > tau
        res = missed_edges_bound(above, rest.size, tau=tau, n_top=n_top, confidence_level=level)
        mass = missed_mass_bound(np.abs(mu[sample]), np.zeros(sample.size), at, rank, confidence_level=level)
    else:
        rows = np.sort(rng.choice(N, n, replace=False))
        # Bonferroni reads the intervals at 1 − α_e / r; TOST reads only the estimates, SEs and df
        level_kw = {"confidence_level": 1.0 - alpha * (1 - split) / n_random} if classify == "bonferroni" else {}
        if H.shape[2] == 1:
            cls = verified_means(Ad[:, sample], X[idx[rows]][:, sample], rows, **level_kw)
        else:
            cls = verified_means_multi(Hd[:, sample], X[idx[rows]][:, sample], rows, **level_kw)
        if classify == "bonferroni":
            above = possibly_above(cls.confidence_interval.low, cls.confidence_interval.high, tau)
        else:
            above = tost_holm_possibly_above(cls.estimate, cls.standard_error, cls.df, tau, alpha * (1 - split))
        res = missed_edges_bound(np.asarray(above, bool), rest.size, tau=tau, n_top=n_top,
                                 confidence_level=1.0 - alpha * split, classification_level=1.0 - alpha * (1 - split))
        mass = missed_mass_bound(*sampled_effects(Ad[:, sample], X[idx[rows]][:, sample], rows), at, rank,
                                 confidence_level=level)
    unverified = np.setdiff1d(rest, sample)
    truth = int((np.abs(mu[unverified]) > tau).sum())
    fail = failure_probability(rest.size, int((np.abs(mu[rest]) > tau).sum()), n_random, level) if known else np.nan
    wrong = int(np.sum((np.abs(mu[sample]) > tau) & ~np.asarray(above, bool)))
    return (truth, res.bound, unverified.size, fail, float(np.abs(mu[unverified]).sum()), mass.high,
            float(np.abs(mu[top]).sum()), wrong)


def missed_edges_study(exact: np.ndarray, approx: np.ndarray | dict[str, np.ndarray], *, tau: float, n_top: int,
                       n_random: int, n_prompts: int = 512, n_labelled: int = 16, n_datasets: int = 200,
                       seed: int = SEED.default, confidence_level: float = 0.95, split: float = 0.5, known: bool = True,
                       classify: str = "tost-holm") -> MissedStudy:
    """Return a MissedStudy of the missed-edges bound over ``n_datasets`` datasets drawn from the population
    (``exact``, ``approx`` [P, E], the same prompts; or several approximations, [P, E, p] or {name: [P, E]}: the
    first ranks, all predict, module docstring); ``known``: the sampled edges' effects are the truth, else they are
    estimated by PPI++ from ``n_labelled`` of ``n_prompts`` prompts and classified by ``classify`` ("tost-holm", the
    pipelines' rule, or "bonferroni": intervals inside (−τ, τ))."""
    X = np.asarray(exact, np.float64)
    A = approx if isinstance(approx, dict) else np.asarray(approx, np.float64)
    H = stack_predictors(A[:, :, None] if isinstance(A, np.ndarray) and A.ndim == 2 else A)[0]
    if H.shape[:2] != X.shape:
        raise InputError(f"the approximations {H.shape[:2]} must be [P, E] of the exact scores' shape {X.shape}")
    mu = X.mean(0)
    rng = np.random.default_rng(seed)
    out = np.array([_one(X, H, mu, rng, tau=tau, n_top=n_top, n_random=n_random, N=n_prompts, n=n_labelled,
                         level=confidence_level, split=split, known=known, classify=classify)
                    for _ in range(n_datasets)])
    truth, bound, unv = (out[:, i].astype(np.int64) for i in range(3))
    return MissedStudy(truth, bound, unv, truth <= bound, out[:, 3], confidence_level, out[:, 4], out[:, 5], out[:, 6],
                       out[:, 7].astype(np.int64))
