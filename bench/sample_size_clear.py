"""Validation of circuitstat.stats.sample_size.clear_probability: predicted against realised chance that the
data-level interval's lower end clears a target, on two known populations (docs/sample-size.md).

Realised: the share of 40 datasets of N drawn from the population whose circuit_stability data-level interval
(jaccard_data_ci_low, the audit's defaults) clears the target. Predicted: clear_probability from each of 12
pilots of 32 prompts (15 simulated datasets each); printed with how often the prediction lay within 2 of its
binomial Monte Carlo SEs of the realised share.

    OMP_NUM_THREADS=1 nice python bench/sample_size_clear.py      # about 35 CPU-s
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from circuitstat.stats.sample_size import clear_probability  # noqa: E402
from circuitstat.stats.stability import circuit_stability  # noqa: E402


def main() -> None:
    """Print one line per population."""
    from fixture_populations import load_planted_pair, load_zoo_fixture

    t0 = time.process_time()
    n, k, pilots, sims, real_n = 128, 5, 12, 15, 40
    for name, P, target in [("zoo-induction-exact", load_zoo_fixture()[0], 0.5),
                            ("planted3-exact", load_planted_pair()[0], 0.3)]:
        rng = np.random.default_rng(11)
        real = np.mean([circuit_stability(P[rng.integers(0, P.shape[0], n)], ks=[k], ranking="absolute", seed=d,
                                          data_level=True).per_k["jaccard_data_ci_low"][0] >= target
                        for d in range(real_n)])
        preds = np.array([clear_probability(P[rng.integers(0, P.shape[0], 32)], n, [k], target, ranking="absolute",
                                            n_datasets=sims, seed=r)["p_clear"][0] for r in range(pilots)])
        se = np.sqrt(np.maximum(preds * (1 - preds), 1 / sims) / sims)
        print(f"{name} N={n} k={k} target {target}: realised {real:.2f} (+- {np.sqrt(real * (1 - real) / real_n):.2f},"
              f" {real_n} datasets); predicted over {pilots} pilots: mean {preds.mean():.2f}, range "
              f"{preds.min():.2f}-{preds.max():.2f}; within 2 MC SE of the realised in {np.mean(np.abs(preds - real) <= 2 * se):.2f}")
    print(f"CPU-s {time.process_time() - t0:.0f}")


if __name__ == "__main__":
    main()
