"""Per-edge p-values (one-sample t, bootstrap-SE z, interval inversion, resampling) and FDR
control (BH, BY); scalar z and t p-values and Holm's family-wise adjustment for a study's claims.

`interval_test_edges` turns a per-edge interval result (circuitstat.stats.intervals.bootstrap_edges) into
tests whose p-value inverts that same interval, so the interval excludes 0 exactly when
p < 1 - confidence_level; the FDR adjustment is applied to those p-values (the multiplicity
rule: reject where the adjusted p-value <= alpha).

Adjustments are vectorised own code (sort once, running minimum from the largest p-value),
checked against statsmodels' multipletests. NaN p-values (e.g. an edge whose scores are all
identical, where the t statistic is 0/0) stay NaN and are not counted among the m tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy import special

from circuitstat.core.results import Result

__all__ = [
    "EdgeTestResult",
    "t_test_edges",
    "z_test_edges",
    "bh_adjust",
    "by_adjust",
    "adjust_pvalues",
    "resampling_pvalue",
    "interval_test_edges",
    "holm_adjust",
    "holm_verdicts",
    "z_pvalue",
    "t_pvalue",
]

ALTERNATIVES = ("two-sided", "less", "greater")


def check_alternative(alternative: str) -> None:
    """Raise ValueError for an unknown alternative."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")


def _adjust(p: np.ndarray, factor: float | None) -> np.ndarray:
    """Return step-up FDR-adjusted p-values (BH when factor is None, else BH times factor)."""
    p = np.asarray(p, dtype=np.float64)
    flat = p.ravel()
    ok = ~np.isnan(flat)
    if ((flat[ok] < 0) | (flat[ok] > 1)).any():
        raise ValueError("p-values must lie in [0, 1]")
    out = np.full(flat.shape, np.nan)
    q = flat[ok]
    m = q.size
    if m:
        order = np.argsort(q, kind="stable")
        ranked = q[order] * m / np.arange(1, m + 1)
        if factor is not None:
            ranked = ranked * factor
        # step-up: adjusted p_(i) = min_{j >= i} p_(j) m / j, capped at 1
        ranked = np.minimum.accumulate(ranked[::-1])[::-1]
        adj = np.empty(m)
        adj[order] = np.minimum(ranked, 1.0)
        out[ok] = adj
    return out.reshape(p.shape)


def bh_adjust(pvalues: np.ndarray) -> np.ndarray:
    """Return Benjamini–Hochberg adjusted p-values (reject where <= alpha)."""
    return _adjust(pvalues, None)


def by_adjust(pvalues: np.ndarray) -> np.ndarray:
    """Return Benjamini–Yekutieli adjusted p-values (valid under arbitrary dependence)."""
    m = int(np.sum(~np.isnan(np.asarray(pvalues, dtype=np.float64))))
    c_m = float(np.sum(1.0 / np.arange(1, m + 1))) if m else 1.0
    return _adjust(pvalues, c_m)


def adjust_pvalues(pvalues: np.ndarray, method: str = "bh",
                   alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Return (reject, adjusted p-values) for method 'bh' or 'by' at FDR level alpha."""
    if method in ("bh", "fdr_bh"):
        adj = bh_adjust(pvalues)
    elif method in ("by", "fdr_by"):
        adj = by_adjust(pvalues)
    else:
        raise ValueError(f"unknown FDR method {method!r}; use 'bh' or 'by'")
    with np.errstate(invalid="ignore"):
        return adj <= alpha, adj


def resampling_pvalue(null: np.ndarray, observed: np.ndarray | float,
                      alternative: str = "greater") -> np.ndarray:
    """Return (1 + #null at least as extreme) / (B + 1), never below 1/(B+1); null on last axis."""
    check_alternative(alternative)
    null = np.asarray(null, dtype=np.float64)
    obs = np.asarray(observed, dtype=np.float64)[..., None]
    b = null.shape[-1]
    ge = (null >= obs).sum(axis=-1)
    le = (null <= obs).sum(axis=-1)
    if alternative == "greater":
        return (1.0 + ge) / (b + 1.0)
    if alternative == "less":
        return (1.0 + le) / (b + 1.0)
    return np.minimum(1.0, 2.0 * (1.0 + np.minimum(ge, le)) / (b + 1.0))


@dataclass(repr=False)
class EdgeTestResult(Result):
    """Per-edge tests: statistic, p-value, FDR-adjusted p-value and rejection per edge."""

    estimate: np.ndarray
    standard_error: np.ndarray
    statistic: np.ndarray
    pvalue: np.ndarray
    pvalue_adjusted: np.ndarray
    reject: np.ndarray
    test: str
    correction: str
    alpha: float
    df: float | None = None
    edge_names: Sequence[str] | None = None
    params: dict = field(default_factory=dict)
    main_table = "edge_tests"

    def _tables(self) -> dict[str, dict[str, Any]]:
        cols: dict[str, Any] = {"edge": np.arange(self.estimate.size, dtype=np.int64)}
        if self.edge_names is not None:
            cols["edge_name"] = np.asarray(self.edge_names, dtype=str)
        cols.update(estimate=self.estimate, standard_error=self.standard_error,
                    statistic=self.statistic, pvalue=self.pvalue,
                    pvalue_adjusted=self.pvalue_adjusted, reject=self.reject)
        return {"edge_tests": cols}

    def _summary_items(self) -> list[tuple[str, Any]]:
        return [("test", self.test), ("correction", self.correction), ("alpha", self.alpha),
                ("edges", self.estimate.size), ("tests counted (non-NaN)",
                                                int(np.sum(~np.isnan(self.pvalue)))),
                ("rejected", int(np.sum(self.reject)))]


def _pvalue_from_cdf(stat: np.ndarray, sf: np.ndarray, cdf: np.ndarray,
                     alternative: str) -> np.ndarray:
    """Return p-values from survival/cdf values of a symmetric statistic."""
    if alternative == "greater":
        return sf
    if alternative == "less":
        return cdf
    return np.minimum(1.0, 2.0 * np.minimum(sf, cdf))


def t_test_edges(S: np.ndarray, popmean: float = 0.0, *, alternative: str = "two-sided",
                 correction: str = "bh", alpha: float = 0.05,
                 edge_names: Sequence[str] | None = None) -> EdgeTestResult:
    """Return one-sample t tests of each edge's mean score (S [N, E]) with FDR adjustment."""
    from .resampling import check_score_matrix

    check_alternative(alternative)
    S = check_score_matrix(S)
    n = S.shape[0]
    if n < 2:
        raise ValueError("a t test needs at least 2 examples")
    x = np.asarray(S, dtype=np.float64)
    mean = x.mean(axis=0)
    se = x.std(axis=0, ddof=1) / np.sqrt(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (mean - popmean) / se
    df = n - 1
    cdf = special.stdtr(df, t)
    sf = special.stdtr(df, -t)
    p = _pvalue_from_cdf(t, sf, cdf, alternative)
    reject, adj = adjust_pvalues(p, correction, alpha)
    return EdgeTestResult(mean, se, t, p, adj, reject, "one-sample t", correction, alpha, df,
                          edge_names, {"estimator": "t_test_edges", "popmean": popmean,
                                       "alternative": alternative, "correction": correction,
                                       "alpha": alpha, "n_obs": n})


def z_test_edges(estimate: np.ndarray, standard_error: np.ndarray, null: float = 0.0, *,
                 alternative: str = "two-sided", correction: str = "bh", alpha: float = 0.05,
                 edge_names: Sequence[str] | None = None) -> EdgeTestResult:
    """Return z tests (estimate - null) / SE per edge, e.g. with bootstrap SEs, FDR-adjusted."""
    check_alternative(alternative)
    est = np.asarray(estimate, dtype=np.float64)
    se = np.asarray(standard_error, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (est - null) / se
    p = _pvalue_from_cdf(z, special.ndtr(-z), special.ndtr(z), alternative)
    reject, adj = adjust_pvalues(p, correction, alpha)
    return EdgeTestResult(est, se, z, p, adj, reject, "z (bootstrap SE)", correction, alpha, None,
                          edge_names, {"estimator": "z_test_edges", "null": null,
                                       "alternative": alternative, "correction": correction,
                                       "alpha": alpha})


def interval_test_edges(result: Any, *, correction: str = "bh", alpha: float = 0.05
                        ) -> EdgeTestResult:
    """Return per-edge tests of mean = 0 that invert `result`'s primary interval, FDR-adjusted.

    `result` is a circuitstat.stats.intervals.BootstrapResult; its `pvalue` is the smallest
    1 - confidence level at which its interval excludes 0, so without adjustment the test and
    the interval agree about zero by construction. The statistic column is mean / bootstrap
    SE, a summary only: the p-value does not use it.
    """
    p = np.asarray(result.pvalue, dtype=np.float64)
    est = np.asarray(result.estimate, dtype=np.float64)
    se = np.asarray(result.standard_error, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        stat = est / se
    reject, adj = adjust_pvalues(p, correction, alpha)
    return EdgeTestResult(est, se, stat, p, adj, reject, f"inverted {result.method} interval",
                          correction, alpha, None, result.edge_names,
                          {"estimator": "interval_test_edges", "interval": result.method,
                           "alternative": result.alternative, "correction": correction,
                           "alpha": alpha, "n_obs": result.n_obs,
                           "estimand": result.params.get("estimand")})


# --- scalar p-values and the family-wise (Holm) adjustment of a study's claims ------------------
def z_pvalue(estimate: np.ndarray, standard_error: np.ndarray) -> np.ndarray:
    """Return two-sided normal p-values of estimate / standard_error (NaN where se is not > 0)."""
    estimate = np.asarray(estimate, dtype=np.float64)
    standard_error = np.asarray(standard_error, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(standard_error > 0, estimate / standard_error, np.nan)
    return np.where(np.isfinite(z), 2 * special.ndtr(-np.abs(z)), np.nan)


def holm_adjust(pvalues: np.ndarray) -> np.ndarray:
    """Return Holm step-down family-wise adjusted p-values (NaN entries stay NaN, not counted)."""
    pvalues = np.asarray(pvalues, dtype=np.float64)
    flat = pvalues.ravel()
    finite = ~np.isnan(flat)
    out = np.full(flat.shape, np.nan)
    ranked = flat[finite]
    m = ranked.size
    if m:
        order = np.argsort(ranked, kind="stable")
        stepped = np.maximum.accumulate(ranked[order] * (m - np.arange(m)))
        adjusted = np.empty(m)
        adjusted[order] = np.minimum(stepped, 1.0)
        out[finite] = adjusted
    return out.reshape(pvalues.shape)


def holm_verdicts(values: np.ndarray, pvalues: np.ndarray, directions: np.ndarray, alpha: float = 0.05, *,
                  lows: np.ndarray | None = None, highs: np.ndarray | None = None, resolution: float = 0.0
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Return (verdicts, Holm-adjusted p-values) of directional claims tested as one family.

    Rows with direction 0 are not claims: verdict "" and no adjusted p-value. A claim is
    "supported" when its Holm-adjusted p-value is <= alpha and its value lies on the claimed
    side (direction +1: above 0, −1: below 0), "contradicted" when significant on the other
    side, "inconclusive" otherwise (including a NaN p-value). With ``lows``/``highs`` (each row's
    interval) and a ``resolution``, a claim whose value and interval lie within ``resolution`` of 0
    is "negligible" however small its p-value (circuitstat.core.interval_words: a degenerate estimate is
    never "supported").
    """
    from circuitstat.core.interval_words import NEGLIGIBLE, is_negligible

    values = np.asarray(values, dtype=np.float64)
    directions = np.asarray(directions)
    claims = directions != 0
    adjusted = np.full(values.shape, np.nan)
    adjusted[claims] = holm_adjust(np.asarray(pvalues, dtype=np.float64)[claims])
    verdicts = np.full(values.shape, "", dtype=object)
    for i in np.flatnonzero(claims):
        if lows is not None and highs is not None and is_negligible(values[i], lows[i], highs[i], resolution):
            verdicts[i] = NEGLIGIBLE
        elif not (adjusted[i] <= alpha):
            verdicts[i] = "inconclusive"
        elif np.sign(values[i]) == directions[i]:
            verdicts[i] = "supported"
        else:
            verdicts[i] = "contradicted"
    return verdicts.astype(str), adjusted


def t_pvalue(estimate: float, standard_error: float, df: int) -> float:
    """Return the two-sided p-value of estimate / standard_error against t with ``df`` degrees of freedom."""
    if not (np.isfinite(estimate) and np.isfinite(standard_error) and standard_error > 0 and df >= 1):
        return math.nan
    return float(2 * special.stdtr(df, -abs(estimate) / standard_error))
