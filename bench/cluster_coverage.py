"""Per-edge coverage of the cluster-scheme intervals on templated populations (a Monte Carlo study, not a timing;
issue 49 part 1).

Each cell draws ``--datasets`` datasets of G templates x ``--per`` prompts from a templated population
(circuitstat.stats.populations.templated_datasets: a real score population with prompts of one template
correlated by the icc), and computes on every edge of every dataset the cluster default (wild cluster
bootstrap-t, CR2, G - 1 df), CR2 with t(G - 1) alone, the former default (BCa over resampled templates) and the
example bootstrap's default that ignores the templates (symmetric studentized), and the restricted wild cluster
bootstrap-t inverted into a confidence set ('wcr', circuitstat.stats.intervals.wcr) alone and joined with the
t(G - 1) interval ('wcr+t', the hull of the two: a bench column, not a method). Coverage is pooled over edges
and datasets with its Monte Carlo SE, datasets the unit (circuitstat.stats.calibration.clustered_rate); width is
the median ratio to the cluster default's. Populations: the zoo fixture, the planted model (background 3), and
the 3-layer MLP model's exact scores ('tails', tests/fixtures/tails-mlp3l-induction-exact.parquet; 80 of its
varying edges drawn once with seed 0, to keep the cost of the cell near the others').

    OMP_NUM_THREADS=1 python bench/cluster_coverage.py --population zoo --datasets 100
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from circuitstat.core.results import ConfidenceInterval
from circuitstat.stats import ResamplingPlan
from circuitstat.stats.calibration import clustered_rate
from circuitstat.stats.intervals import bootstrap_edges
from circuitstat.stats.populations import templated_datasets

METHODS = ("wild_cluster_t", "cr2_t", "wcr", "wcr+t", "bca", "example")


def load(name: str) -> np.ndarray:
    """The population: 'zoo' (exact zoo scores, 80 varying edges), 'planted' (planted induction, background 3, 50
    edges) or 'tails' (the 3-layer MLP model's exact scores, 80 of its varying edges)."""
    root = Path(__file__).resolve().parents[1] / "tests"
    sys.path.insert(0, str(root))
    from fixture_populations import load_planted_pair, load_zoo_fixture

    if name == "tails":
        pop = load_zoo_fixture(root / "fixtures" / "tails-mlp3l-induction-exact.parquet")[0]
        pop = pop[:, pop.std(axis=0) > 0]
        return pop[:, np.sort(np.random.default_rng(0).choice(pop.shape[1], 80, replace=False))]
    pop = load_zoo_fixture()[0] if name == "zoo" else load_planted_pair()[0]
    return pop[:, pop.std(axis=0) > 0]


def cell(pop: np.ndarray, g: int, per: int, icc: float, n_datasets: int, seed: int, b: int = 999) -> dict:
    """Return {method: (coverage, MC SE, median width / the default's)} of one (G, icc) cell."""
    x, groups = templated_datasets(pop, g, per, icc, n_datasets, seed=seed)
    e = pop.shape[1]
    mu = np.tile(pop.mean(axis=0), n_datasets)
    cl = bootstrap_edges(x, ResamplingPlan.cluster(groups, b, seed + 1), methods=["cr2_t", "wcr", "bca"])
    ex = bootstrap_edges(x, ResamplingPlan.bootstrap(x.shape[0], b, seed + 2))
    w, t = cl.intervals["wcr"], cl.intervals["cr2_t"]
    hull = ConfidenceInterval(np.minimum(w.low, t.low), np.maximum(w.high, t.high))
    ivs = {**cl.intervals, "wcr+t": hull, "example": ex.confidence_interval}
    ref = ivs["wild_cluster_t"].high - ivs["wild_cluster_t"].low
    out = {}
    for m in METHODS:
        lo, hi = ivs[m].low, ivs[m].high
        cov = ((lo <= mu) & (mu <= hi)).reshape(n_datasets, e)
        rate, se = clustered_rate(cov.sum(axis=1), np.full(n_datasets, e))
        out[m] = (rate, se, float(np.median((hi - lo) / ref)))
    return out


def main() -> None:
    """Print one row per (icc, G) cell."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--population", default="zoo", choices=("zoo", "planted", "tails"))
    ap.add_argument("--datasets", type=int, default=100)
    ap.add_argument("--per", type=int, default=8)
    ap.add_argument("--groups", default="4,5,8,12,20,50")
    ap.add_argument("--icc", default="0.05,0.3,0.7")
    a = ap.parse_args()
    pop = load(a.population)
    print("| population | icc | G | " + " | ".join(METHODS) + " | width vs default: " + " / ".join(METHODS[1:]) + " |")
    for icc in map(float, a.icc.split(",")):
        for g in map(int, a.groups.split(",")):
            r = cell(pop, g, a.per, icc, a.datasets, seed=1000 * g + int(100 * icc))
            cov = " | ".join(f"{r[m][0]:.3f} ± {r[m][1]:.3f}" for m in METHODS)
            wid = " / ".join(f"{r[m][2]:.2f}" for m in METHODS[1:])
            print(f"| {a.population} | {icc:g} | {g} | {cov} | {wid} |", flush=True)


if __name__ == "__main__":
    main()
