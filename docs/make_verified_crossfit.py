"""Print the bias, SD and null rejection rates of in-sample and cross-fitted λ (docs/verified.md, issue 48).

Datasets of N = 512 drawn with replacement from the zoo pair's 1024 prompts (the estimand is the population's
exact mean); the first n are verified. Run from the repository root (under a minute on one core):
    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/make_verified_crossfit.py [n]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fixture_populations import load_zoo_pair  # noqa: E402
from circuitstat.stats.verified.crossfit import crossfit_fit  # noqa: E402
from circuitstat.stats.verified.ppi import DEFAULT_INTERVAL, ppi_fit, ppi_intervals  # noqa: E402


def main(n: int = 16, N: int = 512, D: int = 2000) -> None:
    X, A, names = load_zoo_pair()
    E, truth = X.shape[1], X.mean(0)
    idx = np.random.default_rng(5).integers(0, X.shape[0], (D, N))
    est: dict[str, list] = {"in-sample": [], "cross-fitted": []}
    pval: dict[str, list] = {"in-sample": [], "cross-fitted": []}
    for d0 in range(0, D, 200):
        rows = idx[d0:d0 + 200].T
        d = rows.shape[1]
        Xs, As = X[rows].reshape(N, d * E), A[rows].reshape(N, d * E)
        for k, f in (("in-sample", ppi_fit(Xs[:n], As[:n], As[n:])), ("cross-fitted", crossfit_fit(Xs[:n], As[:n], As[n:]))):
            est[k].append(f.estimate.reshape(d, E).copy())
            f.estimate = f.estimate - np.tile(truth, d)  # test the true mean: the null holds on every edge
            pval[k].append(ppi_intervals(f, DEFAULT_INTERVAL)["pvalue"].reshape(d, E))
    sd = np.concatenate(est["in-sample"]).std(0)
    ok = sd > 1e-9
    print(f"zoo, n = {n}, N = {N}, {D} datasets, {int(ok.sum())} non-constant edges, interval {DEFAULT_INTERVAL}")
    for k in est:
        e, p = np.concatenate(est[k])[:, ok], np.concatenate(pval[k])[:, ok]
        b = (e.mean(0) - truth[ok]) / sd[ok]
        w = int(np.abs(b).argmax())
        ratio = e.std(0) / sd[ok]
        print(f"{k:>12}: largest |bias| / SD {abs(b[w]):.3f} ({np.array(names)[ok][w]}, MC SE {ratio[w] / np.sqrt(D):.3f}); "
              f"SD / in-sample SD median {np.median(ratio):.3f}, max {ratio.max():.2f}; null rejections at 5% "
              f"{(p < 0.05).mean():.4f}, 1% {(p < 0.01).mean():.4f}, 0.2% {(p < 0.002).mean():.4f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 16)
