"""Statistics of head stability across refits (Bali et al. 2026), as array code without torch.

Inputs are per-prompt cosines of attention patterns (``stats.similarity.per_prompt_cosine``),
matched similarities per ordered pair of refits, and residual-stream rows; outputs are the
stability numbers and their intervals. Two sources of uncertainty are kept apart:

* **refits** (the estimand readers care about: stability over the distribution of training
  seeds). Every refit is an anchor in turn: the layer-level statistic is the mean over ordered
  pairs of refits, a U-statistic of order 2 in the refits, and its interval is a leave-one-refit-
  out jackknife with a t quantile on K − 1 degrees of freedom (:func:`refit_jackknife`). Per head
  (heads are only identified inside one refit) the interval is a t interval over the anchor's
  K − 1 comparison refits, conditional on the anchor (:func:`comparison_t_interval`). Both need
  at least 3 refits and say how many they rest on.
* **prompts** (Monte Carlo error of one probe set): resampled through the engine in
  ``stats.resampling`` (:func:`prompt_resampled_similarity`); CKA is resampled by half-size
  subsamples of prompts without replacement (:func:`cka_half_sample_replicates`), because
  duplicated rows bias CKA upwards.

Also here: Fisher-z intervals and permutation tests of correlations, Holm's family-wise
adjustment, bootstrap-SE z p-values, and excess over a null.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
import math
from typing import Any, Callable

import numpy as np
from scipy import stats as sps

from .intervals import percentile_interval  # the one home of percentile intervals; re-exported
from .resampling import ResamplingPlan, as_seed_sequence, resampled_means
from .similarity import (_center_gram, _cka_from_centered, _rbf_gram, _u_center_gram, debiased_cka,
                         linear_cka, match_heads, rbf_cka)

__all__ = [
    "MIN_REFITS_FOR_INTERVAL",
    "matched_similarity",
    "prompt_resampled_similarity",
    "percentile_interval",
    "pair_matrix",
    "refit_bootstrap_counts",
    "anchor_head_stability",
    "all_pairs_layer_stability",
    "ordered_pair_mean",
    "leave_one_refit_out",
    "refit_jackknife",
    "comparison_t_interval",
    "layer_statistics",
    "RefitLevel",
    "refit_level_summaries",
    "refit_pair_weights",
    "weighted_pair_mean",
    "head_distinctness_from_similarity",
    "cross_layer_best_match",
    "shuffled_layer_gap",
    "cka_half_samples",
    "cka_half_sample_replicates",
    "fisher_interval",
    "permutation_correlation",
    "holm_adjust",
    "holm_verdicts",
    "bootstrap_z_summary",
    "jackknife_summary",
    "pooled_fisher_z",
    "fisher_pvalue",
    "t_pvalue",
    "z_pvalue",
    "perplexity_rise",
    "CKA_KINDS",
    "CKA_INTERVAL_RELIABLE",
]

#: the jackknife over refits leaves one out and still needs a pair of refits
MIN_REFITS_FOR_INTERVAL = 3

CKA_KINDS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "linear": linear_cka, "rbf": rbf_cka, "debiased": debiased_cka}

#: whether a CKA kind's intervals (half-sample and refit-level) can be trusted to cover the
#: population CKA. Linear and RBF CKA are biased in finite samples and their intervals sit on
#: the biased estimate: simulated coverage of the population CKA 0.38-0.94 over five latent-factor
#: settings at N = 50-100 (0.38 when the signal is weak, 0.58 with 32 dimensions); the debiased
#: kind (unbiased HSIC) covered 0.91-0.995 in the same settings (tests/stats/test_head_stability_coverage.py).
CKA_INTERVAL_RELIABLE: dict[str, bool] = {"linear": False, "rbf": False, "debiased": True}


def _quiet():
    """Return a context that silences all-NaN warnings (NaN results are kept and documented)."""
    import warnings

    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("ignore", RuntimeWarning)
    return ctx


def _nanmean(values: np.ndarray, axis: Any = None) -> np.ndarray:
    """Return np.nanmean without the all-NaN warning (the NaN stays)."""
    ctx = _quiet()
    try:
        return np.nanmean(values, axis=axis)
    finally:
        ctx.__exit__(None, None, None)


# --- matching and prompt resampling ----------------------------------------------------------
def matched_similarity(similarity: np.ndarray, method: str) -> np.ndarray:
    """Return the matched similarity of every source head: ``[..., H1, H2] -> [..., H1]``.

    ``max``: the best column per row (several heads may match one); ``hungarian``: the
    one-to-one assignment maximising the total similarity (scipy's linear_sum_assignment).
    """
    similarity = np.asarray(similarity, dtype=np.float64)
    if method == "max":
        best = np.where(np.isnan(similarity), -np.inf, similarity).max(axis=-1)
        return np.where(np.isneginf(best), np.nan, best)
    flat = similarity.reshape(-1, *similarity.shape[-2:])
    scores = np.stack([match_heads(matrix, "hungarian")[1] for matrix in flat])
    return scores.reshape(similarity.shape[:-1])


def prompt_resampled_similarity(cosines: np.ndarray, plan: ResamplingPlan | None) -> np.ndarray:
    """Return the mean over prompts of per-prompt cosines ``[P, ...]``, per resample ``[B, ...]``.

    NaN cosines (an all-zero pattern) are left out of each mean, so a resampled mean is the
    ratio of two resampled means (cosines with NaN as 0, and the indicator of a valid cosine),
    both from the engine's ``resampled_means``. ``plan=None`` gives the full-sample mean ``[1, ...]``.
    """
    cosines = np.asarray(cosines, dtype=np.float64)
    n_prompts, shape = cosines.shape[0], cosines.shape[1:]
    valid = (~np.isnan(cosines)).reshape(n_prompts, -1).astype(np.float64)
    filled = np.nan_to_num(cosines, nan=0.0).reshape(n_prompts, -1)
    if plan is None:
        plan = ResamplingPlan.from_counts(np.ones((1, n_prompts), dtype=np.int64))
    with np.errstate(invalid="ignore", divide="ignore"):
        means = resampled_means(filled, plan) / resampled_means(valid, plan)  # [E, B]
    return means.T.reshape((plan.n_resamples,) + shape)


# --- the paper's bootstrap (anchor fixed) -------------------------------------------------------
def pair_matrix(values: np.ndarray, pairs: list[tuple[int, int]], n_refits: int) -> np.ndarray:
    """Return ``[K, K, ...]`` from per-ordered-pair values ``[n_pairs, ...]`` (NaN on the diagonal)."""
    out = np.full((n_refits, n_refits) + values.shape[1:], np.nan)
    for i, (a, b) in enumerate(pairs):
        out[a, b] = values[i]
    return out


def refit_bootstrap_counts(rng: np.random.Generator, n_refits: int, anchor: int, n_resamples: int, resample: bool
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Return bootstrap counts of the anchor's comparison refits and of all refits, ``[R, K]`` each."""
    targets = np.array([b for b in range(n_refits) if b != anchor])
    if resample:
        draw_targets = rng.choice(targets, size=(n_resamples, targets.size), replace=True)
        draw_all = rng.integers(0, n_refits, size=(n_resamples, n_refits))
    else:
        draw_targets = np.tile(targets, (n_resamples, 1))
        draw_all = np.tile(np.arange(n_refits), (n_resamples, 1))
    target_counts = np.stack([np.bincount(d, minlength=n_refits) for d in draw_targets]).astype(np.float64)
    refit_counts = np.stack([np.bincount(d, minlength=n_refits) for d in draw_all]).astype(np.float64)
    return target_counts, refit_counts


def anchor_head_stability(matched: np.ndarray, target_counts: np.ndarray, anchor_rows: np.ndarray,
                           targets: list[int]) -> np.ndarray:
    """Return the anchor's head stability ``[..., L, H]``: comparison-refit weighted mean of matched scores."""
    weights = target_counts[..., targets]
    total = np.einsum("...t,...tlh->...lh", weights, matched[..., anchor_rows, :, :])
    return total / weights.sum(-1)[..., None, None]


def all_pairs_layer_stability(matched: np.ndarray, refit_counts: np.ndarray, pairs: list[tuple[int, int]]
                               ) -> np.ndarray:
    """Return layer stability ``[..., L]`` over every ordered pair, pairs weighted by refit counts."""
    first = np.array([p[0] for p in pairs])
    second = np.array([p[1] for p in pairs])
    weights = refit_counts[..., first] * refit_counts[..., second]
    layer_means = _nanmean(matched, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.einsum("...p,...pl->...l", weights, layer_means) / weights.sum(-1)[..., None]


# --- refit-level uncertainty (every refit an anchor) -------------------------------------------
def _off_diagonal(n_refits: int) -> np.ndarray:
    return ~np.eye(n_refits, dtype=bool)


def ordered_pair_mean(pair_values: np.ndarray) -> np.ndarray:
    """Return the mean over ordered pairs a != b of ``pair_values [K, K, ...]`` (the diagonal is ignored)."""
    pair_values = np.asarray(pair_values, dtype=np.float64)
    return _nanmean(pair_values[_off_diagonal(pair_values.shape[0])], axis=0)


def leave_one_refit_out(pair_values: np.ndarray) -> np.ndarray:
    """Return ``[K, ...]``: the ordered-pair mean over the refits other than refit i, for each i."""
    pair_values = np.asarray(pair_values, dtype=np.float64)
    n_refits = pair_values.shape[0]
    out = []
    for left_out in range(n_refits):
        kept = np.delete(np.arange(n_refits), left_out)
        out.append(ordered_pair_mean(pair_values[np.ix_(kept, kept)]))
    return np.stack(out)


def refit_jackknife(estimate: np.ndarray, leave_one_out: np.ndarray, confidence_level: float
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (low, high, standard error) of a jackknife-over-refits t interval.

    ``leave_one_out [K, ...]`` holds the statistic recomputed without each refit (any function
    of ordered-pair means, e.g. a layer's stability, the gap, an excess over the null). The
    jackknife variance (K − 1)/K Σ (θ₍₋ᵢ₎ − θ̄)² is that of a U-statistic in the refits; the
    quantile is t with K − 1 degrees of freedom. Fewer than 3 refits: NaN (no interval).
    """
    estimate = np.asarray(estimate, dtype=np.float64)
    leave_one_out = np.asarray(leave_one_out, dtype=np.float64)
    n_refits = leave_one_out.shape[0]
    if n_refits < MIN_REFITS_FOR_INTERVAL:
        nan = np.full(estimate.shape, np.nan)
        return nan, nan, nan
    centred = leave_one_out - leave_one_out.mean(axis=0)
    standard_error = np.sqrt((n_refits - 1) / n_refits * (centred ** 2).sum(axis=0))
    half_width = sps.t.ppf(0.5 + confidence_level / 2, n_refits - 1) * standard_error
    return estimate - half_width, estimate + half_width, standard_error


def comparison_t_interval(comparisons: np.ndarray, confidence_level: float
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (mean, low, high) over the anchor's comparison refits (first axis), t on n − 1 df.

    The estimand is conditional on the anchor: a head of the anchor refit against a new
    training seed. Needs at least 2 comparisons (3 refits); otherwise the interval is NaN.
    """
    comparisons = np.asarray(comparisons, dtype=np.float64)
    n_comparisons = comparisons.shape[0]
    mean = comparisons.mean(axis=0)
    if n_comparisons < MIN_REFITS_FOR_INTERVAL - 1:
        nan = np.full(mean.shape, np.nan)
        return mean, nan, nan
    standard_error = comparisons.std(axis=0, ddof=1) / math.sqrt(n_comparisons)
    half_width = sps.t.ppf(0.5 + confidence_level / 2, n_comparisons - 1) * standard_error
    return mean, mean - half_width, mean + half_width


@dataclass
class RefitLevel:
    """Refit-level estimates, leave-one-refit-out values and t intervals of the layer-level numbers."""

    n_refits: int
    estimates: dict[str, np.ndarray]  # name -> estimate ([L] for layers, scalar for summaries)
    leave_one_out: dict[str, np.ndarray]  # name -> [K, ...]
    intervals: dict[str, tuple[np.ndarray, np.ndarray]]


def refit_level_summaries(matched_pairs: np.ndarray, excess_pairs: np.ndarray | None, confidence_level: float) -> RefitLevel:
    """Return the all-anchors layer stability, excess and their summaries with jackknife-over-refits intervals.

    Keys of ``estimates`` / ``leave_one_out`` / ``intervals``: ``layer`` and ``excess`` ([L]),
    the :func:`layer_statistics` of the layer stabilities, and ``excess_mean``.

    ``matched_pairs`` and ``excess_pairs`` are ``[K, K, L, H]`` (NaN diagonal).
    """
    n_refits = matched_pairs.shape[0]
    sources = {"layer": _nanmean(matched_pairs, axis=-1)}
    if excess_pairs is not None:
        sources["excess"] = _nanmean(excess_pairs, axis=-1)
    estimates, leave_one_out = {}, {}
    for name, pair_values in sources.items():
        estimates[name] = ordered_pair_mean(pair_values)
        leave_one_out[name] = leave_one_refit_out(pair_values)
    for key, value in layer_statistics(estimates["layer"]).items():
        estimates[key] = value
        leave_one_out[key] = layer_statistics(leave_one_out["layer"])[key]
    if excess_pairs is not None:
        estimates["excess_mean"] = _nanmean(estimates["excess"])
        leave_one_out["excess_mean"] = _nanmean(leave_one_out["excess"], axis=-1)
    intervals = {}
    for name in estimates:
        low, high, _ = refit_jackknife(estimates[name], leave_one_out[name], confidence_level)
        intervals[name] = (low, high)
    return RefitLevel(n_refits, estimates, leave_one_out, intervals)


def refit_pair_weights(counts: np.ndarray, pairs: list[tuple[int, int]], both_sides: bool) -> np.ndarray:
    """Return bootstrap weights of refit pairs ``[R, n_pairs]``: c_a * c_b (both_sides) or c_b (anchor fixed)."""
    if both_sides:
        return np.stack([counts[:, a] * counts[:, b] for a, b in pairs], axis=1)
    return np.stack([counts[:, b] for _, b in pairs], axis=1)


def weighted_pair_mean(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Return the weighted mean over pairs: values ``[R, L, n_pairs]``, weights ``[R, n_pairs]`` -> ``[R, L]``.

    A replicate whose weights are all zero (one refit drawn every time: no pair) is NaN.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.einsum("rlj,rj->rl", values, weights) / weights.sum(1)[:, None]


def head_distinctness_from_similarity(similarity: np.ndarray) -> np.ndarray:
    """Return 1 − mean similarity to the other heads of the layer: ``[..., H, H] -> [..., H]``."""
    n_heads = similarity.shape[-1]
    off_diagonal = ~np.eye(n_heads, dtype=bool)
    return 1.0 - np.where(off_diagonal, similarity, 0.0).sum(-1) / (n_heads - 1)


def cross_layer_best_match(point: dict[int, np.ndarray], replicates: dict[int, np.ndarray], target_counts: np.ndarray,
                           n_layers: int, n_heads: int) -> dict[str, np.ndarray]:
    """Return the anchor heads' best match in any layer of the comparison refits.

    ``point[b]`` is the anchor-vs-refit-b similarity ``[L*H, L*H]``, ``replicates[b]`` its
    bootstrap replicates ``[R, L*H, L*H]`` (or ``[1, ...]`` when prompts are not resampled),
    ``target_counts [R, K]`` the bootstrap draws of comparison refits. Keys: ``cross_layer``
    (mean best similarity), ``cross_layer_reps``, ``same_layer_share`` (share of refits whose
    best match is in the head's own layer) and ``modal_layer``.
    """
    layer_of = np.repeat(np.arange(n_layers), n_heads)
    targets = sorted(point)
    best_point = [matched_similarity(point[b], "max") for b in targets]
    best_layer = np.stack([layer_of[np.where(np.isnan(point[b]), -np.inf, point[b]).argmax(-1)] for b in targets])
    best_reps = sum(target_counts[:, [b]] * matched_similarity(replicates[b], "max") for b in targets)
    best_reps = best_reps / target_counts[:, targets].sum(1, keepdims=True)
    modal = np.array([np.bincount(best_layer[:, i], minlength=n_layers).argmax() for i in range(best_layer.shape[1])])
    return {"cross_layer": np.mean(best_point, axis=0), "cross_layer_reps": best_reps,
            "same_layer_share": (best_layer == layer_of[None]).mean(0), "modal_layer": modal}


# --- layer-level derived numbers ---------------------------------------------------------------
def layer_statistics(layer_stability: np.ndarray) -> dict[str, np.ndarray]:
    """Return the summaries of layer stabilities ``[..., L]``: mean, gap, least stable layer, ...

    Keys: ``mean``, ``gap`` (max − min), ``argmin``, ``argmin_rel`` (argmin / (L − 1)) and, with
    at least 3 layers, ``ends_minus_middle`` and ``middle_min`` (1 when the least stable layer
    is neither the first nor the last).
    """
    layer_stability = np.asarray(layer_stability, dtype=np.float64)
    n_layers = layer_stability.shape[-1]
    ctx = _quiet()
    try:
        argmin = np.nanargmin(np.where(np.isnan(layer_stability), np.inf, layer_stability), axis=-1).astype(float)
        out = {"mean": np.nanmean(layer_stability, axis=-1),
               "gap": np.nanmax(layer_stability, axis=-1) - np.nanmin(layer_stability, axis=-1),
               "argmin": argmin,
               "argmin_rel": argmin / (n_layers - 1) if n_layers > 1 else argmin * np.nan}
        if n_layers >= 3:
            ends = (layer_stability[..., 0] + layer_stability[..., -1]) / 2
            out["ends_minus_middle"] = ends - np.nanmean(layer_stability[..., 1:-1], axis=-1)
            out["middle_min"] = ((argmin > 0) & (argmin < n_layers - 1)).astype(float)
    finally:
        ctx.__exit__(None, None, None)
    return out


def shuffled_layer_gap(head_stability: np.ndarray, permutations: np.ndarray) -> np.ndarray:
    """Return the mean gap with heads shuffled across layers: ``[..., L, H] -> [...]``.

    ``permutations [S, L*H]`` reorder the flattened heads; a max − min over more layers grows
    with L even without any layer effect, and this is that expectation.
    """
    head_stability = np.asarray(head_stability, dtype=np.float64)
    n_layers, n_heads = head_stability.shape[-2:]
    batch = head_stability.shape[:-2]
    flat = head_stability.reshape(batch + (n_layers * n_heads,))
    shuffled = flat[..., permutations].reshape(batch + (len(permutations), n_layers, n_heads))
    layer_means = _nanmean(shuffled, axis=-1)
    ctx = _quiet()
    try:
        return np.nanmean(np.nanmax(layer_means, axis=-1) - np.nanmin(layer_means, axis=-1), axis=-1)
    finally:
        ctx.__exit__(None, None, None)


# --- CKA over prompts without duplicated rows ---------------------------------------------------
def _row_index(prompts: np.ndarray, rows_per_prompt: int) -> np.ndarray:
    return (prompts[:, None] * rows_per_prompt + np.arange(rows_per_prompt)).ravel()


def cka_half_samples(representations: dict[Any, np.ndarray], pairs: list[tuple[Any, Any]], kind: str,
                     rows_per_prompt: int, plan: ResamplingPlan) -> np.ndarray:
    """Return the CKA of every pair on the unique rows of each resample's prompts, ``[B, n_pairs]``.

    Rows are prompt-major (``rows_per_prompt`` rows per prompt). Each resample keeps the prompts
    it draws at least once, each once: no duplicated rows. RBF keeps the full-sample median
    bandwidth.
    """
    if kind == "rbf":
        grams = {m: _rbf_gram(np.asarray(x, dtype=np.float64), 1.0) for m, x in representations.items()}
    else:
        grams = {m: np.asarray(x, dtype=np.float64) @ np.asarray(x, dtype=np.float64).T
                 for m, x in representations.items()}
    center = _u_center_gram if kind == "debiased" else _center_gram
    out = np.zeros((plan.n_resamples, len(pairs)))
    for b in range(plan.n_resamples):
        rows = _row_index(np.flatnonzero(plan.counts[b]), rows_per_prompt)
        centred = {m: center(gram[np.ix_(rows, rows)]) for m, gram in grams.items()}
        out[b] = [_cka_from_centered(centred[a], centred[c]) for a, c in pairs]
    return out


def cka_half_sample_replicates(representations: dict[Any, np.ndarray], pairs: list[tuple[Any, Any]], kind: str,
                               rows_per_prompt: int, plan: ResamplingPlan | None
                               ) -> tuple[np.ndarray, np.ndarray | None]:
    """Return CKA of every pair on all rows ``[n_pairs]`` and its centred half-sample replicates.

    A bootstrap with duplicated rows biases CKA upwards (a duplicated row agrees with itself in
    both representations). Instead ``plan`` (``ResamplingPlan.subsample``: half of the prompts,
    without replacement) picks whole prompts (:func:`cka_half_samples`). For a mean, the variance
    of a half-sample estimate without replacement, σ²(1/m − 1/n) with m = n/2, equals the
    full-sample variance σ²/n, so the replicates need no rescaling; they are centred on the
    full-sample estimate (θ̂ + θ_b − mean θ_b) to remove the extra small-sample bias of the half
    size (linear and RBF CKA). Returns ``(estimate, replicates [B, n_pairs] or None)``.
    """
    if kind not in CKA_KINDS:
        raise ValueError(f"unknown CKA kind {kind!r}; use {', '.join(CKA_KINDS)}")
    estimate = np.array([CKA_KINDS[kind](representations[a], representations[b]) for a, b in pairs])
    if plan is None:
        return estimate, None
    replicates = cka_half_samples(representations, pairs, kind, rows_per_prompt, plan)
    return estimate, estimate + replicates - _nanmean(replicates, axis=0)


# --- correlations ------------------------------------------------------------------------------
def fisher_interval(r: float, n_eff: float, confidence_level: float = 0.95) -> tuple[float, float]:
    """Return the Fisher-z interval of a correlation from ``n_eff`` pairs; (−1, 1) if n_eff <= 3."""
    if not np.isfinite(r):
        return (math.nan, math.nan)
    if n_eff <= 3:
        return (-1.0, 1.0)
    z = math.atanh(float(np.clip(r, -1 + 1e-12, 1 - 1e-12)))
    q = sps.norm.ppf(0.5 + confidence_level / 2) / math.sqrt(n_eff - 3)
    return (math.tanh(z - q), math.tanh(z + q))


def _centre_within(values: np.ndarray, group_index: list[np.ndarray]) -> np.ndarray:
    centred = values.astype(float).copy()
    for members in group_index:
        centred[members] -= centred[members].mean()
    return centred


def _permutation_count(x_centred: np.ndarray, y_centred: np.ndarray, group_index: list[np.ndarray], r: float,
                       n_permutations: int, seed: Any) -> int:
    """Return how many within-group permutations of y give |r| at least the observed one."""
    n = x_centred.size
    scale = math.sqrt(float(x_centred @ x_centred) * float(y_centred @ y_centred))
    tolerance = 1e-12 * max(1.0, abs(r))
    rng = np.random.default_rng(as_seed_sequence(seed))
    count = 0
    for start in range(0, n_permutations, 1000):
        batch = min(1000, n_permutations - start)
        order = np.tile(np.arange(n), (batch, 1))
        for members in group_index:
            order[:, members] = members[np.argsort(rng.random((batch, members.size)), axis=1)]
        count += int(np.sum(np.abs(y_centred[order] @ x_centred / scale) >= abs(r) - tolerance))
    return count


def permutation_correlation(x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None, *,
                            method: str = "pearson", n_permutations: int = 9999, seed: Any = 0,
                            confidence_level: float = 0.95) -> dict:
    """Return the correlation of x and y within groups, its Fisher-z CI and a permutation p-value.

    With one group this is the ordinary correlation (n_eff = n); with G groups (e.g. refits),
    x and y are centred within each group first and n_eff = n − (G − 1). The permutation null
    shuffles y within each group; with one group of at most 8 elements every permutation is
    enumerated (exact p-value). Keys: r, ci_low, ci_high, pvalue, n, n_eff, permutations, exact.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    groups = np.zeros(x.size, dtype=np.int64) if groups is None else np.asarray(groups)
    finite = np.isfinite(x) & np.isfinite(y)
    x, y, groups = x[finite], y[finite], groups[finite]
    if method == "spearman":
        x, y = sps.rankdata(x), sps.rankdata(y)
    elif method != "pearson":
        raise ValueError(f"unknown correlation {method!r}; use pearson or spearman")
    n = x.size
    group_index = [np.flatnonzero(groups == g) for g in np.unique(groups)]
    n_eff = n - (len(group_index) - 1)
    # centring within groups commutes with permuting within groups: permute the centred values
    x_centred, y_centred = _centre_within(x, group_index), _centre_within(y, group_index)
    scale = math.sqrt(float(x_centred @ x_centred) * float(y_centred @ y_centred))
    r = float(x_centred @ y_centred) / scale if n >= 3 and scale > 0 else math.nan
    low, high = fisher_interval(r, n_eff, confidence_level)
    out = {"r": r, "ci_low": low, "ci_high": high, "n": int(n), "n_eff": int(n_eff)}
    if not np.isfinite(r):
        return {**out, "pvalue": math.nan, "permutations": 0, "exact": False}
    if len(group_index) == 1 and n <= 8:
        every = np.array(list(itertools.permutations(range(n))))
        null = y_centred[every] @ x_centred / scale
        pvalue = float(np.mean(np.abs(null) >= abs(r) - 1e-12 * max(1.0, abs(r))))
        return {**out, "pvalue": pvalue, "permutations": len(every), "exact": True}
    count = _permutation_count(x_centred, y_centred, group_index, r, n_permutations, seed)
    return {**out, "pvalue": (1 + count) / (1 + n_permutations), "permutations": n_permutations, "exact": False}


# --- multiplicity -------------------------------------------------------------------------------
def z_pvalue(estimate: np.ndarray, standard_error: np.ndarray) -> np.ndarray:
    """Return two-sided normal p-values of estimate / standard_error (NaN where se is not > 0)."""
    estimate = np.asarray(estimate, dtype=np.float64)
    standard_error = np.asarray(standard_error, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(standard_error > 0, estimate / standard_error, np.nan)
    return np.where(np.isfinite(z), 2 * sps.norm.sf(np.abs(z)), np.nan)


def holm_adjust(pvalues: np.ndarray) -> np.ndarray:
    """Return Holm step-down family-wise adjusted p-values (NaN entries stay NaN, not counted)."""
    pvalues = np.asarray(pvalues, dtype=np.float64)
    flat = pvalues.ravel()
    finite = ~np.isnan(flat)
    out = np.full(flat.shape, np.nan)
    ranked = flat[finite]
    m = ranked.size
    if m:
        order = np.argsort(ranked, kind="stable")
        stepped = np.maximum.accumulate(ranked[order] * (m - np.arange(m)))
        adjusted = np.empty(m)
        adjusted[order] = np.minimum(stepped, 1.0)
        out[finite] = adjusted
    return out.reshape(pvalues.shape)


# --- importance ---------------------------------------------------------------------------------
def perplexity_rise(clean_loss: np.ndarray, ablated_loss: np.ndarray, plan: ResamplingPlan | None = None
                    ) -> np.ndarray:
    """Return exp(mean ablated loss) − exp(mean clean loss) per head, ``[L, H]`` or ``[B, L, H]``.

    ``clean_loss [N]`` and ``ablated_loss [L, H, N]`` are per-prompt mean next-token losses;
    with a ``plan`` the means are the engine's resampled means (one importance per resample).
    """
    n_layers, n_heads, n_prompts = ablated_loss.shape
    scores = np.column_stack([clean_loss, ablated_loss.reshape(-1, n_prompts).T])  # [N, 1 + L*H]
    if plan is None:
        means = scores.mean(axis=0)[:, None]
    else:
        means = resampled_means(scores, plan)  # [1 + L*H, B]
    rise = np.exp(means[1:]) - np.exp(means[0])
    out = rise.T.reshape(-1, n_layers, n_heads)
    return out[0] if plan is None else out


# --- verdicts of a study ------------------------------------------------------------------------
def bootstrap_z_summary(replicates: np.ndarray, confidence_level: float = 0.95) -> tuple[float, float, float]:
    """Return (low, high, standard error) of a percentile interval from finite bootstrap replicates."""
    replicates = np.asarray(replicates, dtype=np.float64)
    replicates = replicates[np.isfinite(replicates)]
    if replicates.size < 2:
        return (math.nan, math.nan, math.nan)
    low, high = percentile_interval(replicates, confidence_level)
    return float(low), float(high), float(replicates.std(ddof=1))


def jackknife_summary(estimate: float, leave_one_out: np.ndarray, confidence_level: float = 0.95
                      ) -> tuple[float, float, float]:
    """Return (low, high, standard error) of the jackknife-over-refits t interval of a scalar statistic."""
    low, high, standard_error = refit_jackknife(np.asarray(estimate, dtype=np.float64),
                                                np.asarray(leave_one_out, dtype=np.float64), confidence_level)
    return float(low), float(high), float(standard_error)


def pooled_fisher_z(correlations: np.ndarray, n_effective: np.ndarray, confidence_level: float = 0.95
                    ) -> tuple[float, float, float, float]:
    """Return (r, low, high, two-sided p) of correlations pooled in Fisher z with weights n_eff − 3.

    Correlations with n_eff <= 3 or NaN are left out; with none left every value is NaN.
    """
    r = np.asarray(correlations, dtype=np.float64)
    n = np.asarray(n_effective, dtype=np.float64)
    keep = np.isfinite(r) & (n > 3)
    if not keep.any():
        return (math.nan, math.nan, math.nan, math.nan)
    z = np.arctanh(np.clip(r[keep], -1 + 1e-12, 1 - 1e-12))
    weights = n[keep] - 3
    z_mean = float(z @ weights / weights.sum())
    standard_error = 1 / math.sqrt(weights.sum())
    q = sps.norm.ppf(0.5 + confidence_level / 2) * standard_error
    pvalue = float(2 * sps.norm.sf(abs(z_mean) / standard_error))
    return math.tanh(z_mean), math.tanh(z_mean - q), math.tanh(z_mean + q), pvalue


def fisher_pvalue(r: float, n_eff: float) -> float:
    """Return the two-sided p-value of r = 0 from Fisher's z with n_eff pairs (NaN if n_eff <= 3)."""
    if not np.isfinite(r) or n_eff <= 3:
        return math.nan
    z = math.atanh(float(np.clip(r, -1 + 1e-12, 1 - 1e-12))) * math.sqrt(n_eff - 3)
    return float(2 * sps.norm.sf(abs(z)))


def holm_verdicts(values: np.ndarray, pvalues: np.ndarray, directions: np.ndarray, alpha: float = 0.05
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Return (verdicts, Holm-adjusted p-values) of directional claims tested as one family.

    Rows with direction 0 are not claims: verdict "" and no adjusted p-value. A claim is
    "supported" when its Holm-adjusted p-value is <= alpha and its value lies on the claimed
    side (direction +1: above 0, −1: below 0), "contradicted" when significant on the other
    side, "inconclusive" otherwise (including a NaN p-value).
    """
    values = np.asarray(values, dtype=np.float64)
    directions = np.asarray(directions)
    claims = directions != 0
    adjusted = np.full(values.shape, np.nan)
    adjusted[claims] = holm_adjust(np.asarray(pvalues, dtype=np.float64)[claims])
    verdicts = np.full(values.shape, "", dtype=object)
    for i in np.flatnonzero(claims):
        if not (adjusted[i] <= alpha):
            verdicts[i] = "inconclusive"
        elif np.sign(values[i]) == directions[i]:
            verdicts[i] = "supported"
        else:
            verdicts[i] = "contradicted"
    return verdicts.astype(str), adjusted


def t_pvalue(estimate: float, standard_error: float, df: int) -> float:
    """Return the two-sided p-value of estimate / standard_error against t with ``df`` degrees of freedom."""
    if not (np.isfinite(estimate) and np.isfinite(standard_error) and standard_error > 0 and df >= 1):
        return math.nan
    return float(2 * sps.t.sf(abs(estimate) / standard_error, df))
