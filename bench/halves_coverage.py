"""Coverage of the J_{N/2} interval from disjoint halves (circuitstat.stats.stability_halves), per population, N, k.

    python bench/halves_coverage.py [--datasets 200] [--pairs 20000] [--set design|heldout|all|design2|heldout2|round2|round3]
                                    [--out FILE.json]

For each population (a finite matrix of per-example scores, rows drawn with replacement) and dataset size N:
the truth J_{N/2} is the mean Jaccard of the top-k circuits of --pairs independent pairs of datasets of N/2
rows; --datasets datasets of N rows each get the real estimator (halves_stability, default options). Printed
per (population, N, k): coverage with its binomial Monte Carlo SE (the dataset is the unit: one interval per
dataset and k), the median interval width over the width of a correct normal interval for the same estimator
(2 x 1.96 x its SD across datasets; the ratio's MC SE from a bootstrap over datasets), the misses below and
above, zero-width intervals, and the naive interval (T -+ 1.96 x SD over splits / sqrt(splits), the negative
control). Populations: "design" (the first round's rule was chosen on these) and "heldout" (reported, never
tuned on in the first round; seen once with the bootstrap SE). Second round (issue 49 item 2, the bootstrap SE's
critical value): "design2" adds to "design" three gapped populations (two of them reach J_{N/2} > 0.9);
"heldout2" is three new gapped populations (seeds fixed before any was measured); "round2" is "heldout2" plus "heldout".
Third round (issue 49 item 2, 2026-12-07): "round3" is "heldout2" and five populations this bench had never read
(bench/sample_size.py's fresh(): the mlp3l and mlp3ls next-token models' exact scores, smooth tails seed 50, spiky
seed 33; and the mlp4l next-token model's exact scores), fixed with its protocol (--datasets 400) before it was
run; it measured the grouped jackknife (then the product's rule) and the bootstrap SE under the rule fixed for the
round, which its result adopted (docs/calibration.md, "Third round").
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


def gapped(pop: np.ndarray, strength: float = 3.0) -> np.ndarray:
    """Return pop with its top edges pulled from the cut-off: ranks 1-5 by |mean| + 2 g, 6-10 + g (g = strength SD / sqrt 32)."""
    out = pop.copy()
    mean = pop.mean(axis=0)
    order = np.argsort(-np.abs(mean), kind="stable")
    g = strength * pop.std(axis=0) / np.sqrt(32.0)
    sign = np.where(mean < 0, -1.0, 1.0)
    for ranks, mult in ((order[:5], 2.0), (order[5:10], 1.0)):
        out[:, ranks] += mult * sign[ranks] * g[ranks]
    return out


def populations(which: str) -> dict[str, np.ndarray]:
    """Return the named populations of a set ("design", "heldout", "all", "design2", "heldout2" or "round2")."""
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
    design_new = {"spiky-gap-4101": lambda: gapped(spiky_population(2000, 100, seed=4101)),
                  "smooth-gap-4201": lambda: gapped(smooth_tail_population(2000, 80, seed=4201)),
                  "spiky-gap8-4102": lambda: gapped(spiky_population(2000, 100, seed=4102), 8.0)}
    heldout_new = {"spiky-gap-5101": lambda: gapped(spiky_population(2000, 90, seed=5101)),
                   "smooth-gap-5201": lambda: gapped(smooth_tail_population(2000, 90, seed=5201)),
                   "spiky-gap8-5102": lambda: gapped(spiky_population(2000, 90, seed=5102), 8.0)}
    chosen = {"design": design, "heldout": heldout, "all": {**design, **heldout},
              "design2": {**design, **design_new}, "heldout2": heldout_new,
              "round2": {**heldout_new, **heldout}, "round3": heldout_new}[which]
    pops = {name: make() for name, make in chosen.items()}
    if which == "round3":
        pops.update(_unread_populations())
    return pops


def _unread_populations() -> dict[str, np.ndarray]:
    """Return the populations this bench had never read before round 3 (sample_size.fresh() and mlp4l next-token)."""
    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT / "tests"))
    import sample_size
    from fixture_populations import load_planted_pair

    pops = {name.split(" (")[0].replace(" seed ", "-").replace(" ", "-"): pop
            for name, pop in sample_size.fresh().items()}
    pops["mlp4l-nexttoken"] = load_planted_pair(FIXTURES / "verified-mlp4l-nexttoken.parquet")[0]
    return pops


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
    return [{"n": n, **row} for row in summarise(res, tr, ks, np.random.default_rng(seed))]


def summarise(res: list[dict], tr: np.ndarray, ks: list[int], rng: np.random.Generator) -> list[dict]:
    """Return one row per k: coverage of the truth tr [k, (value, MC SE)] by the halves results res (one per dataset)."""
    n_datasets = len(res)
    out = []
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
        out.append({"k": k, "truth": t, "truth_mc_se": tr[i, 1], "bias": float(est.mean() - t),
                    "coverage": float(cover.mean()), "coverage_mc_se": float(np.sqrt(cover.mean() * (1 - cover.mean()) / n_datasets)),
                    "miss_low": float(np.mean(t < lo)), "miss_high": float(np.mean(t > hi)),
                    "width_ratio": float(ratio), "width_ratio_mc_se": float(np.std(ratio_b, ddof=1)),
                    "median_width": float(np.median(hi - lo)), "sd": float(est.std(ddof=1)),
                    "zero_width": int(np.sum(hi - lo <= 0)), "naive_coverage": float(naive.mean()),
                    "datasets": n_datasets})
    return out


#: the printed columns after a cell's own labels (population, N or G and icc), and one row's values for them
HEADER = (f"{'k':>3s} {'truth':>6s} {'cover':>6s} {'±MC':>5s} {'low':>5s} {'high':>5s} {'width/x':>7s} {'±MC':>5s} "
          f"{'zero':>4s} {'naive':>6s}")


def row_text(r: dict) -> str:
    """Return one summarise() row printed under HEADER."""
    return (f"{r['k']:3d} {r['truth']:6.3f} {r['coverage']:6.3f} {r['coverage_mc_se']:5.3f} {r['miss_low']:5.3f} "
            f"{r['miss_high']:5.3f} {r['width_ratio']:7.2f} {r['width_ratio_mc_se']:5.2f} {r['zero_width']:4d} "
            f"{r['naive_coverage']:6.3f}")


def main(argv: list[str] | None = None) -> int:
    """Run the grid and print one line per cell; return the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=20000)
    ap.add_argument("--set", default="design", choices=("design", "heldout", "all", "design2", "heldout2", "round2", "round3"))
    ap.add_argument("--ns", default="32,64,128")
    ap.add_argument("--ks", default="5,10,20")
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None, help="comma-separated population names of the set to run")
    ap.add_argument("--seed-base", type=int, default=1000, help="cell seeds are seed-base + N (other datasets)")
    a = ap.parse_args(argv)
    ks = [int(x) for x in a.ks.split(",")]
    results = []
    print(f"{'population':20s} {'N':>4s} {HEADER}")
    pops = populations(a.set)
    only = None if a.only is None else a.only.split(",")
    for name, pop in pops.items():
        if only is not None and name not in only:
            continue
        for n in (int(x) for x in a.ns.split(",")):
            for r in cell(pop, n, ks, a.datasets, a.pairs, seed=a.seed_base + n):
                r["population"] = name
                results.append(r)
                print(f"{name:20s} {n:4d} {row_text(r)}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
