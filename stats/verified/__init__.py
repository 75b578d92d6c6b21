"""Verified runs: intervals for the mean *exact* effect from an approximation on N prompts and exact on n.

* circuitstat.stats.verified.ppi: PPI++ (Angelopoulos, Duchi & Zrnic 2023) for per-edge means, vectorised, with the
  small-n interval forms the coverage study compares;
* circuitstat.stats.verified.result: ``verified_means`` and its ``VerifiedResult`` (the public entry point);
* circuitstat.stats.verified.reliability: the per-edge reliability flag;
* circuitstat.stats.verified.missed: an upper bound on the unverified edges whose mean exact effect exceeds a threshold;
* circuitstat.stats.verified.missed_mass: an upper bound on their summed |mean exact effect| (stratified Horvitz–Thompson);
* circuitstat.stats.verified.pseudo: pseudo-scores whose column means are the estimates, for stability and
  faithfulness of circuits selected from them (stratified resampling);
* circuitstat.stats.verified.coverage: simulated coverage on paired populations (exact and approximation per prompt);
* circuitstat.stats.verified.active: active verification (exact cells sampled with probabilities from the approximation,
  Horvitz–Thompson weighted; Zrnic & Candès 2024; 2-fold cross-fitted λ for its p-values);
  circuitstat.stats.verified.active_flag: its per-edge tail flag; circuitstat.stats.verified.active_result: its
  verified table;
* circuitstat.stats.verified.multi: several approximations at once as control variates, coefficients cross-fitted
  and shrunk across edges (``verified_means_multi``, the same VerifiedResult).
"""

from __future__ import annotations

from circuitstat.core.lazy import lazy_names

_MODULES = {
    ".result": ["VerifiedResult", "verified_means", "verified_estimand"],
    ".ppi": ["ppi_fit", "ppi_intervals", "power_tuning", "INTERVALS", "DEFAULT_INTERVAL", "TUNINGS",
             "DEFAULT_TUNING"],
    ".missed": ["MissedEdgesResult", "missed_edges_bound", "hypergeometric_upper"],
    ".missed_mass": ["MissedMass", "missed_mass_bound"],
    ".coverage": ["paired_population", "simulate_verified", "simulate_active"],
    ".pseudo": ["VerifiedPseudoScores", "verified_pseudo_scores", "verified_strata"],
    ".active": ["active_probabilities", "active_sample", "active_means", "active_crossfit"],
    ".active_flag": ["active_reliability"],
    ".active_result": ["ActiveVerifiedResult", "active_verified_means", "active_estimand", "ACTIVE_LABEL"],
    ".multi": ["verified_means_multi", "multi_fit"],
}
__all__, __getattr__ = lazy_names(__name__, _MODULES)
