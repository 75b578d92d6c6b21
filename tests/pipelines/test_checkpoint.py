"""Long runs survive (issue 15 item 3): chunked checkpoints, resume after kill -9, refused mismatches,
and the --max-memory budget."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from circuitstat.core.errors import InputError
from circuitstat.pipelines.checkpoint import AttributionJob, CheckpointStore, chunk_bounds
from circuitstat.pipelines.cli import app
from circuitstat.core.tables import read_provenance

# big enough that exact patching takes many chunks of one example each (the kill lands mid-run)
MODEL = "random:gpt2?n_layer=4&n_head=4&n_embd=32&vocab_size=96&n_positions=64&seed=3"
ARGS = ["attribute", "--model", MODEL, "--method", "exact", "--n", "24", "--batch-size", "1", "--seed", "2"]
runner = CliRunner()


def _scores(run: Path) -> np.ndarray:
    t = pq.read_table(run / "scores.parquet")
    return np.asarray(t.column("scores").to_pylist(), dtype=np.float32)


def _chunks(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob("*/rows-*.npy"))


def test_chunk_bounds_are_whole_batches_covering_every_row():
    assert chunk_bounds(10, 3) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert chunk_bounds(10, 3, 4) == [(0, 6), (6, 10)]  # 4 examples round up to two batches of 3
    assert chunk_bounds(5, 8, 100) == [(0, 5)]
    with pytest.raises(InputError):
        chunk_bounds(5, 0)


def test_resume_after_kill_9_gives_identical_scores(tmp_path):
    killed = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", "from circuitstat.pipelines.cli import main; main()", *ARGS,
                             "--out", str(killed)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while not _chunks(killed) and proc.poll() is None:  # wait for the first finished chunk
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    done = _chunks(killed)
    assert 1 <= len(done) < 24 and not (killed / "scores.parquet").exists()
    manifest = json.loads(next((killed / "checkpoints").glob("*/checkpoint.json")).read_text())["payload"]
    assert manifest["binding"]["method"] == "exact" and len(manifest["binding"]["chunks"]) == 24

    res = runner.invoke(app, [*ARGS, "--out", str(killed), "--resume"])
    assert res.exit_code == 0, res.output + res.stderr
    assert not (killed / "checkpoints").exists()  # redundant once the table is committed
    prov = read_provenance(pq.read_table(killed / "scores.parquet"))
    assert prov["resumed_chunks"] == len(done)  # the finished chunks were reused, not recomputed

    fresh = tmp_path / "fresh"
    res = runner.invoke(app, [*ARGS, "--out", str(fresh)])
    assert res.exit_code == 0, res.output + res.stderr
    a, b = _scores(killed), _scores(fresh)
    assert a.shape[0] == 24 and np.array_equal(a, b), "resumed scores differ from an uninterrupted run"


def _job(**change) -> AttributionJob:
    base = dict(weight_hash="w" * 64, task_hash="t" * 64, metric="logit_diff", method="exact", level="edge",
                ablation="counterfactual", n=4, columns=46, seed=0,
                options={"batch_size": 2, "max_rows": 256, "ig_steps": 5, "dtype": "float32", "device": "cpu"})
    base.update(change)
    return AttributionJob(**base)


def test_store_refuses_a_different_job_names_the_difference_and_force_discards(tmp_path):
    store = CheckpointStore(tmp_path, _job(), chunk_bounds(4, 2))
    store.start([])
    store.write(0, 2, np.ones((2, 46), np.float32))
    assert store.check(resume=True, force=False) == [(0, 2)]
    with pytest.raises(InputError, match="--resume"):
        store.check(resume=False, force=False)
    other = CheckpointStore(tmp_path, _job(seed=1), chunk_bounds(4, 2))
    with pytest.raises(InputError, match=r"seed: 0 -> 1.*--force"):
        other.check(resume=True, force=False)
    wider = CheckpointStore(tmp_path, _job(options={**_job().options, "batch_size": 4}), chunk_bounds(4, 4))
    with pytest.raises(InputError, match=r"options.batch_size: 2 -> 4"):
        wider.check(resume=True, force=False)
    assert other.check(resume=True, force=True) == []
    other.start([])
    assert other.finished() == []  # the other job's chunk is gone, never mixed in


def test_store_refuses_a_chunk_of_the_wrong_shape(tmp_path):
    store = CheckpointStore(tmp_path, _job(), chunk_bounds(4, 2))
    store.start([])
    store.write(0, 2, np.ones((2, 45), np.float32))  # sealed, but not this job's shape
    with pytest.raises(InputError, match="not float32"):
        store.read(0, 2)
    np.save(store.chunk_path(2, 4), np.ones((2, 46), np.float32))  # planted without a seal
    assert store.finished() == [(0, 2)]
    with pytest.raises(InputError, match="rows-0000002-0000004.npy .*missing"):
        store.read(2, 4)


def test_cli_refuses_mismatched_checkpoints_with_exit_2(tmp_path):
    out = tmp_path / "run"
    small = ["attribute", "--model", "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1",
             "--method", "eap", "--n", "4", "--batch-size", "2", "--out", str(out)]
    res = runner.invoke(app, small)
    assert res.exit_code == 0, res.output + res.stderr
    # leave checkpoints of a different seed behind, as a run killed with other options would
    job = _job(method="eap", columns=pq.read_table(out / "scores.parquet").schema.field("scores").type.list_size)
    store = CheckpointStore(out, job, chunk_bounds(4, 2))
    store.start([])
    store.write(0, 2, np.zeros((2, job.columns), np.float32))
    (out / "scores.parquet").unlink()
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["stages"]["scores"]["status"] = "running"  # as a killed run leaves it
    (out / "manifest.json").write_text(json.dumps(manifest))
    before = sorted(p.name for p in out.rglob("*"))
    res = runner.invoke(app, [*small, "--resume"])
    assert res.exit_code == 2, res.output + res.stderr
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "different run" in err[0] and "weight_hash" in err[0] and "--force" in err[0]
    assert sorted(p.name for p in out.rglob("*")) == before  # nothing written, nothing mixed
    res = runner.invoke(app, [*small, "--force"])
    assert res.exit_code == 0, res.output + res.stderr
    assert (out / "scores.parquet").exists() and not (out / "checkpoints").exists()


def test_max_memory_too_small_is_refused_naming_the_minimum(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ARGS + ["--out", str(out), "--max-memory", "10KiB"])
    assert res.exit_code == 2
    assert "give at least" in res.stderr and not out.exists()
    res = runner.invoke(app, ARGS + ["--out", str(out), "--max-memory", "lots"])
    assert res.exit_code == 2 and "2GiB" in res.stderr


def test_max_memory_fits_the_batch_to_the_budget_and_keeps_the_scores(tmp_path):
    from circuitstat.circuits import load_model
    from circuitstat.circuits.plan import exact_example_bytes, exact_row_bytes, graph_of, weight_bytes
    from circuitstat.pipelines.build import build_task

    src = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1&initializer_range=1.0"  # effects far from float32 noise
    cfg = load_model(src).cfg
    P = int(build_task(load_model(src), "induction", n=6).clean.shape[1])
    # a receiver has at most 4 upstream senders here, so 4 examples use at most 16 suffix rows per call
    budget = weight_bytes(cfg) + 2 * exact_example_bytes(cfg, graph_of(cfg), P) + 16 * exact_row_bytes(cfg, P)
    base = ["attribute", "--model", src, "--method", "exact", "--n", "6", "--batch-size", "4"]
    res = runner.invoke(app, [*base, "--out", str(tmp_path / "free")])
    assert res.exit_code == 0, res.output + res.stderr
    res = runner.invoke(app, [*base, "--out", str(tmp_path / "tight"), "--max-memory", str(budget)])
    assert res.exit_code == 0, res.output + res.stderr
    spec = json.loads((tmp_path / "tight" / "manifest.json").read_text())["spec"]
    assert spec["batch_size"] == 2  # two examples' kept runs fit beside 16 suffix rows, four do not
    np.testing.assert_allclose(_scores(tmp_path / "tight"), _scores(tmp_path / "free"), rtol=1e-5, atol=1e-6)
