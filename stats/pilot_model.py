"""The population a pilot is simulated from (circuitstat.stats.sample_size's Jaccard predictions): the pilot's centred
rows plus model means, which are the pilot's means deconvolved of their noise, tied at one point where the pilot
tells no edge's mean from it, as they are, or posterior draws from an empirical-Bayes g-model
(docs/sample-size.md, "Expected Jaccard" and "Tied when the pilot tells no edge apart").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.topk import ranking_key

__all__ = ["MEANS", "HOMOGENEITY_LEVEL", "PilotFit", "fit_pilot", "deconvolved_means", "mean_centre",
           "homogeneity_pvalue"]

#: the simulated population's means (``fit_pilot``): the first is the default
MEANS = ("tested", "deconvolved", "pilot", "posterior")


def deconvolved_means(mean: np.ndarray, sd: np.ndarray, n0: int, ranking: str) -> np.ndarray:
    """Return means whose squared spread about c matches the truth's in expectation: (m-c)^2 - s^2/n0, floored at 0.

    c is 0 for absolute ranking (the key is |mean|) and the mean over edges for signed ranking.
    """
    centre = mean_centre(mean, ranking)
    d = np.asarray(mean, dtype=np.float64) - centre
    return centre + np.sign(d) * np.sqrt(np.maximum(d * d - np.asarray(sd, dtype=np.float64) ** 2 / n0, 0.0))


def mean_centre(mean: np.ndarray, ranking: str) -> float:
    """Return c, the point the means are deconvolved or tied towards: 0 for absolute ranking (the key is |mean|),
    the mean over edges for signed ranking."""
    ranking_key(np.zeros(1), ranking)  # raises for an unknown ranking
    return 0.0 if ranking == "absolute" else float(np.mean(mean))


def homogeneity_pvalue(mean: np.ndarray, sd: np.ndarray, n0: int, ranking: str) -> float:
    """Return the p-value of H0: every edge's mean is c (``mean_centre``), from the edges' pilot t statistics: the
    smaller of a chi-square (dense) and a Bonferroni max-|t| (sparse) test, doubled."""
    from scipy import stats as st

    # Each edge's t on n0 - 1 df is mapped to the normal quantile with the same two-sided p, so the sum of squares
    # is chi-square under H0 for normal scores whatever n0 (a plain sum of t^2 has mean E (n0-1)/(n0-3), not E).
    # Edges share prompts: correlated t's spread the sum wider than chi-square, so the test rejects more often than
    # its level, which keeps the deconvolved means (the behaviour before the test) rather than tying them.
    d = np.asarray(mean, np.float64) - mean_centre(mean, ranking)
    sd = np.asarray(sd, np.float64)
    if np.any((sd == 0) & (d != 0)):
        return 0.0
    ok = sd > 0
    if not ok.any():
        return 1.0
    t = d[ok] * np.sqrt(n0) / sd[ok]
    p_edge = 2.0 * st.t.sf(np.abs(t), n0 - 1)
    z = st.norm.isf(p_edge / 2)  # each |t| as the |z| with the same two-sided p
    df = int(ok.sum()) - (0 if ranking == "absolute" else 1)  # signed: c is estimated from the same means
    dense = st.chi2.sf(np.sum(z * z), max(df, 1))  # powerful when many edges differ a little
    sparse = min(1.0, ok.sum() * p_edge.min())  # Bonferroni on the largest |t|: when one or a few edges stand out
    return float(min(1.0, 2.0 * min(dense, sparse)))  # the two joined by Bonferroni: level alpha under H0


#: the level of the homogeneity test below which ``means="tested"`` deconvolves the means and above which it ties
#: them (the usual 5%, not chosen on any population: docs/sample-size.md, "Tied when the pilot tells no edge apart")
HOMOGENEITY_LEVEL = 0.05


@dataclass
class PilotFit:
    """The population model fitted to a pilot: centred rows, plus the means a simulated dataset is centred on."""

    residuals: np.ndarray  # [n0, E] pilot rows minus the pilot means
    mean: np.ndarray  # pilot means [E]
    sd: np.ndarray  # pilot SDs (ddof=1) [E]
    model_means: np.ndarray  # means of the simulated population [E] (the posterior means for means="posterior")
    prior: Any = None  # the g-model (circuitstat.stats.gmodel.GModel) whose posterior draws replace model_means

    def dataset(self, rows: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Return the simulated dataset made of pilot rows ``rows`` (centred) plus the model means (with a prior
        and an rng: one posterior draw of them)."""
        mu = self.model_means if self.prior is None or rng is None else self.prior.draw(rng, 1)[0]
        return self.residuals[rows] + mu


def fit_pilot(S: np.ndarray, *, ranking: str, means: str = "tested") -> PilotFit:
    """Return the PilotFit of S [n0, E]: its rows centred, and model means per ``means`` (tested: deconvolved, or
    all tied at c where ``homogeneity_pvalue`` exceeds HOMOGENEITY_LEVEL; deconvolved; the pilot's own; or a
    g-model whose posterior draws replace them)."""
    if means not in MEANS:
        raise InputError(f"unknown means {means!r}; use one of {MEANS}")
    S = np.asarray(S, dtype=np.float64)
    n0 = S.shape[0]
    mean = S.mean(axis=0)
    sd = S.std(axis=0, ddof=1)
    if means == "posterior":
        from .gmodel import npmle

        ranking_key(np.zeros(1), ranking)  # raises for an unknown ranking
        g = npmle(mean, sd / np.sqrt(n0))
        return PilotFit(S - mean, mean, sd, g.mean(), g)
    if means == "tested" and homogeneity_pvalue(mean, sd, n0, ranking) > HOMOGENEITY_LEVEL:
        model = np.full_like(mean, mean_centre(mean, ranking))  # no edge told apart: every mean tied at c
    else:
        model = deconvolved_means(mean, sd, n0, ranking) if means in ("tested", "deconvolved") else mean
    return PilotFit(S - mean, mean, sd, model)
