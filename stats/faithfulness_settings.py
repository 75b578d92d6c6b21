"""The settings of the faithfulness intervals (circuitstat.stats.faithfulness), checked before any circuit is evaluated:
interval methods, levels and resamples, the selection-aware schemes and their folds, groups and strata."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.params import tail_resamples
from circuitstat.core.topk import ranking_key

from .folds import MIN_PER_FOLD
from .intervals import METHODS
from .resampling import ResamplingPlan
from .strata import check_strata

__all__ = ["SCHEMES", "SCHEME_METHODS", "check_interval_settings", "check_selection_design", "check_selection_inputs",
           "check_selection_settings", "min_resamples"]

SCHEMES = ("crossfit", "reselect")
#: interval methods per scheme, default first
SCHEME_METHODS = {"crossfit": ("corrected-t", *METHODS), "reselect": ("basic",)}


def min_resamples(confidence_level: float) -> int:
    """Return the fewest resamples a two-sided interval needs: one resample beyond each quantile (the one rule,
    circuitstat.core.params.tail_resamples)."""
    return tail_resamples(confidence_level)


def check_interval_settings(method: str, confidence_level: float, n_resamples: int) -> None:
    """Raise InputError for an unknown method, a bad level or too few resamples."""
    if method not in METHODS:
        raise InputError(f"unknown interval method {method!r}; choose from {METHODS}")
    if not 0.5 < confidence_level < 1:
        raise InputError(f"confidence_level must lie in (0.5, 1), got {confidence_level}")
    need = min_resamples(confidence_level)
    if n_resamples < need:
        raise InputError(f"{n_resamples} resamples are too few for a {confidence_level:.0%} {method} interval: "
                         f"it needs at least {need} (one beyond each quantile); raise n_resamples")


def check_selection_inputs(S: np.ndarray, ks: Sequence[int], ranking: str, scheme: str) -> tuple[np.ndarray, list[int]]:
    """Return (S as float64, ks as ints) after checking them; raise InputError otherwise."""
    S = np.asarray(S, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] < 2 or S.shape[1] < 2:
        raise InputError(f"scores must be [N >= 2 examples, E >= 2 edges], got shape {S.shape}")
    if not np.isfinite(S).all():
        raise InputError("scores have NaN/inf values; fix or drop those edges before selecting circuits")
    ranking_key(np.zeros(1), ranking)  # raises InputError for an unknown ranking
    if scheme not in SCHEMES:
        raise InputError(f"unknown scheme {scheme!r}; choose from {SCHEMES}")
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 1 or max(ks) >= S.shape[1]:
        raise InputError(f"every k must lie in [1, {S.shape[1] - 1}] (fewer than the {S.shape[1]} edges), got {ks}")
    return S, ks


def check_selection_settings(scheme: str, method: str, n: int, n_folds: int, n_repeats: int,
                              n_resamples: int | None, confidence_level: float) -> None:
    """Raise InputError for an interval method the scheme lacks, too few resamples or too few examples per fold."""
    allowed = SCHEME_METHODS[scheme]
    if method not in allowed:
        raise InputError(f"scheme {scheme!r} offers methods {allowed}, got {method!r}")
    if not 0.5 < confidence_level < 1:
        raise InputError(f"confidence_level must lie in (0.5, 1), got {confidence_level}")
    if n_resamples is not None:
        check_interval_settings(method if method in METHODS else "percentile", confidence_level, n_resamples)
    if scheme == "crossfit":
        if n_folds < 2 or n_repeats < 1 or n_folds * n_repeats < 3:
            raise InputError(f"cross-fitting needs n_folds >= 2, n_repeats >= 1 and at least 3 splits in all, "
                             f"got n_folds={n_folds}, n_repeats={n_repeats}")
        if n // n_folds < MIN_PER_FOLD:
            raise InputError(f"{n} examples give folds of {n // n_folds} with n_folds={n_folds}; each fold needs at "
                             f"least {MIN_PER_FOLD} examples (N >= {MIN_PER_FOLD * n_folds}): use fewer folds or "
                             "more prompts")


def check_selection_design(scheme: str, method: str, n: int, n_folds: int, n_repeats: int,
                            plan: ResamplingPlan | None, n_resamples: int, seed: Any, confidence_level: float,
                            groups: np.ndarray | None, strata: np.ndarray | None
                            ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Return (groups, strata) checked against the scheme, the method's resamples (a plan or a seed, never both; none
    for corrected-t) and the folds; InputError naming the setting that does not fit."""
    uses_plan = scheme == "reselect" or method != "corrected-t"
    if plan is not None and not uses_plan:
        raise InputError("method 'corrected-t' draws no resamples; drop plan (or pick a bootstrap method)")
    if plan is not None and seed is not None:
        raise InputError("pass either a plan or a seed, not both: the plan already fixes the resamples")
    check_selection_settings(scheme, method, n, n_folds, n_repeats,
                              (plan.n_resamples if plan is not None else int(n_resamples)) if uses_plan else None,
                              confidence_level)
    if groups is not None:
        groups = np.asarray(groups)
        if groups.shape != (n,):
            raise InputError(f"groups must hold one label per example ({n}), got shape {groups.shape}")
        if scheme == "reselect":
            raise InputError("scheme 'reselect' resamples examples, not groups; use scheme 'crossfit' with groups")
    if strata is not None:
        if scheme == "reselect":
            raise InputError("strata are supported by scheme 'crossfit' only; use scheme 'crossfit'")
        strata = check_strata(strata, n, min_size=2)
    return groups, strata
