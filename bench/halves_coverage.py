"""Coverage of the J_{N/2} interval from disjoint halves (circuitstat.stats.stability_halves), per population, N, k.

    python bench/halves_coverage.py [--datasets 200] [--pairs 20000] [--set design|heldout|all] [--out FILE.json]

For each population (a finite matrix of per-example scores, rows drawn with replacement) and dataset size N:
the truth J_{N/2} is the mean Jaccard of the top-k circuits of --pairs independent pairs of datasets of N/2
rows; --datasets datasets of N rows each get the real estimator (halves_stability, default options). Printed
per (population, N, k): coverage with its binomial Monte Carlo SE (the dataset is the unit: one interval per
dataset and k), the median interval width over the width of a correct normal interval for the same estimator
(2 x 1.96 x its SD across datasets; the ratio's MC SE from a bootstrap over datasets), the misses below and
above, zero-width intervals, and the naive interval (T -+ 1.96 x SD over splits / sqrt(splits), the negative
control). Populations: "design" (the rule was chosen on these) and "heldout" (reported, never tuned on).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def populations(which: str) -> dict[str, np.ndarray]:
    """Return the named populations of a set ("design", "heldout" or "all")."""
    from circuitstat.stats.populations import smooth_tail_population, spiky_population

    def fixture(name: str) -> np.ndarray:
        t = pq.read_table(FIXTURES / f"{name}.parquet")
        return np.column_stack([t.column(c).to_numpy() for c in t.column_names]).astype(np.float64)

    design = {"spiky-1": lambda: spiky_population(2000, 100, seed=1),
              "smooth-5": lambda: smooth_tail_population(2000, 100, seed=5),
              "smooth-2026": lambda: smooth_tail_population(2000, 60, seed=2026),
              "zoo": lambda: fixture("zoo-induction-exact")}
    heldout = {"spiky-9": lambda: spiky_population(2000, 80, seed=9),
               "spiky-13": lambda: spiky_population(2000, 90, seed=13),
               "smooth-31": lambda: smooth_tail_population(2000, 80, seed=31),
               "smooth-77": lambda: smooth_tail_population(2000, 90, seed=77),
               "tails-mlp3l": lambda: fixture("tails-mlp3l-induction-exact"),
               "tails-mlp4l-rotary": lambda: fixture("tails-mlp4l-rotary-induction-exact")}
    chosen = {"design": design, "heldout": heldout, "all": {**design, **heldout}}[which]
    return {name: make() for name, make in chosen.items()}


def truth(pop: np.ndarray, m: int, ks: list[int], n_pairs: int, seed: int) -> np.ndarray:
    """Return the Monte Carlo J_m per k and its MC SE: mean Jaccard of top-k of independent size-m datasets."""
    from circuitstat.core.topk import topk
    from circuitstat.stats.stability_halves import pair_jaccard

    rng = np.random.default_rng(seed)
    out = np.zeros((len(ks), 2))
    chunk = 2000
    vals = [[] for _ in ks]
    for start in range(0, n_pairs, chunk):
        n = min(chunk, n_pairs - start)
        m1 = pop[rng.integers(0, pop.shape[0], (n, m))].mean(axis=1)
        m2 = pop[rng.integers(0, pop.shape[0], (n, m))].mean(axis=1)
        for i, k in enumerate(ks):
            a = topk(m1, k, ranking="absolute", seed=rng).indices
            b = topk(m2, k, ranking="absolute", seed=rng).indices
            vals[i].append(pair_jaccard(a, b))
    for i in range(len(ks)):
        v = np.concatenate(vals[i])
        out[i] = v.mean(), v.std(ddof=1) / np.sqrt(v.size)
    return out


def cell(pop: np.ndarray, n: int, ks: list[int], n_datasets: int, n_pairs: int, seed: int) -> list[dict]:
    """Return one result row per k for datasets of n rows of pop."""
    from circuitstat.stats.populations import draw_datasets
    from circuitstat.stats.stability_halves import halves_stability

    tr = truth(pop, n // 2, ks, n_pairs, seed)
    rows = draw_datasets(pop, n, n_datasets, seed=seed + 1)
    res = [halves_stability(pop[r], ks, ranking="absolute", seed=seed + 2 + d) for d, r in enumerate(rows)]
    out = []
    rng = np.random.default_rng(seed)
    for i, k in enumerate(ks):
        est = np.array([r["jaccard_half"][i] for r in res])
        lo = np.array([r["jaccard_half_ci_low"][i] for r in res])
        hi = np.array([r["jaccard_half_ci_high"][i] for r in res])
        mc = np.array([r["jaccard_half_mc_se"][i] for r in res])
        t = tr[i, 0]
        cover = (lo <= t) & (t <= hi)
        ratio = np.median(hi - lo) / (2 * 1.96 * est.std(ddof=1))
        boot = rng.integers(0, n_datasets, (500, n_datasets))
        ratio_b = [np.median((hi - lo)[b]) / (2 * 1.96 * est[b].std(ddof=1)) for b in boot]
        naive = (est - 1.96 * mc <= t) & (t <= est + 1.96 * mc)
        out.append({"n": n, "k": k, "truth": t, "truth_mc_se": tr[i, 1], "bias": float(est.mean() - t),
                    "coverage": float(cover.mean()), "coverage_mc_se": float(np.sqrt(cover.mean() * (1 - cover.mean()) / n_datasets)),
                    "miss_low": float(np.mean(t < lo)), "miss_high": float(np.mean(t > hi)),
                    "width_ratio": float(ratio), "width_ratio_mc_se": float(np.std(ratio_b, ddof=1)),
                    "median_width": float(np.median(hi - lo)), "sd": float(est.std(ddof=1)),
                    "zero_width": int(np.sum(hi - lo <= 0)), "naive_coverage": float(naive.mean()),
                    "datasets": n_datasets})
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the grid and print one line per cell; return the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=20000)
    ap.add_argument("--set", default="design", choices=("design", "heldout", "all"))
    ap.add_argument("--ns", default="32,64,128")
    ap.add_argument("--ks", default="5,10,20")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    ks = [int(x) for x in a.ks.split(",")]
    results = []
    print(f"{'population':20s} {'N':>4s} {'k':>3s} {'truth':>6s} {'cover':>6s} {'±MC':>5s} {'low':>5s} {'high':>5s} "
          f"{'width/x':>7s} {'±MC':>5s} {'zero':>4s} {'naive':>6s}")
    for name, pop in populations(a.set).items():
        for n in (int(x) for x in a.ns.split(",")):
            for r in cell(pop, n, ks, a.datasets, a.pairs, seed=1000 + n):
                r["population"] = name
                results.append(r)
                print(f"{name:20s} {n:4d} {r['k']:3d} {r['truth']:6.3f} {r['coverage']:6.3f} {r['coverage_mc_se']:5.3f} "
                      f"{r['miss_low']:5.3f} {r['miss_high']:5.3f} {r['width_ratio']:7.2f} {r['width_ratio_mc_se']:5.2f} "
                      f"{r['zero_width']:4d} {r['naive_coverage']:6.3f}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
