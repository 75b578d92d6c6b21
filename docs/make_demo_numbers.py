"""Write docs/demo-numbers.json: the numbers of the demo run that the README, docs/results.md and
examples/claims-zoo.yaml quote in their prose (tests/test_demo_numbers.py checks every quote against this file,
and this file against a demo run when one is at hand).

Run from the repository root after `make demo` (or `circuitstat audit examples/audit-zoo.yaml --out runs/demo`):
    PYTHONPATH=. python docs/make_demo_numbers.py runs/demo > docs/demo-numbers.json
The tables' per-edge, stability, faithfulness and approximation rows need seed 0 only (their resampling seeds are
the spec's seed and the stage's name), so a run of the spec with its first model alone gives the same rows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: table -> (key columns, value columns) quoted in prose
QUOTED = {"edge_stats": (("method", "name"), ("estimate", "ci_low", "ci_high", "q")),
          "stability_vs_k": (("method", "k"), ("jaccard_half", "jaccard_half_ci_low", "jaccard_half_ci_high",
                                                "jaccard_data", "jaccard_data_ci_low", "jaccard_data_ci_high",
                                                "jaccard_chance")),
          "faithfulness_vs_k": (("method", "k"), ("f_selected", "f_selected_ci_low", "f_selected_ci_high", "f_ratio",
                                                   "f_ci_low", "f_ci_high")),
          "approximation_summary": (("method",), ("spearman", "spearman_ci_low", "spearman_ci_high", "r2",
                                                  "r2_ci_low", "r2_ci_high"))}


def demo_numbers(run: str | Path) -> dict[str, dict[str, dict[str, float]]]:
    """{table: {"key|key": {column: value}}} of the run's quoted tables (values as the tables hold them)."""
    import pyarrow.parquet as pq

    out: dict[str, dict[str, dict[str, float]]] = {}
    for table, (keys, values) in QUOTED.items():
        t = pq.read_table(Path(run) / f"{table}.parquet", columns=[*keys, *values]).to_pylist()
        out[table] = {"|".join(str(r[k]) for k in keys): {v: r[v] for v in values} for r in t}
    return out


if __name__ == "__main__":
    json.dump(demo_numbers(sys.argv[1]), sys.stdout, indent=1, sort_keys=True, allow_nan=True)
    sys.stdout.write("\n")
