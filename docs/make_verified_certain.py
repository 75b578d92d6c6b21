"""Measure the certain bound on a verified interval's width over exact on all N prompts (docs/verified.md, "A certain
bound, beside the estimated cap").

Per population and n: the flagged share (no_tail_seen), the share of flagged cells whose certain bound
(``width_vs_exact_on_all_max``, circuitstat.stats.verified.reliability.exact_on_all_width_floor, read from the
product) is at most 20, flagged cells whose realised ratio (interval width over the dataset's own exact-on-all-N t
interval, brute force) is above 20 (all flagged, then those certainly within 20, which must be 0), and the medians of
the bound and of the realised ratio over flagged cells. Every cell also asserts realised <= bound.

Run from the repository root (a few minutes per population on one core at N = 2048):
    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/make_verified_certain.py [--prompts N] [--datasets D] [--labelled n]...
Datasets are simulate_verified's draws (seed 2026 + n: the same datasets as make_verified_tables.py and
make_verified_yardstick.py). The bound has no parameter: nothing was chosen on any population.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fixture_populations import verified_populations  # noqa: E402
from make_verified_yardstick import _simulate  # noqa: E402  (this folder: the script's own)
from circuitstat.stats.verified.reliability import RELIABLE_MAX_EXACT_ALL_RATIO  # noqa: E402

CAP = RELIABLE_MAX_EXACT_ALL_RATIO


def _cells(X: np.ndarray, A: np.ndarray, n: int, N: int, D: int, seed: int) -> tuple[np.ndarray, ...]:
    """Per (dataset, edge): the flag, the certain bound and the realised ratio (brute force), from
    make_verified_yardstick's simulation (the same datasets)."""
    s = _simulate(X, A, n, seed, prompts=N, datasets=D)
    with np.errstate(divide="ignore", invalid="ignore"):
        real = np.where(s["wall"] > 0, s["width"] / s["wall"], 0.0)
    assert (real <= s["bound"] * (1 + 1e-9)).all(), "the certain bound was exceeded"
    return s["adopted"], s["bound"], real


def main() -> None:
    ap = argparse.ArgumentParser(description="the certain bound on width over exact on all N, per population")
    ap.add_argument("--prompts", type=int, default=512, help="N, prompts per dataset")
    ap.add_argument("--datasets", type=int, default=500, help="datasets per row")
    ap.add_argument("--labelled", type=int, action="append", help="n (repeatable; default 16 and 32)")
    a = ap.parse_args()
    print(f"| population | n | flagged | flagged certainly ≤ {CAP:g}× | flagged > {CAP:g}× (cells) | of them certainly "
          f"≤ {CAP:g}× | median bound (flagged) | median realised (flagged) |")
    print("|---|---|---|---|---|---|---|---|")
    for pop, (X, A, _, held) in verified_populations().items():
        for n in a.labelled or (16, 32):
            f, b, r = _cells(np.asarray(X, np.float64), np.asarray(A, np.float64), n, a.prompts, a.datasets, 2026 + n)
            sure = f & (b <= CAP)
            print(f"| {pop}{' (held out)' if held else ''} | {n} | {f.mean():.3f} | {sure.sum() / max(f.sum(), 1):.3f}"
                  f" | {int((r[f] > CAP).sum())} | {int((r[sure] > CAP).sum())} | {np.median(b[f]):.1f} | "
                  f"{np.median(r[f]):.1f} |", flush=True)
    print(f"\n{a.datasets} datasets of N = {a.prompts} per row (seed 2026 + n); ratios over the dataset's own t interval "
          "of exact on all N prompts.")


if __name__ == "__main__":
    main()
