"""Are the heads that act as attention sinks the same across training seeds? Heads matched by pattern.

Heads are only identified inside one refit, so "the same head" in another seed means the head
matched to it: within each layer, the one-to-one (Hungarian) assignment maximising the attention
pattern cosine, exactly as in the head-stability study (``circuitstat.stats.head_pairs.per_layer_cosine``,
``circuitstat.stats.head_stability.prompt_resampled_similarity``, ``circuitstat.stats.similarity.match_heads``). By
default the first (BOS / sink) column is dropped from the patterns before matching: with it, every
sink head looks like every other sink head and the agreement below would be partly built into the
matching; without it, heads are matched by where else they attend.

Under that matching, for every ordered pair of seeds (a, b) and layer (and all layers pooled),
with sink heads the heads whose sink rate is >= ``sink_bar``:

* **Jaccard** of seed a's sink heads, carried through the matching, and seed b's sink heads.
  Undefined (NaN, counted in ``n_pairs_undefined``) when neither seed has a sink head there.
* **share** of seed a's sink heads whose matched head in seed b is a sink. Undefined when seed a
  has none.
* **mean |rate difference|** of the sink rates of matched heads (always defined).

**Null**: the expectation of the same statistic under a uniformly random one-to-one matching of
the layer's heads, computed exactly (the number of sinks matched to sinks is hypergeometric; a
head's random partner is uniform), so it needs no Monte Carlo draws and does not depend on head
indices. **Excess** = statistic − null for the agreements and null − statistic for the rate
difference (so positive always means more alike than chance). Aggregation: the mean over ordered
pairs of seeds (every seed an anchor in turn; pairs where the statistic is undefined left out and
counted); intervals: the leave-one-refit-out jackknife with a t quantile on K − 1 degrees of
freedom (``circuitstat.stats.head_stability.refit_jackknife``), covering the mean over the distribution of
training seeds (simulated coverage 0.937-0.967 at 95%, K = 5 seeds, 300 datasets: tests/stats/test_sinks.py;
0.90-0.96 at K = 10 in a 400-dataset probe). Verdict per row from its own excess interval (no multiplicity adjustment):
``stable`` (above 0), ``less than chance`` (below 0), ``inconclusive``, or ``undefined`` (no
interval: fewer than 3 seeds, or too few pairs with a sink head).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy import stats as sps

from .head_pairs import per_layer_cosine
from .head_stability import leave_one_refit_out, ordered_pair_mean, prompt_resampled_similarity, refit_jackknife
from .intervals import interval_verdict
from .similarity import match_heads

__all__ = ["pattern_matchings", "sink_pair_statistics", "sink_matching", "ITEMS", "ESTIMAND_SINK_MATCHING",
           "matching_description"]

#: the rows of the ``sink_matching`` table, per layer
ITEMS = ("sink-head Jaccard", "share of sink heads matched to a sink", "mean |sink-rate difference|")
#: items where a smaller value means more alike (excess = null - value)
_LOWER_IS_ALIKE = {"mean |sink-rate difference|"}

ESTIMAND_SINK_MATCHING = (
    "mean over ordered pairs of training seeds (every seed an anchor in turn; pairs where the statistic is undefined "
    "left out) of the statistic under the one-to-one matching of heads within the layer by attention-pattern cosine; "
    "interval: leave-one-refit-out jackknife, t on K-1 df, covering the mean over the distribution of training seeds; "
    "null: its exact expectation under a uniformly random one-to-one matching")


def matching_description(drop_bos: bool) -> str:
    """Return the description of the head matching recorded in the table."""
    return ("hungarian on the per-prompt cosine of lower-triangle attention patterns, mean over prompts"
            + (", first (BOS) column dropped" if drop_bos else ", first (BOS) column kept"))


def _input_error(msg: str) -> Exception:
    from circuitstat.core.errors import InputError

    return InputError(msg)


# --- matching --------------------------------------------------------------------------------
def _real_tokens_only(patterns: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Return ``patterns [L, H, P, T, T]`` with query rows and key columns of padding set to 0."""
    if mask is None:
        return patterns
    m = np.asarray(mask, dtype=bool)
    if m.shape != patterns.shape[2:4]:
        raise _input_error(f"mask must be [prompts, tokens] = {list(patterns.shape[2:4])}, got {list(m.shape)}")
    keep = (m[:, :, None] & m[:, None, :]).astype(patterns.dtype)
    return patterns * keep


def pattern_matchings(patterns: Sequence[np.ndarray], *, drop_bos: bool = True, mask: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Return (match ``[K, K, L, H]``, matched similarity ``[K, K, L, H]``) of every ordered pair of seeds.

    ``patterns[k]`` is seed k's ``[L, H, P, T, T]`` attention (``circuitstat.circuits.readouts.attention_patterns``);
    ``mask [P, T]`` marks real tokens (padding is zeroed). ``match[a, b, l, h]`` is the head of
    seed b's layer l matched to head h of seed a (Hungarian on the mean pattern cosine); pair
    (b, a) holds the inverse assignment, so the matching of a pair does not depend on its order.
    The diagonal is -1 / NaN.
    """
    if len(patterns) < 2:
        raise _input_error(f"matching heads across seeds needs at least 2 seeds, got {len(patterns)}")
    shapes = {np.shape(p) for p in patterns}
    if len(shapes) != 1 or len(next(iter(shapes))) != 5:
        raise _input_error(f"every seed's patterns must be [L, H, P, T, T] of one shape, got {sorted(shapes)}")
    pats = [_real_tokens_only(np.asarray(p), mask) for p in patterns]
    K, (L, H) = len(pats), pats[0].shape[:2]
    match = np.full((K, K, L, H), -1, dtype=np.int64)
    score = np.full((K, K, L, H), np.nan)
    for a, b in zip(*np.triu_indices(K, 1)):
        similarity = prompt_resampled_similarity(per_layer_cosine(pats[a], pats[b], drop_bos), None)[0]  # [L, H, H]
        for layer in range(L):
            cols, matched = match_heads(similarity[layer], "hungarian")
            match[a, b, layer], score[a, b, layer] = cols, matched
            match[b, a, layer, cols] = np.arange(H)
            score[b, a, layer, cols] = matched
    return match, score


# --- exact nulls under a uniform one-to-one matching -------------------------------------------
def _hypergeom_pmf(n_a: int, n_b: int, n_heads: int) -> np.ndarray:
    """Return P(X = x), x = 0..n_a: sinks of a matched to sinks of b under a uniform matching of n_heads heads."""
    return sps.hypergeom.pmf(np.arange(n_a + 1), n_heads, n_b, n_a)


def _intersection_pmf(n_a: Sequence[int], n_b: Sequence[int], n_heads: int) -> np.ndarray:
    """Return the distribution of the total matched sink count over independently matched layers."""
    pmf = np.ones(1)
    for x, y in zip(n_a, n_b):
        pmf = np.convolve(pmf, _hypergeom_pmf(int(x), int(y), n_heads))
    return pmf


def _jaccard_and_null(n_a: np.ndarray, n_b: np.ndarray, both: np.ndarray, n_heads: int) -> tuple[float, float]:
    """Return (Jaccard, its null expectation) of sink sets with per-layer sizes and matched-sink counts."""
    union_size = int(n_a.sum() + n_b.sum())
    if union_size == 0:
        return np.nan, np.nan
    x = int(both.sum())
    # at most min(|A|, |B|) sinks can meet; the pmf beyond is 0 (and k = |A| + |B| would divide by 0)
    pmf = _intersection_pmf(n_a, n_b, n_heads)[:min(int(n_a.sum()), int(n_b.sum())) + 1]
    k = np.arange(pmf.size)
    return x / (union_size - x), float(pmf @ (k / (union_size - k)))


def _share_and_null(n_a: np.ndarray, n_b: np.ndarray, both: np.ndarray, n_heads: int) -> tuple[float, float]:
    """Return (share of a's sinks matched to a sink, its null expectation sum n_a n_b / H / sum n_a)."""
    total = int(n_a.sum())
    if total == 0:
        return np.nan, np.nan
    return float(both.sum()) / total, float((n_a * n_b).sum()) / n_heads / total


def sink_pair_statistics(rates: np.ndarray, match: np.ndarray, sink_bar: float
                         ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return {item: (value, null)}, each ``[K, K, L + 1]`` per ordered pair of seeds and layer (last: pooled).

    ``rates [K, L, H]`` are the seeds' head sink rates, ``match [K, K, L, H]`` from
    :func:`pattern_matchings`. NaN on the diagonal and where an item is undefined.
    """
    rates = np.asarray(rates, dtype=np.float64)
    match = np.asarray(match)
    if rates.ndim != 3 or match.shape != (rates.shape[0], rates.shape[0], *rates.shape[1:]):
        raise _input_error(f"rates must be [K, L, H] and match [K, K, L, H], got {rates.shape} and {match.shape}")
    if not np.isfinite(rates).all():
        raise _input_error("sink rates contain NaN or infinite values")
    K, L, H = rates.shape
    sinks = rates >= sink_bar
    out = {item: (np.full((K, K, L + 1), np.nan), np.full((K, K, L + 1), np.nan)) for item in ITEMS}
    for a in range(K):
        for b in range(K):
            if a == b:
                continue
            if not all(np.array_equal(np.sort(match[a, b, layer]), np.arange(H)) for layer in range(L)):
                raise _input_error(f"the matching of seeds {a} and {b} is not one-to-one in every layer")
            partner = np.take_along_axis(rates[b], match[a, b], axis=-1)  # [L, H]: rate of each head's match
            both = (sinks[a] & (partner >= sink_bar)).sum(-1)  # [L]
            n_a, n_b = sinks[a].sum(-1), sinks[b].sum(-1)
            diff = np.abs(rates[a] - partner).mean(-1)
            diff_null = np.abs(rates[a][:, :, None] - rates[b][:, None, :]).mean((-1, -2))
            for j, layers in enumerate([[layer] for layer in range(L)] + [list(range(L))]):
                args = (n_a[layers], n_b[layers], both[layers], H)
                for item, (value, null) in zip(ITEMS[:2], (_jaccard_and_null(*args), _share_and_null(*args))):
                    out[item][0][a, b, j], out[item][1][a, b, j] = value, null
                out[ITEMS[2]][0][a, b, j] = diff[layers].mean()
                out[ITEMS[2]][1][a, b, j] = diff_null[layers].mean()
    return out


# --- aggregation over seeds --------------------------------------------------------------------
def sink_matching(rates: np.ndarray, match: np.ndarray, *, sink_bar: float, confidence_level: float = 0.95,
                  matching: str | None = None) -> dict[str, np.ndarray]:
    """Return the ``sink_matching`` table: agreement of sink heads across seeds under pattern matching, with its null.

    One row per layer (-1: all layers pooled) and item (:data:`ITEMS`): the mean over ordered seed
    pairs, its jackknife-over-refits interval, the exact random-matching null, the excess over it
    with its interval, a verdict, and how many pairs were defined.
    """
    rates = np.asarray(rates, dtype=np.float64)
    matching = matching_description(True) if matching is None else matching
    pair_stats = sink_pair_statistics(rates, match, sink_bar)
    K, L, _ = rates.shape
    cols: dict[str, list] = {c: [] for c in (
        "layer", "item", "value", "ci_low", "ci_high", "null", "excess", "excess_ci_low", "excess_ci_high", "verdict",
        "n_refits", "n_pairs", "n_pairs_undefined", "sink_bar", "matching", "estimand")}
    off_diagonal = ~np.eye(K, dtype=bool)
    for item in ITEMS:
        value, null = pair_stats[item]
        excess = null - value if item in _LOWER_IS_ALIKE else value - null
        estimates = {name: ordered_pair_mean(x) for name, x in (("value", value), ("null", null), ("excess", excess))}
        low, high, _ = refit_jackknife(estimates["value"], leave_one_refit_out(value), confidence_level)
        e_low, e_high, _ = refit_jackknife(estimates["excess"], leave_one_refit_out(excess), confidence_level)
        defined = np.isfinite(value[off_diagonal]).sum(0)  # [L + 1]
        for j in range(L + 1):
            row = (j if j < L else -1, item, estimates["value"][j], low[j], high[j], estimates["null"][j],
                   estimates["excess"][j], e_low[j], e_high[j], interval_verdict(e_low[j], e_high[j], "stable", "less than chance", "undefined"), K, int(defined[j]),
                   int(K * (K - 1) - defined[j]), float(sink_bar), matching, ESTIMAND_SINK_MATCHING)
            for c, v in zip(cols, row):
                cols[c].append(v)
    types = {"layer": np.int64, "item": str, "verdict": str, "n_refits": np.int64, "n_pairs": np.int64,
             "n_pairs_undefined": np.int64, "matching": str, "estimand": str}
    return {c: np.array(v, dtype=types.get(c, np.float64)) for c, v in cols.items()}
