"""Confidence intervals for per-edge mean effects: bootstrap (percentile, basic, BCa,
studentized) and Student t, each with the p-value that inverts it, and standard errors.

Estimand: the mean effect over the task's prompt distribution (`ESTIMAND`). The default interval
is the symmetric studentized bootstrap (Hall's symmetric bootstrap-t: mean +- q * SE, q the
confidence-level quantile of |t*|, t* = (mean* - mean) / SE*), chosen by simulated coverage on
heavy-tailed finite populations (tests/stats/test_edge_coverage.py; README). 95% intervals at
N = 64 on real exact zoo scores covered: symmetric studentized 0.947, t 0.931, basic 0.929,
percentile 0.904, equal-tailed studentized 0.900, BCa 0.880. Cluster plans default to the wild
cluster bootstrap-t with CR2 standard errors and G - 1 df (module wild; the i.i.d. standard error
does not hold when prompts share a template; coverage on templated populations in docs/calibration.md).

Every method's p-value inverts its own interval: the interval excludes the null value exactly
when p < 1 - confidence_level (before any multiplicity adjustment), so BH q-values built from
these p-values never disagree with the interval about zero at the unadjusted level.

Conventions follow scipy.stats.bootstrap so results can be checked against it: quantiles are
linear interpolation (type 7), the standard error has ddof=1, BCa's bias correction counts ties
at the estimate as one half (scipy's `_percentile_of_score`), and its acceleration is the
jackknife skewness a = sum(d^3) / (6 sum(d^2)^1.5), which for the mean is the closed form
a = sum(U^3) / (6 (sum U^2)^1.5), U = x - mean(x): no N leave-one-out passes are needed.

Modules: methods (method names, estimand, request checks), bounds (quantiles, every method's
bounds, percentile intervals of replicate sets), verdicts (the one verdict an interval gives, and the
one way an interval is printed, saying why when there is none), pvalues (the p-values that
invert them), wild (the CR2 and wild cluster bootstrap-t methods of cluster plans), wcr (the restricted
wild cluster bootstrap-t inverted exactly into a confidence set, method 'wcr'), jackknife
(leave-one-out values, BCa acceleration), result (BootstrapResult), edges
(bootstrap_edges), statistic (bootstrap_statistic, intervals_from_distribution).
"""

from __future__ import annotations

from .bounds import percentile_interval
from .edges import bootstrap_edges
from .jackknife import acceleration_from_jackknife, jackknife_statistic, mean_acceleration
from .methods import CLUSTER_DEFAULT_METHOD, CLUSTER_METHODS, DEFAULT_METHOD, EDGE_METHODS, ESTIMAND, METHODS
from .result import BootstrapResult
from .statistic import bootstrap_statistic, intervals_from_distribution
from circuitstat.core.interval_words import RESOLUTION, interval_text, interval_verdict, is_negligible, needs_more

__all__ = [
    "percentile_interval",
    "BootstrapResult",
    "bootstrap_edges",
    "bootstrap_statistic",
    "intervals_from_distribution",
    "jackknife_statistic",
    "acceleration_from_jackknife",
    "mean_acceleration",
    "interval_verdict",
    "interval_text",
    "is_negligible",
    "needs_more",
    "RESOLUTION",
    "DEFAULT_METHOD",
    "ESTIMAND",
    "METHODS",
    "CLUSTER_METHODS",
    "CLUSTER_DEFAULT_METHOD",
    "EDGE_METHODS",
]
