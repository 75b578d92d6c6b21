"""A resumed run never uses a finished stage's output that changed since it was recorded (issue 28):
edited, truncated, swapped or linked outputs make the stage run again; unchanged ones are not re-hashed."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import circuitstat.core.rundir
from circuitstat.core.rundir import RunDir
from circuitstat.core.tables import matrix_to_table, read_table


def _pipeline(run: RunDir, calls: list) -> None:
    def a():
        calls.append("a")
        return {"a": matrix_to_table(np.random.default_rng(run.stage_seed("a")).standard_normal((20, 3)))}

    def b():
        calls.append("b")
        return {"b": matrix_to_table(np.asarray(run.table("a").column("scores").to_pylist()) * 2)}

    run.stage("a", a, ["a"])
    run.stage("b", b, ["b"], depends_on=["a"])


@pytest.mark.parametrize("how", ["edited", "truncated", "swapped", "symlinked"])
def test_a_changed_output_is_recomputed_on_resume(tmp_path, how):
    out = tmp_path / "run"
    calls: list = []
    with RunDir(out, seed=1) as run:
        _pipeline(run, calls)
    good = read_table(out / "a.parquet")
    target = out / "a.parquet"
    if how == "edited":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    elif how == "truncated":
        target.write_bytes(target.read_bytes()[:-10])
    elif how == "swapped":
        shutil.copy(out / "b.parquet", target)
    elif how == "symlinked":
        outside = tmp_path / "outside.parquet"
        shutil.copy(out / "b.parquet", outside)
        target.unlink()
        target.symlink_to(outside)
    with pytest.warns(UserWarning, match="missing or changed"):
        with RunDir(out) as run:
            _pipeline(run, calls)
    assert calls == ["a", "b", "a"]  # a ran again; b depends on a's fingerprint, not its bytes: kept
    assert read_table(out / "a.parquet").equals(good) and not target.is_symlink()


def test_unchanged_outputs_are_not_hashed_again(tmp_path, monkeypatch):
    out = tmp_path / "run"
    calls: list = []
    with RunDir(out, seed=1) as run:
        _pipeline(run, calls)
    import types

    import circuitstat.core.integrity

    monkeypatch.setattr(circuitstat.core.integrity, "hashlib", types.SimpleNamespace(sha256=lambda *a: pytest.fail("re-hashed")))
    with RunDir(out) as run:
        _pipeline(run, calls)
    assert calls == ["a", "b"]
    assert circuitstat.core.rundir.RunDir.read_manifest(out)["stages"]["a"]["outputs"]["a"]["identity"]
