"""Several approximations as control variates: PPI++ with p predictors, coefficients cross-fitted and shrunk across edges.

Per edge, with Y exact on the n labelled prompts and Ŷ = (Ŷ¹ … Ŷᵖ) the p approximations (EAP, atp-qkfix, …) on
every prompt, the multivariate PPI++ estimate of the mean (Angelopoulos, Duchi & Zrnic 2023, "PPI++", arXiv
2311.01453, §2 with a vector of predictions; the regression/control-variate estimator of two-phase sampling,
Cochran 1977, Sampling Techniques §12.6) is

    θ̂ = λᵀ mean_U(Ŷ) + mean_L(Y − λᵀŶ),      λ* = Var(Ŷ)⁻¹ Cov(Ŷ, Y) / (1 + n / N_u),

U the N_u unlabelled prompts. With one λ for all labelled prompts this is the control-variate form
mean_L(Y − βᵀŶ) + βᵀ mean_all(Ŷ) with β = λ N / N_u (β* is the regression slope); the mean_U form is the one that
stays unbiased when λ differs between folds (below), so it is the one computed.

**Cross-fitted** (cross-prediction PPI, Zrnic & Candès 2024, PNAS 121(15), arXiv 2309.16598; the cross-fitting of
Chernozhukov et al. 2018): the labelled prompts are split into K folds (prompt i in fold i mod K: the labelled
prompts are a uniformly random subset, so any fixed split is a random one); fold k's coefficients λₖ are fitted on
the other folds' labelled prompts only, and prompt i in fold k contributes λₖᵀ mean_U(Ŷ) + Yᵢ − λₖᵀŶᵢ. Each
contribution is unbiased for the mean exact effect: λₖ is a function of the other folds' prompts, independent of
prompt i and of U, and E[mean_U(Ŷ) − Ŷᵢ] = 0. K = 1 is the in-sample fit (biased under heavy tails; kept as the
negative control and labelled so); K = n is leave-one-out (crossfit.py's λ̂₋ᵢ for p = 1, without its clip).

**Learned across edges** (shrinkage toward a pooled coefficient): on fold k's training prompts, per edge the
moments S_e = Var(Ŷ) [p × p] and c_e = Cov(Ŷ, Y) [p]; the pooled slope β_pool = (Σ_e S_e / v_e)⁻¹ Σ_e c_e / v_e,
v_e = Var(Y_e) (each edge's normal equations scaled to unit exact variance, so every varying edge weighs the same
whatever its scale; edges with constant exact scores are left out of the pool); each edge's slope

    β_e = (m_t S_e + m D_e)⁻¹ (m_t c_e + m D_e β_pool),      D_e = diag(S_e),  m_t = training prompts,

the least-squares slope with a ridge penalty m (β − β_pool)ᵀ D_e (β − β_pool): m pseudo-prompts' worth of prior
at the pooled slope, in each predictor's own scale (with uncorrelated predictors, β_e,j = (m_t β̂_e,j + m β_pool,j)
/ (m_t + m)). m = 0 is per-edge OLS, m = inf the pooled slope for every edge. Legitimate for unbiasedness because
β_pool is computed per fold from the training folds only: the held-out fold's prompts enter no coefficient applied
to them, on any edge (pooling over edges of the same prompts would otherwise carry the held-out prompts' errors
in through the other edges). λₖ = β / (1 + m_t / N_u) (PPI++'s factor, as power_tuning's with the training size).
Coefficients are not clipped (ppi.py clips one λ to [0, 1]; a vector has no such natural box, and with two
approximations of one quantity a negative weight on one is a legitimate fit).

**Variance and interval**: conditional on the coefficients the labelled and unlabelled parts are independent, so
Var(θ̂) = Var_U(λ̄ᵀŶ) / N_u + Var_L(Y − λ_{k(i)}ᵀŶᵢ) / n, λ̄ the coefficients averaged over the labelled prompts.
That is a PPIFit with the combined predictor λ̄ᵀŶ (weight 1) and the rectifier rᵢ = Yᵢ − λ_{k(i)}ᵀŶᵢ, so the interval
forms of ppi.py apply unchanged (the default tkb: Student-t, Welch–Satterthwaite, the rectifier's df lowered by its
excess kurtosis). Degrees of freedom: one per coefficient, n − 1 − p for the rectifier (as crossfit.py does for
p = 1; cross-fitted residuals are not shrunk by their own fit, so this is conservative by about p df; the variance
about the grand mean also counts the spread between folds' coefficients, which the estimate carries too).
Measured in docs/verified.md ("Several predictors").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.results import ConfidenceInterval

from .ppi import (DEFAULT_INTERVAL, INTERVALS, PPIFit, column_excess_kurtosis, ppi_fit, ppi_intervals,
                  yardstick_sd)
from .reliability import approx_tail_share, verified_reliability
from .result import VerifiedResult, labelled_split, verified_estimand

__all__ = ["MULTI_SHRINK", "MULTI_FOLDS", "MultiFit", "multi_label", "pooled_slope", "shrunk_slopes", "multi_fit",
           "stack_predictors", "single_design", "multi_design", "verified_means_multi"]

#: m, the pseudo-prompts' worth of prior at the pooled slope (module docstring); chosen on planted background 3
#: with EAP and atp-qkfix (docs/make_verified_multi.py: the smallest median width with pooled coverage in
#: 0.93-0.98 at n = 16, 32, 51), reported on the other populations
MULTI_SHRINK = 4.0
#: K, the folds over the labelled prompts (None: leave-one-out, K = n); chosen with MULTI_SHRINK
MULTI_FOLDS: int | None = None


@dataclass
class MultiFit:
    """A multi-predictor fit: ``fit`` feeds ppi.py's interval forms; ``lam`` [E, p] the mean coefficients."""

    fit: PPIFit
    lam: np.ndarray         # [E, p]: coefficients averaged over the labelled prompts (λ̄)
    lam_folds: np.ndarray   # [K, E, p]: each fold's coefficients
    folds: int
    shrink: float
    label: str


def multi_label(p: int, folds: int, n: int, shrink: float) -> str:
    """Return the design's name, e.g. "PPI++, 2 predictors, cross-fitted β (K = 2), shrunk across edges (m = 8)"."""
    fit = ("β fitted in-sample (biased)" if folds == 1 else
           f"cross-fitted β (K = {folds}{', leave-one-out' if folds == n else ''})")
    pool = ("β per edge" if shrink == 0 else "β pooled over edges" if np.isinf(shrink) else
            f"shrunk across edges (m = {shrink:g})")
    return f"PPI++, {p} predictor{'s' if p != 1 else ''}, {fit}, {pool}"


def _moments(Y: np.ndarray, H: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (S [E, p, p], c [E, p], v [E]): Var(Ŷ), Cov(Ŷ, Y), Var(Y) per edge over the rows (divisor rows)."""
    m = Y.shape[0]
    yc, hc = Y - Y.mean(0), H - H.mean(0)
    return (np.einsum("iep,ieq->epq", hc, hc) / m, np.einsum("iep,ie->ep", hc, yc) / m, (yc * yc).sum(0) / m)


def pooled_slope(S: np.ndarray, c: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Return β_pool [p]: the slope of the edges' normal equations summed, each over Var(Y_e) (constant edges out)."""
    scale = np.max(v) if v.size else 0.0
    w = np.where(v > 1e-12 * scale, 1.0 / np.where(v > 0, v, 1.0), 0.0) if scale > 0 else np.zeros_like(v)
    return np.linalg.pinv(np.einsum("e,epq->pq", w, S)) @ np.einsum("e,ep->p", w, c)


def shrunk_slopes(Y: np.ndarray, H: np.ndarray, shrink: float) -> np.ndarray:
    """Return β [E, p]: each edge's slope of Y on Ŷ over the rows, shrunk toward the pooled slope by ``shrink`` (m)."""
    S, c, v = _moments(Y, H)
    p = H.shape[2]
    if np.isinf(shrink):
        return np.broadcast_to(pooled_slope(S, c, v), c.shape).copy()
    A, b = Y.shape[0] * S, Y.shape[0] * c
    if shrink > 0:
        D = np.einsum("epp->ep", S) * shrink
        A = A + D[:, :, None] * np.eye(p)
        b = b + D * pooled_slope(S, c, v)
    # pinv: a predictor constant on an edge (EAP identically 0 on a saturated attention) gets slope 0 there
    return np.einsum("epq,eq->ep", np.linalg.pinv(A), b)


def stack_predictors(approx: dict[str, np.ndarray] | np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
    """Return (approximations [N, E, p] float64, names): from {name: [N, E]} or an [N, E, p] array."""
    if isinstance(approx, dict):
        if not approx:
            raise InputError("give at least one approximation: {name: scores [N, E]}")
        arrays = [np.asarray(a, np.float64) for a in approx.values()]
        if any(a.ndim != 2 or a.shape != arrays[0].shape for a in arrays):
            raise InputError(f"every approximation must be [N prompts, E edges] of one shape; got "
                             f"{[a.shape for a in arrays]}")
        return np.stack(arrays, axis=2), tuple(str(k) for k in approx)
    H = np.asarray(approx, np.float64)
    if H.ndim != 3:
        raise InputError(f"approximations must be [N, E, p] (or a dict of [N, E]), got shape {H.shape}")
    return H, tuple(f"approx{j}" for j in range(H.shape[2]))


def _check(Y: np.ndarray, H: np.ndarray, Hu: np.ndarray, folds: int, shrink: float) -> None:
    """Raise InputError naming a shape, size, fold or NaN problem."""
    n, E = Y.shape
    if H.shape[:2] != (n, E) or H.ndim != 3 or Hu.ndim != 3 or Hu.shape[1:] != H.shape[1:]:
        raise InputError(f"need exact [n, E], approximations on the same prompts [n, E, p] and on the unlabelled "
                         f"ones [N_u, E, p]; got {Y.shape}, {H.shape}, {Hu.shape}")
    p = H.shape[2]
    if not 1 <= folds <= n:
        raise InputError(f"folds must lie in [1, n = {n}] (1: in-sample, n: leave-one-out), got {folds}")
    train = n - (-(-n // folds) if folds > 1 else 0)
    if train < p + 2:
        raise InputError(f"{train} training prompts per fold cannot fit {p} coefficients and a mean; use fewer "
                         f"folds or predictors, or verify more prompts")
    if Hu.shape[0] < 2:
        raise InputError(f"need at least 2 unlabelled prompts, got {Hu.shape[0]}")
    if not (shrink >= 0):
        raise InputError(f"shrink must be >= 0 (0: per edge, inf: pooled), got {shrink}")
    for label, a in (("exact", Y), ("approximations (labelled)", H), ("approximations (unlabelled)", Hu)):
        if not np.isfinite(a).all():
            raise InputError(f"the {label} scores contain NaN or infinite values; drop or recompute those prompts")


def multi_fit(Y: np.ndarray, H: np.ndarray, Hu: np.ndarray, *, folds: int | None = MULTI_FOLDS,
              shrink: float = MULTI_SHRINK) -> MultiFit:
    """Return the cross-fitted multi-predictor PPI++ fit (module docstring): Y [n, E], H [n, E, p], Hu [N_u, E, p]."""
    Y, H, Hu = (np.asarray(a, np.float64) for a in (Y, H, Hu))
    if Y.ndim != 2:
        raise InputError(f"exact must be [n labelled prompts, E edges], got shape {Y.shape}")
    folds = Y.shape[0] if folds is None else folds
    _check(Y, H, Hu, int(folds), float(shrink))
    n, E, p = H.shape
    N_u, K = Hu.shape[0], int(folds)
    fold = np.arange(n) % K
    lam_folds = np.empty((K, E, p))
    for k in range(K):
        train = fold != k if K > 1 else np.ones(n, dtype=bool)
        m_t = int(train.sum())
        lam_folds[k] = shrunk_slopes(Y[train], H[train], float(shrink)) / (1.0 + m_t / N_u)
    lam_i = lam_folds[fold]                                   # [n, E, p]: each prompt's held-out coefficients
    rect = Y - np.einsum("iep,iep->ie", lam_i, H)
    lam = lam_i.mean(0)
    Z = np.einsum("iep,ep->ie", Hu, lam)                      # the combined predictor on the unlabelled prompts
    mu = Z.mean(0)
    fit = PPIFit(mu + rect.mean(0), np.ones(E), mu, Z.var(0, ddof=1), column_excess_kurtosis(Z), approx_tail_share(Z),
                 rect, n, N_u, True, "labelled", yardstick_sd(Y, H, np.concatenate([H, Hu])), n_coefficients=p,
                 exact_sd=Y.std(0, ddof=1))
    return MultiFit(fit, lam, lam_folds, K, float(shrink), multi_label(p, K, n, float(shrink)))


def single_design(j: int) -> Callable[[np.ndarray, np.ndarray, np.ndarray], PPIFit]:
    """Return a design for coverage.simulate_designs: ppi.py's single-predictor PPI++ (defaults) on predictor j."""
    return lambda Y, H, Hu: ppi_fit(Y, H[:, :, j], Hu[:, :, j])


def multi_design(cols: Sequence[int], folds: int | None = MULTI_FOLDS, shrink: float = MULTI_SHRINK
                 ) -> Callable[[np.ndarray, np.ndarray, np.ndarray], PPIFit]:
    """Return a design for coverage.simulate_designs: ``multi_fit`` on predictors ``cols``."""
    c = list(cols)
    return lambda Y, H, Hu: multi_fit(Y, H[:, :, c], Hu[:, :, c], folds=folds, shrink=shrink).fit


def verified_means_multi(approx: dict[str, np.ndarray], exact: np.ndarray, labelled: Any, *,
                         folds: int | None = MULTI_FOLDS, shrink: float = MULTI_SHRINK,
                         confidence_level: float = 0.95, interval: str = DEFAULT_INTERVAL, correction: str = "bh",
                         edge_names: Sequence[str] | None = None) -> VerifiedResult:
    """Return per-edge intervals for the mean exact effect from several approximations at once (a VerifiedResult).

    ``approx``: {method: scores [N, E]} on all N prompts (the same prompts and edge order); ``exact`` [n, E] on the
    prompts ``labelled`` (row indices or a boolean mask, in that order; a uniformly random subset), as
    ``verified_means``. The estimate, interval and p-value come from one cross-fitted fit (folds >= 2: unbiased);
    with ``folds=1`` (in-sample, biased) the p-values use the leave-one-out fit, as verified_means' do.
    ``lam`` is the sum of the coefficients (0: exact only); ``coefficients`` [E, p] holds each, ``approx_mean``
    the first approximation's own mean.
    """
    from circuitstat.stats.testing import adjust_pvalues

    H, names = stack_predictors(approx)
    N, E, p = H.shape
    if interval not in INTERVALS:
        raise InputError(f"interval must be one of {INTERVALS}, got {interval!r}")
    rows, Y, unlabelled = labelled_split(exact, labelled, N, E, edge_names)
    mf = multi_fit(Y, H[rows], H[unlabelled], folds=folds, shrink=shrink)
    ci = ppi_intervals(mf.fit, interval, confidence_level)
    cf = mf if mf.folds > 1 else multi_fit(Y, H[rows], H[unlabelled], folds=None, shrink=shrink)
    pvalue = ci["pvalue"] if cf is mf else ppi_intervals(cf.fit, interval, confidence_level)["pvalue"]
    _, q = adjust_pvalues(pvalue, correction, 1 - confidence_level)
    rel = verified_reliability(mf.fit, ci["high"] - ci["low"], confidence_level)
    n = int(rows.size)
    params = {"estimator": "verified_means_multi", "method": mf.label, "predictors": list(names),
              "folds": mf.folds, "shrink": mf.shrink, "interval": interval, "tuning": "labelled",
              "confidence_level": confidence_level, "correction": correction,
              "pvalues": ("the interval's cross-fitted fit" if cf is mf
                          else "leave-one-out fit (the interval's is in-sample)"),
              "lam": "sum of the predictors' coefficients (each: coefficients)",
              "approx_mean": f"{names[0]}'s own mean over all N", "n_labelled": n, "n_prompts": N,
              "estimand": verified_estimand(n, N)}
    return VerifiedResult(mf.fit.estimate, ci["standard_error"], ConfidenceInterval(ci["low"], ci["high"]), ci["df"],
                          mf.lam.sum(1), pvalue, q, H[:, :, 0].mean(0), rel["rectifier_share"],
                          rel["approx_tail_share"], rel["width_ratio"], cf.fit.estimate, rel["reliable"], n, N,
                          float(confidence_level), interval, "labelled", correction, edge_names, params, names, mf.lam,
                          width_vs_exact_all=rel["width_vs_exact_all"],
                          width_vs_exact_all_max=rel.get("width_vs_exact_all_max"))
