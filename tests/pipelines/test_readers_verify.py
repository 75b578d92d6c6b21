"""Every command that reads a finished run verifies its tables against the sha256 its stages recorded
(issue 38 adversarial 2): an edited scores table is refused, never printed as a wrong number."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app

MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1"
runner = CliRunner()


@pytest.fixture(scope="module")
def attribute_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("attr") / "run"
    res = runner.invoke(app, ["attribute", "--model", MODEL, "--method", "eap", "--n", "4", "--out", str(out)])
    assert res.exit_code == 0, res.output + res.stderr
    return out


def _edited_copy(run: Path, dest: Path) -> Path:
    """A copy of ``run`` whose scores.parquet is x1000, written as a valid Parquet file with its metadata."""
    import shutil

    shutil.copytree(run, dest)
    t = pq.read_table(dest / "scores.parquet")
    i = t.column_names.index("scores")
    col = t.column("scores")
    values = np.asarray(col.to_pylist(), dtype=np.float32) * 1000
    t = t.set_column(i, t.field(i), pa.array(list(values), type=col.type))
    pq.write_table(t, dest / "scores.parquet")
    return dest


def test_circuit_refuses_an_edited_scores_table(attribute_run, tmp_path):
    ok = runner.invoke(app, ["circuit", str(attribute_run), "--k", "3"])
    assert ok.exit_code == 0, ok.output + ok.stderr
    bad = _edited_copy(attribute_run, tmp_path / "edited")
    res = runner.invoke(app, ["circuit", str(bad), "--k", "3"])
    assert res.exit_code == 2, res.output + res.stderr
    assert "scores.parquet" in res.stderr and "changed since the run wrote them" in res.stderr
    assert res.stdout == ""  # no circuit, no number printed from the edited table


def test_query_refuses_an_edited_table(attribute_run, tmp_path):
    sql = "SELECT count(*) AS n FROM scores"
    ok = runner.invoke(app, ["query", sql, str(attribute_run)])
    assert ok.exit_code == 0 and "(1 row)" in ok.output, ok.output + ok.stderr
    bad = _edited_copy(attribute_run, tmp_path / "edited")
    res = runner.invoke(app, ["query", sql, str(attribute_run), str(bad)])
    assert res.exit_code == 2, res.output + res.stderr
    assert f"{bad}: 1 table(s) changed" in res.stderr and "scores.parquet" in res.stderr


def test_query_refuses_a_memory_limit_beyond_the_machine(attribute_run):
    """Issue 38 (Low): `query --max-memory 100TiB` was accepted."""
    import os

    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    res = runner.invoke(app, ["query", "SELECT 1 AS one", str(attribute_run), "--max-memory", "100TiB"])
    assert res.exit_code == 2 and "more than this machine's memory" in res.stderr, res.output + res.stderr
    fits = f"{max(physical // 2**20 // 2, 1)}MiB"
    assert runner.invoke(app, ["query", "SELECT 1 AS one", str(attribute_run), "--max-memory", fits]).exit_code == 0


# ---- issue 45, items 1, 2 and 6: one verified reader; the manifest cannot be bypassed ------------------------
AUDIT = {"model": MODEL, "task": {"name": "induction", "n": 16}, "methods": ["exact"], "k": [2],
         "faithfulness": False, "bootstrap": {"n_resamples": 50}}
CLAIMS = "claims:\n  - {kind: circuit_stability, method: exact, k: 2, statistic: jaccard_mean, min: 0.0}\n"

# every command that reads a run directory, with its arguments (RUN: the run read; GOOD: an untouched one)
READERS = {
    "circuit": lambda run, good, tmp: ["circuit", run, "--k", "2"],
    "query": lambda run, good, tmp: ["query", "SELECT count(*) AS n FROM scores_exact", run],
    "compare": lambda run, good, tmp: ["compare", good, run],
    "report": lambda run, good, tmp: ["report", run, "--out", tmp / "page.html"],
    "check": lambda run, good, tmp: ["check", tmp / "claims.yaml", "--run", run],
    "sample-size": lambda run, good, tmp: ["sample-size", run, "--n", "64", "--k", "2", "--datasets", "2"],
    "export mib": lambda run, good, tmp: ["export", "mib", run, "--out", tmp / "mib", "--task-name", "ioi",
                                          "--model-name", "gpt2"],
}
# the other commands, and why none of them reads a finished run's tables
NOT_READERS = {
    "model": "describes a model", "attribute": "writes a run", "audit": "writes (resumes) its own run",
    "heads": "writes a run from models", "train": "trains models", "demo": "writes an audit run",
    "check-circuit": "reads a circuit file, writes a run", "tokens": "writes a run", "serve": "the service",
    "submit": "sends a spec to a server", "study heads": "writes a run", "study variance": "writes a run",
    "study calibration": "writes a run", "study groundtruth": "writes a run", "zoo build": "trains models",
    "zoo list": "lists the model cache", "scripts": "lists the python -m scripts", **{f"users {c}": "the service's accounts"
                                          for c in ("add", "token", "revoke", "rotate", "tokens", "admin", "list")},
}


def cli_commands() -> dict:
    """{'command' or 'group command': its click command} of every command of the CLI."""
    import click
    import typer

    def walk(cmd, path):
        if hasattr(cmd, "list_commands"):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                yield from walk(cmd.get_command(ctx, name), [*path, name])
        else:
            yield " ".join(path), cmd

    return dict(walk(typer.main.get_command(app), []))


def test_every_command_is_listed_as_a_reader_or_not():
    """A new command that reads a run must be added to READERS (and so to the tamper tests below)."""
    commands = cli_commands()
    assert set(READERS).isdisjoint(NOT_READERS)
    assert sorted({*READERS, *NOT_READERS}) == sorted(commands)
    trusting = sorted(n for n, c in commands.items() if any("--trust-unrecorded" in getattr(p, "opts", ()) for p in c.params))
    assert trusting == sorted(READERS)  # each reader offers the explicit way to read hand-made tables; no other does


@pytest.fixture(scope="module")
def audit_run(tmp_path_factory) -> Path:
    import yaml

    root = tmp_path_factory.mktemp("audit")
    (root / "audit.yaml").write_text(yaml.safe_dump(AUDIT))
    res = runner.invoke(app, ["audit", str(root / "audit.yaml"), "--out", str(root / "run"), "--no-report"])
    assert res.exit_code == 0, res.output + res.stderr
    return root / "run"


def _scaled(run: Path, dest: Path) -> Path:
    """A copy of the audit ``run`` whose scores_exact.parquet is x1000 (valid Parquet, same metadata)."""
    import shutil

    shutil.copytree(run, dest)
    t = pq.read_table(dest / "scores_exact.parquet")
    i = t.column_names.index("scores")
    col = t.column("scores")
    t = t.set_column(i, t.field(i), pa.array(list(np.asarray(col.to_pylist(), dtype=np.float32) * 1000), type=col.type))
    pq.write_table(t, dest / "scores_exact.parquet")
    return dest


def _tamper(run: Path, how: str) -> str:
    """Apply tampering ``how`` to the manifest of ``run``; return what the refusal must name."""
    import json

    path = run / "manifest.json"
    manifest = json.loads(path.read_text())
    if how == "unreadable":  # (a)
        path.write_text("{\n")
        return "manifest.json"
    if how == "no stages":  # (b)
        manifest["stages"] = []
    elif how == "running":  # (c)
        manifest["stages"]["scores_exact"]["status"] = "running"
    elif how == "deleted record":  # (d)
        del manifest["stages"]["scores_exact"]
    elif how == "no manifest":
        path.unlink()
        return "scores_exact"
    path.write_text(json.dumps(manifest))
    return "manifest.json" if how == "no stages" else "scores_exact"


def _invoke(argv: list) -> object:
    return runner.invoke(app, [str(a) for a in argv])


TAMPERINGS = ["edited only", "unreadable", "no stages", "running", "deleted record", "no manifest"]


@pytest.mark.parametrize("command", sorted(READERS))
def test_every_reader_refuses_every_manifest_tampering(audit_run, tmp_path, command):
    """Issue 45 item 1: with scores x1000 and the manifest (a) unreadable, (b) stageless, (c) the stage 'running',
    (d) the stage's record deleted (and the manifest deleted, or untouched), every reader exits 2 naming the table
    or the manifest and the fix, with no traceback and nothing printed from the edited table."""
    (tmp_path / "claims.yaml").write_text(CLAIMS)
    ok = _invoke(READERS[command](audit_run, audit_run, tmp_path))  # the negative control: the run itself is read
    assert ok.exit_code == 0, (command, ok.output + ok.stderr)
    for how in TAMPERINGS:
        bad = _scaled(audit_run, tmp_path / how.replace(" ", "-"))
        names = "scores_exact" if how == "edited only" else _tamper(bad, how)
        res = _invoke(READERS[command](bad, audit_run, tmp_path))
        assert res.exit_code == 2, (command, how, res.output + res.stderr)
        assert names in res.stderr and "Traceback" not in res.output + res.stderr, (command, how, res.stderr)
        assert res.stdout == "", (command, how, res.stdout)


def test_trust_unrecorded_reads_a_hand_made_table_and_says_so(audit_run, tmp_path):
    """The explicit way to read tables no manifest records: the command names each one it read unchecked."""
    bad = _scaled(audit_run, tmp_path / "copy")
    _tamper(bad, "deleted record")
    sql = "SELECT max(abs(s)) AS m FROM (SELECT unnest(scores) AS s FROM scores_exact)"
    res = _invoke(["query", sql, bad, "--trust-unrecorded", "-f", "csv"])
    assert res.exit_code == 0, res.output + res.stderr
    assert "read unchecked (--trust-unrecorded" in res.stderr and "scores_exact.parquet" in res.stderr
    good = _invoke(["query", sql, audit_run, "-f", "csv"])
    assert good.exit_code == 0 and "read unchecked" not in good.stderr, good.output + good.stderr
    got, want = float(res.stdout.split()[-1]), float(good.stdout.split()[-1])
    assert got == pytest.approx(1000 * want, rel=1e-5)  # the hand-made table itself, as the user asked
    # the report names them too, and a run read as it was written has no such note
    res = _invoke(["report", bad, "--out", tmp_path / "bad.html", "--trust-unrecorded"])
    assert res.exit_code == 0 and "read unchecked" in (tmp_path / "bad.html").read_text(), res.output + res.stderr
    assert "scores_exact.parquet" in (tmp_path / "bad.html").read_text()
    assert _invoke(["report", audit_run, "--out", tmp_path / "good.html", "--trust-unrecorded"]).exit_code == 0
    assert "read unchecked" not in (tmp_path / "good.html").read_text()
    # a recorded table is checked even with the flag: trusting the unrecorded does not unlock an edited one
    edited = _scaled(audit_run, tmp_path / "edited")
    res = _invoke(["query", sql, edited, "--trust-unrecorded"])
    assert res.exit_code == 2 and "changed since the run wrote them" in res.stderr, res.output + res.stderr


def test_query_does_not_expose_a_planted_table(audit_run, tmp_path):
    """Issue 45 item 6: a Parquet file that no manifest records, planted beside a run's tables, is refused."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(audit_run, run)
    ok = _invoke(["query", "SELECT count(*) AS n FROM scores_exact", run])
    assert ok.exit_code == 0, ok.output + ok.stderr
    absent = _invoke(["query", "SELECT * FROM planted", run])  # control: no such table yet
    assert absent.exit_code == 2 and "planted" in absent.stderr and "not written by the run" not in absent.stderr
    pq.write_table(pa.table({"secret": ["x"]}), run / "planted.parquet")
    for sql in ("SELECT * FROM planted", "SELECT count(*) AS n FROM scores_exact"):
        res = _invoke(["query", sql, run])
        assert res.exit_code == 2 and "planted.parquet" in res.stderr and "not written by the run" in res.stderr
        assert "secret" not in res.output


def test_tables_written_outside_a_stage_are_recorded(tmp_path):
    """RunDir records what it writes outside a stage (a Result, check --record's claims), so readers accept it;
    a later stage's record of the same table replaces it, and editing it is still caught."""
    from circuitstat.core.integrity import IntegrityError
    from circuitstat.core.run_check import verify_outputs
    from circuitstat.core.rundir import RunDir

    with RunDir(tmp_path / "r", spec={"x": 1}, seed=0) as run:
        run.write_table("extra", {"a": [1, 2]})
        assert verify_outputs(run.path).checked == 1
        run.stage("s", lambda: {"extra": {"a": [3]}}, ["extra"])
    import json

    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert "extra.parquet" not in manifest.get("tables", {}) and verify_outputs(tmp_path / "r").checked == 1
    pq.write_table(pa.table({"a": [9]}), tmp_path / "r" / "extra.parquet")
    with pytest.raises(IntegrityError, match="extra.parquet"):
        verify_outputs(tmp_path / "r")


def test_check_record_writes_a_claims_table_the_readers_accept(audit_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(audit_run, run)
    (tmp_path / "claims.yaml").write_text(CLAIMS)
    res = _invoke(["check", tmp_path / "claims.yaml", "--run", run, "--record"])
    assert res.exit_code == 0 and (run / "claims.parquet").is_file(), res.output + res.stderr
    res = _invoke(["query", "SELECT status FROM claims", run, "-f", "csv"])
    assert res.exit_code == 0 and res.stdout.split() == ['"status"', '"pass"'], res.output + res.stderr


def test_sample_size_refuses_an_edited_pilot(audit_run, tmp_path):
    """Issue 45 item 2: sample-size read its pilot without the digest check (widths 1000 x too wide)."""
    from circuitstat.core.integrity import IntegrityError
    from circuitstat.pipelines.runs.sample_size.simulate import read_pilot

    sm, _ = read_pilot(audit_run)  # the control: the pilot as written is read
    assert sm.scores.shape[0] == AUDIT["task"]["n"]
    bad = _scaled(audit_run, tmp_path / "bad")
    for trust in (False, True):  # a recorded table is checked even with trust_unrecorded
        with pytest.raises(IntegrityError, match="changed since the run wrote them: scores_exact.parquet"):
            read_pilot(bad, trust_unrecorded=trust)
