"""Wild cluster bootstrap-t for per-edge means: CR2 standard errors, G - 1 degrees of freedom, Webb weights.

An edge's effect is a mean, i.e. the intercept of an intercept-only regression, so with G groups
(templates) of sizes n_g, N = sum n_g, residuals u_i = x_i - mean and cluster sums U_g:

* CR2 (Bell & McCaffrey 2002) adjusts each cluster's residuals by (I - H_gg)^(-1/2), H_gg = 11'/N;
  for the intercept the adjusted cluster sum is U_g / sqrt(1 - n_g/N), so
  SE_CR2^2 = sum_g U_g^2 / (1 - n_g/N) / N^2 (statsmodels' CR0 times that factor per cluster).
* The wild cluster bootstrap (Cameron, Gelbach & Miller 2008) multiplies each cluster's residuals by
  one weight w_g (Rademacher, or Webb's 6 points for G < 12, MacKinnon & Webb 2017; unrestricted,
  WCU): mean* - mean = sum_g w_g U_g / N, and each resample is studentized by its own CR2 SE.
* The interval is mean +- q SE_CR2 with q the larger of the level quantile of |t*| and Student t's
  with G - 1 df (method 'wild_cluster_t'); 'cr2_t' uses the t quantile alone. The t floor keeps the
  interval from being narrower than G groups allow: the wild distribution of a few clusters is
  discrete (6^G or 2^G weight vectors) and can put its quantile below t_{G-1}.

The restricted wild cluster bootstrap-t (the null imposed on the resamples), inverted into a confidence set, is
method 'wcr' (circuitstat.stats.intervals.wcr). Coverage on templated populations is measured in docs/calibration.md
(tests/stats/test_wild_cluster.py): on real scores WCR alone under-covers at G = 5 to 12, and joined with the t floor
it is no better than this interval, which stays the default.
"""

from __future__ import annotations

import numpy as np
from scipy.special import stdtr, stdtrit

from ..resampling import WEBB_BELOW
from .bounds import quantile_sorted
from .methods import CLUSTER_METHODS

__all__ = ["CLUSTER_METHODS", "ClusterSums", "cr2_se", "wild_t", "weight_family", "cluster_intervals",
           "cluster_pvalues"]


class ClusterSums:
    """The per-cluster layout of a plan's groups: sizes n_g and leverages h_g = n_g / N."""

    def __init__(self, groups: np.ndarray) -> None:
        groups = np.asarray(groups, dtype=np.int64)
        self.n_groups = int(groups.max()) + 1
        self.order = np.argsort(groups, kind="stable")
        self.starts = np.flatnonzero(np.r_[True, np.diff(groups[self.order]) != 0])
        self.sizes = np.bincount(groups, minlength=self.n_groups).astype(np.float64)
        self.n_obs = int(groups.size)
        self.h = self.sizes / self.n_obs
        if self.n_groups < 2:
            raise ValueError("a cluster-robust standard error needs at least 2 groups")

    def residual_sums(self, sc: np.ndarray) -> np.ndarray:
        """Return the cluster sums U [c, G] of the residuals of scores sc [c, N] about each row's mean."""
        u = sc - sc.mean(axis=1, keepdims=True)
        return np.add.reduceat(u[:, self.order], self.starts, axis=1)


def cr2_se(U: np.ndarray, cs: ClusterSums) -> np.ndarray:
    """Return the CR2 standard error of each row's mean from its residual cluster sums U [c, G]."""
    return np.sqrt((U * U / (1.0 - cs.h)).sum(axis=1)) / cs.n_obs


def wild_t(U: np.ndarray, cs: ClusterSums, w: np.ndarray) -> np.ndarray:
    """Return the wild bootstrap-t statistics t*[c, B] for weights w [B, G] (unrestricted, CR2-studentized).

    Resample b's cluster residual sums are w_g U_g - n_g d_b with d_b = sum_g w_g U_g / N, so its CR2 sum of
    squares expands into three matrix products (no [c, B, G] array). A resample with SE* = 0 gets t* = 0."""
    inv = 1.0 / (1.0 - cs.h)
    d = (U @ w.T) / cs.n_obs
    ss = ((U * U * inv) @ (w * w).T) - 2.0 * d * ((U * (cs.sizes * inv)) @ w.T) + d * d * float(
        (cs.sizes ** 2 * inv).sum())
    se = np.sqrt(np.maximum(ss, 0.0)) / cs.n_obs
    with np.errstate(divide="ignore", invalid="ignore"):
        t = d / se
    return np.where(se > 0, t, 0.0)


def weight_family(n_groups: int) -> str:
    """Return the name of the wild weights used for G groups."""
    return "Webb 6-point" if n_groups < WEBB_BELOW else "Rademacher"


def cluster_intervals(theta: np.ndarray, se: np.ndarray, abs_ts: np.ndarray | None, n_groups: int,
                      methods: list[str], alpha: float, alternative: str
                      ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return {method: (low, high)} of the cluster methods in `methods` (abs_ts: sorted |t*| [c, B])."""
    out = {}
    q_t = stdtrit(n_groups - 1.0, 1.0 - alpha)
    for m in methods:
        q = np.full(theta.shape, q_t)
        if m == "wild_cluster_t":
            # the t* distribution is symmetric (weights +-w are equally likely), so |t*|'s 1 - 2 alpha
            # quantile is t*'s 1 - alpha quantile, two-sided and one-sided alike
            q = np.maximum(q, quantile_sorted(abs_ts, 1.0 - 2.0 * alpha))
        lo, hi = theta - q * se, theta + q * se
        if alternative == "less":
            lo = np.full_like(lo, -np.inf)
        elif alternative == "greater":
            hi = np.full_like(hi, np.inf)
        out[m] = (lo, hi)
    return out


def cluster_pvalues(method: str, theta: np.ndarray, se: np.ndarray, abs_ts: np.ndarray | None, n_groups: int,
                    alternative: str, null: float = 0.0) -> np.ndarray:
    """Return the p-value that inverts `method`'s interval at `null` (the interval excludes it iff p < 1 - level)."""
    from .pvalues import level_at_least, t_statistic

    t0 = t_statistic(theta, se, null)
    a0 = np.abs(t0)
    df = n_groups - 1.0
    tail_t = stdtr(df, -a0)  # P(T_{G-1} >= |t0|)
    tail = tail_t
    if method == "wild_cluster_t":
        b = abs_ts.shape[1]
        # the bound passes the null once the level's |t*| quantile and t's both lie below |t0|
        tail = np.maximum(tail_t, np.maximum((1.0 - level_at_least(abs_ts, a0)) / 2.0, 0.5 / (b + 1.0)))
    if alternative == "two-sided":
        return np.minimum(1.0, 2.0 * tail)
    right = t0 > 0 if alternative == "greater" else t0 < 0
    return np.where(right, tail, 1.0 - tail)
