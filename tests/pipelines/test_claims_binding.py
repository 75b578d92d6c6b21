"""`check` binds a claims file to its run (issue 47, item 4): the audit records the spec it was asked to run,
and a claims file whose ``spec:`` did not make the run is exit 2, naming both and what differs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from builders import make_run
from circuitstat.pipelines.cli import app as APP

SPEC = {"model": "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=32",
        "task": {"name": "induction", "n": 16, "options": {"seq_len": 6}}, "methods": ["eap"], "k": [5],
        "bootstrap": {"n_resamples": 50}, "faithfulness": False, "circuit": {"file": "circuit.txt"}}
CIRCUIT = "a0.h0->a1.h0<k>\na1.h0->logits\n"
CLAIMS = [{"kind": "published_circuit", "method": "eap", "statistic": "n_unsupported", "max": 100}]


def _write(path: Path, doc) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _invoke(*args):
    r = CliRunner().invoke(APP, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    return r


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """A real (tiny) audit of SPEC, with a published circuit so that the run's k grid gains the circuit's sizes."""
    d = tmp_path_factory.mktemp("bind")
    (d / "circuit.txt").write_text(CIRCUIT)
    _write(d / "a.yaml", SPEC)
    r = _invoke("audit", d / "a.yaml", "--out", d / "run")
    assert r.exit_code == 0, r.output
    return d


def test_the_spec_that_made_the_run_binds_and_another_is_exit_2(audited, tmp_path):
    run = audited / "run"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["spec"]["k"] != [5]  # the audit added the circuit's sizes; the binding is the spec as asked
    assert manifest["provenance"]["spec_binding"]["doc"]["k"] == [5]
    r = _invoke("check", _write(audited / "c.yaml", {"spec": "a.yaml", "claims": CLAIMS}), "--run", run)
    assert r.exit_code == 0 and "note:" not in r.output, r.output
    # negative control: another n, methods and bootstrap (issue 47's n64.yaml against another run)
    other = {**SPEC, "task": {**SPEC["task"], "n": 12}, "methods": ["eap", "exact"], "bootstrap": {"n_resamples": 60}}
    _write(audited / "b.yaml", other)
    r = _invoke("check", _write(audited / "c2.yaml", {"spec": "b.yaml", "claims": CLAIMS}), "--run", run)
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert f"the run {run} was not made from {audited / 'b.yaml'}" in out
    for phrase in ("task.n: 12 in the spec, 16 in the run", "methods: ['eap', 'exact'] in the spec, ['eap'] in the run",
                   "bootstrap.n_resamples: 60 in the spec, 50 in the run"):
        assert phrase in out, out
    assert "hold" not in out  # no claim was evaluated


def test_the_circuit_file_is_bound_by_content_not_by_path(audited, tmp_path):
    """The same spec and circuit copied elsewhere bind (a run made in CI, checked on a laptop); a changed circuit
    file of the same name does not."""
    copy = tmp_path / "elsewhere"
    copy.mkdir()
    for name in ("a.yaml", "circuit.txt"):
        shutil.copy(audited / name, copy / name)
    claims = _write(copy / "c.yaml", {"spec": "a.yaml", "claims": CLAIMS})
    r = _invoke("check", claims, "--run", audited / "run")
    assert r.exit_code == 0, r.output
    (copy / "circuit.txt").write_text(CIRCUIT + "a0.h1->logits\n")
    r = _invoke("check", claims, "--run", audited / "run")
    assert r.exit_code == 2 and "circuit.file: circuit.txt (sha256" in r.output, r.output


def test_a_claims_file_without_a_spec_gets_a_note(audited):
    r = _invoke("check", _write(audited / "c3.yaml", {"claims": CLAIMS}), "--run", audited / "run")
    assert r.exit_code == 0, r.output
    assert "names no 'spec:', so nothing ties its claims to the run" in " ".join(r.output.split())


def test_a_run_that_records_no_binding_is_checked_with_a_note(tmp_path):
    """Runs written before the binding existed (or synthetic ones) are read, with a note saying it cannot be told."""
    run = make_run(tmp_path / "old", published=True)
    (tmp_path / "circuit.txt").write_text(CIRCUIT)
    _write(tmp_path / "a.yaml", SPEC)
    claims = _write(tmp_path / "c.yaml", {"spec": "a.yaml", "claims": CLAIMS})
    r = _invoke("check", claims, "--run", run)
    assert "records no spec binding" in " ".join(r.output.split()), r.output
    assert r.exit_code in (0, 1), r.output
