"""Benchmark: the statistics at the size of a large model's graph (issue 36, item 4), time and peak memory
against the edge count.

Run: OMP_NUM_THREADS=1 nice python bench/scale.py [--edges 1600000 100000 400000] [--n 512] [--memory-up-to 100000]
(sizes run in the order given; growth is against the smallest)

For each edge count E a score table of N examples x E edges (float32: normal scores times a per-edge scale
and a Student-t(2) weight per prompt, heavy-tailed like real ones) is written as the project writes it
(circuitstat.core.tables: zstd, row groups of at most 64 MiB), without ever holding it whole. Then one fresh process per (E, path) runs, on one thread:
  - per-edge intervals (bootstrap_edges, B = --b-intervals, default 200, the default symmetric studentized
    interval) and their BH q-values;
  - circuit_stability at k in {100, 1000, 10000} (B = --b-stability, default 50), with the data-level
    intervals (a double bootstrap of 50 x 10, the minimum, plus the split and size-2N resamples: 830
    resamples, a running top-10000 each).
Memory does not grow with B (no [E, B] array is held; chunks are sized by max_bytes = 1 GiB); time does, about
linearly (the defaults keep a run at 1.6 M edges to minutes of one core).
Paths: "blocks" reads the table through circuitstat.core.score_columns.ParquetColumns (1 GiB of columns at a
time); "memory" loads the whole [N, E] matrix first (where --memory-up-to allows). Peak memory is the child's
own maximum resident set (os.wait4: the kernel's accounting, file reads included). Time is CPU seconds of the
child (the machine is shared; wall time is printed beside it). Growth ratios are against the smallest E of the
same path, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

LIMIT = 16 * 2**30
KS = (100, 1000, 10000)


def write_scores(path: Path, n: int, e: int, seed: int = 0) -> None:
    """Write an [n, e] heavy-tailed float32 score table in the project's format, a few rows at a time."""
    import numpy as np
    import pyarrow.parquet as pq

    from circuitstat.core.tables import matrix_to_table, rows_per_group

    rng = np.random.default_rng(seed)
    scale = rng.gamma(1.0, 1.0, e).astype(np.float32)
    weight = rng.standard_t(2, n).astype(np.float32)  # per prompt: a few prompts carry most of every mean
    rows = rows_per_group(matrix_to_table(np.zeros((1, e), np.float32), {"example": [0]}))
    writer = None
    for r0 in range(0, n, rows):
        block = rng.standard_normal((min(rows, n - r0), e), dtype=np.float32) * scale
        block *= weight[r0:r0 + block.shape[0], None]
        t = matrix_to_table(block, {"example": np.arange(r0, r0 + block.shape[0])})
        writer = writer or pq.ParquetWriter(path, t.schema, compression="zstd")
        writer.write_table(t, row_group_size=rows)
    writer.close()


def child(path: str, how: str, b_intervals: int, b_stability: int) -> None:
    """Run the statistics on the table at ``path`` (``how``: blocks or memory); print one JSON line."""
    import numpy as np

    from circuitstat.core.score_columns import ParquetColumns
    from circuitstat.core.tables import read_table, table_to_matrix
    from circuitstat.stats.intervals import bootstrap_edges
    from circuitstat.stats.stability import circuit_stability

    out: dict = {}
    t0 = time.process_time()
    S = ParquetColumns(path) if how == "blocks" else table_to_matrix(read_table(path, ["scores"]))
    out["load_s"] = time.process_time() - t0
    t0 = time.process_time()
    res = bootstrap_edges(S, n_resamples=b_intervals, seed=1, max_bytes=2**30)
    out["intervals_s"] = time.process_time() - t0
    out["q_below_0.05"] = int((res.qvalue < 0.05).sum())
    t0 = time.process_time()
    st = circuit_stability(S, ks=KS, ranking="absolute", n_resamples=b_stability, seed=2, n_outer=50, n_inner=10,
                           n_rank_resamples=10, max_bytes=2**30)
    out["stability_s"] = time.process_time() - t0
    out["jaccard_data"] = [round(float(x), 4) for x in st.per_k["jaccard_data"]]
    out["passes"] = getattr(S, "passes", 0)
    print(json.dumps(out))


def measure(path: Path, how: str, b_intervals: int, b_stability: int) -> dict:
    """The child's JSON, its peak RSS (bytes) and CPU/wall seconds, from os.wait4."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, __file__, "--child", str(path), how, str(b_intervals),
                          str(b_stability)], stdout=subprocess.PIPE, env=env,
                         text=True)
    text = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"child {how} on {path.name} failed ({p.returncode})")
    out = json.loads(text.strip().splitlines()[-1])
    out.update(peak=usage.ru_maxrss * 1024, cpu=usage.ru_utime + usage.ru_stime, wall=time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--edges", type=int, nargs="+", default=[1_600_000, 100_000, 400_000])
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--memory-up-to", type=int, default=100_000, help="largest E the in-memory path runs at")
    ap.add_argument("--b-intervals", type=int, default=200, help="bootstrap resamples of the per-edge intervals")
    ap.add_argument("--b-stability", type=int, default=50, help="resamples of the stability estimates")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], int(a.child[2]), int(a.child[3]))
    print(f"# bench/scale.py: N = {a.n}; intervals B = {a.b_intervals} (studentized symmetric) + BH q-values; "
          f"stability B = {a.b_stability} at k = {KS} with data-level 50 x 10 (+ splits, size 2N); one thread; "
          "peak RSS of each child")
    print(f"{'E':>9} {'path':>6} {'cpu s':>8} {'wall s':>8} {'intervals':>9} {'stability':>9} {'peak GiB':>8} "
          f"{'passes':>6}  q<.05  J_data(k)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="circuitstat-scale-") as tmp:
        for e in a.edges:
            path = Path(tmp) / f"scores-{e}.parquet"
            write_scores(path, a.n, e)
            for how in ("blocks", "memory") if e <= a.memory_up_to else ("blocks",):
                r = measure(path, how, a.b_intervals, a.b_stability)
                rows.append((e, how, r))
                print(f"{e:>9,} {how:>6} {r['cpu']:>8.1f} {r['wall']:>8.1f} {r['intervals_s']:>9.1f} "
                      f"{r['stability_s']:>9.1f} {r['peak'] / 2**30:>8.2f} {r['passes']:>6}  {r['q_below_0.05']:>5} "
                      f"{r['jaccard_data']}", flush=True)
            path.unlink()
    for how in ("blocks", "memory"):
        mine = [(e, r) for e, h, r in rows if h == how]
        if len(mine) < 2:
            continue
        e0, r0 = min(mine, key=lambda er: er[0])
        for e, r in sorted(mine, key=lambda er: er[0])[1:]:
            print(f"growth {how}: E x{e / e0:.0f} -> cpu x{r['cpu'] / r0['cpu']:.2f}, peak memory "
                  f"x{r['peak'] / r0['peak']:.2f}")
    top = max(r["peak"] for _, _, r in rows)
    print(f"largest peak {top / 2**30:.2f} GiB: {'within' if top <= LIMIT else 'OVER'} 16 GiB")


if __name__ == "__main__":
    main()
