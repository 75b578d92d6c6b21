"""Mask methods against the truth in both configurations: counterfactual vs optimal ablation (Li & Janson 2024), and
edge pruning's fixed penalty vs its target-sparsity Lagrangian (Bhaskar et al. 2024).

Per ground-truth model: one fit on N prompts (edge AUROC of its logits against the true circuit) and ``--refits``
fits on bootstrap resamples of them (mean pairwise Jaccard of their top-|C| circuits: refit stability), and the
CPU seconds of one fit (single thread).  Prints a markdown table (docs/edge-pruning.md).

    python bench/masks_optimal.py [--n 32] [--steps 40] [--refits 3] [--only target] [--models planted:...,tracr:...]
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from circuitstat.circuits.groundtruth import load_groundtruth
from circuitstat.circuits.mask_methods import fit_mask
from circuitstat.pipelines.groundtruth_masks import refit_mask
from circuitstat.pipelines.parallel import single_threaded
from circuitstat.stats import ResamplingPlan
from circuitstat.stats.groundtruth import auroc

MODELS = ["planted:induction?background=1", "planted:induction?background=3", "tracr:reverse", "tracr:frac_prevs"]
CONFIGS = {  # name -> (method, options)
    "UGS optimiser, counterfactual ablation": ("ugs", {}),
    "UGS (optimal ablation)": ("ugs", {"ablation": "optimal"}),
    "edge pruning, counterfactual, fixed penalty": ("edge-pruning", {}),
    "edge pruning, optimal ablation, fixed penalty": ("edge-pruning", {"ablation": "optimal"}),
    "edge pruning, counterfactual, target 0.9 (Lagrangian, KL)": ("edge-pruning", {"target": 0.9, "objective": "kl"}),
}


def _jaccard(vectors: np.ndarray, k: int) -> float:
    """Mean pairwise Jaccard of the refits' top-k sets (signed ranking)."""
    sets = [set(np.argsort(-v, kind="stable")[:k].tolist()) for v in vectors]
    return float(np.mean([len(a & b) / len(a | b) for a, b in itertools.combinations(sets, 2)]))


def main() -> None:
    """Print one row per model and configuration."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--refits", type=int, default=3)
    ap.add_argument("--n-samples", type=int, default=4)
    ap.add_argument("--only", default="", help="run only the configurations whose name contains this")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated ground-truth sources")
    args = ap.parse_args()
    print("| model | edges | |C| | configuration | AUROC | refit Jaccard (top-|C|) | kept / target | s per fit |")
    print("|---|---|---|---|---|---|---|---|")
    with single_threaded():
        for source in args.models.split(","):
            gt = load_groundtruth(source)
            task = gt.task(args.n, 0)
            k = int(gt.truth.sum())
            plan = ResamplingPlan.bootstrap(args.n, args.refits, 1)
            for name, (method, opts) in CONFIGS.items():
                if args.only not in name:
                    continue
                opts = {"steps": args.steps, **opts, **({"n_samples": args.n_samples} if method == "ugs" else {})}
                t0 = time.process_time()
                fit = fit_mask(method, gt.model, task, seed=0, **opts)
                secs = time.process_time() - t0
                V = refit_mask(gt.model, task, plan, seed=0, method=method, **opts)
                kept = int(fit.circuit_mask().sum())
                tgt = opts.get("target")
                kt = f"{kept} / {round((1 - tgt) * gt.truth.size)}" if tgt is not None else f"{kept} / -"
                print(f"| {source} | {gt.truth.size} | {k} | {fit.params['label']} | "
                      f"{auroc(fit.log_alpha.astype(np.float64), gt.truth):.2f} | {_jaccard(V, k):.2f} | {kt} | "
                      f"{secs:.2f} |", flush=True)


if __name__ == "__main__":
    main()
