"""Print the predictor tables of docs/verified.md: the PPI variance floor and the verified interval per approximation.

Run from the repository root (a few minutes on one core):
    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/make_verified_predictors.py
Population: the planted induction model with background 3 (tests/fixtures/groundtruth-verified-planted3.parquet:
exact and EAP on 1024 prompts, the 50 edges whose scores vary); the other approximations are attributed here on
the same prompts (the fixture's task: n = 1024, seed 20261203).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fixture_populations import load_planted_pair  # noqa: E402
from circuitstat.stats.verified.coverage import simulate_verified  # noqa: E402
from circuitstat.stats.verified.floor import per_prompt_correlation, width_floor  # noqa: E402

N = 512


def predictors() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Return (exact [1024, 50], {method: scores [1024, 50]}) of the planted background-3 model."""
    import torch

    from circuitstat.circuits.attribution import attribute
    from circuitstat.circuits.groundtruth import load_groundtruth

    torch.set_num_threads(1)
    X, eap, names = load_planted_pair()
    gt = load_groundtruth("planted:induction?background=3")
    task = gt.task(1024, 20261203)
    out = {"eap": eap}
    for method in ("atp-qkfix", "eap-ig-inputs", "atpstar"):
        S = attribute(gt.model, task, method, batch_size=64, seed=0, progress=False)
        out[method] = S.scores[:, [list(S.names).index(n) for n in names]].astype(np.float64)
    return X, out


def main() -> None:
    """Print the floor table, then the simulated verified intervals of eap and atp-qkfix."""
    X, preds = predictors()
    for method, A in preds.items():
        rho = per_prompt_correlation(X, A)
        floors = [np.median(width_floor(rho, n, N)) for n in (16, 32, 51, 64)]
        first = next(n for n in range(4, N) if np.median(width_floor(rho, n, N)) <= 1.5)
        q1, q3 = np.quantile(rho, [0.25, 0.75])
        print(f"| {method} | {np.median(rho):.3f} ({q1:.3f}, {q3:.3f}) | " + " | ".join(f"{f:.2f}" for f in floors)
              + f" | {first} |", flush=True)
    for method in ("eap", "atp-qkfix"):
        for n in (16, 32):
            r = simulate_verified(X, preds[method], N, n, 1000, seed=2026 + n, methods=("tka",))
            cov, w = r["tka"]["covered"], r["tka"]["width"] / r["exact_all"]["width"]
            se = cov.mean(1).std(ddof=1) / np.sqrt(cov.shape[0])
            print(f"| planted bg 3 | {method} | {n} | {cov.mean():.3f} ± {se:.3f} | {cov.mean(0).min():.3f} | "
                  f"{np.median(np.median(w, 0)):.2f} |", flush=True)


if __name__ == "__main__":
    main()
