"""Print the measured tables of docs/verified.md (coverage of verified-run intervals for the mean exact effect).

Run from the repository root (about 2 minutes on one core):
    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/make_verified_tables.py > /tmp/verified-tables.md
Populations: the zoo induction pair and the planted background-3 pair (tests/fixtures), and the synthetic
circuitstat.stats.verified.coverage.paired_population (seed 7; a second seed, 11 with fail_share 0.6, as a check).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fixture_populations import load_planted_pair, load_zoo_pair  # noqa: E402
from circuitstat.stats.verified.coverage import paired_population, simulate_verified  # noqa: E402

N, D, NS = 512, 1000, (8, 16, 32)
FORMS = (("z", "pooled"), ("t2", "labelled"), ("tk", "labelled"), ("tka", "labelled"))


def _pops() -> dict:
    X, A, names = load_zoo_pair()
    P, Q, pnames = load_planted_pair()
    S, T = paired_population(2000, 60, seed=7)
    U, V = paired_population(2000, 60, seed=11, fail_share=0.6)
    return {"zoo induction": (X, A, names), "planted bg 3": (P, Q, pnames),
            "synthetic (seed 7)": (S, T, [f"e{i}" for i in range(60)]),
            "synthetic (seed 11)": (U, V, [f"e{i}" for i in range(60)])}


def _row(pop: str, n: int, form: str, tuning: str, r: dict, names: list[str]) -> str:
    c, rel = r[form]["covered"], r[form]["reliable"]
    per = c.mean(1)
    edge, ref = c.mean(0), r["exact_all"]["covered"].mean(0)
    hits, cnt = (c & rel).sum(0), rel.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel_edge = hits / cnt
        ok = r["exact_all"]["width"].mean(0) > 0
        w_all = np.median(np.median(r[form]["width"], 0)[ok] / np.median(r["exact_all"]["width"], 0)[ok])
        w_n = np.median(np.median(r[form]["width"], 0)[ok] / np.median(r["exact_n"]["width"], 0)[ok])
    assess = (cnt >= 30) & (ref >= 0.93)
    worst_rel = np.nanmin(np.where(assess, rel_edge, np.nan))
    floor = 0.90 - 2 * np.sqrt(0.09 / np.maximum(cnt, 1))
    fails = int((assess & (rel_edge < floor)).sum())
    e = int(edge.argmin())
    return (f"| {pop} | {n} | {form}/{tuning} | {c.mean():.3f} ± {per.std(ddof=1) / np.sqrt(per.size):.3f} | "
            f"{edge.min():.3f} `{names[e]}` ({ref[e]:.3f}) | {rel.mean():.2f} | {worst_rel:.3f} | {fails} | "
            f"{w_all:.2f} | {w_n:.2f} | {r['exact_n']['covered'].mean():.3f} |")


def main() -> None:
    print("| population | n | form/λ tuning | pooled coverage ± MC SE | worst edge (exact on all N there) | "
          "flagged reliable | worst flagged edge* | edges flagged < 0.90* | width / exact on all N | "
          "width / exact on n | exact on n: pooled |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for pop, (X, A, names) in _pops().items():
        for n in NS:
            for form, tuning in FORMS:
                r = simulate_verified(X, A, N, n, D, seed=2026 + n, methods=(form,), tuning=tuning)
                print(_row(pop, n, form, tuning, r, names), flush=True)
    print(f"\n{D} datasets of N = {N} per cell; MC SE with the dataset as the unit. * among edges where exact on "
          "all N covers >= 0.93 and >= 30 cells are flagged reliable; 'edges flagged < 0.90' counts those below "
          "0.90 by more than 2 binomial MC SE.")


if __name__ == "__main__":
    main()
