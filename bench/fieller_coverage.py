"""Coverage of the fixed-circuit faithfulness interval where the denominator is small (not a test; issue 47, item 7).

Faithfulness is a ratio of means θ = μ_a / μ_b (a = m(C) − m(∅), b = m(M) − m(∅)). Population: b ~ μ_b + 1.5 ε_b,
a = θ b + 0.7 ε_a, θ = 0.8, N = 32, with ε normal or Student t3 (scaled to unit variance: heavy tails). Per cell,
``--reps`` datasets: Fieller's set (circuitstat.stats.fieller; a set that is unbounded covers) against the
bootstrap intervals of the ratio the audit printed before (BCa, the default, and percentile; B = 999). Also the
share of datasets whose Fieller set is bounded and the median width of the bounded ones against BCa's.

    python bench/fieller_coverage.py --reps 2000
    python bench/fieller_coverage.py --reps 2000 --curve

``--curve``: the run's own top-k curve (faithfulness_vs_k), several circuits over one shared denominator, through
the functions the audit calls (circuitstat.stats.fieller.fieller_over_plan against the BCa interval the audit printed
before): circuit j has a_j = θ_j b + 0.7 ε_j with θ = (0.1, 0.4, 0.8, 1.0), the same b and ε as above.
"""

from __future__ import annotations

import argparse

import numpy as np

from circuitstat.stats.faithfulness import fixed_circuit_interval
from circuitstat.stats.fieller import fieller_interval, fieller_over_plan
from circuitstat.stats.resampling import ResamplingPlan


def _draw(rng, n, mu_b, heavy):
    e = (lambda: rng.standard_t(3, n) / np.sqrt(3.0)) if heavy else (lambda: rng.standard_normal(n))
    b = mu_b + 1.5 * e()
    return 0.8 * b + 0.7 * e(), b


def cell(mu_b: float, heavy: bool, reps: int, n: int = 32, seed: int = 0) -> dict:
    """Coverage of θ = 0.8 by Fieller, BCa and percentile over `reps` datasets of one population."""
    rng = np.random.default_rng(seed)
    hit = {"fieller": 0, "bca": 0, "percentile": 0}
    bounded, wf, wb = 0, [], []
    for r in range(reps):
        a, b = _draw(rng, n, mu_b, heavy)
        f = fieller_interval(a, b)
        s = f.shape[0]
        hit["fieller"] += bool(f.covers(0.8)[0])
        res = fixed_circuit_interval(a, b, np.zeros(n), ResamplingPlan.bootstrap(n, 999, r), method="bca",
                                     methods=["percentile"])
        for m in ("bca", "percentile"):
            hit[m] += bool(res.intervals[m].low[0] <= 0.8 <= res.intervals[m].high[0])
        if s == "bounded":
            bounded += 1
            wf.append(f.high[0] - f.low[0])
            wb.append(res.intervals["bca"].high[0] - res.intervals["bca"].low[0])
    ratio = float(np.median(np.array(wf) / np.array(wb))) if wf else float("nan")
    return {**{k: v / reps for k, v in hit.items()}, "bounded": bounded / reps, "width_vs_bca": ratio}


THETAS = np.array([0.1, 0.4, 0.8, 1.0])


def curve_cell(mu_b: float, heavy: bool, reps: int, n: int = 32, seed: int = 0) -> dict:
    """Per-k coverage of θ_j by the audit's Fieller columns and by its former BCa columns, over `reps` curves."""
    rng = np.random.default_rng(seed)
    e = (lambda size: rng.standard_t(3, size) / np.sqrt(3.0)) if heavy else (lambda size: rng.standard_normal(size))
    fie, bca, bounded = np.zeros(THETAS.size), np.zeros(THETAS.size), 0
    for r in range(reps):
        b = mu_b + 1.5 * e(n)
        mc = THETAS * b[:, None] + 0.7 * e((n, THETAS.size))  # m_circuit with m_empty = 0, m_clean = b
        plan = ResamplingPlan.bootstrap(n, 999, r)
        f = fieller_over_plan(mc, b, np.zeros(n), plan, confidence_level=0.95)
        fie += f.covers(THETAS)
        old = fixed_circuit_interval(mc, b, np.zeros(n), plan, method="bca").confidence_interval
        bca += (old.low <= THETAS) & (THETAS <= old.high)
        bounded += f.shape[0] == "bounded"  # the shared denominator decides the shape of every k's set
    return {"fieller": fie / reps, "bca": bca / reps, "bounded": bounded / reps}


def curve_main(reps: int) -> None:
    """Print the per-k coverage table of the top-k curve (docs/mib.md)."""
    se = np.sqrt(0.95 * 0.05 / reps)
    print(f"top-k curve: N = 32, θ = {THETAS.tolist()}, {reps} curves per cell (MC SE at 0.95: {se:.3f}); B = 999")
    print("| μ_b (mean t of b̄) | tails | Fieller per θ | BCa (before) per θ | Fieller bounded |")
    print("|---|---|---|---|---|")
    for mu in (0.3, 0.8, 3.0):
        for heavy in (False, True):
            c = curve_cell(mu, heavy, reps)
            show = lambda v: " / ".join(f"{x:.3f}" for x in v)  # noqa: E731
            print(f"| {mu} ({mu / (1.5 / np.sqrt(32)):.1f}) | {'t3' if heavy else 'normal'} | {show(c['fieller'])} | "
                  f"{show(c['bca'])} | {c['bounded']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--curve", action="store_true", help="the top-k curve's several circuits over one denominator")
    args = ap.parse_args()
    if args.curve:
        curve_main(args.reps)
        return
    se = np.sqrt(0.95 * 0.05 / args.reps)
    print(f"N = 32, θ = 0.8, {args.reps} datasets per cell (MC SE at 0.95: {se:.3f}); B = 999")
    print("| μ_b (mean t of b̄) | tails | Fieller | BCa (before) | percentile (before) | Fieller bounded | width vs BCa |")
    print("|---|---|---|---|---|---|---|")
    for mu in (0.3, 0.5, 0.8, 3.0):
        for heavy in (False, True):
            c = cell(mu, heavy, args.reps)
            print(f"| {mu} ({mu / (1.5 / np.sqrt(32)):.1f}) | {'t3' if heavy else 'normal'} | {c['fieller']:.3f} | "
                  f"{c['bca']:.3f} | {c['percentile']:.3f} | {c['bounded']:.2f} | {c['width_vs_bca']:.2f} |")


if __name__ == "__main__":
    main()
