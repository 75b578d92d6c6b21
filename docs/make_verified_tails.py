"""Print docs/verified.md's tail miss rates of verified intervals at the levels BH over many edges leans on (0.99, 0.998).

Run from the repository root (about 2 minutes on one core):
    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/make_verified_tails.py ["mlp3l next-token" ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fixture_populations import load_planted_pair, load_zoo_pair  # noqa: E402
from circuitstat.stats.verified.coverage import paired_population, simulate_verified  # noqa: E402
from circuitstat.stats.verified.ppi import DEFAULT_INTERVAL  # noqa: E402


def main(N: int = 512, D: int = 1000) -> None:
    S, T = paired_population(2000, 60, seed=7)
    U, V = paired_population(2000, 60, seed=11, fail_share=0.6)
    pops = {"zoo induction": load_zoo_pair()[:2], "planted bg 3": load_planted_pair()[:2],
            "synthetic (seed 7)": (S, T), "synthetic (seed 11)": (U, V)}
    fx = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
    for m in ("mlp3l", "mlp4l", "mlp3ls"):  # the held-out next-token pairs (tests/fixtures/make_verified_nexttoken.py)
        pops[f"{m} next-token"] = load_planted_pair(fx / f"verified-{m}-nexttoken.parquet")[:2]
    if sys.argv[1:]:  # measure only the populations named on the command line
        pops = {k: v for k, v in pops.items() if k in sys.argv[1:]}
    print("| population | n | level | miss rate ± MC SE | / nominal | exact on all N: miss rate | edges > 3× nominal |")
    print("|---|---|---|---|---|---|---|")
    for pop, (X, A) in pops.items():
        for n in (16, 32):
            for level in (0.99, 0.998):
                r = simulate_verified(X, A, N, n, D, seed=77 + n, confidence_level=level)
                miss = 1 - r[DEFAULT_INTERVAL]["covered"]
                per, edge = miss.mean(1), miss.mean(0)
                print(f"| {pop} | {n} | {level} | {miss.mean():.4f} ± {per.std(ddof=1) / np.sqrt(D):.4f} | "
                      f"{miss.mean() / (1 - level):.2f} | {1 - r['exact_all']['covered'].mean():.4f} | "
                      f"{int((edge > 3 * (1 - level)).sum())} of {edge.size} |", flush=True)
    print(f"\n{D} datasets of N = {N} per cell, interval {DEFAULT_INTERVAL}; MC SE with the dataset as the unit.")


if __name__ == "__main__":
    main()
