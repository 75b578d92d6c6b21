"""Coverage of the J_{N/2} interval under a cluster plan (whole templates as the units), on templated populations.

    OMP_NUM_THREADS=1 python bench/halves_cluster_coverage.py [--population zoo|planted|tails] [--datasets 200]
                                                             [--templates 8,20,50] [--per 4] [--icc 0.1,0.5]

Each dataset holds G templates x --per prompts from a templated population (circuitstat.stats.populations.
templated_datasets: prompts of one template correlate by the icc; bench/cluster_coverage.py's populations), and
gets halves_stability with the templates as its groups (halves of the templates, the bootstrap of templates). The
truth is the mean Jaccard of the top-k circuits of --pairs independent pairs of datasets of floor(G/2) templates x
--per prompts (what the halves estimate). Printed per (G, icc, k) as bench/halves_coverage.py prints a cell:
coverage with its binomial MC SE (the dataset is the unit), misses below and above, the median width over a
correct normal interval's, zero widths and the naive interval (the negative control).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_coverage import load  # noqa: E402
from halves_coverage import HEADER, row_text, summarise  # noqa: E402

from circuitstat.core.topk import topk  # noqa: E402
from circuitstat.stats.populations import templated_datasets  # noqa: E402
from circuitstat.stats.stability_halves import halves_stability, pair_jaccard  # noqa: E402


def _means(pop: np.ndarray, g: int, per: int, icc: float, n: int, seed: int) -> np.ndarray:
    """Return [n, E]: the mean scores of n independent templated datasets of g templates x per prompts."""
    x, _ = templated_datasets(pop, g, per, icc, n, seed=seed)
    return x.reshape(g * per, n, pop.shape[1]).mean(axis=0)


def truth(pop: np.ndarray, g: int, per: int, icc: float, ks: list[int], n_pairs: int, seed: int) -> np.ndarray:
    """Return [k, (J, MC SE)]: the mean Jaccard of top-k circuits of independent datasets of g templates x per."""
    rng = np.random.default_rng(seed)
    vals = [[] for _ in ks]
    for c, start in enumerate(range(0, n_pairs, 1000)):
        n = min(1000, n_pairs - start)
        m1, m2 = (_means(pop, g, per, icc, n, seed=10 * seed + 2 * c + j) for j in (0, 1))
        for i, k in enumerate(ks):
            vals[i].append(pair_jaccard(topk(m1, k, ranking="absolute", seed=rng).indices,
                                        topk(m2, k, ranking="absolute", seed=rng).indices))
    return np.array([[np.concatenate(v).mean(), np.concatenate(v).std(ddof=1) / np.sqrt(n_pairs)] for v in vals])


def cell(pop: np.ndarray, g: int, per: int, icc: float, ks: list[int], n_datasets: int, n_pairs: int,
         seed: int) -> list[dict]:
    """Return one row per k for n_datasets templated datasets of g templates x per prompts."""
    tr = truth(pop, g // 2, per, icc, ks, n_pairs, seed)
    x, groups = templated_datasets(pop, g, per, icc, n_datasets, seed=seed + 1)
    x = x.reshape(g * per, n_datasets, pop.shape[1])
    res = [halves_stability(x[:, d], ks, ranking="absolute", groups=groups, seed=seed + 2 + d)
           for d in range(n_datasets)]
    return [{"templates": g, "per": per, "icc": icc, **row}
            for row in summarise(res, tr, ks, np.random.default_rng(seed))]


def main(argv: list[str] | None = None) -> int:
    """Run the grid and print one line per cell; return the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--population", default="zoo", choices=("zoo", "planted", "tails"))
    ap.add_argument("--datasets", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=10000)
    ap.add_argument("--templates", default="8,20,50")
    ap.add_argument("--per", type=int, default=4)
    ap.add_argument("--icc", default="0.1,0.5")
    ap.add_argument("--ks", default="5,10,20")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    pop, ks = load(a.population), [int(k) for k in a.ks.split(",")]
    print(f"{'population':10s} {'G':>3s} {'icc':>4s} {HEADER}")
    results = []
    for g in (int(x) for x in a.templates.split(",")):
        for icc in (float(x) for x in a.icc.split(",")):
            for r in cell(pop, g, a.per, icc, ks, a.datasets, a.pairs, seed=3000 + g + int(100 * icc)):
                r["population"] = a.population
                results.append(r)
                print(f"{a.population:10s} {g:3d} {icc:4.2f} {row_text(r)}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
