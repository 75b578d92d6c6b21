"""Approximation error: how well an approximate attribution (EAP, EAP-IG, ...) tracks exact patching.

Per edge: bias, error SD and the per-example regression of approximate on exact scores (slope,
intercept, R²). Overall: rank agreement of the mean scores (Spearman, Kendall), the pooled
per-example regression, the mean error, and the overlap of the top-k circuits. Arrays only: the
audit and the variance study call this with score matrices and add method names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from circuitstat.core.results import Result
from circuitstat.core.topk import TIE_RULE, topk

__all__ = ["ApproximationResult", "approximation_agreement"]


@dataclass(repr=False)
class ApproximationResult(Result):
    """Per-edge error of approximate scores against exact ones, and a one-row summary."""

    per_edge: dict[str, np.ndarray]
    summary_row: dict[str, float]
    edge_names: Sequence[str] | None = None
    params: dict = field(default_factory=dict)
    main_table = "approximation_agreement"

    def _tables(self) -> dict[str, dict[str, Any]]:
        E = self.per_edge["bias"].size
        per = {"edge": np.arange(E, dtype=np.int64)}
        if self.edge_names is not None:
            per["name"] = list(self.edge_names)
        per.update(self.per_edge)
        summ = {k: [v] for k, v in self.summary_row.items()}
        return {"approximation_agreement": summ, "approximation_edges": per}

    def _summary_items(self) -> list[tuple[str, Any]]:
        s = self.summary_row
        return [("Spearman of mean scores", s["spearman"]), ("Kendall of mean scores", s["kendall"]),
                ("pooled per-example R^2", s["r2"]), (f"top-{s['k']} overlap", s["top_k_overlap"])]


def approximation_agreement(exact: np.ndarray, approx: np.ndarray, k: int, *, ranking: str, seed: Any = 0,
                            edge_names: Sequence[str] | None = None) -> ApproximationResult:
    """Return the agreement of ``approx`` [N, E] with ``exact`` [N, E] (same prompts, same edges).

    top_k_overlap: share of exact's top-k circuit (of mean scores, ``ranking`` signed or absolute)
    that the approximation's top-k circuit contains; ties are broken at random from ``seed`` (the
    project's one top-k, circuitstat.core.topk).
    """
    from scipy import stats as sps

    s, a = np.asarray(exact, np.float64), np.asarray(approx, np.float64)
    if s.shape != a.shape or s.ndim != 2:
        raise ValueError(f"exact and approx must be [N, E] of the same shape, got {s.shape} and {a.shape}")
    N = s.shape[0]
    err = a - s
    sm, am = s.mean(0), a.mean(0)
    sc, ac = s - sm, a - am
    sxx, sxy, syy = (sc * sc).sum(0), (sc * ac).sum(0), (ac * ac).sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(sxx > 0, sxy / sxx, np.nan)
        r2 = np.where((sxx > 0) & (syy > 0), sxy**2 / (sxx * syy), np.nan)
    per_edge = {"exact_mean": sm, "approx_mean": am, "bias": err.mean(0),
                "error_sd": err.std(0, ddof=1) if N > 1 else np.full(s.shape[1], np.nan),
                "slope": slope, "intercept": am - slope * sm, "r2": r2}
    tk_s, tk_a = topk(sm, k, ranking=ranking, seed=seed), topk(am, k, ranking=ranking, seed=seed)
    top_s, top_a = set(tk_s.indices.tolist()), set(tk_a.indices.tolist())
    flat_s, flat_a = s.ravel(), a.ravel()
    fit = sps.linregress(flat_s, flat_a) if np.ptp(flat_s) > 0 else None
    summary = {"spearman": float(sps.spearmanr(sm, am).statistic), "kendall": float(sps.kendalltau(sm, am).statistic),
               "slope": float(fit.slope) if fit else np.nan, "r2": float(fit.rvalue**2) if fit else np.nan,
               "bias_mean": float(err.mean()), "top_k_overlap": len(top_s & top_a) / k, "k": int(k),
               "tie_rule": TIE_RULE, "cutoff_ties": int(tk_s.n_tied_at_cutoff),
               "cutoff_ties_approx": int(tk_a.n_tied_at_cutoff)}
    return ApproximationResult(per_edge, summary, edge_names,
                               {"estimator": "approximation_agreement", "k": int(k), "ranking": ranking, "n": N})
