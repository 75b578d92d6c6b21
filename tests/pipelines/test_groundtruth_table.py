"""`study groundtruth`'s terminal table and power intervals (issue 43 item 3): the verdict is printed whole
('trivial', not 'trivi'), and a power interval stays within [0, 1], where the t interval over datasets left it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def _recall_rows(recalls, fdps) -> list[dict]:
    rows = []
    for r, f in zip(recalls, fdps):
        for stat, v in (("recall", r), ("fdp", f)):
            rows.append({"model": "planted:x", "method": "exact", "n": 32, "family": "test:bootstrap",
                         "statistic": stat, "param": "alpha=0.05", "value": v})
    return rows


RECALLS = [1.0] * 8 + [0.7, 0.75]  # most datasets find every true edge: a t interval runs above 1


def test_power_interval_stays_within_0_and_1_and_keeps_its_lower_end():
    from circuitstat.stats.groundtruth_scoring import fdr_rows, over_datasets

    t = over_datasets(np.asarray(RECALLS))
    assert t["ci_high"] > 1  # negative control: the plain t interval leaves [0, 1]
    (row,) = fdr_rows(_recall_rows(RECALLS, [0.0] * 10), ["model", "method", "n"])
    assert row["power_ci_high"] == 1.0 and row["power_ci_low"] == t["ci_low"] and row["power"] == t["mean"]
    (low,) = fdr_rows(_recall_rows([0.0] * 8 + [0.3, 0.25], [0.0] * 10), ["model", "method", "n"])
    assert low["power_ci_low"] == 0.0 and 0 < low["power_ci_high"] < 1


def test_the_summary_prints_the_whole_verdict_and_the_power_interval():
    from circuitstat.pipelines.runs.groundtruth.study import summary_lines
    from circuitstat.stats.groundtruth_scoring import fdr_rows

    fdr = fdr_rows(_recall_rows(RECALLS, [0.0] * 10), ["model", "method", "n"])
    assert fdr[0]["verdict"] == "trivial"
    summary = {"model": ["planted:x"], "method": ["exact"], "n": [32], "family": ["ranking"],
               "statistic": ["auroc"], "param": [""], "estimate": [0.9], "ci_low": [0.85], "ci_high": [0.95],
               "n_datasets": [10]}
    tables = {"groundtruth_summary": pa.table(summary), "groundtruth_models": pa.table({"model": ["planted:x"],
                                                                                          "n_true": [3]}),
              "groundtruth_fdr": pa.table({k: [r[k] for r in fdr] for k in fdr[0]})}
    (line,) = [ln for ln in summary_lines(tables) if ln.startswith("planted:x")]
    assert "0.000 trivial" in line and "trivi " not in line
    assert f"{fdr[0]['power']:.2f} [{fdr[0]['power_ci_low']:.2f},1.00]" in line
