"""Calibration of the circuit hypothesis tests (circuitstat.stats.circuit_tests) by resampling cached evaluations.

A *pool* holds per-prompt metric values computed once on P prompts (the full model, the circuit, its
complement, the circuit minus each edge, a pool of inflated circuits with and without one added edge, a pool of
random connected circuits and their complements). The pool is the population: a dataset of N prompts is N rows drawn with
replacement, and a test's random circuits / inflated circuits are drawn from the pool's. So each of R datasets is
an exact i.i.d. draw from a known population, the truth of each null is known from the pool itself, and R
datasets cost R resamples of arrays instead of R model runs.

Every ``simulate_*`` function returns a boolean array of rejections, one per dataset; :func:`rejection_rate`
turns it into a rate with its Monte Carlo standard error.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from circuitstat.stats import circuit_tests as T

__all__ = ["rejection_rate", "equivalence_size", "tost_size", "rank_size", "boundary_margin", "simulate_equivalence",
           "simulate_random_rank", "simulate_minimality", "simulate_independence"]


def rejection_rate(hits: np.ndarray) -> tuple[float, float]:
    """Return (rejection rate, its Monte Carlo standard error) over datasets."""
    hits = np.asarray(hits, dtype=bool)
    p = float(hits.mean())
    return p, math.sqrt(p * (1 - p) / hits.size)


def equivalence_size(n: int, q: float, margin: float, alpha: float) -> float:
    """Return P(p-value <= alpha) of the equivalence test on n prompts when P(Δ > 0) = q (no ties): exact."""
    region = [k for k in range(n + 1) if T.equivalence_pvalue(k, n, margin) <= alpha]
    return float(stats.binom.pmf(region, n, q).sum()) if region else 0.0


def tost_size(n: int, q: float, margin: float, alpha: float) -> float:
    """Return P(TOST p-value <= alpha) on n prompts when P(Δ > 0) = q (no ties): exact."""
    region = [k for k in range(n + 1) if T.tost_pvalue(k, n, margin) <= alpha]
    return float(stats.binom.pmf(region, n, q).sum()) if region else 0.0


def rank_size(n_random: int, alpha: float) -> float:
    """Return the exact size of the rank p-value (1 + #not beaten) / (R + 1) <= alpha under exchangeability."""
    return math.floor(alpha * (n_random + 1) + 1e-12) / (n_random + 1)


def boundary_margin(full: np.ndarray, circuit: np.ndarray) -> tuple[float, float]:
    """Return (q, |q − 1/2|): the pool's P(circuit > model) + P(tie)/2 (ties are split by a fair coin), and the
    margin that puts the pool on the null's boundary."""
    delta = np.asarray(circuit) - np.asarray(full)
    q = float((delta > 0).mean() + 0.5 * (delta == 0).mean())
    return q, abs(q - 0.5)


def _rows(rng: np.random.Generator, P: int, n: int) -> np.ndarray:
    return rng.integers(P, size=n)


def simulate_equivalence(full: np.ndarray, circuit: np.ndarray, n: int, R: int, *, margin: float, alpha: float,
                         seed: int, tost: bool = False) -> np.ndarray:
    """Return rejections of the equivalence test (the paper's direction, or the TOST) on R datasets of n prompts."""
    rng = np.random.default_rng(seed)
    fn = T.equivalence_tost if tost else T.equivalence_test
    out = np.empty(R, dtype=bool)
    for r in range(R):
        rows = _rows(rng, full.size, n)
        out[r] = fn(full[rows], circuit[rows], margin=margin, random_state=rng).pvalue <= alpha
    return out


def simulate_random_rank(full: np.ndarray, candidate: np.ndarray, randoms: np.ndarray, n: int, R: int, *,
                         n_random: int, alpha: float, seed: int, test: str = "sufficiency",
                         exchangeable: bool = False, quantile: float | None = T.PAPER_QUANTILE) -> np.ndarray:
    """Return rejections of sufficiency (or partial necessity) on R datasets; ``randoms`` [P, pool] random circuits.

    ``exchangeable``: the candidate is itself one of the pool's random circuits, drawn afresh per dataset
    (a random connected circuit of the true circuit's size: the null holds); ``candidate`` is ignored.
    ``quantile``: the paper's q (default 0.9) or None (the exact rank test).
    """
    rng = np.random.default_rng(seed)
    fn = T.sufficiency_test if test == "sufficiency" else T.partial_necessity_test
    out = np.empty(R, dtype=bool)
    for r in range(R):
        rows = _rows(rng, full.size, n)
        pick = rng.choice(randoms.shape[1], size=n_random + exchangeable, replace=False)
        cand = randoms[:, pick[0]] if exchangeable else candidate
        others = randoms[:, pick[int(exchangeable):]]
        out[r] = fn(full[rows], cand[rows], others[rows], quantile=quantile).pvalue <= alpha
    return out


def simulate_minimality(circuit: np.ndarray, minus: np.ndarray, inflated: np.ndarray, inflated_minus: np.ndarray,
                        n: int, R: int, *, n_random: int, quantile: float, alpha: float, correction: str,
                        seed: int) -> np.ndarray:
    """Return rejections of minimality (any edge redundant after the correction) on R datasets; the references
    are ``n_random`` of the pool's inflated circuits (paired columns of ``inflated`` and ``inflated_minus``)."""
    rng = np.random.default_rng(seed)
    out = np.empty(R, dtype=bool)
    for r in range(R):
        rows = _rows(rng, circuit.size, n)
        pick = rng.choice(inflated.shape[1], size=n_random, replace=False)
        res = T.minimality_test(circuit[rows], minus[rows], inflated[rows][:, pick], inflated_minus[rows][:, pick],
                                quantile=quantile, alpha=alpha, correction=correction)
        out[r] = not res.minimal
    return out


def simulate_independence(full: np.ndarray, complement: np.ndarray, n: int, R: int, *, n_permutations: int,
                          alpha: float, seed: int, independent: bool = False) -> np.ndarray:
    """Return rejections of the HSIC test on R datasets; ``independent`` pairs each prompt's full-model metric
    with the complement's metric of another, independently drawn prompt (the null is then true exactly)."""
    rng = np.random.default_rng(seed)
    out = np.empty(R, dtype=bool)
    for r in range(R):
        rows = _rows(rng, full.size, n)
        other = _rows(rng, full.size, n) if independent else rows
        out[r] = T.independence_test(full[rows], complement[other], n_permutations=n_permutations,
                                     random_state=rng).pvalue <= alpha
    return out
