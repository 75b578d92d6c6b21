"""MIB-style CPR and CMD of the mask methods beside EAP, EAP-IG and exact patching, on the ground-truth models and a zoo model.

For each model and dataset d: every method ranks the edges on the dataset's N prompts (attribution methods by
|mean score|, mask methods by their learned log α, signed: a larger logit is a more open gate), and the circuits
of MIB's sizes (circuitstat.circuits.faithfulness.MIB_FRACTIONS, pruned as MIB's evaluation prunes) are scored on
another N prompts of the same task (MIB scores on its test split, not on the prompts the method saw): CPR = ∫ f dx
and CMD = ∫ |1 − f| dx over the fraction of edges x, f the ratio of means (Mueller et al. 2025, MIB; the area step
is circuitstat.circuits.faithfulness.curve_areas, checked against MIB's evaluate_area_under_curve in
tests/circuits/test_faithfulness.py). Counterfactual ablation in the evaluation, as MIB's. Cells are mean ± MC SE
over datasets (the dataset is the unit), with each method's CPU seconds per fit (one thread).

    OMP_NUM_THREADS=1 python bench/masks_cpr.py [--datasets 6] [--n 32] [--steps 40]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from circuitstat.circuits.attribution import attribute
from circuitstat.circuits.faithfulness import MIB_FRACTIONS, faithfulness_curve
from circuitstat.circuits.groundtruth import load_groundtruth
from circuitstat.circuits.mask_methods import fit_mask
from circuitstat.pipelines.parallel import single_threaded

MODELS = ["planted:induction?background=1", "planted:induction?background=3", "tracr:reverse", "tracr:frac_prevs",
          "zoo:attn-only-2l/seed-0"]  # a trained model (no known circuit): induction with the demo's options
METHODS = {  # label -> (method, options); mask methods in both ablation configurations
    "exact": ("exact", {}),
    "EAP": ("eap", {}),
    "EAP-IG (inputs)": ("eap-ig-inputs", {}),
    "edge pruning, counterfactual ablation": ("edge-pruning", {}),
    "edge pruning, optimal ablation": ("edge-pruning", {"ablation": "optimal"}),
    "UGS optimiser, counterfactual ablation": ("ugs", {}),
    "UGS (optimal ablation)": ("ugs", {"ablation": "optimal"}),
}
EVAL_OFFSET = 10_000  # the evaluation prompts' dataset seed: d + this, disjoint from the ranking prompts' d


class _Zoo:
    """A zoo model with the demo's induction task, shaped as a ground-truth model for this bench (no truth)."""

    def __init__(self, source: str) -> None:
        from circuitstat.pipelines.sources import LOCAL

        self.model = LOCAL.load(source)

    def task(self, n: int, seed: int):
        """The demo's induction prompts (seq_len 10, the tokens the model saw often), n of them, drawn by seed."""
        from circuitstat.pipelines.build import build_task

        return build_task(self.model, "induction", n=n, seed=seed, seq_len=10)


def _load(source: str):
    """The model and its task: a ground-truth model's, or a zoo model's induction."""
    return _Zoo(source) if source.startswith("zoo:") else load_groundtruth(source)


def _ranking_scores(gt, task, method: str, opts: dict, steps: int, d: int) -> tuple[np.ndarray, str, float]:
    """(the edge scores a circuit is cut from, the ranking, CPU seconds) of one method on one dataset."""
    t0 = time.process_time()
    if method in ("edge-pruning", "ugs"):
        fit = fit_mask(method, gt.model, task, seed=d, steps=steps, **opts)
        return fit.log_alpha.astype(np.float64), "signed", time.process_time() - t0
    sm = attribute(gt.model, task, method, progress=False, batch_size=64, seed=d)
    return np.asarray(sm.scores, dtype=np.float64).mean(0), "absolute", time.process_time() - t0


def _ms(x) -> str:
    """'mean ± MC SE' over datasets."""
    x = np.asarray(x, dtype=np.float64)
    return f"{x.mean():.3f} ± {x.std(ddof=1) / np.sqrt(len(x)):.3f}"


def main() -> None:
    """Print one row per model and method: CPR, CMD (mean ± MC SE over datasets) and seconds per fit."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", type=int, default=6)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    print(f"{args.datasets} datasets of {args.n} prompts ranking, {args.n} other prompts evaluating; mask fits "
          f"{args.steps} steps\n")
    print("| model | method | CPR (higher better) | CMD (lower better) | s / fit |")
    print("|---|---|---|---|---|")
    with single_threaded():
        for source in args.models.split(","):
            gt = _load(source)
            for label, (method, opts) in METHODS.items():
                cpr, cmd, secs = [], [], []
                for d in range(args.datasets):
                    scores, ranking, s = _ranking_scores(gt, gt.task(args.n, d), method, opts, args.steps, d)
                    curve = faithfulness_curve(gt.model, gt.task(args.n, d + EVAL_OFFSET), scores, ranking=ranking,
                                               fractions=MIB_FRACTIONS, prune=True, seed=d, progress=False)
                    cpr.append(curve.cpr), cmd.append(curve.cmd), secs.append(s)
                print(f"| {source} | {label} | {_ms(cpr)} | {_ms(cmd)} | {np.mean(secs):.2f} |", flush=True)


if __name__ == "__main__":
    main()
