"""Fieller's set against the former BCa interval for the true circuit of a planted model, on more datasets than the
ground-truth study's R = 20 (not a test; issue 47; docs/groundtruth.md "Faithfulness intervals").

The study's faithfulness family also selects and cross-fits a circuit per dataset, which costs a model run per
distinct selected circuit on every population prompt. The true circuit's fixed-circuit rows need only the true
circuit, the full model and the empty circuit on each prompt, so R disjoint datasets of each N are cheap here:
the same calls as circuitstat.stats.groundtruth_scoring's fixed rows (fieller_over_plan over a size-N bootstrap
plan, a union covering by membership; fixed_circuit_interval's BCa on the same plan), f = 1 by construction.

    python bench/groundtruth_fieller.py --background 3 --reps 200
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np

from circuitstat.circuits.faithfulness import faithfulness
from circuitstat.circuits.groundtruth import load_groundtruth
from circuitstat.stats.faithfulness import fixed_circuit_interval
from circuitstat.stats.fieller import fieller_over_plan
from circuitstat.stats.resampling import ResamplingPlan


def metrics(background: float, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return m(C_true), m(M), m(∅) [n] on n prompts of the planted model's task."""
    gt = load_groundtruth(f"planted:induction?background={background:g}")
    task = gt.task(n, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        r = faithfulness(gt.model, task, gt.truth[None], batch_size=64, progress=False)
    return np.asarray(r.m_circuit, np.float64)[:, 0], np.asarray(r.m_clean, np.float64), np.asarray(r.m_empty,
                                                                                                  np.float64)


def cell(mc: np.ndarray, mM: np.ndarray, m0: np.ndarray, n: int, reps: int, n_resamples: int) -> dict:
    """Coverage of f = 1 over `reps` disjoint datasets of size n: Fieller (all, bounded share, among bounded), BCa."""
    fie, bounded, bca = np.zeros(reps, bool), np.zeros(reps, bool), np.zeros(reps, bool)
    for r in range(reps):
        rows = np.arange(r * n, (r + 1) * n)
        plan = ResamplingPlan.bootstrap(n, n_resamples, r)
        f = fieller_over_plan((mc - m0)[rows, None], mM[rows], m0[rows], plan, confidence_level=0.95)
        fie[r], bounded[r] = f.covers(1.0)[0], f.shape[0] == "bounded"
        ci = fixed_circuit_interval(mc[rows], mM[rows], m0[rows], plan, method="bca").confidence_interval
        bca[r] = ci.low[0] <= 1.0 <= ci.high[0]
    se = lambda p, k: np.sqrt(p * (1 - p) / k) if k else float("nan")  # noqa: E731
    nb = int(bounded.sum())
    among = fie[bounded].mean() if nb else float("nan")
    return {"fieller": fie.mean(), "fieller_se": se(fie.mean(), reps), "bounded": bounded.mean(), "n_bounded": nb,
            "among_bounded": among, "among_se": se(among, nb), "bca": bca.mean(), "bca_se": se(bca.mean(), reps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--background", type=float, default=3.0)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--sizes", default="16,64,128")
    ap.add_argument("--n-resamples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=12345)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    mc, mM, m0 = metrics(args.background, args.reps * max(sizes), args.seed)
    print(f"planted bg={args.background:g}: {args.reps} disjoint datasets per N, B = {args.n_resamples}, f = 1")
    print("| N | Fieller covers | Fieller bounded | Fieller among bounded | former BCa covers |")
    print("|---|---|---|---|---|")
    for n in sizes:
        c = cell(mc, mM, m0, n, args.reps, args.n_resamples)
        print(f"| {n} | {c['fieller']:.3f} ± {c['fieller_se']:.3f} | {c['bounded']:.3f} ({c['n_bounded']}) | "
              f"{c['among_bounded']:.3f} ± {c['among_se']:.3f} | {c['bca']:.3f} ± {c['bca_se']:.3f} |")


if __name__ == "__main__":
    main()
