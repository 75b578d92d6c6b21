"""Measure a candidate second yardstick for the verified tail flag's width rule (docs/verified.md, "Tried: a
prediction-powered yardstick"; issue 48 item 1). Nothing here is used by the product: it records what was tried.

The flag's width rule (circuitstat.stats.verified.reliability) fails a cell whose interval is more than 2× the t
interval of exact on the n labelled prompts, its SD taken without the most extreme labelled prompt (sd_trim). Where
the labelled prompts are by chance over-spread that yardstick is wide too, and the flag passes an interval more than
20× exact on all N. The candidate takes the yardstick's SD as min(sd_trim, sd_reg), with sd_reg the two-phase
(double-sampling) regression estimate of SD(Y) that uses the approximation on all N prompts as a control variate for
the labelled second moment (Cochran 1977, Sampling Techniques, §12.6; in PPI terms, Angelopoulos et al. 2023,
"Prediction-powered inference", Science 382, the rectified estimate of E[(Y − μ)²] with the control variate
β²(Ŷ − mean Ŷ)²), on the same n − 1 labelled prompts sd_trim keeps:

    β = Cov(Y, Ŷ) / Var(Ŷ)                          (labelled prompts less the most extreme Y)
    s²_reg = [Var(Y) − β² Var(Ŷ)] + β² Var_N(Ŷ)     (= Var(Y) + β² (Var_N(Ŷ) − Var(Ŷ)))

The bracket is the OLS residual variance (never negative), Var_N(Ŷ) the approximation's variance over all N prompts.
Where the labelled sample is over-spread and the approximation tracks exact, β² (Var_N(Ŷ) − Var(Ŷ)) < 0 corrects it.

Run from the repository root (about a minute on one core):
    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/make_verified_yardstick.py [--seed-base B] [--prompts N]
        [--datasets D] [population ...]
Datasets are simulate_verified's draws (seed B + n, B = 2026 by default: the same datasets as make_verified_tables.py).
Populations that chose the candidate: the zoo pair, planted background 3, synthetic seed 7 (also at B = 1000 and
3000); the others (tests/fixture_populations.py) were measured once, after the candidate was fixed.
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
from circuitstat.stats.verified.ppi import ppi_fit, ppi_intervals  # noqa: E402
from circuitstat.stats.verified.reliability import verified_reliability  # noqa: E402

N, D, NS, CHUNK = 512, 500, (8, 16, 32), 100
#: rule name: (yardstick, factor, capped); "current" is the product's rule. Capped: also W <= 20 · 2z · SD_yard / sqrt(N)
#: (20× exact on all N's width estimated from the yardstick's SD), implied by the factor-2 rule unless N > ~85 n
RULES = {"current": ("trim", 2.0, False), "two-phase": ("reg", 2.0, False), "two-phase, 1.8×": ("reg", 1.8, False),
         "current, capped": ("trim", 2.0, True), "two-phase, capped": ("reg", 2.0, True)}


def regression_sd(Y: np.ndarray, Yhat: np.ndarray, Yhat_all: np.ndarray) -> np.ndarray:
    """Return per column the two-phase regression SD of Y on the labelled rows less the most extreme Y."""
    n, E = Y.shape
    far = np.abs(Y - np.median(Y, 0)).argmax(0)  # the prompt sd_without_extreme drops
    keep = np.ones(Y.shape, bool)
    keep[far, np.arange(E)] = False
    Yt, Ht = (a.T[keep.T].reshape(E, n - 1).T for a in (Y, Yhat))
    yc, hc = Yt - Yt.mean(0), Ht - Ht.mean(0)
    vh = (hc * hc).sum(0)
    beta = np.where(vh > 0, (yc * hc).sum(0) / np.where(vh > 0, vh, 1.0), 0.0)
    resid = ((yc - beta * hc) ** 2).sum(0) / (n - 2)  # OLS residual variance, ddof 1 as Var(Y)
    return np.sqrt(resid + beta**2 * Yhat_all.var(0, ddof=1))


def _simulate(X: np.ndarray, A: np.ndarray, n: int, seed: int) -> dict[str, np.ndarray]:
    """Per (dataset, edge) cell: covered, width, exact-on-all-N width and coverage, the flag's other rules, ratios."""
    P, E = X.shape
    truth = X.mean(0)
    idx = np.random.default_rng(as_seed_sequence(seed)).integers(0, P, (D, N))  # simulate_verified's draws
    q_all, keys = special.stdtrit(N - 1, 0.975), ("covered", "width", "wall", "call", "base", "ratio", "shrink")
    out: dict[str, list] = {k: [] for k in keys}
    chunk = max(1, CHUNK * 512 // N)  # memory ~ N · chunk · E; results do not depend on it (every step is per column)
    for d0 in range(0, D, chunk):
        rows = idx[d0:d0 + chunk].T
        d = rows.shape[1]
        Xs, As = X[rows].reshape(N, d * E), A[rows].reshape(N, d * E)
        fit = ppi_fit(Xs[:n], As[:n], As[n:])
        r = ppi_intervals(fit, "tkb")
        width = r["high"] - r["low"]
        base = verified_reliability(fit)["reliable"]  # without the width rule
        ratio = verified_reliability(fit, width)["width_ratio"]  # against sd_trim's yardstick (the product's)
        sd_reg = regression_sd(Xs[:n], As[:n], As)
        with np.errstate(divide="ignore", invalid="ignore"):
            shrink = np.where(fit.exact_ref_sd > 0, np.minimum(1.0, sd_reg / fit.exact_ref_sd), 1.0)
        m, se = Xs.mean(0), Xs.std(0, ddof=1) / np.sqrt(N)
        t = np.tile(truth, d)
        got = (((r["low"] <= t) & (t <= r["high"])), width, 2 * q_all * se, np.abs(m - t) <= q_all * se, base,
               ratio, shrink)
        for k, v in zip(keys, got):
            out[k].append(np.asarray(v).reshape(d, E))
    return {k: np.concatenate(v) for k, v in out.items()}


def _row(pop: str, n: int, rule: str, s: dict[str, np.ndarray], names: list[str]) -> str:
    """One markdown row: the flag of ``rule`` on the simulated cells ``s``."""
    kind, factor, capped = RULES[rule]
    with np.errstate(divide="ignore", invalid="ignore"):  # a smaller yardstick, a larger ratio (0/0: fails)
        ratio = s["ratio"] if kind == "trim" else s["ratio"] / s["shrink"]
    rel = s["base"] & (ratio <= factor)
    if capped:  # width over the yardstick's t width <= 20 (z / t) sqrt(n / N) <=> W <= 20 · 2z · SD_yard / sqrt(N)
        rel &= ratio <= 20 * special.ndtri(0.975) / special.stdtrit(n - 1, 0.975) * np.sqrt(n / N)
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
    ap = argparse.ArgumentParser(description="the verified flag under its current and a candidate width yardstick")
    ap.add_argument("--seed-base", type=int, default=2026, help="datasets from seed B + n (2026: the docs tables')")
    ap.add_argument("--prompts", type=int, default=N, help="N, prompts per dataset")
    ap.add_argument("--datasets", type=int, default=D, help="datasets per row")
    ap.add_argument("populations", nargs="*", help="names in tests/fixture_populations.py (default: all)")
    a = ap.parse_args()
    N, D, base, args = a.prompts, a.datasets, a.seed_base, a.populations
    print("| population | n | rule | pooled coverage ± MC SE | flagged | flagged > 20× (cells) | widest flagged | "
          "worst flagged edge* | edges flagged < 0.90* |")
    print("|---|---|---|---|---|---|---|---|---|")
    for pop, (X, A, names, held) in verified_populations(args).items():
        for n in NS:
            s = _simulate(np.asarray(X, np.float64), np.asarray(A, np.float64), n, base + n)
            for rule in RULES:
                print(_row(pop + (" (held out)" if held else ""), n, rule, s, names), flush=True)
    print(f"\n{D} datasets of N = {N} per row (seed {base} + n); * among edges where exact on all N covers >= 0.93 "
          "and >= 30 cells are flagged; 'edges flagged < 0.90' lists those below by more than 2 binomial MC SE.")


if __name__ == "__main__":
    main()
