"""Variance components of balanced crossed random-effects designs, vectorised over edges.

The input has one axis per factor (e.g. examples x counterfactual draw x estimator x seed) and the
edges on the last axis, one observation per cell. Each main effect and interaction up to
`max_order` is a random effect; the remaining interactions are pooled with the error into
"residual" (with one observation per cell the highest interaction is always confounded with it).
Estimates are the ANOVA / method-of-moments solutions of the expected-mean-square equations
E[MS_T] = sigma_e^2 + sum_{U >= T} (prod_{i not in U} n_i) sigma_U^2. Negative estimates are
reported as they are (they say the component is small relative to its noise); truncation at
zero happens only with `truncate_negative=True`. For balanced data these equal REML estimates
whenever all are positive, which is what the statsmodels MixedLM oracle checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Sequence

import numpy as np
from scipy import stats

from .results import ConfidenceInterval, Result

__all__ = ["VarianceComponentsResult", "variance_components", "ICCResult", "icc"]


def _as_design(Y: np.ndarray, n_factors: int) -> np.ndarray:
    """Return Y as float64 with a trailing edge axis, after checking balance and finiteness."""
    Y = np.asarray(Y, dtype=np.float64)
    if Y.ndim == n_factors:
        Y = Y[..., None]
    if Y.ndim != n_factors + 1:
        raise ValueError(f"expected {n_factors} factor axes plus an edge axis, got shape {Y.shape}")
    if min(Y.shape[:-1]) < 2:
        raise ValueError(f"every factor needs at least 2 levels, got {Y.shape[:-1]}")
    if not np.isfinite(Y).all():
        raise ValueError("the design has NaN/inf cells; variance components need a complete, "
                         "balanced design (fill or drop the incomplete levels)")
    return Y


def _effects_ss(Y: np.ndarray, terms: list[tuple[int, ...]]) -> tuple[dict, np.ndarray]:
    """Return ({term: SS [E]}, residual SS [E}) by orthogonal effect decomposition."""
    n_f = Y.ndim - 1
    axes = tuple(range(n_f))
    mu = Y.mean(axis=axes, keepdims=True)
    effects: dict[tuple[int, ...], np.ndarray] = {}
    fitted = np.broadcast_to(mu, Y.shape).copy()
    ss = {}
    for t in terms:
        other = tuple(a for a in axes if a not in t)
        eff = Y.mean(axis=other, keepdims=True) - mu
        # remove every lower-order effect contained in t (all are in the model: hierarchy)
        for u in effects:
            if set(u) < set(t):
                eff = eff - effects[u]
        effects[t] = eff
        fitted += eff
        reps = int(np.prod([Y.shape[a] for a in other])) if other else 1
        ss[t] = reps * (eff**2).sum(axis=axes)
    resid = Y - fitted
    return ss, (resid**2).sum(axis=axes)


@dataclass(repr=False)
class VarianceComponentsResult(Result):
    """Per-edge variance components with SEs, Satterthwaite CIs, shares and the ANOVA table."""

    factors: list[str]
    components: dict[str, np.ndarray]  # name -> [E] estimates (raw unless truncated)
    standard_error: dict[str, np.ndarray]
    confidence_interval: dict[str, ConfidenceInterval]
    df_satterthwaite: dict[str, np.ndarray]
    shares: dict[str, np.ndarray]
    mean_squares: dict[str, np.ndarray]
    df: dict[str, int]
    ems: np.ndarray  # [terms, components] expected-mean-square coefficients
    negative: dict[str, np.ndarray]  # True where the raw estimate was < 0
    truncated: bool
    edge_names: Sequence[str] | None = None
    params: dict = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """Return the component names in table order (residual last)."""
        return list(self.components)

    @property
    def total(self) -> np.ndarray:
        """Return the total variance per edge (sum of the reported components)."""
        return np.sum([v for v in self.components.values()], axis=0)

    def _tables(self) -> dict[str, dict[str, Any]]:
        names = self.names
        e = next(iter(self.components.values())).size
        edge = np.tile(np.arange(e, dtype=np.int64), len(names))
        comp = np.repeat(np.asarray(names, dtype=str), e)
        main: dict[str, Any] = {"edge": edge}
        if self.edge_names is not None:
            main["edge_name"] = np.tile(np.asarray(self.edge_names, dtype=str), len(names))

        def stack(d: dict) -> np.ndarray:
            return np.concatenate([np.asarray(d[n]) for n in names])

        main.update(component=comp, variance=stack(self.components),
                    standard_error=stack(self.standard_error),
                    ci_low=np.concatenate([self.confidence_interval[n].low for n in names]),
                    ci_high=np.concatenate([self.confidence_interval[n].high for n in names]),
                    df_satterthwaite=stack(self.df_satterthwaite), share=stack(self.shares),
                    negative_estimate=stack(self.negative))
        anova = {"edge": edge, "term": comp,
                 "df": np.repeat([self.df[n] for n in names], e).astype(np.int64),
                 "mean_square": stack(self.mean_squares)}
        ti, ci = np.nonzero(self.ems)
        ems = {"term": np.asarray(names, dtype=str)[ti], "component": np.asarray(names,
                                                                                  dtype=str)[ci],
               "coefficient": self.ems[ti, ci]}
        return {"main": main, "anova": anova, "ems": ems}

    def _summary_items(self) -> list[tuple[str, Any]]:
        items: list[tuple[str, Any]] = [("factors", " x ".join(self.factors)),
                                        ("edges", next(iter(self.components.values())).size),
                                        ("truncate_negative", self.truncated)]
        for n in self.names:
            items.append((f"share {n} (median)", float(np.nanmedian(self.shares[n]))))
            items.append((f"negative {n} (edges)", int(np.sum(self.negative[n]))))
        return items


def variance_components(Y: np.ndarray, factors: Sequence[str], *, max_order: int | None = None,
                        truncate_negative: bool = False, confidence_level: float = 0.95,
                        edge_names: Sequence[str] | None = None) -> VarianceComponentsResult:
    """Return ANOVA variance components per edge of Y [n_1, ..., n_F, E] (balanced, crossed).

    max_order: highest interaction order estimated (default F-1); higher ones join the residual.
    """
    factors = list(factors)
    n_f = len(factors)
    if n_f < 2:
        raise ValueError("need at least 2 crossed factors (with one factor and one observation "
                         "per level there is no residual to separate from the effect)")
    if len(set(factors)) != n_f:
        raise ValueError("factor names must be unique")
    Y = _as_design(Y, n_f)
    levels = Y.shape[:-1]
    max_order = n_f - 1 if max_order is None else int(max_order)
    if not 1 <= max_order <= n_f - 1:
        raise ValueError(f"max_order must lie in [1, {n_f - 1}]: the {n_f}-way interaction is "
                         "confounded with the error when there is one observation per cell")
    terms = [t for r in range(1, max_order + 1) for t in combinations(range(n_f), r)]
    names = [":".join(factors[i] for i in t) for t in terms] + ["residual"]
    ss, ss_res = _effects_ss(Y, terms)
    df = [int(np.prod([levels[i] - 1 for i in t])) for t in terms]
    df_res = int(np.prod(levels)) - 1 - sum(df)
    if df_res < 1:
        raise ValueError("no residual degrees of freedom left; lower max_order")
    ms = np.stack([ss[t] / d for t, d in zip(terms, df)] + [ss_res / df_res])  # [terms+1, E]
    dfs = np.asarray(df + [df_res], dtype=np.float64)
    # expected mean squares: rows = mean squares, columns = components (residual last)
    nt = len(terms)
    A = np.zeros((nt + 1, nt + 1))
    for i, t in enumerate(terms):
        for j, u in enumerate(terms):
            if set(t) <= set(u):
                A[i, j] = np.prod([levels[a] for a in range(n_f) if a not in u])
        A[i, nt] = 1.0
    A[nt, nt] = 1.0
    C = np.linalg.inv(A)  # sigma^2 = C @ MS
    comps = C @ ms
    # Var(MS_j) = 2 E[MS_j]^2 / df_j; unbiased plug-in uses MS_j^2 / (df_j + 2)
    var = (C**2) @ (2 * ms**2 / (dfs[:, None] + 2))
    se = np.sqrt(var)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        nu = comps**2 / ((C**2) @ (ms**2 / dfs[:, None]))
        lo = nu * comps / stats.chi2.ppf(0.5 + confidence_level / 2, nu)
        hi = nu * comps / stats.chi2.ppf(0.5 - confidence_level / 2, nu)
    pos = comps > 0
    lo, hi = np.where(pos, lo, np.nan), np.where(pos, hi, np.nan)
    negative = comps < 0
    reported = np.maximum(comps, 0.0) if truncate_negative else comps
    total = reported.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        shares = reported / total
    params = {"estimator": "variance_components", "factors": factors, "levels": list(levels),
              "max_order": max_order, "truncate_negative": truncate_negative,
              "confidence_level": confidence_level, "method": "ANOVA (expected mean squares)"}
    return VarianceComponentsResult(
        factors=factors, components=dict(zip(names, reported)),
        standard_error=dict(zip(names, se)),
        confidence_interval={n: ConfidenceInterval(lo[i], hi[i]) for i, n in enumerate(names)},
        df_satterthwaite=dict(zip(names, nu)), shares=dict(zip(names, shares)),
        mean_squares=dict(zip(names, ms)), df=dict(zip(names, [int(d) for d in dfs])), ems=A,
        negative=dict(zip(names, negative)), truncated=truncate_negative, edge_names=edge_names,
        params=params)


# --- intraclass correlation ----------------------------------------------------------------
ICC_TYPES = ("ICC1", "ICC2", "ICC3", "ICC1k", "ICC2k", "ICC3k")
ICC_LABELS = ("ICC(1,1)", "ICC(A,1)", "ICC(C,1)", "ICC(1,k)", "ICC(A,k)", "ICC(C,k)")


@dataclass(repr=False)
class ICCResult(Result):
    """Shrout–Fleiss / McGraw–Wong ICCs per edge: estimate, F test and CI per type."""

    icc: dict[str, np.ndarray]
    F: dict[str, np.ndarray]
    df1: dict[str, float]
    df2: dict[str, np.ndarray]
    pvalue: dict[str, np.ndarray]
    confidence_interval: dict[str, ConfidenceInterval]
    n_targets: int
    n_raters: int
    edge_names: Sequence[str] | None = None
    params: dict = field(default_factory=dict)

    def _tables(self) -> dict[str, dict[str, Any]]:
        e = np.atleast_1d(self.icc["ICC1"]).size
        t = len(ICC_TYPES)
        main: dict[str, Any] = {"edge": np.tile(np.arange(e, dtype=np.int64), t)}
        if self.edge_names is not None:
            main["edge_name"] = np.tile(np.asarray(self.edge_names, dtype=str), t)

        def stack(d: dict) -> np.ndarray:
            return np.concatenate([np.broadcast_to(np.asarray(d[n], dtype=np.float64), (e,))
                                   for n in ICC_TYPES])

        main.update(type=np.repeat(np.asarray(ICC_TYPES, dtype=str), e),
                    label=np.repeat(np.asarray(ICC_LABELS, dtype=str), e), icc=stack(self.icc),
                    F=stack(self.F), df1=stack(self.df1), df2=stack(self.df2),
                    pvalue=stack(self.pvalue),
                    ci_low=stack({n: c.low for n, c in self.confidence_interval.items()}),
                    ci_high=stack({n: c.high for n, c in self.confidence_interval.items()}))
        return {"main": main}

    def _summary_items(self) -> list[tuple[str, Any]]:
        return [("targets (n)", self.n_targets), ("raters (k)", self.n_raters)] + [
            (f"{t} median", float(np.nanmedian(self.icc[t]))) for t in ICC_TYPES]


def icc(Y: np.ndarray, *, confidence_level: float = 0.95,
        edge_names: Sequence[str] | None = None) -> ICCResult:
    """Return the six ICCs of Y [n targets, k raters, E] (two-way ANOVA), as pingouin computes them."""
    Y = _as_design(Y, 2)
    n, k = Y.shape[:2]
    ss, ss_e = _effects_ss(Y, [(0,), (1,)])
    msb = ss[(0,)] / (n - 1)  # between targets
    msj = ss[(1,)] / (k - 1)  # between raters (judges)
    df2kd = (n - 1) * (k - 1)
    mse = ss_e / df2kd
    msw = (ss[(1,)] + ss_e) / (n * (k - 1))  # within targets (one-way model)
    with np.errstate(divide="ignore", invalid="ignore"):
        icc1 = (msb - msw) / (msb + (k - 1) * msw)
        icc2 = (msb - mse) / (msb + (k - 1) * mse + k * (msj - mse) / n)
        icc3 = (msb - mse) / (msb + (k - 1) * mse)
        icc1k = (msb - msw) / msb
        icc2k = (msb - mse) / (msb + (msj - mse) / n)
        icc3k = (msb - mse) / msb
        f1 = msb / msw
        f3 = msb / mse
    df1, df1kd = n - 1, n * (k - 1)
    p1 = stats.f.sf(f1, df1, df1kd)
    p3 = stats.f.sf(f3, df1, df2kd)
    a = 1 - confidence_level
    q = 1 - a / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        f1l = f1 / stats.f.ppf(q, df1, df1kd)
        f1u = f1 * stats.f.ppf(q, df1kd, df1)
        f3l = f3 / stats.f.ppf(q, df1, df2kd)
        f3u = f3 * stats.f.ppf(q, df2kd, df1)
        l1, u1 = (f1l - 1) / (f1l + k - 1), (f1u - 1) / (f1u + k - 1)
        l3, u3 = (f3l - 1) / (f3l + k - 1), (f3u - 1) / (f3u + k - 1)
        # ICC(A,1): Satterthwaite-type df v (McGraw & Wong 1996, case 2A)
        fj = msj / mse
        vn = df2kd * (k * icc2 * fj + n * (1 + (k - 1) * icc2) - k * icc2) ** 2
        vd = df1 * k**2 * icc2**2 * fj**2 + (n * (1 + (k - 1) * icc2) - k * icc2) ** 2
        v = vn / vd
        f2u = stats.f.ppf(q, n - 1, v)
        f2l = stats.f.ppf(q, v, n - 1)
        l2 = n * (msb - f2u * mse) / (f2u * (k * msj + (k * n - k - n) * mse) + n * msb)
        u2 = n * (f2l * msb - mse) / (k * msj + (k * n - k - n) * mse + n * f2l * msb)
    cis = {"ICC1": (l1, u1), "ICC2": (l2, u2), "ICC3": (l3, u3),
           "ICC1k": (1 - 1 / f1l, 1 - 1 / f1u),
           "ICC2k": (l2 * k / (1 + l2 * (k - 1)), u2 * k / (1 + u2 * (k - 1))),
           "ICC3k": (1 - 1 / f3l, 1 - 1 / f3u)}
    vals = dict(zip(ICC_TYPES, (icc1, icc2, icc3, icc1k, icc2k, icc3k)))
    Fs = {"ICC1": f1, "ICC2": f3, "ICC3": f3, "ICC1k": f1, "ICC2k": f3, "ICC3k": f3}
    d2 = {"ICC1": df1kd, "ICC2": df2kd, "ICC3": df2kd, "ICC1k": df1kd, "ICC2k": df2kd,
          "ICC3k": df2kd}
    ps = {"ICC1": p1, "ICC2": p3, "ICC3": p3, "ICC1k": p1, "ICC2k": p3, "ICC3k": p3}

    def sq(x: Any) -> Any:
        x = np.asarray(x, dtype=np.float64)
        return x[0] if x.shape == (1,) and Y.shape[-1] == 1 else x

    params = {"estimator": "icc", "n_targets": n, "n_raters": k,
              "confidence_level": confidence_level, "reference": "Shrout & Fleiss 1979; "
              "McGraw & Wong 1996; CIs as pingouin.intraclass_corr"}
    return ICCResult(icc={t: sq(v) for t, v in vals.items()}, F={t: sq(v) for t, v in Fs.items()},
                     df1={t: float(df1) for t in ICC_TYPES},
                     df2={t: float(v) for t, v in d2.items()},
                     pvalue={t: sq(v) for t, v in ps.items()},
                     confidence_interval={t: ConfidenceInterval(sq(lo), sq(hi))
                                          for t, (lo, hi) in cis.items()},
                     n_targets=n, n_raters=k, edge_names=edge_names, params=params)
