"""Claims on a run over a large graph (issue 36, item 4): looking up an edge's row in a large edge_stats
indexes the key columns only, never a Python dict per row of every column."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from circuitstat.pipelines.claims.reader import RunReader

E = 10_000
EXTRA = 16  # float columns a claim does not read (edge_stats has about twenty)


def test_edge_lookup_in_a_large_table_holds_only_the_key_columns(tmp_path):
    rng = np.random.default_rng(0)
    cols = {"method": pa.array(["eap"] * E + ["exact"] * E), "name": pa.array([f"e{i}" for i in range(E)] * 2),
            "estimate": pa.array(rng.standard_normal(2 * E)), "q": pa.array(rng.random(2 * E))}
    cols.update({f"x{j}": pa.array(rng.random(2 * E)) for j in range(EXTRA)})
    table = pa.table(cols)
    pq.write_table(table, tmp_path / "edge_stats.parquet")
    run = RunReader(tmp_path)
    run.table("edge_stats", [])  # read the file first: the bound below is on the look-up alone
    tracemalloc.start()
    got = run.rows("edge_stats", ["estimate", "q"], method="exact", name="e4321")
    again = run.rows("edge_stats", ["estimate"], method="eap", name="e7")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    i = E + 4321
    assert got == [{"estimate": table["estimate"][i].as_py(), "q": table["q"][i].as_py(), "method": "exact",
                    "name": "e4321"}]
    assert again == [{"estimate": table["estimate"][7].as_py(), "method": "eap", "name": "e7"}]
    assert run.rows("edge_stats", ["q"], method="exact", name="nope") == []
    # two key columns of 20,000 rows as Python objects and the index: about 6 MB; a dict of all 20 columns per
    # row (what the look-up built before) is about 45 MB
    assert peak < 12 * 2**20, peak / 2**20
