"""Errors and terminal output (issue 28 items 12-15): a failed write is exit 2, --plan allocates no
weights, a run of another command is not merged into, control characters never reach the terminal,
a large claims file without aliases is read, and SIGTERM cleans up and exits 143."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app, user_error_message

MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1"
runner = CliRunner()


# ---- item 12: a full disk is a user error, never an internal one -----------------------------------
def test_a_safetensors_write_failure_is_exit_2_not_3(tmp_path):
    import resource

    from safetensors.torch import save_file
    import torch

    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:  # a real failed write (EFBIG, as ENOSPC on a full disk): safetensors raises its own error type
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limits[1]))
        with pytest.raises(Exception) as e:
            save_file({"w": torch.zeros(10_000)}, str(tmp_path / "w.safetensors"))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert not isinstance(e.value, OSError)  # not caught as one before
    message = user_error_message(e.value)
    assert message is not None and "File too large" in message and "free space" in message
    assert user_error_message(RuntimeError("a bug")) is None  # other errors stay internal


def test_a_full_disk_under_the_run_is_exit_2(tmp_path):
    import resource

    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, limits[1]))
        res = runner.invoke(app, ["attribute", "--model", MODEL, "--method", "eap", "--n", "4", "--batch-size", "2",
                                  "--out", str(tmp_path / "run")])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert res.exit_code == 2, res.output + res.stderr
    assert "internal error" not in res.stderr and "Traceback" not in res.output


# ---- item 13: --plan runs on the meta device -------------------------------------------------------
def test_plan_of_a_huge_config_allocates_no_weights():
    import resource

    # 1.5 TiB of float32 weights: loading them would fail or be killed; the plan needs only shapes
    huge = "random:gpt2?n_layer=200&n_head=8&n_embd=13000&vocab_size=50257&n_positions=64"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    res = runner.invoke(app, ["attribute", "--model", huge, "--plan", "--allow-large", "--n", "4"])
    assert res.exit_code == 0, res.output + res.stderr
    assert "no time estimate: the weights (1.5 TiB) exceed the memory limit" in res.output
    assert "eap" in res.output and "4,485,901" in res.output
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    assert grown < 4 * 2**30  # the component graph and bookkeeping only


def test_plan_of_a_small_model_still_calibrates_its_time():
    res = runner.invoke(app, ["attribute", "--model", MODEL, "--plan", "--n", "4", "--batch-size", "2"])
    assert res.exit_code == 0, res.output + res.stderr
    assert "calibration on" in res.output and "no time estimate" not in res.output


# ---- item 14b: audit into a run of another command ------------------------------------------------
def test_audit_into_an_attribute_run_is_refused_unless_forced(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["attribute", "--model", MODEL, "--method", "eap", "--n", "4", "--batch-size", "2",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output + res.stderr
    before = (out / "manifest.json").read_bytes()
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"model": MODEL, "task": {"name": "induction", "n": 8}, "methods": ["eap"],
                                    "k": [2], "faithfulness": False, "bootstrap": {"n_resamples": 20}}))
    res = runner.invoke(app, ["audit", str(spec), "--out", str(out), "--no-report"])
    assert res.exit_code == 2, res.output + res.stderr
    assert "holds a `circuitstat attribute` run" in res.stderr and "--force" in res.stderr
    assert (out / "manifest.json").read_bytes() == before  # nothing merged, the spec not replaced
    res = runner.invoke(app, ["attribute", "--model", MODEL, "--method", "eap", "--n", "4", "--batch-size", "2",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output + res.stderr  # the same command resumes as before


# ---- item 15a: control characters -----------------------------------------------------------------
def test_control_characters_from_files_never_reach_the_terminal(tmp_path):
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from builders import make_run

    run = make_run(tmp_path / "run")
    bad = "bell\x07soh\x01esc\x1b[2Jbidi\u202etitle\x1b]0;pwned\x07"
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump({"run": "run", "claims": [
        {"name": bad, "kind": "circuit_stability", "method": "exact", "k": 5, "statistic": "jaccard_mean",
         "min": 0.0}]}, allow_unicode=True))
    res = runner.invoke(app, ["check", str(claims)])
    shown = res.output + res.stderr
    assert "bell" in shown and "soh" in shown  # the name is shown ...
    for ch in ("\x07", "\x01", "\x1b", "\u202e"):  # ... without its control characters
        assert ch not in shown, repr(ch)
    from circuitstat.pipelines.cli import terminal_text

    assert terminal_text("a\tb\nc\x00\x7f\x9b") == "a\tb\nc"


# ---- item 15b: a large claims file without aliases --------------------------------------------------
def test_a_large_document_without_aliases_is_read_and_an_alias_bomb_still_refused(tmp_path):
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.yamlio import MAX_EXPANDED_NODES, read_yaml_strict

    big = tmp_path / "big.yaml"
    big.write_text("claims:\n" + "".join(f"- {i}\n" for i in range(MAX_EXPANDED_NODES + 10_000)))
    assert len(read_yaml_strict(big)["claims"]) == MAX_EXPANDED_NODES + 10_000
    bomb = tmp_path / "bomb.yaml"
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1},"
              f" *a{i - 1}, *a{i - 1}]" for i in range(1, 9)]
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match="alias bomb"):
        read_yaml_strict(bomb)


def test_claim_lookups_by_index_equal_pyarrow_filters(tmp_path):
    """The index that makes a 60,000-claim check fast selects what pyarrow.compute.equal selects."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from circuitstat.pipelines.claims.reader import RunReader

    table = pa.table({"method": ["exact", "eap", None, "eap", "exact"], "k": [5, 5, 10, None, 10],
                      "v": [0.1, 0.2, 0.3, 0.4, 0.5]})
    pq.write_table(table, tmp_path / "t.parquet")
    reader = RunReader(tmp_path)
    for eq in ({"method": "eap"}, {"method": "exact", "k": 10}, {"k": 5}, {"method": None}, {"k": 10.0}, {}):
        mask = None
        for col, val in eq.items():
            m = pc.equal(table[col], val)
            mask = m if mask is None else pc.and_(mask, m)
        want = (table.filter(mask) if mask is not None else table).select(["v", *eq]).to_pylist()
        assert reader.rows("t", ["v"], **eq) == want, eq


# ---- item 15c: SIGTERM ------------------------------------------------------------------------------
def test_sigterm_cleans_up_and_exits_143(tmp_path):
    out = tmp_path / "run"
    model = "random:gpt2?n_layer=4&n_head=4&n_embd=32&vocab_size=96&n_positions=64&seed=3"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", "from circuitstat.pipelines.cli import main; main()", "attribute", "--model",
                             model, "--method", "exact", "--n", "24", "--batch-size", "1", "--out", str(out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while not list(out.glob("checkpoints/*/rows-*.npy")) and proc.poll() is None:
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err.decode()
    last = err.decode().strip().splitlines()[-1]
    assert last.rsplit("\r", 1)[-1] == "error: terminated (SIGTERM); rerun the same command to resume"
    assert not (out / ".lock").exists()  # the run directory was released
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stages"]["scores"]["status"] == "failed"  # recorded as it is for Ctrl-C: resumable
    assert list(out.glob("checkpoints/*/rows-*.npy"))  # its finished chunks kept for the resume
