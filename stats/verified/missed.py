"""An upper bound on the number of unverified edges whose mean exact effect exceeds a threshold.

A verified run computes exact effects for the top-m candidate edges (by the approximation) plus a
uniformly random sample of r of the R remaining edges. Among the R remaining, K edges have a mean exact
effect above the user's threshold τ (in absolute value); the sample holds X ~ Hypergeometric(R, K, r) of
them. The exact one-sided upper confidence bound for K (Buonaccorsi 1987, "A note on confidence intervals
for proportions in finite populations", The American Statistician 41; the finite-population analogue of
Clopper-Pearson) is

    K_U(x) = max { K : P(X <= x | R, K, r) > α },

and the unverified edges (R − r of them, never computed exactly) hold at most K_U − x such edges. (AtP*,
Kramár et al. 2024, arXiv 2403.00745, bounds missed effects differently: it patches random subsets of nodes
jointly and, assuming their effects do not cancel, bounds the largest effect it may have missed.)

Which sampled edges exceed τ is itself estimated: an edge counts as "possibly above τ" unless a test rejects
|μ_e| ≥ τ. Two classifications with family-wise error α_e over the r sampled edges are offered: its Bonferroni
interval (level 1 − α_e / r) inside (−τ, τ) (``possibly_above``), or, with more power for the same guarantee,
TOST (two one-sided t tests, an intersection-union test: Berger & Hsu 1996, Statistical Science 11(4)) p-values
with Holm's step-down at α_e (``tost_holm_possibly_above``; the pipelines' default). Either way every truly large
sampled edge is counted with probability 1 − α_e, K_U is monotone in x, and the bound holds with probability at
least 1 − α − α_e (the level the result states).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special

from circuitstat.core.errors import InputError
from circuitstat.core.results import Result
from circuitstat.stats.verified.missed_mass import MASS_ESTIMAND

__all__ = ["log_choose", "hypergeometric_cdf", "hypergeometric_upper", "possibly_above", "tost_pvalues", "holm_reject",
           "tost_holm_possibly_above", "MissedEdgesResult",
           "missed_edges_bound", "MISSED_ESTIMAND"]

MISSED_ESTIMAND = "number of unverified edges whose mean exact effect exceeds the threshold (upper bound)"


def log_choose(n: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Return log C(n, k) (−inf where k < 0 or k > n)."""
    n, k = np.asarray(n, np.float64), np.asarray(k, np.float64)
    ok = (k >= 0) & (k <= n)
    with np.errstate(invalid="ignore"):
        out = special.gammaln(n + 1) - special.gammaln(np.where(ok, k, 0) + 1) - special.gammaln(
            np.where(ok, n - k, 0) + 1)
    return np.where(ok, out, -np.inf)


def hypergeometric_cdf(x: int, population: int, successes: np.ndarray, draws: int) -> np.ndarray:
    """Return P(X <= x) for X ~ Hypergeometric(population, successes, draws), vectorised over ``successes``."""
    K = np.asarray(successes, np.float64)[..., None]
    k = np.arange(0, int(x) + 1, dtype=np.float64)
    logp = log_choose(K, k) + log_choose(population - K, draws - k) - log_choose(population, draws)
    return np.minimum(np.exp(logp).sum(-1), 1.0)


def hypergeometric_upper(x: int, population: int, draws: int, confidence_level: float = 0.95) -> int:
    """Return the exact upper confidence bound on the successes K among ``population`` from x of ``draws``."""
    x, R, r = int(x), int(population), int(draws)
    if not (0 <= r <= R and 0 <= x <= r):
        raise InputError(f"need 0 <= x <= draws <= population, got x={x}, draws={r}, population={R}")
    if not 0.0 < confidence_level < 1.0:
        raise InputError(f"confidence_level must lie in (0, 1), got {confidence_level}")
    alpha = 1.0 - confidence_level
    lo, hi = x, R - (r - x)  # the K that can produce x successes in r draws
    # P(X <= x | K) decreases in K, and at K = x it is 1 > α: bisect for the last K where it exceeds α
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hypergeometric_cdf(x, R, np.array([mid]), r)[0] > alpha:
            lo = mid
        else:
            hi = mid - 1
    return int(lo)


def possibly_above(low: np.ndarray, high: np.ndarray, tau: float) -> np.ndarray:
    """Return True per edge unless its interval lies inside (−τ, τ) (the effect may exceed τ in size)."""
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    return ~((low > -tau) & (high < tau))


def tost_pvalues(estimate: np.ndarray, standard_error: np.ndarray, df: np.ndarray, tau: float) -> np.ndarray:
    """Return per edge the TOST p-value of H0: |μ| ≥ τ (the larger of the two one-sided t tests' p-values)."""
    est, se = np.asarray(estimate, np.float64), np.asarray(standard_error, np.float64)
    df = np.broadcast_to(np.asarray(df, np.float64), est.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        lower = special.stdtr(df, -(est + tau) / se)   # H0: μ ≤ −τ
        upper = special.stdtr(df, (est - tau) / se)    # H0: μ ≥ τ
    exact = np.where(np.abs(est) < tau, 0.0, 1.0)     # SE 0: the effect is known
    return np.where(se > 0, np.maximum(lower, upper), exact)


def holm_reject(pvalues: np.ndarray, alpha: float) -> np.ndarray:
    """Return which hypotheses Holm's step-down rejects at family-wise level ``alpha``."""
    p = np.asarray(pvalues, np.float64)
    order = np.argsort(p, kind="stable")
    m = p.size
    ok = p[order] <= alpha / (m - np.arange(m))
    k = m if ok.all() else int(np.argmin(ok))  # the first non-rejection stops the step-down
    out = np.zeros(m, dtype=bool)
    out[order[:k]] = True
    return out


def tost_holm_possibly_above(estimate: np.ndarray, standard_error: np.ndarray, df: np.ndarray, tau: float,
                             alpha: float) -> np.ndarray:
    """Return True per edge unless Holm over the edges' TOST p-values rejects |μ| ≥ τ at family-wise level ``alpha``."""
    return ~holm_reject(tost_pvalues(estimate, standard_error, df, tau), alpha)


@dataclass(repr=False)
class MissedEdgesResult(Result):
    """The bound on missed edges, one row: conf_int() gives [0, bound] for the unverified edges' count."""

    bound: int
    bound_remaining: int
    sampled_above: int
    n_sampled: int
    n_remaining: int
    n_top: int
    tau: float
    confidence_level: float
    classification_level: float
    params: dict = field(default_factory=dict)
    mass: Any = None  # circuitstat.stats.verified.missed_mass.MissedMass, or None (count only)
    main_table = "missed_edges"

    @property
    def level(self) -> float:
        """Return the level the bound holds at: confidence_level + classification_level − 1 (Bonferroni)."""
        return self.confidence_level + self.classification_level - 1.0

    def interval_level(self) -> float:
        """Return the level of the stated bound (both error sources)."""
        return self.level

    def _tables(self) -> dict[str, dict[str, Any]]:
        estimand = f"{MISSED_ESTIMAND}: |mean exact effect| > {self.tau:g}, at level {self.level:.3g}"
        out: dict[str, list] = {
            "tau": [self.tau], "n_top": [self.n_top], "n_remaining": [self.n_remaining],
            "n_sampled": [self.n_sampled], "n_unverified": [self.n_remaining - self.n_sampled],
            "sampled_above": [self.sampled_above], "missed_low": [0], "missed_high": [self.bound],
            "remaining_above_high": [self.bound_remaining], "level": [self.level]}
        if self.mass is not None:
            m = self.mass
            out.update({"mass_low": [0.0], "mass_high": [m.high], "mass_estimate": [m.estimate],
                        "mass_strata": [m.n_strata], "mass_level": [m.level],
                        "mass_method": [f"stratified Horvitz-Thompson, {m.n_strata} rank blocks, {m.method}; "
                                        "approximate: an unsampled edge larger than the sampled ones is invisible"]})
            estimand += f"; {MASS_ESTIMAND}, at level {m.level:.3g} (approximate)"
        out["estimand"] = [estimand]
        return {"missed_edges": out}

    def _summary_items(self) -> list[tuple[str, Any]]:
        return [("estimand", MISSED_ESTIMAND), ("threshold τ", self.tau),
                ("verified", f"top {self.n_top} + random {self.n_sampled} of the other {self.n_remaining}"),
                ("sampled edges possibly above τ", self.sampled_above),
                (f"unverified edges above τ (≤, level {self.level:.3g})", self.bound)] + (
            [] if self.mass is None else [(f"Σ|mean exact effect| over unverified edges (≤, level {self.mass.level:.3g})",
                                           self.mass.high)])


def missed_edges_bound(sample_above: np.ndarray, n_remaining: int, *, tau: float, n_top: int = 0,
                       confidence_level: float = 0.975, classification_level: float = 1.0,
                       mass: Any = None) -> MissedEdgesResult:
    """Return the upper bound on unverified edges above τ from the random sample's classification.

    ``sample_above`` [r] bool: each sampled edge possibly above τ (`possibly_above` on intervals that hold
    simultaneously at ``classification_level``; 1.0 when the sampled edges' effects are known exactly).
    ``n_remaining`` is R, the edges outside the top ``n_top`` the sample was drawn from uniformly. ``mass``: the
    missed-mass bound of the same sample (circuitstat.stats.verified.missed_mass.missed_mass_bound), reported beside.
    """
    above = np.asarray(sample_above)
    if above.ndim != 1 or above.dtype != bool:
        raise InputError("sample_above must be a 1-D boolean array, one entry per sampled edge")
    r, R = above.size, int(n_remaining)
    if r > R:
        raise InputError(f"{r} sampled edges cannot come from {R} remaining ones")
    if not 0.0 < classification_level <= 1.0 or confidence_level + classification_level <= 1.0:
        raise InputError("need 0 < classification_level <= 1 and a positive combined level")
    x = int(above.sum())
    k_upper = hypergeometric_upper(x, R, r, confidence_level)
    params = {"estimator": "missed_edges_bound", "tau": float(tau), "confidence_level": confidence_level,
              "classification_level": classification_level, "estimand": MISSED_ESTIMAND}
    return MissedEdgesResult(k_upper - x, k_upper, x, r, R, int(n_top), float(tau), float(confidence_level),
                             float(classification_level), params, mass)
