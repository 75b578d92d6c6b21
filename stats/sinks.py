"""Attention sinks: per-head sink rate, output norm, their relation across heads, and confidence.

Inputs are the read-outs of ``circuitstat.circuits.contributions.sink_readouts``: per prompt n, head u (layers
x heads flattened) and query position i, the attention a[n, u, i] to the prompt's sink token and
the norm r[n, u, i] of the head's output; ``positions`` marks the query positions that count
(real tokens after the sink token).

* **Sink rate** of a head (after Gu et al. 2024, "When attention sink emerges"): the share of
  counted query positions whose attention to the sink token exceeds ``threshold`` (default 0.3),
  per prompt, then its mean over prompts. Estimand: that share over the prompt distribution;
  interval: ``circuitstat.stats.intervals.bootstrap_edges`` over prompts (calibrated default).
* **Output norm** of a head: the mean over counted positions of ||o_i||, per prompt, then the mean
  over prompts (same interval).
* **Relation across heads**: the least-squares quadratic norm = b0 + b1 s + b2 s^2 over the heads'
  (sink rate, output norm) means. The paper (Cunningham & Muca Cirone 2026) reports a convex
  relation; the curvature b2 gets a BCa interval from the bootstrap over prompts (heads fixed;
  acceleration from the leave-one-prompt-out jackknife; simulated coverage 0.947 at 95%, 300 datasets
  of N = 48 prompts, 8 heads: tests/stats/test_sinks.py). Spearman's rho of the same head means is
  the nonparametric check (interval: percentile bootstrap over prompts). Verdicts: "convex" when
  the curvature interval lies above 0, "concave" below, else "inconclusive"; "increasing" /
  "decreasing" / "inconclusive" from rho's interval. Two verdicts, each from its own marginal
  interval (no multiplicity adjustment; the rule is in the table).
* **Confidence**: per prompt and head, the mean sink attention at the positions whose top
  next-token probability is at or below the prompt's median minus at those above it (0 when every
  position ties at the median); positive = the head sinks more where the model is unsure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy import stats as sps

from circuitstat.core.results import Result
from circuitstat.core.params import N_RESAMPLES

from .intervals import (BootstrapResult, acceleration_from_jackknife, bootstrap_edges,
                        interval_text, interval_verdict, intervals_from_distribution)
from .resampling import ResamplingPlan, resampled_means

__all__ = ["sink_shares", "position_means", "quadratic_fit", "confidence_gap", "SinkResult", "sink_relation",
           "sink_stability", "DEFAULT_THRESHOLD", "ESTIMANDS", "ESTIMAND_SINK_STABILITY"]

#: attention to the sink token above which a query position counts as sinking (Gu et al. 2024 use 0.3)
DEFAULT_THRESHOLD = 0.3

ESTIMANDS = {
    "sink_rate": "share of query positions attending to the sink token above the threshold, mean over the prompt "
                 "distribution",
    "output_norm": "mean norm of the head's output over query positions, mean over the prompt distribution",
    "curvature": "curvature b2 of the least-squares quadratic of head output norm on head sink rate (head means "
                 "over the prompt distribution); prompts resampled, heads fixed",
    "spearman": "Spearman rho between head sink rate and head output norm (head means over the prompt "
                "distribution); prompts resampled, heads fixed",
    "confidence_gap": "mean sink attention at low-confidence minus high-confidence positions, mean over the prompt "
                      "distribution",
}


def _input_error(msg: str) -> Exception:
    from circuitstat.core.errors import InputError

    return InputError(msg)


def _counted(positions: np.ndarray, n_units_shape: tuple[int, ...]) -> np.ndarray:
    """Return ``positions`` [N, P] as bool after checking every prompt has a counted position."""
    pos = np.asarray(positions, dtype=bool)
    if pos.ndim != 2 or pos.shape[0] != n_units_shape[0] or pos.shape[1] != n_units_shape[-1]:
        raise _input_error(f"positions must be [N, P] = [{n_units_shape[0]}, {n_units_shape[-1]}], got {pos.shape}")
    if not pos.any(axis=1).all():
        raise _input_error("some prompts have no query position after the sink token; use prompts of 2 or more tokens")
    return pos


def position_means(values: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Return the mean of ``values`` [N, U, P] over each prompt's counted positions: [N, U]."""
    v = np.asarray(values, dtype=np.float64)
    pos = _counted(positions, v.shape)
    w = pos[:, None, :].astype(np.float64)
    return (v * w).sum(-1) / w.sum(-1)


def sink_shares(sink_attention: np.ndarray, positions: np.ndarray, threshold: float = DEFAULT_THRESHOLD) -> np.ndarray:
    """Return [N, U] per prompt and head the share of counted positions with sink attention > ``threshold``."""
    if not 0.0 <= float(threshold) < 1.0:
        raise _input_error(f"the sink threshold is an attention weight in [0, 1), got {threshold}")
    return position_means(np.asarray(sink_attention) > threshold, positions)


def quadratic_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Return least-squares (b0, b1, b2) of y = b0 + b1 x + b2 x^2 over the last axis: [..., 3] (NaN if singular)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    X = np.stack([np.ones_like(x), x, x * x], axis=-1)  # [..., U, 3]
    XtX = np.swapaxes(X, -1, -2) @ X
    Xty = (np.swapaxes(X, -1, -2) @ y[..., None])[..., 0]
    out = np.full(Xty.shape, np.nan)
    # fewer than three distinct x values cannot fix a quadratic: NaN rather than an arbitrary solution
    distinct = np.sort(x, axis=-1)
    n_distinct = 1 + (np.diff(distinct, axis=-1) > 1e-12 * np.maximum(1.0, np.abs(distinct[..., 1:]))).sum(-1)
    ok = n_distinct >= 3
    if ok.any():
        out[ok] = np.linalg.solve(XtX[ok], Xty[ok][..., None])[..., 0]
    return out


def _spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Return Spearman's rho over the last axis (NaN where either side is constant)."""
    rx, ry = sps.rankdata(x, axis=-1), sps.rankdata(y, axis=-1)
    rx = rx - rx.mean(-1, keepdims=True)
    ry = ry - ry.mean(-1, keepdims=True)
    den = np.sqrt((rx * rx).sum(-1) * (ry * ry).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (rx * ry).sum(-1) / np.where(den > 0, den, 1.0), np.nan)


def confidence_gap(sink_attention: np.ndarray, confidence: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Return [N, U] mean sink attention at positions with confidence <= the prompt's median minus above it."""
    a = np.asarray(sink_attention, dtype=np.float64)
    pos = _counted(positions, a.shape)
    conf = np.where(pos, np.asarray(confidence, dtype=np.float64), np.nan)
    median = np.nanmedian(conf, axis=1, keepdims=True)
    low = (pos & (conf <= median))[:, None, :].astype(np.float64)
    high = (pos & (conf > median))[:, None, :].astype(np.float64)
    n_high = high.sum(-1)
    mean_low = (a * low).sum(-1) / low.sum(-1)
    mean_high = (a * high).sum(-1) / np.where(n_high > 0, n_high, 1.0)
    return np.where(n_high > 0, mean_low - mean_high, 0.0)


@dataclass(repr=False)
class SinkResult(Result):
    """Per-head sink rates, output norms, confidence gaps and the fitted relation.

    Tables ``sink_heads`` and ``sink_fit``.
    """

    head_names: list[str]
    threshold: float
    sink_rate: BootstrapResult
    output_norm: BootstrapResult
    gap: BootstrapResult | None
    fit: dict[str, dict[str, Any]]
    params: dict = field(default_factory=dict)
    main_table = "sink_heads"

    def _tables(self) -> dict[str, dict[str, Any]]:
        U = len(self.head_names)
        layer = np.array([int(n.split(".")[0][1:]) for n in self.head_names], dtype=np.int64)
        head = np.array([int(n.split(".h")[1]) for n in self.head_names], dtype=np.int64)
        s, r = self.sink_rate, self.output_norm
        heads: dict[str, Any] = {
            "layer": layer, "head": head, "node": np.array(self.head_names, dtype=str),
            "sink_rate": s.estimate, "ci_low": s.confidence_interval.low, "ci_high": s.confidence_interval.high,
            "output_norm": r.estimate, "norm_ci_low": r.confidence_interval.low,
            "norm_ci_high": r.confidence_interval.high,
            "confidence_gap": self.gap.estimate if self.gap is not None else np.full(U, np.nan),
            "gap_ci_low": self.gap.confidence_interval.low if self.gap is not None else np.full(U, np.nan),
            "gap_ci_high": self.gap.confidence_interval.high if self.gap is not None else np.full(U, np.nan),
            "threshold": np.full(U, self.threshold), "n": np.full(U, s.n_obs, dtype=np.int64),
            "interval_reliable": s.reliable}
        terms = list(self.fit)
        fit = {"term": np.array(terms, dtype=str)}
        for col in ("estimate", "ci_low", "ci_high"):
            fit[col] = np.array([self.fit[t][col] for t in terms], dtype=np.float64)
        for col in ("interval", "verdict", "estimand", "multiplicity"):
            fit[col] = np.array([self.fit[t][col] for t in terms], dtype=str)
        return {"sink_heads": heads, "sink_fit": fit}

    def _summary_items(self) -> list[tuple[str, Any]]:
        items: list[tuple[str, Any]] = [("prompts (N)", self.sink_rate.n_obs), ("heads", len(self.head_names)),
                                        ("threshold", self.threshold)]
        order = np.argsort(-self.sink_rate.estimate)
        for i in order[:5]:
            ci = self.sink_rate.confidence_interval
            items.append((f"sink rate {self.head_names[i]}", interval_text(self.sink_rate.estimate[i], ci.low[i],
                                                                           ci.high[i], missing="too few prompts")))
        for term, row in self.fit.items():
            text = interval_text(row["estimate"], row["ci_low"], row["ci_high"], digits=4, missing="too few heads")
            items.append((term, f"{text} {row['verdict']}".rstrip()))
        return items


def _head_level(share: np.ndarray, norm: np.ndarray, plan: ResamplingPlan) -> tuple[np.ndarray, np.ndarray]:
    """Return resampled head means of share and norm, each [B, U] (one matrix product per quantity)."""
    return resampled_means(share, plan).T, resampled_means(norm, plan).T


def sink_relation(share: np.ndarray, norm: np.ndarray, head_names: Sequence[str], *,
                  gap: np.ndarray | None = None, threshold: float = DEFAULT_THRESHOLD,
                  plan: ResamplingPlan | None = None, n_resamples: int = N_RESAMPLES.default_for("tokens"), seed: Any = None,
                  confidence_level: float = 0.95) -> SinkResult:
    """Return per-head sink rates and output norms with intervals, and the quadratic and Spearman relation.

    ``share`` and ``norm`` are [N, U] per prompt and head (:func:`sink_shares`,
    :func:`position_means`); ``gap`` [N, U] optional confidence gaps (:func:`confidence_gap`).
    """
    share = np.asarray(share, dtype=np.float64)
    norm = np.asarray(norm, dtype=np.float64)
    if share.ndim != 2 or share.shape != norm.shape or share.shape[1] != len(head_names):
        raise _input_error(f"share and norm must both be [N, {len(head_names)} heads], got {share.shape} and "
                           f"{norm.shape}")
    N, U = share.shape
    if N < 2:
        raise _input_error("sink intervals need at least 2 prompts")
    if not (np.isfinite(share).all() and np.isfinite(norm).all()):
        raise _input_error("sink shares or output norms contain NaN or infinite values")
    if plan is None:
        plan = ResamplingPlan.bootstrap(N, n_resamples, seed)
    elif seed is not None:
        raise _input_error("pass either a plan or a seed, not both: the plan already fixes the draw")
    kw = dict(confidence_level=confidence_level)
    rate_res = bootstrap_edges(share, plan, edge_names=list(head_names), **kw)
    norm_res = bootstrap_edges(norm, plan, edge_names=list(head_names), **kw)
    gap_res = None if gap is None else bootstrap_edges(np.asarray(gap, dtype=np.float64), plan, **kw)

    s_hat, r_hat = share.mean(0), norm.mean(0)
    s_b, r_b = _head_level(share, norm, plan)
    # leave-one-prompt-out head means in closed form, for the BCa acceleration
    s_jack = (share.sum(0)[None] - share) / (N - 1)
    r_jack = (norm.sum(0)[None] - norm) / (N - 1)
    fit: dict[str, dict[str, Any]] = {}
    coef_hat, coef_b, coef_jack = quadratic_fit(s_hat, r_hat), quadratic_fit(s_b, r_b), quadratic_fit(s_jack, r_jack)
    rule = "two verdicts (curvature, Spearman), each from its own marginal interval; not adjusted"
    for i, term in enumerate(("intercept", "slope", "curvature")):
        est, reps, jack = coef_hat[i], coef_b[:, i], coef_jack[:, i]
        lo = hi = np.nan
        if np.isfinite(est) and np.isfinite(reps).all() and np.isfinite(jack).all():
            ci = intervals_from_distribution(reps, est, method="bca", confidence_level=confidence_level,
                                             acceleration=acceleration_from_jackknife(jack))["bca"]
            lo, hi = float(ci.low), float(ci.high)
        verdict = interval_verdict(lo, hi, "convex", "concave") if term == "curvature" else ""
        fit[term] = {"estimate": float(est), "ci_low": lo, "ci_high": hi, "interval": "bca over prompts",
                     "verdict": verdict, "estimand": ESTIMANDS["curvature"] if term == "curvature" else
                     "coefficient of the same quadratic", "multiplicity": rule}
    rho_hat, rho_b = _spearman(s_hat, r_hat), _spearman(s_b, r_b)
    lo = hi = np.nan
    finite = rho_b[np.isfinite(rho_b)]
    if np.isfinite(rho_hat) and finite.size == rho_b.size:
        ci = intervals_from_distribution(rho_b, rho_hat, method="percentile", confidence_level=confidence_level)
        lo, hi = float(ci["percentile"].low), float(ci["percentile"].high)
    fit["spearman"] = {"estimate": float(rho_hat), "ci_low": lo, "ci_high": hi, "interval": "percentile over prompts",
                       "verdict": interval_verdict(lo, hi, "increasing", "decreasing"), "estimand": ESTIMANDS["spearman"],
                       "multiplicity": rule}
    params = {"estimator": "sink_relation", "threshold": threshold, "plan": plan.describe(),
              "confidence_level": confidence_level, "n_prompts": N, "n_heads": U, "estimands": ESTIMANDS,
              "multiplicity": rule, "rho_replicates_undefined": int(rho_b.size - finite.size)}
    return SinkResult(list(head_names), float(threshold), rate_res, norm_res, gap_res, fit, params)


# --- stability of sinks across training seeds ------------------------------------------------------------
ESTIMAND_SINK_STABILITY = ("mean over the distribution of training seeds (t interval over the K seeds, K-1 df); heads "
                           "are matched within a layer by rank of sink rate (the one-to-one matching on this scalar)")
ESTIMAND_SEED_RELATION = ("mean over the distribution of training seeds of each seed's fitted value (t interval over "
                          "the K seeds, K-1 df; each seed's prompts fixed)")


def _seed_t_interval(values: np.ndarray, confidence_level: float) -> tuple[float, float, float]:
    """Return (mean, low, high) of a t interval over seeds (NaN ends with fewer than 3 seeds or NaN values)."""
    v = np.asarray(values, dtype=np.float64)
    mean = float(v.mean())
    if v.size < 3 or not np.isfinite(v).all():
        return mean, np.nan, np.nan
    half = sps.t.ppf(0.5 + confidence_level / 2, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size)
    return mean, mean - half, mean + half


def sink_stability(rates: np.ndarray, spearman: np.ndarray, curvature: np.ndarray, *, sink_bar: float = 0.3,
                   confidence_level: float = 0.95) -> dict[str, np.ndarray]:
    """Return the ``sink_stability`` table: are the sink heads and the sink-norm relation the same across seeds?

    ``rates`` [K seeds, L, H] head sink rates; ``spearman`` and ``curvature`` [K] each seed's
    relation. Rows per layer: the sink rate of the layer's r-th strongest sink head (heads matched
    across seeds by rank) and the number of heads with rate >= ``sink_bar``; model rows (layer -1):
    Spearman's rho, the fit's curvature and the share of seeds with positive curvature. Each with a
    t interval over seeds (the share: Clopper-Pearson). Whether the sink heads are the same heads, with heads matched by
    attention pattern and a random-matching null, is ``circuitstat.stats.sink_matching.sink_matching``.
    """
    rates = np.asarray(rates, dtype=np.float64)
    if rates.ndim != 3 or rates.shape[0] < 2:
        raise _input_error(f"rates must be [seeds >= 2, layers, heads], got shape {rates.shape}")
    K, L, H = rates.shape
    ranked = -np.sort(-rates, axis=2)  # [K, L, H], strongest sink first
    rows: dict[str, list] = {c: [] for c in ("layer", "item", "value", "ci_low", "ci_high", "sd", "min", "max",
                                             "n_refits", "estimand")}

    def add(layer: int, item: str, values: np.ndarray, estimand: str = ESTIMAND_SINK_STABILITY) -> None:
        mean, lo, hi = _seed_t_interval(values, confidence_level)
        v = np.asarray(values, dtype=np.float64)
        for col, val in zip(rows, (layer, item, mean, lo, hi, float(v.std(ddof=1)) if v.size > 1 else np.nan,
                                   float(np.nanmin(v)), float(np.nanmax(v)), K, estimand)):
            rows[col].append(val)

    for layer in range(L):
        for r in range(H):
            add(layer, f"rank {r + 1} sink rate", ranked[:, layer, r])
        add(layer, f"heads with sink rate >= {sink_bar:g}", (rates[:, layer] >= sink_bar).sum(-1))
    add(-1, "spearman(sink rate, output norm)", np.asarray(spearman, dtype=np.float64), ESTIMAND_SEED_RELATION)
    # each seed's curvature interval holds its heads fixed; this one spans the spread between seeds
    add(-1, "curvature of the quadratic fit (norm on sink rate)", np.asarray(curvature, dtype=np.float64),
        ESTIMAND_SEED_RELATION)
    convex = np.asarray(curvature) > 0
    add(-1, "share of seeds with convex fit (curvature > 0)", convex.astype(np.float64))
    # a share of K binary outcomes: the exact (Clopper-Pearson) interval, not a t interval
    ci = sps.binomtest(int(convex.sum()), K).proportion_ci(confidence_level, method="exact")
    rows["ci_low"][-1], rows["ci_high"][-1] = float(ci.low), float(ci.high)
    rows["estimand"][-1] = "share of training seeds whose fit is convex (Clopper-Pearson interval over the K seeds)"
    types = {"layer": np.int64, "item": str, "n_refits": np.int64, "estimand": str}
    return {c: np.array(v, dtype=types.get(c, np.float64)) for c, v in rows.items()}
