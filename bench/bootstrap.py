"""Benchmark: per-edge percentile bootstrap CIs, circuitstat's engine vs scipy.stats.bootstrap.

Run: python bench/bootstrap.py [--edges 20000] [--scipy-edges 1000] [--full-scipy]

Both sides draw the same resamples (same integer seed: the engine draws exactly the indices
scipy draws), so their intervals must agree to rounding. scipy runs on a subset of edges (its
vectorised path materialises [edges, batch, N] resampled data) and its time is scaled linearly
to all edges; --full-scipy runs it on every edge. Peak memory of the engine is measured with
tracemalloc at E = 100,000 (the score matrix itself excluded: it exists before the call).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from scipy import stats

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from circuitstat.stats.intervals import bootstrap_edges  # noqa: E402


def _time(fn, repeat: int = 1):
    """Return (best wall time in seconds, last result) over `repeat` runs."""
    best, out = np.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--edges", type=int, default=20000)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--scipy-edges", type=int, default=1000)
    ap.add_argument("--full-scipy", action="store_true")
    ap.add_argument("--memory-edges", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    N, E, B, seed = args.n, args.edges, args.resamples, args.seed

    rng = np.random.default_rng(12345)
    S = (rng.standard_normal((N, E)) * rng.lognormal(0, 1, E)
         + rng.standard_normal(E)).astype(np.float32)

    rows = []
    t_eng, res = _time(lambda: bootstrap_edges(S, n_resamples=B, seed=seed, method="percentile"),
                       repeat=2)
    rows.append(("circuitstat percentile, n_jobs=1", t_eng, E))
    t_eng2, res2 = _time(lambda: bootstrap_edges(S, n_resamples=B, seed=seed,
                                                 method="percentile", n_jobs=2), repeat=2)
    rows.append(("circuitstat percentile, n_jobs=2", t_eng2, E))
    assert np.array_equal(res.confidence_interval.low, res2.confidence_interval.low)
    t_bca, _ = _time(lambda: bootstrap_edges(S, n_resamples=B, seed=seed, method="bca"))
    rows.append(("circuitstat BCa, n_jobs=1", t_bca, E))
    t_def, _ = _time(lambda: bootstrap_edges(S, n_resamples=B, seed=seed))
    rows.append(("circuitstat default (symmetric studentized), n_jobs=1", t_def, E))

    sub = E if args.full_scipy else min(args.scipy_edges, E)
    S_sub = S[:, :sub].astype(np.float64)  # float64 so scipy's means match to rounding
    batch = max(1, int(256 * 2**20 // (8 * N * sub)))  # scipy holds [sub, batch, N] float64
    t_sp, ref = _time(lambda: stats.bootstrap((S_sub,), np.mean, n_resamples=B, batch=batch,
                                              vectorized=True, axis=0, method="percentile",
                                              rng=np.random.default_rng(seed)))
    t_sp_all = t_sp * E / sub
    rows.append((f"scipy.stats.bootstrap percentile ({sub} edges{'' if sub == E else ', scaled'})",
                 t_sp_all, E))
    diff = max(np.abs(res.confidence_interval.low[:sub] - ref.confidence_interval.low).max(),
               np.abs(res.confidence_interval.high[:sub] - ref.confidence_interval.high).max())

    # peak memory at E = 100k: the chunked engine never holds [B, E] float64
    Em = args.memory_edges
    Sm = (rng.standard_normal((N, Em))).astype(np.float32)
    tracemalloc.start()
    t_mem, _ = _time(lambda: bootstrap_edges(Sm, n_resamples=B, seed=seed, method="percentile"))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)

    print(f"\nPer-edge percentile bootstrap CIs: N={N}, E={E}, B={B}, float32 scores, "
          f"{os.cpu_count()} CPUs")
    print(f"{'implementation':<52}{'time (s)':>10}{'edges/s':>12}")
    for name, t, e in rows:
        print(f"{name:<52}{t:>10.2f}{e / t:>12,.0f}")
    print(f"\nspeed-up vs scipy (n_jobs=1): {t_sp_all / t_eng:6.1f}x   (n_jobs=2): "
          f"{t_sp_all / t_eng2:6.1f}x")
    print(f"max |CI difference| vs scipy on {sub} edges, same resamples: {diff:.2e}")
    print(f"default interval / BCa time: {t_def / t_bca:.2f}")
    data_level_cost(seed)
    print(f"\nmemory at E={Em:,}, N={N}, B={B}: time {t_mem:.2f} s, tracemalloc peak "
          f"{peak / 2**20:.0f} MiB (score matrix {Sm.nbytes / 2**20:.0f} MiB not counted; a "
          f"[B, E] float64 array would be {8 * B * Em / 2**20:.0f} MiB); process max RSS, whole script incl. scipy run "
          f"{rss:.0f} MiB")


def data_level_cost(seed: int) -> None:
    """Print the stability stage's time with and without data-level intervals on the demo's shape."""
    from circuitstat.stats.stability import circuit_stability
    from circuitstat.stats.stability_data import METHODS
    from circuitstat.stats.stability_halves import halves_stability

    fixture = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "zoo-induction-exact.parquet"
    S = np.column_stack([c.to_numpy() for c in pq.read_table(fixture).columns])[:64].astype(np.float32)
    run = lambda level, method=METHODS[0]: circuit_stability(  # noqa: E731
        S, None, [5, 10, 20, 50], ranking="absolute", n_resamples=1000, seed=seed,
        data_level=level, data_level_method=method)
    t_off, _ = _time(lambda: run(False), repeat=20)
    print(f"\ncircuit stability on the demo's shape (N=64 zoo prompts, E=81, B=1000, k=5/10/20/50): "
          f"{t_off:.2f} s without data-level intervals")
    for method in (METHODS[0], "bracketed"):  # the default, and the former default
        t_on, _ = _time(lambda: run(True, method), repeat=20)
        print(f"  with data-level intervals, method {method:<13} {t_on:.2f} s = "
              f"{t_on / t_off:.2f}x the stage (issue 13's 3x budget is on the audit's stats stages)")
    # J_{N/2} from halves with its bootstrap SE, part of the data-level intervals above
    t_half, _ = _time(lambda: halves_stability(S, [5, 10, 20, 50], ranking="absolute", seed=seed), repeat=20)
    print(f"  of which J_N/2 from halves alone            {t_half:.2f} s = {t_half / t_off:.2f}x")


if __name__ == "__main__":
    main()
