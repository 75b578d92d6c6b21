"""Stratified resampling: every resample draws within each stratum, so each stratum keeps its size.

A verified run's data are a stratified sample: n labelled prompts (approximation and exact) and N − n
unlabelled ones (approximation only), the n drawn uniformly from the N. Its estimator (PPI++,
circuitstat.stats.verified) treats the two as separate samples, so a bootstrap must resample the
labelled prompts among themselves and the unlabelled among themselves (the stratified bootstrap; Davison
& Hinkley 1997, Bootstrap Methods and their Application, §3.7); an ordinary bootstrap of all N would let
the number of labelled prompts vary and mix the two samples. Each function here runs an existing
unstratified draw of circuitstat.stats.resampling or .stability_data once per stratum, from its own child
seed, and places the stratum's counts at its rows.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.seeds import as_seed_sequence, spawn_seeds

__all__ = ["check_strata", "stratified_counts", "stratum_weighted_means"]


def check_strata(strata: Any, n_obs: int | None = None, min_size: int = 1) -> np.ndarray:
    """Return the strata as int64 labels 0..S−1 [N]; InputError for a bad shape or a stratum under ``min_size``."""
    arr = np.asarray(strata)
    if arr.ndim != 1 or (n_obs is not None and arr.size != n_obs):
        raise InputError(f"strata must hold one label per example ({n_obs}), got shape {arr.shape}")
    _, inv, sizes = np.unique(arr, return_inverse=True, return_counts=True)
    if sizes.min() < min_size:
        raise InputError(f"every stratum needs at least {min_size} examples, the smallest has {sizes.min()}")
    return inv.astype(np.int64)


def stratified_counts(strata: np.ndarray, draw: Callable[[int, np.random.SeedSequence], Any],
                      seed: Any) -> Any:
    """Return ``draw(n_s, child seed)``'s counts per stratum placed at the stratum's rows (same structure).

    ``draw`` returns an int array [B, n_s] or a tuple of them (e.g. a nested bootstrap's outer and inner
    counts); row b of every stratum's array belongs to resample b, so the result's row b holds each
    stratum's own draw b and the stratum's total weight is what ``draw`` gives it.
    """
    labels = check_strata(strata)
    S = int(labels.max()) + 1
    parts = [draw(int((labels == s).sum()), c) for s, c in enumerate(spawn_seeds(as_seed_sequence(seed), S))]
    single = not isinstance(parts[0], tuple)
    parts = [(p,) if single else p for p in parts]
    out = []
    for j in range(len(parts[0])):
        counts = np.zeros((parts[0][j].shape[0], labels.size), dtype=np.int32)
        for s, p in enumerate(parts):
            counts[:, labels == s] = p[j]
        out.append(counts)
    return out[0] if single else tuple(out)


def stratum_weighted_means(S: np.ndarray, rows: np.ndarray, strata: np.ndarray) -> np.ndarray:
    """Return Σ_s (N_s / N) · mean over ``rows`` ∩ stratum s of S [N, E]: the stratified estimator's mean on ``rows``.

    On all N rows it is the plain mean; on a subset it weights each stratum by its population share, so
    a subset with fewer labelled rows than n·|rows|/N still gives the stratified (PPI++) estimate.
    InputError when ``rows`` miss a stratum (its mean is undefined there).
    """
    labels = check_strata(strata, S.shape[0])
    sub = labels[rows]
    out = np.zeros(S.shape[1])
    for s in range(int(labels.max()) + 1):
        mine = rows[sub == s]
        if mine.size == 0:
            raise InputError(f"a subset of {rows.size} examples holds none of stratum {s}; use fewer folds or "
                             "more examples in every stratum (e.g. verify more prompts)")
        out += (labels == s).mean() * S[mine].sum(0) / mine.size
    return out
