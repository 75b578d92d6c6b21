"""Fieller's confidence set for a ratio of means, the faithfulness of a fixed circuit (issue 47, item 7).

Faithfulness f = (m̄(C) − m̄(∅)) / (m̄(M) − m̄(∅)) is a ratio of means θ = μ_a / μ_b with a_i = m_i(C) − m_i(∅) and
b_i = m_i(M) − m_i(∅). Fieller (1954) inverts the t-test of the linear combination a − θ b, whose mean is 0 at the
true θ: the set {θ : (ā − θ b̄)² ≤ t² (v_aa − 2θ v_ab + θ² v_bb)}, with v the variances and covariance of the means
and t the (1 − α/2) quantile of Student's t on N − 1 (or G − 1 clusters) degrees of freedom. With
A = b̄² − t² v_bb, B = ā b̄ − t² v_ab, C = ā² − t² v_aa and D = B² − A C the set is

* **bounded**, [(B − √D)/A, (B + √D)/A], when A > 0, i.e. when the denominator's own t statistic exceeds t;
* a **union** of two rays (−∞, (B + √D)/A] ∪ [(B − √D)/A, ∞) when A < 0 and D > 0;
* the whole line (**unbounded**) when A < 0 and D ≤ 0.

The last two say what a percentile interval of the ratio hides when it explodes: the full model's effect over the
empty circuit is not distinguishable from 0 on these prompts, so no finite interval covers f at the stated level
(Gleser & Hwang 1987: any interval of a ratio that is always bounded has coverage 0 in the worst case). A table
stores the hull (−∞/+∞ ends) and says which case it is; a claim bounding f_ci_low then fails, as it should.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

from circuitstat.core.errors import InputError

__all__ = ["FIELLER_ESTIMAND", "FiellerInterval", "fieller_faithfulness", "fieller_interval", "fieller_note",
           "fieller_over_plan", "UNDISTINGUISHABLE"]

#: the verdict when the denominator is not distinguishable from 0 (the set is a union or the whole line)
UNDISTINGUISHABLE = "the full model's effect over the empty circuit is not distinguishable from 0 on these prompts"
FIELLER_ESTIMAND = ("faithfulness of this fixed circuit: the ratio (circuit − empty) / (full − empty) of mean effects "
                    "on the prompt distribution (selection not included)")


@dataclass(frozen=True)
class FiellerInterval:
    """Fieller sets per ratio: the hull [low, high] (±inf when unbounded), the shape and the union's inner ends."""

    estimate: np.ndarray  # [C] ā / b̄
    low: np.ndarray  # [C] lower end of the hull (−inf unless bounded)
    high: np.ndarray  # [C] upper end of the hull (+inf unless bounded)
    shape: np.ndarray  # [C] "bounded", "union" or "unbounded"
    inner_low: np.ndarray  # [C] union only: the set is (−inf, inner_low] ∪ [inner_high, inf); NaN otherwise
    inner_high: np.ndarray
    denominator_t: float  # b̄ / se(b̄): |t| > critical t means bounded
    critical_t: float
    df: int
    confidence_level: float

    def notes(self) -> list[str]:
        """Return one sentence per ratio: empty when bounded, else what the set is and why."""
        return [fieller_note(s, lo, hi) for s, lo, hi in zip(self.shape, self.inner_low, self.inner_high)]

    def covers(self, theta: Any) -> np.ndarray:
        """Return bool [C] (theta a scalar or [C]; a grid [G, 1] gives [G, C]): whether each set holds theta. A union
        of two rays does not hold the values between its inner ends, which its hull (−inf, inf) would."""
        theta = np.asarray(theta, dtype=np.float64)
        in_hull = (self.low <= theta) & (theta <= self.high)
        with np.errstate(invalid="ignore"):
            in_rays = (theta <= self.inner_low) | (theta >= self.inner_high)
        return np.where(self.shape == "union", in_rays, in_hull).astype(bool)


def fieller_note(shape: str, inner_low: float = float("nan"), inner_high: float = float("nan")) -> str:
    """Return the sentence a report prints for a Fieller set of this shape ('' when bounded)."""
    if shape == "bounded":
        return ""
    if shape == "union":
        return (f"{UNDISTINGUISHABLE}: the Fieller set is (−∞, {inner_low:.3g}] ∪ [{inner_high:.3g}, ∞), no finite "
                "interval")
    return f"{UNDISTINGUISHABLE}: the Fieller set is the whole line"


def _mean_cov(a: np.ndarray, b: np.ndarray, groups: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """Return (ā [C], b̄, v_aa [C], v_ab [C], v_bb, df): means and the (cluster-robust) covariance of the means."""
    n = b.size
    abar, bbar = a.sum(0) / n, b.sum() / n
    ua, ub = a - abar, b - bbar
    if groups is None:
        return abar, bbar, (ua * ua).sum(0) / (n * (n - 1)), (ua * ub[:, None]).sum(0) / (n * (n - 1)), \
            (ub * ub).sum() / (n * (n - 1)), n - 1
    g = np.unique(groups, return_inverse=True)[1]
    G = int(g.max()) + 1
    if G < 2:
        raise InputError("a Fieller interval over clusters needs at least 2 clusters")
    sa = np.zeros((G, a.shape[1]))
    np.add.at(sa, g, ua)
    sb = np.bincount(g, weights=ub, minlength=G)
    c = G / (G - 1) / n**2  # CR1: the usual small-G correction of the cluster-robust variance of a mean
    return abar, bbar, c * (sa * sa).sum(0), c * (sa * sb[:, None]).sum(0), c * (sb * sb).sum(), G - 1


def fieller_interval(a: Any, b: Any, *, confidence_level: float = 0.95, groups: Any = None) -> FiellerInterval:
    """Return Fieller's set for ā_c / b̄ per column c of ``a`` [N, C] over a shared denominator ``b`` [N]."""
    a = np.asarray(a, dtype=np.float64)
    a = a[:, None] if a.ndim == 1 else a
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.shape != (a.shape[0],):
        raise InputError(f"numerator {a.shape} and denominator {b.shape} disagree: give a [N, C] and b [N]")
    if a.shape[0] < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise InputError("a Fieller interval needs at least 2 finite examples")
    if not 0.5 < confidence_level < 1:
        raise InputError(f"confidence_level must lie in (0.5, 1), got {confidence_level}")
    groups = None if groups is None else np.asarray(groups)
    abar, bbar, vaa, vab, vbb, df = _mean_cov(a, b, groups)
    t = float(sps.t.ppf(0.5 + confidence_level / 2, df))
    A = bbar**2 - t**2 * vbb
    B = abar * bbar - t**2 * vab
    C = abar**2 - t**2 * vaa
    D = B**2 - A * C
    root = np.sqrt(np.maximum(D, 0.0))
    c = a.shape[1]
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = abar / bbar
        if A > 0:
            lo, hi = (B - root) / A, (B + root) / A
            shape = np.full(c, "bounded", dtype=object)
            inner_lo = inner_hi = np.full(c, np.nan)
        else:
            lo, hi = np.full(c, -np.inf), np.full(c, np.inf)
            union = D > 0
            shape = np.where(union, "union", "unbounded").astype(object)
            inner_lo = np.where(union, (B + root) / A, np.nan) if A < 0 else np.full(c, np.nan)
            inner_hi = np.where(union, (B - root) / A, np.nan) if A < 0 else np.full(c, np.nan)
            shape = shape if A < 0 else np.full(c, "unbounded", dtype=object)
    den_t = float(bbar / np.sqrt(vbb)) if vbb > 0 else float(np.sign(bbar) * np.inf)
    return FiellerInterval(estimate, lo, hi, shape, inner_lo, inner_hi, den_t, t, int(df), confidence_level)


def fieller_faithfulness(m_circuit: Any, m_clean: Any, m_empty: Any, *, confidence_level: float = 0.95,
                         groups: Any = None) -> FiellerInterval:
    """Return Fieller's set for the ratio-of-means faithfulness of circuits m_circuit [N, C] (m_clean, m_empty [N])."""
    mc = np.asarray(m_circuit, dtype=np.float64)
    mc = mc[:, None] if mc.ndim == 1 else mc
    m0 = np.asarray(m_empty, dtype=np.float64)
    return fieller_interval(mc - m0[:, None], np.asarray(m_clean, dtype=np.float64) - m0,
                            confidence_level=confidence_level, groups=groups)


def fieller_over_plan(num: Any, m_clean: Any, m_empty: Any, plan: Any, *, confidence_level: float) -> FiellerInterval:
    """Return Fieller's set for mean(num) / mean(m_clean − m_empty), with the plan's clusters as clusters when it
    resamples whole clusters (a cluster plan), else one example per unit: the interval the run's bootstrap would
    resample over, inverted analytically."""
    groups = plan.groups if getattr(plan, "kind", None) == "cluster" else None
    den = np.asarray(m_clean, dtype=np.float64) - np.asarray(m_empty, dtype=np.float64)
    return fieller_interval(np.asarray(num, dtype=np.float64), den, confidence_level=confidence_level, groups=groups)
