"""The per-edge interval methods, the estimand they cover, and the checks of a request for them
(method names, confidence level and alternative, resampling plan)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..resampling import ResamplingPlan
from ..testing import check_alternative

METHODS = ("percentile", "basic", "bca", "t", "studentized", "studentized_symmetric")
#: methods that need a cluster plan's groups: studentized by the CR2 cluster-robust SE (circuitstat.stats.intervals.wild;
#: 'wcr' is the restricted wild cluster bootstrap-t inverted into a confidence set, circuitstat.stats.intervals.wcr)
CLUSTER_METHODS = ("wild_cluster_t", "cr2_t", "wcr")
#: cluster methods that need the plan's wild weights
WILD_METHODS = ("wild_cluster_t", "wcr")
#: every per-edge method bootstrap_edges offers
EDGE_METHODS = METHODS + CLUSTER_METHODS
#: methods whose interval rests on the resampled means (need enough resamples)
RESAMPLING_METHODS = ("percentile", "basic", "bca", "studentized", "studentized_symmetric")
#: methods that studentize with the i.i.d. standard error (not valid for cluster plans)
IID_METHODS = ("t", "studentized", "studentized_symmetric")
STUDENTIZED = ("studentized", "studentized_symmetric")
#: methods available for a general statistic's bootstrap distribution (no per-example SE)
RESAMPLING_ONLY = ("percentile", "basic", "bca")
DEFAULT_METHOD = "studentized_symmetric"
#: the default under a cluster plan: wild cluster bootstrap-t, CR2 SE, G - 1 df (circuitstat.stats.intervals.wild)
CLUSTER_DEFAULT_METHOD = "wild_cluster_t"
ESTIMAND = "mean effect over the task's prompt distribution"


def tail_levels(confidence_level: float, alternative: str) -> float:
    """Return the lower tail probability alpha used for the two quantiles (scipy's rule)."""
    if not 0 < confidence_level < 1:
        raise ValueError("confidence_level must lie strictly between 0 and 1")
    check_alternative(alternative)
    return (1 - confidence_level) / 2 if alternative == "two-sided" else 1 - confidence_level


def check_methods(method: str, methods: Sequence[str] | None,
                   allowed: Sequence[str] = METHODS) -> list[str]:
    """Return the list of interval methods to compute, primary first."""
    out = [method] + [m for m in (methods or []) if m != method]
    for m in out:
        if m not in allowed:
            hint = ("; 't' and 'studentized' need the per-example data of a mean: use "
                    "bootstrap_edges" if m in IID_METHODS else "")
            raise ValueError(f"unknown interval method {m!r} here; choose from {tuple(allowed)}"
                             + hint)
    return out


def plan_for(n_obs: int, plan: ResamplingPlan | None, n_resamples: int,
              seed: Any) -> ResamplingPlan:
    """Return `plan`, or a fresh bootstrap plan; refuse subsample plans for intervals."""
    if plan is None:
        return ResamplingPlan.bootstrap(n_obs, n_resamples, seed)
    if seed is not None:
        raise ValueError("pass either a plan or a seed, not both: the plan already fixes the draw")
    if plan.is_half_subsample:
        raise ValueError(
            f"confidence intervals need size-N bootstrap resamples, but this plan is "
            f"{plan.kind!r} (half-size subsamples overstate the spread by about sqrt(2)); use "
            "ResamplingPlan.bootstrap, .cluster or .poisson; keep subsamples for stability selection"
        )
    return plan


def check_plan_for_methods(plan: ResamplingPlan, todo: Sequence[str],
                            confidence_level: float) -> None:
    """Raise InputError when the plan cannot support a requested method."""
    from circuitstat.core.errors import InputError

    bad = [m for m in todo if m in IID_METHODS]
    if plan.kind == "cluster" and bad:
        raise InputError(f"interval method(s) {bad} use the independent-example standard error, "
                         "which is wrong under the cluster bootstrap; use method 'wild_cluster_t' (the "
                         "default), 'cr2_t', 'wcr', 'percentile', 'basic' or 'bca' with a cluster plan")
    clustered = [m for m in todo if m in CLUSTER_METHODS]
    if clustered and (plan.kind != "cluster" or plan.groups is None):
        raise InputError(f"interval method(s) {clustered} studentize with the cluster-robust (CR2) standard error "
                         f"and need a cluster plan (the templates); this plan is {plan.kind!r}: use "
                         "ResamplingPlan.cluster(groups, ...) (bootstrap scheme 'clusters') or another method")
    wild = [m for m in todo if m in WILD_METHODS]
    if wild and plan.wild is None:
        raise InputError(f"method(s) {wild} need the plan's wild weights; build the plan with "
                         "ResamplingPlan.cluster(groups, ...)")
    if any(m in RESAMPLING_METHODS for m in todo):
        # the smallest p-value, 1/(B+1), must lie below 1 - level (a margin absorbs the
        # rounding of 1 - 0.95), else an interval could exclude 0 while p >= 1 - level
        tail = (1.0 - confidence_level) * (1 - 1e-9)
        b_min = max(1, int(np.floor(1.0 / tail)) - 1)
        while 1.0 / (b_min + 1.0) >= tail:
            b_min += 1
        if plan.n_resamples < b_min:
            raise InputError(f"{plan.n_resamples} resamples are too few for a "
                             f"{confidence_level:.3g} interval and its p-value; use at least "
                             f"n_resamples = {b_min} (1000 or more for stable bounds)")

