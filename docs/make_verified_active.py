"""Print docs/verified.md's active-verification table: median width over exact on all N at a 10% budget of exact cells.

Run from the repository root (about a minute on one core):
    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/make_verified_active.py
Per dataset, N = 512 prompts drawn with replacement from the population (the estimand is its exact mean); the
approximation (EAP) on all of them; exact on a Poisson sample of (prompt, edge) cells, 0.1 N expected per edge,
either uniform (mix 0) or active (circuitstat.stats.verified.active's defaults); the estimate and interval of
active_means. Width is compared with the t interval of exact on all N of the same dataset, per cell, and the median
over datasets taken per edge; edges whose exact scores are numerically constant (SD <= 1e-6 of the largest |score|)
are left out (their exact-on-all width is ~0).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from scipy import special

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fixture_populations import load_planted_pair, load_zoo_pair  # noqa: E402
from circuitstat.stats.verified.active import active_means, active_probabilities, active_sample  # noqa: E402

N, FRACTION = 512, 0.10


def measure(X: np.ndarray, A: np.ndarray, mix: float, D: int, seed: int) -> dict:
    """Coverage and width over exact on all N of the design with uniform share 1 - ``mix``, on ``D`` datasets."""
    rng = np.random.default_rng(seed)
    truth = X.mean(0)
    keep = X.std(0) > 1e-6 * np.abs(X).max()
    cov, ratio = [], []
    for d in range(D):
        rows = rng.integers(0, X.shape[0], N)
        Xs, As = X[rows], A[rows]
        p = active_probabilities(As, FRACTION * N, mix=mix)
        r = active_means(As, Xs, active_sample(p, rng.integers(2**63)), p)
        wall = 2 * special.stdtrit(N - 1, 0.975) * Xs.std(0, ddof=1) / np.sqrt(N)
        cov.append((r["low"] <= truth) & (truth <= r["high"]))
        ratio.append((r["high"] - r["low"])[keep] / wall[keep])
    c, w = np.array(cov)[:, keep], np.median(np.array(ratio), 0)
    per = c.mean(1)
    return {"coverage": c.mean(), "se": per.std(ddof=1) / np.sqrt(D), "worst": c.mean(0).min(),
            "width": float(np.median(w)), "share15": float(np.mean(w <= 1.5)), "edges": int(keep.sum())}


def main(D: int = 500) -> None:
    fx = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
    pops = {"zoo induction": load_zoo_pair()[:2], "planted bg 3": load_planted_pair()[:2],
            "mlp3l next-token": load_planted_pair(fx / "verified-mlp3l-nexttoken.parquet")[:2]}
    print("| population | design | non-constant edges | pooled coverage ± MC SE | worst edge | median width / exact on all N | edges ≤ 1.5× |")
    print("|---|---|---|---|---|---|---|")
    for pop, (X, A) in pops.items():
        for name, mix in (("uniform", 0.0), ("active", 0.5)):
            m = measure(X, A, mix, D, seed=48)
            print(f"| {pop} | {name} | {m['edges']} | {m['coverage']:.3f} ± {m['se']:.3f} | {m['worst']:.3f} | "
                  f"{m['width']:.2f} | {m['share15']:.2f} |", flush=True)
    print(f"\n{D} datasets of N = {N} per row; {FRACTION:.0%} of the (prompt, edge) cells patched exactly in expectation.")


if __name__ == "__main__":
    main(int(sys.argv[1]) if sys.argv[1:] else 500)
