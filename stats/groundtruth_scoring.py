"""One dataset's discovery scored against the truth, and the summaries over R datasets (the ground-truth study).

``score_dataset`` takes the per-example scores S [N, E] of one dataset and the true edge mask and
returns long rows ``(family, statistic, param, value)``:

* ``ranking``: ``auroc`` and ``auroc_pessimistic`` of |mean| (or the signed mean) against the truth;
* ``topk``: precision, recall and F1 of the top-k circuit at each k of ``ks``;
* ``test:bootstrap`` (the audit's default per-edge test: the symmetric studentized bootstrap interval
  inverted, Benjamini-Hochberg q-values) and ``test:t`` (one-sample t, BH): at each alpha the edges with
  q <= alpha, their FDP, recall (power), precision, F1 and counts;
* ``test:verified`` (``score_verified_dataset``, a verified run: the approximation on the dataset's N prompts,
  exact on n of them): the same rows for the q-values of the PPI++ intervals of the mean exact effect;
* ``stability``: inclusion frequencies of the top-k circuit (k = the truth's size) over half-size
  subsamples; at each threshold pi the realised number of false edges with frequency >= pi and the
  Meinshausen-Buhlmann bound on its expectation (circuitstat.stats.stability.selection_error_bounds, valid there).

``faithfulness_dataset`` adds the ``faithfulness`` family: whether the fixed-circuit interval of the
true circuit (Fieller's set, with how often it is bounded; the former BCa interval beside it as ``fixed_bca_*``)
covers its known faithfulness, and whether the selection-aware (cross-fitted) interval of
the selected top-k circuit covers that circuit's population faithfulness and the true circuit's;
``faithfulness_refit_dataset`` the same rows for a mask fit (one refit per cross-fitting fold).

``summarise`` turns the rows of R datasets into intervals over datasets (circuitstat.stats.groundtruth.over_datasets)
and ``fdr_rows`` into the FDR calibration verdicts (circuitstat.stats.groundtruth.fdr_check).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

import numpy as np

from .groundtruth import DATASET_ESTIMAND, auroc, fdr_check, over_datasets, pessimistic_auroc, selection_metrics, \
    topk_metrics
from circuitstat.core.topk import ranking_key

__all__ = ["Row", "score_dataset", "score_vector_dataset", "refit_rows", "score_verified_dataset",
           "faithfulness_dataset", "faithfulness_refit_dataset", "summarise", "fdr_rows", "TESTS"]

Row = tuple[str, str, str, float]  # (family, statistic, param, value)
TESTS = ("bootstrap", "t")


def _tests(S: np.ndarray, truth: np.ndarray, alphas: Sequence[float], n_resamples: int, seed: Any) -> list[Row]:
    """FDP, power and selection sizes of q-value selections by each per-edge test."""
    from .intervals import bootstrap_edges
    from .resampling import ResamplingPlan
    from .testing import t_test_edges

    n = S.shape[0]
    qs = {"bootstrap": bootstrap_edges(S, ResamplingPlan.bootstrap(n, n_resamples, seed)).qvalue}
    if n >= 2:
        with np.errstate(invalid="ignore", divide="ignore"):
            qs["t"] = t_test_edges(S).pvalue_adjusted
    rows: list[Row] = []
    for test, q in qs.items():
        for a in alphas:
            with np.errstate(invalid="ignore"):
                m = selection_metrics(np.nan_to_num(q, nan=1.0) <= a, truth)
            rows += [(f"test:{test}", stat, f"q={a:g}", float(m[stat]))
                     for stat in ("fdp", "recall", "precision", "f1", "n_selected", "n_false")]
    return rows


def _stability(S: np.ndarray, truth: np.ndarray, k: int, thresholds: Sequence[float], n_subsamples: int, seed: Any,
               ranking: str) -> list[Row]:
    """Realised false edges of stability selection against the Meinshausen-Buhlmann bound, per threshold."""
    from .resampling import ResamplingPlan
    from .stability import circuit_stability, selection_error_bounds

    plan = ResamplingPlan.subsample(S.shape[0], n_subsamples, seed)
    res = circuit_stability(S, plan, [k], ranking=ranking, data_level=False, n_rank_resamples=2,
                            n_pair_resamples=min(n_subsamples, 50))
    freq = res.inclusion_counts[0] / res.n_resamples
    bound = selection_error_bounds(k, S.shape[1], thresholds)["pfer_mb"]
    rows: list[Row] = []
    for pi, b in zip(thresholds, bound):
        sel = freq >= pi
        rows += [("stability", "false_edges", f"pi={pi:g}", float((sel & ~truth).sum())),
                 ("stability", "pfer_bound_mb", f"pi={pi:g}", float(b)),
                 ("stability", "recall", f"pi={pi:g}", float((sel & truth).sum() / truth.sum()))]
    return rows


def _ranking_rows(key: np.ndarray, truth: np.ndarray, ks: Sequence[int], seed: Any) -> list[Row]:
    """AUROC (plain and pessimistic) of a ranking key [E] and the top-k precision, recall and F1 at each k."""
    rows: list[Row] = [("ranking", "auroc", "", auroc(key, truth)),
                       ("ranking", "auroc_pessimistic", "", pessimistic_auroc(key, truth))]
    top = topk_metrics(key, truth, ks, ranking="signed", seed=seed)  # key is already the ranking key
    for i, k in enumerate(top["k"]):
        rows += [("topk", stat, f"k={int(k)}", float(top[stat][i])) for stat in ("precision", "recall", "f1")]
    return rows


def score_vector_dataset(scores: np.ndarray, truth: np.ndarray, *, ks: Sequence[int], ranking: str = "absolute",
                         seed: Any = 0) -> list[Row]:
    """Rows of one dataset's single score vector [E] (a method without per-example scores, e.g. edge pruning's
    mask logits): the ``ranking`` and ``topk`` families only (no per-edge test: nothing to resample within a fit)."""
    from .resampling import spawn_seeds

    s_tie = spawn_seeds(seed, 3)[1]  # the tie stream score_dataset uses
    return _ranking_rows(ranking_key(np.asarray(scores, dtype=np.float64), ranking), np.asarray(truth, dtype=bool),
                         ks, s_tie)


def refit_rows(vectors: np.ndarray, plan: Any, truth: np.ndarray, *, ranking: str = "absolute",
               seed: Any = 0) -> list[Row]:
    """Family ``stability:refit`` at k = the truth's size: agreement of the top-k circuits of score vectors
    refitted on each bootstrap resample of one dataset (circuitstat.stats.stability.refit_stability; for
    per-example methods the resampled means), and how the consensus circuit {f >= 1/2} meets the truth."""
    from .stability import refit_stability

    truth = np.asarray(truth, dtype=bool)
    k = int(truth.sum())
    res = refit_stability(vectors, plan, [k], ranking=ranking, seed=seed, n_pair_resamples=plan.n_resamples,
                          n_rank_resamples=0)  # rank correlations are not reported here
    freq = res.inclusion_counts[0] / res.n_resamples
    cons = freq >= 0.5
    pk = res.per_k
    return [("stability:refit", "jaccard_mean", f"k={k}", float(pk["jaccard_mean"][0])),
            ("stability:refit", "jaccard_corrected", f"k={k}", float(pk["jaccard_corrected"][0])),
            ("stability:refit", "phi", f"k={k}", float(pk["phi"][0])),
            ("stability:refit", "consensus_recall", f"k={k}", float((cons & truth).sum() / k)),
            ("stability:refit", "consensus_false_edges", f"k={k}", float((cons & ~truth).sum()))]


def score_dataset(S: np.ndarray, truth: np.ndarray, *, ks: Sequence[int], alphas: Sequence[float] = (0.05, 0.1),
                  ranking: str = "absolute", n_resamples: int = 500, thresholds: Sequence[float] = (0.6, 0.75, 0.9),
                  n_subsamples: int = 100, seed: Any = 0) -> list[Row]:
    """Rows (family, statistic, param, value) of one dataset's scores S [N, E] against ``truth`` [E] (module doc)."""
    from .resampling import spawn_seeds

    S = np.asarray(S, dtype=np.float64)
    truth = np.asarray(truth, dtype=bool)
    s_test, s_tie, s_stab = spawn_seeds(seed, 3)
    rows = _ranking_rows(ranking_key(S.sum(0) / S.shape[0], ranking), truth, ks, s_tie)
    rows += _tests(S, truth, alphas, n_resamples, s_test)
    if S.shape[0] >= 4:
        rows += _stability(S, truth, int(truth.sum()), thresholds, n_subsamples, s_stab, ranking)
    return rows


def score_verified_dataset(approx: np.ndarray, exact: np.ndarray, labelled: np.ndarray, truth: np.ndarray, *,
                           ks: Sequence[int], alphas: Sequence[float] = (0.05, 0.1), ranking: str = "absolute",
                           seed: Any = 0) -> list[Row]:
    """Rows of one dataset's *verified* run against ``truth``: ``approx`` [N, E] on every prompt, ``exact`` [n, E] on
    the prompts ``labelled``; ranking and top-k by the PPI++ estimates of the mean exact effect, and the q-value
    selections of their intervals (family ``test:verified``; circuitstat.stats.verified)."""
    from .verified import verified_means

    truth = np.asarray(truth, dtype=bool)
    res = verified_means(approx, exact, labelled)
    key = ranking_key(res.estimate, ranking)
    rows: list[Row] = [("ranking", "auroc", "", auroc(key, truth)),
                       ("ranking", "auroc_pessimistic", "", pessimistic_auroc(key, truth))]
    top = topk_metrics(key, truth, ks, ranking="signed", seed=seed)
    for i, k in enumerate(top["k"]):
        rows += [("topk", stat, f"k={int(k)}", float(top[stat][i])) for stat in ("precision", "recall", "f1")]
    for a in alphas:
        m = selection_metrics(np.nan_to_num(res.qvalue, nan=1.0) <= a, truth)
        rows += [("test:verified", stat, f"q={a:g}", float(m[stat]))
                 for stat in ("fdp", "recall", "precision", "f1", "n_selected", "n_false")]
    return rows


def _fixed_truth_rows(rows: np.ndarray, truth: np.ndarray, evaluations: Any, true_value: float, n_resamples: int,
                      confidence_level: float, seed: Any) -> list[Row]:
    """The fixed-circuit interval rows of the true circuit on the dataset's population ``rows``: Fieller's set, the
    audit's fixed-circuit interval (circuitstat.stats.fieller; an unbounded set covers trivially, so the share bounded
    and the coverage among bounded sets are rows of their own, NaN where unbounded), and the former BCa interval of
    the bootstrap ratio beside it, named ``fixed_bca_*``."""
    from .faithfulness import fixed_circuit_interval
    from .fieller import fieller_over_plan
    from .resampling import ResamplingPlan

    mc, mM, m0 = evaluations.get(truth[None], rows)
    plan = ResamplingPlan.bootstrap(len(rows), n_resamples, seed)
    bca = fixed_circuit_interval(mc, mM, m0, plan, method="bca", confidence_level=confidence_level)
    lo, hi = float(bca.confidence_interval.low[0]), float(bca.confidence_interval.high[0])
    fie = fieller_over_plan(mc - m0[:, None], mM, m0, plan, confidence_level=confidence_level)
    bounded = fie.shape[0] == "bounded"
    covers = float(fie.covers(true_value)[0])
    return [("faithfulness", "fixed_estimate", "", float(fie.estimate[0])),
            ("faithfulness", "fixed_covers_truth", "", covers),
            ("faithfulness", "fixed_bounded", "", float(bounded)),
            ("faithfulness", "fixed_covers_truth_bounded", "", covers if bounded else float("nan")),
            ("faithfulness", "fixed_width_bounded", "", float(fie.high[0] - fie.low[0]) if bounded else float("nan")),
            ("faithfulness", "fixed_bca_covers_truth", "", float(lo <= true_value <= hi)),
            ("faithfulness", "fixed_bca_width", "", hi - lo)]


def _selected_rows(sel: Any, key: np.ndarray, truth: np.ndarray, evaluations: Any, true_value: float) -> list[Row]:
    """Coverage rows of a selection-aware interval ``sel`` of the top-|C| circuit of ranking ``key`` [E]."""
    lo, hi = float(sel.confidence_interval.low[0]), float(sel.confidence_interval.high[0])
    selected = np.zeros_like(truth)
    selected[np.argsort(-key, kind="stable")[:int(truth.sum())]] = True
    f_sel = float(evaluations.population_faithfulness(selected[None])[0])
    return [("faithfulness", "selected_estimate", "", float(sel.estimate[0])),
            ("faithfulness", "selected_covers_own", "", float(lo <= f_sel <= hi)),
            ("faithfulness", "selected_covers_truth", "", float(lo <= true_value <= hi)),
            ("faithfulness", "selected_is_truth", "", float((selected == truth).all()))]


def faithfulness_dataset(S: np.ndarray, rows: np.ndarray, truth: np.ndarray, evaluations: Any, *, true_value: float,
                         ranking: str = "absolute", n_resamples: int = 500, confidence_level: float = 0.95,
                         seed: Any = 0) -> list[Row]:
    """Coverage rows of the faithfulness intervals on one dataset (population ``rows`` of ``evaluations``).

    ``evaluations``: a circuitstat.stats.calibration_kinds.PopulationEvaluations over the population the dataset was
    drawn from; ``true_value``: the true circuit's faithfulness on the task's distribution (known by
    construction).
    """
    from .faithfulness import selection_aware_faithfulness
    from .folds import MIN_PER_FOLD
    from .resampling import spawn_seeds

    s_fix, s_sel = spawn_seeds(seed, 2)
    n, k = len(rows), int(truth.sum())
    out = _fixed_truth_rows(rows, truth, evaluations, true_value, n_resamples, confidence_level, s_fix)
    n_folds = min(5, n // MIN_PER_FOLD)
    if n_folds < 2:
        return out
    sel = selection_aware_faithfulness(S, lambda masks, r: evaluations.get(masks, rows[r]), [k], ranking=ranking,
                                       n_folds=n_folds, n_repeats=2, seed=s_sel, confidence_level=confidence_level)
    return out + _selected_rows(sel, ranking_key(S.sum(0) / n, ranking), truth, evaluations, true_value)


def faithfulness_refit_dataset(scores: np.ndarray, refit: Any, rows: np.ndarray, truth: np.ndarray, evaluations: Any, *,
                               true_value: float, ranking: str = "signed", n_folds: int = 4, n_repeats: int = 1,
                               n_resamples: int = 500, confidence_level: float = 0.95, seed: Any = 0) -> list[Row]:
    """``faithfulness_dataset``'s rows for a selection without per-example scores (a mask fit): ``scores`` [E]
    its fit on the dataset, ``refit(train_rows, seed) -> [E]`` its fit on dataset rows ``train_rows``
    (circuitstat.stats.faithfulness_refit: cross-fitted with one refit per fold)."""
    from .folds import MIN_PER_FOLD
    from .faithfulness_refit import refit_selection_faithfulness
    from .resampling import spawn_seeds

    s_fix, s_sel = spawn_seeds(seed, 2)
    n = len(rows)
    out = _fixed_truth_rows(rows, truth, evaluations, true_value, n_resamples, confidence_level, s_fix)
    n_folds = min(n_folds, n // MIN_PER_FOLD)
    if n_folds < 2 or n_folds * n_repeats < 3:
        return out
    sel = refit_selection_faithfulness(refit, scores, lambda masks, r: evaluations.get(masks, rows[r]),
                                       [int(truth.sum())], n_obs=n, ranking=ranking, n_folds=n_folds,
                                       n_repeats=n_repeats, seed=s_sel, confidence_level=confidence_level)
    return out + _selected_rows(sel, ranking_key(np.asarray(scores, dtype=np.float64), ranking), truth, evaluations,
                                true_value)


def summarise(rows: Sequence[dict], keys: Sequence[str], confidence_level: float = 0.95) -> list[dict]:
    """One row per group of ``keys`` + (family, statistic, param): the mean over datasets with its t interval."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in keys) + (r["family"], r["statistic"], r["param"])].append(r["value"])
    out = []
    for g, values in groups.items():
        s = over_datasets(np.asarray(values), confidence_level)
        out.append({**dict(zip(list(keys) + ["family", "statistic", "param"], g)), "estimate": s["mean"],
                    "se": s["se"], "ci_low": s["ci_low"], "ci_high": s["ci_high"], "spread_low": s["spread_low"],
                    "spread_high": s["spread_high"], "n_datasets": s["n_datasets"], "estimand": DATASET_ESTIMAND})
    return out


def fdr_rows(rows: Sequence[dict], keys: Sequence[str], z: float = 2.0) -> list[dict]:
    """FDR calibration per group of ``keys`` and test and alpha: realised FDR vs alpha (fdr_check) and power."""
    fdp: dict[tuple, list[float]] = defaultdict(list)
    rec: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if r["family"].startswith("test:") and r["statistic"] in ("fdp", "recall"):
            g = tuple(r[k] for k in keys) + (r["family"].split(":", 1)[1], float(r["param"].split("=", 1)[1]))
            (fdp if r["statistic"] == "fdp" else rec)[g].append(r["value"])
    out = []
    for g, values in fdp.items():
        c = fdr_check(np.asarray(values), g[-1], z=z)
        p = over_datasets(np.asarray(rec[g]))
        out.append({**dict(zip(list(keys) + ["test", "alpha"], g)), "fdr": c["fdr"], "fdr_mc_se": c["fdr_mc_se"],
                    "bound": c["bound"], "verdict": c["verdict"], "share_with_false": c["share_with_false"],
                    # a recall lies in [0, 1]: the t interval's ends are kept there (the schema says so); the
                    # power cannot lie outside, so the kept interval covers exactly when the t interval does
                    "power": p["mean"], "power_ci_low": float(np.clip(p["ci_low"], 0.0, 1.0)),
                    "power_ci_high": float(np.clip(p["ci_high"], 0.0, 1.0)),
                    "n_datasets": c["n_datasets"]})
    return out
