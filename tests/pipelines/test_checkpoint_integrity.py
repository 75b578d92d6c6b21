"""Attribution checkpoints are read back only through their seals (issue 28 item 4): an edited, truncated,
linked or copied chunk (another --seed, another run directory) is refused naming the file, never used."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from circuitstat.pipelines.checkpoint import CheckpointStore
from circuitstat.pipelines.cli import app

MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1"
runner = CliRunner()


def _args(out: Path, seed: int = 0) -> list[str]:
    return ["attribute", "--model", MODEL, "--method", "eap", "--n", "6", "--batch-size", "2", "--seed", str(seed),
            "--out", str(out)]


def _scores(run: Path) -> np.ndarray:
    return np.asarray(pq.read_table(run / "scores.parquet").column("scores").to_pylist(), dtype=np.float32)


def _interrupted(out: Path, seed: int, monkeypatch) -> list[Path]:
    """A finished run turned into one killed after its last chunk: chunks kept, scores stage 'running'."""
    with monkeypatch.context() as m:
        m.setattr(CheckpointStore, "remove", lambda self: None)
        res = runner.invoke(app, _args(out, seed))
    assert res.exit_code == 0, res.output + res.stderr
    (out / "scores.parquet").unlink()
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["stages"]["scores"]["status"] = "running"
    (out / "manifest.json").write_text(json.dumps(manifest))
    return sorted((out / "checkpoints").glob("*/rows-*.npy"))


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> np.ndarray:
    out = tmp_path_factory.mktemp("fresh") / "run"
    assert runner.invoke(app, _args(out)).exit_code == 0
    return _scores(out)


def test_an_untouched_interrupted_run_resumes_to_the_same_scores(tmp_path, monkeypatch, fresh):
    out = tmp_path / "run"
    _interrupted(out, 0, monkeypatch)
    res = runner.invoke(app, [*_args(out), "--resume"])
    assert res.exit_code == 0, res.output + res.stderr
    assert np.array_equal(_scores(out), fresh)


@pytest.mark.parametrize("how", ["edited", "copied-other-seed", "copied-other-run", "truncated", "symlinked",
                                 "seal-swapped"])
def test_a_tampered_chunk_is_refused_naming_it(tmp_path, monkeypatch, fresh, how):
    out = tmp_path / "run"
    chunks = _interrupted(out, 0, monkeypatch)
    target = chunks[1]
    if how == "edited":  # item 4: a chunk x1000
        arr = np.load(target)
        np.save(target, arr * 1000)
    elif how in ("copied-other-seed", "copied-other-run"):  # item 4: a chunk (and its seal) of another run
        other = tmp_path / "other"
        other_chunks = _interrupted(other, 1 if how == "copied-other-seed" else 0, monkeypatch)
        for suffix in (".npy", ".seal"):
            shutil.copy(other_chunks[1].with_suffix(suffix), target.with_suffix(suffix))
    elif how == "truncated":
        target.write_bytes(target.read_bytes()[:-8])
    elif how == "symlinked":
        outside = tmp_path / "outside.npy"
        shutil.copy(target, outside)
        target.unlink()
        target.symlink_to(outside)
    elif how == "seal-swapped":  # two chunks' seals exchanged
        a, b = target.with_suffix(".seal"), chunks[0].with_suffix(".seal")
        ta, tb = a.read_bytes(), b.read_bytes()
        a.write_bytes(tb)
        b.write_bytes(ta)
    res = runner.invoke(app, [*_args(out), "--resume"])
    assert res.exit_code == 2, res.output + res.stderr
    err = res.stderr.strip().splitlines()
    named = target.name if how != "seal-swapped" else "rows-"
    assert len(err) == 1 and named in err[0] and "--force" in err[0], err
    assert not (out / "scores.parquet").exists()  # refused before anything was computed or written
    res = runner.invoke(app, [*_args(out), "--force"])
    assert res.exit_code == 0, res.output + res.stderr
    assert np.array_equal(_scores(out), fresh)  # recomputed, never the tampered numbers


def test_an_edited_scores_run_is_not_a_calibration_population(tmp_path, fresh):
    """A finished attribution run read back as a calibration population must match the digest its run
    recorded: an edited scores.parquet (a real Parquet, other numbers) is refused naming it."""
    import pyarrow as pa

    out = tmp_path / "run"
    assert runner.invoke(app, _args(out)).exit_code == 0
    t = pq.read_table(out / "scores.parquet")
    col = t.column_names.index("scores")
    edited = [[x * 1000 for x in row] for row in t.column("scores").to_pylist()]
    t = t.set_column(col, t.schema.field("scores"), pa.array(edited, type=t.schema.field("scores").type))
    pq.write_table(t, out / "scores.parquet")
    res = runner.invoke(app, ["study", "calibration", "--scores", str(out), "--out", str(tmp_path / "cal")])
    assert res.exit_code == 2, res.output + res.stderr
    assert "scores.parquet does not match the digest its run recorded" in res.stderr
    assert not (tmp_path / "cal").exists()
