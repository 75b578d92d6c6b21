"""One output-path policy for every command that writes (issue 45 item 3; circuitstat.core.outpath): no file option
replaces a device, FIFO or link or writes into a missing directory or a run's records; a run directory is never
written through a link nor into another command's run, --force or not; export mib writes through no link below
--out. Targets are FIFOs and links in a temporary directory; /dev/full is only ever refused, with os.replace
made to fail the test should anything get as far as renaming over it."""

from __future__ import annotations

import inspect
import os
import shutil
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from circuitstat.core.errors import InputError
from circuitstat.core.rundir import RunDir
from circuitstat.pipelines.cli import app

MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=64&seed=1"
runner = CliRunner()

# file options: each refused before any work by check_output_file (argv given the target and a scratch dir)
FILE_OUTPUTS = {
    "compare --html": lambda t, d: ["compare", d / "a", d / "b", "--html", t],
    "circuit --json": lambda t, d: ["circuit", d / "a", "--k", "1", "--json", t],
    "check --junit": lambda t, d: ["check", d / "claims.yaml", "--run", d / "a", "--junit", t],
    "report --out": lambda t, d: ["report", d / "a", "--out", t],
}
# run directories: check_run_out (a link, a file, another command's run: refused, --force or not)
RUN_OUTPUTS = {"attribute --out", "audit --out", "heads --out", "check-circuit --out", "tokens --out",
               "study heads --out", "study variance --out", "study calibration --out", "study groundtruth --out",
               "sample-size --out", "submit --out", "demo --out"}
# directories filled otherwise, each under its own check
OTHER_OUTPUTS = {"export mib --out": "check_no_links below --out", "train --out": "model folders (check_out_dir)",
                 "serve --data": "the service's data directory", **{f"users {c} --data": "the service's data directory"
                                                                   for c in ("add", "token", "revoke", "rotate",
                                                                             "tokens", "admin", "list")}}


def _invoke(argv: list):
    return runner.invoke(app, [str(a) for a in argv])


def _commands() -> dict:
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


def test_every_output_option_is_under_the_policy():
    """Every path option that names where a command writes is listed here, so a new one cannot skip the policy;
    every run-writing command's body checks its --out through check_out/check_run_out."""
    found = set()
    for name, cmd in _commands().items():
        for p in cmd.params:
            opts = getattr(p, "opts", ())
            if any(o in ("--out", "--html", "--json", "--junit", "--data", "--output") for o in opts) and not p.is_flag:
                found.add(f"{name} {opts[0]}")
    assert found == set(FILE_OUTPUTS) | RUN_OUTPUTS | set(OTHER_OUTPUTS)
    commands = _commands()
    for option in RUN_OUTPUTS - BY_BEHAVIOUR:
        source = inspect.getsource(commands[option.rsplit(" ", 1)[0]].callback)
        assert "check_out(" in source or "check_run_out(" in source, option


# run outputs whose refusal the tests below show by running the command (their check sits in a helper)
BY_BEHAVIOUR = {"attribute --out", "sample-size --out", "check-circuit --out", "tokens --out", "heads --out"}


@pytest.fixture
def scratch(tmp_path) -> Path:
    """Two runs a file option may name beside (a and b, with manifests) and a claims file."""
    for name in ("a", "b"):
        with RunDir(tmp_path / name, spec={"synthetic": True}, seed=0):
            pass
    (tmp_path / "claims.yaml").write_text("claims:\n  - {kind: circuit_stability, method: exact, k: 2, "
                                          "statistic: jaccard_mean, min: 0.0}\n")
    return tmp_path


@pytest.mark.parametrize("option", sorted(FILE_OUTPUTS))
def test_file_options_refuse_special_files_links_records_and_missing_directories(scratch, option):
    argv = FILE_OUTPUTS[option]
    fifo, kept, link = scratch / "fifo.html", scratch / "kept.html", scratch / "link.html"
    os.mkfifo(fifo)
    kept.write_text("the user's file")
    link.symlink_to(kept)
    manifest = (scratch / "b" / "manifest.json").read_bytes()
    cases = [(fifo, "is a FIFO"), (link, "is a symbolic link"), (scratch / "b" / "manifest.json", "run's own record"),
             (scratch / "new" / "x.html", "does not exist")]
    if option == "report --out":  # report's own rule refuses an existing non-.html file first, and says so
        cases[2] = (scratch / "b" / "manifest.json", "is not an .html file")
    for target, words in cases:
        res = _invoke(argv(target, scratch))
        assert res.exit_code == 2 and words in res.stderr and "Traceback" not in res.output, (option, target, res.output)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.path.islink(link) and kept.read_text() == "the user's file"
    assert (scratch / "b" / "manifest.json").read_bytes() == manifest and not (scratch / "new").exists()


@pytest.mark.parametrize("option", sorted(FILE_OUTPUTS))
def test_dev_full_is_refused_before_any_write(scratch, option, monkeypatch):
    """Issue 45 item 3: `compare A B --html /dev/full` replaced the device node when run as root."""
    def no_rename(*a, **k):
        raise AssertionError(f"os.replace{a} reached: /dev/full would be replaced")

    monkeypatch.setattr(os, "replace", no_rename)
    res = _invoke(FILE_OUTPUTS[option]("/dev/full", scratch))
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "/dev/full" in res.stderr and ("is a device" in res.stderr or "not an .html file" in res.stderr)
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)


def test_the_policy_accepts_a_new_name_or_a_regular_file(tmp_path):
    """The negative control: what a user normally names passes."""
    from circuitstat.core.outpath import check_output_file

    assert check_output_file(tmp_path / "new.html", flag="--html") == tmp_path / "new.html"
    (tmp_path / "old.html").write_text("x")
    assert check_output_file(tmp_path / "old.html", flag="--html") == tmp_path / "old.html"
    assert check_output_file(tmp_path / "d" / "report.html", flag="--out", new_dir=True)  # report --out NEW_DIR
    with pytest.raises(InputError, match="does not exist"):
        check_output_file(tmp_path / "d" / "e" / "report.html", flag="--out", new_dir=True)  # two new levels


def test_atomic_write_never_renames_over_a_special_file(tmp_path):
    from circuitstat.core.atomic import atomic_write_bytes

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="is a FIFO"):
        atomic_write_bytes(fifo, b"page")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.listdir(tmp_path) == ["fifo"]  # no temporary file left
    with pytest.raises(InputError, match="is a directory"):
        atomic_write_bytes(tmp_path, b"page")
    atomic_write_bytes(tmp_path / "plain", b"one")  # the control: a regular file is replaced
    atomic_write_bytes(tmp_path / "plain", b"two")
    assert (tmp_path / "plain").read_bytes() == b"two"


@pytest.fixture(scope="module")
def attribute_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("attr") / "run"
    res = runner.invoke(app, ["attribute", "--model", MODEL, "--method", "eap", "--n", "4", "--out", str(out)])
    assert res.exit_code == 0, res.output + res.stderr
    return out


def test_sample_size_never_writes_into_another_run(attribute_run, tmp_path):
    """Issue 45 item 3: `sample-size PILOT --out OTHER_RUN` wrote into an audit run and rewrote its manifest."""
    other = tmp_path / "other"
    shutil.copytree(attribute_run, other)
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    for force in ([], ["--force"]):
        res = _invoke(["sample-size", attribute_run, "--out", other, *force])
        assert res.exit_code == 2 and "holds a `circuitstat attribute` run" in res.stderr, res.output
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    res = _invoke(["sample-size", attribute_run, "--out", link])
    assert res.exit_code == 2 and "symbolic link" in res.stderr and not (tmp_path / "elsewhere").exists()


def test_force_never_writes_into_a_run_of_another_kind(tmp_path):
    """--force only recomputes a run of the same kind: attribute --force into an audit's run is refused."""
    with RunDir(tmp_path / "audit", spec={"methods": ["eap"], "bootstrap": {}}, seed=0, kind="audit"):
        pass
    before = (tmp_path / "audit" / "manifest.json").read_bytes()
    # attribute, tokens and heads check --out in their kind's run (circuitstat.pipelines.kinds.check_run_out)
    runs = (["attribute", "--model", MODEL, "--method", "eap", "--n", "4"], ["tokens", "--model", MODEL, "--n", "4"],
            ["heads", "--models", f"{MODEL},{MODEL}"])
    for argv in runs:
        res = _invoke([*argv, "--out", tmp_path / "audit", "--force"])
        assert res.exit_code == 2 and "holds a `circuitstat audit` run" in res.stderr, (argv, res.output)
        assert (tmp_path / "audit" / "manifest.json").read_bytes() == before
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "audit", target_is_directory=True)
    for argv in (*runs, ["check-circuit", tmp_path / "c.json", "--model", MODEL, "--task", "induction"]):
        res = _invoke([*argv, "--out", link])
        assert res.exit_code == 2 and "is a symbolic link" in res.stderr, res.output


def test_export_mib_force_writes_through_no_link(attribute_run, tmp_path):
    """Issue 45 item 3: with D/<task>_<model> a link out of D, `export mib --force` replaced files there."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "importances.json").write_text("theirs")
    d = tmp_path / "D"
    d.mkdir()
    (d / "ioi_gpt2").symlink_to(outside, target_is_directory=True)
    argv = ["export", "mib", attribute_run, "--out", d, "--task-name", "ioi", "--model-name", "gpt2"]
    for force in ([], ["--force"]):
        res = _invoke([*argv, *force])
        assert res.exit_code == 2 and "is a symbolic link" in res.stderr, res.output
    assert os.listdir(outside) == ["importances.json"] and (outside / "importances.json").read_text() == "theirs"
    (d / "ioi_gpt2").unlink()  # the control: without the link the export is written
    res = _invoke(argv)
    assert res.exit_code == 0 and (d / "ioi_gpt2" / "importances.json").is_file(), res.output
    res = _invoke(["export", "mib", attribute_run, "--out", tmp_path / "no" / "D", "--task-name", "ioi",
                   "--model-name", "gpt2"])
    assert res.exit_code == 2 and not (tmp_path / "no").exists(), res.output


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_check_circuit_says_what_a_special_file_is(tmp_path, kind):
    """Issue 45 item 6: check-circuit on /dev/zero, a FIFO or a directory said "not found"."""
    path = {"fifo": tmp_path / "c.json", "directory": tmp_path, "device": Path("/dev/zero")}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    res = _invoke(["check-circuit", path, "--model", MODEL, "--task", "induction", "--out", tmp_path / "run"])
    words = {"fifo": "is a FIFO", "directory": "is a directory", "device": "is a device"}[kind]
    assert res.exit_code == 2 and words in res.stderr and "not found" not in res.stderr, res.output
    missing = _invoke(["check-circuit", tmp_path / "nope.json", "--model", MODEL, "--task", "induction",
                       "--out", tmp_path / "run2"])
    assert missing.exit_code == 2 and "not found" in missing.stderr  # the control: a missing file is "not found"
