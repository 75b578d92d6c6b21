"""Per-edge bootstrap intervals of the mean of a score matrix S [N, E], in edge chunks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy.special import ndtri

from circuitstat.core.results import ConfidenceInterval

from ..reliability import RELIABLE_MAX_TAIL_SHARE, tail_share
from ..resampling import (DEFAULT_MAX_BYTES, ResamplingPlan, resolve_jobs, check_score_matrix, default_chunk_size,
                          map_edge_chunks, plan_weights, studentized_resamples)
from ..testing import bh_adjust
from .bounds import frac_below, intervals_sorted
from .jackknife import acceleration_from_jackknife, mean_acceleration
from .methods import (CLUSTER_DEFAULT_METHOD, DEFAULT_METHOD, EDGE_METHODS, ESTIMAND, IID_METHODS, STUDENTIZED,
                      WILD_METHODS, check_methods, check_plan_for_methods, plan_for, tail_levels)
from .pvalues import pvalues_sorted
from .result import BootstrapResult
from .wcr import wcr_interval
from .wild import CLUSTER_METHODS, ClusterSums, cluster_intervals, cluster_pvalues, cr2_se, weight_family, wild_t


def bootstrap_edges(S: np.ndarray, plan: ResamplingPlan | None = None, *,
                    n_resamples: int = 2000, seed: Any = None, method: str | None = None,
                    methods: Sequence[str] | None = None, confidence_level: float = 0.95,
                    alternative: str = "two-sided", keep_distribution: bool = False,
                    chunk_size: int | None = None, n_jobs: int = 1,
                    max_bytes: int = DEFAULT_MAX_BYTES,
                    edge_names: Sequence[str] | None = None,
                    reliable_max_tail_share: float = RELIABLE_MAX_TAIL_SHARE) -> BootstrapResult:
    """Return per-edge CIs, SEs and interval-inverting p-values of the mean of S [N, E].

    Estimand: the mean effect over the task's prompt distribution. `method` gives
    `confidence_interval` and `pvalue` (default None: the symmetric studentized bootstrap,
    chosen by simulated coverage; for cluster plans the wild cluster bootstrap-t with CR2 standard
    errors and G - 1 df, circuitstat.stats.intervals.wild); `methods` adds more interval types. The
    estimate is the plain mean for every plan; for cluster/Poisson plans the resampled mean is the weighted mean
    sum(w s) / sum(w).
    The interval is computed in edge chunks (one or, for the studentized bootstrap, three
    matrix products per chunk).
    """
    S = check_score_matrix(S)
    n_obs, n_edges = S.shape
    plan = plan_for(n_obs, plan, n_resamples, seed)
    if plan.n_obs != n_obs:
        check_score_matrix(S, plan)  # raises with the fix named
    if n_obs < 2:
        raise ValueError("the bootstrap needs at least 2 examples (N >= 2)")
    method_reason = "as asked"
    if method is None:
        method = CLUSTER_DEFAULT_METHOD if plan.kind == "cluster" else DEFAULT_METHOD
        method_reason = (cluster_reason(plan) if plan.kind == "cluster" and plan.wild is not None
                         else "the default for a cluster bootstrap" if plan.kind == "cluster"
                         else "the default, chosen by simulated coverage")
    if not 0.0 <= reliable_max_tail_share <= 1.0:
        raise ValueError(f"reliable_max_tail_share is a share of the total deviation and must "
                         f"lie in [0, 1], got {reliable_max_tail_share}")
    todo = check_methods(method, methods, EDGE_METHODS)
    alpha = tail_levels(confidence_level, alternative)
    check_plan_for_methods(plan, todo, confidence_level)
    b = plan.n_resamples
    if keep_distribution and 8 * n_edges * b > max(max_bytes, 4 * 2**30):
        raise MemoryError(
            f"keeping the [E={n_edges}, B={b}] bootstrap distribution needs "
            f"{8 * n_edges * b / 2**30:.2f} GiB; pass fewer edges (S[:, subset]) or raise max_bytes"
        )
    reduce = _EdgeChunk.for_plan(plan, todo, alpha, alternative, keep_distribution)
    if reduce.weights is not None and chunk_size is None:
        # t*, |t*| and the centred and squared resampled sums: about three times the
        # per-edge workspace default_chunk_size budgets for
        chunk_size = default_chunk_size(n_obs, b, resolve_jobs(n_jobs), max_bytes // 3)
    elif reduce.wild is not None and chunk_size is None:
        # t* and its sorted copy have one column per wild weight row (up to 7,776 when G <= 5 are enumerated)
        chunk_size = default_chunk_size(n_obs, max(b, reduce.wild.shape[0]), resolve_jobs(n_jobs), max_bytes)
    parts = list(map_edge_chunks(S, plan, reduce, chunk_size=chunk_size, n_jobs=n_jobs,
                                 max_bytes=max_bytes, check=False))
    params = {"estimator": "bootstrap_edges", "statistic": "mean", "estimand": ESTIMAND,
              "plan": plan.describe(), "method": method, "methods": todo,
              "confidence_level": confidence_level, "alternative": alternative,
              "n_obs": n_obs, "n_edges": n_edges,
              "method_reason": method_reason,
              "pvalue": f"inverts the {method} interval; qvalue = Benjamini-Hochberg",
              "pvalue_floor": pvalue_floor(method, b if plan.wild is None else plan.wild.shape[0]),
              "reliable_max_tail_share": reliable_max_tail_share}
    return _edge_result(parts, reduce, method, confidence_level, b, edge_names, params, reliable_max_tail_share)


def pvalue_floor(method: str, n_resamples: int) -> float:
    """The smallest p-value ``method``'s interval-inverting p-value can take: 1/(B+1) for a resampling one
    (circuitstat.stats.intervals.pvalues never reports less; B the wild weight rows for 'wild_cluster_t'), 0 for
    the analytic t and CR2 t."""
    return 0.0 if method in ("t", "cr2_t") else 1.0 / (int(n_resamples) + 1.0)


def cluster_reason(plan: ResamplingPlan) -> str:
    """Why a cluster plan's default interval is the wild cluster bootstrap-t, with what its G groups allow."""
    g = int(plan.wild.shape[1])
    fam = weight_family(g)
    distinct = (6 if fam.startswith("Webb") else 2) ** g
    exact = plan.wild.shape[0] == distinct
    few = (f" With G = {g} templates only {distinct:,} distinct weight patterns exist"
           + (" (all enumerated: the bootstrap distribution is exact)" if exact else "")
           + f", and the interval cannot be narrower than +-t({g - 1} df) x SE: G templates allow no less."
           if g <= 5 else "")
    # measured (docs/calibration.md, bench/cluster_coverage.py): 0.97-0.98 on the planted model's lighter tails
    few += (" With so few templates it can be conservative where scores are light-tailed (coverage up to 0.98 "
            "measured for a 95% interval)." if g <= 8 else "")
    return (f"the default for a cluster bootstrap: the templates (G = {g}), not the prompts, are the independent "
            f"units, so the interval studentizes with the CR2 cluster-robust SE and refers it to a wild cluster "
            f"bootstrap-t ({fam} weights, {plan.wild.shape[0]:,} weight vectors) and to Student t with G - 1 = {g - 1} df, "
            "whichever is wider (Cameron, Gelbach and Miller 2008; MacKinnon and Webb 2017). Trust it over an "
            "example bootstrap, whose SE treats prompts of one template as independent, and over a percentile or "
            "BCa cluster bootstrap, which under-cover with few templates." + few)


@dataclass
class _EdgeChunk:
    """The per-chunk reduction of bootstrap_edges: map_edge_chunks calls it with each chunk's resampled means."""

    todo: list[str]  # interval methods, primary first
    alpha: float  # tail level of each bound
    alternative: str
    keep_distribution: bool
    n_obs: int
    totals: np.ndarray  # the plan's resample sizes
    cluster_info: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # (order, starts, sizes) of clusters, for BCa
    weights: np.ndarray | None  # the plan's weights, for the studentized bootstrap
    clusters: ClusterSums | None = None  # the plan's groups, for the CR2 methods
    wild: np.ndarray | None = None  # the plan's wild weights [B_w, G], for wild_cluster_t

    @classmethod
    def for_plan(cls, plan: ResamplingPlan, todo: list[str], alpha: float, alternative: str,
                 keep_distribution: bool) -> _EdgeChunk:
        """Return the reduction for `plan` and the methods `todo` (cluster layout and weights as they need)."""
        n_obs = plan.n_obs
        cluster_info = None
        if "bca" in todo and plan.kind == "cluster":
            order = np.argsort(plan.groups, kind="stable")
            starts = np.flatnonzero(np.r_[True, np.diff(plan.groups[order]) != 0])
            sizes = np.diff(np.r_[starts, n_obs]).astype(np.float64)
            cluster_info = (order, starts, sizes)
        weights = plan_weights(plan) if set(todo) & set(STUDENTIZED) else None
        clusters = ClusterSums(plan.groups) if set(todo) & set(CLUSTER_METHODS) else None
        wild = plan.wild if set(todo) & set(WILD_METHODS) else None
        return cls(todo, alpha, alternative, keep_distribution, n_obs, plan.totals, cluster_info, weights,
                   clusters, wild)

    def __call__(self, r: np.ndarray, sc: np.ndarray, sl: slice) -> dict[str, Any]:
        """Return the chunk's estimates, SEs, tail shares, BCa pieces, intervals and p-values (r [c, B], sc [c, N])."""
        todo, n_obs = self.todo, self.n_obs
        theta = sc.mean(axis=1)  # sc is [c, N]
        out: dict[str, Any] = {"theta": theta, "se": r.std(axis=1, ddof=1),
                               "boot_mean": r.mean(axis=1), "tail": tail_share(sc, axis=1)}
        if self.keep_distribution:
            out["dist"] = r.copy()
        se = sc.std(axis=1, ddof=1) / np.sqrt(n_obs) if set(todo) & set(IID_METHODS) else None
        ts = abs_ts = None
        if set(todo) & set(STUDENTIZED):
            ts = studentized_resamples(sc, theta, self.weights, self.totals)
            if "studentized_symmetric" in todo:
                abs_ts = np.sort(np.abs(ts), axis=1)
            ts.sort(axis=1)
        accel = None
        if "bca" in todo:
            out["frac"] = frac_below(r, theta)
            if self.cluster_info is None:
                accel = mean_acceleration(sc, axis=1)
            else:
                # leave-one-cluster-out means: templates are the independent units
                order, starts, sizes = self.cluster_info
                gsum = np.add.reduceat(sc[:, order], starts, axis=1)  # [c, G]
                jack = (sc.sum(axis=1)[:, None] - gsum) / (n_obs - sizes)[None, :]
                accel = acceleration_from_jackknife(jack)
            out["accel"] = accel
        df = float(n_obs - 1)
        r.sort(axis=1)
        plain = [m for m in todo if m not in CLUSTER_METHODS]
        out["ci"] = intervals_sorted(r, theta, out.get("frac"), accel, plain, self.alpha, self.alternative,
                                      ts=ts, abs_ts=abs_ts, se=se, df=df)
        out["p"] = {m: pvalues_sorted(m, r, theta, 0.0, out.get("frac"), accel, self.alternative,
                                       ts=ts, abs_ts=abs_ts, se=se, df=df) for m in plain}
        if self.clusters is not None:
            self._cluster_methods(out, sc, theta)
        return out

    def _cluster_methods(self, out: dict[str, Any], sc: np.ndarray, theta: np.ndarray) -> None:
        """Add the CR2-studentized methods' intervals and p-values to a chunk's `out` (and the CR2 SE as `se`
        when one of them is the primary method: the SE the interval uses)."""
        cs = self.clusters
        U = cs.residual_sums(sc)
        se = cr2_se(U, cs)
        abs_wild = (np.sort(np.abs(wild_t(U, cs, self.wild)), axis=1) if "wild_cluster_t" in self.todo
                    else None)
        todo = [m for m in self.todo if m in CLUSTER_METHODS and m != "wcr"]
        out["ci"].update(cluster_intervals(theta, se, abs_wild, cs.n_groups, todo, self.alpha, self.alternative))
        out["p"].update({m: cluster_pvalues(m, theta, se, abs_wild, cs.n_groups, self.alternative) for m in todo})
        if "wcr" in self.todo:
            out["ci"]["wcr"], out["p"]["wcr"] = wcr_interval(U, cs, self.wild, theta, self.alpha, self.alternative)
        if self.todo[0] in CLUSTER_METHODS:
            out["se"] = se


def _edge_result(parts: list[dict[str, Any]], reduce: _EdgeChunk, method: str, confidence_level: float,
                 n_resamples: int, edge_names: Sequence[str] | None, params: dict[str, Any],
                 reliable_max_tail_share: float) -> BootstrapResult:
    """Return the BootstrapResult of the chunks' reductions, concatenated in edge order."""
    todo = reduce.todo

    def cat(key: str) -> np.ndarray:
        return np.concatenate([p[key] for p in parts])

    theta = cat("theta")
    intervals = {m: ConfidenceInterval(np.concatenate([p["ci"][m][0] for p in parts]),
                                       np.concatenate([p["ci"][m][1] for p in parts]))
                 for m in todo}
    pvalues = {m: np.concatenate([p["p"][m] for p in parts]) for m in todo}
    tail = cat("tail")
    return BootstrapResult(
        estimate=theta, confidence_interval=intervals[method], standard_error=cat("se"),
        bias=cat("boot_mean") - theta, pvalue=pvalues[method], intervals=intervals,
        method=method, confidence_level=confidence_level, alternative=reduce.alternative,
        n_obs=reduce.n_obs, n_resamples=n_resamples,
        z0=ndtri(cat("frac")) if "bca" in todo else None,
        acceleration=cat("accel") if "bca" in todo else None,
        bootstrap_distribution=cat("dist") if reduce.keep_distribution else None,
        edge_names=edge_names, params=params, pvalues=pvalues, qvalue=bh_adjust(pvalues[method]),
        tail_share=tail, reliable=tail <= reliable_max_tail_share)
