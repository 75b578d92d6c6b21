"""Coverage of the fixed-circuit faithfulness interval where the denominator is small (not a test; issue 47, item 7).

Faithfulness is a ratio of means θ = μ_a / μ_b (a = m(C) − m(∅), b = m(M) − m(∅)). Population: b ~ μ_b + 1.5 ε_b,
a = θ b + 0.7 ε_a, θ = 0.8, N = 32, with ε normal or Student t3 (scaled to unit variance: heavy tails). Per cell,
``--reps`` datasets: Fieller's set (circuitstat.stats.fieller; a set that is unbounded covers) against the
bootstrap intervals of the ratio the audit printed before (BCa, the default, and percentile; B = 999). Also the
share of datasets whose Fieller set is bounded and the median width of the bounded ones against BCa's.

    python bench/fieller_coverage.py --reps 2000
"""

from __future__ import annotations

import argparse

import numpy as np

from circuitstat.stats.faithfulness import fixed_circuit_interval
from circuitstat.stats.fieller import fieller_interval
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
        hit["fieller"] += bool(f.low[0] <= 0.8 <= f.high[0]) if s == "bounded" else \
            bool(0.8 <= f.inner_low[0] or 0.8 >= f.inner_high[0]) if s == "union" else 1
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    args = ap.parse_args()
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
