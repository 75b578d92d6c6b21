"""A run records its kind in its manifest (RunDir ``kind``); the kind of a run directory is read from there, never
guessed from its spec's keys. A run from before kinds were recorded is refused as an output, with the fix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from circuitstat.core.errors import InputError
from circuitstat.core.rundir import RunDir, RunDirError
from circuitstat.pipelines.kinds import NO_KIND, check_run_out, recorded_kind

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import result_factories  # noqa: E402  (tests/result_factories.py)

AUDIT_LIKE_SPEC = {"methods": ["eap"], "bootstrap": {}}  # the keys the retired recognise() called an audit's


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _drop_kind(path: Path) -> None:
    """Make ``path`` look like a run written before kinds were recorded."""
    m = _manifest(path)
    del m["kind"]
    (path / "manifest.json").write_text(json.dumps(m))


def test_rundir_records_its_kind_and_refuses_another(tmp_path):
    with RunDir(tmp_path / "r", spec={"a": 1}, seed=0, kind="attribute"):
        pass
    assert _manifest(tmp_path / "r")["kind"] == "attribute"
    with RunDir(tmp_path / "r", spec={"a": 1}, seed=0):  # reopened without a kind: the recorded one stays
        pass
    assert recorded_kind(_manifest(tmp_path / "r")) == "attribute"
    with pytest.raises(RunDirError, match="holds a `attribute` run, not a `audit` run"):
        with RunDir(tmp_path / "r", spec={"a": 1}, seed=0, kind="audit"):
            pass
    assert recorded_kind(_manifest(tmp_path / "r")) == "attribute"
    with RunDir(tmp_path / "none", spec={"a": 1}, seed=0):
        pass
    assert "kind" in _manifest(tmp_path / "none") and recorded_kind(_manifest(tmp_path / "none")) is None


def test_the_kind_is_read_not_guessed_from_the_spec(tmp_path):
    """Negative control for the retired recognise(): a spec with an audit's keys recorded as an attribute run is an
    attribute run, and an audit's keys with no recorded kind are no audit."""
    with RunDir(tmp_path / "r", spec=AUDIT_LIKE_SPEC, seed=0, kind="attribute"):
        pass
    check_run_out(tmp_path / "r", "attribute")  # the same kind: accepted
    with pytest.raises(InputError, match="holds a `circuitstat attribute` run, not a `circuitstat audit` run"):
        check_run_out(tmp_path / "r", "audit")
    with RunDir(tmp_path / "plain", spec=AUDIT_LIKE_SPEC, seed=0):
        pass
    with pytest.raises(InputError, match="holds a run of another command"):
        check_run_out(tmp_path / "plain", "audit")


def test_a_run_without_a_recorded_kind_is_refused_with_the_fix(tmp_path):
    from circuitstat.pipelines.claims.runkind import audit_target_problem

    with RunDir(tmp_path / "old", spec=AUDIT_LIKE_SPEC, seed=0, kind="audit") as run:
        run.stage("index", lambda: {}, [])
    check_run_out(tmp_path / "old", "audit")
    assert audit_target_problem(tmp_path / "old") is None
    _drop_kind(tmp_path / "old")
    before = (tmp_path / "old" / "manifest.json").read_bytes()
    with pytest.raises(InputError) as e:
        check_run_out(tmp_path / "old", "audit", force=True)
    assert NO_KIND in str(e.value) and "give a new --out" in str(e.value)
    assert NO_KIND in audit_target_problem(tmp_path / "old")
    assert (tmp_path / "old" / "manifest.json").read_bytes() == before  # nothing written


def test_the_cli_refuses_an_old_run_as_out_exit_2(tmp_path):
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    with RunDir(tmp_path / "old", spec={"method": "eap"}, seed=0, kind="attribute"):
        pass
    _drop_kind(tmp_path / "old")
    res = CliRunner().invoke(app, ["attribute", "--model", "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&seed=1",
                                   "--method", "eap", "--n", "4", "--out", str(tmp_path / "old")])
    assert res.exit_code == 2 and "before circuitstat recorded a run's kind" in res.stderr, res.output
    assert "Traceback" not in res.output


def test_a_result_run_records_its_kind(tmp_path):
    """sample-size and heads write a Result: its class's run_kind is the kind its run directory records."""
    from circuitstat.pipelines.runs.heads.result import HeadStabilityResult
    from circuitstat.pipelines.runs.sample_size.simulate import SampleSizeResult

    assert SampleSizeResult.run_kind == "sample-size" and HeadStabilityResult.run_kind == "heads"
    res = result_factories.sample_size()
    res.write(tmp_path / "ss")
    assert recorded_kind(_manifest(tmp_path / "ss")) == "sample-size"
    other = result_factories.bootstrap()  # a Result no command owns as its kind
    other.write(tmp_path / "b")
    assert recorded_kind(_manifest(tmp_path / "b")) is None
