"""Cross-fitting folds: examples split at random, or whole groups (templates) dealt to balance fold sizes.

:func:`fold_split` makes one split; :func:`fillable_folds` says how many folds a dataset can fill with
at least ``MIN_PER_FOLD`` examples each, so that a caller can choose the fold count before a run instead
of failing in its faithfulness stage (a task file with a ``group`` column of a few IOI templates cannot
fill five folds).
"""

from __future__ import annotations

import numpy as np

from circuitstat.core.errors import InputError

__all__ = ["MIN_PER_FOLD", "DEFAULT_FOLDS", "fold_split", "fold_loads", "fillable_folds"]

#: fewest examples a cross-fitting fold may hold (its circuit is evaluated on them)
MIN_PER_FOLD = 4
#: the fold count when the data can fill it
DEFAULT_FOLDS = 5


def _deal(sizes: np.ndarray, order: np.ndarray, n_folds: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (fold of each group, examples per fold): groups in ``order``, each to the currently smallest fold."""
    fold_of, load = np.empty(sizes.size, dtype=np.int64), np.zeros(n_folds, dtype=np.int64)
    for g in order:
        f = int(np.argmin(load))
        fold_of[g], load[f] = f, load[f] + sizes[g]
    return fold_of, load


def _largest_first(rng: np.random.Generator | None, sizes: np.ndarray) -> np.ndarray:
    """Return group indices, largest first (random among equal sizes when ``rng`` is given)."""
    order = np.arange(sizes.size) if rng is None else rng.permutation(sizes.size)
    return order[np.argsort(-sizes[order], kind="stable")]


def fold_loads(n: int, n_folds: int, groups: np.ndarray | None) -> np.ndarray:
    """Return the examples per fold that :func:`fold_split` gives (the same for every random split)."""
    if groups is None:
        return np.array([len(f) for f in np.array_split(np.arange(n), n_folds)], dtype=np.int64)
    _, sizes = np.unique(groups, return_counts=True)
    # equal sizes are interchangeable, so the deal's loads do not depend on the order among them
    return _deal(sizes, _largest_first(None, sizes), n_folds)[1]


def fillable_folds(n: int, groups: np.ndarray | None, limit: int = DEFAULT_FOLDS) -> int:
    """Return the most folds (at most ``limit``) whose every fold holds >= MIN_PER_FOLD examples; 0 if none."""
    for k in range(int(limit), 0, -1):
        if fold_loads(n, k, groups).min() >= MIN_PER_FOLD:
            return k
    return 0


def fold_split(rng: np.random.Generator, n: int, n_folds: int, groups: np.ndarray | None,
               strata: np.ndarray | None = None) -> list[np.ndarray]:
    """Return sorted example rows of each fold: a random split, or whole groups dealt to balance fold sizes.

    ``strata`` (without groups): stratified folds, each stratum's rows in random order dealt round-robin
    (stratum after stratum), so every fold holds each stratum's share to within one example and the fold
    sizes are array_split's."""
    if groups is None and strata is not None:
        strata = np.asarray(strata)
        order = np.concatenate([rng.permutation(np.flatnonzero(strata == s)) for s in np.unique(strata)])
        return [np.sort(order[f::n_folds]) for f in range(n_folds)]
    if groups is None:
        return [np.sort(f) for f in np.array_split(rng.permutation(n), n_folds)]
    ids, sizes = np.unique(groups, return_counts=True)
    fold_of, load = _deal(sizes, _largest_first(rng, sizes), n_folds)
    if load.min() < MIN_PER_FOLD:
        raise InputError(f"the groups (templates) cannot fill {n_folds} folds with at least {MIN_PER_FOLD} examples "
                         f"each (smallest fold: {load.min()}); use at most {fillable_folds(n, groups, n_folds)} "
                         "folds or more groups")
    per_row = fold_of[np.searchsorted(ids, groups)]
    return [np.flatnonzero(per_row == f) for f in range(n_folds)]
