"""Print the missed-edges table of docs/verified.md: how often the bound holds on planted models (known nulls).

Run from the repository root (a few minutes on one core):
    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/make_missed_tables.py > /tmp/missed-tables.md
Populations: the planted induction models with background 3 and 5 (tests/fixtures/groundtruth-verified-planted*.parquet,
made by tests/fixtures/make_groundtruth_verified.py: exact and EAP on the same 1024 prompts, the 50 edges whose
scores vary). Each dataset draws N = 512 prompts with replacement (circuitstat.stats.verified.missed_study).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fixture_populations import load_planted_pair  # noqa: E402
from circuitstat.stats.verified.missed_study import missed_edges_study  # noqa: E402

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
TOP, RANDOM, TAUS = 5, 15, (0.5, 0.1, 0.05)
CELLS = (("known", None, 1000), ("estimated", 16, 500), ("estimated", 64, 500))


def main() -> None:
    """Print one markdown row per population, τ and mode."""
    print("| population | τ | sampled effects | datasets | hold rate ± MC SE | expected (exact) | median truth | "
          "median bound | bound < unverified | truth > 0 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, bg in (("planted bg 3", 3), ("planted bg 5", 5)):
        X, A, _ = load_planted_pair(FIX / f"groundtruth-verified-planted{bg}.parquet")
        for tau in TAUS:
            for mode, n, D in CELLS:
                s = missed_edges_study(X, A, tau=tau, n_top=TOP, n_random=RANDOM, n_labelled=n or 16, n_datasets=D,
                                       seed=bg * 100 + int(tau * 100), known=mode == "known").summary()
                exp = "—" if mode != "known" else f"{s['expected_hold_rate']:.3f}"
                what = "known" if mode == "known" else f"PPI++, n = {n}"
                print(f"| {label} | {tau} | {what} | {D} | {s['hold_rate']:.3f} ± {s['mc_se']:.3f} | {exp} | "
                      f"{s['median_truth']:.0f} | {s['median_bound']:.0f} of {s['median_unverified']:.0f} | "
                      f"{s['share_bound_below_unverified']:.2f} | {s['share_truth_positive']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
