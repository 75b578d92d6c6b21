"""Benchmark: the audit's statistics stages (edge_stats, stability) from a large score table, time and peak memory
against the edge count, streamed against in memory (issue 36, item 4).

Run: OMP_NUM_THREADS=1 nice python bench/audit_scale.py [--edges 100000 400000] [--n 512] [--b 100]

No model: for each edge count E a heavy-tailed [N, E] float32 score table is written as the audit writes
``scores_<method>.parquet`` (bench/scale.py's generator: zstd, row groups of at most 64 MiB). Then one fresh process
per (E, path) runs what the audit's edge_stats and stability stages run (circuitstat.pipelines.runs.audit.run
._analysis_stages): the scores through circuitstat.pipelines.runs.audit.scores.RunScores, the run's resampling plans
(B = --b, the spec's bootstrap.n_resamples), pipelines.runs.audit.tables.edge_stats_table (per-edge intervals, p- and
q-values, the reliability flag) and stability_tables (stability vs k at k = 100, 1000, 10000 with the data-level
intervals, inclusion), and writes the three tables into a run directory as the stages do (schema-checked
Parquet). Paths: "blocks" is the audit's (RunScores.columns: ParquetColumns keeping 1 GiB of columns); "memory"
sets STREAM_BYTES above the matrix, so RunScores hands the stages the whole matrix, as the audit did before.
Peak memory is the child's own maximum resident set (os.wait4); time is the child's CPU seconds on one thread
(wall time beside it: the machine is shared). Each child prints a digest of its three tables: equal digests
mean bit-identical tables.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

KS = [100, 1000, 10000]
METHOD = "eap"
SPEC_DOC = {"bench": "audit_scale"}  # one spec and seed: both paths draw the same resamples


def _spec(b: int):
    from circuitstat.pipelines.spec import parse_spec

    return parse_spec({"model": "random:gpt2", "task": {"name": "induction", "n": 512}, "methods": [METHOD],
                       "k": KS, "faithfulness": False, "bootstrap": {"n_resamples": b}})


def child(root: str, how: str, b: int) -> None:
    """The audit's edge_stats and stability stages on ``root``/scores_eap.parquet; print one JSON line."""
    from circuitstat.core.rundir import RunDir
    from circuitstat.pipelines.runs.audit import scores as audit_scores
    from circuitstat.pipelines.runs.audit.run import resampling_plan
    from circuitstat.pipelines.runs.audit.tables import edge_stats_table, stability_tables

    spec = _spec(b)
    if how == "memory":
        audit_scores.STREAM_BYTES = 2**62
    out: dict = {}
    with RunDir(Path(root), spec=SPEC_DOC, seed=0) as run:  # the same seeds for both paths
        scores = audit_scores.RunScores(run, [METHOD])
        N, E = scores.n_examples, scores.n_columns
        names = [f"e{i}" for i in range(E)]
        t0 = time.process_time()
        plan = resampling_plan(spec, N, None, run.stage_seed("resampling"), for_intervals=True)
        stats = edge_stats_table(scores.columns(METHOD), names, METHOD, plan, spec, 1)
        out["edge_stats_s"] = time.process_time() - t0
        t0 = time.process_time()
        plan = resampling_plan(spec, N, None, run.stage_seed("resampling"), for_intervals=False)
        stab, inc = stability_tables(scores.columns(METHOD), names, METHOD, plan, KS, spec, 1)
        out["stability_s"] = time.process_time() - t0
        digest = hashlib.sha256()
        for name, table in (("edge_stats", stats), ("stability_vs_k", stab), ("inclusion", inc)):
            run.write_table(name, table)  # checked against the registered schema
            digest.update(json.dumps({c: list(map(str, v)) if isinstance(v, list) else v.tobytes().hex()
                                      for c, v in table.items()}, sort_keys=True).encode())
    out["digest"] = digest.hexdigest()[:12]
    out["q_below_0.05"] = int((stats["q"] < 0.05).sum())
    out["whole_loads"] = len(scores.loads)
    print(json.dumps(out))


def measure(root: Path, how: str, b: int) -> dict:
    """The child's JSON, its peak RSS (bytes) and CPU/wall seconds, from os.wait4."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, __file__, "--child", str(root), how, str(b)], stdout=subprocess.PIPE,
                         env=env, text=True)
    text = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"child {how} on {root.name} failed ({os.waitstatus_to_exitcode(status)})")
    out = json.loads(text.strip().splitlines()[-1])
    out.update(peak=usage.ru_maxrss * 1024, cpu=usage.ru_utime + usage.ru_stime, wall=time.perf_counter() - t0)
    return out


def main() -> None:
    from circuitstat.core.rundir import RunDir
    from scale import write_scores  # bench/scale.py: the same heavy-tailed table, written as the project writes it

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--edges", type=int, nargs="+", default=[100_000, 400_000])
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--b", type=int, default=100, help="the spec's bootstrap.n_resamples (both stages)")
    ap.add_argument("--memory-up-to", type=int, default=400_000, help="largest E the in-memory path runs at")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], int(a.child[2]))
    print(f"# bench/audit_scale.py: the audit's edge_stats + stability stages; N = {a.n}, B = {a.b}, k = {KS} "
          "(the audit's data-level defaults: double bootstrap 100 x 20 + splits, size 2N); one thread; peak RSS of each "
          "child")
    print(f"{'E':>9} {'path':>6} {'cpu s':>8} {'wall s':>8} {'edge_stats':>10} {'stability':>9} {'peak GiB':>8} "
          f"{'whole':>5}  digest")
    rows = []
    with tempfile.TemporaryDirectory(prefix="circuitstat-audit-scale-") as tmp:
        for e in a.edges:
            root = Path(tmp) / f"run-{e}"
            with RunDir(root, spec=SPEC_DOC, seed=0):  # the run directory the scores stage would have made
                pass
            write_scores(root / f"scores_{METHOD}.parquet", a.n, e)
            for how in ("blocks", "memory") if e <= a.memory_up_to else ("blocks",):
                r = measure(root, how, a.b)
                rows.append((e, how, r))
                print(f"{e:>9,} {how:>6} {r['cpu']:>8.1f} {r['wall']:>8.1f} {r['edge_stats_s']:>10.1f} "
                      f"{r['stability_s']:>9.1f} {r['peak'] / 2**30:>8.2f} {r['whole_loads']:>5}  {r['digest']}",
                      flush=True)
    for e in a.edges:
        mine = {h: r for x, h, r in rows if x == e}
        if len(mine) == 2:
            b, m = mine["blocks"], mine["memory"]
            print(f"E = {e:,}: blocks / memory: cpu x{b['cpu'] / m['cpu']:.2f}, peak x{b['peak'] / m['peak']:.2f}; "
                  f"tables {'identical' if b['digest'] == m['digest'] else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
