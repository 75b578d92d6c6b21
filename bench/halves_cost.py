"""Cost of the data-level stability intervals: the stability stage with J_{N/2} from halves against without.

    OMP_NUM_THREADS=1 python bench/halves_cost.py [--repeats 3]

One thread, CPU time (time.process_time), min / median / max of interleaved repeats, on a random score matrix of
the demo's audit shape scaled up (N = 64 prompts, E = 2,000 edges, B = 1,000 resamples, four k). Printed as ratios
against the stability stage without data-level intervals, timed in the same run (docs/calibration.md, "Data-level
stability"): the halves alone (circuitstat.stats.stability_halves.halves_stability), the stage with every
data-level interval, and that minus the halves.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from circuitstat.stats.stability import circuit_stability
from circuitstat.stats.stability_halves import halves_stability


def _cpu(fn) -> float:
    """Return the CPU seconds of one call of fn."""
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def main(argv: list[str] | None = None) -> int:
    """Time the three variants and print one line each; return the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    n, e, b, ks = 64, 2000, 1000, [10, 20, 50, 100]
    rng = np.random.default_rng(0)
    S = rng.standard_t(4, size=(n, e)) + rng.normal(0, 0.3, e)
    runs = {"stage without data-level intervals": lambda: circuit_stability(S, None, ks, ranking="absolute", seed=2,
                                                                            n_resamples=b, data_level=False),
            "stage with data-level intervals": lambda: circuit_stability(S, None, ks, ranking="absolute", seed=2,
                                                                         n_resamples=b, data_level=True),
            "halves alone (J_N/2 and its interval)": lambda: halves_stability(S, ks, ranking="absolute", seed=3)}
    times = {k: [] for k in runs}
    for _ in range(a.repeats):  # interleaved, so drift in the machine's load hits every variant alike
        for name, fn in runs.items():
            times[name].append(_cpu(fn))
    ref = np.median(times["stage without data-level intervals"])
    print(f"stability stage, N = {n}, E = {e}, B = {b}, k = {ks}; one thread, CPU time, {a.repeats} repeats")
    for name, t in times.items():
        print(f"  {name:40s} {min(t):.3f} / {np.median(t):.3f} / {max(t):.3f} s   {np.median(t) / ref:.2f} x")
    rest = np.median(times["stage with data-level intervals"]) - np.median(times["halves alone (J_N/2 and its interval)"])
    print(f"  {'stage with data-level, minus the halves':40s} {rest:.3f} s   {rest / ref:.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
