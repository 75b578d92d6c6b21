"""Print the missed-mass table of docs/verified.md: how often the bound on Σ|μ| over the unverified edges holds.

Run from the repository root (a few minutes on one core):
    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/make_missed_mass_table.py > /tmp/missed-mass.md
Populations (circuitstat.stats.verified.missed_study; each dataset draws N = 512 prompts with replacement, takes the
top 5 edges by |EAP mean| and a uniformly random 15 of the others): the planted induction models with background 3
and 5, the zoo's attention-only induction pair and the two next-token pairs (tests/fixtures; edges whose exact
scores vary). The strata rule (one rank block per 10 sampled edges) and the Cantelli factor were chosen on the
synthetic populations of tests/stats/test_missed_mass.py, not on these.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fixture_populations import load_planted_pair, load_zoo_pair  # noqa: E402
from circuitstat.stats.verified.missed_study import missed_edges_study  # noqa: E402

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
CELLS = (("known", 16, 500, 15), ("PPI++, n = 16", 16, 300, 15), ("PPI++, n = 64", 64, 300, 15),
         ("known", 16, 400, 60))  # the last: 60 sampled edges (fewer where the graph leaves fewer)


def populations() -> dict:
    """Return {label: (exact, approx)} over the edges whose exact scores vary."""
    out = {f"planted bg {bg}": load_planted_pair(FIX / f"groundtruth-verified-planted{bg}.parquet")[:2] for bg in (3, 5)}
    out["zoo induction"] = load_zoo_pair()[:2]
    for m in ("mlp3l", "mlp4l"):
        out[f"{m} next-token"] = load_planted_pair(FIX / f"verified-{m}-nexttoken.parquet")[:2]
    return {k: (X[:, X.std(0) > 0], A[:, X.std(0) > 0]) for k, (X, A) in out.items()}


def main() -> None:
    """Print one markdown row per population and mode."""
    print("| population | sampled effects | sampled edges | datasets | hold rate ± MC SE | median bound / truth | "
          "median truth | median bound | bound < top-5 mass |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, (X, A) in populations().items():
        tau = float(np.quantile(np.abs(X.mean(0)), 0.95))  # the count's τ does not enter the mass bound
        for mode, n, D, r in CELLS:
            r = min(r, X.shape[1] - 10)
            s = missed_edges_study(X, A, tau=tau, n_top=5, n_random=r, n_labelled=n, n_datasets=D, seed=48,
                                   known=mode == "known").mass_summary()
            print(f"| {label} | {mode} | {r} | {D} | {s['mass_hold_rate']:.3f} ± {s['mass_mc_se']:.3f} | "
                  f"{s['mass_median_ratio']:.2f} | {s['mass_median_truth']:.3g} | {s['mass_median_high']:.3g} | "
                  f"{s['mass_below_top']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
