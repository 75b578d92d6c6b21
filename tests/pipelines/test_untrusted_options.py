"""Untrusted options (issue 14): every bad option or spec value is one line, exit 2, nothing written.

Each case runs the real command through typer's CliRunner (the error boundary lives inside the
app, so the runner sees the same exit codes as the ``circuitstat`` entry point) and checks: exit
code 2, exactly one line on stderr starting with ``error:``, no traceback, and no run directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app

TINY = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1"
SPEC = {"model": TINY, "task": {"name": "induction", "n": 6, "options": {"seq_len": 4}}, "methods": ["eap"],
        "batch_size": 3, "bootstrap": {"n_resamples": 40}, "k": [2, 4]}

runner = CliRunner()


def _refused(args: list[str], out: Path, *words: str) -> str:
    res = runner.invoke(app, args)
    err = res.stderr
    assert res.exit_code == 2, (res.exit_code, err, res.output)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in res.output + err
    assert not out.exists(), "a refused run must not create its directory"
    low = err.lower()
    for w in words:
        assert w.lower() in low, (w, err)
    return err


def _attribute(out: Path, *extra: str) -> list[str]:
    return ["attribute", "--model", TINY, "--n", "4", "--batch-size", "2", "--out", str(out), *extra]


@pytest.mark.parametrize("extra, words", [
    (["--batch-size", "-2"], ["--batch-size", "greater than or equal to 1"]),
    (["--batch-size", "0"], ["--batch-size"]),
    (["--ig-steps", "0"], ["--ig-steps"]),
    (["--n", "0"], ["--n"]),
    (["--n", "100000000"], ["--allow-large"]),
    (["--method", "telepathy"], ["telepathy", "exact", "eap"]),
    (["--level", "graph"], ["graph", "edge", "node"]),
    (["--ablation", "bogus"], ["bogus", "counterfactual"]),
    (["--metric", "bogus"], ["bogus", "logit_diff", "kl"]),
    (["--dtype", "int8"], ["int8", "float32"]),
    (["--device", "bogus"], ["bogus", "cpu"]),
    (["--device", "cuda:99"], ["cuda"]),
    (["--method", "clean-corrupted", "--ablation", "zero"], ["clean-corrupted", "counterfactual"]),
    (["--task", "no-such-task"], ["no-such-task"]),
])
def test_bad_attribute_options_are_refused_before_the_run_directory(tmp_path, extra, words):
    out = tmp_path / "run"
    _refused(_attribute(out, *extra), out, *words)


def test_out_naming_a_file_is_refused(tmp_path):
    target = tmp_path / "a-file"
    target.write_text("keep me")
    res = runner.invoke(app, _attribute(target))
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and "is a file" in res.stderr
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("args", [["--n-inputs", "0"], ["--n-inputs", "-3"], ["--length", "0"]])
def test_model_command_bad_sizes(tmp_path, args):
    _refused(["model", TINY, *args], tmp_path / "nothing", args[0])


def _audit(tmp_path: Path, spec: dict, *extra: str) -> tuple[list[str], Path]:
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    out = tmp_path / "run"
    return ["audit", str(path), "--out", str(out), "--no-report", *extra], out


def _with(**over) -> dict:
    spec = json.loads(json.dumps(SPEC))
    for key, value in over.items():
        node = spec
        *path, last = key.split("__")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = value
    return spec


@pytest.mark.parametrize("over, words", [
    ({"task__options__seq_len": "3"}, ["seq_len", "integer"]),
    ({"task__options__seq_len": 3.9}, ["seq_len", "integer"]),
    ({"task__options__seq_length": 4}, ["seq_length", "seq_len"]),
    ({"task__options__token_ids": [1.5, 2, 3, 4, 5, 6, 7, 8, 9]}, ["token_ids", "integer"]),
    ({"task__options__token_ids": [True, 2, 3, 4, 5, 6, 7, 8, 9]}, ["token_ids", "integer"]),
    ({"task__options__metric": "kl"}, ["task.metric"]),
    ({"task__metric": "bogus"}, ["task.metric"]),
    ({"device": "bogus"}, ["device"]),
    ({"device": "cuda:99"}, ["cuda"]),
    ({"bootstrap__scheme": "clusters"}, ["clusters", "groups"]),
    ({"k": [500]}, ["k=500"]),
    ({"n_jobs": 100000}, ["n_jobs"]),
    ({"task__n": 1_000_000, "bootstrap__n_resamples": 100_000}, ["--allow-large"]),
    ({"methods": ["clean-corrupted"], "ablation": "mean"}, ["clean-corrupted"]),
])
def test_bad_audit_specs_are_refused_before_the_run_directory(tmp_path, over, words):
    args, out = _audit(tmp_path, _with(**over))
    _refused(args, out, *words)


@pytest.mark.parametrize("n_jobs", ["0", "500"])
def test_n_jobs_out_of_range_is_refused(tmp_path, n_jobs):
    args, out = _audit(tmp_path, SPEC, "--n-jobs", n_jobs)
    _refused(args, out, "--n-jobs")


def test_unreachable_scheduler_is_one_line(tmp_path):
    pytest.importorskip("distributed")
    args, out = _audit(tmp_path, SPEC, "--scheduler", "tcp://127.0.0.1:9")
    _refused(args, out, "scheduler")


def test_variance_study_k_above_edges_refused_before_writing(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(json.dumps({"model": TINY, "task": {"name": "induction", "n": 6, "options": {"seq_len": 4}},
                                "k": [500], "estimators": {"methods": ["exact", "eap"]}}))
    out = tmp_path / "run"
    _refused(["study", "variance", str(path), "--out", str(out), "--no-report"], out, "k=500")


def test_json_booleans_are_not_answer_tokens(tmp_path):
    rows = [{"clean": "a b", "corrupted": "c d", "answer": True, "wrong_answer": 3}]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    from circuitstat.circuits.tasks import TaskValidationError, task_from_texts

    class Tok:  # one token per character; True would otherwise become the 4 tokens of "True"
        name, bos_id, eos_id, pad_id, vocab_size = "chars", None, None, 0, 256

        def encode(self, s):
            return [ord(c) for c in s]

        def decode(self, ids):
            return "".join(map(chr, ids))

    with pytest.raises(TaskValidationError, match="true/false"):
        task_from_texts("t", Tok(), ["ab"], ["cd"], [True], [3])
    with pytest.raises(TaskValidationError, match="decimal"):
        task_from_texts("t", Tok(), ["ab"], ["cd"], [7], [3.7])


def test_unknown_metric_option_is_refused():
    from circuitstat.circuits.tasks import TaskValidationError, make_task

    with pytest.raises(TaskValidationError, match="unknown option.*'temperature'"):
        make_task("induction", vocab_size=64, n=2, seq_len=4, temperature=2.0)
    from circuitstat.circuits.metrics import MetricError

    with pytest.raises(MetricError, match="takes no options"):
        make_task("induction", vocab_size=64, n=2, seq_len=4, metric_kwargs={"temperature": 2.0})


def test_single_k_audit_reports_undefined_areas(tmp_path):
    import pyarrow.parquet as pq

    args, out = _audit(tmp_path, _with(k=[3]))
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.stderr
    f = pq.read_table(out / "faithfulness_vs_k.parquet").to_pandas()
    assert len(f) == 1 and f["f_ratio"].notna().all()  # the single-k faithfulness itself is computed
    assert f["cpr"].isna().all() and f["cmd"].isna().all() and "two k" in f["area_note"].iloc[0]
    assert "stage faithfulness: done in" in res.stderr


# A fixture whose full-model effect is far from float32 noise: with GPT-2's default initializer range
# (0.02) a one-layer random model puts m(M) - m(∅) near 1e-4, so a faithfulness ratio of 3 nodes divides
# one float32 rounding difference by another and differs between CPUs (issue 22). Weights drawn with
# initializer_range=1 put every example's |m(M) - m(∅)| near 0.5.
WIDE = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1&initializer_range=1.0"


def test_node_level_audit_runs_end_to_end(tmp_path):
    import numpy as np
    import pyarrow.parquet as pq

    from circuitstat.circuits import load_model
    from circuitstat.circuits.faithfulness import faithfulness
    from circuitstat.pipelines.build import build_task

    args, out = _audit(tmp_path, _with(model=WIDE, level="node", k=[1, 3], methods=["exact", "eap"]))
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.stderr
    f = pq.read_table(out / "faithfulness_vs_k.parquet").to_pandas()
    grid = f[f.k_source == "grid"]  # the circuit choice's search adds rows below the grid's largest k
    assert set(f["method"]) == {"exact", "eap"} and list(grid["k"][grid.method == "exact"]) == [1, 3]
    # oracle: the node circuit evaluated as an edge mask (every out-edge of a kept node live)
    model = load_model(WIDE)
    task = build_task(model, "induction", n=6, seed=0, seq_len=4)
    scores = pq.read_table(out / "scores_exact.parquet").column("scores").to_pylist()
    mean = np.asarray(scores, dtype=np.float64).mean(0)
    keep = np.argsort(-np.abs(mean), kind="stable")[:3]
    mask = np.isin(model.graph.edge_sender, keep)
    direct = faithfulness(model, task, mask, progress=False)
    # the fixture is not degenerate: every example's full effect dwarfs float32 rounding of the metric
    gap = np.abs(direct.m_clean - direct.m_empty)
    assert gap.min() > 1e4 * np.finfo(np.float32).eps * np.abs(direct.m_clean).max()
    row = f[(f.method == "exact") & (f.k == 3)].iloc[0]
    assert np.isclose(row["f_ratio"], direct.ratio_of_means[0], rtol=1e-4)
    assert np.isclose(row["edge_fraction"], 3 / model.graph.n_senders)
    # the comparison can fail: every other 3-node circuit (a wrong mask) is far from the audit's value
    for other in ({0, 1, 2, 3} - {int(i)} for i in range(4)):
        if other != set(keep.tolist()):
            wrong = faithfulness(model, task, np.isin(model.graph.edge_sender, sorted(other)), progress=False)
            assert abs(wrong.ratio_of_means[0] - row["f_ratio"]) > 0.1, other


def test_internal_error_is_exit_3_with_traceback(monkeypatch, capsys):
    """A bug (here a RuntimeError planted in a command) exits 3 with its traceback, unlike bad input."""
    import circuitstat.pipelines.cli as cli

    def broken(*a, **k):
        raise RuntimeError("planted bug")

    monkeypatch.setattr("circuitstat.pipelines.sources.RunInputs.resolve", broken)
    monkeypatch.setattr(sys, "argv", ["circuitstat", "model", TINY])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    err = capsys.readouterr().err
    assert exc.value.code == 3
    assert "Traceback" in err and "planted bug" in err and "internal error (a bug in circuitstat" in err


def test_interrupt_is_exit_130(monkeypatch, capsys):
    import circuitstat.pipelines.cli as cli

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("circuitstat.pipelines.sources.RunInputs.resolve", interrupted)
    monkeypatch.setattr(sys, "argv", ["circuitstat", "model", TINY])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 130
    assert capsys.readouterr().err.strip() == "error: interrupted; rerun the same command to resume"


def test_entry_point_exit_2_is_one_line(tmp_path):
    """The real entry point (a new interpreter): bad input is exit 2, one line, nothing written."""
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "circuitstat.pipelines.cli", *_attribute(out, "--batch-size", "-2")],
                       capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr and not out.exists()
    p = subprocess.run([sys.executable, "-m", "circuitstat.pipelines.cli", "no-such-command"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1


def test_every_stage_runs_on_one_thread_and_says_how_long(tmp_path, capsys):
    """Stages (the faithfulness stage included) run with one torch and one BLAS thread, restored after."""
    import torch
    from threadpoolctl import threadpool_info

    from circuitstat.pipelines.runs.audit.run import run_stage
    from circuitstat.core.rundir import RunDir

    seen = {}

    def stage():
        seen["torch"] = torch.get_num_threads()
        seen["blas"] = {p["num_threads"] for p in threadpool_info()}
        return {"t": {"x": [1]}}

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with RunDir(tmp_path / "run", spec={}, command=[], seed=0) as run:
            run_stage(run, "faithfulness", stage, ["t"])
            run_stage(run, "faithfulness", stage, ["t"])  # finished: not run again
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen["torch"] == 1 and seen["blas"] <= {1}
    err = capsys.readouterr().err
    assert "stage faithfulness: done in" in err and "stage faithfulness: already done (resumed)" in err


def test_too_few_resamples_for_the_faithfulness_interval_names_the_minimum() -> None:
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.spec import parse_spec

    doc = {"model": "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64", "bootstrap": {"n_resamples": 39}}
    with pytest.raises(InputError, match="at least 40"):
        parse_spec(doc)
    assert parse_spec({**doc, "faithfulness": False}).bootstrap.n_resamples == 39
    assert parse_spec({**doc, "bootstrap": {"n_resamples": 40}}).bootstrap.n_resamples == 40


def test_served_source_exists_only_inside_a_server_job(tmp_path, monkeypatch):
    """'served:NAME' is a server's name for an operator's model, resolved only by the inputs a server job is given:
    a CLI spec cannot use it to reach any path, and a served model records the name, never the path."""
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.sources import LOCAL, Resolved, RunInputs

    with pytest.raises(InputError, match="inside one of its jobs only"):
        LOCAL.resolve("served:anything")
    job = RunInputs(served={"tiny": str(tmp_path)}, hide_paths=True)
    assert job.resolve("served:tiny") == Resolved(str(tmp_path), "served:tiny")
    with pytest.raises(InputError):
        job.resolve("served:other")
    assert LOCAL.resolve(str(tmp_path)) == Resolved(str(tmp_path), str(tmp_path))  # paths as they are, locally
    from circuitstat.circuits import loading

    real_load, seen = loading.load_model, {}
    monkeypatch.setattr(loading, "load_model", lambda location, **kw: seen.update(kw, at=location))
    job.load("served:tiny")
    assert seen["at"] == str(tmp_path) and seen["name"] == "served:tiny"  # the name passed, as an argument
    m = real_load("random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64", name="served:tiny")
    assert m.source == "served:tiny" and "served:tiny" in str(m.identity())


def test_a_model_named_by_a_name_still_finds_its_training_token_counts(tmp_path):
    """The recorded source is the name (served:NAME, zoo:...), not a path: the files beside the weights (the
    induction task's pool of tokens seen in training) are found through the directory the model came from."""
    import numpy as np

    from circuitstat.circuits.model import CircuitModel, ModelConfig
    from circuitstat.pipelines.build import build_task
    from circuitstat.pipelines.sources import RunInputs
    from circuitstat.pipelines.zoo import frequent_tokens

    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_head=8, d_mlp=32, vocab_size=50, n_ctx=32)
    CircuitModel(cfg).init_weights(1).save(tmp_path / "m")
    counts = np.zeros(50, dtype=np.int64)
    counts[[5, 7, 11, 13, 17, 19, 23, 29, 31, 37]] = 5000  # the only tokens "seen" in training
    np.save(tmp_path / "m" / "token_counts.npy", counts)
    model = RunInputs(served={"tiny": str(tmp_path / "m")}).load("served:tiny")
    assert model.source == "served:tiny" and str(tmp_path) not in str(model.identity())
    assert list(frequent_tokens(model)) == [5, 7, 11, 13, 17, 19, 23, 29, 31, 37]
    task = build_task(model, "induction", n=8, seq_len=4)
    used = set(task.clean[:, 1:].flatten().tolist())
    assert used <= {5, 7, 11, 13, 17, 19, 23, 29, 31, 37}
