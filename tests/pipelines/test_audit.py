"""The audit end to end: tables, resume after kill -9 in any stage, lock, worker-count invariance."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from circuitstat.pipelines.runs.audit.run import run_audit
from circuitstat.pipelines.spec import parse_spec

SPEC = {
    "model": "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3",
    "task": {"name": "induction", "n": 12, "options": {"seq_len": 5}},
    "methods": ["exact", "eap"],
    "batch_size": 4,
    "bootstrap": {"n_resamples": 40},
    "k": [3, 6],
}
TABLES = ["edges", "scores_exact", "scores_eap", "edge_stats", "stability_vs_k", "inclusion", "faithfulness_vs_k",
          "approximation", "approximation_summary"]
STAGES = ["index", "scores_exact", "scores_eap", "edge_stats", "faithfulness", "stability", "approximation"]


def _tables(run: Path) -> dict:
    return {t: pq.read_table(run / f"{t}.parquet").to_pandas() for t in TABLES}


def _same(a: dict, b: dict) -> None:
    for name in TABLES:
        x, y = a[name], b[name]
        assert list(x.columns) == list(y.columns), name
        for col in x.columns:
            if x[col].dtype == object and isinstance(x[col].iloc[0], np.ndarray):
                assert np.array_equal(np.stack(x[col]), np.stack(y[col])), (name, col)
            else:
                assert x[col].equals(y[col]), (name, col)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("ref") / "run"
    run_audit(parse_spec(SPEC), out)
    return out, _tables(out)


def test_audit_writes_every_table_with_provenance(reference):
    out, tables = reference
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s for s in STAGES if manifest["stages"][s]["status"] == "done"] == STAGES
    stats = tables["edge_stats"]
    assert set(stats["method"]) == {"exact", "eap"} and (stats["ci_low"] <= stats["estimate"]).all()
    assert (stats["estimate"] <= stats["ci_high"]).all()
    # the estimate is the mean of the stored per-example scores
    S = np.stack(tables["scores_exact"]["scores"])
    exact = stats[stats.method == "exact"].sort_values("edge")
    assert np.allclose(exact["estimate"], S.astype(np.float64).mean(0), atol=1e-7)
    prov = pq.read_schema(out / "edge_stats.parquet").metadata[b"circuitstat.provenance"]
    assert b"weight_hash" in prov and b"task" in prov
    assert sorted(tables["stability_vs_k"]["k"].unique()) == [3, 6]


def test_audit_command_ends_with_the_verdict_demo_prints(reference, tmp_path):
    """`circuitstat audit` ends with the one-screen verdict (resumed here: every stage is already done)."""
    import yaml
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app
    from circuitstat.reports.verdicts import verdict, verdict_text

    out, _ = reference
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    r = CliRunner().invoke(app, ["audit", str(spec), "--out", str(out)])
    assert r.exit_code == 0, r.output
    want = verdict_text(verdict(out), out / "report.html")
    assert r.output.rstrip().endswith(want) and f"report: {out / 'report.html'}" in r.output
    assert "stable" in want or "inconclusive" in want or "no interval" in want  # a stability verdict is in it


def _killer_script(out: Path, target: str) -> str:
    """A driver that runs the audit and SIGKILLs itself inside stage ``target``."""
    hooks = {
        "scores_exact": "circuitstat.pipelines.runs.audit.common.attribution_scores",  # the stages call it there
        "edge_stats": "circuitstat.pipelines.runs.audit.stages.edge_stats_table",  # the stages' module calls them
        "stability": "circuitstat.pipelines.runs.audit.stages.stability_tables",
        "faithfulness": "circuitstat.pipelines.runs.audit.common.faithfulness_table",
        "approximation": "circuitstat.pipelines.runs.audit.stages.approximation_tables",
    }
    mod, fn = hooks[target].rsplit(".", 1)
    return textwrap.dedent(f"""
        import os, signal, importlib
        m = importlib.import_module({mod!r})
        def boom(*a, **k):
            os.kill(os.getpid(), signal.SIGKILL)
        setattr(m, {fn!r}, boom)
        from circuitstat.pipelines.spec import parse_spec
        from circuitstat.pipelines.runs.audit.run import run_audit
        run_audit(parse_spec({SPEC!r}), {str(out)!r})
    """)


@pytest.mark.parametrize("target", ["scores_exact", "edge_stats", "stability", "faithfulness", "approximation"])
def test_resume_after_kill_matches_uninterrupted_run(reference, tmp_path, target):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", _killer_script(out, target)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    before = json.loads((out / "manifest.json").read_text())["stages"]
    assert before[target]["status"] == "running"
    done_before = {s for s, v in before.items() if v["status"] == "done"}
    run_audit(parse_spec(SPEC), out)
    after = json.loads((out / "manifest.json").read_text())["stages"]
    for s in done_before:  # finished stages were not recomputed
        assert after[s]["attempts"] == 1 and after[s]["finished_utc"] == before[s]["finished_utc"], s
    assert after[target]["attempts"] == 2
    _same(reference[1], _tables(out))


def test_second_run_on_locked_directory_is_refused(reference, tmp_path):
    from circuitstat.core.lock import DirLock, RunLockedError

    out = tmp_path / "run"
    out.mkdir()
    lock = DirLock(out / ".lock")
    lock.acquire()
    try:
        with pytest.raises(RunLockedError):
            run_audit(parse_spec(SPEC), out)
    finally:
        lock.release()


@pytest.mark.slow
def test_tables_identical_for_n_jobs_and_dask(reference, tmp_path):
    ref = reference[1]
    run_audit(parse_spec(SPEC), tmp_path / "two", n_jobs=2)
    _same(ref, _tables(tmp_path / "two"))
    run_audit(parse_spec(SPEC), tmp_path / "dask", n_jobs=2, scheduler="local")
    _same(ref, _tables(tmp_path / "dask"))


def test_audit_over_seeds_adds_head_stability(tmp_path):
    from circuitstat.circuits.model import CircuitModel, ModelConfig

    cfg = ModelConfig(n_layers=2, n_heads=2, d_model=32, d_head=16, d_mlp=0, mlp="none", vocab_size=64, n_ctx=64)
    dirs = [str(CircuitModel(cfg).init_weights(s).save(tmp_path / f"seed-{s}")) for s in (0, 1, 2)]
    spec = parse_spec({"models": dirs, "task": {"name": "induction", "n": 8, "options": {"seq_len": 5}},
                       "methods": ["eap"], "bootstrap": {"n_resamples": 20}, "k": [3], "faithfulness": False,
                       "heads": {"n_probe": 6, "n_resamples": 10}})
    out = run_audit(spec, tmp_path / "run")
    heads = pq.read_table(out / "heads.parquet").to_pandas()
    assert len(heads) == 4 and heads["stability"].between(-1, 1).all()
    assert (heads["ci_low"] <= heads["stability"] + 1e-12).all()
    # the one-screen verdict audit and demo print reads these tables: the head with the largest excess over its null
    from circuitstat.pipelines.demo import print_summary
    from circuitstat.reports.verdicts import verdict, verdict_text

    lines: list[str] = []
    print_summary(out, echo=lines.append)
    text = "\n".join(lines)
    assert text.strip() == verdict_text(verdict(out)).strip() and text.startswith("\nVerdict (eap, 95% intervals")
    best = heads.sort_values("excess").iloc[-1]
    flat = " ".join(text.split())
    assert f"largest excess over the shuffled null: a{int(best['layer'])}.h{int(best['head'])} {best['excess']:.3g}" in flat
    assert "k = 3: faithfulness was not run" in flat and "faithfulness (faithfulness: true in the audit spec)" in flat


def test_audit_loads_each_model_once_with_the_spec_dtype(tmp_path, monkeypatch):
    """Model 0 is loaded once (not again by the heads stage), and every refit gets the spec's dtype."""
    import torch

    import circuitstat.circuits.loading

    loads = []
    real = circuitstat.circuits.loading.load_model

    def counting(source, device="cpu", dtype=None, **kw):
        loads.append((source, str(device), dtype))
        return real(source, device=device, dtype=dtype, **kw)

    monkeypatch.setattr(circuitstat.circuits.loading, "load_model", counting)
    sources = [SPEC["model"].replace("seed=3", f"seed={s}") for s in (3, 4, 5)]
    spec = parse_spec({"models": sources, "task": {"name": "induction", "n": 8, "options": {"seq_len": 5}},
                       "methods": ["eap"], "bootstrap": {"n_resamples": 20}, "k": [3], "faithfulness": False,
                       "dtype": "bfloat16", "heads": {"n_probe": 6, "n_resamples": 10}}, "<test>")
    out = run_audit(spec, tmp_path / "run")
    assert loads == [(s, "cpu", torch.bfloat16) for s in sources]
    assert len(pq.read_table(out / "heads.parquet")) == 4
    loads.clear()
    run_audit(spec, out)  # resumed: every stage done, so no refit is loaded for the heads stage
    assert loads == [(sources[0], "cpu", torch.bfloat16)]


def test_scheduler_without_dask_is_a_clear_error(monkeypatch):
    import sys

    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.parallel import backend

    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    with pytest.raises(InputError, match=r"pip install 'circuitstat\[dask\]'"):
        with backend(2, "local"):
            pass


@pytest.mark.parametrize("damage", ["edited", "truncated", "swapped", "symlinked"])
def test_check_and_report_refuse_a_table_changed_since_the_run_wrote_it(reference, tmp_path, damage):
    """An edited stability table would make a false claim hold: check and report name it (exit 2), never read it."""
    import os
    import shutil

    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app
    from circuitstat.core.run_check import verify_outputs

    run = tmp_path / "run"
    shutil.copytree(reference[0], run)
    assert verify_outputs(run).checked >= len(TABLES)  # every table of the audit is a recorded stage output
    claims = tmp_path / "claims.yaml"
    claims.write_text("claims:\n  - {kind: circuit_stability, method: exact, k: 3, statistic: jaccard_mean, min: 0.99}\n")
    assert CliRunner().invoke(app, ["check", str(claims), "--run", str(run)]).exit_code == 1  # the claim is false
    target = run / "stability_vs_k.parquet"
    if damage == "edited":  # the claim's column set to 1 everywhere: the claim would now hold
        t = pq.read_table(target)
        i = t.column_names.index("jaccard_mean")
        pq.write_table(t.set_column(i, "jaccard_mean", __import__("pyarrow").array([1.0] * len(t))), target)
    elif damage == "truncated":
        target.write_bytes(target.read_bytes()[:100])
    elif damage == "swapped":
        shutil.copyfile(run / "inclusion.parquet", target)
    else:
        target.unlink()
        os.symlink(reference[0] / "stability_vs_k.parquet", target)
    for argv in (["check", str(claims), "--run", str(run)], ["report", str(run)]):
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 2 and "stability_vs_k.parquet (stage stability)" in r.output, (argv, r.output)
