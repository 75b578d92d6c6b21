"""Paths inside spec files resolve relative to the spec and stay in its tree (issue: untrusted input)."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app
from circuitstat.pipelines.spec import load_spec

RANDOM = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64"


def _spec(path, model: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"model": model, "task": {"name": "induction", "n": 8}, "methods": ["eap"],
                                    "k": [2, 3]}))
    return path


def _audit(spec, out, *extra):
    r = CliRunner().invoke(app, ["audit", str(spec), "--out", str(out), "--no-report", *extra])
    return r.exit_code, r.output


def test_absolute_and_parent_model_paths_are_refused_and_write_nothing(tmp_path) -> None:
    (tmp_path / "models" / "m").mkdir(parents=True)
    for model in (str(tmp_path / "models" / "m"), "../models/m", "~/m"):
        spec = _spec(tmp_path / "specs" / "a.yaml", model)
        code, out = _audit(spec, tmp_path / "run")
        assert code == 2, out
        assert "--allow-outside" in out and "Traceback" not in out and len(out.strip().splitlines()) == 1
        assert not (tmp_path / "run").exists()


def test_relative_model_path_resolves_against_the_spec(tmp_path) -> None:
    (tmp_path / "specs" / "models" / "m").mkdir(parents=True)
    spec = load_spec(_spec(tmp_path / "specs" / "a.yaml", "models/m"))
    assert spec.model == str(tmp_path / "specs" / "models" / "m")
    # sources that are not paths are left alone
    assert load_spec(_spec(tmp_path / "specs" / "b.yaml", RANDOM)).model == RANDOM
    # a hub id is marked as one: looked up in the Hugging Face cache only, never in the current directory
    assert load_spec(_spec(tmp_path / "specs" / "c.yaml", "org/name")).model == "hf:org/name"


def test_allow_outside_lifts_confinement(tmp_path) -> None:
    spec = _spec(tmp_path / "specs" / "a.yaml", str(tmp_path / "elsewhere"))
    assert load_spec(spec, allow_outside=True).model == str(tmp_path / "elsewhere")
    code, out = _audit(spec, tmp_path / "run", "--allow-outside")
    assert code == 2 and "allow-outside" not in out  # past confinement: now the model itself is missing
