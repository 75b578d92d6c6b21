"""The one top-k of circuitstat: the k edges with the largest score or |score|, ties at random.

Edges are ranked by a total order: key descending, then a pseudo-random tie priority ascending.
The priority of edge e in row r is output e+1 of a SplitMix64 stream seeded by the row's 64-bit
seed (drawn from the run's numpy Generator), so it depends only on (seed, row, edge): a top-k
computed in edge chunks and merged (circuitstat.stats.topk_stream) equals one global sort, whatever the chunk
size, and every edge tied at the cut-off is equally likely to be kept. The number of edges tied
with the k-th key, and how many of them were left out, are returned with the indices, so a
report can say when a circuit was decided by a coin flip (e.g. 10 non-zero edges at k = 20).

Whether circuits are chosen by signed score or by |score| is an explicit argument (MIB issue #19).

Why random and not the smaller index: exactly tied edges are common (structurally zero edges, a
saturated metric, scores rounded by low precision). Breaking them by index always keeps the same
low-index edges, which biases circuits toward early edges and makes the tied part of a circuit
identical in every resample, so stability across resamples is overstated exactly where the data
cannot decide. A seeded random priority is reproducible (same seed, same circuit) and keeps every
tied edge with equal probability; the tables record the rule (``TIE_RULE``) and the tie counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InputError, warn_renamed

__all__ = ["RANKINGS", "TIE_RULE", "TopK", "check_ranking", "ranking_key", "row_seeds", "tie_priorities", "topk",
           "select_topk", "topk_mask"]

RANKINGS = ("signed", "absolute")
#: the tie rule, as the tables record it (column ``tie_rule``)
TIE_RULE = "seeded random: edges tied with the k-th score are kept by a pseudo-random priority from the seed"

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def check_ranking(ranking: Any, renamed: dict[str, Any] | None = None, where: str = "top-k") -> str:
    """Return the ranking, 'signed' or 'absolute', given as ``ranking=`` or by its old name ``absolute=``.

    ``renamed`` holds the caller's other keywords: ``absolute=True/False`` is read with a warning
    naming ``ranking``; any other is a TypeError. InputError when no ranking is given (an explicit
    choice: signed and absolute ranking give different circuits), for another value, or when the
    old and the new name disagree.
    """
    renamed = renamed or {}
    unknown = sorted(set(renamed) - {"absolute"})
    if unknown:
        raise TypeError(f"{where}() got unexpected keyword argument(s) {unknown}")
    if "absolute" in renamed:
        absolute = renamed["absolute"]
        if not isinstance(absolute, (bool, np.bool_)):
            raise InputError(f"absolute must be True or False, got {absolute!r}; write ranking='absolute' or 'signed'")
        old = "absolute" if absolute else "signed"
        warn_renamed(f"absolute={bool(absolute)}", f"ranking={old!r}", where, stacklevel=4)
        if ranking is not None and ranking != old:
            raise InputError(f"{where}: absolute={bool(absolute)} contradicts ranking={ranking!r}; give ranking only")
        ranking = old
    if ranking not in RANKINGS:
        raise InputError(f"ranking must be 'signed' or 'absolute' (an explicit choice: they give different circuits), "
                         f"got {ranking!r}")
    return ranking


def ranking_key(values: np.ndarray, ranking: str) -> np.ndarray:
    """Return the ranking key: the score itself ('signed') or its magnitude ('absolute')."""
    check_ranking(ranking)
    return values if ranking == "signed" else np.abs(values)


def row_seeds(rng: Any, n_rows: int) -> np.ndarray:
    """Return n_rows uint64 tie-breaking seeds drawn from a Generator, SeedSequence or int."""
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    return rng.integers(0, 2**64, size=n_rows, dtype=np.uint64, endpoint=False)


def tie_priorities(seeds: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Return uint64 priorities [rows, len(edges)]: SplitMix64 output edge+1 of each row's seed."""
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design
        z = (np.asarray(seeds, dtype=np.uint64)[:, None]
             + (np.asarray(edges, dtype=np.uint64)[None, :] + np.uint64(1)) * _GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


@dataclass(frozen=True)
class TopK:
    """Top-k edges per row in rank order, with the ties at the cut-off counted."""

    indices: np.ndarray  # [..., k] int64, rank order (key descending, random among equal keys)
    threshold: np.ndarray  # [...] key of the k-th edge
    n_tied_at_cutoff: np.ndarray  # [...] edges whose key equals the threshold (kept or not)
    n_tied_excluded: np.ndarray  # [...] of those, how many the random tie-break left out
    ranking: str

    @property
    def k(self) -> int:
        """Return the circuit size k."""
        return int(self.indices.shape[-1])


def _check(scores: np.ndarray, k: int) -> np.ndarray:
    """Return scores as a finite float64 [rows, E] array after checking k."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim not in (1, 2) or s.shape[-1] == 0:
        raise InputError(f"scores must be [E] or [rows, E] with E >= 1, got shape {s.shape}")
    if not np.isfinite(s).all():
        raise InputError("scores contain NaN or inf; drop those edges before taking a top-k")
    n_edges = s.shape[-1]
    if not 1 <= int(k) <= n_edges:
        raise InputError(f"k must lie in [1, {n_edges}] (the number of edges), got {k}")
    return np.atleast_2d(s)


def select_topk(key: np.ndarray, pri: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """Return (indices [R, k] in rank order, threshold, tied, excluded) under (-key, pri) [R, E]."""
    n_rows, n_edges = key.shape
    t = np.partition(key, n_edges - k, axis=1)[:, n_edges - k]  # k-th largest key per row
    gt = key > t[:, None]
    eq = key == t[:, None]
    need = k - gt.sum(axis=1)
    n_eq = eq.sum(axis=1)
    keep = gt | eq
    surplus = np.flatnonzero(n_eq > need)
    if surplus.size:
        # among the tied edges keep the `need` with the smallest priorities
        pe = np.where(eq[surplus], pri[surplus], np.iinfo(np.uint64).max)
        cut = np.take_along_axis(np.sort(pe, axis=1), (need[surplus] - 1)[:, None], axis=1)
        keep[surplus] = gt[surplus] | (eq[surplus] & (pri[surplus] <= cut))
    rows, cols = np.nonzero(keep)
    idx = cols.reshape(n_rows, k)
    kv = key[rows, cols].reshape(n_rows, k)
    pv = pri[rows, cols].reshape(n_rows, k)
    order = np.lexsort((pv, -kv), axis=1)
    return np.take_along_axis(idx, order, axis=1), t, n_eq, n_eq - need


def topk(scores: np.ndarray, k: int, *, ranking: str, seed: Any = None) -> TopK:
    """Return the top-k edges of scores [E] or [rows, E], ties at the cut-off broken at random.

    seed: a numpy Generator, SeedSequence or int (the run's seed); one tie-breaking stream is
    drawn per row. None draws fresh OS entropy (results then differ between calls only where
    ties decide them).
    """
    s = _check(scores, k)
    key = ranking_key(s, ranking)
    pri = tie_priorities(row_seeds(seed, s.shape[0]), np.arange(s.shape[1]))
    idx, t, n_eq, excluded = select_topk(key, pri, int(k))
    if np.ndim(scores) == 1:
        return TopK(idx[0], t[0], n_eq[0], excluded[0], ranking)
    return TopK(idx, t, n_eq, excluded, ranking)


def topk_mask(scores: np.ndarray, k: int, *, ranking: str, seed: Any = None) -> np.ndarray:
    """Return a boolean mask [..., E] of the top-k edges (same order and ties as `topk`)."""
    res = topk(scores, k, ranking=ranking, seed=seed)
    idx = np.atleast_2d(res.indices)
    mask = np.zeros((idx.shape[0], np.shape(scores)[-1]), dtype=bool)
    np.put_along_axis(mask, idx, True, axis=1)
    return mask if np.ndim(scores) == 2 else mask[0]
