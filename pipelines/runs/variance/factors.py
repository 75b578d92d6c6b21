"""The study's factor stages: each factor's Jaccard to the reference circuit (``variance_stability``)
and selection at fixed faithfulness (``faithfulness_vs_k``, ``selection``).

A mixin of the study (:class:`circuitstat.pipelines.runs.variance.study._Study`): the methods read its
score matrices (``S``), resampling plan, run directory and spec.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from circuitstat.core.topk import TIE_RULE

from circuitstat.pipelines.runs.variance.scorer import Key
from circuitstat.pipelines.runs.variance.spec import spec_view

class FactorStages:
    """Per-factor Jaccard to the reference circuit and selection at fixed faithfulness."""

    # -- per-factor Jaccard to the reference circuit --
    def factor_levels(self) -> list[tuple[str, str, Any]]:
        """(factor, level, (key, aggregation, dataset)) for every compared level."""
        sp = self.spec
        out = []
        for j in range(1, sp.dataset.n_fresh + 1):
            out.append(("dataset: fresh draws", f"draw {j}", (Key(0, j, 0, "exact"), "mean", j)))
        for c in range(1, self.C):
            out.append(("counterfactual", f"draw {c}", (Key(0, 0, c, "exact"), "mean", 0)))
        for lab in self.levels[1:]:
            out.append(("estimator", lab, (Key(0, 0, 0, lab), "mean", 0)))
        for how in sp.aggregations[1:]:
            out.append(("aggregation", how, (self.ref, how, 0)))
        for s in range(1, self.S_models):
            out.append(("seed", f"seed {s}", (Key(s, 0, 0, "exact"), "mean", 0)))
        return out

    def _paired(self, levels: list, pairs: list, name: str, with_mean: bool):
        """circuitstat.stats.factor_stability.paired_jaccard on the reference dataset, or None with the reason."""
        from circuitstat.stats.factor_stability import paired_jaccard
        from circuitstat.stats.stability_data import MIN_OBS

        why = None
        if self.sc.n_obs(0) < MIN_OBS:
            why = f"no interval: a data-level interval needs at least {MIN_OBS} examples"
        elif self.plan0.kind != "bootstrap":
            why = f"no interval: the data-level interval needs the examples bootstrap, not {self.plan0.kind!r}"
        res = paired_jaccard(self.S(self.ref), levels, pairs, self.plan0.counts, ranking=self.spec.ranking,
                             trim=self.spec.trim, seed=self.run.stage_seed(name), confidence_level=self.cl,
                             with_mean=with_mean, intervals=why is None)
        return res, why or "paired double bootstrap + split extrapolation, bracketed (data level)"

    def factor_stage(self) -> dict:
        from circuitstat.stats import chance_jaccard
        from circuitstat.stats.factor_stability import PAIRED_ESTIMAND, SPREAD_LABEL, fresh_draw_jaccards
        from circuitstat.stats.stability_data import ESTIMANDS

        sp = self.spec
        pairs = [(k, k) for k in self.ks]
        nk = len(self.ks)
        nan = np.full(nk, np.nan)
        chance = np.asarray(chance_jaccard(self.E, self.ks), dtype=np.float64)
        cols = ("factor", "level", "k", "jaccard_mean", "ci_low", "ci_high", "estimand", "interval", "se", "bias",
                "split", "jaccard_full_data", "spread_low", "spread_high", "cutoff_ties", "chance", "n_resamples")
        rows: dict[str, list] = {c: [] for c in cols}

        def add(factor, level, j, lo, hi, estimand, interval, full, se=nan, bias=nan, split=nan, s_lo=nan,
                s_hi=nan, ties=None):
            ties = np.full(nk, -1) if ties is None else ties
            for i, k in enumerate(self.ks):
                for c, v in zip(cols, (factor, level, int(k), float(j[i]), float(lo[i]), float(hi[i]), estimand,
                                       interval, float(se[i]), float(bias[i]), float(split[i]), float(full[i]),
                                       float(s_lo[i]), float(s_hi[i]), int(ties[i]), float(chance[i]),
                                       int(self.plan0.n_resamples))):
                    rows[c].append(v)

        # independent datasets: the data-level intervals of circuitstat.stats.stability_data on the reference matrix
        st = self.run.table("stability_vs_k").to_pydict()
        ex = [i for i, m in enumerate(st["method"]) if m == "exact"]
        col = {c: np.asarray(st[c], dtype=np.float64)[ex] for c in ("jaccard_data", "jaccard_data_ci_low",
                                                                    "jaccard_data_ci_high", "jaccard_pop",
                                                                    "jaccard_pop_ci_low", "jaccard_pop_ci_high")}
        how_dl = "double bootstrap (circuitstat.stats.stability_data)" if np.isfinite(col["jaccard_pop_ci_low"]).any() else \
            "not computed (see stability_vs_k: data-level intervals need N >= 32 and the examples bootstrap)"
        add("dataset: bootstrap", "resamples", col["jaccard_pop"], col["jaccard_pop_ci_low"],
            col["jaccard_pop_ci_high"], ESTIMANDS["jaccard_pop_ci"], how_dl, nan)
        by_factor: dict[str, list] = {}
        for factor, level, spec_ in self.factor_levels():
            by_factor.setdefault(factor, []).append((level, spec_))
        fresh = by_factor.pop("dataset: fresh draws", [])
        fulls, mean_full = fresh_draw_jaccards(self.S(self.ref), [(self.S(key), how) for _, (key, how, _) in fresh],
                                               pairs, ranking=sp.ranking, trim=sp.trim,
                                               seed=self.run.stage_seed("fresh_draws"))
        for (level, _), full in zip(fresh, fulls):
            add("dataset: fresh draws", level, full, col["jaccard_data_ci_low"], col["jaccard_data_ci_high"],
                ESTIMANDS["jaccard_data_ci"], f"{how_dl}; the value is this draw's Jaccard to the reference", full)
        if len(fresh) > 1:
            add("dataset: fresh draws", "all levels (mean)", col["jaccard_data"], col["jaccard_data_ci_low"],
                col["jaccard_data_ci_high"], ESTIMANDS["jaccard_data_ci"],
                f"{how_dl}; value: its plug-in, full data: mean over the {len(fresh)} draws", mean_full)
        # paired factors: the same prompts scored two ways
        for factor, lv in by_factor.items():
            levels = [(self.S(key), how) for _, (key, how, _) in lv]
            res, how_iv = self._paired(levels, pairs, f"factor_{factor}", with_mean=len(lv) > 1)
            estimand = PAIRED_ESTIMAND + ("; for seeds: these trained models, not the distribution of training "
                                          "seeds" if factor == "seed" else "")
            names = [lvl for lvl, _ in lv] + (["all levels (mean)"] if len(lv) > 1 else [])
            for i, level in enumerate(names):
                add(factor, level, res.estimate[i], res.ci_low[i], res.ci_high[i], estimand, how_iv,
                    res.full_data[i], res.se[i], res.bias[i], res.split[i], res.spread_low[i], res.spread_high[i],
                    res.cutoff_ties[i])
        out = {c: (np.asarray(v, dtype=np.int64) if c in ("k", "n_resamples", "cutoff_ties") else v)
               for c, v in rows.items()}
        out["spread_label"] = [SPREAD_LABEL] * len(rows["k"])
        out["tie_rule"] = [TIE_RULE] * len(rows["k"])
        return {"variance_stability": out}

    # -- selection at fixed faithfulness --
    def selection_ks(self) -> list[int]:
        sp = self.spec
        if sp.selection.ks is not None:
            ks = [k for k in sp.selection.ks if k <= self.E]
        else:
            ks = np.unique(np.round(np.geomspace(1, self.E, 16)).astype(int)).tolist()
        return sorted(set(ks) | set(self.ks) | {self.E})

    def selection_stage(self) -> dict:
        from circuitstat.pipelines.runs.audit.tables import concat_parts, faithfulness_table

        sp = self.spec
        model, task = self.sc.model(0), self.sc.task(0)
        ks = self.selection_ks()
        parts, sel = [], {c: [] for c in ("method", "target", "k_star", "k_low", "k_high", "f_at_k_star", "reached")}
        for lab in self.levels:
            t = faithfulness_table(model, task, self.S(Key(0, 0, 0, lab)), lab, ks, self.plan0, spec_view(sp), seed=sp.seed)
            parts.append(t)
            k_arr, f, lo, hi = (np.asarray(t[c]) for c in ("k", "f_ratio", "f_ci_low", "f_ci_high"))
            first = lambda ok: int(k_arr[np.argmax(ok)]) if ok.any() else -1  # noqa: E731
            ks_, kl, kh = first(f >= sp.selection.target), first(hi >= sp.selection.target), first(lo >= sp.selection.target)
            for c, v in zip(sel, (lab, sp.selection.target, ks_, kl, kh,
                                  float(f[np.argmax(f >= sp.selection.target)]) if ks_ > 0 else np.nan, ks_ > 0)):
                sel[c].append(v)
        sel = {c: (np.asarray(v, dtype=np.int64) if c.startswith("k_") else v) for c, v in sel.items()}
        return {"faithfulness_vs_k": concat_parts(parts), "selection": sel}
