"""`check` only reads a finished run (issue 38, "Writes where it should not" 1): a missing directory, a run of
another kind (an `attribute` run) or a half-finished one is exit 2 naming the problem and the fix, and
nothing is written; running the audit first takes an explicit --run-audit."""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app

MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1"
SPEC = {"model": MODEL, "task": {"name": "induction", "n": 8}, "methods": ["eap"], "k": [2], "faithfulness": False}
CLAIM = {"kind": "circuit_stability", "method": "eap", "k": 2, "statistic": "jaccard_mean", "min": 0.0}
runner = CliRunner()


def _snapshot(root: Path) -> dict:
    """Every path under ``root`` with its bytes (files) and modification time, and root's own time."""
    out = {".": root.stat().st_mtime_ns}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def attribute_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("attr") / "run"
    res = runner.invoke(app, ["attribute", "--model", MODEL, "--method", "eap", "--n", "4", "--out", str(out)])
    assert res.exit_code == 0, res.output + res.stderr
    return out


@pytest.fixture
def audits(monkeypatch) -> list:
    """Record every audit check would start (none may start without --run-audit)."""
    calls = []
    monkeypatch.setattr("circuitstat.pipelines.runs.audit.run.run_audit", lambda spec, out, **kw: calls.append(Path(out)))
    return calls


@pytest.fixture
def claims(tmp_path) -> Path:
    (tmp_path / "audit.yaml").write_text(yaml.safe_dump(SPEC))
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"spec": "audit.yaml", "claims": [CLAIM]}))
    return path


@pytest.mark.parametrize("flags", [[], ["--run-audit"], ["--record"], ["--run-audit", "--record"]])
def test_an_attribute_run_is_refused_and_left_as_it_was(attribute_run, tmp_path, claims, audits, flags):
    copy = tmp_path / "runs" / "copy-attr"
    shutil.copytree(attribute_run, copy)
    before = _snapshot(tmp_path / "runs")
    res = runner.invoke(app, ["check", str(claims), "--run", str(copy), *flags])
    assert res.exit_code == 2, res.output + res.stderr
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "an `attribute` run" in err[0] and "pass --run DIR" in err[0], err
    assert "running the audit" not in res.output + res.stderr and audits == []
    assert _snapshot(tmp_path / "runs") == before  # edges.parquet, manifest, no claims.parquet or report.html


@pytest.mark.parametrize("flags", [[], ["--record"]])
def test_a_missing_run_directory_is_refused_and_nothing_is_created(tmp_path, claims, audits, flags):
    (tmp_path / "runs").mkdir()
    before = _snapshot(tmp_path)
    res = runner.invoke(app, ["check", str(claims), "--run", str(tmp_path / "runs" / "dmeo"), *flags])
    assert res.exit_code == 2, res.output + res.stderr
    assert "runs/dmeo does not exist" in res.stderr and "--run-audit to run (or resume) the audit of" in res.stderr
    assert audits == [] and _snapshot(tmp_path) == before


def test_run_audit_is_explicit_and_documented(tmp_path, claims, audits):
    usage = " ".join(runner.invoke(app, ["check", "--help"]).output.split())
    assert "--run-audit" in usage and "without it check only reads" in usage
    res = runner.invoke(app, ["check", str(claims), "--run", str(tmp_path / "new"), "--run-audit"])
    assert audits == [tmp_path / "new"], res.output + res.stderr  # the stand-in audit ran, into the directory given
