"""Print the heavy-tail tables of docs/calibration.md: per-edge coverage of the per-edge intervals on real
heavy-tailed populations (worst edge, edges below 0.90, the worst edge among cells flagged reliable, coverage of
unreliable cells, coverage by kurtosis decile).

Run from the repository root after tests/fixtures/make_tails_populations.py (one thread; minutes per population):
    OMP_NUM_THREADS=1 python docs/make_calibration_tails.py [DATASETS] [OUT_DIR] [POPULATION ...] > /tmp/tails.md
DATASETS (default 1000) datasets per N; OUT_DIR (optional, "-" for none) keeps each population's result tables as
Parquet; POPULATION: some of the names below (default all).
Populations: tests/fixtures/zoo-induction-exact.parquet (attention-only, 2 layers, 1024 prompts),
tails-mlp3l-induction-exact.parquet and tails-mlp4l-rotary-induction-exact.parquet (2,048 prompts each).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from circuitstat.stats.calibration import coverage_study
from circuitstat.stats.calibration_kinds import edge_interval_kinds
from circuitstat.stats.tails import edge_tails

ROOT = Path(__file__).resolve().parents[1]
POPULATIONS = {"zoo attn-only-2l": "zoo-induction-exact.parquet", "mlp3l": "tails-mlp3l-induction-exact.parquet",
               "mlp4l-rotary": "tails-mlp4l-rotary-induction-exact.parquet"}
SIZES, METHODS, B = (32, 64, 128), ("studentized_symmetric", "t", "bca"), 500


def _facts(name: str, x: np.ndarray) -> str:
    t = edge_tails(x)
    k = t.excess_kurtosis[np.isfinite(t.excess_kurtosis)]
    big = t.abs_mean_rank <= max(1, x.shape[1] // 4)
    w = int(np.nanargmax(np.where(big, t.top_prompt_share, -np.inf)))
    q = np.quantile(k, [0.1, 0.5, 0.9])
    return (f"| {name} | {x.shape[0]} | {x.shape[1]} | {q[0]:.1f} / {q[1]:.1f} / {q[2]:.1f} / {k.max():.0f} | "
            f"{int(np.sum(k > 100))} | {t.top_prompt_share[w]:.2f} (rank {t.abs_mean_rank[w]}, kurtosis "
            f"{t.excess_kurtosis[w]:.0f}) | {int(np.sum(big & (t.top_prompt_share > 0.5)))} |")


def _row(pop: str, r: dict) -> str:
    rel = (f"{r['worst_reliable_unit']} (rank {r['worst_reliable_unit_abs_mean_rank']:.0f}, kurt "
           f"{r['worst_reliable_unit_excess_kurtosis']:.0f}): {r['worst_reliable_unit_coverage']:.3f} of "
           f"{r['worst_reliable_unit_cells']}") if r["worst_reliable_unit"] else "—"
    return (f"| {pop} | {r['kind'][5:]} | {r['n']} | {r['coverage']:.3f} ± {r['coverage_mc_se']:.3f} | "
            f"{r['worst_unit']} (rank {r['worst_unit_abs_mean_rank']:.0f}, kurt {r['worst_unit_excess_kurtosis']:.0f}, "
            f"share {r['worst_unit_top_prompt_share']:.2f}): {r['worst_unit_coverage']:.3f} | "
            f"{r['n_units_below_floor']} | {r['coverage_reliable']:.3f} ({r['share_reliable']:.2f}) | {rel} | "
            f"{r['n_units_reliable_below_floor']} | {r['coverage_unreliable']:.3f} ± {r['coverage_unreliable_mc_se']:.3f} |")


def main(n_datasets: int, out: Path | None, names: list[str] | None = None) -> None:
    facts, rows, deciles, worst = [], [], [], []
    for pop in names or list(POPULATIONS):
        file = POPULATIONS[pop]
        tab = pq.read_table(ROOT / "tests" / "fixtures" / file)
        x = np.column_stack([tab.column(i).to_numpy() for i in range(tab.num_columns)]).astype(np.float64)
        facts.append(_facts(pop, x))
        t0 = time.process_time()
        kinds = edge_interval_kinds(x, n_resamples=B, confidence_level=0.95, edge_names=tab.column_names,
                                    methods=list(METHODS))
        res = coverage_study(x, SIZES, kinds, n_datasets=n_datasets, seed=20261203)
        print(f"<!-- {pop}: {time.process_time() - t0:.0f} CPU-s -->", flush=True)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            for name, table in res.tables().items():
                pq.write_table(table, out / f"{pop.replace(' ', '_')}-{name}.parquet")
        rows += [_row(pop, r) for r in res.rows]
        for n in SIZES:
            d = [r for r in res.by_kurtosis if r["n"] == n and r["kind"] == "edge/studentized_symmetric"]
            deciles.append(f"| {pop} | {n} | " + " | ".join(
                f"{r['coverage']:.3f} / {r['coverage_reliable']:.3f}" for r in d) + " |")
            units = sorted((u for u in res.per_unit if u["n"] == n and u["kind"] == "edge/studentized_symmetric"),
                           key=lambda u: u["coverage"])[:3]
            worst += [f"| {pop} | {n} | {u['unit_label']} | {u['abs_mean_rank']:.0f} | {u['excess_kurtosis']:.0f} | "
                      f"{u['top_prompt_share']:.2f} | {u['coverage']:.3f} | {u['coverage_reliable']:.3f} "
                      f"({u['n_reliable_cells']}) | {u['coverage_unreliable']:.3f} ({u['n_unreliable_cells']}) |"
                      for u in units]
    print("| population | prompts | edges | excess kurtosis q10 / q50 / q90 / max | edges > 100 | largest top-prompt "
          "share, top quarter by \\|mean\\| | top-quarter edges with share > 0.5 |\n|---|---|---|---|---|---|---|")
    print("\n".join(facts) + "\n")
    print("| population | interval | N | coverage ± MC | worst edge (\\|mean\\| rank, kurtosis, top share): coverage | "
          "edges < 0.90 | reliable cells: coverage (share) | worst edge among reliable cells: coverage of cells | "
          "edges < 0.90 among reliable | unreliable cells ± MC |\n|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows) + "\n")
    print("| population | N | " + " | ".join(f"d{i}" for i in range(1, 11)) + " |\n|---|---|" + "---|" * 10)
    print("\n".join(deciles) + "\n")
    print("| population | N | edge | \\|mean\\| rank | kurtosis | top share | coverage | reliable (cells) | "
          "unreliable (cells) |\n|---|---|---|---|---|---|---|---|---|")
    print("\n".join(worst))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000,
         Path(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "-" else None, sys.argv[3:] or None)
