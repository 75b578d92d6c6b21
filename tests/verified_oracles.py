"""Independent oracles for the missed-edges bound (circuitstat.stats.verified.missed): scipy and statsmodels only."""

from __future__ import annotations

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests


def brute_upper(x: int, R: int, r: int, level: float) -> int:
    """The largest K with P(X <= x | Hypergeometric(R, K, r)) > 1 − level, by trying every K (scipy's CDF)."""
    return max(K for K in range(x, R - (r - x) + 1) if stats.hypergeom.cdf(x, R, K, r) > 1 - level)


def tost_holm_above(fit, tau: float, alpha: float) -> np.ndarray:
    """Per edge of a verified fit: not rejected by Holm (statsmodels) over TOST p-values of H0: |μ| >= τ computed
    from scipy's t distribution (the fit's estimate, SE and df)."""
    est, se, df = fit.estimate, fit.standard_error, fit.df
    with np.errstate(divide="ignore"):  # SE 0 (an edge constant at 0 here): ±inf, the effect known
        p = np.maximum(stats.t.cdf(-(est + tau) / se, df), stats.t.cdf((est - tau) / se, df))
    return ~multipletests(p, alpha=alpha, method="holm")[0]
