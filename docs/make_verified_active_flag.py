"""Print docs/verified.md's table of the active design's tail flag and cross-fitted p-values ("Active verification").

Run from the repository root (a few minutes on one core):
    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/make_verified_active_flag.py > /tmp/active-flag.md
    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/make_verified_active_flag.py --prompts 2048 --datasets 200 \
        --budget 16 --budget 32   # "The active design's flag at N = 2048"
Per (population, budget B): 500 datasets of N = 512 prompts drawn with replacement (the estimand is the population's
exact mean), circuitstat.stats.verified.coverage.simulate_active (the active design's cells, active_means' interval,
active_flag's flag, active_crossfit's estimate). Populations that chose the rule: the zoo induction pair, the planted
background-3 pair and synthetic seed 7. Held out: planted background 5, synthetic seed 11 (fail share 0.6) and the
three next-token pairs (as docs/make_verified_tables.py). Name populations on the command line to measure only those.
The "without" column counts the failing edges of the flag with each rule left out in turn (the negative controls).
With --prompts other than 512 each row adds the flagged cells wider than 20× exact on all N (the cap the width rule
implies at N = 512 but no longer at N = 2048) and the size table is left out (it was measured at N = 512); at
N = 512 the output is the docs table's, byte for byte. Datasets are simulate_active's draws, seed 4800 + B at any N
(--seed-base S: S + B).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fixture_populations import verified_populations  # noqa: E402
from circuitstat.stats.verified.active_flag import ACTIVE_FLAG_RULES, active_flag  # noqa: E402
from circuitstat.stats.verified.active_result import active_pvalues  # noqa: E402
from circuitstat.stats.verified.coverage import simulate_active  # noqa: E402

N, D, BUDGETS = 512, 500, (16, 32, 51)
#: the N the docs' first table was measured at: its output stays byte for byte as it was (no > 20× column, size rows)
N_DOCS = 512
FAILS: list[str] = []


def flag_without(a: dict, drop: str | None) -> np.ndarray:
    """The flag recomputed from its stored inputs with rule ``drop`` left out (None: the flag itself)."""
    return active_flag(a, tuple(k for k in ACTIVE_FLAG_RULES if k != drop))


def per_edge(c: np.ndarray, rel: np.ndarray, ref: np.ndarray) -> tuple[float, int, np.ndarray, np.ndarray]:
    """(worst flagged edge, edges failing the floor, flagged coverage per edge, assessable) on edges exact-on-all N
    covers >= 0.93 with >= 30 flagged cells; failing: below 0.90 by more than 2 binomial MC SE."""
    hits, cnt = (c & rel).sum(0), rel.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel_edge = hits / cnt
    assess = (cnt >= 30) & (ref >= 0.93)
    worst = float(np.nanmin(np.where(assess, rel_edge, np.nan))) if assess.any() else float("nan")
    floor = 0.90 - 2 * np.sqrt(0.09 / np.maximum(cnt, 1))
    return worst, int((assess & (rel_edge < floor)).sum()), rel_edge, assess & (rel_edge < floor)


def _row(pop: str, held: bool, B: int, r: dict, names: list[str]) -> str:
    a, ex = r["active"], r["exact_all"]
    c, rel = a["covered"], a["reliable"]
    per, ref = c.mean(1), ex["covered"].mean(0)
    ok = ex["width"].mean(0) > 0  # numerically constant edges: exact on all N has width ~0
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = (a["width"] / ex["width"])[:, ok]
    fr = ratio[rel[:, ok]]
    worst, fails, rel_edge, bad = per_edge(c, rel, ref)
    FAILS.extend(f"{pop}, B = {B}: `{names[i]}` {rel_edge[i]:.3f} of {rel[:, i].sum()} flagged cells (exact on all N "
                 f"{ref[i]:.3f})" for i in np.flatnonzero(bad))
    ctrl = [per_edge(c, flag_without(a, k), ref)[1] for k in ACTIVE_FLAG_RULES]
    fc = (c & rel).sum() / max(rel.sum(), 1)
    # cross-fitted against in-sample: the variance cost, as the ratio of the estimates' SD over datasets (per edge,
    # median over non-constant edges) and of the mean SEs
    sd_ratio = np.median(a["estimate_crossfit"][:, ok].std(0) / a["estimate"][:, ok].std(0))
    se_ratio = np.median(a["se_crossfit"][:, ok].mean(0) / a["se"][:, ok].mean(0))
    e = int(c.mean(0).argmin())
    # beyond N = 512 the cap is no longer implied by the width rule with >= 16 cells: count the cells it must hold to
    over20 = "" if N == N_DOCS else f" {int((fr > 20).sum())} |"
    return (f"| {pop}{' (held out)' if held else ''} | {B} | {c.mean():.3f} ± {per.std(ddof=1) / np.sqrt(per.size):.3f} | "
            f"{c.mean(0).min():.3f} `{names[e]}` ({ref[e]:.3f}) | {rel.mean():.2f} | {fc:.3f} | "
            f"{'—' if np.isnan(worst) else f'{worst:.3f}'} | {fails} | {' / '.join(map(str, ctrl))} | "
            f"{np.mean(ratio > 10):.4f} | {np.mean(ratio > 100):.4f} | {fr.max() if fr.size else 0:.3g} | "
            f"{np.median(np.median(ratio, 0)):.2f} | {sd_ratio:.3f} | {se_ratio:.3f} |{over20}")


def size_rows(pops: dict) -> None:
    """Print the two-sided 5% test's rejection rate of mean 0 on centred populations (X − mean X, A − mean X: every
    edge null, EAP's relation to exact kept) with the in-sample and the cross-fitted p-values."""
    print("\n| population | B | in-sample: rejected at 5% ± MC SE | worst edge | cross-fitted: rejected at 5% ± MC SE "
          "| worst edge |")
    print("|---|---|---|---|---|---|")
    for pop, (X, A, _, held) in pops.items():
        if held:
            continue
        m = X.mean(0)
        for B in BUDGETS[:2]:
            a = simulate_active(X - m, A - m, N, B, D, seed=4900 + B)["active"]
            ok = X.std(0) > 1e-6 * np.abs(X).max()
            cells = []
            for est, se in (("estimate", "se"), ("estimate_crossfit", "se_crossfit")):
                rej = (active_pvalues(a[est], a[se], a["cells"]) <= 0.05)[:, ok]
                per = rej.mean(1)
                cells.append(f"{rej.mean():.4f} ± {per.std(ddof=1) / np.sqrt(per.size):.4f} | {rej.mean(0).max():.3f}")
            print(f"| {pop} | {B} | {' | '.join(cells)} |", flush=True)


def _args() -> argparse.Namespace:
    """The command line: N, datasets, budgets and populations (defaults: the docs' N = 512 table)."""
    ap = argparse.ArgumentParser(description="the active design's tail flag and cross-fitted p-values")
    ap.add_argument("--prompts", type=int, default=N, help="N, prompts per dataset (default 512)")
    ap.add_argument("--datasets", type=int, default=D, help="datasets per row (default 500)")
    ap.add_argument("--seed-base", type=int, default=4800, help="datasets from seed S + B (4800: the docs tables')")
    ap.add_argument("--budget", type=int, action="append", help="B, expected exact cells per edge (repeatable; "
                    "default 16, 32, 51)")
    ap.add_argument("populations", nargs="*", help="names in tests/fixture_populations.py (default: all)")
    return ap.parse_args()


def main() -> None:
    global N, D
    a = _args()
    N, D, budgets = a.prompts, a.datasets, tuple(a.budget or BUDGETS)
    print("| population | B | pooled coverage ± MC SE | worst edge (exact on all N there) | flagged | flagged cells cover | "
          "worst flagged edge* | edges flagged < 0.90* | same without cells / residual / approx tail / width rule | "
          "share > 10× exact on all N | > 100× | widest flagged (× exact on all N) | median width / exact on all N | "
          "cross-fitted SD / in-sample SD | cross-fitted SE / in-sample SE |" + ("" if N == N_DOCS else
                                                                               " flagged > 20× (cells) |"))
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("" if N == N_DOCS else "---|"))
    # {name: (exact, approx, edge names, held out?)}: the one list in tests/fixture_populations.py, or those named
    pops = verified_populations(a.populations)
    for pop, (X, A, names, held) in pops.items():
        for B in budgets:
            r = simulate_active(X, A, N, B, D, seed=a.seed_base + B)
            print(_row(pop, held, B, r, names), flush=True)
    seeds = "" if a.seed_base == 4800 else f" (seed {a.seed_base} + B)"
    print(f"\n{D} datasets of N = {N} per row{seeds}; MC SE with the dataset as the unit. * among edges where exact on "
          "all N covers >= 0.93 and >= 30 cells are flagged; 'edges flagged < 0.90' counts those below 0.90 by more "
          "than 2 binomial MC SE. Widths over non-constant edges (exact on all N wider than 0).")
    print("\nEdges whose flagged cells cover < 0.90 (assessable edges only):\n")
    print("\n".join(f"* {f}" for f in FAILS) or "* none")
    if N == N_DOCS:  # the size table was measured at N = 512 only
        size_rows(pops)


if __name__ == "__main__":
    main()
