"""Data-level circuit stability from disjoint halves: J_{N/2}, exactly estimable, with a jackknife interval.

J_m = E[Jaccard(top-k of D1, top-k of D2)] for two independent datasets of m prompts. From one dataset of N
prompts, J_N has no unbiased estimator (two independent size-N datasets would need 2N prompts), but J_{N/2}
has one: for a random split of the N prompts into two disjoint halves A and B, the halves are independent
size-N/2 datasets, so E[J(A, B)] = J_{N/2} exactly, and so is the average over any number of random splits
(T, the reported jaccard_half). Under a cluster plan the units are whole templates (halves of the templates);
under a stratified plan every stratum is halved (each half keeps the stratum shares). With an odd number of
units one unit sits out of each split (a different one each time), so the halves have floor(U/2) units.

The standard error of T is not the SD over splits: splits of one dataset share its noise, and that SD measures
the Monte Carlo error of the split average, not how T varies from dataset to dataset (the naive interval
T -+ z sd / sqrt(splits) covers far too rarely; tests/stats/test_stability_halves.py). T is a symmetric function
of all N prompts (a U-statistic whose kernel has degree N), and an unbiased variance estimator for such a
statistic does not exist (Wang & Lindsay 2014, "Variance estimation of a general U-statistic with application
to cross-validation", Statistica Sinica 24: one needs kernel degree <= N/2). We use the delete-a-group
jackknife (Shao & Wu 1989, Ann. Statist. 17; Efron & Stein 1981, Ann. Statist. 9): the units are dealt at
random into G blocks; T_(g) is the same split average on the data without block g, with the same random splits
restricted to the remaining units (common random numbers: the Monte Carlo noise of T_(g) - T_(h) stays
small); then

    v_J = (G - 1) / G * sum_g (T_(g) - mean_h T_(h))^2.

By the Efron-Stein inequality (with the iid blocks as units) E[v_J] >= (G - 1) / G Var(T on G - 1 blocks),
about Var(T) where the variance falls like 1 / N: conservative in expectation, never knowingly too small. The
splits come in R independent batches; the deviations' Monte Carlo share is estimated from their spread over
batches and removed (never below zero), and T's own Monte Carlo variance (the SD of J over splits divided
by sqrt(splits)) is added.

The interval (half_interval) is built on the arcsine-square-root scale, g(J) = asin(sqrt(J)), the variance-
stabilising transform of a quantity bounded in [0, 1] (Anscombe 1948, Biometrika 35), with the jackknife SE
carried over by the delta method, g'(T) se = se / (2 sqrt(T (1 - T))), and mapped back with sin^2: asymmetric,
longer on the side away from the nearer bound. At small J, T is right-skewed (skewness +0.2 to +0.9 across
datasets where J_{N/2} < 0.3 on the design populations: most datasets land below J_{N/2}, a few far above), so
the symmetric T -+ z se missed one-sidedly with the truth above (spiky-1, N = 32, k = 5: 16 of 200 above, none
below; the arcsine interval: 1 above, none below).
Where T is 0 or 1 and se > 0 the delta method has no slope and the interval is T -+ q se, clipped to [0, 1].

The critical value q is the normal quantile where at least MIN_EVENTS splits have a Jaccard other than its most
frequent value, and Student's t with max(events - 1, 1) degrees of freedom below that: the spread rests on the
splits that disagree, and with few of them the jackknife SE is itself noisy and small (the design populations'
studentised errors had a 95% quantile of 2.2-2.9 with 3-15 such splits against 1.5-1.6 with 20 or more). Where
no split disagrees (events = 0) whatever spread there is comes from the leave-block-out splits alone, and the
lower end is also bounded by the sampling-aware gap bound circuitstat.stats.flip_bound.jaccard_gap_floor at
m = N/2 (computed only there); where moreover se is exactly 0 (every leave-block-out split alike too) the
interval is [min(T, gap bound), 1], 1 the range's end. The gap bound is below 1 by at least machine epsilon, so
no interval has zero width. (Before, the gap bound also lowered the interval wherever fewer than 10 splits
disagreed; it was 0 in all 334 such (dataset, k) of the design populations, which made cells with many of them
2-5.6 x too wide.)

The rule (16 blocks, the arcsine scale, t below 20 disagreeing splits) was chosen on the four design populations
of bench/halves_coverage.py against 8, 12 and 32 blocks, the logit scale, a symmetric interval, a skewness
(acceleration) correction from the jackknife's third moment and other thresholds, then measured on six held-out
populations. One change came after that held-out run: the gap bound also where no split disagrees but se > 0
(it had applied only at se = 0; two held-out cells were at 0.925 and 0.905). It moved design cells by at most
0.005 in coverage. Measured (200 datasets per cell, N = 32/64/128, k = 5/10/20; docs/calibration.md, "Primary:
J_N/2 from disjoint halves"): design coverage 0.955-1.000, width 1.07-2.38 x a correct normal interval (median
1.26); held out 0.935-1.000, width 1.05-2.09 x (median 1.31; above 1.3 x in 28 of 54 cells, mostly where the
jackknife is conservative). Misses fell from 213 below / 384 above to 198 below / 208 above over the 90 cells.
No zero-width interval in 18,000.

J_N itself is reported beside it as an extrapolation (jaccard_data*, circuitstat.stats.stability_data: the
bracketed double bootstrap, its method named in jaccard_data_method). J_{N/2} <= J_N where more data gives
more agreement (typical; not guaranteed where a population has near-ties at the cut-off).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from scipy.special import ndtri
from scipy.stats import t as student_t

from circuitstat.core.errors import InputError
from circuitstat.core.seeds import as_seed_sequence, spawn_seeds
from circuitstat.core.topk import row_seeds

from .flip_bound import jaccard_gap_floor, unit_means_order
from .resampling import DEFAULT_MAX_BYTES, ResamplingPlan
from .topk_stream import streaming_topk

__all__ = ["HALF_COLUMNS", "N_BATCHES", "N_BLOCKS", "PERMS_PER_BATCH", "MIN_EVENTS",
           "half_split_rows", "halves_from_tops", "half_interval", "pair_jaccard", "halves_stability"]

#: blocks of the grouped jackknife (G; fewer when there are fewer units)
N_BLOCKS = 16
#: independent batches of splits (the Monte Carlo share of the jackknife deviations comes from their spread)
N_BATCHES = 8
#: random splits per batch
PERMS_PER_BATCH = 8
#: splits with a Jaccard other than its most frequent value, below which the critical value is Student's t
#: with (events - 1) df instead of the normal quantile
MIN_EVENTS = 20
#: the columns halves_stability returns (one value per k)
HALF_COLUMNS = ("jaccard_half", "jaccard_half_se", "jaccard_half_mc_se", "jaccard_half_ci_low",
                "jaccard_half_ci_high", "jaccard_half_floor", "jaccard_half_units")


def _unit_blocks(n_units: int, n_blocks: int, rng: np.random.Generator,
                 strata: np.ndarray | None) -> np.ndarray:
    """Return each unit's jackknife block (0..G-1), dealt at random (round robin within each stratum)."""
    block = np.empty(n_units, dtype=np.int64)
    labels = np.zeros(n_units, dtype=np.int64) if strata is None else strata
    offset = 0
    for s in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == s))
        block[members] = (offset + np.arange(members.size)) % n_blocks
        offset += members.size  # continue the deal, so blocks stay within one unit of equal size
    return block


def half_split_rows(n_units: int, n_perms: int, blocks: np.ndarray, rng: np.random.Generator,
                    strata: np.ndarray | None = None) -> np.ndarray:
    """Return 0/1 unit weights [n_perms * (G + 1) * 2, n_units]: per split, halves (A, B), then (A, B) minus each block.

    Each split deals every stratum's units (all units when strata is None) in random order: the first
    floor(n_s / 2) to A, the next floor(n_s / 2) to B (with n_s odd, one sits out).
    """
    n_blocks = int(blocks.max()) + 1
    labels = np.zeros(n_units, dtype=np.int64) if strata is None else np.asarray(strata)
    halves = np.zeros((n_perms, 2, n_units), dtype=np.int8)
    for s in np.unique(labels):
        members = np.flatnonzero(labels == s)
        h = members.size // 2
        order = members[np.argsort(rng.random((n_perms, members.size)), axis=1)]
        np.put_along_axis(halves[:, 0], order[:, :h], 1, axis=1)
        np.put_along_axis(halves[:, 1], order[:, h:2 * h], 1, axis=1)
    keep = np.vstack([np.ones(n_units, dtype=np.int8)] +
                     [(blocks != g).astype(np.int8) for g in range(n_blocks)])  # [G + 1, U]
    rows = halves[:, None, :, :] * keep[None, :, None, :]  # [P, G + 1, 2, U]
    return rows.reshape(-1, n_units)


def pair_jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return the Jaccard index of each row pair of equal-size edge sets a, b [rows, k]."""
    k = a.shape[1]
    both = np.sort(np.concatenate([a, b], axis=1), axis=1)
    inter = (both[:, 1:] == both[:, :-1]).sum(axis=1)  # each set has distinct edges: a repeat is a shared edge
    return inter / (2 * k - inter)


def halves_from_tops(tops: np.ndarray, n_perms: int, n_blocks: int, n_batches: int) -> dict[str, float]:
    """Return T ("est"), its jackknife se, Monte Carlo se ("mc") and "events" from halves' top-k rows.

    tops [n_perms * (G + 1) * 2, k] in the row order of half_split_rows; events: the splits whose Jaccard differs
    from its most frequent value.
    """
    k = tops.shape[1]
    pairs = tops.reshape(n_perms, n_blocks + 1, 2, k)
    jac = pair_jaccard(pairs[:, :, 0].reshape(-1, k), pairs[:, :, 1].reshape(-1, k)).reshape(n_perms, n_blocks + 1)
    est = float(jac[:, 0].mean())
    mc = float(jac[:, 0].std(ddof=1) / np.sqrt(n_perms))
    # per batch r: the leave-block-out averages T_(g)^(r) and their deviations from their mean over g
    per_batch = jac[:, 1:].reshape(n_batches, n_perms // n_batches, n_blocks).mean(axis=1)  # [R, G]
    dev = per_batch - per_batch.mean(axis=1, keepdims=True)
    dbar = dev.mean(axis=0)
    mc_share = dev.var(axis=0, ddof=1) / n_batches  # Monte Carlo variance of each averaged deviation
    g = n_blocks
    var_j = max((g - 1) / g * float(np.sum(dbar ** 2 - mc_share)), 0.0)
    se = float(np.sqrt(var_j + mc ** 2))
    _, counts = np.unique(jac[:, 0], return_counts=True)
    # splits whose Jaccard differs from the most frequent value: the events the spread rests on
    events = int(n_perms - counts.max())
    return {"est": est, "se": se, "mc": mc, "events": events}


def half_interval(est: float, se: float, events: int, floor: float, confidence_level: float) -> tuple[float, float]:
    """Return (low, high): the interval for J_{N/2} on the arcsine-square-root scale (module docstring).

    est T in [0, 1], se its standard error, events the splits whose Jaccard differs from the most frequent
    value, floor the gap bound (read only where events is 0). Always low < high.
    """
    if events == 0 and not floor <= 1:  # NaN: the caller skipped the bound where it is needed
        raise ValueError("half_interval needs the gap bound (jaccard_gap_floor) where no split disagrees, got "
                         f"{floor}; compute it for this k")
    if se == 0:  # no spread visible: the gap bound below, the range's end above
        return float(min(est, floor)), 1.0
    tail = 0.5 + confidence_level / 2
    q = float(ndtri(tail)) if events >= MIN_EVENTS else float(student_t.ppf(tail, max(events - 1, 1)))
    if not 0 < est < 1:  # the arcsine's slope is infinite at the bounds
        lo, hi = max(est - q * se, 0.0), min(est + q * se, 1.0)
    else:
        y, s = np.arcsin(np.sqrt(est)), se / (2 * np.sqrt(est * (1 - est)))  # delta method
        lo, hi = (float(np.sin(np.clip(y + d, 0.0, np.pi / 2)) ** 2) for d in (-q * s, q * s))
    if events == 0:  # no split of the data disagrees: the spread is the leave-block-out splits' only
        lo = min(lo, floor)
    return float(lo), float(hi)


def _units(n_obs: int, strata: np.ndarray | None, groups: np.ndarray | None) -> tuple:
    """Return (unit of each example, number of units, strata per unit or None)."""
    if strata is not None and groups is not None:
        raise InputError("data-level stability halves strata or templates, not both; drop one of them")
    if groups is not None:
        unit = np.unique(np.asarray(groups), return_inverse=True)[1].astype(np.int64)
        return unit, int(unit.max()) + 1, None
    st = None if strata is None else np.unique(np.asarray(strata), return_inverse=True)[1].astype(np.int64)
    return np.arange(n_obs), n_obs, st


def halves_stability(S: np.ndarray, ks: Sequence[int], *, ranking: str, seed: Any,
                     confidence_level: float = 0.95, strata: np.ndarray | None = None,
                     groups: np.ndarray | None = None, n_blocks: int = N_BLOCKS, n_batches: int = N_BATCHES,
                     perms_per_batch: int = PERMS_PER_BATCH, chunk_size: int | None = None, n_jobs: int = 1,
                     max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, np.ndarray]:
    """Return per-k columns HALF_COLUMNS: J_{N/2} from disjoint halves, its jackknife se and interval.

    S [N, E] scores; seed (SeedSequence/int) fixes the blocks, splits and ties; strata [N] halve each stratum;
    groups [N] (a cluster plan's templates) make whole templates the units.
    """
    if not 0 < confidence_level < 1:
        raise InputError(f"confidence_level must lie in (0, 1), got {confidence_level}")
    if int(n_blocks) < 2 or int(n_batches) < 2 or int(perms_per_batch) < 1:
        raise InputError(f"the jackknife needs n_blocks >= 2, n_batches >= 2 and perms_per_batch >= 1, got "
                         f"{n_blocks}, {n_batches}, {perms_per_batch}")
    n_obs, n_edges = S.shape
    unit, n_units, unit_strata = _units(n_obs, strata, groups)
    if n_units < 4:
        raise InputError(f"J_(N/2) needs at least 4 independent units (examples or templates), got {n_units}")
    ks_arr = np.asarray(ks, dtype=np.int64)
    if ks_arr.size == 0 or ks_arr.min() < 1 or ks_arr.max() > n_edges:
        raise InputError(f"every k must lie in 1..{n_edges} (the edges), got {list(ks_arr)}; lower the largest k")
    g = int(min(n_blocks, n_units))
    c_blocks, c_splits, c_ties = spawn_seeds(as_seed_sequence(seed), 3)
    blocks = _unit_blocks(n_units, g, np.random.default_rng(c_blocks), unit_strata)
    n_perms = int(n_batches) * int(perms_per_batch)
    rows = half_split_rows(n_units, n_perms, blocks, np.random.default_rng(c_splits), unit_strata)
    plan = ResamplingPlan.from_counts(rows[:, unit].astype(np.int32))
    state, _ = streaming_topk(S, plan, int(ks_arr.max()), ranking, row_seeds(np.random.default_rng(c_ties),
                              plan.n_resamples), chunk_size=chunk_size, n_jobs=n_jobs, max_bytes=max_bytes)
    cols = {c: np.empty(ks_arr.size) for c in HALF_COLUMNS}
    res = [halves_from_tops(state.idx[:, :k], n_perms, g, int(n_batches)) for k in ks_arr]
    # no split disagrees: the gaps also bound the lower end (computed only there: K x E pairs)
    flat = np.array([r["events"] == 0 for r in res])
    floors = np.full(ks_arr.size, np.nan)
    if flat.any():
        _, order = unit_means_order(S, ranking, None if groups is None else unit)
        floors[flat] = jaccard_gap_floor(S, order, ks_arr[flat], max(n_units // 2, 1), ranking, confidence_level,
                                         None if groups is None else unit)
    for i, r in enumerate(res):
        lo, hi = half_interval(r["est"], r["se"], r["events"], floors[i], confidence_level)
        cols["jaccard_half"][i], cols["jaccard_half_se"][i], cols["jaccard_half_mc_se"][i] = r["est"], r["se"], r["mc"]
        cols["jaccard_half_ci_low"][i], cols["jaccard_half_ci_high"][i] = lo, hi
        cols["jaccard_half_floor"][i] = floors[i]
    labels = np.zeros(n_units, dtype=np.int64) if unit_strata is None else unit_strata
    cols["jaccard_half_units"][:] = int(np.sum(np.bincount(labels) // 2))  # units in each half
    return cols
