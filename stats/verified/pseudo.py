"""Pseudo-scores of a verified run: a matrix whose column means are the PPI++ estimates, for circuit analyses.

Circuits selected from verified estimates need the same data-level stability and selection-aware
faithfulness as circuits of plain scores. Those analyses take a score matrix [N, E] and rank its
column means, over resamples or training folds. With λ̂ per edge (PPI++, circuitstat.stats.verified.ppi),
n labelled prompts L and N_u = N − n unlabelled prompts U, the estimate is

    θ̂ = λ̂ · mean_U(Ŷ) + mean_L(Y − λ̂ Ŷ),

so the rows

    C_i = (N / n) · (Y_i − λ̂ Ŷ_i)   for i in L,        C_j = (N / N_u) · λ̂ Ŷ_j   for j in U

have column means exactly θ̂. A resample that keeps n labelled and N_u unlabelled rows (the stratified
bootstrap, ResamplingPlan.stratified with :func:`verified_strata`) has mean
λ̂ · mean*_U(Ŷ) + mean*_L(Y − λ̂ Ŷ): the same estimator on the resampled prompts. Its bootstrap
variance is λ̂² Var_U(Ŷ)/N_u + Var_L(Y − λ̂ Ŷ)/n with divisor-n variances, the plug-in ("z") variance of
PPI++; an ordinary bootstrap of all N rows would let the labelled count vary and is wrong here. On a
training subset the stratum-weighted mean (circuitstat.stats.strata.stratum_weighted_means) gives the same
estimator on the subset's prompts.

λ̂ is held at its full-sample value in every resample and fold (as the two-phase regression estimator's
linearisation does; Cochran 1977, §12.6): the resamples then carry the variability of the two means,
not of λ̂ (second order for the estimate; PPI++'s own interval treats λ̂ so).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from circuitstat.stats.verified.ppi import DEFAULT_TUNING, ppi_fit
from circuitstat.stats.verified.result import labelled_rows, verified_estimand

__all__ = ["VerifiedPseudoScores", "verified_pseudo_scores", "verified_strata", "LABELLED", "UNLABELLED"]

#: stratum labels of :func:`verified_strata`
UNLABELLED, LABELLED = 0, 1


@dataclass(frozen=True)
class VerifiedPseudoScores:
    """``scores`` [N, E] whose column means are the PPI++ estimates; ``strata`` [N] (1 = labelled); λ̂ [E]."""

    scores: np.ndarray
    strata: np.ndarray
    lam: np.ndarray
    n_labelled: int
    n_prompts: int

    @property
    def estimand(self) -> str:
        """Return what the column means estimate, e.g. "mean exact effect, verified on 16 of 512 prompts"."""
        return verified_estimand(self.n_labelled, self.n_prompts)


def verified_strata(labelled, n_prompts: int) -> np.ndarray:
    """Return the stratum of each of ``n_prompts`` prompts: LABELLED for the rows ``labelled``, else UNLABELLED."""
    rows = labelled_rows(labelled, n_prompts)
    strata = np.full(n_prompts, UNLABELLED, dtype=np.int64)
    strata[rows] = LABELLED
    return strata


def verified_pseudo_scores(approx: np.ndarray, exact: np.ndarray, labelled, *, tuning: str = DEFAULT_TUNING,
                           lam: np.ndarray | None = None) -> VerifiedPseudoScores:
    """Return the pseudo-scores of a verified run (column means = the PPI++ estimates of ``verified_means``).

    ``approx`` [N, E] on every prompt, ``exact`` [n, E] on the rows ``labelled`` (in that order), as
    ``verified_means`` takes them; ``lam`` [E] fixes λ instead of tuning it (``tuning`` as there).
    """
    A = np.asarray(approx, dtype=np.float64)
    N = A.shape[0]
    rows = labelled_rows(labelled, N)
    strata = verified_strata(rows, N)
    unl = strata == UNLABELLED
    fit = ppi_fit(np.asarray(exact, dtype=np.float64), A[rows], A[unl], lam=lam, tuning=tuning)
    n, N_u = rows.size, int(unl.sum())
    C = np.empty_like(A)
    C[unl] = (N / N_u) * fit.lam * A[unl]
    C[rows] = (N / n) * fit.rectifier
    return VerifiedPseudoScores(C, strata, fit.lam, n, N)
