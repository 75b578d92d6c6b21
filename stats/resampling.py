"""Resampling engine: one plan of resample weights, applied to [N, E] score matrices in edge chunks.

A `ResamplingPlan` is drawn once from a `numpy.random.SeedSequence` and stores integer weights
`counts[b, n]` (how often example n appears in resample b). Every resampling scheme used by the
package reduces to such weights: the ordinary bootstrap (multinomial counts), the cluster
bootstrap (whole templates drawn with replacement), half-size subsampling, complementary pairs
(Shah & Samworth 2013) and Poisson(1) weights for streaming data.

Resampled means of a score matrix S [N, E] are `(S[:, chunk].T @ counts.T) / totals`: one matrix
product per chunk of edges, in float64 for that chunk only, so E = 100k and B = 10k never need a
[B, E] float64 array. Each chunk is reduced at once to the per-edge outputs a caller needs (a
reducer function), so results cannot depend on the chunk size, and the joblib `n_jobs` option
only changes which thread computes a chunk, never what it computes.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from circuitstat.core.score_columns import column_blocks
from circuitstat.core.seeds import as_seed_sequence, seed_record, spawn_seeds

__all__ = [
    "DEFAULT_MAX_BYTES",
    "ResamplingPlan",
    "check_score_matrix",
    "edge_chunks",
    "default_chunk_size",
    "map_edge_chunks",
    "resampled_means",
    "resample_statistic",
    "PoissonBootstrapAccumulator",
    "plan_weights",
    "studentized_resamples",
    "wild_weights",
    "WEBB_BELOW",
    "ENUMERATE_UP_TO",
]

#: default working-memory budget for one pass over edge chunks (all workers together)
DEFAULT_MAX_BYTES = 256 * 2**20

# Poisson weights are generated per fixed block of examples, each from its own child seed, so
# the weight of example n depends only on (seed, B, n), never on how a stream was batched.
_POISSON_BLOCK = 256

KINDS = ("bootstrap", "cluster", "subsample", "complementary_pairs", "poisson", "stratified")


# --- seeds ---------------------------------------------------------------------------------
# --- plans ---------------------------------------------------------------------------------
def _counts_from_indices(idx: np.ndarray, n_obs: int) -> np.ndarray:
    """Return [B, n_obs] int32 counts of each index per row of `idx` [B, m]."""
    b = idx.shape[0]
    flat = (idx + (np.arange(b, dtype=np.int64) * n_obs)[:, None]).ravel()
    return np.bincount(flat, minlength=b * n_obs).reshape(b, n_obs).astype(np.int32)


@dataclass(frozen=True, eq=False)
class ResamplingPlan:
    """Integer resample weights [B, N] with the scheme and seed that produced them."""

    counts: np.ndarray
    kind: str
    seed: dict | None = None
    groups: np.ndarray | None = None
    #: for complementary pairs: rows 2i and 2i+1 are the two disjoint halves of split i
    n_pairs: int | None = None
    #: for a stratified bootstrap: the stratum (0..S-1) of each example; each resample keeps every stratum's size
    strata: np.ndarray | None = None
    #: for a cluster plan: wild cluster bootstrap weights [B_w, G] (wild_weights), one column per group
    wild: np.ndarray | None = None
    _totals: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        counts = np.asarray(self.counts)
        if counts.ndim != 2 or counts.shape[0] < 1 or counts.shape[1] < 1:
            raise ValueError(f"counts must be a non-empty [B, N] array, got shape {counts.shape}")
        if counts.dtype.kind not in "iu":
            raise ValueError("counts must be integers (times each example is drawn)")
        if (counts < 0).any():
            raise ValueError("counts must be non-negative")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        totals = counts.sum(axis=1).astype(np.float64)
        if (totals == 0).any():
            raise ValueError(
                "a resample has zero total weight (possible for Poisson weights on very few "
                "examples); use more examples or ResamplingPlan.bootstrap"
            )
        counts = counts.astype(np.int32, copy=False)
        counts.setflags(write=False)
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "_totals", totals)

    # -- properties --
    @property
    def n_resamples(self) -> int:
        """Return B, the number of resamples (rows)."""
        return int(self.counts.shape[0])

    @property
    def n_obs(self) -> int:
        """Return N, the number of examples (columns)."""
        return int(self.counts.shape[1])

    @property
    def totals(self) -> np.ndarray:
        """Return the total weight of each resample (N for the bootstrap), float64 [B]."""
        return self._totals

    @property
    def is_half_subsample(self) -> bool:
        """Return True when resamples are half-size subsamples (stability-selection bounds apply)."""
        return self.kind in ("subsample", "complementary_pairs")

    def indices(self, b: int) -> np.ndarray:
        """Return the (sorted) example indices of resample `b`, repeated by their count."""
        return np.repeat(np.arange(self.n_obs), self.counts[b])

    def describe(self) -> dict:
        """Return a JSON-able description (kind, sizes, seed) for report provenance."""
        d = {"kind": self.kind, "n_resamples": self.n_resamples, "n_obs": self.n_obs,
             "seed": self.seed}
        if self.groups is not None:
            d["n_clusters"] = int(np.unique(self.groups).size)
        if self.n_pairs is not None:
            d["n_pairs"] = self.n_pairs
        if self.strata is not None:
            d["stratum_sizes"] = np.bincount(self.strata).tolist()
        return d

    # -- constructors --
    @classmethod
    def bootstrap(cls, n_obs: int, n_resamples: int,
                  seed: int | np.random.SeedSequence | None = None) -> "ResamplingPlan":
        """Return an ordinary bootstrap plan (multinomial counts).

        Indices are drawn as `default_rng(seed).integers(0, n_obs, (n_resamples, n_obs))`, the
        draw scipy.stats.bootstrap makes, so the same integer seed gives the same resamples as
        `scipy.stats.bootstrap(..., rng=np.random.default_rng(seed))`.
        """
        _check_sizes(n_obs, n_resamples)
        ss = as_seed_sequence(seed)
        rng = np.random.default_rng(ss)
        # draw in row blocks to bound memory; consecutive integers() calls continue one stream
        rows = max(1, 2**22 // n_obs)
        blocks = []
        for start in range(0, n_resamples, rows):
            b = min(rows, n_resamples - start)
            blocks.append(_counts_from_indices(rng.integers(0, n_obs, (b, n_obs)), n_obs))
        return cls(np.concatenate(blocks), "bootstrap", seed_record(ss))

    @classmethod
    def cluster(cls, groups: Sequence[Any] | np.ndarray, n_resamples: int,
                seed: int | np.random.SeedSequence | None = None) -> "ResamplingPlan":
        """Return a cluster bootstrap plan: whole groups (e.g. templates) drawn with replacement."""
        groups = np.asarray(groups)
        if groups.ndim != 1:
            raise ValueError("groups must be a 1-D array with one label per example")
        _, inv = np.unique(groups, return_inverse=True)
        n_groups = int(inv.max()) + 1
        if n_groups < 2:
            raise ValueError("cluster bootstrap needs at least 2 groups; use bootstrap() instead")
        _check_sizes(groups.size, n_resamples)
        ss = as_seed_sequence(seed)
        rng = np.random.default_rng(ss)
        gcounts = _counts_from_indices(rng.integers(0, n_groups, (n_resamples, n_groups)), n_groups)
        counts = gcounts[:, inv]  # every example of a drawn group gets that group's count
        # the wild weights come from a child seed, so the group draws stay those of earlier releases
        wild = wild_weights(n_groups, n_resamples, spawn_seeds(ss, 1)[0])
        return cls(counts, "cluster", seed_record(ss), groups=inv.astype(np.int64), wild=wild)

    @classmethod
    def stratified(cls, strata: Sequence[Any] | np.ndarray, n_resamples: int,
                   seed: int | np.random.SeedSequence | None = None) -> "ResamplingPlan":
        """Return a stratified bootstrap plan: each stratum's examples drawn with replacement among themselves.

        Stratum s (labels sorted) draws ``bootstrap(n_s, n_resamples, child s of seed)``
        (circuitstat.stats.strata), so every resample holds exactly n_s examples of stratum s.
        """
        from .strata import check_strata, stratified_counts

        labels = check_strata(strata)
        _check_sizes(labels.size, n_resamples)
        ss = as_seed_sequence(seed)
        counts = stratified_counts(labels, lambda n_s, c: cls.bootstrap(n_s, n_resamples, c).counts, ss)
        return cls(counts, "stratified", seed_record(ss), strata=labels)

    @classmethod
    def subsample(cls, n_obs: int, n_resamples: int,
                  seed: int | np.random.SeedSequence | None = None) -> "ResamplingPlan":
        """Return half-size subsamples (floor(N/2) examples without replacement)."""
        ss, rng, half = _halves(n_obs, n_resamples, seed, "half-size subsampling needs")
        order = np.argsort(rng.random((n_resamples, n_obs)), axis=1)[:, :half]
        return cls(_counts_from_indices(order, n_obs), "subsample", seed_record(ss))

    @classmethod
    def complementary_pairs(cls, n_obs: int, n_pairs: int,
                            seed: int | np.random.SeedSequence | None = None) -> "ResamplingPlan":
        """Return 2*n_pairs resamples: for each split, two disjoint halves of size floor(N/2)."""
        ss, rng, half = _halves(n_obs, n_pairs, seed, "complementary pairs need")
        perm = np.argsort(rng.random((n_pairs, n_obs)), axis=1)
        idx = np.empty((2 * n_pairs, half), dtype=np.int64)
        idx[0::2] = perm[:, :half]
        idx[1::2] = perm[:, half:2 * half]
        return cls(_counts_from_indices(idx, n_obs), "complementary_pairs", seed_record(ss),
                   n_pairs=n_pairs)

    @classmethod
    def poisson(cls, n_obs: int, n_resamples: int,
                seed: int | np.random.SeedSequence | None = None) -> "ResamplingPlan":
        """Return Poisson(1) weights; example n's weights depend only on (seed, B, n)."""
        _check_sizes(n_obs, n_resamples)
        ss = as_seed_sequence(seed)
        return cls(poisson_weights(ss, n_resamples, 0, n_obs), "poisson", seed_record(ss))

    @classmethod
    def from_indices(cls, indices: np.ndarray, n_obs: int | None = None,
                     kind: str = "bootstrap") -> "ResamplingPlan":
        """Return a plan from explicit resample indices [B, m] (e.g. those scipy would draw)."""
        indices = np.asarray(indices)
        if indices.ndim != 2 or indices.dtype.kind not in "iu":
            raise ValueError("indices must be an integer array [n_resamples, resample_size]")
        n_obs = int(indices.max()) + 1 if n_obs is None else int(n_obs)
        if indices.min() < 0 or indices.max() >= n_obs:
            raise ValueError(f"indices must lie in [0, {n_obs})")
        return cls(_counts_from_indices(indices.astype(np.int64), n_obs), kind, None)

    @classmethod
    def from_counts(cls, counts: np.ndarray, kind: str = "bootstrap") -> "ResamplingPlan":
        """Return a plan from explicit integer weights [B, N]."""
        return cls(np.asarray(counts), kind, None)


def nested_bootstrap(n_obs: int, n_outer: int, n_inner: int,
                     seed: int | np.random.SeedSequence | None = None
                     ) -> tuple[ResamplingPlan, ResamplingPlan]:
    """Return (outer, inner) plans of a double bootstrap; inner row o*n_inner+i resamples outer o.

    The outer plan is ResamplingPlan.bootstrap(n_obs, n_outer, child 0 of seed); inner resample i
    of outer resample o draws n_obs examples with replacement from outer o's examples (child 1),
    so its counts compose the two draws and the chunked engine gives every inner mean as W.S/N.
    """
    _check_sizes(n_obs, n_outer)
    _check_sizes(n_obs, n_inner)
    ss = as_seed_sequence(seed)
    c_outer, c_inner = spawn_seeds(ss, 2)
    outer = ResamplingPlan.bootstrap(n_obs, n_outer, c_outer)
    rng = np.random.default_rng(c_inner)
    # example indices of every outer resample, rows sorted (np.repeat per row, vectorised)
    members = np.nonzero(outer.counts)[1]
    idx = np.repeat(members, outer.counts[outer.counts > 0]).reshape(n_outer, n_obs)
    pos = rng.integers(0, n_obs, (n_outer, n_inner, n_obs))
    drawn = np.take_along_axis(idx[:, None, :], pos, axis=2).reshape(n_outer * n_inner, n_obs)
    inner = ResamplingPlan(_counts_from_indices(drawn, n_obs), "bootstrap",
                           {**seed_record(c_inner), "nested_in": seed_record(c_outer),
                            "n_inner": int(n_inner)})
    return outer, inner


#: below this many groups the wild cluster bootstrap uses Webb's 6-point weights, else Rademacher
#: (MacKinnon & Webb 2017)
WEBB_BELOW = 12
#: weight sets with at most this many patterns are always enumerated, whatever n_resamples asks (6^5: Webb at
#: G <= 5). With so few templates the restricted wild bootstrap's bounds sit in the tail that near-constant
#: weight patterns make, where a random draw of 999 patterns moves them by tens of percent
ENUMERATE_UP_TO = 6 ** 5
_WEBB = np.array([-np.sqrt(1.5), -1.0, -np.sqrt(0.5), np.sqrt(0.5), 1.0, np.sqrt(1.5)])


def wild_weights(n_groups: int, n_resamples: int,
                 seed: int | np.random.SeedSequence | None = None) -> np.ndarray:
    """Return wild cluster bootstrap weights [B_w, G]: Webb's 6 points for G < 12, else Rademacher +-1.

    Every weight has mean 0 and variance 1 (Webb 2013; Cameron, Gelbach & Miller 2008). When the
    distinct weight vectors (6^G or 2^G) are no more than `n_resamples` or ENUMERATE_UP_TO (7,776: Webb
    at G <= 5), all of them are returned once each (B_w = 6^G or 2^G: the exact wild bootstrap
    distribution, no Monte Carlo error); otherwise n_resamples rows are drawn at random.
    """
    g = int(n_groups)
    if g < 1:
        raise ValueError("the wild cluster bootstrap needs at least one group")
    _check_sizes(g, n_resamples)
    vals = _WEBB if g < WEBB_BELOW else np.array([-1.0, 1.0])
    if g * np.log(vals.size) <= np.log(max(int(n_resamples), ENUMERATE_UP_TO)) + 1e-12:
        codes = np.arange(vals.size ** g)[:, None] // vals.size ** np.arange(g)[None, :] % vals.size
        return vals[codes]
    return vals[np.random.default_rng(as_seed_sequence(seed)).integers(0, vals.size, (int(n_resamples), g))]


def _check_sizes(n_obs: int, n_resamples: int) -> None:
    """Raise ValueError for empty data or no resamples."""
    if int(n_obs) < 1:
        raise ValueError("no examples: the score matrix is empty (N = 0)")
    if int(n_resamples) < 1:
        raise ValueError("n_resamples must be a positive integer")


def _halves(n_obs: int, n_draws: int, seed: Any, what: str) -> tuple[np.random.SeedSequence, np.random.Generator, int]:
    """(seed, its generator, floor(N/2)) of a half-sample scheme after checking the sizes."""
    _check_sizes(n_obs, n_draws)
    ss = as_seed_sequence(seed)
    half = n_obs // 2
    if half < 1:
        raise ValueError(f"{what} at least 2 examples")
    return ss, np.random.default_rng(ss), half


def poisson_weights(seed: int | np.random.SeedSequence, n_resamples: int, start: int,
                    stop: int) -> np.ndarray:
    """Return Poisson(1) weights [B, stop-start] int32 for examples start..stop-1 of a stream."""
    ss = as_seed_sequence(seed)
    out = np.empty((n_resamples, stop - start), dtype=np.int32)
    first, last = start // _POISSON_BLOCK, (stop - 1) // _POISSON_BLOCK
    for j in range(first, last + 1):
        child = np.random.SeedSequence(ss.entropy, spawn_key=tuple(ss.spawn_key) + (j,),
                                       pool_size=ss.pool_size)
        block = np.random.default_rng(child).poisson(1.0, (n_resamples, _POISSON_BLOCK))
        lo, hi = max(start, j * _POISSON_BLOCK), min(stop, (j + 1) * _POISSON_BLOCK)
        out[:, lo - start:hi - start] = block[:, lo - j * _POISSON_BLOCK:hi - j * _POISSON_BLOCK]
    return out


# --- chunked engine ------------------------------------------------------------------------
def check_score_matrix(S: np.ndarray, plan: ResamplingPlan | None = None) -> np.ndarray:
    """Return S as a 2-D float array after checking shape, emptiness and finiteness."""
    if hasattr(S, "blocks"):  # columns read in blocks (circuitstat.core.score_columns): checked block by block
        return _check_blocks(S, plan)
    if not hasattr(S, "shape") or not hasattr(S, "dtype"):
        S = np.asarray(S)
    if S.ndim != 2:
        raise ValueError(f"score matrix must be 2-D [N examples, E edges], got shape {S.shape}")
    n, e = S.shape
    if n == 0 or e == 0:
        raise ValueError(f"score matrix is empty (shape {S.shape}); run attribution on a "
                         "non-empty dataset and edge set first")
    if S.dtype.kind not in "fiu":
        raise ValueError(f"score matrix must be numeric, got dtype {S.dtype}")
    if S.dtype.kind == "f" and not np.isfinite(S).all():
        bad = np.unique(np.nonzero(~np.isfinite(S))[1])
        raise ValueError(f"score matrix has NaN/inf in {bad.size} edge(s) (first: {bad[:5]}); "
                         "drop those edges or fix the metric before resampling")
    if plan is not None and plan.n_obs != n:
        raise ValueError(f"plan has N = {plan.n_obs} examples but the score matrix has {n} rows; "
                         "build the plan with the score matrix's number of examples")
    return S


def _check_blocks(S: Any, plan: ResamplingPlan | None) -> Any:
    """Return S (a ParquetColumns) after the checks of check_score_matrix, one block of edges at a time."""
    n, e = S.shape
    if n == 0 or e == 0:
        raise ValueError(f"score matrix is empty (shape {S.shape}); run attribution on a "
                         "non-empty dataset and edge set first")
    if plan is not None and plan.n_obs != n:
        raise ValueError(f"plan has N = {plan.n_obs} examples but the score matrix has {n} rows; "
                         "build the plan with the score matrix's number of examples")
    bad = [np.unique(np.nonzero(~np.isfinite(block))[1]) + sl.start for sl, block in column_blocks(S)]
    bad = np.concatenate(bad)
    if bad.size:
        raise ValueError(f"score matrix has NaN/inf in {bad.size} edge(s) (first: {bad[:5]}); "
                         "drop those edges or fix the metric before resampling")
    return S


def edge_chunks(n_edges: int, chunk_size: int) -> list[slice]:
    """Return consecutive slices of at most `chunk_size` edges covering range(n_edges)."""
    chunk_size = max(1, int(chunk_size))
    return [slice(s, min(s + chunk_size, n_edges)) for s in range(0, n_edges, chunk_size)]


def default_chunk_size(n_obs: int, n_resamples: int, n_jobs: int = 1,
                       max_bytes: int = DEFAULT_MAX_BYTES) -> int:
    """Return the largest edge chunk whose float64 workspace fits `max_bytes` over all workers."""
    # per edge: the resampled row (B), a sorted copy or mask (B), the float64 scores (N)
    per_edge = 8 * (3 * n_resamples + n_obs)
    return max(1, int(max_bytes // (max(1, n_jobs) * per_edge)))


def resolve_jobs(n_jobs: int) -> int:
    """Return a positive worker count (joblib convention: -1 means all cores)."""
    import os

    if n_jobs is None or n_jobs == 0:
        return 1
    if n_jobs < 0:
        return max(1, (os.cpu_count() or 1) + 1 + n_jobs)
    return int(n_jobs)


def map_edge_chunks(S: np.ndarray, plan: ResamplingPlan,
                    fn: Callable[[np.ndarray, np.ndarray, slice], Any], *,
                    chunk_size: int | None = None, n_jobs: int = 1,
                    max_bytes: int = DEFAULT_MAX_BYTES, backend: str = "threading",
                    check: bool = True) -> Iterator[Any]:
    """Yield fn(resampled [c, B], scores [c, N], edge slice) per chunk, in order (float64).

    `resampled[j, b]` is the mean of edge j in resample b, i.e. row j of (counts @ S / totals).T;
    `scores` is the chunk of S transposed and contiguous, so reductions over examples run along
    its last axis and give bit-identical results whatever the chunk size.
    Workers (joblib, threads by default: numpy releases the GIL in BLAS and sort) only change
    where a chunk runs; outputs come back in chunk order.
    """
    if check:  # callers that already validated S pass check=False to skip a full pass
        S = check_score_matrix(S, plan)
    n_obs, n_edges = S.shape
    jobs = resolve_jobs(n_jobs)
    if chunk_size is None:
        chunk_size = default_chunk_size(n_obs, plan.n_resamples, jobs, max_bytes)
    slices = edge_chunks(n_edges, chunk_size)
    wt = np.ascontiguousarray(plan.counts.T, dtype=np.float64)  # [N, B]
    totals = plan.totals

    def work(sl: slice) -> Any:
        # float64 for this chunk only; [c, N] contiguous: per-edge sums over examples then use
        # the same (pairwise) summation order for every chunk size, so results are chunk-free
        sc = np.ascontiguousarray(np.asarray(S[:, sl], dtype=np.float64).T)
        r = sc @ wt
        r /= totals  # divide (not multiply by 1/N) so the bootstrap equals sum/N like np.mean
        return fn(r, sc, sl)

    if jobs == 1 or len(slices) == 1:
        for sl in slices:
            yield work(sl)
        return
    from joblib import Parallel, delayed

    par = Parallel(n_jobs=jobs, backend=backend, return_as="generator",
                   pre_dispatch=f"{2 * jobs}")
    yield from par(delayed(work)(sl) for sl in slices)


def resampled_means(S: np.ndarray, plan: ResamplingPlan, *,
                    max_bytes: int = 4 * 2**30) -> np.ndarray:
    """Return all resampled means [E, B] (resamples last, as scipy); refuses beyond max_bytes."""
    S = check_score_matrix(S, plan)
    need = 8 * S.shape[1] * plan.n_resamples
    if need > max_bytes:
        raise MemoryError(
            f"[E, B] float64 needs {need / 2**30:.2f} GiB > max_bytes; reduce edges per call or "
            "use the chunked estimators (bootstrap_edges, circuit_stability) that never hold it"
        )
    return np.concatenate(list(map_edge_chunks(S, plan, lambda r, s, sl: r.copy())), axis=0)


# --- general statistics --------------------------------------------------------------------
def is_vectorized(statistic: Callable, vectorized: bool | None) -> bool:
    """Return whether `statistic` accepts an `axis` keyword (scipy's rule when None)."""
    if vectorized is not None:
        return bool(vectorized)
    try:
        return "axis" in inspect.signature(statistic).parameters
    except (TypeError, ValueError):
        return False


def resample_statistic(data: np.ndarray, statistic: Callable[..., Any], plan: ResamplingPlan, *,
                       axis: int = 0, vectorized: bool | None = None, batch: int | None = None,
                       n_jobs: int = 1) -> np.ndarray:
    """Return statistic(resample) for every resample, resamples on the last axis (scipy layout).

    For statistics with no matrix shortcut (median, trimmed mean, ...). The statistic must be
    symmetric in the observations: resamples are materialised with their indices in sorted
    order. `statistic(x, axis=...)` is called on a [batch, n, ...] stack when vectorized.
    """
    data = np.moveaxis(np.asarray(data), axis, 0)
    if data.shape[0] != plan.n_obs:
        raise ValueError(f"data has {data.shape[0]} observations along axis {axis} but the plan "
                         f"has N = {plan.n_obs}")
    vec = is_vectorized(statistic, vectorized)
    equal = bool(np.all(plan.totals == plan.totals[0]))
    size = int(plan.totals[0])
    if batch is None:
        per = max(1, size * int(np.prod(data.shape[1:], dtype=np.int64)) * data.itemsize)
        batch = max(1, (64 * 2**20) // per)
    arange = np.arange(plan.n_obs)

    def work(b0: int, b1: int) -> np.ndarray:
        if vec and equal:
            counts = plan.counts[b0:b1]
            idx = np.repeat(np.tile(arange, b1 - b0), counts.ravel()).reshape(b1 - b0, size)
            return np.asarray(statistic(data[idx], axis=1))
        return np.stack([np.asarray(statistic(data[plan.indices(b)], axis=0) if vec
                                    else statistic(data[plan.indices(b)]))
                         for b in range(b0, b1)])

    bounds = [(b, min(b + batch, plan.n_resamples)) for b in range(0, plan.n_resamples, batch)]
    jobs = resolve_jobs(n_jobs)
    if jobs == 1:
        parts = [work(b0, b1) for b0, b1 in bounds]
    else:
        from joblib import Parallel, delayed

        parts = Parallel(n_jobs=jobs, backend="threading")(delayed(work)(*bb) for bb in bounds)
    return np.moveaxis(np.concatenate(parts, axis=0), 0, -1)


# --- streaming -----------------------------------------------------------------------------
class PoissonBootstrapAccumulator:
    """Streaming Poisson bootstrap of per-edge means: feed batches of rows, read [E, B] means."""

    def __init__(self, n_edges: int, n_resamples: int,
                 seed: int | np.random.SeedSequence | None = None) -> None:
        self.seed = as_seed_sequence(seed)
        self.n_edges, self.n_resamples = int(n_edges), int(n_resamples)
        self.n_seen = 0
        self._sums = np.zeros((self.n_edges, self.n_resamples), dtype=np.float64)
        self._totals = np.zeros(self.n_resamples, dtype=np.float64)
        self._sum = np.zeros(self.n_edges, dtype=np.float64)

    def update(self, batch: np.ndarray) -> None:
        """Add a [n, E] batch of score rows (weights depend only on row position in the stream)."""
        batch = check_score_matrix(batch)
        if batch.shape[1] != self.n_edges:
            raise ValueError(f"batch has {batch.shape[1]} edges, accumulator has {self.n_edges}")
        w = poisson_weights(self.seed, self.n_resamples, self.n_seen, self.n_seen + batch.shape[0])
        b64 = np.asarray(batch, dtype=np.float64)
        self._sums += b64.T @ w.T.astype(np.float64)
        self._totals += w.sum(axis=1)
        self._sum += b64.sum(axis=0)
        self.n_seen += batch.shape[0]

    def estimate(self) -> np.ndarray:
        """Return the per-edge mean of all rows seen so far [E]."""
        return self._sum / self.n_seen

    def resampled_means(self) -> np.ndarray:
        """Return the Poisson-bootstrap means [E, B] of all rows seen so far."""
        if self.n_seen == 0 or (self._totals == 0).any():
            raise ValueError("no data (or a resample with zero weight) yet; feed more rows")
        return self._sums / self._totals

    def plan(self) -> ResamplingPlan:
        """Return the equivalent ResamplingPlan for the rows seen so far."""
        return ResamplingPlan(poisson_weights(self.seed, self.n_resamples, 0, self.n_seen),
                              "poisson", seed_record(self.seed))


# --- studentized (bootstrap-t) resamples ---------------------------------------------------
def plan_weights(plan: ResamplingPlan) -> np.ndarray:
    """Return the plan's counts as a contiguous float64 [N, B] matrix (the engine's layout)."""
    return np.ascontiguousarray(plan.counts.T, dtype=np.float64)


def studentized_resamples(sc: np.ndarray, theta: np.ndarray, weights: np.ndarray,
                          totals: np.ndarray) -> np.ndarray:
    """Return bootstrap-t statistics t*[j, b] = (mean* - mean) / se* for scores sc [c, N].

    se* is the resample's own standard error, sqrt(plug-in variance / (T_b - 1)) with T_b the
    resample's total weight (N for the bootstrap), i.e. np.std(resample, ddof=1) / sqrt(T_b).
    Two matrix products per chunk: centred sums W·U and squared sums W·U² (U = x - mean, so
    there is no cancellation when the mean is large against the spread). A resample with
    se* = 0 (all drawn values equal) gets t* = 0 if its mean equals the sample mean, else ±inf.
    `weights` is plan_weights(plan) [N, B]; `totals` is plan.totals [B].
    """
    u = np.asarray(sc, dtype=np.float64) - np.asarray(theta, dtype=np.float64)[:, None]
    d = (u @ weights) / totals
    m2 = ((u * u) @ weights) / totals
    # plug-in variance of each resample; rounding can leave -1e-17 where it is exactly 0
    var = np.maximum(m2 - d * d, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        se = np.sqrt(var / np.maximum(totals - 1.0, 0.0))
        t = d / se
    zero = ~(se > 0)
    dz = d[zero]
    t[zero] = np.where(dz == 0, 0.0, np.copysign(np.inf, dz))
    return t
