"""The result of :class:`circuitstat.pipelines.runs.heads.stability.HeadStability` and the tables it is assembled into.

:class:`HeadStabilityResult` holds the column dicts of every table (heads, layers, residual,
head_details, correlation, summary, refits) with their intervals, each labelled with its
estimand (:data:`ESTIMANDS`); the functions below build those tables from the outputs of the
estimator's stages (every statistic in them comes from ``stats``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from circuitstat.stats.head_nulls import residual_minus_head_jackknife
from circuitstat.stats.head_pairs import quiet_nanmean
from circuitstat.stats.head_stability import RefitLevel, comparison_t_interval, percentile_interval
from circuitstat.core.seeds import seed_record
from circuitstat.core.results import Result

if TYPE_CHECKING:
    from circuitstat.circuits.probes import ProbeSet

__all__ = ["ESTIMANDS", "FitContext", "HeadStabilityResult"]


@dataclass
class FitContext:
    """What every stage of one fit shares: models, probe, sizes, seeds and resampling draws."""

    models: list
    probe: ProbeSet
    anchor: int
    n_layers: int
    n_heads: int
    seeds: dict[str, np.random.SeedSequence]
    root: np.random.SeedSequence
    n_resamples: int
    confidence_level: float
    prompt_plan: ResamplingPlan | None
    target_counts: np.ndarray  # [R, K] the anchor's comparison refits drawn
    refit_counts: np.ndarray  # [R, K] all refits drawn
    patterns: list[np.ndarray] = field(default_factory=list)

    @property
    def n_refits(self) -> int:
        """Number of refits (models)."""
        return len(self.models)

    @property
    def targets(self) -> list[int]:
        """The refits compared with the anchor."""
        return [b for b in range(self.n_refits) if b != self.anchor]


ESTIMANDS = {
    "refit_ci": "stability over the distribution of training seeds; layers, residual and summary: every refit an "
                "anchor in turn, jackknife over refits of the all-pairs mean (t, K-1 df); heads: the anchor's head "
                "against a new training seed, t interval over the anchor's K-1 comparison refits",
    "excess_ci": "stability minus its null, same refit-level interval as refit_ci",
    "ci": "bootstrap of prompts (with replacement) and of the anchor's comparison refits, anchor fixed: Monte Carlo "
          "uncertainty of the paper's setting, not an interval for the seed distribution; CKA: half-samples of "
          "prompts without replacement",
}


@dataclass(repr=False)
class HeadStabilityResult(Result):
    """Head/layer stability, importance, residual CKA and their intervals; ``.tables()`` for Parquet.

    Tables: ``heads`` (layer, head, stability, ci_low, ci_high, null_mean, distinctness,
    importance, match, pairs, then excess, refit_ci_low, refit_ci_high, excess_ci_low,
    excess_ci_high, n_refits), ``layers`` (layer, stability, ci_low, ci_high, null_mean, then
    stability_all_anchors, refit_ci_low, refit_ci_high, excess, excess_ci_low, excess_ci_high,
    n_refits), ``residual`` (layer, hook, kind, cka, ci_low, ci_high, then cka_all_pairs,
    refit_ci_low, refit_ci_high, n_refits), ``head_details``, ``correlation``, ``summary`` (item,
    value, ci_low, ci_high, verdict) and ``refits``. Every interval's estimand is in
    ``params['estimands']`` (see :data:`ESTIMANDS`). ``replicates`` keeps the bootstrap
    replicates of the layer-level numbers (same resampling scheme for every result with the same
    ``n_resamples``); ``refit_replicates`` the leave-one-refit-out values (``jackknife:<name>``) and
    estimates (``estimate:<name>``), so results on the same seeds can be compared refit by refit.
    """

    run_kind = "heads"  # the run kind its run directory records (circuitstat.pipelines.kinds)

    n_layers: int
    n_heads: int
    heads: dict
    layers: dict
    residual: dict
    head_details: dict
    correlation: dict
    summary_rows: list
    refits: dict
    replicates: dict
    params: dict = field(default_factory=dict)
    refit_replicates: dict = field(default_factory=dict)
    main_table = "heads"
    #: ``conf_int()``'s default: layer stability over the distribution of training seeds
    primary_interval = "layers.refit_ci"

    @property
    def head_stability(self) -> np.ndarray:
        """Return the [L, H] stability of the anchor's heads."""
        return np.asarray(self.heads["stability"]).reshape(self.n_layers, self.n_heads)

    @property
    def layer_stability(self) -> np.ndarray:
        """Return the [L] layer stability (the ``stability`` column of ``layers``)."""
        return np.asarray(self.layers["stability"])

    @property
    def gap(self) -> float:
        """Return max − min layer stability."""
        s = self.layer_stability
        return float(np.nanmax(s) - np.nanmin(s))

    @property
    def least_stable_layer(self) -> int:
        """Return the index of the least stable layer."""
        return int(np.nanargmin(self.layer_stability))

    def item(self, name: str) -> dict:
        """Return the summary row called ``name``."""
        for row in self.summary_rows:
            if row["item"] == name:
                return row
        raise KeyError(f"no summary item {name!r}; have {[r['item'] for r in self.summary_rows]}")

    def _tables(self) -> dict[str, dict[str, Any]]:
        summary = {k: np.array([r[k] for r in self.summary_rows], dtype=float)
                   for k in ("value", "ci_low", "ci_high")}
        summary = {"item": np.array([str(r["item"]) for r in self.summary_rows]), **summary,
                   "verdict": np.array([str(r["verdict"]) for r in self.summary_rows])}
        return {"heads": self.heads, "layers": self.layers, "residual": self.residual,
                "head_details": self.head_details, "correlation": self.correlation, "summary": summary,
                "refits": self.refits}

    def _summary_items(self) -> list[tuple[str, Any]]:
        items = [("refits", len(self.refits["refit"])), ("layers x heads", f"{self.n_layers} x {self.n_heads}"),
                 ("match / pairs", f"{self.params.get('match')} / {self.params.get('pairs')}")]
        from circuitstat.stats.head_stability import seeds_interval_text

        n_refits = len(self.refits["refit"])
        for r in self.summary_rows:
            # rows without an interval: a plain value (a share, the null) or an across-seed one with too few seeds
            if not np.isfinite(r["ci_low"]) and "refit" not in r["item"]:
                items.append((r["item"], f"{r['value']:.4g}"))
            else:
                items.append((r["item"], seeds_interval_text(r["value"], r["ci_low"], r["ci_high"], n_refits, digits=4)))
        return items

    def table_provenance(self) -> dict:
        """Return the models, probe, seed, method and parameters recorded with every table."""
        return {"models": self.params.get("models", []), "probe": self.params.get("probe", {}),
                "seed": self.params.get("seed"), "method": "head_stability",
                "params": {k: v for k, v in self.params.items() if k not in ("models", "probe")}}

    def run_spec(self) -> dict:
        """Return the spec of a run directory ``write`` creates: the parameters without the models (every
        table's provenance records those)."""
        return {**super().run_spec(), "params": {k: v for k, v in super().run_spec()["params"].items() if k != "models"}}


# =============================================================================================
# Tables of one fit
# =============================================================================================
def summary_rows(ctx: FitContext, derived: tuple[dict, dict], null: dict, refit_level: RefitLevel, shape: dict,
                 importance: dict, residual: dict) -> list[dict]:
    """Return the rows of the ``summary`` table (item, value, ci_low, ci_high, verdict)."""
    rows: list[dict] = []
    level = ctx.confidence_level

    def add(item, value, low=np.nan, high=np.nan):
        rows.append({"item": item, "value": float(value), "ci_low": float(low), "ci_high": float(high),
                     "verdict": ""})

    def add_bootstrap(item, value, replicates, discrete=False):
        add(item, value, *percentile_interval(replicates, level, discrete=discrete))

    layer_point, layer_reps = derived
    add_bootstrap("mean head stability", layer_point["mean"], layer_reps["mean"])
    add("mean null", quiet_nanmean(null["layer"]) if np.isfinite(null["layer"]).any() else np.nan)
    add_bootstrap("gap (max - min layer stability)", layer_point["gap"], layer_reps["gap"])
    add_bootstrap("gap expected with heads shuffled across layers", layer_point["gap_shuffled"],
                  layer_reps["gap_shuffled"])
    add_bootstrap("excess gap (gap minus its shuffled-layers expectation)", layer_point["gap_excess"],
                  layer_reps["gap_excess"])
    add_bootstrap("least stable layer", layer_point["argmin"], layer_reps["argmin"], discrete=True)
    add_bootstrap("least stable layer (relative position)", layer_point["argmin_rel"], layer_reps["argmin_rel"],
                  discrete=True)
    if ctx.n_layers >= 3:
        add_bootstrap("ends minus middle layer stability", layer_point["ends_minus_middle"],
                      layer_reps["ends_minus_middle"])
        add("share of replicates with the least stable layer in the middle", layer_reps["middle_min"].mean())
    add_bootstrap("mean distinctness", quiet_nanmean(shape["distinctness"]),
                  quiet_nanmean(shape["distinctness_reps"].reshape(ctx.n_resamples, -1), axis=1))
    add_bootstrap("mean cross-layer best match", quiet_nanmean(shape["cross_layer"]),
                  quiet_nanmean(shape["cross_layer_reps"], axis=1))
    add("share of heads whose cross-layer best match is in their own layer", shape["same_layer_share"].mean())
    for key, reps in residual["replicates"].items():
        kind, hook = key.split(":")
        mean = np.mean([r["cka"] for r in residual["rows"] if (r["kind"], r["hook"]) == (kind, hook)])
        add_bootstrap(f"mean residual {kind} CKA ({hook})", mean, quiet_nanmean(reps, axis=1))
    rows.extend(refit_summary_rows(ctx, refit_level, residual))
    for row in importance["rows"]:
        if row["scope"] == "deep":
            add("correlation of stability and importance (deep layers)", row["r"], row["ci_low"], row["ci_high"])
    return rows


def refit_summary_rows(ctx: FitContext, refit_level: RefitLevel, residual: dict) -> list[dict]:
    """Return summary rows whose interval is over training seeds (every refit an anchor, jackknife)."""
    tag = f"(every refit an anchor; jackknife over {ctx.n_refits} refits)"
    rows = []
    for name, item in (("mean", "mean head stability"), ("excess_mean", "mean excess stability over the null"),
                       ("gap", "gap (max - min layer stability)"),
                       ("ends_minus_middle", "ends minus middle layer stability")):
        if name in refit_level.estimates:
            low, high = refit_level.intervals[name]
            rows.append({"item": f"{item} {tag}", "value": float(refit_level.estimates[name]),
                         "ci_low": float(low), "ci_high": float(high), "verdict": ""})
    for key, refit in residual["refit"].items():
        kind, hook = key.split(":")
        difference, low, high = residual_minus_head_jackknife(refit["estimate"], refit["leave_one_out"],
                                                              refit_level.estimates["mean"],
                                                              refit_level.leave_one_out["mean"], ctx.confidence_level)
        mean_low, mean_high = refit["mean_interval"]
        rows.append({"item": f"mean residual {kind} CKA ({hook}) {tag}", "value": float(refit["estimate"].mean()),
                     "ci_low": float(mean_low), "ci_high": float(mean_high), "verdict": ""})
        rows.append({"item": f"mean residual {kind} CKA ({hook}) minus mean head stability {tag}",
                     "value": float(difference), "ci_low": float(low), "ci_high": float(high), "verdict": ""})
    return rows


def result_tables(ctx: FitContext, pairs: str, stability: dict, null: dict, refit_level: RefitLevel,
                  matched_pairs: np.ndarray, excess_pairs: np.ndarray | None, shape: dict, importance: dict,
                  residual: dict) -> tuple[dict, ...]:
    """Return the heads, layers, residual, head_details and correlation tables (column dicts)."""
    n_layers, n_heads, level = ctx.n_layers, ctx.n_heads, ctx.confidence_level
    layer_index, head_index = (a.ravel().astype(np.int64) for a in
                               np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij"))
    comparisons = matched_pairs[ctx.anchor, ctx.targets]  # [K-1, L, H]
    _, refit_low, refit_high = comparison_t_interval(comparisons, level)
    nan_heads = np.full((n_layers, n_heads), np.nan)
    excess_low = excess_high = nan_heads
    if excess_pairs is not None:
        _, excess_low, excess_high = comparison_t_interval(excess_pairs[ctx.anchor, ctx.targets], level)
    boot_low, boot_high = percentile_interval(stability["head_reps"], level)
    match_text = [" ".join(f"r{b}:h{int(stability['match_index'][b][layer, head])}" for b in ctx.targets)
                  for layer, head in zip(layer_index, head_index)]
    heads = {"layer": layer_index, "head": head_index, "stability": stability["heads"].ravel(),
             "ci_low": boot_low.ravel(), "ci_high": boot_high.ravel(), "null_mean": null["head"].ravel(),
             "distinctness": shape["distinctness"].ravel(), "importance": importance["value"].ravel(),
             "match": np.array(match_text), "pairs": np.array([pairs] * (n_layers * n_heads)),
             "excess": (stability["heads"] - null["head"]).ravel(), "refit_ci_low": refit_low.ravel(),
             "refit_ci_high": refit_high.ravel(), "excess_ci_low": np.asarray(excess_low).ravel(),
             "excess_ci_high": np.asarray(excess_high).ravel(),
             "n_refits": np.full(n_layers * n_heads, ctx.n_refits, dtype=np.int64)}
    layer_low, layer_high = percentile_interval(stability["layer_reps"], level)
    nan_layers = np.full(n_layers, np.nan)
    excess = refit_level.estimates.get("excess", nan_layers)
    excess_ci = refit_level.intervals.get("excess", (nan_layers, nan_layers))
    layers = {"layer": np.arange(n_layers, dtype=np.int64), "stability": stability["layers"], "ci_low": layer_low,
              "ci_high": layer_high, "null_mean": null["layer"],
              "stability_all_anchors": refit_level.estimates["layer"],
              "refit_ci_low": refit_level.intervals["layer"][0], "refit_ci_high": refit_level.intervals["layer"][1],
              "excess": excess, "excess_ci_low": excess_ci[0], "excess_ci_high": excess_ci[1],
              "n_refits": np.full(n_layers, ctx.n_refits, dtype=np.int64)}
    residual_columns = residual_table(residual["rows"])
    details = details_table(ctx, stability, shape, importance, layer_index, head_index)
    correlation = {"scope": np.array([r["scope"] for r in importance["rows"]], dtype=str),
                   "layer": np.array([r["layer"] for r in importance["rows"]], dtype=np.int64),
                   **{k: np.array([r[k] for r in importance["rows"]], dtype=float)
                      for k in ("r", "ci_low", "ci_high", "pvalue")},
                   **{k: np.array([r[k] for r in importance["rows"]], dtype=np.int64)
                      for k in ("n", "n_eff", "refits")},
                   "method": np.array([r["method"] for r in importance["rows"]], dtype=str)}
    return heads, layers, residual_columns, details, correlation


def residual_table(rows: list[dict]) -> dict:
    """Return the residual table's columns from its rows (typed even when empty)."""
    types = {"layer": np.int64, "hook": str, "kind": str, "cka": float, "ci_low": float, "ci_high": float,
             "cka_all_pairs": float, "refit_ci_low": float, "refit_ci_high": float, "n_refits": np.int64,
             "interval_reliable": bool}
    return {k: np.array([r[k] for r in rows], dtype=t) for k, t in types.items()}


def details_table(ctx: FitContext, stability: dict, shape: dict, importance: dict, layer_index: np.ndarray,
                   head_index: np.ndarray) -> dict:
    """Return the head_details table: one-source intervals, distinctness, importance and cross-layer match."""
    level = ctx.confidence_level
    prompts_low, prompts_high = percentile_interval(stability["only_prompts"], level)
    refits_low, refits_high = percentile_interval(stability["only_refits"], level)
    distinct_low, distinct_high = percentile_interval(shape["distinctness_reps"], level)
    cross_low, cross_high = percentile_interval(shape["cross_layer_reps"], level)
    return {"layer": layer_index, "head": head_index,
            "stability_ci_low_prompts": prompts_low.ravel(), "stability_ci_high_prompts": prompts_high.ravel(),
            "stability_ci_low_refits": refits_low.ravel(), "stability_ci_high_refits": refits_high.ravel(),
            "distinctness_ci_low": distinct_low.ravel(), "distinctness_ci_high": distinct_high.ravel(),
            "importance_ci_low": np.asarray(importance["low"]).ravel(),
            "importance_ci_high": np.asarray(importance["high"]).ravel(),
            "cross_layer_similarity": shape["cross_layer"], "cross_layer_ci_low": cross_low,
            "cross_layer_ci_high": cross_high, "cross_layer_best_layer": shape["modal_layer"].astype(np.int64),
            "cross_layer_same_layer_share": shape["same_layer_share"]}


def refits_table(ctx: FitContext) -> dict:
    """Return the refits table: source, weight hash, training seed and role of every refit."""
    seeds = [getattr(m, "meta", {}).get("training", {}).get("seed") for m in ctx.models]
    return {"refit": np.arange(ctx.n_refits, dtype=np.int64),
            "source": np.array([str(getattr(m, "source", "memory")) for m in ctx.models]),
            "weight_hash": np.array([m.weight_hash() for m in ctx.models]),
            "seed": np.array([-1 if s is None else int(s) for s in seeds], dtype=np.int64),
            "role": np.array(["anchor" if i == ctx.anchor else "refit" for i in range(ctx.n_refits)])}


def result_params(ctx: FitContext, null: dict, params: dict) -> dict:
    """Return the parameters, estimands and provenance recorded with every table."""
    models = [{"refit": i, "source": str(getattr(m, "source", "memory")), "weight_hash": m.weight_hash(),
               "seed": getattr(m, "meta", {}).get("training", {}).get("seed"),
               "role": "anchor" if i == ctx.anchor else "refit"} for i, m in enumerate(ctx.models)]
    return {**params, "estimator": "HeadStability", "null_description": null["description"],
            "models": models, "probe": ctx.probe.describe(), "n_refits": ctx.n_refits, "n_layers": ctx.n_layers,
            "n_heads": ctx.n_heads, "seed_record": seed_record(ctx.root), "estimands": ESTIMANDS,
            "similarity": "cosine of lower-triangle (with diagonal) attention patterns per prompt, mean over prompts",
            "importance_definition": "exp(mean next-token loss, head zero-ablated) - exp(mean clean loss) on the probe set",
            "bootstrap": f"{ctx.n_resamples} replicates; resampled: {params['ci_over']}; percentile intervals"}


def refit_replicates(refit_level: RefitLevel, residual: dict) -> dict:
    """Return leave-one-refit-out values and estimates of the refit-level statistics, by name."""
    out = {}
    for name in ("mean", "excess_mean", "gap", "ends_minus_middle"):
        if name in refit_level.estimates:
            out[f"estimate:{name}"] = np.atleast_1d(refit_level.estimates[name])
            out[f"jackknife:{name}"] = refit_level.leave_one_out[name]
    for key, refit in residual["refit"].items():
        out[f"estimate:resid:{key}"] = np.atleast_1d(refit["estimate"].mean())
        out[f"jackknife:resid:{key}"] = refit["leave_one_out"].mean(-1)
    return out
