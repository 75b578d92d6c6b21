"""Token-importance faithfulness: does ablating the tokens a measure ranks highest hurt the metric?

Input: per-prompt metric drops ``drops[n, m, k]`` = m(clean) − m(top-k tokens by measure m
ablated) for N prompts, M measures (one of them usually ``random``, the null) and K values of k
(the ablation itself is ``circuitstat.circuits.contributions.ablation_drops``).

* **Mean drop per measure and k**, with the project's calibrated interval for a mean over prompts
  (``circuitstat.stats.intervals.bootstrap_edges``: the symmetric studentized bootstrap by default, its
  p-value inverting the interval, and the tail-share reliability flag). Estimand: the mean drop
  over the task's prompt distribution.
* **Paired differences** between measures (drop_a − drop_b on the same prompt and k), with the
  same interval over prompts (one resampling plan shared by every table, so the resamples are
  the same prompts everywhere). Estimand: the mean paired difference over the prompt
  distribution. Verdicts: Holm's step-down adjustment over the whole family of differences
  (every pair at every k) at family-wise level ``alpha``; "a > b" / "a < b" where the adjusted
  p-value is <= alpha, else "inconclusive". The intervals are unadjusted (marginal) 95%
  intervals; the multiplicity rule is stated in the table.

Coverage of the paired-difference interval is simulated in tests/stats/test_token_importance.py
(skewed paired population, N = 48).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Mapping, Sequence

import numpy as np

from circuitstat.core.results import Result
from circuitstat.core.params import N_RESAMPLES

from .intervals import BootstrapResult, bootstrap_edges, interval_text
from .resampling import ResamplingPlan
from .testing import holm_adjust

__all__ = ["TokenImportanceResult", "token_importance_faithfulness", "TokenStabilityResult", "token_stability",
           "ESTIMAND_DROP", "ESTIMAND_DIFFERENCE", "ESTIMAND_TOKEN_STABILITY"]

ESTIMAND_DROP = "mean metric drop over the task's prompt distribution when the top-k tokens of the measure are ablated"
ESTIMAND_DIFFERENCE = "mean paired difference of those drops between two measures over the prompt distribution"


def _check_drops(drops: Any, measures: Sequence[str], ks: Sequence[int]) -> np.ndarray:
    """Return ``drops`` as float64 [N, M, K]; ValueError naming the mismatch."""
    from circuitstat.core.errors import InputError

    d = np.asarray(drops, dtype=np.float64)
    if d.ndim != 3 or d.shape[1:] != (len(measures), len(ks)):
        raise InputError(f"drops must be [N, {len(measures)} measures, {len(ks)} ks], got shape {d.shape}")
    if d.shape[0] < 2:
        raise InputError("token-importance intervals need at least 2 prompts")
    if not np.isfinite(d).all():
        raise InputError("some metric drops are NaN or infinite; check the task's metric on the ablated prompts")
    if len(set(measures)) != len(measures):
        raise InputError(f"measure names repeat: {list(measures)}")
    return d


@dataclass(repr=False)
class TokenImportanceResult(Result):
    """Mean drops and paired differences with intervals over prompts; tables ``token_importance``
    and ``token_importance_diffs``."""

    measures: tuple[str, ...]
    ks: tuple[int, ...]
    drops: BootstrapResult
    differences: BootstrapResult | None
    pairs: list[tuple[str, str]]
    pvalue_holm: np.ndarray
    verdicts: np.ndarray
    alpha: float
    params: dict = field(default_factory=dict)
    main_table = "token_importance"

    def _index(self, measure: str, k: int) -> int:
        return self.measures.index(measure) * len(self.ks) + self.ks.index(k)

    def mean_drop(self, measure: str, k: int) -> tuple[float, float, float]:
        """Return (mean drop, ci_low, ci_high) of ``measure`` at ``k``."""
        i = self._index(measure, k)
        ci = self.drops.confidence_interval
        return float(self.drops.estimate[i]), float(ci.low[i]), float(ci.high[i])

    def difference(self, a: str, b: str, k: int) -> dict[str, Any]:
        """Return the row of the paired difference a − b at ``k`` (estimate, interval, p-values, verdict)."""
        row = self.pairs.index((a, b)) * len(self.ks) + self.ks.index(k)
        table = self._tables()["token_importance_diffs"]
        return {name: col[row] for name, col in table.items()}

    @property
    def multiplicity(self) -> str:
        """Return the multiple-comparison rule of the verdicts."""
        m = len(self.pairs) * len(self.ks)
        return (f"Holm step-down over the {m} paired differences (every pair at every k), family-wise alpha "
                f"{self.alpha:g}; intervals are marginal {self.drops.confidence_level:g} intervals")

    def _tables(self) -> dict[str, dict[str, Any]]:
        M, K = len(self.measures), len(self.ks)
        d = self.drops
        main = {"measure": np.repeat(np.array(self.measures, dtype=str), K),
                "k": np.tile(np.array(self.ks, dtype=np.int64), M),
                "n": np.full(M * K, d.n_obs, dtype=np.int64),
                "mean_drop": d.estimate, "standard_error": d.standard_error,
                "ci_low": d.confidence_interval.low, "ci_high": d.confidence_interval.high,
                "pvalue": d.pvalue, "tail_share": d.tail_share, "interval_reliable": d.reliable,
                "interval": np.full(M * K, d.method), "estimand": np.full(M * K, ESTIMAND_DROP)}
        P = len(self.pairs)
        diffs: dict[str, Any] = {"measure_a": np.repeat(np.array([a for a, _ in self.pairs], dtype=str), K),
                                 "measure_b": np.repeat(np.array([b for _, b in self.pairs], dtype=str), K),
                                 "k": np.tile(np.array(self.ks, dtype=np.int64), P)}
        if self.differences is None:
            empty = np.zeros(0)
            diffs.update(difference=empty, standard_error=empty, ci_low=empty, ci_high=empty, pvalue=empty,
                         pvalue_holm=empty, verdict=np.zeros(0, dtype=str), interval_reliable=np.zeros(0, bool),
                         multiplicity=np.zeros(0, dtype=str), estimand=np.zeros(0, dtype=str))
        else:
            r = self.differences
            diffs.update(difference=r.estimate, standard_error=r.standard_error, ci_low=r.confidence_interval.low,
                         ci_high=r.confidence_interval.high, pvalue=r.pvalue, pvalue_holm=self.pvalue_holm,
                         verdict=self.verdicts, interval_reliable=r.reliable,
                         multiplicity=np.full(P * K, self.multiplicity),
                         estimand=np.full(P * K, ESTIMAND_DIFFERENCE))
        return {"token_importance": main, "token_importance_diffs": diffs}

    def _summary_items(self) -> list[tuple[str, Any]]:
        items: list[tuple[str, Any]] = [("prompts (N)", self.drops.n_obs), ("resamples (B)", self.drops.n_resamples),
                                        ("interval", self.drops.method), ("estimand", ESTIMAND_DROP)]
        few = "too few prompts or no spread"
        for m in self.measures:
            for k in self.ks:
                est, lo, hi = self.mean_drop(m, k)
                items.append((f"drop {m} k={k}", interval_text(est, lo, hi, digits=4, missing=few)))
        if self.differences is not None:
            for (a, b) in self.pairs:
                for k in self.ks:
                    row = self.difference(a, b, k)
                    text = interval_text(row["difference"], row["ci_low"], row["ci_high"], digits=4, missing=few)
                    items.append((f"{a} - {b} k={k}", f"{text} {row['verdict']}"))
            items.append(("multiplicity", self.multiplicity))
        return items


def _verdicts(estimate: np.ndarray, adjusted: np.ndarray, alpha: float, pairs: list[tuple[str, str]],
              n_k: int) -> np.ndarray:
    """Return "a > b", "a < b" or "inconclusive" per difference row (Holm-adjusted p <= alpha)."""
    out = []
    for i, (est, p) in enumerate(zip(estimate, adjusted)):
        a, b = pairs[i // n_k]
        if p <= alpha and est > 0:
            out.append(f"{a} > {b}")
        elif p <= alpha and est < 0:
            out.append(f"{a} < {b}")
        else:
            out.append("inconclusive")
    return np.array(out, dtype=str)


def token_importance_faithfulness(drops: np.ndarray, measures: Sequence[str], ks: Sequence[int], *,
                                  pairs: Sequence[tuple[str, str]] | None = None, plan: ResamplingPlan | None = None,
                                  n_resamples: int = N_RESAMPLES.default_for("tokens"), seed: Any = None, method: str | None = None,
                                  confidence_level: float = 0.95, alpha: float = 0.05) -> TokenImportanceResult:
    """Return mean drops per measure and k and paired differences, with intervals over prompts and Holm verdicts.

    ``drops`` [N, M, K]; ``pairs`` (default: every pair of measures in the given order) are the
    differences tested; ``plan`` (or ``n_resamples`` and ``seed``) the one resampling plan used
    for every interval; ``method`` the interval (default: circuitstat.stats.intervals' calibrated default).
    """
    from circuitstat.core.errors import InputError

    measures, ks = tuple(str(m) for m in measures), tuple(int(k) for k in ks)
    d = _check_drops(drops, measures, ks)
    N, M, K = d.shape
    if plan is None:
        plan = ResamplingPlan.bootstrap(N, n_resamples, seed)
    elif seed is not None:
        raise InputError("pass either a plan or a seed, not both: the plan already fixes the draw")
    pairs = list(combinations(measures, 2)) if pairs is None else [(str(a), str(b)) for a, b in pairs]
    for a, b in pairs:
        if a not in measures or b not in measures or a == b:
            raise InputError(f"pair ({a!r}, {b!r}) is not two different measures of {list(measures)}")
    kw = dict(method=method, confidence_level=confidence_level)
    drop_res = bootstrap_edges(d.reshape(N, M * K), plan, **kw)
    diff_res, adjusted, verdicts = None, np.zeros(0), np.zeros(0, dtype=str)
    if pairs:
        cols = [d[:, measures.index(a)] - d[:, measures.index(b)] for a, b in pairs]  # each [N, K]
        diff_res = bootstrap_edges(np.concatenate(cols, axis=1), plan, **kw)
        adjusted = holm_adjust(diff_res.pvalue)
        verdicts = _verdicts(diff_res.estimate, adjusted, alpha, pairs, K)
    params = {"estimator": "token_importance_faithfulness", "measures": list(measures), "ks": list(ks),
              "pairs": [list(p) for p in pairs], "plan": plan.describe(), "method": drop_res.method,
              "confidence_level": confidence_level, "alpha": alpha, "n_prompts": N,
              "estimands": {"drop": ESTIMAND_DROP, "difference": ESTIMAND_DIFFERENCE},
              "multiplicity": "Holm over every pair x k"}
    return TokenImportanceResult(measures, ks, drop_res, diff_res, pairs, adjusted, verdicts, alpha, params)


# --- stability of the important tokens across training seeds ---------------------------------------
ESTIMAND_TOKEN_STABILITY = ("expected Jaccard between the top-k token sets of two independently trained seeds on a "
                            "prompt of the task's distribution; every seed an anchor, jackknife over seeds (t, K-1 "
                            "df); the prompts are fixed")


def _topk_jaccard(orders_a: np.ndarray, orders_b: np.ndarray, take: np.ndarray, n_positions: int) -> np.ndarray:
    """Return per prompt the Jaccard of the first ``take[n]`` positions of two orders [N, P]."""
    ranks = np.arange(n_positions)[None, :] < take[:, None]
    sel_a = np.zeros(orders_a.shape, bool)
    sel_b = np.zeros(orders_b.shape, bool)
    np.put_along_axis(sel_a, orders_a, ranks, axis=1)
    np.put_along_axis(sel_b, orders_b, ranks, axis=1)
    inter = (sel_a & sel_b).sum(1)
    return inter / (sel_a | sel_b).sum(1)


@dataclass(repr=False)
class TokenStabilityResult(Result):
    """Top-k token agreement across seeds per measure and k, against chance; table ``token_stability``."""

    rows: dict[str, np.ndarray]
    params: dict = field(default_factory=dict)
    main_table = "token_stability"

    def _tables(self) -> dict[str, dict[str, Any]]:
        return {"token_stability": self.rows}

    def _summary_items(self) -> list[tuple[str, Any]]:
        from .head_stability import seeds_interval_text

        r = self.rows
        return [(f"top-{k} {m} Jaccard", f"{seeds_interval_text(j, lo, hi, K)} (chance {c:.3g})")
                for m, k, j, lo, hi, c, K in zip(r["measure"], r["k"], r["jaccard"], r["ci_low"], r["ci_high"],
                                                 r["chance"], r["n_refits"])]


def token_stability(orders: Mapping[str, np.ndarray], candidates: np.ndarray, ks: Sequence[int], *,
                    confidence_level: float = 0.95) -> TokenStabilityResult:
    """Return per measure and k the mean top-k token Jaccard between seeds, its excess over chance, and intervals.

    ``orders`` maps a measure to ``[K seeds, N, P]`` token orders (largest importance first) of the
    same prompts; ``candidates`` [N, P] the tokens that may be chosen (shared by every seed).
    Chance: the expected Jaccard of two random k-subsets of a prompt's candidates (hypergeometric).
    Intervals: jackknife over seeds of the ordered-pair mean (circuitstat.stats.head_stability), >= 3 seeds.
    """
    from circuitstat.core.errors import InputError

    from .head_stability import leave_one_refit_out, ordered_pair_mean, refit_jackknife
    from .stability import chance_jaccard

    cand = np.asarray(candidates, dtype=bool)
    n_cand = cand.sum(1)
    rows: dict[str, list] = {c: [] for c in ("measure", "k", "jaccard", "ci_low", "ci_high", "chance", "excess",
                                             "excess_ci_low", "excess_ci_high", "n_refits", "n_prompts", "estimand")}
    for measure, o in orders.items():
        o = np.asarray(o)
        if o.ndim != 3 or o.shape[1:] != cand.shape:
            raise InputError(f"orders of {measure!r} must be [seeds, {cand.shape[0]}, {cand.shape[1]}], got {o.shape}")
        S = o.shape[0]
        if S < 2:
            raise InputError("token stability across seeds needs at least 2 seeds")
        for k in ks:
            take = np.minimum(int(k), n_cand)
            chance = np.array([chance_jaccard(int(c), int(t)) for c, t in zip(n_cand, take)])
            pair = np.full((S, S, 2), np.nan)  # [.., 0] Jaccard, [.., 1] excess over chance
            for a in range(S):
                for b in range(a + 1, S):
                    j = _topk_jaccard(o[a], o[b], take, cand.shape[1])
                    pair[a, b] = pair[b, a] = (j.mean(), (j - chance).mean())
            est, loo = ordered_pair_mean(pair), leave_one_refit_out(pair)
            lo, hi, _ = refit_jackknife(est, loo, confidence_level)
            rows["measure"].append(measure)
            rows["k"].append(int(k))
            rows["jaccard"].append(est[0])
            rows["ci_low"].append(lo[0])
            rows["ci_high"].append(hi[0])
            rows["chance"].append(float(chance.mean()))
            rows["excess"].append(est[1])
            rows["excess_ci_low"].append(lo[1])
            rows["excess_ci_high"].append(hi[1])
            rows["n_refits"].append(S)
            rows["n_prompts"].append(cand.shape[0])
            rows["estimand"].append(ESTIMAND_TOKEN_STABILITY)
    types = {"measure": str, "estimand": str, "k": np.int64, "n_refits": np.int64, "n_prompts": np.int64}
    table = {c: np.array(v, dtype=types.get(c, np.float64)) for c, v in rows.items()}
    params = {"estimator": "token_stability", "ks": [int(k) for k in ks], "measures": list(orders),
              "confidence_level": confidence_level, "estimand": ESTIMAND_TOKEN_STABILITY}
    return TokenStabilityResult(table, params)
