"""Streaming top-K over the resamples of a score matrix, in edge chunks (the floor's tie rule, circuitstat.core.topk).

A chunk's top-K state and the merge of two states equal one global sort under the total order of
circuitstat.core.topk (key descending, then the per-(seed, edge) tie priority), whatever the chunk size, and
count exactly the edges tied at the boundary that were left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from circuitstat.core.topk import ranking_key, select_topk, tie_priorities

from .resampling import DEFAULT_MAX_BYTES, ResamplingPlan, map_edge_chunks

__all__ = ["TopKState", "chunk_topk", "merge_topk", "streaming_topk"]


@dataclass
class TopKState:
    """Streaming top-K per row: K best (key, edge) in rank order, ties dropped at the boundary."""

    vals: np.ndarray  # [B, K] float64, descending
    pri: np.ndarray  # [B, K] uint64 tie priorities (circuitstat.core.topk), ascending within equal values
    idx: np.ndarray  # [B, K] int64; padding = sentinel
    boundary: np.ndarray  # [B] value at rank K
    dropped: np.ndarray  # [B] edges equal to `boundary` that are not in the list


def chunk_topk(keyT: np.ndarray, priT: np.ndarray, start: int, K: int, sentinel: int) -> TopKState:
    """Return the top-K state of one chunk (keyT, priT [B, c], edges start..start+c-1)."""
    b, c = keyT.shape
    if c <= K:
        vals = np.full((b, K), -np.inf)
        pri = np.full((b, K), np.iinfo(np.uint64).max, dtype=np.uint64)
        idx = np.full((b, K), sentinel, dtype=np.int64)
        vals[:, :c], pri[:, :c] = keyT, priT
        idx[:, :c] = np.arange(start, start + c)
        order = np.lexsort((pri, -vals), axis=1)
        dropped = np.zeros(b, dtype=np.int64)
    else:
        local, _, _, dropped = select_topk(keyT, priT, K)
        idx = local + start
        vals = np.take_along_axis(keyT, local, axis=1)
        pri = np.take_along_axis(priT, local, axis=1)
        order = np.arange(K)[None, :].repeat(b, axis=0)  # already in rank order
    vals = np.take_along_axis(vals, order, axis=1)
    return TopKState(vals, np.take_along_axis(pri, order, axis=1),
                     np.take_along_axis(idx, order, axis=1), vals[:, -1].copy(), dropped)


def merge_topk(a: TopKState, c: TopKState, sentinel: int) -> TopKState:
    """Return the top-K state of the union of two states (order-independent, exact tie counts)."""
    K = a.vals.shape[1]
    vals = np.concatenate([a.vals, c.vals], axis=1)
    pri = np.concatenate([a.pri, c.pri], axis=1)
    idx = np.concatenate([a.idx, c.idx], axis=1)
    order = np.lexsort((idx, pri, -vals), axis=1)  # (key desc, priority asc): one total order
    vals = np.take_along_axis(vals, order, axis=1)
    pri = np.take_along_axis(pri, order, axis=1)
    idx = np.take_along_axis(idx, order, axis=1)
    v = vals[:, K - 1]
    rest = ((vals[:, K:] == v[:, None]) & (idx[:, K:] < sentinel)).sum(axis=1)
    dropped = rest + np.where(a.boundary == v, a.dropped, 0) + np.where(c.boundary == v,
                                                                        c.dropped, 0)
    return TopKState(vals[:, :K].copy(), pri[:, :K].copy(), idx[:, :K].copy(), v.copy(), dropped)


def streaming_topk(S: np.ndarray, plan: ResamplingPlan, K: int, ranking: str, seeds: np.ndarray,
                   *, n_full: int = 0, chunk_size: int | None = None, n_jobs: int = 1,
                   max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[TopKState, np.ndarray]:
    """Return the top-K state of every resample of S [N, E] and its first n_full key vectors.

    One chunked pass of the resampling engine (resampled means W.S/N per edge chunk); `seeds`
    holds one uint64 tie-breaking seed per resample (row_seeds). Never holds a [B, E] array
    beyond the n_full kept key vectors [n_full, E].
    """
    n_edges = S.shape[1]
    sentinel = n_edges  # larger than every real edge index

    def reduce(r: np.ndarray, sc: np.ndarray, sl: slice) -> tuple[TopKState, np.ndarray]:
        key = ranking_key(r, ranking)
        full = key[:, :n_full].T.copy()
        pri = tie_priorities(seeds, np.arange(sl.start, sl.stop))  # depends on edge, not chunk
        return chunk_topk(np.ascontiguousarray(key.T), pri, sl.start, K, sentinel), full

    state: TopKState | None = None
    fulls = []
    for part, full in map_edge_chunks(S, plan, reduce, chunk_size=chunk_size, n_jobs=n_jobs,
                                      max_bytes=max_bytes, check=False):
        state = part if state is None else merge_topk(state, part, sentinel)
        fulls.append(full)
    return state, np.concatenate(fulls, axis=1)
