"""The study's summary stage (``variance_summary``, ``summary``) and its text lines for the command line.

``SummaryStages`` is a mixin of the study (:class:`circuitstat.pipelines.runs.variance.study._Study`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from circuitstat.pipelines.runs.variance.scorer import Key

__all__ = ["MULTIPLICITY", "summary_lines"]

#: how the summary's verdicts combine intervals
MULTIPLICITY = "none: each verdict reads its own interval at the stated confidence level"


class SummaryStages:
    """The summary tables: per-factor verdicts against the bar and the headline items with intervals."""

    # -- summary --
    def summary_stage(self, sel: bool) -> dict:
        from circuitstat.stats.factor_stability import bar_verdict

        sp, run = self.spec, self.run
        k = sp.k_summary
        vs = run.table("variance_stability").to_pydict()
        cols = ("factor", "level", "jaccard_to_reference", "ci_low", "ci_high", "bar", "meets_bar", "verdict", "k",
                "jaccard_full_data", "n_levels", "estimand", "interval", "multiplicity")
        rows: dict[str, list] = {c: [] for c in cols}
        summ: dict[str, list] = {c: [] for c in ("item", "value", "ci_low", "ci_high", "verdict")}

        def item(name, v, lo=np.nan, hi=np.nan, verdict=""):  # estimands: variance_summary / variance_shares
            for c, x in zip(summ, (name, float(v), float(lo), float(hi), verdict)):
                summ[c].append(x)

        def vrow(factor, level, j, lo, hi, kk, jfull, n, estimand, interval) -> str:
            verdict = bar_verdict(lo, hi, sp.bar)
            for c, x in zip(rows, (factor, level, float(j), float(lo), float(hi), float(sp.bar), verdict == "met",
                                   verdict, int(kk), float(jfull), int(n), estimand, interval, MULTIPLICITY)):
                rows[c].append(x)
            return verdict

        fac = np.asarray(vs["factor"], dtype=object)
        lev = np.asarray(vs["level"], dtype=object)
        kk = np.asarray(vs["k"])
        item("examples (N)", self.sc.n_obs(0))
        item(f"bootstrap resamples (B), {sp.bootstrap.scheme}", self.plan0.n_resamples)
        for f in dict.fromkeys(fac.tolist()):
            sel_rows = np.flatnonzero((fac == f) & (kk == k))
            n_lv = self.plan0.n_resamples if f == "dataset: bootstrap" else len(sel_rows) - (len(sel_rows) > 1)
            agg = [i for i in sel_rows if lev[i] in ("all levels (mean)", "resamples")] or list(sel_rows)
            i = agg[0]
            j, lo, hi = vs["jaccard_mean"][i], vs["ci_low"][i], vs["ci_high"][i]
            verdict = vrow(f, str(lev[i]), j, lo, hi, k, vs["jaccard_full_data"][i], n_lv, vs["estimand"][i],
                           vs["interval"][i])
            item(f"Jaccard to reference at k={k}: {f}", j, lo, hi, verdict)
            for i in sel_rows:
                if i != agg[0]:
                    vrow(f"{f}: {lev[i]}", str(lev[i]), vs["jaccard_mean"][i], vs["ci_low"][i], vs["ci_high"][i], k,
                         vs["jaccard_full_data"][i], 1, vs["estimand"][i], vs["interval"][i])
        if sel:
            self._selection_rows(vrow, item)
        self._intrinsic_items(item, k)
        sh = run.table("variance_shares").to_pydict()
        for s, v, lo, hi, n in zip(sh["source"], sh["share"], sh["ci_low"], sh["ci_high"], sh["n_edges"]):
            item(f"variance share over top-{n} edges: {s}", v, lo, hi)
        ap = run.table("approximation_summary").to_pydict()
        for m, rho, r2, ov in zip(ap["method"], ap["spearman"], ap["r2"], ap["top_k_overlap"]):
            item(f"approximation {m}: Spearman of mean scores vs exact", rho)
            item(f"approximation {m}: per-input R² vs exact", r2)
            item(f"approximation {m}: top-{k} overlap with exact", ov)
        return {"variance_summary": {c: (np.asarray(v, dtype=np.int64) if c in ("k", "n_levels") else v)
                                     for c, v in rows.items()},
                "summary": summ}

    def _intrinsic_items(self, item, k: int) -> None:
        """Summary items: median CV, sign consistency and SNR over the top-k edges, heavy-tailed share."""
        from circuitstat.stats.intervals import intervals_from_distribution
        from circuitstat.stats.intrinsic import intrinsic_medians

        top = self.top_edges(max(k, 1))
        S0 = self.S(self.ref)
        full = intrinsic_medians(S0[:, top], np.ones((1, S0.shape[0]), dtype=np.int64))
        boot = intrinsic_medians(S0[:, top], self.plan0.counts)
        for name, label in (("cv", "median coefficient of variation"), ("sign_consistency", "median sign consistency"),
                            ("snr", "median SNR |mean|/SD")):
            ci = intervals_from_distribution(boot[name], full[name][0], method="percentile",
                                             confidence_level=self.cl)["percentile"]
            item(f"intrinsic: {label}, top-{k} edges (percentile bootstrap, edges fixed)", full[name][0], ci.low,
                 ci.high)
        it = self.run.table("intrinsic").to_pydict()
        heavy = np.asarray(it["heavy_tailed"], dtype=bool)[top]
        item(f"intrinsic: heavy-tailed edges among top-{k} (share)", heavy.mean())

    def _selection_rows(self, vrow, item) -> None:
        from circuitstat.stats.factor_stability import PAIRED_ESTIMAND, bar_verdict

        sp, run = self.spec, self.run
        sel = run.table("selection").to_pydict()
        ks = dict(zip(sel["method"], sel["k_star"]))
        for m, kst, lo, hi in zip(sel["method"], sel["k_star"], sel["k_low"], sel["k_high"]):
            reached = kst > 0
            item(f"selection: smallest k with faithfulness >= {sp.selection.target:g} ({m})",
                 kst if reached else np.nan, lo if lo > 0 else np.nan, hi if hi > 0 else np.nan,
                 "" if reached else "not reached")
        k_ref = ks.get("exact", -1)
        others = [(m, kk) for m, kk in ks.items() if m != "exact" and kk > 0]
        if k_ref <= 0 or not others:
            return
        levels = [(self.S(Key(0, 0, 0, m)), "mean") for m, _ in others]
        res, how = self._paired(levels, [[(kk, k_ref)] for _, kk in others], "factor_selection",
                                with_mean=len(others) > 1)
        for i, (m, kk) in enumerate(others):
            vrow(f"selection: {m}", m, res.estimate[i, 0], res.ci_low[i, 0], res.ci_high[i, 0], k_ref,
                 res.full_data[i, 0], 1, PAIRED_ESTIMAND,
                 f"{how}; k={kk} vs exact k={k_ref}, both held at the selected sizes (not re-selected per resample)")
        if len(others) > 1:
            j, lo, hi = res.estimate[-1, 0], res.ci_low[-1, 0], res.ci_high[-1, 0]
            vrow(f"selection (f >= {sp.selection.target:g})", "all estimators (mean)", j, lo, hi, k_ref,
                 res.full_data[-1, 0], len(others), PAIRED_ESTIMAND,
                 f"{how}; each estimator at its selected k, exact at k={k_ref} (sizes not re-selected per resample)")
            item(f"Jaccard to reference: selection at faithfulness >= {sp.selection.target:g} (estimators)", j, lo,
                 hi, bar_verdict(lo, hi, sp.bar))



def summary_lines(out: Path) -> list[str]:
    """The per-factor Jaccard table of a finished study, as text lines (verdicts against the recorded bar)."""
    from circuitstat.core.tables import read_table

    s = read_table(Path(out) / "variance_summary.parquet").to_pydict()
    k = s["k"][0] if s["k"] else "?"
    bar = f"{s['bar'][0]:g} bar" if s.get("bar") else "bar"
    lines = [f"{'factor (Jaccard to the reference circuit, k=' + str(k) + ')':<46} {'Jaccard':>8}  {'interval':<17} {bar}"]
    for f, j, lo, hi, v in zip(s["factor"], s["jaccard_to_reference"], s["ci_low"], s["ci_high"], s["verdict"]):
        interval = f"[{lo:.3f}, {hi:.3f}]" if np.isfinite(lo) and np.isfinite(hi) else "no interval"
        lines.append(f"{f[:46]:<46} {j:>8.3f}  {interval:<17} {v}".rstrip())
    return lines
