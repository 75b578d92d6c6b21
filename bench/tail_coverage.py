"""Per-edge coverage on heavy-tailed populations: the mean's interval where a flag calls it reliable, and the
robust estimands' own intervals (a Monte Carlo study, not a timing; issue 34 part 3).

For each population and N, ``--datasets`` datasets of N prompts are drawn with replacement; on each, every
edge gets the default mean interval (circuitstat.stats.intervals.bootstrap_edges, B = 999), the median's
order-statistic interval and the 20%-trimmed mean's Tukey-McLaughlin interval (circuitstat.stats.robust),
each checked against its own population estimand. Candidate flags for "the mean's interval can be trusted"
are scored by per-edge coverage among the cells they flag reliable (edges with >= 30 flagged cells). Prints
one block per population: pooled / worst-edge coverage of each interval, and per flag the worst edge's
flagged-reliable coverage and the share of cells flagged.

    OMP_NUM_THREADS=1 python bench/tail_coverage.py --datasets 200 [--parquet NAME=PATH ...]
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy.stats import kurtosis, trim_mean

from circuitstat.stats.intervals import bootstrap_edges
from circuitstat.stats.populations import (draw_datasets, single_spike_population, smooth_tail_population,
                                           spiky_population)
from circuitstat.stats.reliability import tail_share
from circuitstat.stats.robust import median_interval, trimmed_mean_interval

#: candidate flags: name -> rule on one dataset [N, E] (True = reliable)
FLAGS = {
    "tail_share<=0.6 (current)": lambda x: tail_share(x) <= 0.6,
    "tail_share<=0.4": lambda x: tail_share(x) <= 0.4,
    "kurtosis<=3": lambda x: kurtosis(x, axis=0) <= 3.0,
    "max|z|<=3.5": lambda x: (np.abs(x - x.mean(0)) / x.std(0, ddof=1)).max(0) <= 3.5,
}


def _populations(parquets: list[str], synthetic: bool = True) -> dict[str, np.ndarray]:
    """Return the populations by name: synthetic ones and any Parquet score tables (one column per edge)."""
    import pyarrow.parquet as pq

    out = {"spiky(2000,60,1)": spiky_population(2000, 60, seed=1),
           "smooth(2000,60,5)": smooth_tail_population(2000, 60, seed=5),
           "single-spike(2048,40,0)": single_spike_population(2048, 40, seed=0)} if synthetic else {}
    for item in parquets:
        name, path = item.split("=", 1)
        t = pq.read_table(path)
        cols = [c for c in t.column_names if t[c].type in ("float", "double")]
        out[name] = np.column_stack([t[c].to_numpy() for c in cols]).astype(np.float64)
    return out


def _edge_cov(hit: np.ndarray, mask: np.ndarray | None = None, min_cells: int = 30) -> tuple[float, float, int]:
    """Return (pooled, worst-edge coverage, edges counted) of hit [D, E] over the cells in mask."""
    mask = np.ones_like(hit) if mask is None else mask
    n = mask.sum(0)
    ok = n >= min_cells
    per = (hit & mask).sum(0)[ok] / n[ok]
    pooled = (hit & mask).sum() / max(mask.sum(), 1)
    return float(pooled), float(per.min()) if per.size else float("nan"), int(ok.sum())


def study(pop: np.ndarray, n: int, n_datasets: int, seed: int) -> dict[str, tuple]:
    """Return coverage figures of one population and N."""
    truth = {"mean": pop.mean(0), "median": np.median(pop, 0), "trimmed": trim_mean(pop, 0.2, axis=0)}
    hits = {k: [] for k in truth}
    flags = {k: [] for k in FLAGS}
    for d, rows in enumerate(draw_datasets(pop, n, n_datasets, seed=seed)):
        x = pop[rows]
        b = bootstrap_edges(x, n_resamples=999, seed=seed * 100003 + d)
        lo, hi = b.confidence_interval
        hits["mean"].append((lo <= truth["mean"]) & (truth["mean"] <= hi))
        for key, r in (("median", median_interval(x)), ("trimmed", trimmed_mean_interval(x))):
            hits[key].append((r.low <= truth[key]) & (truth[key] <= r.high))
        for k, rule in FLAGS.items():
            flags[k].append(rule(x))
    out = {k: _edge_cov(np.array(v)) for k, v in hits.items()}
    mean_hit = np.array(hits["mean"])
    for k, v in flags.items():
        f = np.array(v)
        out["flag " + k] = _edge_cov(mean_hit, f) + (float(f.mean()),)
    return out


def main() -> None:
    """Print the study's tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=200)
    ap.add_argument("--n", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--parquet", nargs="*", default=[], help="NAME=PATH of a score table (one column per edge)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-synthetic", action="store_true", help="only the --parquet populations")
    a = ap.parse_args()
    for name, pop in _populations(a.parquet, not a.no_synthetic).items():
        k = kurtosis(pop, axis=0)
        print(f"## {name}: {pop.shape[0]} prompts x {pop.shape[1]} edges; excess kurtosis deciles "
              + " ".join(f"{v:.0f}" for v in np.nanpercentile(k, np.arange(10, 100, 10))) + f", max {np.nanmax(k):.0f}")
        for n in a.n:
            res = study(pop, n, a.datasets, a.seed)
            for key, v in res.items():
                extra = f" flagged {v[3]:.3f}" if len(v) > 3 else ""
                print(f"N={n:4d} {key:28s} pooled {v[0]:.3f} worst edge {v[1]:.3f} ({v[2]} edges){extra}",
                      flush=True)


if __name__ == "__main__":
    main()
