"""Run directories: lock exclusivity, stale locks, kill -9 and resume, stage spec fingerprints."""

import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from circuitstat.core.atomic import TMP_SUFFIX
from circuitstat.core.lock import DirLock, RunLockedError, StaleLockWarning
from circuitstat.core.rundir import RunDir, RunDirError, StageOutputError, StageSpecChangedError
from circuitstat.core.tables import matrix_to_table, read_provenance, read_table, table_to_matrix

ROOT = Path(__file__).resolve().parents[2]
FORK = mp.get_context("fork")  # children inherit the test's imports; fast


# ----- lock -------------------------------------------------------------------------------------
def _hold_run(path, ready, release):
    with RunDir(path):
        ready.set()
        release.wait(20)


def test_lock_excludes_a_second_process_until_released(tmp_path):
    ready, release = FORK.Event(), FORK.Event()
    child = FORK.Process(target=_hold_run, args=(tmp_path / "run", ready, release))
    child.start()
    try:
        assert ready.wait(20)
        with pytest.raises(RunLockedError, match=rf"process {child.pid} on host .*delete .*\.lock"):
            RunDir(tmp_path / "run").open()
    finally:
        release.set()
        child.join(20)
    assert child.exitcode == 0
    with RunDir(tmp_path / "run") as run:  # free again, no warning
        assert run.run_id


def _race(path, barrier, results, hold):
    lock = DirLock(path)
    barrier.wait()
    try:
        lock.acquire()
        results.put("won")
        hold.wait(20)
        lock.release()
    except RunLockedError:
        results.put("lost")


def test_exactly_one_of_many_racing_processes_gets_the_lock(tmp_path):
    n = 6
    barrier, results, hold = FORK.Barrier(n), FORK.Queue(), FORK.Event()
    procs = [FORK.Process(target=_race, args=(tmp_path / ".lock", barrier, results, hold)) for _ in range(n)]
    for p in procs:
        p.start()
    outcome = Counter(results.get(timeout=20) for _ in range(n))
    hold.set()
    for p in procs:
        p.join(20)
    assert outcome == {"won": 1, "lost": n - 1}
    assert not (tmp_path / ".lock").exists()


def _take_lock_and_die(path):
    DirLock(path).acquire()
    os.kill(os.getpid(), signal.SIGKILL)


def test_stale_lock_of_dead_process_is_taken_over_with_warning(tmp_path):
    (tmp_path / "run").mkdir()
    child = FORK.Process(target=_take_lock_and_die, args=(tmp_path / "run" / ".lock",))
    child.start()
    child.join(20)
    assert child.exitcode == -signal.SIGKILL
    assert json.loads((tmp_path / "run" / ".lock").read_text())["pid"] == child.pid
    with pytest.warns(StaleLockWarning, match=rf"process {child.pid} .* no longer running"):
        with RunDir(tmp_path / "run") as run:
            assert json.loads((tmp_path / "run" / ".lock").read_text())["pid"] == os.getpid()
            assert run.run_id
    assert not (tmp_path / "run" / ".lock").exists()


def test_lock_from_other_host_is_not_stolen(tmp_path):
    lock = tmp_path / ".lock"
    lock.write_text(json.dumps({"pid": 1, "host": socket.gethostname() + "-elsewhere", "token": "x"}))
    with pytest.raises(RunLockedError, match="elsewhere.*delete"):
        DirLock(lock).acquire()
    assert lock.exists()


def test_unreadable_old_lock_is_taken_over(tmp_path):
    lock = tmp_path / ".lock"
    lock.write_bytes(b"")  # a writer killed between create and write
    os.utime(lock, (time.time() - 60, time.time() - 60))
    with pytest.warns(StaleLockWarning, match="unreadable"):
        with DirLock(lock) as held:
            assert held.held


def test_same_process_cannot_open_one_run_twice(tmp_path):
    with RunDir(tmp_path / "r"):
        with pytest.raises(RunLockedError, match=str(os.getpid())):
            RunDir(tmp_path / "r").open()


# ----- stages and resume -------------------------------------------------------------------------
def _matrix(seed_seq, n=8, e=5):
    return np.random.default_rng(seed_seq).standard_normal((n, e)).astype(np.float32)


def test_resume_after_exception_recomputes_only_unfinished_stages(tmp_path):
    calls = Counter()

    def pipeline(run, fail_in=None):
        def a():
            calls["a"] += 1
            return {"scores": matrix_to_table(_matrix(run.stage_seed("a")))}

        def b():
            calls["b"] += 1
            run.write_table("b1", {"x": [1, 2]})
            if fail_in == "b":
                raise KeyboardInterrupt  # like Ctrl-C in the middle of a stage
            return {"b2": {"y": [3.0]}}

        def c():
            calls["c"] += 1
            s = table_to_matrix(run.table("scores"))
            return {"c": {"mean": s.mean(0)}}

        run.stage("a", a, ["scores"], params={"n": 8})
        run.stage("b", b, ["b1", "b2"], depends_on=["a"])
        run.stage("c", c, ["c"], depends_on=["a", "b"])

    with RunDir(tmp_path / "r", seed=3) as run, pytest.raises(KeyboardInterrupt):
        pipeline(run, fail_in="b")
    assert calls == {"a": 1, "b": 1}
    m = RunDir.read_manifest(tmp_path / "r")
    assert m["stages"]["a"]["status"] == "done" and m["stages"]["b"]["status"] == "failed"
    assert "KeyboardInterrupt" in m["stages"]["b"]["error"]

    with RunDir(tmp_path / "r", seed=3) as run:
        pipeline(run)
        assert all(run.is_done(s) for s in "abc")
    assert calls == {"a": 1, "b": 2, "c": 1}

    with RunDir(tmp_path / "r") as run:  # everything done: nothing recomputed
        pipeline(run)
    assert calls == {"a": 1, "b": 2, "c": 1}

    prov = read_provenance(tmp_path / "r" / "scores.parquet")
    assert prov["stage"]["name"] == "a" and prov["stage"]["params"] == {"n": 8}
    assert prov["seed"]["entropy"] == 3
    assert prov["run"]["id"] == m["run_id"]


# A three-stage run in a subprocess that SIGKILLs itself at a chosen point inside stage b.
KILLED_RUN = textwrap.dedent(
    """
    import io, os, signal, sys
    import numpy as np
    import pyarrow.parquet as pq
    import circuitstat.core.rundir
    from circuitstat.core.rundir import RunDir
    from circuitstat.core.tables import matrix_to_table
    out, kill_at = sys.argv[1], sys.argv[2]
    log = open(out + ".calls", "a")
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    def stage_fn(run, name, outputs):
        def fn():
            log.write(name + "\\n"); log.flush()
            rng = np.random.default_rng(run.stage_seed(name))
            tables = {o: matrix_to_table(rng.standard_normal((50, 7)).astype(np.float32)) for o in outputs}
            if name == "b":
                run.write_table(outputs[0], tables.pop(outputs[0]))
                if kill_at == "in_fn":
                    die()
                if kill_at == "mid_write":  # die with half of b2 written to its temp file
                    real = pq.write_table
                    def half(t, f, **kw):
                        buf = io.BytesIO(); real(t, buf, **kw)
                        f.write(buf.getvalue()[:1000]); f.flush(); die()
                    pq.write_table = half
                if kill_at == "before_commit":  # outputs all written, manifest not yet updated
                    circuitstat.core.rundir.hash_file = lambda p: die()
            return tables
        return fn
    with RunDir(out, spec={"demo": 1}, seed=11) as run:
        run.stage("a", stage_fn(run, "a", ["a"]), ["a"])
        run.stage("b", stage_fn(run, "b", ["b1", "b2"]), ["b1", "b2"], depends_on=["a"])
        run.stage("c", stage_fn(run, "c", ["c"]), ["c"], depends_on=["b"])
    """
)


def _run_script(out: Path, kill_at: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", KILLED_RUN, str(out), kill_at], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize("kill_at", ["in_fn", "mid_write", "before_commit"])
def test_sigkill_in_a_stage_then_resume_matches_uninterrupted_run(tmp_path, kill_at):
    out = tmp_path / "killed"
    first = _run_script(out, kill_at)
    assert first.returncode == -signal.SIGKILL, first.stderr
    # Nothing partial is visible: every visible table reads completely, the manifest parses,
    # and stage b is not marked done.
    for p in out.glob("*.parquet"):
        read_table(p)
    manifest = RunDir.read_manifest(out)
    assert manifest["stages"]["a"]["status"] == "done"
    assert manifest["stages"]["b"]["status"] == "running"
    assert "c" not in manifest["stages"]

    second = _run_script(out, "never")
    assert second.returncode == 0, second.stderr
    assert "taking over stale lock" in second.stderr
    calls = Counter(Path(str(out) + ".calls").read_text().split())
    assert calls == {"a": 1, "b": 2, "c": 1}
    assert not [p for p in out.rglob("*") if p.name.endswith(TMP_SUFFIX) or p.name == ".lock"]

    clean = tmp_path / "clean"
    assert _run_script(clean, "never").returncode == 0
    for name in ["a", "b1", "b2", "c"]:
        assert read_table(out / f"{name}.parquet").equals(read_table(clean / f"{name}.parquet"))


def test_changed_params_of_finished_stage_raise_then_force_recomputes(tmp_path):
    calls = Counter()

    def run_all(path, n, force=False):
        with RunDir(path) as run:
            def up():
                calls["up"] += 1
                return {"up": {"n": [n]}}

            def down():
                calls["down"] += 1
                return {"down": {"n2": [read_table(run.output_path("up"))["n"][0].as_py() * 2]}}

            run.stage("up", up, ["up"], params={"n": n, "method": "eap"}, force=force)
            run.stage("down", down, ["down"], depends_on=["up"], force=force)

    run_all(tmp_path, 10)
    with pytest.raises(StageSpecChangedError, match=r"stage 'up'.*n: 10 -> 20.*force=True"):
        run_all(tmp_path, 20)
    assert calls == {"up": 1, "down": 1}
    assert read_table(tmp_path / "down.parquet")["n2"].to_pylist() == [20]  # old results untouched

    with RunDir(tmp_path) as run:  # downstream of a changed upstream is refused too
        run.stage("up", lambda: {"up": {"n": [20]}}, ["up"], params={"n": 20, "method": "eap"}, force=True)
        with pytest.raises(StageSpecChangedError, match=r"stage 'down'.*upstream"):
            run.stage("down", lambda: None, ["down"], depends_on=["up"])

    run_all(tmp_path, 20, force=True)  # up already matches; only down recomputes
    assert calls == {"up": 1, "down": 2}
    assert read_table(tmp_path / "down.parquet")["n2"].to_pylist() == [40]
    run_all(tmp_path, 20)
    assert calls == {"up": 1, "down": 2}


def test_stage_outputs_must_match_declaration(tmp_path):
    with RunDir(tmp_path) as run:
        with pytest.raises(StageOutputError, match=r"declared outputs \['b'\] but did not write"):
            run.stage("s", lambda: {"a": {"x": [1]}}, ["a", "b"])
        assert not run.is_done("s")
        with pytest.raises(StageOutputError, match="undeclared"):
            run.stage("t", lambda: {"zzz": {"x": [1]}}, ["a"])
        with pytest.raises(StageOutputError, match="not among its outputs"):
            run.stage("u", lambda: run.write_table("other", {"x": [1]}), ["a"])
        with pytest.raises(RunDirError, match="has not finished"):
            run.stage("v", lambda: None, [], depends_on=["s"])


def test_outputs_left_by_a_failed_attempt_do_not_count(tmp_path):
    def writes_then_fails():
        run.write_table("a", {"x": [1]})
        raise RuntimeError("boom")

    with RunDir(tmp_path) as run:
        with pytest.raises(RuntimeError, match="boom"):
            run.stage("s", writes_then_fails, ["a"])
        assert (tmp_path / "a.parquet").exists()
        # A retry that writes nothing must not be marked done on the stale file.
        with pytest.raises(StageOutputError, match="did not write"):
            run.stage("s", lambda: None, ["a"])
        assert not run.is_done("s")


def test_missing_output_of_done_stage_is_recomputed(tmp_path):
    calls = Counter()

    def fn():
        calls["s"] += 1
        return {"s": {"x": [1]}}

    with RunDir(tmp_path) as run:
        run.stage("s", fn, ["s"])
        (tmp_path / "s.parquet").unlink()
        assert not run.is_done("s")
        with pytest.warns(UserWarning, match="missing"):
            run.stage("s", fn, ["s"])
    assert calls["s"] == 2


def test_seed_is_recorded_reused_and_checked(tmp_path):
    with RunDir(tmp_path) as run:
        entropy = run.seed.entropy
        s1 = run.stage_seed("boot").generate_state(2)
    with RunDir(tmp_path) as run:  # no seed given: the recorded one is reused
        assert run.seed.entropy == entropy
        assert np.array_equal(run.stage_seed("boot").generate_state(2), s1)
        assert not np.array_equal(run.stage_seed("other").generate_state(2), s1)
    with pytest.raises(RunDirError, match="same seed"):
        RunDir(tmp_path, seed=entropy + 1).open()
    assert not (tmp_path / ".lock").exists()  # a refused open releases the lock


def test_refuses_foreign_nonempty_directory_and_writes_need_open(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="not empty and has no manifest.json"):
        RunDir(tmp_path).open()
    run = RunDir(tmp_path / "new")
    with pytest.raises(RunDirError, match="with RunDir"):
        run.stage("s", lambda: None)
    assert not (tmp_path / "new").exists()  # constructing writes nothing


def test_manifest_records_spec_command_history(tmp_path):
    with RunDir(tmp_path, spec={"model": "gpt2", "B": np.int64(1000)}, command=["circuitstat", "audit"]) as run:
        run.stage("s", lambda: {"s": {"x": [1]}}, ["s"], params={"k": [1, 2]})
    with RunDir(tmp_path, spec={"model": "gpt2", "B": 1000}, command=["circuitstat", "audit"]):
        pass
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["spec"] == {"model": "gpt2", "B": 1000} and m["command"] == ["circuitstat", "audit"]
    assert len(m["history"]) == 2 and m["history"][0]["spec_sha256"] == m["history"][1]["spec_sha256"]
    out = m["stages"]["s"]["outputs"]["s"]
    assert out["path"] == "s.parquet" and len(out["sha256"]) == 64 and m["stages"]["s"]["seconds"] >= 0
