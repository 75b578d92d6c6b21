"""Circuit stability under resampling, reported as functions of the circuit size k.

One chunked pass over the edges (circuitstat.stats.topk_stream.streaming_topk) keeps, per resample, the K = max(k)
best edges by (key descending, random tie priority): ties at a cut-off are broken at random from
the run's seed (circuitstat.core.topk), the same whatever the chunk size, and the ties at each cut-off are
counted (cutoff_ties_mean: edges sharing the k-th key; cutoff_ties_excluded_*: those left out).
From those lists, per k: inclusion frequency per edge, mean pairwise Jaccard (SD and a U-statistic
jackknife interval: Monte Carlo error of the resampling statistic, not a data-level interval),
its exact hypergeometric chance value and the chance-corrected value, the consensus circuit
{f_e >= 0.5} and each resample's Jaccard to it, Nogueira et al. (2018) stability Phi with their
asymptotic (again Monte Carlo) interval, and rank-biased overlap. Spearman and Kendall use full
score vectors of a few resamples. Stability-selection error bounds (Meinshausen & Buhlmann 2010,
Shah & Samworth 2013) are given only for half-size subsamples, where they hold.

Data-level estimands with intervals that cover them: primary, jaccard_half* (J_{N/2}: expected Jaccard of the top-k
circuits of two independent datasets of N/2 prompts, exact from disjoint halves; stats.stability_halves); beside it
(stats.stability_data, double bootstrap) jaccard_data* (J_N at N prompts, extrapolated: bracketed), jaccard_pop*
(a dataset's circuit vs the population's) and phi_data*. The
estimand of every interval is named in the tables' schema metadata (circuitstat.estimands).

Whether circuits are chosen by signed score or by |score| is an explicit, recorded argument.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy import sparse, stats
from scipy.special import ndtri

from circuitstat.core.errors import InputError
from circuitstat.core.seeds import as_seed_sequence, seed_record, spawn_seeds
from circuitstat.core.results import Result
from circuitstat.core.score_columns import column_means
from circuitstat.core.topk import TIE_RULE, ranking_key, row_seeds, select_topk, tie_priorities, topk

from .resampling import DEFAULT_MAX_BYTES, ResamplingPlan, check_score_matrix
from .stability_data import (ESTIMANDS, DataLevelEstimates, check_data_level,
                             data_level_stability)
from .stability_halves import HALF_COLUMNS, halves_stability
from .topk_stream import streaming_topk

__all__ = [
    "StabilityResult",
    "circuit_stability",
    "topk_indices",
    "chance_jaccard",
    "nogueira_stability",
    "rank_biased_overlap",
    "pairwise_jaccard",
    "selection_error_bounds",
    "refit_stability",
]

# --- small, reusable pieces ----------------------------------------------------------------
def topk_indices(scores: np.ndarray, k: int, ranking: str, *, seed: Any = 0) -> np.ndarray:
    """Return the k edges with the largest key in rank order, ties at random (circuitstat.core.topk.topk).

    Pass the run's seed: the default 0 is reproducible but reuses one tie order for every call.
    """
    return topk(scores, k, ranking=ranking, seed=seed).indices


def chance_jaccard(n_edges: int, k: int | Sequence[int]) -> np.ndarray:
    """Return E[J] of two independent uniformly random k-subsets of n_edges (hypergeometric)."""
    ks = np.atleast_1d(np.asarray(k, dtype=np.int64))
    out = np.empty(ks.size)
    for i, kk in enumerate(ks):
        if not 0 < kk <= n_edges:
            raise ValueError(f"k must lie in [1, {n_edges}], got {kk}")
        x = np.arange(max(0, 2 * kk - n_edges), kk + 1)
        # |A ∩ B| for random k-subsets is hypergeometric(M=n_edges, n=k, N=k)
        pmf = stats.hypergeom.pmf(x, n_edges, kk, kk)
        out[i] = float(np.sum(pmf * x / (2 * kk - x)))
    return out if np.ndim(k) else out[0]


def nogueira_stability(Z: np.ndarray | sparse.spmatrix,
                       confidence_level: float = 0.95) -> tuple[float, float, float, float]:
    """Return (Phi, variance, ci_low, ci_high) of Nogueira et al. (2018) for selections Z [M, d].

    Phi = 1 - mean_f s_f^2 / (kbar/d (1 - kbar/d)), s_f^2 the unbiased variance of feature f's
    selection indicator; variance from their asymptotic result (Theorem 7 / Corollary 9).
    """
    Zs = sparse.csr_matrix(Z, dtype=np.float64)
    m, d = Zs.shape
    if m < 2:
        raise ValueError("Phi needs at least 2 selections")
    p = np.asarray(Zs.mean(axis=0)).ravel()
    k_i = np.asarray(Zs.sum(axis=1)).ravel()
    kbar = p.sum()
    denom = (kbar / d) * (1 - kbar / d)
    if denom <= 0:
        return np.nan, np.nan, np.nan, np.nan  # selecting nothing or everything: undefined
    phi = 1 - (m / (m - 1)) * np.mean(p * (1 - p)) / denom
    zp = Zs @ p
    phi_i = (zp / d - k_i * kbar / d**2
             + phi / 2 * (2 * k_i * kbar / d**2 - k_i / d - kbar / d + 1)) / denom
    var = 4.0 / m**2 * np.sum((phi_i - phi_i.mean()) ** 2)
    z = ndtri(0.5 + confidence_level / 2)
    return float(phi), float(var), float(phi - z * np.sqrt(var)), float(phi + z * np.sqrt(var))


def rank_biased_overlap(a: np.ndarray, b: np.ndarray, p: float) -> np.ndarray:
    """Return extrapolated RBO (Webber et al. 2010) of ranked lists a, b [P, k] (or [k]), depth k."""
    a2, b2 = np.atleast_2d(a).astype(np.int64), np.atleast_2d(b).astype(np.int64)
    if a2.shape != b2.shape:
        raise ValueError("ranked lists must have the same shape")
    if not 0 < p < 1:
        raise ValueError("RBO persistence p must lie in (0, 1)")
    n_pairs, k = a2.shape
    span = int(max(a2.max(), b2.max())) + 1
    order = np.argsort(b2, axis=1, kind="stable")
    sb = np.take_along_axis(b2, order, axis=1)
    off = np.arange(n_pairs, dtype=np.int64)[:, None] * span
    # one global searchsorted: row offsets keep every row's values in its own range
    pos = np.searchsorted((sb + off).ravel(), (a2 + off).ravel()).reshape(n_pairs, k)
    pos = np.clip(pos - np.arange(n_pairs)[:, None] * k, 0, k - 1)
    found = np.take_along_axis(sb, pos, axis=1) == a2
    pb = np.where(found, np.take_along_axis(order, pos, axis=1), k)
    depth = np.maximum(np.arange(k)[None, :], pb)  # 0-based depth where the item is in both
    rows = np.broadcast_to(np.arange(n_pairs)[:, None], depth.shape)
    cnt = np.bincount((rows * (k + 1) + depth)[found], minlength=n_pairs * (k + 1))
    x = np.cumsum(cnt.reshape(n_pairs, k + 1)[:, :k], axis=1)  # overlap at depth 1..k
    d = np.arange(1, k + 1)
    # weights p^d computed in log space: p close to 1 and k in the thousands stay finite
    w = np.exp(d * np.log(p))
    rbo = x[:, -1] / k * w[-1] + (1 - p) / p * np.sum(x / d * w, axis=1)
    return rbo if np.ndim(a) == 2 else rbo[0]


def jaccard_moments(rows_idx: np.ndarray, k: int, n_edges: int,
                     max_bytes: int) -> tuple[float, float, float, int]:
    """Return (mean, SD, jackknife SE, pairs) of pairwise Jaccard of equal-size sets [M, k]."""
    m = rows_idx.shape[0]
    if m < 3:
        return np.nan, np.nan, np.nan, m * (m - 1) // 2
    union, inv = np.unique(rows_idx, return_inverse=True)
    inv = inv.reshape(m, k)
    rr = np.repeat(np.arange(m), k)
    if m * union.size * 4 <= max_bytes:
        # dense indicator over edges ever selected; float32 products of 0/1 are exact (< 2^24)
        Z = np.zeros((m, union.size), dtype=np.float32)
        Z[rr, inv.ravel()] = 1.0
        Zt = np.ascontiguousarray(Z.T)
    else:
        Z = sparse.csr_matrix((np.ones(m * k, dtype=np.float32), (rr, inv.ravel())),
                              shape=(m, union.size))
        Zt = Z.T.tocsc()
    row_sums = np.zeros(m)
    sq = 0.0
    block = max(1, int(max_bytes // (8 * 3 * m)))
    for r0 in range(0, m, block):
        r1 = min(m, r0 + block)
        inter = Z[r0:r1] @ Zt
        inter = inter.toarray() if sparse.issparse(inter) else inter
        inter = inter.astype(np.float64)
        jac = inter / (2 * k - inter)
        jac[np.arange(r1 - r0), np.arange(r0, r1)] = 0.0  # a set with itself is not a pair
        row_sums[r0:r1] = jac.sum(axis=1)
        sq += float((jac**2).sum())
    n_pairs = m * (m - 1) // 2
    total = row_sums.sum() / 2
    mean = total / n_pairs
    sd = np.sqrt(max(0.0, (sq / 2 - total**2 / n_pairs) / (n_pairs - 1)))
    # jackknife of the U-statistic over resamples: leave resample i out, in closed form
    loo = (total - row_sums) / ((m - 1) * (m - 2) / 2)
    se = np.sqrt((m - 1) / m * np.sum((loo - loo.mean()) ** 2))
    return float(mean), float(sd), float(se), n_pairs


def pairwise_jaccard(sets: np.ndarray) -> np.ndarray:
    """Return the [M, M] Jaccard matrix of boolean selections [M, d] (indicator product)."""
    Z = sparse.csr_matrix(np.asarray(sets, dtype=bool), dtype=np.float64)
    inter = (Z @ Z.T).toarray()
    size = np.asarray(Z.sum(axis=1)).ravel()
    union = size[:, None] + size[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1), 1.0)


def selection_error_bounds(k: int | np.ndarray, n_edges: int, thresholds: Sequence[float], *,
                           n_pairs: int | None = None) -> dict[str, np.ndarray]:
    """Return PFER bounds E[V] per (k, threshold): Meinshausen–Bühlmann and Shah–Samworth.

    MB: E[V] <= q^2 / ((2 pi - 1) p) with q = k selected per half-size subsample, p = n_edges.
    CPSS (needs complementary pairs, n_pairs splits), unimodal case of Shah & Samworth's eq. (8):
    E[V] <= C(tau, B) q^2 / p, NaN outside the range of tau where it is proven.
    """
    ks = np.atleast_1d(np.asarray(k, dtype=np.float64))
    th = np.atleast_1d(np.asarray(thresholds, dtype=np.float64))
    if ((th <= 0.5) | (th > 1)).any():
        raise ValueError("stability-selection thresholds must lie in (0.5, 1]")
    kk, tt = np.meshgrid(ks, th, indexing="ij")
    q2p = kk**2 / n_edges
    out = {"k": kk.ravel().astype(np.int64), "threshold": tt.ravel(),
           "pfer_mb": (q2p / (2 * tt - 1)).ravel()}
    if n_pairs is not None:
        b = float(n_pairs)
        theta = kk / n_edges
        low = 0.5 + np.minimum(theta**2, 1 / (2 * b) + 0.75 * theta**2)
        c_low = 1.0 / (2 * (2 * tt - 1 - 1 / (2 * b)))
        c_high = 4 * (1 - tt + 1 / (2 * b)) / (1 + 1 / b)
        c = np.where(tt <= 0.75, c_low, c_high)
        valid = np.where(tt <= 0.75, tt > low, tt <= 1)
        out["pfer_cpss_unimodal"] = np.where(valid, c * q2p, np.nan).ravel()
    return out


# --- result --------------------------------------------------------------------------------
@dataclass(repr=False)
class StabilityResult(Result):
    """Circuit stability as functions of k: per-k table, inclusion counts, rank agreement."""

    ks: np.ndarray
    ranking: str
    n_edges: int
    n_resamples: int
    plan_kind: str
    per_k: dict[str, np.ndarray]
    inclusion_counts: np.ndarray  # [len(ks), E] int32: resamples whose top-k holds the edge
    consensus_threshold: float
    spearman: np.ndarray  # one value per pair of kept full score vectors
    kendall: np.ndarray
    rank_pairs: np.ndarray  # [P, 2] resample ids for spearman
    kendall_pairs: np.ndarray
    n_pairs_cpss: int | None = None
    edge_names: Sequence[str] | None = None
    #: data-level interval of J_{N/2}, the expected Jaccard between the circuits of two independent datasets of N/2
    #: prompts, exactly estimable from disjoint halves (``conf_int()``'s default; J_N is jaccard_data_ci)
    primary_interval = "jaccard_half_ci"
    main_table = "stability"
    #: uint64 tie-breaking seeds (circuitstat.core.topk.tie_priorities): one per resample, then the data's
    tie_seeds: np.ndarray | None = None
    params: dict = field(default_factory=dict)

    # convenient scipy-like attributes
    @property
    def mean_jaccard(self) -> np.ndarray:
        """Return mean pairwise Jaccard per k."""
        return self.per_k["jaccard_mean"]

    @property
    def phi(self) -> np.ndarray:
        """Return Nogueira's stability Phi per k."""
        return self.per_k["phi"]

    def _k_pos(self, k: int) -> int:
        """Return the position of k in the grid (ValueError if absent)."""
        hits = np.flatnonzero(self.ks == k)
        if hits.size == 0:
            raise ValueError(f"k={k} is not in the grid {self.ks.tolist()}")
        return int(hits[0])

    def inclusion_frequency(self, k: int) -> np.ndarray:
        """Return f_e, the share of resamples whose top-k circuit contains edge e [E]."""
        return self.inclusion_counts[self._k_pos(k)] / self.n_resamples

    def consensus(self, k: int) -> np.ndarray:
        """Return the consensus circuit {e : f_e >= threshold} as sorted edge indices."""
        return np.flatnonzero(self.inclusion_frequency(k) >= self.consensus_threshold)

    def selection_bounds(self, thresholds: Sequence[float] = (0.6, 0.7, 0.8, 0.9)) -> dict:
        """Return stability-selection PFER bounds per (k, threshold); half-size subsamples only."""
        if self.plan_kind not in ("subsample", "complementary_pairs"):
            raise ValueError(
                "stability-selection error bounds (Meinshausen–Bühlmann, Shah–Samworth) hold only "
                f"for half-size subsamples, but these resamples are {self.plan_kind!r}; rerun "
                "circuit_stability with plan=ResamplingPlan.subsample(N, B, seed) or "
                "ResamplingPlan.complementary_pairs(N, n_pairs, seed)")
        out = selection_error_bounds(self.ks, self.n_edges, thresholds, n_pairs=self.n_pairs_cpss)
        th = np.asarray(thresholds, dtype=np.float64)
        out["n_selected"] = np.array([[int(np.sum(self.inclusion_counts[i] / self.n_resamples >= t))
                                       for t in th] for i in range(self.ks.size)]).ravel()
        return out


    def to_table(self, name: str | None = None):
        """Return one result table; its schema metadata names the estimand of each interval."""
        table = super().to_table(name)
        meta = dict(table.schema.metadata or {})
        meta[b"circuitstat.estimands"] = json.dumps(ESTIMANDS, sort_keys=True).encode()
        return table.replace_schema_metadata(meta)

    def _tables(self) -> dict[str, dict[str, Any]]:
        tables: dict[str, dict[str, Any]] = {"stability": {"k": self.ks, **self.per_k,
                                                           "tie_rule": [TIE_RULE] * self.ks.size}}
        ki, ei = np.nonzero(self.inclusion_counts)
        inc = {"k": self.ks[ki], "edge": ei.astype(np.int64)}
        if self.edge_names is not None:
            inc["edge_name"] = np.asarray(self.edge_names, dtype=str)[ei]
        cnt = self.inclusion_counts[ki, ei]
        inc.update(count=cnt.astype(np.int64), frequency=cnt / self.n_resamples,
                   in_consensus=cnt / self.n_resamples >= self.consensus_threshold)
        tables["stability_inclusion"] = inc
        kend = np.full(self.rank_pairs.shape[0], np.nan)
        lookup = {tuple(p): v for p, v in zip(self.kendall_pairs.tolist(), self.kendall)}
        for i, p in enumerate(self.rank_pairs.tolist()):
            kend[i] = lookup.get(tuple(p), np.nan)
        tables["rank_correlation"] = {"resample_a": self.rank_pairs[:, 0].astype(np.int64),
                                      "resample_b": self.rank_pairs[:, 1].astype(np.int64),
                                      "spearman": self.spearman, "kendall": kend}
        if self.plan_kind in ("subsample", "complementary_pairs"):
            tables["selection_bounds"] = self.selection_bounds(
                self.params.get("selection_thresholds") or (0.6, 0.7, 0.8, 0.9))
        return tables

    @property
    def spearman_mean(self) -> float:
        """Return the mean Spearman correlation over pairs of resampled full score vectors (NaN if none)."""
        return float(np.nanmean(self.spearman)) if self.spearman.size else np.nan

    def _summary_items(self) -> list[tuple[str, Any]]:
        items: list[tuple[str, Any]] = [
            ("ranking", self.ranking), ("edges", self.n_edges), ("resamples", self.n_resamples),
            ("plan", self.plan_kind),
            ("spearman (mean over pairs)", self.spearman_mean),
            ("kendall (mean over pairs)", float(np.nanmean(self.kendall))
             if self.kendall.size else np.nan)]
        for i, k in enumerate(self.ks):
            items.append((f"k={k}", f"J={self.per_k['jaccard_mean'][i]:.3f} "
                                    f"(chance {self.per_k['jaccard_chance'][i]:.3f}, corrected "
                                    f"{self.per_k['jaccard_corrected'][i]:.3f}) "
                                    f"Phi={self.per_k['phi'][i]:.3f} "
                                    f"|consensus|={self.per_k['consensus_size'][i]}"))
            if np.isfinite(self.per_k["jaccard_data_ci_low"][i]):
                items.append((f"  k={k} data level", (
                    f"J_N/2 (halves) {self.per_k['jaccard_half'][i]:.3f} "
                    f"[{self.per_k['jaccard_half_ci_low'][i]:.3f}, "
                    f"{self.per_k['jaccard_half_ci_high'][i]:.3f}]  "
                    f"J_N (extrapolated, bracketed) {self.per_k['jaccard_data'][i]:.3f} "
                    f"[{self.per_k['jaccard_data_ci_low'][i]:.3f}, "
                    f"{self.per_k['jaccard_data_ci_high'][i]:.3f}]  J(D,pop) "
                    f"[{self.per_k['jaccard_pop_ci_low'][i]:.3f}, "
                    f"{self.per_k['jaccard_pop_ci_high'][i]:.3f}]  Phi "
                    f"[{self.per_k['phi_data_ci_low'][i]:.3f}, "
                    f"{self.per_k['phi_data_ci_high'][i]:.3f}]")))
        note = self.params.get("data_level") or {}
        if not note.get("computed", True):
            items.append(("data-level intervals", f"not computed: {note.get('reason')}"))
        return items


def _add_data_level(per_k: dict[str, np.ndarray], S: np.ndarray, ks: np.ndarray, ranking: str,
                    plan: ResamplingPlan, seed: np.random.SeedSequence, wanted: bool | None,
                    n_outer: int, n_inner: int, method: str, confidence_level: float,
                    chunk_size: int | None, n_jobs: int, max_bytes: int) -> dict:
    """Add the data-level columns to per_k in place; return what was done (for params)."""
    names = [f"{e}{p}" for e in ("jaccard_data", "jaccard_pop", "phi_data")
             for p in ("", "_se", "_bias", "_ci_low", "_ci_high", "_split", "_2n")
             if not (e == "jaccard_pop" and p in ("_split", "_2n"))] + list(HALF_COLUMNS)
    groups = plan.groups if plan.kind == "cluster" else None  # whole templates, as the plan resamples them
    why = "not requested (data_level=False)" if wanted is False else check_data_level(
        S.shape[0], plan.kind, n_outer, n_inner, plan.strata,
        None if groups is None else int(np.unique(groups).size))
    if why is not None:
        if wanted:
            raise InputError(why)
        for c in names:
            per_k[c] = np.full(ks.size, np.nan)
        return {"computed": False, "reason": why}
    est = DataLevelEstimates(per_k["jaccard_mean"], per_k["jaccard_se"],
                             per_k["full_data_jaccard_mean"], per_k["full_data_jaccard_se"],
                             per_k["phi"], np.sqrt(per_k["phi_variance"]))
    per_k.update(data_level_stability(S, ks, est, ranking=ranking, seed=seed, n_outer=n_outer,
                                      n_inner=n_inner, confidence_level=confidence_level,
                                      method=method, chunk_size=chunk_size, n_jobs=n_jobs,
                                      max_bytes=max_bytes, strata=plan.strata, groups=groups))
    # the primary data-level quantity: J_{N/2} from disjoint halves (its own seed child: the first five are
    # data_level_stability's)
    per_k.update(halves_stability(S, ks, ranking=ranking, seed=spawn_seeds(seed, 6)[5],
                                  confidence_level=confidence_level, strata=plan.strata, groups=groups,
                                  chunk_size=chunk_size, n_jobs=n_jobs, max_bytes=max_bytes))
    return {"computed": True, "method": method, "n_outer": int(n_outer),
            "n_inner": int(n_inner), "seed": seed_record(seed)}


def _run_seed(plan: ResamplingPlan, seed: Any) -> np.random.SeedSequence:
    """Return the run's root SeedSequence: the plan's recorded seed, else `seed` (None: fresh)."""
    if plan.seed is not None and plan.seed.get("entropy") is not None:
        return np.random.SeedSequence(plan.seed["entropy"], spawn_key=tuple(plan.seed["spawn_key"]))
    return as_seed_sequence(seed)


# --- estimator -----------------------------------------------------------------------------
def _per_k_columns(state, ks_arr: np.ndarray, n_edges: int, full_top: np.ndarray, *, m_pair: int, n_full: int,
                   consensus_threshold: float, confidence_level: float, rbo_p: float | None,
                   max_bytes: int) -> tuple[dict[str, list], np.ndarray]:
    """(per-k columns, inclusion counts [len(ks), E]) from the resamples' streamed top-K lists."""
    z = ndtri(0.5 + confidence_level / 2)
    B = state.idx.shape[0]
    real = state.idx < n_edges
    cols: dict[str, list] = {c: [] for c in (
        "jaccard_mean", "jaccard_sd", "jaccard_se", "jaccard_ci_low", "jaccard_ci_high",
        "jaccard_pairs", "jaccard_chance", "jaccard_corrected", "consensus_size",
        "consensus_jaccard_mean", "consensus_jaccard_sd", "consensus_jaccard_q05",
        "consensus_jaccard_median", "consensus_jaccard_q95", "full_data_jaccard_mean",
        "full_data_jaccard_se",
        "phi", "phi_variance", "phi_ci_low", "phi_ci_high", "rbo_mean", "rbo_sd", "rbo_p",
        "resamples_with_cutoff_ties", "cutoff_ties_mean", "cutoff_ties_excluded_mean",
        "cutoff_ties_excluded_max")}
    counts = np.zeros((ks_arr.size, n_edges), dtype=np.int32)
    # RBO pairs: all pairs among the kept resamples (cheap: only the ranked lists are needed)
    n_rbo = max(n_full, min(B, 2))
    ia, ib = np.triu_indices(n_rbo, k=1)
    for i, k in enumerate(ks_arr):
        top = state.idx[:, :k]
        counts[i] = np.bincount(top.ravel(), minlength=n_edges)
        freq = counts[i] / B
        # ties: equal values just outside the cut-off, incl. those dropped in earlier chunks
        vk = state.vals[:, k - 1]
        outside = ((state.vals[:, k:] == vk[:, None]) & real[:, k:]).sum(axis=1)
        outside = outside + np.where(state.boundary == vk, state.dropped, 0)
        inside = (state.vals[:, :k] == vk[:, None]).sum(axis=1)
        cols["resamples_with_cutoff_ties"].append(int(np.sum(outside > 0)))
        cols["cutoff_ties_mean"].append(float(np.mean(inside + outside)))
        cols["cutoff_ties_excluded_mean"].append(float(outside.mean()))
        cols["cutoff_ties_excluded_max"].append(int(outside.max()))
        mean, sd, se, npairs = jaccard_moments(top[:m_pair], int(k), n_edges, max_bytes)
        chance = float(chance_jaccard(n_edges, int(k)))
        cols["jaccard_mean"].append(mean)
        cols["jaccard_sd"].append(sd)
        cols["jaccard_se"].append(se)
        cols["jaccard_ci_low"].append(mean - z * se)
        cols["jaccard_ci_high"].append(mean + z * se)
        cols["jaccard_pairs"].append(npairs)
        cols["jaccard_chance"].append(chance)
        cols["jaccard_corrected"].append((mean - chance) / (1 - chance))
        cons = freq >= consensus_threshold
        csize = int(cons.sum())
        inter = cons[top].sum(axis=1)
        cj = inter / (k + csize - inter)
        cols["consensus_size"].append(csize)
        cols["consensus_jaccard_mean"].append(float(cj.mean()))
        cols["consensus_jaccard_sd"].append(float(cj.std(ddof=1)))
        q05, q50, q95 = np.quantile(cj, [0.05, 0.5, 0.95])
        cols["consensus_jaccard_q05"].append(float(q05))
        cols["consensus_jaccard_median"].append(float(q50))
        cols["consensus_jaccard_q95"].append(float(q95))
        in_full = np.zeros(n_edges, dtype=bool)
        in_full[full_top[:k]] = True
        fi = in_full[top].sum(axis=1)
        fj = fi / (2 * k - fi)
        cols["full_data_jaccard_mean"].append(float(np.mean(fj)))
        cols["full_data_jaccard_se"].append(float(np.std(fj, ddof=1) / np.sqrt(B)))
        Z = sparse.csr_matrix((np.ones(B * k), (np.repeat(np.arange(B), k), top.ravel())),
                              shape=(B, n_edges))
        phi, var, lo, hi = nogueira_stability(Z, confidence_level)
        cols["phi"].append(phi)
        cols["phi_variance"].append(var)
        cols["phi_ci_low"].append(lo)
        cols["phi_ci_high"].append(hi)
        p = rbo_p if rbo_p is not None else 1.0 - 1.0 / max(int(k), 2)
        rbo = rank_biased_overlap(top[ia], top[ib], p) if ia.size else np.array([np.nan])
        cols["rbo_mean"].append(float(np.mean(rbo)))
        cols["rbo_sd"].append(float(np.std(rbo, ddof=1)) if rbo.size > 1 else np.nan)
        cols["rbo_p"].append(p)
    return cols, counts


def _rank_agreement(full: np.ndarray, n_full: int, n_kendall_pairs: int | None):
    """(Spearman over all pairs, Kendall over disjoint pairs, their index pairs) of full score vectors."""
    if n_full >= 2:
        ranks = stats.rankdata(full, axis=1)
        ranks -= ranks.mean(axis=1, keepdims=True)
        ranks /= np.linalg.norm(ranks, axis=1, keepdims=True)
        corr = ranks @ ranks.T  # Pearson correlation of ranks = Spearman (average ranks for ties)
        pa_, pb_ = np.triu_indices(n_full, k=1)
        spearman = corr[pa_, pb_]
        rank_pairs = np.stack([pa_, pb_], axis=1)
        n_kp = n_full // 2 if n_kendall_pairs is None else min(int(n_kendall_pairs), n_full // 2)
        kendall_pairs = np.stack([np.arange(n_kp) * 2, np.arange(n_kp) * 2 + 1], axis=1)
        kendall = np.array([stats.kendalltau(full[a], full[b]).statistic
                            for a, b in kendall_pairs])
        return spearman, kendall, rank_pairs, kendall_pairs
    empty = np.zeros((0, 2), dtype=np.int64)
    return np.zeros(0), np.zeros(0), empty, empty


def _checked_ks(plan: ResamplingPlan, ks: Sequence[int], n_edges: int, consensus_threshold: float,
                selection_thresholds: Sequence[float] | None) -> np.ndarray:
    """Return the sorted unique ks; raise ValueError for a request circuit_stability cannot answer."""
    if selection_thresholds is not None and not plan.is_half_subsample:
        raise ValueError(
            "stability-selection error bounds need half-size subsamples, but the plan is "
            f"{plan.kind!r}; use plan=ResamplingPlan.subsample(N, B, seed) or "
            "ResamplingPlan.complementary_pairs(N, n_pairs, seed), or drop selection_thresholds")
    ks_arr = np.unique(np.asarray(ks, dtype=np.int64))
    if ks_arr.size == 0 or ks_arr[0] < 1 or ks_arr[-1] >= n_edges:
        raise ValueError(f"every k must lie in [1, E-1] = [1, {n_edges - 1}], got {ks_arr.tolist()}")
    if not 0 < consensus_threshold <= 1:
        raise ValueError("consensus_threshold must lie in (0, 1]")
    if plan.n_resamples < 2:
        raise ValueError("stability needs at least 2 resamples")
    return ks_arr


def circuit_stability(S: np.ndarray, plan: ResamplingPlan | None = None,
                      ks: Sequence[int] = (10, 20, 50, 100, 200, 500, 1000), *, ranking: str,
                      n_resamples: int = 200, seed: Any = None, consensus_threshold: float = 0.5,
                      selection_thresholds: Sequence[float] | None = None,
                      n_pair_resamples: int = 1000, n_rank_resamples: int = 30,
                      n_kendall_pairs: int | None = None, rbo_p: float | None = None,
                      confidence_level: float = 0.95, chunk_size: int | None = None,
                      n_jobs: int = 1, max_bytes: int = DEFAULT_MAX_BYTES,
                      edge_names: Sequence[str] | None = None, data_level: bool | None = None,
                      n_outer: int = 100, n_inner: int = 20,
                      data_level_method: str = "bracketed_2n") -> StabilityResult:
    """Return the stability of top-k circuits of S [N, E] across resamples, for every k in ks.

    ranking: 'signed' (largest scores) or 'absolute' (largest |scores|), required.
    n_pair_resamples: pairwise Jaccard uses the first that many resamples (B^2 pairs).
    n_rank_resamples: Spearman over all pairs and Kendall over disjoint pairs of that many full
    score vectors. rbo_p: RBO persistence; None uses p = 1 - 1/k (expected depth k).
    data_level: add intervals for the data-level estimands (circuitstat.stats.stability_data: Jaccard and
    Phi between circuits of independent size-N datasets, Jaccard to the population's circuit)
    from a double bootstrap of n_outer x n_inner resamples. None: where possible (bootstrap
    plan, N >= stability_data.MIN_OBS), else NaN columns with the reason in params; True:
    refuse with InputError where not possible; False: skip. data_level_method: one of
    stability_data.METHODS; the default "bracketed_2n" adds 2 * n_outer resamples of size 2N.
    """
    ranking_key(np.zeros(1), ranking)  # raises for an unknown ranking
    S = check_score_matrix(S)
    n_obs, n_edges = S.shape
    if plan is None:
        plan = ResamplingPlan.bootstrap(n_obs, n_resamples, seed)
    elif seed is not None and plan.seed is not None:
        raise ValueError("pass either a plan or a seed, not both: the plan already fixes the draw")
    root = _run_seed(plan, seed)
    if plan.n_obs != n_obs:
        check_score_matrix(S, plan)  # raises with the fix named
    ks_arr = _checked_ks(plan, ks, n_edges, consensus_threshold, selection_thresholds)
    B = plan.n_resamples
    K = int(ks_arr[-1])
    n_full = min(B, max(0, int(n_rank_resamples)))
    tie_rng = np.random.default_rng(spawn_seeds(root, 2)[0])
    seeds = row_seeds(tie_rng, B + 1)  # one tie-breaking stream per resample, one for the data
    state, full = streaming_topk(S, plan, K, ranking, seeds[:B], n_full=n_full,
                                 chunk_size=chunk_size, n_jobs=n_jobs, max_bytes=max_bytes)

    theta = column_means(S)  # block by block: no float64 copy of S
    full_top = select_topk(ranking_key(theta, ranking)[None, :],
                           tie_priorities(seeds[B:], np.arange(n_edges)), K)[0][0]
    m_pair = min(B, int(n_pair_resamples))
    cols, counts = _per_k_columns(state, ks_arr, n_edges, full_top, m_pair=m_pair, n_full=n_full,
                                  consensus_threshold=consensus_threshold, confidence_level=confidence_level,
                                  rbo_p=rbo_p, max_bytes=max_bytes)
    per_k = {c: np.asarray(v) for c, v in cols.items()}
    data_note = _add_data_level(per_k, S, ks_arr, ranking, plan, spawn_seeds(root, 2)[1],
                                data_level, n_outer, n_inner, data_level_method,
                                confidence_level, chunk_size, n_jobs, max_bytes)

    spearman, kendall, rank_pairs, kendall_pairs = _rank_agreement(full, n_full, n_kendall_pairs)

    params = {"estimator": "circuit_stability", "ranking": ranking, "ks": ks_arr,
              "plan": plan.describe(), "consensus_threshold": consensus_threshold,
              "n_pair_resamples": m_pair, "n_rank_resamples": n_full,
              "rbo_p": rbo_p if rbo_p is not None else "1 - 1/k",
              "confidence_level": confidence_level,
              "tie_breaking": "random (circuitstat.core.topk priorities from the run seed)",
              "tie_seed": seed_record(root),
              "selection_thresholds": list(selection_thresholds) if selection_thresholds else None,
              "data_level": data_note, "estimands": ESTIMANDS,
              "n_obs": n_obs, "n_edges": n_edges}
    return StabilityResult(ks=ks_arr, ranking=ranking, n_edges=n_edges, n_resamples=B,
                           plan_kind=plan.kind, per_k=per_k, inclusion_counts=counts,
                           consensus_threshold=consensus_threshold, spearman=spearman,
                           kendall=kendall, rank_pairs=rank_pairs, kendall_pairs=kendall_pairs,
                           n_pairs_cpss=plan.n_pairs, edge_names=edge_names, tie_seeds=seeds,
                           params=params)


def refit_stability(vectors: np.ndarray, plan: ResamplingPlan, ks: Sequence[int], *, ranking: str,
                    seed: Any = None, **options: Any) -> StabilityResult:
    """Return the stability of top-k circuits of score vectors refitted on each resample of ``plan``.

    ``vectors`` [B, E]: row b is a method's score vector fitted on resample b of ``plan`` (its counts as
    example weights; e.g. a mask-learning method, circuitstat.circuits.edge_pruning, refitted with a fresh seed
    per resample).  Such methods have no per-example scores whose resampled means would stand in for a
    refit, so each resample's circuit is the top-k of its own vector: :func:`circuit_stability` runs on the
    vectors with one resample per row (inclusion frequency, pairwise Jaccard against chance, Phi, rank
    agreement).  Their intervals are the same Monte Carlo intervals over resamples of one dataset; the
    data-level estimands need a double bootstrap of refits and are not computed (NaN, the reason in params).
    For a method with per-example scores S, ``vectors`` = the resampled means of S gives circuit_stability's
    own per-k values.  (``full_data_*`` compares each refit with the top-k of the refits' mean vector.)
    """
    V = np.asarray(vectors, dtype=np.float64)
    if V.ndim != 2 or V.shape[0] != plan.n_resamples:
        raise ValueError(f"vectors must be [{plan.n_resamples}, E], one per resample of the plan; got {V.shape}")
    if seed is None and plan.seed is not None:
        seed = _run_seed(plan, None)  # tie-breaking from the plan's recorded seed, as circuit_stability's
    one_each = ResamplingPlan.from_counts(np.eye(V.shape[0], dtype=np.int32), kind=plan.kind)
    res = circuit_stability(V, one_each, ks, ranking=ranking, seed=seed, data_level=False, **options)
    res.params.update(plan=plan.describe(), estimator="refit_stability",
                      refit="one score vector per resample, fitted on that resample (no per-example scores)",
                      data_level="not computed for refitted vectors (it needs a double bootstrap of refits)")
    return res
