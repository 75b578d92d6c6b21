"""Claims of the head-stability study tested from intervals and p-values (Bali et al. 2026).

Array code only: per condition, bootstrap replicates and point estimates of the layer
statistics, leave-one-seed-out values where the study has them, and the deep-layer
correlations go in; the summary table (value, unadjusted interval, p-value, Holm-adjusted
p-value and verdict per claim row) comes out. The study's training and fitting are in
circuitstat.pipelines.runs.heads.study, which states the claims; moved from there unchanged in its numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .head_stability import bootstrap_z_summary, fisher_interval, fisher_pvalue, jackknife_summary, pooled_fisher_z
from .intervals import RESOLUTION
from .testing import holm_verdicts, t_pvalue, z_pvalue

__all__ = ["StudyDesign", "ClaimRows", "ClaimSources", "claims_table", "layer_points", "paired_mean", "difference",
           "BOOTSTRAP_INTERVAL", "JACKKNIFE_INTERVAL", "FISHER_INTERVAL"]


@dataclass(frozen=True)
class StudyDesign:
    """The study's grid: condition name -> number of layers, the depths, the (optimizer, weight decay)
    pairs and how a (depth, optimizer, weight decay) cell is named."""

    conditions: dict[str, int]
    depths: tuple[int, ...]
    optimizers: tuple[tuple[str, float], ...]
    name_of: Callable[[int, str, float], str]


def claims_table(design: StudyDesign, reps: dict[str, dict[str, np.ndarray]], points: dict[str, dict[str, float]],
                 corr: dict[str, dict[str, float]], refit: dict[str, dict[str, tuple]] | None = None
                 ) -> dict[str, np.ndarray]:
    """Return the summary table testing the claims, verdicts Holm-adjusted over all directional rows.

    ``reps[cond][statistic]``: bootstrap replicates (paired across conditions); ``points[cond]``:
    point estimates of the same statistics; ``corr[cond]``: the deep-layer correlation (r, n_eff);
    ``refit[cond][statistic]``: (estimate, leave-one-refit-out values), refits in seed order. With
    ``refit``, claims about mean, gap, ends-minus-middle, residual and excess use the jackknife
    over seeds (the seed distribution, every refit an anchor), paired by seed across conditions;
    without it, the bootstrap replicates. The ``interval`` column says which.
    """
    rows = ClaimRows()
    source = ClaimSources(reps, points, refit)
    conds = dict(design.conditions)
    _claim_layers(rows, source, design, conds)
    _claim_correlation(rows, conds, corr)
    _claim_optimizer(rows, source, design)
    _claim_residual_and_null(rows, source, conds)
    return rows.table()


BOOTSTRAP_INTERVAL = "bootstrap percentile (prompts and the anchor's comparison refits; anchor fixed)"
JACKKNIFE_INTERVAL = "jackknife over training seeds, every refit an anchor (t, K-1 df; paired by seed across conditions)"
FISHER_INTERVAL = "Fisher z"


class ClaimRows:
    """Rows of the study's summary; p-values are adjusted together (Holm) at the end."""

    def __init__(self, confidence_level: float = 0.95):
        self.rows: list[dict] = []
        self.level = confidence_level

    def add(self, item, value, low, high, pvalue, direction, interval):
        self.rows.append({"item": item, "value": float(value), "ci_low": float(low), "ci_high": float(high),
                          "pvalue": float(pvalue) if direction else math.nan, "direction": direction,
                          "interval": interval})

    def bootstrap(self, item, value, replicates, direction=0):
        """A row whose interval is the bootstrap percentile and whose p-value is z with the bootstrap SE."""
        low, high, se = bootstrap_z_summary(replicates, self.level)
        self.add(item, value, low, high, float(z_pvalue(np.asarray(value), np.asarray(se))), direction,
                 BOOTSTRAP_INTERVAL)

    def jackknife(self, item, estimate, leave_one_out, direction=0):
        """A row whose interval and p-value are the jackknife over refits (t on K − 1 df)."""
        low, high, se = jackknife_summary(estimate, leave_one_out, self.level)
        self.add(item, estimate, low, high, t_pvalue(estimate, se, len(leave_one_out) - 1), direction,
                 JACKKNIFE_INTERVAL)

    def table(self, alpha: float = 0.05) -> dict[str, np.ndarray]:
        """Return the summary columns with Holm-adjusted p-values and verdicts over every directional row."""
        values = np.array([r["value"] for r in self.rows], dtype=float)
        directions = np.array([r["direction"] or 0 for r in self.rows])
        lows, highs = (np.array([r[c] for r in self.rows], dtype=float) for c in ("ci_low", "ci_high"))
        # stabilities and their differences are bounded by 1: one at the precision the summary prints is negligible
        verdicts, adjusted = holm_verdicts(values, np.array([r["pvalue"] for r in self.rows]), directions, alpha,
                                           lows=lows, highs=highs, resolution=RESOLUTION)
        family = f"Holm over the {int((directions != 0).sum())} directional rows of this table, family-wise alpha {alpha:g}"
        return {"item": np.array([r["item"] for r in self.rows]), "value": values,
                "ci_low": lows, "ci_high": highs, "verdict": verdicts,
                "pvalue": np.array([r["pvalue"] for r in self.rows], dtype=float), "pvalue_holm": adjusted,
                "interval": np.array([r["interval"] for r in self.rows]),
                "multiplicity": np.array([family if d else "" for d in directions])}


def paired_mean(items: list[tuple[float, np.ndarray]]) -> tuple[float, np.ndarray]:
    """Return the mean of (estimate, replicates) pairs, replicates paired and cut to the shortest."""
    m = min(len(v[1]) for v in items)
    return float(np.mean([v[0] for v in items])), np.mean([v[1][:m] for v in items], axis=0)


def difference(a: tuple[float, np.ndarray], b: tuple[float, np.ndarray]) -> tuple[float, np.ndarray]:
    """Return (estimate, replicates) of a − b, replicates paired and cut to the shorter."""
    m = min(len(a[1]), len(b[1]))
    return a[0] - b[0], a[1][:m] - b[1][:m]


class ClaimSources:
    """Where a claim's statistic comes from: the jackknife over seeds when the study has it, else the bootstrap."""

    def __init__(self, reps: dict, points: dict, refit: dict | None):
        self.reps, self.points, self.refit = reps, points, refit
        self.over_seeds: dict[str, bool] = {}

    def use(self, stat: str, conds: list[str]) -> "ClaimSources":
        """Decide once per claim: the jackknife when every condition in ``conds`` has refit-level ``stat``."""
        self.over_seeds[stat] = bool(conds) and self.refit is not None and all(stat in self.refit[n] for n in conds)
        return self

    def get(self, cond: str, stat: str) -> tuple[float, np.ndarray]:
        """Return (estimate, replicates): leave-one-seed-out values, or bootstrap replicates."""
        if self.over_seeds.get(stat, False):
            return self.refit[cond][stat]
        return self.points[cond][stat], self.reps[cond][stat]

    def add(self, rows: "ClaimRows", stat: str, item: str, value_reps: tuple[float, np.ndarray], direction: int = 0):
        """Add a row with the interval that matches where ``stat`` came from."""
        (rows.jackknife if self.over_seeds.get(stat, False) else rows.bootstrap)(item, *value_reps, direction)


def _claim_layers(rows: ClaimRows, source: ClaimSources, design: StudyDesign, conds: dict) -> None:
    """Claims 1 (middle layers least stable) and 2 (the gap grows with depth)."""
    deep_enough = [n for n, r in conds.items() if r >= 3]
    source.use("ends_minus_middle", deep_enough).use("gap", list(conds)).use("gap_excess", [])
    for n in deep_enough:
        source.add(rows, "ends_minus_middle", f"1. ends minus middle layer stability [{n}]",
                   source.get(n, "ends_minus_middle"), +1)
    item = "1. least stable layers are in the middle (ends minus middle, mean over conditions)"
    if deep_enough:
        source.add(rows, "ends_minus_middle", item,
                   paired_mean([source.get(n, "ends_minus_middle") for n in deep_enough]), +1)
    else:
        rows.add(item, math.nan, math.nan, math.nan, math.nan, +1, BOOTSTRAP_INTERVAL)
    dmin, dmax = min(design.depths), max(design.depths)
    gap_pairs = []
    for opt, wd in design.optimizers:
        a, b = design.name_of(dmax, opt, wd), design.name_of(dmin, opt, wd)
        for d in design.depths:
            n = design.name_of(d, opt, wd)
            source.add(rows, "gap", f"2. gap [{n}]", source.get(n, "gap"))
        source.add(rows, "gap", f"2. gap L{dmax} minus gap L{dmin} [{opt}]",
                   difference(source.get(a, "gap"), source.get(b, "gap")), +1)
        gap_pairs.append((a, b))
    source.add(rows, "gap", f"2. the gap grows with depth (gap L{dmax} minus L{dmin}, mean over optimizers)",
               paired_mean([difference(source.get(a, "gap"), source.get(b, "gap")) for a, b in gap_pairs]), +1)
    # robustness: a max - min over more layers grows with L by itself; the excess gap removes that
    if all("gap_excess" in source.reps[n] and "gap_excess" in source.points[n] for p in gap_pairs for n in p):
        source.add(rows, "gap_excess",
                   f"2b. robustness: excess gap over layer-shuffled heads, L{dmax} minus L{dmin}, mean over optimizers",
                   paired_mean([difference(source.get(a, "gap_excess"), source.get(b, "gap_excess"))
                                 for a, b in gap_pairs]), +1)


def _claim_correlation(rows: ClaimRows, conds: dict, corr: dict) -> None:
    """Claim 3: less stable deep heads are more important (negative correlation, Fisher z pooled)."""
    deep_conds = [n for n, r in conds.items() if r >= 4] or list(conds)
    for n in deep_conds:
        r, n_eff = corr[n]["r"], corr[n]["n_eff"]
        low, high = fisher_interval(r, n_eff)
        rows.add(f"3. correlation of stability and importance, deep layers [{n}]", r, low, high,
                 fisher_pvalue(r, n_eff), -1, FISHER_INTERVAL)
    r, low, high, pvalue = pooled_fisher_z(np.array([corr[n]["r"] for n in deep_conds]),
                                           np.array([corr[n]["n_eff"] for n in deep_conds]))
    rows.add("3. less stable deep heads are more important (pooled Fisher z over conditions)", r, low, high, pvalue,
             -1, FISHER_INTERVAL)


def _claim_optimizer(rows: ClaimRows, source: ClaimSources, design: StudyDesign) -> None:
    """Claim 4: AdamW raises stability (and, over seeds, its excess over the null)."""
    if not {"adam", "adamw"} <= {o for o, _ in design.optimizers}:
        return
    source.use("mean", list(source.points)).use("excess_mean", list(source.points))
    wd = dict(design.optimizers)
    pairs = [(d, design.name_of(d, "adamw", wd["adamw"]), design.name_of(d, "adam", wd["adam"])) for d in design.depths]
    diffs = []
    for d, a, b in pairs:
        diffs.append(difference(source.get(a, "mean"), source.get(b, "mean")))
        source.add(rows, "mean", f"4. mean stability AdamW minus Adam [L{d}]", diffs[-1], +1)
    source.add(rows, "mean", "4. AdamW raises stability (AdamW minus Adam, mean over depths)", paired_mean(diffs), +1)
    if source.over_seeds["excess_mean"]:
        source.add(rows, "excess_mean",
                   "4b. AdamW raises excess stability over the null (AdamW minus Adam, mean over depths)",
                   paired_mean([difference(source.get(a, "excess_mean"), source.get(b, "excess_mean"))
                                 for _, a, b in pairs]), +1)


def _claim_residual_and_null(rows: ClaimRows, source: ClaimSources, conds: dict) -> None:
    """Claims 5 (residual stream more stable than the heads) and 6 (heads more stable than their null)."""
    key = "resid:linear:post"
    source.use(key, list(conds)).use("mean", list(conds)).use("excess_mean", list(conds))
    if source.over_seeds[key] != source.over_seeds["mean"]:  # a difference needs both from one source
        source.over_seeds[key] = source.over_seeds["mean"] = False
    residual = {n: difference(source.get(n, key), source.get(n, "mean")) for n in conds}
    for n in conds:
        source.add(rows, key, f"5. residual linear CKA (post) minus head stability [{n}]", residual[n], +1)
    source.add(rows, key, "5. the residual stream is more stable than the heads (mean over conditions)",
               paired_mean(list(residual.values())), +1)
    if source.over_seeds["excess_mean"]:
        for n in conds:
            source.add(rows, "excess_mean", f"6. mean head stability minus its shuffled-prompt null [{n}]",
                       source.get(n, "excess_mean"), +1)
        source.add(rows, "excess_mean", "6. heads are more stable than their null (excess, mean over conditions)",
                   paired_mean([source.get(n, "excess_mean") for n in conds]), +1)


def layer_points(res) -> dict[str, float]:
    """Return a condition's point estimates: mean, gap, least stable layer (index and relative
    position), ends minus middle, and the mean residual CKA per kind and hook.

    ``res`` has ``layer_stability`` [L] and ``residual`` (columns kind, hook, cka)."""
    s = res.layer_stability
    L = s.size
    out = {"mean": float(np.nanmean(s)), "gap": float(np.nanmax(s) - np.nanmin(s)),
           "argmin": float(np.nanargmin(s)), "argmin_rel": float(np.nanargmin(s)) / (L - 1) if L > 1 else math.nan,
           "ends_minus_middle": float((s[0] + s[-1]) / 2 - np.mean(s[1:-1])) if L >= 3 else math.nan}
    r = res.residual
    for kind in set(r["kind"]):
        for hook in set(r["hook"]):
            m = (r["kind"] == kind) & (r["hook"] == hook)
            out[f"resid:{kind}:{hook}"] = float(np.mean(r["cka"][m]))
    return out
