"""Issue 46: every command that writes a run of a registered kind builds that kind's spec and runs it through
``kind(name).run``, as the service does; and "an option of another mask method" is refused by one guard
(circuitstat.pipelines.mask_options.check_mask_options), with one message from the command line, a spec (the
service's jobs) and the library."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from circuitstat.core.errors import InputError
from circuitstat.pipelines import kinds
from circuitstat.pipelines.cli import app

MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=16&n_positions=64&vocab_size=97"


class Reached(Exception):
    """Raised by the spied run: the command got as far as the kind's run (nothing is computed)."""


def _spy(monkeypatch, name: str) -> list:
    """The calls (spec, out, keyword arguments) that reach run kind ``name``'s run, which is replaced by a spy."""
    calls: list = []
    module = importlib.import_module(kinds.module_of(name))

    def run(spec, out, **kw):
        calls.append((spec, Path(out), kw))
        raise Reached

    monkeypatch.setattr(module, "KIND", dataclasses.replace(module.KIND, run=run))
    return calls


def _write(tmp_path: Path, name: str, doc: dict) -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    """A command line per run kind (every kind of the registry; the spec files are valid; nothing runs)."""
    audit = _write(tmp_path, "audit.yaml", {"model": MODEL, "task": {"name": "induction", "n": 8}, "methods": ["eap"]})
    variance = _write(tmp_path, "variance.yaml", {"model": MODEL, "task": {"name": "induction", "n": 8}})
    calibration = _write(tmp_path, "cal.yaml", {"model": MODEL, "task": {"name": "induction", "n": 64},
                                               "method": "exact", "sizes": [16], "n_datasets": 20})
    truth = _write(tmp_path, "gt.yaml", {"models": ["planted:induction?background=1"], "methods": ["exact", "eap"],
                                        "sizes": [8], "n_datasets": 5, "n_resamples": 100, "n_subsamples": 10})
    return {
        "attribute": ["attribute", "--model", MODEL, "--n", "4", "--method", "eap", "--seed", "3"],
        "audit": ["audit", audit, "--no-report"],
        "study variance": ["study", "variance", variance, "--no-report"],
        "study calibration": ["study", "calibration", calibration],
        "study groundtruth": ["study", "groundtruth", truth],
        "study heads": ["study", "heads", "--quick"],
        "tokens": ["tokens", "--model", MODEL, "--n", "4"],
        "heads": ["heads", "--models", f"{MODEL},{MODEL}"],
        "sample-size": ["sample-size", str(tmp_path), "--n", "64"],  # the pilot is read in the run (spied)
    }


@pytest.mark.parametrize("name", [k for k in kinds.KINDS])
def test_each_command_runs_its_spec_through_the_kinds_run(tmp_path, monkeypatch, name):
    calls = _spy(monkeypatch, name)
    out = tmp_path / "run"
    res = CliRunner().invoke(app, [*_commands(tmp_path)[name], "--out", str(out), "--force"])
    assert "Reached" in res.output and len(calls) == 1, res.output  # stopped by the spy, as reached
    spec, where, kw = calls[0]
    assert where == out and kw["force"] is True  # the command's own option reaches the run as a keyword
    assert type(spec).__name__ == SPEC_CLASSES[name]  # the kind's own spec object, as a service job is parsed into


SPEC_CLASSES = {"attribute": "AttributeSpec", "audit": "AuditSpec", "study variance": "VarianceSpec",
                "study calibration": "CalibrationSpec", "study groundtruth": "GroundTruthSpec",
                "study heads": "HeadStudyRun", "tokens": "TokensSpec", "heads": "HeadsRun",
                "sample-size": "SampleSizeSpec"}


def test_attribute_builds_the_services_spec_from_its_options(tmp_path, monkeypatch):
    """The command's spec equals the one a service job with the same request options is parsed into."""
    calls = _spy(monkeypatch, "attribute")
    CliRunner().invoke(app, ["attribute", "--model", MODEL, "--method", "ugs", "--n", "8", "--steps", "3",
                             "--n-samples", "2", "--n-refits", "2", "--task-option", "seq_len=6", "--dtype", "fp32",
                             "--device", "cpu", "--out", str(tmp_path / "o")])
    spec, _, kw = calls[0]
    job = kinds.kind("attribute").parse({"model": MODEL, "method": "ugs", "n": 8, "ugs": {"steps": 3, "n_samples": 2},
                                         "n_refits": 2, "task_options": {"seq_len": 6}}, "job")
    assert spec == job
    assert kw["device"] == "cpu" and "device" not in type(spec).model_fields  # the machine's, not the request's


def test_a_command_that_bypasses_the_kind_is_caught(tmp_path, monkeypatch):
    """Negative control: the library's direct road (run_attribute, not kind(...).run) writes a run while the spy
    sees no call, so a command taking that road would fail the test above."""
    from circuitstat.pipelines.runs.attribute.run import run_attribute

    calls = _spy(monkeypatch, "attribute")
    run_attribute(MODEL, "induction", tmp_path / "direct", n=4, method="eap")
    assert (tmp_path / "direct" / "scores.parquet").is_file() and calls == []


GUARD_CASES = [  # (command-line flags, spec/library keyword arguments, the method)
    (["--n-samples", "2"], {"ugs": {"n_samples": 2}}, "eap"),
    (["--n-samples", "2"], {"ugs": {"n_samples": 2}}, "edge-pruning"),
    (["--target", "0.5"], {"edge_pruning": {"target": 0.5}}, "ugs"),
    (["--steps", "3"], {"edge_pruning": {"steps": 3}}, "exact"),
    (["--n-refits", "2"], {"n_refits": 2}, "eap"),
]


def _audit_road(options: dict, method: str) -> str:
    """The error of an audit spec running ``method`` (with eap) for one misplaced option, or 'accepted'."""
    from circuitstat.pipelines.spec import parse_spec

    sections = {k: {**v, "steps": 7} for k, v in options.items() if isinstance(v, dict)}  # not a written-out default
    try:
        parse_spec({"model": MODEL, "methods": sorted({"eap", method}), **sections}, "audit.yaml")
        return "accepted"
    except InputError as e:
        return str(e)


def _three_roads(flags: list[str], options: dict, method: str, tmp_path: Path) -> tuple[str, str, str]:
    """The error of the command line, of a service job's spec and of the library for one misplaced option."""
    res = CliRunner().invoke(app, ["attribute", "--model", MODEL, "--method", method, *flags,
                                   "--out", str(tmp_path / "cli")])
    cli = f"exit {res.exit_code}: {res.output}"
    try:
        kinds.kind("attribute").parse({"model": MODEL, "method": method, **options}, "job")
        spec = "accepted"
    except InputError as e:
        spec = str(e)
    from circuitstat.pipelines.runs.attribute.run import run_attribute

    try:
        run_attribute("/no/such/model", "induction", tmp_path / "lib", method=method, n=4, **options)
        lib = "ran"
    except InputError as e:
        lib = str(e)
    return cli, spec, lib


@pytest.mark.parametrize("flags, options, method", GUARD_CASES)
def test_an_option_of_another_method_gets_one_message_everywhere(tmp_path, flags, options, method):
    from circuitstat.pipelines.mask_options import check_mask_options

    with pytest.raises(InputError) as want:  # the guard's own message
        check_mask_options(method, {k: list(v) for k, v in options.items() if isinstance(v, dict)},
                           refits="n_refits" in options)
    cli, spec, lib = _three_roads(flags, options, method, tmp_path)
    assert cli.startswith("exit 2:") and str(want.value) in " ".join(cli.split())
    assert str(want.value) in spec and lib == str(want.value)
    assert not (tmp_path / "cli").exists() and not (tmp_path / "lib").exists()
    if any(isinstance(v, dict) for v in options.values()):  # an audit spec's sections: the same guard
        with pytest.raises(InputError) as audit_want:
            check_mask_options(sorted({"eap", method}), {k: [*v, "steps"] for k, v in options.items()
                                                         if isinstance(v, dict)}, words="methods")
        assert str(audit_want.value) in _audit_road(options, method)


def test_the_guard_is_the_only_place_that_refuses(tmp_path, monkeypatch):
    """Negative control: with the guard switched off, neither the command line, nor a spec (an attribute job's or an
    audit's), nor the library refuses a UGS option given with eap (so no second copy of the check is left)."""
    from circuitstat.pipelines import mask_options

    monkeypatch.setattr(mask_options, "check_mask_options", lambda *a, **k: None)
    cli, spec, lib = _three_roads(["--n-samples", "2"], {"ugs": {"n_samples": 2}}, "eap", tmp_path)
    audit = _audit_road({"ugs": {"n_samples": 2}}, "eap")
    for got in (cli, spec, lib, audit):
        assert "n_samples" not in got and "--n-samples" not in got
    assert spec == "accepted" and audit == "accepted"  # the spec took it; the command line and the library went on to the model
    assert "/no/such/model" in lib


def test_mask_options_are_derived_from_the_method_records_and_options_classes():
    from circuitstat.circuits.methods import METHOD_RECORDS
    from circuitstat.pipelines.mask_options import owners
    from circuitstat.pipelines.spec import UGSOptions

    masks = tuple(m.name for m in METHOD_RECORDS if m.family == "mask")
    assert owners("n_refits") == masks
    assert owners("steps") == masks  # every mask fit takes its steps
    assert owners("n_samples") == ("ugs",) and "n_samples" in UGSOptions.model_fields
    assert owners("target") == ("edge-pruning",) and owners("no_such_option") == ()


def test_the_prompt_limit_is_lifted_by_the_command_lines_allow_large_only(tmp_path, monkeypatch):
    """--n above 1,000,000: refused naming --allow-large, which lifts it on the command line; a service job's spec
    has no key that lifts it (a request never lifts a CLI-only limit)."""
    from circuitstat.pipelines.runs.attribute.run import N_MAX

    calls = _spy(monkeypatch, "attribute")
    args = ["attribute", "--model", MODEL, "--n", str(N_MAX + 1), "--out", str(tmp_path / "o")]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2 and "--allow-large" in refused.output and calls == []
    CliRunner().invoke(app, [*args, "--allow-large"])
    assert len(calls) == 1 and calls[0][0].n == N_MAX + 1 and calls[0][2]["allow_large"] is True
    for data in ({"n": N_MAX + 1}, {"n": N_MAX + 1, "allow_large": True}):
        with pytest.raises(InputError, match="n"):
            kinds.kind("attribute").parse({"model": MODEL, **data}, "job")
    assert kinds.kind("attribute").parse({"model": MODEL, "n": N_MAX}, "job").n == N_MAX


def test_check_run_audit_and_check_circuit_run_their_audits_through_the_kind(tmp_path, monkeypatch):
    """`check --run-audit` and `check-circuit` write audit runs: through kind("audit").run as well."""
    calls = _spy(monkeypatch, "audit")
    spec = _write(tmp_path, "audit.yaml", {"model": MODEL, "task": {"name": "induction", "n": 8}, "methods": ["eap"]})
    claims = _write(tmp_path, "claims.yaml", {"spec": Path(spec).name, "run": "runs/a", "claims": [
        {"kind": "circuit_stability", "method": "eap", "k": 5, "statistic": "jaccard_mean", "min": 0.0}]})
    res = CliRunner().invoke(app, ["check", claims, "--run-audit"])
    assert len(calls) == 1 and calls[0][1] == tmp_path / "runs" / "a", res.output
    (tmp_path / "c.txt").write_text("input->logits\n")
    res = CliRunner().invoke(app, ["check-circuit", str(tmp_path / "c.txt"), "--model", MODEL, "--task", "induction",
                                   "--out", str(tmp_path / "cc")])
    assert len(calls) == 2 and type(calls[1][0]).__name__ == "AuditSpec" and calls[1][0].circuit is not None, \
        res.output


def test_the_demo_runs_its_audit_through_the_kind(tmp_path, monkeypatch):
    from circuitstat.pipelines import zoo

    monkeypatch.setattr(zoo, "default_zoo", lambda **kw: None)  # the zoo's training is not what is tested here
    calls = _spy(monkeypatch, "audit")
    res = CliRunner().invoke(app, ["demo", "--quick", "--out", str(tmp_path / "demo")])
    assert "Reached" in res.output and len(calls) == 1, res.output
    assert type(calls[0][0]).__name__ == "AuditSpec" and calls[0][2] == {"n_jobs": None}


def test_a_heads_run_records_its_kind_and_can_be_run_again(tmp_path):
    """`heads` wrote no kind, so its own check_run_out refused a second run into the same --out (even --force)."""
    import json

    gpt2 = MODEL.replace("vocab_size=97", "vocab_size=50257")  # the bundled GPT-2 tokenizer builds the probes
    argv = ["heads", "--models", f"{gpt2}&seed=1,{gpt2}&seed=2", "--n-probe", "4", "--n-resamples", "20",
            "--out", str(tmp_path / "h")]
    first = CliRunner().invoke(app, argv)
    assert first.exit_code == 0, first.output
    assert json.loads((tmp_path / "h" / "manifest.json").read_text())["kind"] == "heads"
    again = CliRunner().invoke(app, argv)
    assert again.exit_code == 0, again.output


def test_every_mask_option_with_a_flag_is_an_option_of_the_attribute_command():
    """The guard names an option by its flag: each flag it names exists, and each spec-only option has none."""
    import typer

    from circuitstat.pipelines.mask_options import NO_FLAG, REFITS, flag
    from circuitstat.pipelines.spec import MASK_SECTIONS

    command = typer.main.get_command(app).commands["attribute"]
    flags = {o for p in command.params for o in getattr(p, "opts", ())}
    keys = {REFITS} | {k for _, cls in MASK_SECTIONS.values() for k in cls.model_fields}
    assert {k for k in keys if flag(k) is not None and flag(k) not in flags} == set()
    assert set(NO_FLAG) <= keys and all(f"--{k.replace('_', '-')}" not in flags for k in NO_FLAG)
