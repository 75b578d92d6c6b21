"""Verified runs: per-edge intervals for the mean *exact* effect from an approximation plus exact on a subset.

Phase 1 computes an approximation (EAP, EAP-IG, AtP*) on all N prompts; phase 2 computes exact patching
on a uniformly random subset of n of them (drawn from a recorded seed by the caller). `verified_means`
takes both as arrays and returns a `VerifiedResult`: per edge the PPI++ estimate of the mean exact
effect (circuitstat.stats.verified.ppi), its interval in the small-n form the coverage study chose, the p-value
inverting that interval, BH (or BY) q-values over edges (circuitstat.stats.testing), the power-tuning weight, the
approximation's own mean beside it (a different estimand, labelled so) and a reliability flag
(circuitstat.stats.verified.reliability).

The N − n unlabelled prompts play PPI++'s unlabelled sample: the subset is uniformly random among
i.i.d. prompts, so labelled and unlabelled prompts are independent samples of the prompt distribution,
the setting PPI++ and its reference implementation assume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.results import ConfidenceInterval, Result

from .ppi import DEFAULT_INTERVAL, DEFAULT_TUNING, INTERVALS, TUNINGS, ppi_fit, ppi_intervals
from .reliability import verified_reliability

__all__ = ["VerifiedResult", "verified_means", "verified_estimand", "labelled_rows", "labelled_split"]


def verified_estimand(n: int, N: int) -> str:
    """Return the words every verified interval carries: what it covers and on how many prompts."""
    return f"mean exact effect, verified on {n} of {N} prompts"


@dataclass(repr=False)
class VerifiedResult(Result):
    """Per-edge PPI++ estimates of the mean exact effect: conf_int(), summary(), to_table() ("verified")."""

    estimate: np.ndarray
    standard_error: np.ndarray
    confidence_interval: ConfidenceInterval
    df: np.ndarray
    lam: np.ndarray
    pvalue: np.ndarray
    qvalue: np.ndarray
    approx_mean: np.ndarray
    rectifier_share: np.ndarray
    approx_tail_share: np.ndarray
    width_ratio: np.ndarray
    estimate_crossfit: np.ndarray
    reliable: np.ndarray
    n_labelled: int
    n_prompts: int
    confidence_level: float
    interval: str
    tuning: str
    correction: str
    edge_names: Sequence[str] | None = None
    params: dict = field(default_factory=dict)
    #: several predictors (circuitstat.stats.verified.multi): their names and coefficients [E, p]; ``lam`` is their sum
    predictors: tuple[str, ...] | None = None
    coefficients: np.ndarray | None = None
    #: interval width over the estimated width of exact on all N prompts (the flag's second width rule)
    width_vs_exact_all: np.ndarray | None = None
    #: a certain upper bound on the interval's width over exact on all N prompts' t interval (reliability.py)
    width_vs_exact_all_max: np.ndarray | None = None
    main_table = "verified"

    @property
    def estimand(self) -> str:
        """Return what the intervals cover, e.g. "mean exact effect, verified on 16 of 512 prompts"."""
        return verified_estimand(self.n_labelled, self.n_prompts)

    def _tables(self) -> dict[str, dict[str, Any]]:
        E = self.estimate.size
        cols: dict[str, Any] = {"edge": np.arange(E, dtype=np.int64)}
        if self.edge_names is not None:
            cols["edge_name"] = np.asarray(self.edge_names, dtype=str)
        cols.update(estimate=self.estimate, standard_error=self.standard_error,
                    ci_low=self.confidence_interval.low, ci_high=self.confidence_interval.high, df=self.df,
                    pvalue=self.pvalue, qvalue=self.qvalue, lam=self.lam, approx_mean=self.approx_mean,
                    rectifier_share=self.rectifier_share, approx_tail_share=self.approx_tail_share,
                    width_vs_exact_on_labelled=self.width_ratio, estimate_crossfit=self.estimate_crossfit)
        if self.width_vs_exact_all is not None:
            cols["width_vs_exact_on_all"] = self.width_vs_exact_all
        if self.width_vs_exact_all_max is not None:
            cols["width_vs_exact_on_all_max"] = self.width_vs_exact_all_max
        cols.update(no_tail_seen=self.reliable, n_labelled=np.full(E, self.n_labelled, dtype=np.int64),
                    n_prompts=np.full(E, self.n_prompts, dtype=np.int64),
                    estimand=np.full(E, self.estimand, dtype=object))
        if self.coefficients is None or self.predictors is None:
            return {"verified": cols}
        return {"verified": cols, "verified_coefficients": self._coefficient_columns()}

    def _coefficient_columns(self) -> dict[str, Any]:
        """The verified_coefficients columns: one row per edge and predictor (edge-major), with the design's name."""
        E, p = self.coefficients.shape
        out: dict[str, Any] = {"edge": np.repeat(np.arange(E, dtype=np.int64), p)}
        if self.edge_names is not None:
            out["edge_name"] = np.repeat(np.asarray(self.edge_names, dtype=str), p)
        out.update(predictor=np.tile(np.asarray(self.predictors, dtype=object), E),
                   coefficient=np.asarray(self.coefficients, np.float64).reshape(-1),
                   design=np.full(E * p, str(self.params.get("method", "")), dtype=object))
        return out

    def _summary_items(self) -> list[tuple[str, Any]]:
        level = self.confidence_level
        with np.errstate(invalid="ignore"):
            rejected = int(np.sum(self.qvalue <= 1 - level))
        if self.predictors is not None and self.coefficients is not None:
            lam = [("design", self.params.get("method", "")), *((f"median λ ({name})", float(np.median(c)))
                                                                for name, c in zip(self.predictors, self.coefficients.T))]
        else:
            lam = [("median λ", float(np.median(self.lam)))]
        return [("estimand", self.estimand), ("interval", f"{self.interval} ({level:.0%}), λ tuning {self.tuning}"),
                ("edges", self.estimate.size), *lam,
                ("no tail seen (not: covers)", f"{int(self.reliable.sum())} of {self.reliable.size}"),
                (f"q <= {1 - level:g} ({self.correction.upper()})", rejected)]


def labelled_rows(labelled: Any, N: int) -> np.ndarray:
    """Return the labelled row indices as int64; ValueError for duplicates, out-of-range or too few/many rows."""
    rows = np.asarray(labelled)
    if rows.dtype == bool:
        if rows.shape != (N,):
            raise InputError(f"a boolean labelled mask must have one entry per prompt ({N}), got {rows.shape}")
        rows = np.flatnonzero(rows)
    if rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
        raise InputError("labelled must be the row indices (or a boolean mask) of the exactly patched prompts")
    if rows.size and (rows.min() < 0 or rows.max() >= N):
        raise InputError(f"labelled row indices must lie in [0, {N}); the approximation has {N} prompts")
    if np.unique(rows).size != rows.size:
        raise InputError("labelled row indices repeat a prompt; each prompt is patched exactly once")
    if N - rows.size < 2:
        raise InputError(f"{rows.size} of {N} prompts are labelled: keep at least 2 unlabelled, or use exact "
                         "patching's own intervals")
    return rows.astype(np.int64)


def labelled_split(exact: Any, labelled: Any, N: int, E: int, edge_names: Sequence[str] | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (labelled rows, exact [n, E] float64, the unlabelled mask [N]) of a verified fit's inputs; InputError
    for a shape that does not match the N prompts and E edges of the approximation, or edge names of another length."""
    rows = labelled_rows(labelled, N)
    Y = np.asarray(exact, dtype=np.float64)
    if Y.shape != (rows.size, E):
        raise InputError(f"exact must be [n labelled = {rows.size}, E = {E}] (one row per labelled prompt, in "
                         f"the order of `labelled`), got {Y.shape}")
    if edge_names is not None and len(edge_names) != E:
        raise InputError(f"{len(edge_names)} edge names for {E} edges")
    unlabelled = np.ones(N, dtype=bool)
    unlabelled[rows] = False
    return rows, Y, unlabelled


def verified_means(approx: np.ndarray, exact: np.ndarray, labelled: Any, *, confidence_level: float = 0.95,
                   interval: str = DEFAULT_INTERVAL, tuning: str = DEFAULT_TUNING, correction: str = "bh",
                   edge_names: Sequence[str] | None = None, crossfit_pvalues: bool = True) -> VerifiedResult:
    """Return per-edge PPI++ intervals for the mean exact effect (a VerifiedResult).

    ``approx`` [N, E]: the approximation on all N prompts; ``exact`` [n, E]: exact patching on the
    prompts ``labelled`` (n row indices into ``approx``, or a boolean mask), in that order. The
    labelled prompts must be a uniformly random subset; the others are PPI++'s unlabelled sample.
    ``crossfit_pvalues``: p- and q-values test mean = 0 with the cross-fitted estimate (λ̂ left out per
    labelled prompt, circuitstat.stats.verified.crossfit: unbiased, slightly wider) in the same interval form;
    the interval and ``estimate`` keep λ̂ fitted on all n (narrower; biased by up to 0.5 SD on heavy tails).
    """
    from circuitstat.stats.testing import adjust_pvalues

    from .crossfit import crossfit_fit

    A = np.asarray(approx, dtype=np.float64)
    if A.ndim != 2:
        raise InputError(f"approx must be [N prompts, E edges], got shape {A.shape}")
    if interval not in INTERVALS or tuning not in TUNINGS:
        raise InputError(f"interval must be one of {INTERVALS} and tuning one of {TUNINGS}; got {interval!r}, "
                         f"{tuning!r}")
    N, E = A.shape
    rows, Y, unlabelled = labelled_split(exact, labelled, N, E, edge_names)
    fit = ppi_fit(Y, A[rows], A[unlabelled], tuning=tuning)
    ci = ppi_intervals(fit, interval, confidence_level)
    cf = crossfit_fit(Y, A[rows], A[unlabelled], tuning=tuning)
    p = ppi_intervals(cf, interval, confidence_level)["pvalue"] if crossfit_pvalues else ci["pvalue"]
    _, q = adjust_pvalues(p, correction, 1 - confidence_level)
    rel = verified_reliability(fit, ci["high"] - ci["low"], confidence_level)
    params = {"estimator": "verified_means", "method": "PPI++ (power-tuned, λ per edge)", "interval": interval,
              "tuning": tuning, "confidence_level": confidence_level, "correction": correction,
              "pvalues": "cross-fitted λ (leave one out)" if crossfit_pvalues else "λ fitted on all labelled prompts",
              "n_labelled": int(rows.size), "n_prompts": N, "estimand": verified_estimand(int(rows.size), N)}
    return VerifiedResult(fit.estimate, ci["standard_error"], ConfidenceInterval(ci["low"], ci["high"]), ci["df"],
                          fit.lam, p, q, A.mean(0), rel["rectifier_share"], rel["approx_tail_share"],
                          rel["width_ratio"], cf.estimate, rel["reliable"], int(rows.size), N, float(confidence_level),
                          interval, tuning, correction, edge_names, params,
                          width_vs_exact_all=rel["width_vs_exact_all"],
                          width_vs_exact_all_max=rel.get("width_vs_exact_all_max"))
