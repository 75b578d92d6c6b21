"""The point width's heavy-tail factor, before and after its median self-calibration (docs/sample-size.md, "The point
width under heavy tails", third round): the median over pilots of each pilot's median realised / predicted width.

"before": median_sd_growth alone (the exponent held at 1); "adopted": circuitstat.stats.sample_size.predict_widths as
it is, median_sd_growth ** c with c the pilot's self-calibration at the median, capped at width_upper. Both from the
same pilots and the same realised datasets (seed 7000 + the population's index in its set).

Run from the repository root (about 2 minutes per population on one core at 60 pilots):
    OMP_NUM_THREADS=1 python bench/point_width_rules.py {design,held,fresh} [PILOTS]
Sets: design (the populations the factor was chosen on), held (the held-out ones of earlier rounds, on which this
candidate had been measured in round two) and fresh (built for this round and used for no choice: the mlp3l and
mlp3ls next-token models' exact scores, smooth tails seed 50, spiky seed 33).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]
import sample_size as bench  # noqa: E402
from circuitstat.stats import sample_size as ss  # noqa: E402
from circuitstat.stats.intervals import bootstrap_edges  # noqa: E402

NS, N0, LEVEL = [64, 128, 256, 512], 32, 0.9


def _before(S: np.ndarray, seed) -> dict[str, np.ndarray]:
    """predict_widths with the median self-calibration's exponent held at 1 (the rule before)."""
    orig = ss.self_calibration
    ss.self_calibration = lambda X, level, quantile=None, **kw: (1.0 if quantile == 0.5
                                                                 else orig(X, level, quantile=quantile, **kw))
    try:
        return ss.predict_widths(S, NS, prediction_level=LEVEL, n_resamples=999, seed=seed)
    finally:
        ss.self_calibration = orig


def ratios(P: np.ndarray, pilots: int, seed: int) -> tuple[list[float], list[float]]:
    """Return per N the median over pilots of the median realised / predicted width, before and adopted."""
    rb, ra = [[] for _ in NS], [[] for _ in NS]
    for c in np.random.SeedSequence(seed).spawn(pilots):
        c_rows, c_w, c_real = c.spawn(3)
        S = P[np.random.default_rng(c_rows).integers(0, P.shape[0], N0)]
        wa = ss.predict_widths(S, NS, prediction_level=LEVEL, n_resamples=999, seed=c_w)
        wb = _before(S, c_w)
        rr = np.random.default_rng(c_real)
        for i, n in enumerate(NS):
            sel = wa["n"] == n
            D = P[rr.integers(0, P.shape[0], n)]
            b = bootstrap_edges(D, n_resamples=999, seed=int(rr.integers(2**63)))
            real = np.asarray(b.confidence_interval.high) - np.asarray(b.confidence_interval.low)
            ok = wb["width"][sel] > 0
            rb[i].append(np.median(real[ok] / wb["width"][sel][ok]))
            ra[i].append(np.median(real[ok] / wa["width"][sel][ok]))
    return [float(np.median(x)) for x in rb], [float(np.median(x)) for x in ra]


def main() -> None:
    which, pilots = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 60
    pops = {"design": bench.populations, "held": bench.held_out, "fresh": bench.fresh}[which]()
    print(f"| population | before: N = {' / '.join(map(str, NS))} | worst abs log | adopted | worst abs log |")
    print("|---|---|---|---|---|")
    for i, (name, P) in enumerate(pops.items()):
        b, a = ratios(np.asarray(P, np.float64), pilots, 7000 + i)
        print(f"| {name} | {' / '.join(f'{v:.3f}' for v in b)} | {max(abs(np.log(b))):.3f} | "
              f"{' / '.join(f'{v:.3f}' for v in a)} | {max(abs(np.log(a))):.3f} |", flush=True)
    print(f"\n{pilots} pilots of {N0} per population; median over pilots of the median over edges of realised / "
          "predicted width")


if __name__ == "__main__":
    main()
