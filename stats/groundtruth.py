"""Scoring circuit discovery against a known circuit, and summaries over repeated datasets.

Edge ranking against the truth:

* ``auroc``: the area under the ROC curve of the edge scores, ties counted half (the Mann-Whitney
  statistic U / (n_true n_false));
* ``pessimistic_auroc``: InterpBench's form (Gupta et al. 2024, arXiv 2407.14494): the area under the
  staircase through the ROC points that, between two points, first moves right (false positives) and
  only then up, sum_i (1 - FPR_i)(TPR_i - TPR_{i-1}).  For a ranking this credits a tie between a true
  and a false edge with nothing: it is P(true score > false score), strictly.

Selections against the truth: precision, recall, F1 and the false discovery proportion
FDP = V / max(R, 1) (V false edges among R selected; 0 when nothing is selected, as in the FDR's
definition).  Precision is NaN when nothing is selected.

Over repeated datasets (``over_datasets``): the mean of a per-dataset statistic with a t interval
whose estimand is the statistic's expected value over independent datasets of N prompts from the
task's distribution (valid because the R datasets are disjoint draws from that distribution), and
the 2.5-97.5 % spread of the per-dataset values, labelled as spread, not as an interval.
``fdr_check`` compares the realised FDR (mean FDP) with a level alpha, allowing its Monte Carlo error.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from scipy import stats as sps

from circuitstat.core.topk import ranking_key, topk_mask

__all__ = ["DATASET_ESTIMAND", "SPREAD_LABEL", "roc_points", "roc_on_grid", "auroc", "pessimistic_auroc",
           "selection_metrics",
           "topk_metrics", "over_datasets", "fdr_check"]

DATASET_ESTIMAND = ("the expected value of the statistic for a dataset of N prompts from the task's distribution "
                    "(t interval over R independent datasets)")
SPREAD_LABEL = "2.5-97.5% of the per-dataset values (spread over datasets, not an interval for the mean)"


def _check(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=bool).ravel()
    if s.shape != y.shape:
        raise ValueError(f"scores ({s.size}) and labels ({y.size}) differ in length")
    if not np.isfinite(s).all():
        raise ValueError("scores must be finite to be ranked")
    if y.all() or not y.any():
        raise ValueError("the truth must hold at least one true and one false edge for a ROC curve")
    return s, y


def roc_points(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (FPR, TPR) at every distinct score threshold, from (0, 0) to (1, 1); tied scores move together."""
    s, y = _check(scores, labels)
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(s) != 0), s.size - 1]  # end of each group of tied scores
    tp = np.cumsum(y)[last]
    fp = (last + 1) - tp
    return np.r_[0.0, fp / (~y).sum()], np.r_[0.0, tp / y.sum()]


def roc_on_grid(scores: np.ndarray, labels: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Return the ROC's TPR at each FPR of ``grid``: the largest TPR reached at an FPR no larger (a step
    function, so averaging over datasets is vertical averaging of ROC curves)."""
    fpr, tpr = roc_points(scores, labels)
    idx = np.searchsorted(fpr, np.asarray(grid, dtype=np.float64), side="right") - 1
    return np.maximum.accumulate(tpr)[np.clip(idx, 0, None)]


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Return the ROC area (trapezoids; ties count half): U / (n_true n_false)."""
    fpr, tpr = roc_points(scores, labels)
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))


def pessimistic_auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Return InterpBench's pessimistic ROC area: sum_i (1 - FPR_i)(TPR_i - TPR_{i-1}) (ties count nothing)."""
    fpr, tpr = roc_points(scores, labels)
    return float(np.sum((1 - fpr[1:]) * np.diff(tpr)))


def selection_metrics(selected: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Return n_selected, n_false, FDP, precision, recall and F1 of a selected edge set against the truth."""
    sel = np.asarray(selected, dtype=bool).ravel()
    y = np.asarray(labels, dtype=bool).ravel()
    if sel.shape != y.shape:
        raise ValueError(f"selection ({sel.size}) and labels ({y.size}) differ in length")
    r, tp = int(sel.sum()), int((sel & y).sum())
    precision = tp / r if r else float("nan")
    recall = tp / max(int(y.sum()), 1)
    f1 = 2 * tp / (r + int(y.sum())) if r + y.sum() else 0.0
    return {"n_selected": r, "n_false": r - tp, "fdp": (r - tp) / max(r, 1), "precision": precision,
            "recall": recall, "f1": f1}


def topk_metrics(scores: np.ndarray, labels: np.ndarray, ks: Sequence[int], *, ranking: str = "absolute",
                 seed: Any = 0) -> dict[str, np.ndarray]:
    """Return precision, recall and F1 [len(ks)] of the top-k edges (ties at the cut-off broken at random)."""
    s, y = _check(scores, labels)
    ranking_key(s[:1], ranking)  # an unknown ranking fails here
    out = {"k": np.asarray(ks, dtype=np.int64), "precision": [], "recall": [], "f1": []}
    for k in out["k"]:
        m = selection_metrics(topk_mask(s, int(k), ranking=ranking, seed=seed), y)
        for c in ("precision", "recall", "f1"):
            out[c].append(m[c])
    return {k: np.asarray(v) for k, v in out.items()}


def over_datasets(values: np.ndarray, confidence_level: float = 0.95) -> dict[str, float]:
    """Return mean, SE, t interval (estimand: DATASET_ESTIMAND) and spread of per-dataset values (NaN dropped)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[~np.isnan(v)]
    n = v.size
    out = {"mean": float(v.mean()) if n else float("nan"), "se": float("nan"), "ci_low": float("nan"),
           "ci_high": float("nan"), "spread_low": float("nan"), "spread_high": float("nan"), "n_datasets": n}
    if n:
        out["spread_low"], out["spread_high"] = (float(x) for x in np.quantile(v, [0.025, 0.975]))
    if n >= 2:
        se = float(v.std(ddof=1) / np.sqrt(n))
        half = float(sps.t.ppf(0.5 + confidence_level / 2, n - 1)) * se
        out.update(se=se, ci_low=out["mean"] - half, ci_high=out["mean"] + half)
    return out


def fdr_check(fdp: np.ndarray, alpha: float, *, z: float = 2.0) -> dict[str, Any]:
    """Return the realised FDR (mean FDP), its Monte Carlo SE, and whether FDR <= alpha + z SE holds.

    ``verdict``: 'holds' (mean FDP within alpha plus z Monte Carlo SEs), 'exceeded', or 'trivial' when no
    dataset made a false discovery, where the check cannot tell a calibrated test from one that rejects
    nothing (pair it with the power).
    """
    v = np.asarray(fdp, dtype=np.float64).ravel()
    n = v.size
    fdr = float(v.mean())
    se = float(v.std(ddof=1) / np.sqrt(n)) if n >= 2 else float("nan")
    bound = alpha + z * (se if np.isfinite(se) else 0.0)
    verdict = "trivial" if not (v > 0).any() else ("holds" if fdr <= bound else "exceeded")
    return {"alpha": float(alpha), "fdr": fdr, "fdr_mc_se": se, "bound": bound, "verdict": verdict,
            "n_datasets": n, "share_with_false": float((v > 0).mean()) if n else float("nan")}
