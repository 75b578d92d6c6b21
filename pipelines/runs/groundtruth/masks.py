"""The ground-truth study's rows for methods without per-example scores (edge pruning, UGS), and its
``stability:refit`` family for every method.

Edge pruning (circuitstat.circuits.edge_pruning) learns one mask logit per edge from a dataset: one vector, no
per-example scores.  Per dataset it is fitted once on the dataset's prompts (ranking and top-k rows, the mask
logits ranked signed: a larger logit is a more open gate) and, with ``refits`` >= 3, refitted on each of
``refits`` bootstrap resamples of the dataset (the resample's counts as example weights, a fresh seed per
refit: bootstrap over prompts and refits over seeds).  The refits' top-|C| circuits give the
``stability:refit`` rows (circuitstat.stats.groundtruth_scoring.refit_rows).  Per-example methods get the same
rows from the resampled means of their scores on the same kind of plan, so the column compares like with like.
Per-edge tests need per-example scores and are not computed for edge pruning.  UGS (circuitstat.circuits.ugs)
gets the same rows from its own fits (options ``ugs``), its logits ranked signed as edge pruning's.  With ``edge-pruning`` among
``faithfulness_methods`` each dataset also gets the ``faithfulness`` family: the fixed-circuit interval of the
true circuit and the selection-aware interval of the fit's top-|C| circuit, cross-fitted with one refit per
fold (``FAITHFULNESS_FOLDS`` folds, one repeat: each fold's masks fitted on the other folds' prompts, their
top-|C| circuit evaluated on the fold; circuitstat.stats.faithfulness_refit).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from circuitstat.pipelines.options import MASK_METHODS
from circuitstat.pipelines.spec import EdgePruningOptions

__all__ = ["MASK_METHODS", "FAITHFULNESS_FOLDS", "EdgePruningOptions", "refit_mask", "fold_refit", "edge_pruning_stability", "pruning_rows",
           "refit_stability_rows", "pruning_flops"]

#: cross-fitting folds of edge pruning's selection-aware faithfulness (one refit each, one repeat: fits are costly)
FAITHFULNESS_FOLDS = 4


def refit_mask(model, task, plan, *, rows=None, seed: Any = 0, method: str = "edge-pruning",
                       **options: Any) -> np.ndarray:
    """[B, E] mask logits of ``method`` (edge-pruning or ugs), one fit per resample of ``plan`` (its counts weight
    the prompts ``rows``, all by default), each from its own child of ``seed`` (the fit's other options as given)."""
    from circuitstat.circuits.mask_methods import fit_mask
    from circuitstat.core.seeds import spawn_seeds

    rows = np.arange(int(task.clean.shape[0])) if rows is None else np.asarray(rows)
    if plan.n_obs != len(rows):
        raise ValueError(f"the plan resamples {plan.n_obs} prompts but {len(rows)} rows were given")
    return np.stack([fit_mask(method, model, task, rows=rows, weights=plan.counts[b], seed=sb, **options).log_alpha
                     for b, sb in enumerate(spawn_seeds(seed, plan.n_resamples))])


def fold_refit(model, task, rows, method: str = "edge-pruning", **options: Any):
    """``refit(train, seed) -> [E]`` mask logits for circuitstat.stats.faithfulness_refit: ``method`` fitted on
    the dataset ``rows`` with weight 1 on positions ``train`` and 0 elsewhere (as refit_mask weights a
    resample's counts; rows of weight 0 take no part in the fit)."""
    from circuitstat.circuits.mask_methods import fit_mask

    rows = np.asarray(rows)

    def refit(train: np.ndarray, seed) -> np.ndarray:
        weights = np.zeros(len(rows))
        weights[np.asarray(train)] = 1.0
        return fit_mask(method, model, task, rows=rows, weights=weights, seed=seed, **options).log_alpha
    return refit


def edge_pruning_stability(model, task, plan, ks, *, rows=None, seed: Any = 0, **options: Any):
    """The circuitstat.stats.stability StabilityResult of edge pruning's top-k circuits (k in ``ks``), refitted on
    every resample of ``plan`` (bootstrap over prompts, a fresh seed per refit; the logits ranked signed)."""
    from circuitstat.stats.stability import refit_stability

    vectors = refit_mask(model, task, plan, rows=rows, seed=seed, **options)
    return refit_stability(vectors, plan, ks, ranking="signed", seed=seed)


def _ks(gt, spec) -> list[int]:
    k_true = int(gt.truth.sum())
    return sorted({max(1, int(round(m * k_true))) for m in spec.k_multiples} - {gt.truth.size})


def _datasets(spec, seed):
    """(n, r, population rows, seed) of every dataset, in the order and with the seeds of _dataset_rows."""
    from circuitstat.core.seeds import spawn_seeds

    block = max(spec.sizes)
    seeds = iter(spawn_seeds(seed, len(spec.sizes) * spec.n_datasets))
    for n in spec.sizes:
        for r in range(spec.n_datasets):
            yield n, r, np.arange(r * block, r * block + n), next(seeds)


def _row(method: str, n: int, r: int, vals) -> list[dict]:
    return [{"model": "", "method": method, "n": n, "dataset": r, "family": f, "statistic": st, "param": p,
             "value": float(v)} for f, st, p, v in vals]


def pruning_rows(gt, task, spec, seed, roc_grid: np.ndarray, evals=None, method: str = "edge-pruning") -> list[dict]:
    """Every per-dataset row of mask-learned ``method`` (edge-pruning or ugs; options spec.edge_pruning or spec.ugs)
    on one model: a fit per dataset (ROC points at ``roc_grid``), ``spec.refits`` refits per dataset, and with
    ``evals`` (the model's PopulationEvaluations) the faithfulness family, one refit per cross-fitting fold."""
    from circuitstat.circuits.mask_methods import fit_mask
    from circuitstat.pipelines.spec import mask_spec
    from circuitstat.core.seeds import spawn_seeds
    from circuitstat.stats import ResamplingPlan
    from circuitstat.stats.groundtruth import roc_on_grid
    from circuitstat.stats.groundtruth_scoring import faithfulness_refit_dataset, refit_rows, score_vector_dataset

    opts = mask_spec(spec, method).fit_options()
    out = []
    for n, r, rows, s in _datasets(spec, seed):
        s_fit, s_plan, s_score, s_faith = spawn_seeds(s, 4)  # the first three as before the faithfulness family
        fit = fit_mask(method, gt.model, task, rows=rows, seed=s_fit, batch_size=spec.batch_size, **opts)
        vals = score_vector_dataset(fit.log_alpha, gt.truth, ks=_ks(gt, spec), ranking="signed", seed=s_score)
        vals += [("roc", "tpr", f"fpr={x:.2f}", float(t))
                 for x, t in zip(roc_grid, roc_on_grid(fit.log_alpha.astype(np.float64), gt.truth, roc_grid))]
        if spec.refits >= 3:
            plan = ResamplingPlan.bootstrap(n, spec.refits, s_plan)
            vectors = refit_mask(gt.model, task, plan, rows=rows, seed=s_fit, batch_size=spec.batch_size,
                                         method=method, **opts)
            vals += refit_rows(vectors, plan, gt.truth, ranking="signed", seed=s_plan)
        if evals is not None:
            refit = fold_refit(gt.model, task, rows, method, batch_size=spec.batch_size, **opts)
            vals += faithfulness_refit_dataset(fit.log_alpha, refit, rows, gt.truth, evals, true_value=1.0,
                                               ranking="signed", n_folds=FAITHFULNESS_FOLDS, n_repeats=1,
                                               n_resamples=spec.n_resamples, confidence_level=spec.confidence_level,
                                               seed=s_faith)
        out += _row(method, n, r, vals)
    return out


def refit_stability_rows(S: np.ndarray, gt, spec, method: str, seed) -> list[dict]:
    """``stability:refit`` rows of a per-example method: its resampled means on each dataset's bootstrap plan."""
    from circuitstat.core.seeds import spawn_seeds
    from circuitstat.stats import ResamplingPlan
    from circuitstat.stats.groundtruth_scoring import refit_rows
    from circuitstat.stats.resampling import resampled_means

    out = []
    for n, r, rows, s in _datasets(spec, seed):
        s_plan = spawn_seeds(s, 3)[1]
        plan = ResamplingPlan.bootstrap(n, spec.refits, s_plan)
        vals = refit_rows(resampled_means(S[rows], plan).T, plan, gt.truth, ranking=spec.ranking, seed=s_plan)
        out += _row(method, n, r, vals)
    return out


def pruning_flops(spec, cfg, n_edges: int, method: str = "edge-pruning") -> float:
    """Operations of the study's fits of mask-learned ``method`` on one model: per dataset 1 + refits (+ folds, for
    the faithfulness family) fits of ``steps`` forward-and-backward passes (about 3 forwards; UGS: n_samples of
    them) over its prompts, plus the clean and empty runs, plus the faithfulness family's circuit runs on the
    population."""
    from circuitstat.circuits.plan import forward_flops
    from circuitstat.pipelines.spec import mask_draws, mask_spec

    if method not in spec.methods:
        return 0.0
    fwd = forward_flops(cfg, int(cfg.n_ctx))
    opts = mask_spec(spec, method)
    passes = opts.steps * mask_draws(method, opts)
    fits = 1 + (spec.refits if spec.refits >= 3 else 0)
    if method in spec.faithfulness_methods:  # one refit per fold, and the circuits' runs on the population
        fits += FAITHFULNESS_FOLDS
        evals = spec.n_datasets * len(spec.sizes) * (spec.n_datasets * max(spec.sizes) + 3 * max(spec.sizes)) * fwd
    else:
        evals = 0.0
    return float(sum(spec.n_datasets * fits * n * fwd * (3 * passes + 2) for n in spec.sizes)) + evals


def describe(spec: Any) -> dict:
    """The spec keys this module reads, for the evaluate stage's parameters."""
    return {"refits": spec.refits, "edge_pruning": spec.edge_pruning.model_dump(), "ugs": spec.ugs.model_dump()}
