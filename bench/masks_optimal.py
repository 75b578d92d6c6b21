"""Mask methods against the truth in both configurations: counterfactual vs optimal ablation (Li & Janson 2024), and
edge pruning's fixed penalty vs its target-sparsity Lagrangian (Bhaskar et al. 2024), with the dataset as the unit.

Per ground-truth model, ``--datasets`` independent datasets of ``--n`` prompts (the ground truth's own task draw,
seed = the dataset's index); per dataset and configuration: one fit on the dataset (edge AUROC of its logits
against the true circuit, and how many of its top-|C| edges are true) and ``--refits`` fits on bootstrap resamples
of it (mean pairwise Jaccard of their top-|C| circuits: refit stability), and the CPU seconds of the fit (single
thread).  Every figure is the mean over datasets with its Monte Carlo standard error (sd / sqrt(datasets)); a
second table gives the paired difference optimal − counterfactual per method (same datasets, same seeds).

The configuration "... optimal ablation, constants frozen" is ``lr_constants: 0``: the constants stay at the
fit's mean outputs (mean ablation on the fit's prompts), the control that separates "a constant instead of a
counterfactual" from "the constant learned"; "... reference means" starts the constants of every fit and refit at
the mean outputs over a separate reference draw of 256 prompts (the source's ``compute_means.py`` procedure).

    python bench/masks_optimal.py [--n 32] [--steps 40] [--datasets 8] [--refits 3] [--only UGS]
        [--models planted:...,tracr:...]
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from circuitstat.circuits.groundtruth import load_groundtruth
from circuitstat.circuits.mask_methods import fit_mask
from circuitstat.circuits.optimal_ablation import OptimalAblation
from circuitstat.pipelines.runs.groundtruth.masks import refit_mask
from circuitstat.pipelines.parallel import single_threaded
from circuitstat.stats import ResamplingPlan
from circuitstat.stats.groundtruth import auroc

MODELS = ["planted:induction?background=1", "planted:induction?background=3", "tracr:reverse", "tracr:frac_prevs"]
CONFIGS = {  # name -> (method, options)
    "UGS optimiser, counterfactual ablation": ("ugs", {}),
    "UGS (optimal ablation)": ("ugs", {"ablation": "optimal"}),
    "UGS, optimal ablation, constants frozen": ("ugs", {"ablation": "optimal", "lr_constants": 0.0}),
    "edge pruning, counterfactual, fixed penalty": ("edge-pruning", {}),
    "edge pruning, optimal ablation, fixed penalty": ("edge-pruning", {"ablation": "optimal"}),
    "edge pruning, optimal ablation, constants frozen": ("edge-pruning", {"ablation": "optimal", "lr_constants": 0.0}),
    "edge pruning, counterfactual, target 0.9 (Lagrangian, KL)": ("edge-pruning", {"target": 0.9, "objective": "kl"}),
    "edge pruning, optimal ablation, target 0.9 (Lagrangian, KL)": ("edge-pruning", {"target": 0.9, "objective": "kl",
                                                                                     "ablation": "optimal"}),
    # the paper's node target default (target_layer_sparsity 0.72, princeton-nlp/Edge-Pruning src/prune/fpt2_ioi.py)
    "edge pruning, counterfactual, target 0.9, node masks (target 0.72) (Lagrangian, KL)": (
        "edge-pruning", {"target": 0.9, "objective": "kl", "node_masks": True, "node_target": 0.72}),
    "UGS, optimal ablation, reference means": ("ugs", {"ablation": "reference"}),
    "edge pruning, optimal ablation, reference means": ("edge-pruning", {"ablation": "reference"}),
}
REFERENCE_N, REFERENCE_SEED = 256, 10_000  # the source's means: a separate pass over the task (not a dataset's)
PAIRS = {  # method -> (counterfactual configuration, optimal configuration)
    "UGS": ("UGS optimiser, counterfactual ablation", "UGS (optimal ablation)"),
    "edge pruning": ("edge pruning, counterfactual, fixed penalty", "edge pruning, optimal ablation, fixed penalty"),
}


def _top(v: np.ndarray, k: int) -> set:
    """The top-k edges of a logit vector (signed ranking, ties broken by edge index)."""
    return set(np.argsort(-v, kind="stable")[:k].tolist())


def _jaccard(vectors: np.ndarray, k: int) -> float:
    """Mean pairwise Jaccard of the refits' top-k sets."""
    sets = [_top(v, k) for v in vectors]
    return float(np.mean([len(a & b) / len(a | b) for a, b in itertools.combinations(sets, 2)]))


def _one_dataset(gt, n: int, d: int, method: str, opts: dict, refits: int) -> dict:
    """One dataset's figures for one configuration: AUROC, true edges in the top-|C|, refit Jaccard, kept, seconds."""
    task = gt.task(n, d)
    k = int(gt.truth.sum())
    t0 = time.process_time()
    fit = fit_mask(method, gt.model, task, seed=d, **opts)
    secs = time.process_time() - t0
    V = refit_mask(gt.model, task, ResamplingPlan.bootstrap(n, refits, d), seed=d, method=method, **opts)
    true = set(np.flatnonzero(gt.truth).tolist())
    la = fit.log_alpha.astype(np.float64)
    return {"auroc": auroc(la, gt.truth), "hits": len(_top(la, k) & true) / k, "jaccard": _jaccard(V, k),
            "refit_auroc": float(np.mean([auroc(v.astype(np.float64), gt.truth) for v in V])),
            "refit_hits": float(np.mean([len(_top(v, k) & true) / k for v in V])),
            "kept": float(fit.circuit_mask().sum()), "secs": secs}


def _ms(x) -> str:
    """'mean ± MC SE' over datasets."""
    x = np.asarray(x, dtype=np.float64)
    return f"{x.mean():.2f} ± {x.std(ddof=1) / np.sqrt(len(x)):.2f}"


def _measure(args) -> dict:
    """{(source, configuration): [per-dataset dicts]}, printing the first table's rows as they come."""
    print("| model | edges | |C| | configuration | AUROC | top-|C| true share | refit Jaccard (top-|C|) | "
          "refit AUROC | "
          "refit top-|C| true share | kept | s / fit |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    out = {}
    for source in args.models.split(","):
        gt = load_groundtruth(source)
        for name, (method, opts) in CONFIGS.items():
            if args.only not in name:
                continue
            opts = {"steps": args.steps, **opts, **({"n_samples": args.n_samples} if method == "ugs" else {})}
            if opts.get("ablation") == "reference":  # one start for every dataset and refit
                opts["ablation"] = OptimalAblation.from_reference(gt.model, gt.task(REFERENCE_N, REFERENCE_SEED))
            rows = [_one_dataset(gt, args.n, d, method, opts, args.refits) for d in range(args.datasets)]
            out[(source, name)] = rows
            col = {key: [r[key] for r in rows] for key in rows[0]}
            print(f"| {source} | {gt.truth.size} | {int(gt.truth.sum())} | {name} | {_ms(col['auroc'])} | "
                  f"{_ms(col['hits'])} | {_ms(col['jaccard'])} | {_ms(col['refit_auroc'])} | "
                  f"{_ms(col['refit_hits'])} | {np.mean(col['kept']):.1f} | "
                  f"{np.mean(col['secs']):.2f} |", flush=True)
    return out


def _paired(out: dict, models: list[str]) -> None:
    """Print optimal − counterfactual per model and method, paired over datasets (mean ± MC SE)."""
    print("\n| model | method | Δ AUROC (optimal − counterfactual) | Δ refit Jaccard | Δ top-|C| true share |")
    print("|---|---|---|---|---|")
    for source in models:
        for method, (cf, oa) in PAIRS.items():
            if (source, cf) not in out or (source, oa) not in out:
                continue
            a, b = out[(source, cf)], out[(source, oa)]
            diff = {key: [y[key] - x[key] for x, y in zip(a, b)] for key in ("auroc", "jaccard", "hits")}
            print(f"| {source} | {method} | {_ms(diff['auroc'])} | {_ms(diff['jaccard'])} | {_ms(diff['hits'])} |")


def main() -> None:
    """Print one row per model and configuration, then the paired differences."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--datasets", type=int, default=8)
    ap.add_argument("--refits", type=int, default=3)
    ap.add_argument("--n-samples", type=int, default=4)
    ap.add_argument("--only", default="", help="run only the configurations whose name contains this")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated ground-truth sources")
    args = ap.parse_args()
    if args.datasets < 2 or args.refits < 2:
        raise SystemExit("--datasets and --refits must be at least 2 (an MC SE and a pairwise Jaccard need two)")
    with single_threaded():
        out = _measure(args)
    _paired(out, args.models.split(","))


if __name__ == "__main__":
    main()
