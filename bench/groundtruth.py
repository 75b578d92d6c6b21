"""The ground-truth study's cost: attribution per model and method, scoring per dataset, faithfulness coverage.

For each ground-truth model (every tracr fixture and the planted induction model) and method: seconds per
prompt of the attribution (single-threaded, the fastest of ``--repeats``), and that as a multiple of one clean
forward on the same batch; then the per-dataset scoring (circuitstat.stats.groundtruth_scoring.score_dataset: AUROCs,
top-k, both per-edge tests with their bootstraps, stability selection) and the faithfulness family per
dataset, at each N.  With these a study's CPU time is about

    sum over models and methods of  (R x max N) x seconds/prompt  +  R x len(sizes) x (scoring + faithfulness)

(printed for the default spec at the end).

    python bench/groundtruth.py [--n 256] [--repeats 2] [--quick]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch

from circuitstat.circuits.attribution import METHODS, attribute
from circuitstat.circuits.groundtruth import load_groundtruth
from circuitstat.circuits.groundtruth.compiled import compiled_names
from circuitstat.pipelines.runs.groundtruth.study import DEFAULT_MODELS, GroundTruthSpec
from circuitstat.pipelines.parallel import single_threaded
from circuitstat.stats.groundtruth_scoring import score_dataset


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def attribution_costs(models: list[str], n: int, repeats: int) -> dict[tuple[str, str], float]:
    """Seconds per prompt of each (model, method), printed with the multiple of one clean forward."""
    out = {}
    print(f"{'model':<34} {'edges':>6} {'forward ms':>10} " + " ".join(f"{m:>18}" for m in METHODS))
    for source in models:
        gt = load_groundtruth(source)
        task = gt.task(n, 0)
        with torch.no_grad():
            fwd = _best(lambda: gt.model(task.clean), repeats)
        cells = []
        for method in METHODS:
            t = _best(lambda: attribute(gt.model, task, method, progress=False, batch_size=64), repeats)
            out[(source, method)] = t / n
            cells.append(f"{1e3 * t / n:8.2f} ms {t / fwd:6.0f}x")
        print(f"{source[:34]:<34} {gt.truth.size:>6} {1e3 * fwd:10.2f} " + " ".join(f"{c:>18}" for c in cells))
    return out


def scoring_costs(sizes: list[int], repeats: int, spec: GroundTruthSpec) -> dict[int, float]:
    """Seconds of score_dataset per dataset at each N, on the largest graph (dyck, 388 edges)."""
    gt = load_groundtruth("tracr:dyck")
    task = gt.task(max(sizes), 0)
    S = attribute(gt.model, task, "eap-ig-inputs", progress=False, batch_size=64).scores.astype(np.float64)
    out = {}
    for n in sizes:
        out[n] = _best(lambda: score_dataset(S[:n], gt.truth, ks=[6, 12, 24], alphas=spec.alphas,
                                             n_resamples=spec.n_resamples, n_subsamples=spec.n_subsamples), repeats)
        print(f"score_dataset N={n:<4} {out[n]:.3f} s per dataset (388 edges, B={spec.n_resamples})")
    return out


def faithfulness_cost(n: int, spec: GroundTruthSpec) -> float:
    """Seconds of the faithfulness family for one dataset of N prompts (planted model, population cached)."""
    from circuitstat.pipelines.runs.groundtruth.study import population_evaluations
    from circuitstat.stats.groundtruth_scoring import faithfulness_dataset

    gt = load_groundtruth(DEFAULT_MODELS[-2])
    task = gt.task(n, 0)
    S = attribute(gt.model, task, "exact", progress=False, batch_size=64).scores.astype(np.float64)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        evals = population_evaluations(gt, task, spec)
        faithfulness_dataset(S, np.arange(n), gt.truth, evals, true_value=1.0, n_resamples=spec.n_resamples)
    t = time.perf_counter() - t0
    print(f"faithfulness family N={n}: {t:.2f} s (population evaluations included; cached across datasets)")
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=256, help="prompts per attribution measurement")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="two models, fewer prompts")
    args = ap.parse_args()
    spec = GroundTruthSpec()
    models = ["tracr:reverse", DEFAULT_MODELS[-2]] if args.quick else [f"tracr:{p}" for p in compiled_names()] + \
        DEFAULT_MODELS[-2:-1]
    with single_threaded():
        per_prompt = attribution_costs(models, 64 if args.quick else args.n, args.repeats)
        scoring = scoring_costs(spec.sizes, args.repeats, spec)
        faith = faithfulness_cost(max(spec.sizes), spec)
    pop = spec.n_datasets * max(spec.sizes)
    n_models = len(DEFAULT_MODELS)
    attr = sum(per_prompt.values()) / len(models) * len(METHODS) * n_models * pop
    score = sum(scoring.values()) * spec.n_datasets * len(METHODS) * n_models
    print(f"default spec ({n_models} models x {len(METHODS)} methods, sizes {spec.sizes}, R={spec.n_datasets}): "
          f"about {attr:.0f} s attribution + {score:.0f} s scoring (upper bound: dyck's 388 edges for every model) "
          f"+ {faith * n_models:.0f} s faithfulness, on one core")


if __name__ == "__main__":
    main()
