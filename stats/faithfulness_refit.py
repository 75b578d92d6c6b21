"""Selection-aware faithfulness of a circuit whose selection is a refit, not a top-k of per-example scores.

A mask-learned circuit (edge pruning: circuitstat.circuits.edge_pruning) has no per-example scores whose
training-fold means could select each fold's circuit, so circuitstat.stats.faithfulness's cross-fitting is run
with the selection itself repeated: for each of ``n_repeats`` random splits into ``n_folds`` folds, the
selection is refitted on the other folds' prompts (``refit(train_rows, seed)``: a fresh seed per refit, from
the call's seed), its top-k circuit is evaluated on the held-out fold, and the corrected resampled t interval
(Nadeau & Bengio 2003; circuitstat.stats.faithfulness.corrected_t) is taken over the splits.  Its variance
inflation carries the variability of the refitted circuits (over prompts and over the optimisation's seeds),
so its estimand is procedure-level: the faithfulness of the selection procedure at N, averaged over refits
(ESTIMAND_SELECTED; Bates, Hastie & Tibshirani 2023 for cross-validation), not that of the one circuit a user
reports.  With ``refit`` = top-k of the training folds' mean scores it is exactly
``selection_aware_faithfulness(S, ...)`` (the tests check it), so the two intervals state the same estimand.

:func:`conditional_faithfulness` is the interval for the reported circuit itself (ESTIMAND_CONDITIONAL): one fit
on a random half of the prompts, whose top-k circuit is the one reported, and its fixed-circuit Fieller interval
(circuitstat.stats.fieller) on the other half.  Measured coverage: docs/edge-pruning.md, "Two estimands".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.seeds import as_seed_sequence, seed_record, spawn_seeds
from circuitstat.core.topk import ranking_key, topk_mask

from .faithfulness import (ESTIMAND_SELECTED, Evaluate, FaithfulnessInterval, corrected_t, crossfit, EvaluationCache,
                           topk_masks, ratio_of_means)
from .faithfulness_settings import check_selection_settings
from .fieller import FiellerInterval, fieller_faithfulness
from .folds import MIN_PER_FOLD, fold_split

__all__ = ["Refit", "refit_selection_faithfulness", "conditional_faithfulness", "ConditionalFaithfulness",
           "ESTIMAND_CONDITIONAL"]

#: ``refit(train_rows [n_train] int, seed) -> scores [E]``: the selection run on the training prompts only
Refit = Callable[[np.ndarray, np.random.SeedSequence], np.ndarray]


def _fold_means(refit: Refit, n: int, n_edges: int, seeds: list[np.random.SeedSequence], calls: list[int]):
    """The cross-fit's ``fold_means``: one refit per fold on the other folds' rows, each with the next seed."""
    def fold_means(split: list[np.ndarray]) -> np.ndarray:
        out = []
        for rows in split:
            train = np.setdiff1d(np.arange(n), rows)
            v = np.asarray(refit(train, seeds[calls[0]]), dtype=np.float64)
            calls[0] += 1
            if v.shape != (n_edges,) or not np.isfinite(v).all():
                raise InputError(f"refit returned scores of shape {v.shape} (or NaN/inf); it must return [{n_edges}] "
                                 "finite scores, one per edge")
            out.append(v)
        return np.stack(out)
    return fold_means


def refit_selection_faithfulness(refit: Refit, scores: np.ndarray, evaluate: Evaluate, ks: Sequence[int], *,
                                 n_obs: int, ranking: str = "signed", n_folds: int = 4, n_repeats: int = 1,
                                 seed: Any = None, confidence_level: float = 0.95, groups: np.ndarray | None = None,
                                 rtol: float = 1e-4, atol: float = 1e-6) -> FaithfulnessInterval:
    """Return the cross-fitted faithfulness of the top-k circuit of a refitted selection, with the corrected t interval.

    ``refit(train_rows, seed) -> [E]`` selects on the given rows of the ``n_obs`` prompts (called exactly
    ``n_folds x n_repeats`` times); ``scores`` [E]: the same selection on all of them (the circuit one
    reports, compared with the fold circuits in ``fold_circuit_jaccard``); ``evaluate`` as in
    circuitstat.stats.faithfulness.selection_aware_faithfulness; ``groups``: whole templates per fold.
    """
    scores = np.asarray(scores, dtype=np.float64)
    n, ks = int(n_obs), [int(k) for k in ks]
    if scores.ndim != 1 or scores.size < 2 or not np.isfinite(scores).all():
        raise InputError(f"scores must be one finite score per edge (at least 2 edges), got shape {scores.shape}")
    ranking_key(np.zeros(1), ranking)  # raises InputError for an unknown ranking
    if not ks or min(ks) < 1 or max(ks) >= scores.size:
        raise InputError(f"every k must lie in [1, {scores.size - 1}] (fewer than the {scores.size} edges), got {ks}")
    check_selection_settings("crossfit", "corrected-t", n, n_folds, n_repeats, None, confidence_level)
    if groups is not None and np.shape(groups) != (n,):
        raise InputError(f"groups must hold one label per example ({n}), got shape {np.shape(groups)}")
    root = as_seed_sequence(seed)
    # the first three children are selection_aware_faithfulness's (splits, plan, ties): the same folds
    split_seed, _, tie_seed, refit_seed = spawn_seeds(root, 4)
    tie_rng = np.random.default_rng(tie_seed)
    calls = [0]
    fold_means = _fold_means(refit, n, scores.size, spawn_seeds(refit_seed, n_folds * n_repeats), calls)
    cache = EvaluationCache(evaluate, n, scores.size)
    full_masks = topk_masks(scores, ks, ranking, tie_rng)
    held, folds, jac = crossfit(None, cache, ks, ranking, n_folds, n_repeats, split_seed, tie_rng, full_masks,
                                 None if groups is None else np.asarray(groups), fold_means=fold_means)
    theta = ratio_of_means(held, cache.m_clean, cache.m_empty, rtol=rtol, atol=atol)
    ci, se, df = corrected_t(theta, folds, cache.m_clean, cache.m_empty, n_folds, confidence_level)
    extra = {"fold_circuit_jaccard": jac, "t_df": np.full(len(ks), df, dtype=np.int64),
             "refits": np.full(len(ks), calls[0], dtype=np.int64),
             "evaluated_circuit_rows": np.full(len(ks), cache.circuit_rows, dtype=np.int64),
             "cost_vs_fixed": np.full(len(ks), cache.circuit_rows / (n * len(ks)))}
    params = {"estimator": "refit_selection_faithfulness", "scheme": "crossfit-refit", "ranking": ranking, "ks": ks,
              "method": "corrected-t", "confidence_level": confidence_level, "seed": seed_record(root), "plan": None,
              "rtol": rtol, "atol": atol, "estimand": ESTIMAND_SELECTED, "n_folds": n_folds, "n_repeats": n_repeats,
              "folds": "whole groups" if groups is not None else "examples",
              "selection": "top-k of a refit on the training folds (a fresh seed per refit)"}
    return FaithfulnessInterval(
        estimate=theta, confidence_interval=ci, intervals={"corrected-t": ci}, standard_error=se,
        method="corrected-t", confidence_level=confidence_level, estimand=ESTIMAND_SELECTED, n_obs=n, n_resamples=0,
        k=np.asarray(ks), extra=extra, params=params)


# --- the reported circuit's own interval (issue 47, item 8) -------------------------------------------------
#: what the conditional interval covers: the one circuit a user gets, fitted on half the prompts
ESTIMAND_CONDITIONAL = ("faithfulness on the prompt distribution of the reported circuit: the top-k circuit of one fit "
                        "on half the prompts, evaluated on the other half (Fieller; conditional on that circuit)")


@dataclass(frozen=True)
class ConditionalFaithfulness:
    """The half-fit circuits [C, E] (the reported ones), their held-out faithfulness and Fieller sets per k."""

    k: np.ndarray  # [C]
    masks: np.ndarray  # [C, E] the circuits fitted on fit_rows: the circuits this interval is about
    estimate: np.ndarray  # [C] ratio of means on eval_rows
    interval: FiellerInterval  # Fieller sets on eval_rows (hull, shape, notes)
    fit_rows: np.ndarray
    eval_rows: np.ndarray
    seed: dict

    def note(self, i: int) -> str:
        """Return how row i was computed, and the Fieller set's caveat when it is not bounded."""
        caveat = self.interval.notes()[i]
        return (f"the reported circuit: fitted on {self.fit_rows.size} prompts, its Fieller interval on the other "
                f"{self.eval_rows.size}" + (f"; {caveat}" if caveat else ""))


def conditional_faithfulness(refit: Refit, evaluate: Evaluate, ks: Sequence[int], *, n_obs: int,
                             ranking: str = "signed", seed: Any = None, confidence_level: float = 0.95,
                             groups: np.ndarray | None = None) -> ConditionalFaithfulness:
    """Fit once on a random half of the prompts (whole groups), take its top-k circuits, and return their Fieller
    interval on the other half: an interval for the faithfulness of those circuits, whose data did not choose them.

    Sample splitting (Cox 1975; Rinaldo et al. 2019): conditional on the fit half, the evaluation half is an
    independent sample, so the fixed-circuit interval (circuitstat.stats.fieller) covers the reported circuit."""
    n, ks = int(n_obs), [int(k) for k in ks]
    ranking_key(np.zeros(1), ranking)  # raises InputError for an unknown ranking
    if groups is not None and np.shape(groups) != (n,):
        raise InputError(f"groups must hold one label per example ({n}), got shape {np.shape(groups)}")
    if n < 2 * MIN_PER_FOLD:
        raise InputError(f"the conditional interval splits the prompts in two halves of at least {MIN_PER_FOLD}; "
                         f"{n} prompts are too few: add prompts")
    root = as_seed_sequence(seed)
    split_seed, fit_seed, tie_seed = spawn_seeds(root, 3)
    g = None if groups is None else np.asarray(groups)
    fit_rows, eval_rows = fold_split(np.random.default_rng(split_seed), n, 2, g)
    v = np.asarray(refit(fit_rows, fit_seed), dtype=np.float64)
    if v.ndim != 1 or v.size < 2 or not np.isfinite(v).all():
        raise InputError(f"refit returned scores of shape {v.shape} (or NaN/inf); it must return one finite score "
                         "per edge")
    if not ks or min(ks) < 1 or max(ks) >= v.size:
        raise InputError(f"every k must lie in [1, {v.size - 1}] (fewer than the {v.size} edges), got {ks}")
    masks = np.stack([topk_mask(v, k, ranking=ranking, seed=tie_seed) for k in ks])
    mc, mM, m0 = evaluate(masks, eval_rows)
    fi = fieller_faithfulness(mc, mM, m0, confidence_level=confidence_level,
                              groups=None if g is None else g[eval_rows])
    return ConditionalFaithfulness(np.asarray(ks), masks, fi.estimate, fi, fit_rows, eval_rows, seed_record(root))
