"""Data-level circuit stability at size N: J_N as an extrapolation, J to the population, Phi_N.

The primary data-level quantity is J_{N/2}, exactly estimable from disjoint halves, with a bias-corrected
bootstrap interval (circuitstat.stats.stability_halves: 0.8-5.8 x the width of a correct normal interval, median 1.16-1.23, where this
module's bracket was 4.4-15 SD, median 9.4; docs/calibration.md). J_N = E[Jaccard] of two independent size-N
datasets has no unbiased estimator from one dataset of N; it is reported here as an extrapolation, labelled
"J_N (extrapolated, bracketed double bootstrap)" in the tables' estimands.

The mean pairwise Jaccard over bootstrap resamples (Méloux et al.) is the bootstrap plug-in
estimate of J_N = E[Jaccard(top-k of D1, top-k of D2)] for two independent datasets D1, D2 of N
prompts from the task's prompt distribution; the mean Jaccard of each resample's circuit to the
full data's is the plug-in estimate of E[Jaccard(top-k of a size-N sample, top-k of the
population)]; Nogueira's Phi over resamples is the plug-in estimate of the same Phi for size-N
datasets (for equal set sizes, the expected Kuncheva index of two independent datasets). The
spread of those statistics over resamples of one dataset is Monte Carlo error: it says nothing
about how the statistic varies from dataset to dataset, so its "CI" covered J_N in 19-26% of
datasets (issue 13).

Here the sampling distribution of each plug-in statistic comes from a double bootstrap: outer
resamples D*_o of the data, and for each, inner resamples of D*_o (circuitstat.stats.resampling.
nested_bootstrap; one chunked pass of the engine over all rows). For each outer o the same
statistic T*_o is computed from its inner resamples. Then

* se   = sqrt(var_o(T*_o) - mean_o(mc_o^2) + mc^2), where mc_o is the jackknife Monte Carlo
  error of T*_o over its n_inner resamples and mc that of the estimate itself (the raw
  variance is kept when the Monte Carlo share would remove more than half of it);
* bias = mean_o(T*_o) - T, the double-bootstrap estimate of the plug-in's bias;
* split = the split-half extrapolation: the mean J (or Kuncheva index) between the top-k of
  disjoint halves and of disjoint quarters of the data over N_SPLITS random splits (unbiased
  for J_{N/2} and J_{N/4}), extrapolated linearly in 1/m to m = N.

The plug-in is biased upwards where the population has no structure at the cut-off
(resamples of one dataset share its noise, and with heavy tails its rare spikes: up to +0.18 at
J ~ 0.12 on spiky populations, N = 32) and downwards where a real score gap sits at the cut-off
(the dataset's noise blurs the gap: -0.09 at J = 0.76, smooth population, N = 128, k = 5). The
double bootstrap estimates that bias from the effect of a second layer of the same noise, and
the first layer's effect is larger (about twice: noise enters the gaps through its SD, and
sqrt(2) - 1 < 1) and need not have the same sign, so the bias estimate is neither reliable in
size nor in sign. J_m grows faster than linearly in 1/m on spiky data, so the split
extrapolation is biased downwards. Method "bracketed_2n" (the default) therefore reports

    [min(T - |bias|, split, half) - z se,  max(T + |bias|, T_2N) + z se]

where half is the halves' value itself (unbiased for J_{N/2} <= J_N: the extrapolation's own
noise, about twice the plug-in's SD, left the lower end above J_N in 12-15% of some spiky
cells; the reported *_split column is min(split, half) under this method), and T_2N is the
same plug-in from 2 * n_outer bootstrap resamples of size 2N drawn from the N examples:
twice the data per circuit raises the agreement by more than the shared noise lowers it where
the plug-in is biased down, and where it is biased up T_2N lies above T anyway. For J to the
population there is no split analogue (the population's circuit is never seen): its lower
end is also bounded by the data-level one (J(sample, population) >= J(sample, sample) held in
every population measured, to 0.002 where the population has near-ties) and its upper end by
the data-level one through the overlap bound pop_upper_from_data (Cauchy-Schwarz). Method
"bracketed" (the former default) is the same without half, T_2N and the upper population
bound; it covered 0.70 at smooth N = 128, k = 5, where its upper end stayed below J_N.

Measured coverage of the 95% intervals (80-100 datasets per cell, the real estimator with
n_resamples = 200, n_outer = 60, n_inner = 15; N = 32/64/128, k = 5/10/20; eight populations:
the zoo fixture, spiky_population(2000, E, seed) with (100, 1), (80, 9), (90, 13) and
smooth_tail_population(2000, E, seed) with (100, 5), (60, 2026), (80, 31), (90, 77); 72 cells;
summarised in docs/calibration.md), bracketed_2n / bracketed: jaccard_data 0.93-1.00 /
0.70-1.00, phi_data 0.93-1.00 / 0.74-1.00, jaccard_pop 0.95-1.00 / 0.70-1.00. Not a blind check:
the smooth seed-5 population's failing cell was used to diagnose the problem, the candidates
were compared on the zoo, spiky seed 1 and smooth seeds 5 and 2026 at once (T_2N was picked
because it bounded the truth from above in every cell while T + |bias| did not), and the halves'
bound was added after a lower-end miss on spiky seed 9; only seeds 13 and 77 were unseen
(jaccard_data 0.96-1.00, phi_data 0.93-1.00 there). The price is width and over-coverage: median
coverage 1.00, widths 4.4-15 SD of the estimate across datasets (median 9.4; "bracketed":
4.1-13.5, median 7.0; a correct normal interval is 3.9 SD). Where the plug-in's bias is several
SD (spiky populations at N = 32) no interval can be narrow without knowing the bias's sign. With
the Imbens-Manski critical value (one-sided where the bracket is wide) the widths were 4.0-14 SD
(median 8.7) but coverage fell to 0.91; not adopted.
The old Monte Carlo interval covered J_N in 0.00-0.36. On a held-out population (the zoo's
mlp-2l seed 0, docs/calibration.md) jaccard_data covers only 0.93 / 0.87 at k = 5, N = 64 / 128,
the truth above the interval in every miss (a real gap between ranks 5 and 6): not conservative
there.
Where fewer than MIN_EVENTS = 10 of the nested resamples' top-k differ from their most frequent one, the
bracket's spread rests on too few events (all resamples alike gave a zero-width [1, 1] in 20 of 800 datasets
whose truth was 0.9991-0.9996, issue 34): under both bracketed methods the lower ends of jaccard_data and
phi_data are then also bounded by resolution_floor, a Clopper-Pearson bound on the chance a dataset's circuit
differs, turned into a bound on J_N and Phi_N by the triangle inequality (both distances are metrics). With
every resample alike and R = n_outer (n_inner + 1) resamples it is 1 - 2 (1 - 0.025^(1/R)): 0.9866 at R = 550,
0.9965 at R = 2100 (Jaccard, 95%). An interval is zero-width only where the estimate is exact. On the held-out
tails mlp4l-rotary population (k = 5, N = 128, 60 datasets, truth 0.99997) zero-width intervals went from 7 to 0
and coverage from 0.883 to 1.000, mean width 0.0590 -> 0.0594 (docs/calibration.md).
Methods "bias_bounded" ([min(T, T - bias), max(T, T - bias)] +- z se),
"plugin" (T +- z se) and "bias_corrected" (T - bias +- z se) are kept for comparison. Jaccard
bounds are clipped to [0, 1], Phi bounds to [-1, 1] (the ranges of the statistics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy.special import ndtri
from scipy.stats import beta

from circuitstat.core.errors import InputError
from circuitstat.core.seeds import as_seed_sequence, spawn_seeds
from circuitstat.core.topk import row_seeds

from .resampling import DEFAULT_MAX_BYTES, ResamplingPlan, nested_bootstrap
from .topk_stream import streaming_topk

__all__ = ["MIN_OBS", "MIN_OUTER", "MIN_INNER", "METHODS", "ESTIMANDS",
           "DataLevelEstimates",
           "check_data_level", "data_level_stability", "double_size_counts",
           "pop_upper_from_data", "resolution_floor"]

#: fewest examples for a data-level interval (coverage was measured from N = 32 up)
MIN_OBS = 32
#: fewest examples a stratum of a stratified plan needs for the data-level draws (its quarters must not be empty)
MIN_STRATUM = 4
#: fewest outer resamples: the standard error and bias come from their spread and mean
MIN_OUTER = 50
#: fewest inner resamples per outer: pairwise Jaccard needs pairs, the jackknife needs >= 3
MIN_INNER = 10
METHODS = ("bracketed_2n", "bracketed", "bias_bounded", "plugin", "bias_corrected")
#: differing resamples below which a lower end is floored by resolution_floor (np >= 10 for a normal binomial)
MIN_EVENTS = 10
#: random splits of the data for the split-half extrapolation
N_SPLITS = 30

#: what each interval column covers, written into the table metadata of StabilityResult
ESTIMANDS = {
    "jaccard_ci": "Monte Carlo error of jaccard_mean over these resamples of one dataset "
                  "(jackknife over resamples); NOT an interval for a data-level quantity",
    "jaccard_half_ci": "J_{N/2} = E[Jaccard(top-k of D1, top-k of D2)] for two independent datasets of N/2 "
                       "prompts: disjoint halves, exactly estimable; bias-corrected bootstrap SE, arcsine-scale interval "
                       "(the primary data-level interval, circuitstat.stats.stability_halves)",
    "jaccard_data_ci": "J_N (extrapolated, bracketed double bootstrap): E[Jaccard(top-k of D1, top-k of D2)] "
                       "for two independent datasets of N prompts from the prompt distribution",
    "jaccard_pop_ci": "E[Jaccard(top-k of a dataset of N prompts, top-k of the population "
                      "mean scores)] (double bootstrap)",
    "phi_ci": "Monte Carlo error of Phi over these resamples (Nogueira et al. 2018 asymptotic "
              "variance); NOT an interval for a data-level quantity",
    "phi_data_ci": "Phi (Nogueira) of the top-k circuits of independent datasets of N prompts, "
                   "i.e. their expected Kuncheva index (double bootstrap)",
}


@dataclass
class DataLevelEstimates:
    """Plug-in statistics per k from the main resamples, with their Monte Carlo errors."""

    jaccard: np.ndarray
    jaccard_mc: np.ndarray
    jaccard_pop: np.ndarray
    jaccard_pop_mc: np.ndarray
    phi: np.ndarray
    phi_mc: np.ndarray


def check_data_level(n_obs: int, plan_kind: str, n_outer: int, n_inner: int,
                     strata: np.ndarray | None = None, n_groups: int | None = None) -> str | None:
    """Return why a data-level interval cannot be computed here, every reason that applies (None when it can).

    A cluster plan's units are its n_groups templates: every draw resamples whole templates, so they must
    number MIN_OBS (the smallest count of units at which coverage was measured)."""
    why = []
    if n_obs < MIN_OBS:
        why.append(f"at least {MIN_OBS} examples, got N = {n_obs} (attribute more prompts)")
    if plan_kind == "cluster" and n_groups is not None and n_groups < MIN_OBS:
        why.append(f"at least {MIN_OBS} templates under the cluster scheme (whole templates are resampled), got "
                   f"G = {n_groups} (add templates, i.e. groups)")
    if strata is not None and np.bincount(strata).min() < MIN_STRATUM:
        why.append(f"at least {MIN_STRATUM} examples in every stratum (its quarters are resampled), got "
                   f"{np.bincount(strata).min()} (verify more prompts, or leave more unverified)")
    if plan_kind not in ("bootstrap", "stratified", "cluster"):
        # the plug-in estimate of J_N is over size-N bootstrap resamples of the examples (or of whole templates)
        why.append(f"an ordinary bootstrap of the examples (or a stratified or cluster one), got a {plan_kind} plan")
    return ("data-level intervals need " + ", and ".join(why)) if why else None


def _check_counts(n_outer: int, n_inner: int, confidence_level: float, method: str) -> None:
    """Raise InputError for resample counts or options the method cannot work with."""
    if int(n_outer) < MIN_OUTER:
        raise InputError(f"n_outer = {n_outer} is too few for a data-level interval; use at "
                         f"least {MIN_OUTER} outer resamples")
    if int(n_inner) < MIN_INNER:
        raise InputError(f"n_inner = {n_inner} is too few for a data-level interval; use at "
                         f"least {MIN_INNER} inner resamples per outer resample")
    if not 0 < confidence_level < 1:
        raise InputError(f"confidence_level must lie in (0, 1), got {confidence_level}")
    if method not in METHODS:
        raise InputError(f"unknown data-level method {method!r}; use one of {METHODS}")


def _intersections(tops: np.ndarray) -> np.ndarray:
    """Return the [m, m] intersection sizes of equal-size edge sets tops [m, k]."""
    m, k = tops.shape
    union, inv = np.unique(tops, return_inverse=True)
    Z = np.zeros((m, union.size))
    Z[np.repeat(np.arange(m), k), inv.ravel()] = 1.0
    return Z @ Z.T


def _u_mean_and_mc(pair: np.ndarray) -> tuple[float, float]:
    """Return the mean of a symmetric pair statistic over i != j and its jackknife error."""
    m = pair.shape[0]
    off = pair - np.diag(np.diag(pair))
    row = off.sum(axis=1)
    total = row.sum() / 2
    n_pairs = m * (m - 1) / 2
    loo = (total - row) / ((m - 1) * (m - 2) / 2)  # leave one resample out, closed form
    return total / n_pairs, float(np.sqrt((m - 1) / m * np.sum((loo - loo.mean()) ** 2)))


def _outer_statistics(idx: np.ndarray, n_outer: int, n_inner: int, k: int,
                      n_edges: int) -> np.ndarray:
    """Return [n_outer, 6]: (J*, mc, Jpop*, mc, Phi*, mc) of each outer's inner resamples."""
    out = np.empty((n_outer, 6))
    denom_phi = k * (n_edges - k)
    for o in range(n_outer):
        inner = idx[n_outer + o * n_inner:n_outer + (o + 1) * n_inner, :k]
        rows = np.vstack([inner, idx[o:o + 1, :k]])  # the outer's own circuit last
        inter = _intersections(rows)
        ii = inter[:n_inner, :n_inner]
        out[o, 0:2] = _u_mean_and_mc(ii / (2 * k - ii))
        out[o, 4:6] = _u_mean_and_mc((ii * n_edges - k * k) / denom_phi)  # Kuncheva = Phi
        to_outer = inter[:n_inner, n_inner]
        jp = to_outer / (2 * k - to_outer)
        out[o, 2] = jp.mean()
        out[o, 3] = jp.std(ddof=1) / np.sqrt(n_inner)
    return out


def _interval(est: np.ndarray, mc: np.ndarray, star: np.ndarray, star_mc: np.ndarray,
              split: np.ndarray | None, z: float, method: str,
              lo_bound: float, double: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Return se, bias, low, high per k from outer statistics star [len(ks), n_outer].

    split: the split-half extrapolation per k (a second estimate, biased the other way), or
    None where the estimand has none. double: the plug-in from resamples of size 2N (the upper
    end of method bracketed_2n), or None.
    """
    raw = star.var(axis=1, ddof=1)
    # the outer spread includes each T*_o's own Monte Carlo error; remove it, but never more
    # than half the raw variance (a noisy Monte Carlo estimate must not make the interval 0)
    var = np.maximum(raw - np.mean(star_mc**2, axis=1), raw / 2)
    se = np.sqrt(var + mc**2)
    bias = star.mean(axis=1) - est
    corrected = est - bias
    lo, hi = {"plugin": (est, est), "bias_corrected": (corrected, corrected),
              "bias_bounded": (np.minimum(est, corrected), np.maximum(est, corrected))}.get(
        method, (est - np.abs(bias), est + np.abs(bias)))  # bracketed: the bias's sign is open
    if method in ("bracketed", "bracketed_2n") and split is not None:
        lo = np.minimum(lo, split)
    if method == "bracketed_2n" and double is not None:
        hi = np.maximum(hi, double)
    out = {"se": se, "bias": bias, "ci_low": np.clip(lo - z * se, lo_bound, 1.0),
           "ci_high": np.clip(hi + z * se, lo_bound, 1.0)}
    if split is not None:
        out["split"] = split
    return out


def split_counts(n_obs: int, n_splits: int, seed: Any) -> np.ndarray:
    """Return [n_splits * 6, N] counts: per random split, its two halves then its four quarters."""
    rng = np.random.default_rng(as_seed_sequence(seed))
    perm = np.argsort(rng.random((n_splits, n_obs)), axis=1)
    h, q = n_obs // 2, n_obs // 4
    parts = [perm[:, :h], perm[:, h:2 * h]] + [perm[:, i * q:(i + 1) * q] for i in range(4)]
    counts = np.zeros((n_splits, 6, n_obs), dtype=np.int32)
    for j, part in enumerate(parts):
        np.put_along_axis(counts[:, j], part, 1, axis=1)
    return counts.reshape(n_splits * 6, n_obs)


#: pairs of disjoint quarters (0..3) of one split
_QUARTER_PAIRS = ((0, 1), (2, 3), (0, 2), (1, 3), (0, 3), (1, 2))


def _split_statistics(idx: np.ndarray, n_splits: int, k: int, n_edges: int) -> tuple[float, ...]:
    """Return mean (J, Kuncheva) between disjoint halves and between disjoint quarters."""
    tops = idx[:, :k].reshape(n_splits, 6, k)
    inter_h, inter_q = [], []
    for s in range(n_splits):
        inter = _intersections(tops[s])
        inter_h.append(inter[0, 1])
        inter_q.extend(inter[2 + a, 2 + b] for a, b in _QUARTER_PAIRS)
    ih, iq = np.asarray(inter_h), np.asarray(inter_q)
    kun = k * (n_edges - k)
    return (float(np.mean(ih / (2 * k - ih))), float(np.mean((ih * n_edges - k * k) / kun)),
            float(np.mean(iq / (2 * k - iq))), float(np.mean((iq * n_edges - k * k) / kun)))


def double_size_counts(n_obs: int, n_resamples: int, seed: Any) -> np.ndarray:
    """Return [n_resamples, N] counts of bootstrap resamples of size 2N drawn from N examples."""
    rng = np.random.default_rng(as_seed_sequence(seed))
    idx = rng.integers(0, n_obs, (int(n_resamples), 2 * int(n_obs)))
    flat = (idx + (np.arange(idx.shape[0], dtype=np.int64) * n_obs)[:, None]).ravel()
    return np.bincount(flat, minlength=idx.shape[0] * n_obs).reshape(-1, n_obs).astype(np.int32)


def _double_statistics(idx: np.ndarray, k: int, n_edges: int) -> tuple[float, float]:
    """Return the mean pairwise (Jaccard, Kuncheva index) of the size-2N resamples' top-k."""
    inter = _intersections(idx[:, :k])
    jac, _ = _u_mean_and_mc(inter / (2 * k - inter))
    kun, _ = _u_mean_and_mc((inter * n_edges - k * k) / (k * (n_edges - k)))
    return jac, kun


def resolution_floor(tops: np.ndarray, k: int, n_edges: int, confidence_level: float) -> tuple[float, float]:
    """Return lower bounds (Jaccard, Phi) on the data-level J_N and Phi_N from the resamples' top-k rows tops [R, >=k].

    Both Jaccard distance and 1 - Kuncheva = n/(n-k) |A ^ B| / (2k) are metrics on size-k sets, so for any fixed
    set M, E[1 - J(D1, D2)] <= 2 E[d(D, M)] (triangle inequality, D1, D2, D independent datasets). With M the
    most frequent top-k among the R resamples, E[d(D, M)] = q E[d | D != M], q the chance a dataset's top-k
    differs from M: q is bounded above by the one-sided Clopper-Pearson bound from the x of R resamples that
    differ, and E[d | D != M] by the mean distance of those x (their largest possible value, 1 or n/(n-k), when
    x = 0). Where every resample gives the same circuit the bracket's spread is 0, yet R resamples only
    resolve a flip chance down to about 3/R (the rule of three): this floor keeps the lower end honest there.
    Returns NaN (no floor) once MIN_EVENTS or more resamples differ: the usual condition for a normal
    approximation of a binomial count, past which the bracket's standard error resolves the flips (the
    triangle bound is loose for unstable circuits: used everywhere it widened J ~ 0.5 intervals from 8 to 13
    SD of the estimate).
    """
    rows = np.sort(np.asarray(tops)[:, :k], axis=1)
    uniq, inv, counts = np.unique(rows, axis=0, return_inverse=True, return_counts=True)
    mode = uniq[np.argmax(counts)]
    inter = np.isin(rows, mode).sum(axis=1)
    differ = inter < k
    n_rows, x = rows.shape[0], int(differ.sum())
    if x >= MIN_EVENTS:
        return float("nan"), float("nan")
    alpha = (1.0 - confidence_level) / 2
    q_hi = 1.0 if x == n_rows else float(beta.ppf(1.0 - alpha, x + 1, n_rows - x))
    scale = n_edges / (n_edges - k) if n_edges > k else 1.0
    d_j = 1.0 - inter / (2 * k - inter)
    d_phi = scale * (k - inter) / k
    mean_j = float(d_j[differ].mean()) if x else 1.0
    mean_phi = float(d_phi[differ].mean()) if x else scale
    return 1.0 - 2.0 * q_hi * mean_j, 1.0 - 2.0 * q_hi * mean_phi


def pop_upper_from_data(jaccard_data_high: np.ndarray) -> np.ndarray:
    """Return the bound on J(sample, population) implied by an upper bound on J(D1, D2).

    With pi_e the probability that edge e is in a size-N dataset's top-k and P the population's
    top-k, E|D1 & D2| = sum_e pi_e^2 >= (sum_{e in P} pi_e)^2 / k = E|D & P|^2 / k (Cauchy-
    Schwarz), so the expected overlap share with the population is at most the square root of
    the data-level one; Jaccard J and overlap share r = |A & B| / k map by r = 2J / (1 + J).
    (The map is applied to expectations: exact for the overlap, approximate for E[Jaccard].)
    """
    r = np.sqrt(np.clip(2 * jaccard_data_high / (1 + jaccard_data_high), 0.0, 1.0))
    return r / (2 - r)


def _draws(n_obs: int, n_outer: int, n_inner: int, n_double: int, seeds, strata: np.ndarray | None,
           groups: np.ndarray | None = None) -> tuple:
    """Return the counts (outer, inner, splits[, size 2N]) of data_level_stability, drawn within ``strata`` if given;
    with ``groups`` (labels 0..G-1) every draw is of whole groups, each example getting its group's count."""
    c_nest, c_split, c_double = seeds
    if groups is not None:
        g = np.unique(np.asarray(groups), return_inverse=True)[1].astype(np.int64)
        return tuple(c[:, g] for c in _draws(int(g.max()) + 1, n_outer, n_inner, n_double, seeds, strata))

    def draw(n: int, seed) -> tuple:
        # a stratum's child seeds derive from the three, so unstratified draws are unchanged
        s_nest, s_split, s_double = (spawn_seeds(seed, 3) if strata is not None else (c_nest, c_split, c_double))
        outer, inner = nested_bootstrap(n, n_outer, n_inner, s_nest)
        out = (outer.counts, inner.counts, split_counts(n, N_SPLITS, s_split))
        return out + ((double_size_counts(n, n_double, s_double),) if n_double else ())

    if strata is None:
        return draw(n_obs, None)
    from .strata import check_strata, stratified_counts

    # every stratum needs 4 examples: its quarters must not be empty
    return stratified_counts(check_strata(strata, n_obs, min_size=MIN_STRATUM), draw, c_nest)


def _engine_pass(S: np.ndarray, ks_arr: np.ndarray, *, ranking: str, seed: Any, n_outer: int, n_inner: int,
                 method: str, confidence_level: float, chunk_size: int | None, n_jobs: int, max_bytes: int,
                 strata: np.ndarray | None, groups: np.ndarray | None) -> dict[str, np.ndarray]:
    """Return the per-k raw statistics of one engine pass: star [len(ks), n_outer, 6], halves [len(ks), 4],
    double [len(ks), 2] or None, floors [len(ks), 2] (the Monte Carlo resolution floor of J and Phi)."""
    n_edges = S.shape[1]
    # a fifth child for the size-2N resamples: the first four are those of the other methods
    c_nest, _, c_ties, c_split, c_double = spawn_seeds(as_seed_sequence(seed), 5)
    n_nested = n_outer * (n_inner + 1)
    n_split_rows = 6 * N_SPLITS
    n_double = 2 * int(n_outer) if method == "bracketed_2n" else 0
    # one pass of the engine over every row: outer, inner, the halves and quarters, size 2N
    blocks = list(_draws(S.shape[0], n_outer, n_inner, n_double, (c_nest, c_split, c_double), strata, groups))
    plan = ResamplingPlan.from_counts(np.vstack(blocks))
    seeds = row_seeds(np.random.default_rng(c_ties), plan.n_resamples)
    state, _ = streaming_topk(S, plan, int(ks_arr.max()), ranking, seeds, chunk_size=chunk_size,
                              n_jobs=n_jobs, max_bytes=max_bytes)
    star = np.stack([_outer_statistics(state.idx[:n_nested], n_outer, n_inner, int(k), n_edges)
                     for k in ks_arr])  # [len(ks), n_outer, 6]
    split_idx = state.idx[n_nested:n_nested + n_split_rows]
    halves = np.array([_split_statistics(split_idx, N_SPLITS, int(k), n_edges)
                       for k in ks_arr])  # [len(ks), 4]: J, Phi at N/2; J, Phi at N/4
    double = (np.array([_double_statistics(state.idx[n_nested + n_split_rows:], int(k), n_edges)
                        for k in ks_arr]) if n_double else None)  # [len(ks), 2]: J, Phi
    # the lower ends never claim more agreement than the nested resamples can resolve (resolution_floor)
    floors = np.array([resolution_floor(state.idx[:n_nested], int(k), n_edges, confidence_level)
                       for k in ks_arr])
    return {"star": star, "halves": halves, "double": double, "floors": floors}


def _split_extrapolation(halves: np.ndarray, method: str) -> tuple[np.ndarray, np.ndarray]:
    """Return the split-half values (J, Phi) per k: extrapolated linearly in 1/m to m = N from N/2 and N/4."""
    split_j = halves[:, 0] + (halves[:, 0] - halves[:, 2]) / 2
    split_phi = halves[:, 1] + (halves[:, 1] - halves[:, 3]) / 2
    if method == "bracketed_2n":
        # J_N >= J_{N/2} (more data, more agreement) and the halves' value is unbiased for
        # J_{N/2}; the extrapolation alone left the lower end above the truth in 12-15% of
        # spiky datasets (Phi at N = 32, k = 10; Jaccard at N = 64, k = 10 of a second seed)
        split_j = np.minimum(split_j, halves[:, 0])
        split_phi = np.minimum(split_phi, halves[:, 1])
    return split_j, split_phi


def _assemble(estimates: DataLevelEstimates, raw: dict[str, np.ndarray], z: float, method: str,
              n_k: int) -> dict[str, np.ndarray]:
    """Return the jaccard_data*, jaccard_pop* and phi_data* columns from the engine pass's raw statistics."""
    star, double, floors = raw["star"], raw["double"], raw["floors"]
    split_j, split_phi = _split_extrapolation(raw["halves"], method)
    cols: dict[str, np.ndarray] = {}
    for name, est, mc, j, split, lo_bound, dbl in (
            ("jaccard_data", estimates.jaccard, estimates.jaccard_mc, 0, split_j, 0.0, 0),
            ("jaccard_pop", estimates.jaccard_pop, estimates.jaccard_pop_mc, 2, None, 0.0, None),
            ("phi_data", estimates.phi, estimates.phi_mc, 4, split_phi, -1.0, 1)):
        d = double[:, dbl] if double is not None and dbl is not None else None
        iv = _interval(np.asarray(est, dtype=np.float64), np.asarray(mc, dtype=np.float64),
                       star[:, :, j], star[:, :, j + 1], split, z, method, lo_bound, d)
        if dbl is not None and method in ("bracketed", "bracketed_2n"):
            floor = np.maximum(floors[:, dbl], lo_bound)
            iv["ci_low"] = np.where(np.isnan(floor), iv["ci_low"], np.fmin(iv["ci_low"], floor))
        cols[name] = np.asarray(est, dtype=np.float64)
        for part, v in iv.items():
            cols[f"{name}_{part}"] = v
        if dbl is not None:
            cols[f"{name}_2n"] = d if d is not None else np.full(n_k, np.nan)
    if method in ("bracketed", "bracketed_2n"):
        # the population's circuit is never seen, so J to it has no split analogue; its lower
        # end is bounded by the data-level one: J(sample, population) >= J(sample, sample)
        # held in every population measured (to 0.002 where the population has near-ties)
        cols["jaccard_pop_ci_low"] = np.minimum(cols["jaccard_pop_ci_low"],
                                                cols["jaccard_data_ci_low"])
    if method == "bracketed_2n":
        # and its upper end by the data-level one through the overlap bound (pop_upper_from_data)
        cols["jaccard_pop_ci_high"] = np.maximum(
            cols["jaccard_pop_ci_high"], pop_upper_from_data(cols["jaccard_data_ci_high"]))
    return cols


def data_level_stability(S: np.ndarray, ks: Sequence[int], estimates: DataLevelEstimates, *,
                         ranking: str, seed: Any, n_outer: int = 100, n_inner: int = 20,
                         confidence_level: float = 0.95, method: str = "bracketed_2n",
                         chunk_size: int | None = None, n_jobs: int = 1,
                         max_bytes: int = DEFAULT_MAX_BYTES, strata: np.ndarray | None = None,
                         groups: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Return per-k data-level estimates and intervals (jaccard_data*, jaccard_pop*, phi_data*).

    S [N, E] is the score matrix, `estimates` the plug-in statistics of circuit_stability's
    resamples for the same ks; seed (SeedSequence/int) fixes the nested resamples, the splits,
    the size-2N resamples and the ties. strata [N] (a stratified sample, e.g. a verified run's
    labelled and unlabelled prompts): every draw (outer, inner, halves, quarters, size 2N) is made
    within each stratum (circuitstat.stats.strata), so each keeps its stratum shares; the estimand
    is then J_N of datasets drawn as this one was. groups [N] (a cluster plan's templates, labels 0..G-1): every
    draw resamples whole templates (halves are halves of the templates), so the estimand is J of datasets of G
    templates drawn from the template distribution, each with its prompts.
    """
    _check_counts(n_outer, n_inner, confidence_level, method)
    n_obs = S.shape[0]
    if strata is not None and groups is not None:
        raise InputError("data-level stability resamples strata or templates, not both; drop one of them")
    n_groups = None if groups is None else int(np.unique(groups).size)
    why = check_data_level(n_obs, "bootstrap" if groups is None else "cluster", n_outer, n_inner,
                           n_groups=n_groups)
    if why:
        raise InputError(why)
    ks_arr = np.asarray(ks, dtype=np.int64)
    raw = _engine_pass(S, ks_arr, ranking=ranking, seed=seed, n_outer=n_outer, n_inner=n_inner, method=method,
                       confidence_level=confidence_level, chunk_size=chunk_size, n_jobs=n_jobs,
                       max_bytes=max_bytes, strata=strata, groups=groups)
    return _assemble(estimates, raw, float(ndtri(0.5 + confidence_level / 2)), method, ks_arr.size)
