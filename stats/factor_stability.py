"""How much a factor of the variance study moves the circuit: Jaccard to the reference circuit.

A *paired* factor level (a counterfactual draw, an estimator, an aggregation, a training seed)
scores the same N prompts as the reference (exact scores, mean aggregation, the task's own
counterfactual, the first seed), so each dataset gives two score matrices. The estimand of its
interval is

    J_N = E_D[ Jaccard(top-k of the level's aggregated scores on D, top-k of the reference's on D) ]

over datasets D of N prompts from the task's prompt distribution, the level (model, estimator,
counterfactual draw) held fixed. With one dataset that is estimated as the data-level circuit
stability of circuitstat.stats.stability_data is, generalised to two paired matrices (`paired_jaccard`):

* plug-in T: the mean over the run's bootstrap resamples of the paired Jaccard (both circuits
  from the same resample); its Monte Carlo error from the resamples' spread;
* a double bootstrap (circuitstat.stats.resampling.nested_bootstrap: inner resamples of each outer
  resample) gives T*_o per outer resample: se from their spread (less their own Monte Carlo
  error, never below half the raw variance) and the bias mean(T*) - T;
* the split extrapolation: the mean paired Jaccard on disjoint halves and quarters of the data
  (unbiased for J_{N/2} and J_{N/4}; circuitstat.stats.stability_data.split_counts), extrapolated linearly
  in 1/m to m = N.

Interval ("bracketed, paired"): low = min(T - |bias|, split, J_full) - z se, high =
max(max(T + |bias|, split, J_full) + z se, J_full + z sd1), clipped to [0, 1], where J_full is
the full-data Jaccard (one draw of the quantity averaged: unbiased) and sd1 the SD of the
per-resample Jaccards (it matched the SD of J_full over datasets to 0.01 in the simulations).
Unlike the unpaired data-level Jaccard, the split value may lie on either side: paired circuits
share the prompts' noise, so J_m need not grow with m. The plug-in was biased downwards by up to
twice the double bootstrap's estimate (spiky population, k = 20: -0.074 vs -0.040), which is
why the upper end also reaches J_full + z sd1. Measured coverage of the 95% interval (60
datasets per cell; populations of 2000 prompts x 60 edges, reference spiky_population or
smooth_tail_population, level = reference x (1 + 0.3 noise) + 0.5-1.5 SD noise; k = 5/10/20;
spiky N = 32/64/128, smooth N = 64/128): 0.95-1.00 in all 18 cells, widths 0.29-0.63 (2.5-4 SD
of one dataset's Jaccard; the interval is conservative at k = 5). Without the J_full + z sd1
term: 0.85-1.00 (0.85-0.92 at k = 20). Tests: tests/stats/test_variance_intervals.py.

`spread_low` / `spread_high` are the 2.5-97.5 % spread of the per-resample Jaccards of one
dataset: resampling spread (the old "CI" of the study), not an interval for any data-level
quantity; they never drive a verdict.

Top-k is circuitstat.core.topk's (random tie-breaking from the run's seed, independently for the level's and
the reference's circuit, so edges tied at the cut-off are not shared by construction); the
edges tied at each level's full-data cut-off are counted (``cutoff_ties``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy.special import ndtri

from circuitstat.core.errors import InputError

from circuitstat.core.seeds import as_seed_sequence, spawn_seeds
from circuitstat.core.topk import ranking_key, row_seeds, select_topk, tie_priorities
from .resampling import nested_bootstrap
from .stability_data import MIN_INNER, MIN_OBS, MIN_OUTER, N_SPLITS, split_counts

__all__ = ["AGGREGATIONS", "PAIRED_ESTIMAND", "SPREAD_LABEL", "aggregate", "ranked_tops",
           "jaccard_pairs", "circuit_jaccard", "fresh_draw_jaccards", "bar_verdict", "PairedJaccard", "paired_jaccard"]

AGGREGATIONS = ("mean", "median", "trimmed_mean", "mean_abs")
PAIRED_ESTIMAND = ("E over datasets of N prompts of Jaccard(top-k of the level's scores, top-k of the "
                   "reference's scores), both on the same prompts; the level held fixed (double bootstrap "
                   "+ split extrapolation, bracketed)")
SPREAD_LABEL = "2.5-97.5% spread of per-resample Jaccards of one dataset (resampling spread, not a CI)"
#: rows of the resampling engine aggregated at once (bounds the [rows, E] memory)
_ROW_BLOCK = 256


def aggregate(S: np.ndarray, how: str, trim: float, counts: np.ndarray | None = None) -> np.ndarray:
    """Return aggregated scores [E] (counts None) or one row per resample [B, E] (counts [B, N])."""
    from scipy import stats as sps

    if how not in AGGREGATIONS:
        raise InputError(f"unknown aggregation {how!r}; use one of {AGGREGATIONS}")
    S = np.asarray(S, dtype=np.float64)
    if how in ("mean", "mean_abs"):
        X = np.abs(S) if how == "mean_abs" else S
        if counts is None:
            return X.sum(0) / X.shape[0]
        W = np.asarray(counts, dtype=np.float64)
        return (W @ X) / W.sum(1, keepdims=True)
    fn = (lambda x: np.median(x, axis=0)) if how == "median" else (lambda x: sps.trim_mean(x, trim, axis=0))
    if counts is None:
        return fn(S)
    idx = np.arange(S.shape[0])
    return np.stack([fn(S[np.repeat(idx, c)]) for c in np.asarray(counts)])


def ranked_tops(V: np.ndarray, K: int, ranking: str, seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ([R, K] top-K edges in rank order, [R] edges tied at the K-th key) of V [R, E].

    seeds: one uint64 tie-breaking seed per row (circuitstat.core.topk.row_seeds); ties at random.
    """
    V = np.atleast_2d(np.asarray(V, dtype=np.float64))
    key = ranking_key(V, ranking)
    pri = tie_priorities(np.asarray(seeds, dtype=np.uint64), np.arange(V.shape[1]))
    idx, _, n_eq, _ = select_topk(key, pri, int(K))
    return idx, n_eq


def jaccard_pairs(A: np.ndarray, R: np.ndarray, pairs: Sequence[tuple[int, int]], n_cols: int) -> np.ndarray:
    """Return [B, len(pairs)]: Jaccard of the top-ka of A and the top-kb of R per row, per (ka, kb).

    A, R: [B or 1, >= k] ranked edge lists; a single row broadcasts.
    """
    A, R = np.atleast_2d(A), np.atleast_2d(R)
    B = max(A.shape[0], R.shape[0])
    A = np.broadcast_to(A, (B, A.shape[1]))
    R = np.broadcast_to(R, (B, R.shape[1]))
    rows = np.arange(B)[:, None]
    big = max(A.shape[1], R.shape[1]) + 1
    pa = np.full((B, n_cols), big, dtype=np.int64)
    pr = np.full((B, n_cols), big, dtype=np.int64)
    pa[rows, A] = np.arange(A.shape[1])  # rank of each edge in each list
    pr[rows, R] = np.arange(R.shape[1])
    out = np.empty((B, len(pairs)))
    for i, (ka, kb) in enumerate(pairs):
        inter = ((pa < ka) & (pr < kb)).sum(1)
        out[:, i] = inter / (ka + kb - inter)
    return out


def circuit_jaccard(Va: np.ndarray, Vb: np.ndarray, pairs: Sequence[tuple[int, int]], *, ranking: str,
                    seed: Any) -> np.ndarray:
    """Return [len(pairs)]: Jaccard of the top-ka circuit of scores Va [E] and the top-kb of Vb [E]."""
    K = max(max(a, b) for a, b in pairs)
    seeds = row_seeds(np.random.default_rng(as_seed_sequence(seed)), 2)
    ta, _ = ranked_tops(Va, K, ranking, seeds[:1])
    tb, _ = ranked_tops(Vb, K, ranking, seeds[1:])
    return jaccard_pairs(ta, tb, pairs, np.shape(Va)[-1])[0]


def fresh_draw_jaccards(S_ref: np.ndarray, draws: Sequence[tuple[np.ndarray, str]], pairs: Sequence[tuple[int, int]],
                        *, ranking: str, trim: float, seed: Any) -> tuple[np.ndarray, np.ndarray]:
    """Return ([draws, P] Jaccard of each independent dataset's full-data circuit to the reference's, [P] their mean).

    Each value is one draw of J(top-k of D1, top-k of D2) for independent datasets: its interval
    is the data-level one of circuitstat.stats.stability_data (jaccard_data_ci), not computed here.
    """
    V0 = aggregate(S_ref, "mean", trim)
    seeds = spawn_seeds(as_seed_sequence(seed), max(len(draws), 1))
    J = np.array([circuit_jaccard(aggregate(S, how, trim), V0, pairs, ranking=ranking, seed=sd)
                  for (S, how), sd in zip(draws, seeds)]).reshape(len(draws), len(pairs))
    return J, J.mean(axis=0) if len(draws) else np.full(len(pairs), np.nan)


def bar_verdict(low: float, high: float, bar: float) -> str:
    """Return 'met' (interval above the bar), 'not met' (below it), 'inconclusive', or '' (no interval)."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return ""
    return "met" if low >= bar else ("not met" if high < bar else "inconclusive")


@dataclass
class PairedJaccard:
    """Per level (rows; the mean over levels last when asked) and pair (columns): paired Jaccard."""

    estimate: np.ndarray  # plug-in T: mean over the main resamples
    mc: np.ndarray  # its Monte Carlo error
    full_data: np.ndarray  # Jaccard of the two full-data circuits (one draw of the estimand's variable)
    se: np.ndarray
    bias: np.ndarray
    split: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    spread_low: np.ndarray  # resampling spread, labelled SPREAD_LABEL
    spread_high: np.ndarray
    resample_sd: np.ndarray  # SD of the per-resample Jaccards (estimates the SD of one dataset's Jaccard)
    cutoff_ties: np.ndarray  # edges tied at the k-th key of the level's full-data circuit
    n_outer: int
    n_inner: int


def _check(S_ref: np.ndarray, levels: Sequence[tuple[np.ndarray, str]], n_outer: int, n_inner: int,
           confidence_level: float) -> None:
    """Raise InputError for shapes, sizes or resample counts the paired interval cannot use."""
    N = S_ref.shape[0]
    if N < MIN_OBS:
        raise InputError(f"a data-level Jaccard interval needs at least {MIN_OBS} examples, got N = {N}; "
                         "attribute more prompts")
    if any(np.shape(S) != S_ref.shape for S, _ in levels):
        raise InputError("paired levels must score the same prompts and edges as the reference (same shape)")
    if n_outer < MIN_OUTER or n_inner < MIN_INNER:
        raise InputError(f"n_outer = {n_outer}, n_inner = {n_inner} are too few; use at least {MIN_OUTER} outer "
                         f"and {MIN_INNER} inner resamples")
    if not 0 < confidence_level < 1:
        raise InputError(f"confidence_level must lie in (0, 1), got {confidence_level}")


def _per_level_pairs(pairs: Sequence, n_levels: int) -> list[list[tuple[int, int]]]:
    """Return one list of (k_level, k_ref) pairs per level (a shared list is repeated)."""
    pairs = list(pairs)
    if pairs and isinstance(pairs[0], tuple):
        per = [[(int(a), int(b)) for a, b in pairs]] * n_levels
    else:
        per = [[(int(a), int(b)) for a, b in p] for p in pairs]
    if len(per) != n_levels or len({len(p) for p in per}) != 1 or not per[0]:
        raise InputError("pairs must be one list of (k_level, k_ref) or one such list per level, all of one length")
    return per


def _row_jaccards(S_ref: np.ndarray, levels: Sequence[tuple[np.ndarray, str]], counts: np.ndarray,
                  pairs: list[list[tuple[int, int]]], ranking: str, trim: float, seeds: np.ndarray) -> np.ndarray:
    """Return [R, L, P]: per resample row, the paired Jaccard of each level to the reference."""
    K = max(max(a, b) for p in pairs for a, b in p)
    E = S_ref.shape[1]
    out = np.empty((counts.shape[0], len(levels), len(pairs[0])))
    for s in range(0, counts.shape[0], _ROW_BLOCK):
        c, sd = counts[s:s + _ROW_BLOCK], seeds[s:s + _ROW_BLOCK]
        ref, _ = ranked_tops(aggregate(S_ref, "mean", trim, c), K, ranking, sd[:, 0])
        for i, (S, how) in enumerate(levels):
            tops, _ = ranked_tops(aggregate(S, how, trim, c), K, ranking, sd[:, i + 1])
            out[s:s + c.shape[0], i] = jaccard_pairs(tops, ref, pairs[i], E)
    return out


def _bracket(est: np.ndarray, mc: np.ndarray, star: np.ndarray, star_mc: np.ndarray, split: np.ndarray,
             full: np.ndarray, sd1: np.ndarray, z: float) -> tuple[np.ndarray, ...]:
    """Return (se, bias, low, high) from the outer statistics star [..., n_outer] (see module doc)."""
    raw = star.var(axis=-1, ddof=1)
    var = np.maximum(raw - np.mean(star_mc**2, axis=-1), raw / 2)  # less the outers' Monte Carlo error
    se = np.sqrt(var + mc**2)
    bias = star.mean(axis=-1) - est
    lo = np.minimum.reduce([est - np.abs(bias), split, full]) - z * se
    # the plug-in's downward bias was up to twice the double bootstrap's estimate: the upper end
    # also reaches the normal interval of the full-data Jaccard (unbiased, SD ~ the resamples' SD)
    hi = np.maximum(np.maximum.reduce([est + np.abs(bias), split, full]) + z * se, full + z * sd1)
    return se, bias, np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)


def _cutoff_ties(levels: Sequence[tuple[np.ndarray, str]], pairs: list[list[tuple[int, int]]], shape: tuple,
                 ranking: str, trim: float) -> np.ndarray:
    """Return [shape]: edges tied at the k-th key of each level's full-data circuit (-1 on a mean row)."""
    ties = np.full(shape, -1, dtype=np.int64)
    for i, (S, how) in enumerate(levels):
        key = ranking_key(aggregate(S, how, trim), ranking)
        for p, (ka, _) in enumerate(pairs[i]):
            ties[i, p] = int((key == np.partition(key, key.size - ka)[key.size - ka]).sum())
    return ties


def paired_jaccard(S_ref: np.ndarray, levels: Sequence[tuple[np.ndarray, str]],
                   pairs: Sequence[tuple[int, int]], main_counts: np.ndarray, *, ranking: str, trim: float = 0.1,
                   seed: Any, n_outer: int = 100, n_inner: int = 20, confidence_level: float = 0.95,
                   with_mean: bool = False, intervals: bool = True) -> PairedJaccard:
    """Return the paired Jaccard of each level to the reference circuit with its data-level interval.

    S_ref [N, E]: the reference scores (mean aggregation); levels: (scores [N, E] on the same
    prompts, aggregation) per level; pairs: (k of the level, k of the reference), shared by all
    levels or one list (of one length) per level; main_counts
    [B, N]: the run's bootstrap resamples (the plug-in); seed fixes the nested resamples, the
    splits and the ties. with_mean adds a last row for the mean over levels (one statistic per
    resample, so its interval accounts for the levels' dependence), column p averaging each level's
    p-th pair. intervals=False gives the plug-in, full-data value and spread only (NaN interval;
    no minimum N).
    """
    S_ref = np.asarray(S_ref, dtype=np.float64)
    if intervals:
        _check(S_ref, levels, n_outer, n_inner, confidence_level)
    elif any(np.shape(S) != S_ref.shape for S, _ in levels):
        raise InputError("paired levels must score the same prompts and edges as the reference (same shape)")
    pairs = _per_level_pairs(pairs, len(levels))
    N = S_ref.shape[0]
    c_nest, c_split, c_ties = spawn_seeds(as_seed_sequence(seed), 3)
    main = np.asarray(main_counts)
    if main.ndim != 2 or main.shape[1] != N or main.shape[0] < 2:
        raise InputError(f"main_counts must be [B >= 2, N = {N}] resample counts, got shape {main.shape}")
    blocks = [np.ones((1, N), dtype=np.int32), main]
    if intervals:
        blocks += [nested_bootstrap(N, n_outer, n_inner, c_nest)[1].counts, split_counts(N, N_SPLITS, c_split)]
    counts = np.vstack(blocks)
    # independent tie-breaking per circuit: edges tied at the cut-off in both are not the same
    # edges by construction (10 non-zero edges at k = 20 must not give Jaccard 1)
    seeds = row_seeds(np.random.default_rng(c_ties), counts.shape[0] * (len(levels) + 1)).reshape(
        counts.shape[0], len(levels) + 1)
    J = _row_jaccards(S_ref, levels, counts, pairs, ranking, trim, seeds)  # [R, L, P]
    if with_mean:
        J = np.concatenate([J, J.mean(axis=1, keepdims=True)], axis=1)
    J = np.moveaxis(J, 0, -1)  # [L, P, R]
    B = main.shape[0]
    full, jm = J[..., 0], J[..., 1:1 + B]
    est, mc = jm.mean(-1), jm.std(-1, ddof=1) / np.sqrt(B)
    a = 1 - confidence_level
    s_lo, s_hi = np.quantile(jm, [a / 2, 1 - a / 2], axis=-1)
    ties = _cutoff_ties(levels, pairs, est.shape, ranking, trim)
    if not intervals:
        nan = np.full(est.shape, np.nan)
        return PairedJaccard(est, mc, full, nan, nan, nan, nan, nan, s_lo, s_hi, jm.std(-1, ddof=1), ties, 0, 0)
    ji = J[..., 1 + B:1 + B + n_outer * n_inner].reshape(J.shape[:2] + (n_outer, n_inner))
    js = J[..., 1 + B + n_outer * n_inner:].reshape(J.shape[:2] + (N_SPLITS, 6))
    star, star_mc = ji.mean(-1), ji.std(-1, ddof=1) / np.sqrt(n_inner)
    half, quarter = js[..., :2].mean((-2, -1)), js[..., 2:].mean((-2, -1))
    split = half + (half - quarter) / 2  # linear in 1/m from m = N/2, N/4 to m = N
    z = float(ndtri(0.5 + confidence_level / 2))
    se, bias, lo, hi = _bracket(est, mc, star, star_mc, split, full, jm.std(-1, ddof=1), z)
    return PairedJaccard(est, mc, full, se, bias, split, lo, hi, s_lo, s_hi, jm.std(-1, ddof=1), ties, int(n_outer),
                         int(n_inner))
