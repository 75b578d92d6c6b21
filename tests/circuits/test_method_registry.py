"""circuitstat.circuits.methods: one record per method, read by attribution, the plan, the options and the CLI.

The plan's numbers were recorded before the registry replaced the per-method if-chains
(tests/circuits/method_golden.py wrote tests/fixtures/method_plan_golden.json from the old code): every method x
level x three (n, positions, batch, steps, rows) on four configs, and the mask fits, must price exactly as before."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from method_golden import FIXTURE, compute  # noqa: E402

from circuitstat.circuits.methods import MASK_METHODS, METHOD_RECORDS, METHODS, Passes, count, method  # noqa: E402

GOLDEN = json.loads(FIXTURE.read_text())
OLD_METHODS = ("exact", "eap", "eap-ig-inputs", "eap-ig-activations", "clean-corrupted", "atp-qkfix", "atp-graddrop",
               "atpstar", "ensemble")  # the methods the fixture was recorded for


def test_plan_numbers_equal_those_recorded_before_the_registry():
    now = compute(OLD_METHODS, ("edge-pruning", "ugs"))
    assert set(now) == set(GOLDEN)
    changed = {}
    for key, old in GOLDEN.items():
        new = now[key]
        if old[-1] == "KeyError":  # the old estimate_seconds crashed on exact at a post-norm model: now priced
            assert key.startswith("post-norm|exact|") and new[:-1] == old[:-1] and math.isfinite(new[-1]), key
            continue
        if new != old:
            changed[key] = (old, new)
    assert not changed, list(changed.items())[:3]


def test_the_golden_comparison_catches_a_changed_pass_count(monkeypatch):
    """Negative control: one pass count changed in one record changes recorded numbers."""
    import dataclasses

    import circuitstat.circuits.methods as methods

    rec = methods.method("clean-corrupted")
    monkeypatch.setitem(methods._BY_NAME, "clean-corrupted", dataclasses.replace(rec, passes=dataclasses.replace(
        rec.passes, runs="3")))
    now = compute(("clean-corrupted",), ())
    assert any(now[k] != GOLDEN[k] for k in now)


def test_records_are_consistent():
    names = [m.name for m in METHOD_RECORDS]
    assert len(names) == len(set(names))
    assert set(METHODS) | set(MASK_METHODS) == set(names) and not set(METHODS) & set(MASK_METHODS)
    for m in METHOD_RECORDS:
        assert set(m.levels) <= {"edge", "node"} and m.levels
        assert all(x in METHODS for x in m.members)
    with pytest.raises(ValueError, match="unknown pass count"):
        type(METHOD_RECORDS[0])("x", "score", "m:f", Passes(runs="steps*bogus"))
    assert count("steps*groups", steps=3, groups=5) == 15 and count("2") == 2


def test_every_runner_resolves():
    from circuitstat.circuits.methods import runner

    for m in METHOD_RECORDS:
        assert callable(runner(m.name))
        if m.family == "mask":
            assert callable(runner(m.name, 1))


def test_the_module_imports_no_torch_and_no_pydantic():
    import subprocess

    code = ("import sys; import circuitstat.circuits.methods, circuitstat.pipelines.options; "
            "print(sorted(m for m in ('torch', 'pydantic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_method_names_the_known_ones():
    from circuitstat.core.errors import InputError

    with pytest.raises(InputError, match="use one of exact, eap"):
        method("eap-typo")


@pytest.mark.parametrize("name", [m.name for m in METHOD_RECORDS])
def test_every_method_parses_on_the_command_line_and_round_trips_a_spec(name):
    """The CLI's --method and both specs (attribute, audit) accept every registered method and keep it."""
    import typer

    from circuitstat.pipelines.runs.attribute.run import AttributeSpec
    from circuitstat.pipelines.cli import app
    from circuitstat.pipelines.spec import parse_spec

    cmd = typer.main.get_command(app).commands["attribute"]
    ctx = cmd.make_context("attribute", ["--model", "random:gpt2", "--method", name])
    assert ctx.params["method"] == name
    spec = AttributeSpec(model="random:gpt2", method=name)
    assert AttributeSpec(**spec.model_dump()).method == name
    if not method(name).effect:  # an audit's intervals cover effects: it refuses other scores
        return                            # (test_flow_routes checks the refusal)
    methods = ["eap", name] if name != "eap" else ["eap"]  # an audit needs a score method besides exact
    audit = parse_spec({"model": "random:gpt2", "methods": methods})
    assert parse_spec(audit.model_dump(exclude_none=True)).methods == audit.methods == methods


def test_help_lists_every_method_and_the_cli_refuses_others():
    import typer
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    out = CliRunner().invoke(app, ["attribute", "--help"], env={"COLUMNS": "1000", "TERMINAL_WIDTH": "1000"}).output
    assert all(m.name in out for m in METHOD_RECORDS), out
    cmd = typer.main.get_command(app).commands["attribute"]
    with pytest.raises(Exception, match="'eap-typo' is not one of 'exact', 'eap'"):  # typer's BadParameter
        cmd.make_context("attribute", ["--model", "random:gpt2", "--method", "eap-typo"])


def test_mask_draws_read_the_option_the_record_names():
    """A mask fit's step costs one masked run per draw: UGS's n_samples (its record's draws_option), else 1; every
    mask method has an options section in a spec."""
    from circuitstat.pipelines.spec import MASK_SECTIONS, UGSOptions, mask_draws

    assert set(MASK_SECTIONS) == set(MASK_METHODS)
    assert mask_draws("ugs", UGSOptions(n_samples=3)) == 3 and mask_draws("ugs", UGSOptions(n_samples=1)) == 1
    assert mask_draws("edge-pruning", MASK_SECTIONS["edge-pruning"][1]()) == 1
    for name in MASK_METHODS:
        opt = method(name).draws_option
        assert not opt or opt in MASK_SECTIONS[name][1].model_fields
