"""Measure the verified tail flag's width rules before and after issue 48 item 1 (docs/verified.md, "A
prediction-powered yardstick for the width rule").

Previous rule: fail a cell whose interval is more than 2× the t interval of exact on the n labelled prompts, its SD
taken without the most extreme labelled prompt (sd_trim). Adopted rule (circuitstat.stats.verified.reliability, the
product's, read from it here): the same factor 2 with the yardstick SD min(sd_trim, sd_reg), sd_reg the two-phase
(double-sampling) regression estimate of SD(Y) that uses the approximation on all N prompts
(circuitstat.stats.verified.ppi.regression_sd; Cochran 1977, Sampling Techniques, §12.6), and a cap: the interval at
most 20× the estimated width of exact on all N, 2 z SD_yard / sqrt(N). The other rules (rectifier share, the
approximation's tail share, n >= 16) are the same in both. The flag does not change the intervals, so pooled coverage
is one number per row pair.

Run from the repository root (about a minute per population on one core at N = 512):
    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/make_verified_yardstick.py [--seed-base B] [--prompts N]
        [--datasets D] [--labelled n]... [population ...]
Datasets are simulate_verified's draws (seed B + n, B = 2026 by default: the same datasets as make_verified_tables.py).
Populations that chose the yardstick: the zoo pair, planted background 3, synthetic seed 7 (also at B = 1000 and
3000); the others (tests/fixture_populations.py) were measured once, after it was fixed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy import special

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fixture_populations import verified_populations  # noqa: E402
from circuitstat.core.seeds import as_seed_sequence  # noqa: E402
from circuitstat.stats.verified.ppi import ppi_fit, ppi_intervals, sd_without_extreme  # noqa: E402
from circuitstat.stats.verified.reliability import RELIABLE_MAX_WIDTH_RATIO, verified_reliability, width_over  # noqa: E402

N, D, NS, CHUNK = 512, 500, (8, 16, 32), 100
RULES = ("previous", "adopted")


def _simulate(X: np.ndarray, A: np.ndarray, n: int, seed: int, prompts: int | None = None,
              datasets: int | None = None) -> dict[str, np.ndarray]:
    """Per (dataset, edge) cell: covered, width, exact-on-all-N width and coverage, the flag under the previous and
    the adopted rule, and the certain bound on width over exact on all N (N, D: the module's unless given)."""
    N, D = prompts or globals()["N"], datasets or globals()["D"]
    P, E = X.shape
    truth = X.mean(0)
    idx = np.random.default_rng(as_seed_sequence(seed)).integers(0, P, (D, N))  # simulate_verified's draws
    q_all = special.stdtrit(N - 1, 0.975)
    keys = ("covered", "width", "wall", "call", "previous", "adopted", "bound")
    out: dict[str, list] = {k: [] for k in keys}
    chunk = max(1, CHUNK * 512 // N)  # memory ~ N · chunk · E; results do not depend on it (every step is per column)
    for d0 in range(0, D, chunk):
        rows = idx[d0:d0 + chunk].T
        d = rows.shape[1]
        Xs, As = X[rows].reshape(N, d * E), A[rows].reshape(N, d * E)
        fit = ppi_fit(Xs[:n], As[:n], As[n:])
        r = ppi_intervals(fit, "tkb")
        width = r["high"] - r["low"]
        base = verified_reliability(fit)["reliable"]  # the rules other than width's
        q_n = special.stdtrit(n - 1, 0.975)
        previous = base & (width_over(width, 2 * q_n * sd_without_extreme(Xs[:n]) / np.sqrt(n))
                           <= RELIABLE_MAX_WIDTH_RATIO)
        rel = verified_reliability(fit, width)
        m, se = Xs.mean(0), Xs.std(0, ddof=1) / np.sqrt(N)
        t = np.tile(truth, d)
        got = (((r["low"] <= t) & (t <= r["high"])), width, 2 * q_all * se, np.abs(m - t) <= q_all * se, previous,
               rel["reliable"], rel["width_vs_exact_all_max"])
        for k, v in zip(keys, got):
            out[k].append(np.asarray(v).reshape(d, E))
    return {k: np.concatenate(v) for k, v in out.items()}


def _row(pop: str, n: int, rule: str, s: dict[str, np.ndarray], names: list[str]) -> str:
    """One markdown row: the flag of ``rule`` ("previous" or "adopted") on the simulated cells ``s``."""
    rel = s[rule]
    c, ok = s["covered"], s["wall"].mean(0) > 0
    vs_all = s["width"][:, ok] / s["wall"][:, ok]
    fr = vs_all[rel[:, ok]]
    cnt, ref = rel.sum(0), s["call"].mean(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel_edge = (c & rel).sum(0) / cnt
    assess = (cnt >= 30) & (ref >= 0.93)
    floor = 0.90 - 2 * np.sqrt(0.09 / np.maximum(cnt, 1))
    worst = f"{np.nanmin(np.where(assess, rel_edge, np.nan)):.3f}" if assess.any() else "—"
    bad = ", ".join(f"`{names[i]}` {rel_edge[i]:.3f}" for i in np.flatnonzero(assess & (rel_edge < floor))) or "0"
    per = c.mean(1)
    return (f"| {pop} | {n} | {rule} | {c.mean():.3f} ± {per.std(ddof=1) / np.sqrt(per.size):.3f} | {rel.mean():.3f} | "
            f"{int((fr > 20).sum())} | {fr.max() if fr.size else 0:.1f} | {worst} | {bad} |")


def main() -> None:
    global N, D
    ap = argparse.ArgumentParser(description="the verified flag under its previous and its adopted width rules")
    ap.add_argument("--seed-base", type=int, default=2026, help="datasets from seed B + n (2026: the docs tables')")
    ap.add_argument("--prompts", type=int, default=N, help="N, prompts per dataset")
    ap.add_argument("--datasets", type=int, default=D, help="datasets per row")
    ap.add_argument("--labelled", type=int, action="append", help="n, labelled prompts per dataset (repeatable; "
                    "default 8, 16, 32)")
    ap.add_argument("populations", nargs="*", help="names in tests/fixture_populations.py (default: all)")
    a = ap.parse_args()
    N, D, base, args, ns = a.prompts, a.datasets, a.seed_base, a.populations, a.labelled or NS
    print("| population | n | rule | pooled coverage ± MC SE | flagged | flagged > 20× (cells) | widest flagged | "
          "worst flagged edge* | edges flagged < 0.90* |")
    print("|---|---|---|---|---|---|---|---|---|")
    for pop, (X, A, names, held) in verified_populations(args).items():
        for n in ns:
            s = _simulate(np.asarray(X, np.float64), np.asarray(A, np.float64), n, base + n)
            for rule in RULES:
                print(_row(pop + (" (held out)" if held else ""), n, rule, s, names), flush=True)
    print(f"\n{D} datasets of N = {N} per row (seed {base} + n); * among edges where exact on all N covers >= 0.93 "
          "and >= 30 cells are flagged; 'edges flagged < 0.90' lists those below by more than 2 binomial MC SE.")


if __name__ == "__main__":
    main()
