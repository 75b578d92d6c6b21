"""The last ways past confinement (issue 28 items 6-10): head-study plan paths, zoo: names, bare model
names in specs, values quoted from a spec reached through a claims file, and query's links and caps."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from circuitstat.core.errors import InputError
from circuitstat.pipelines.sources import LOCAL
from circuitstat.pipelines.cli import app
from circuitstat.pipelines.runs.heads.study import load_head_study_plan
from circuitstat.pipelines.spec import load_spec
from circuitstat.core.query import connect, query
from circuitstat.core.rundir import RunDir
from circuitstat.core.tables import matrix_to_table

SECRET = "SECRET-7c1e"
runner = CliRunner()


def _yaml(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _one_line_error(res, *needles: str) -> str:
    assert res.exit_code == 2, res.output + res.stderr
    err = res.stderr.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "Traceback" not in res.output, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


# ---- item 6: head-study plans ----------------------------------------------------------------------
@pytest.mark.parametrize("key", ["corpus", "tokenizer"])
def test_plan_recipe_paths_are_confined_to_the_plan_and_read_nothing(tmp_path, monkeypatch, key):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET * 100)
    monkeypatch.setenv("CIRCUITSTAT_CACHE", str(tmp_path / "cache"))
    plan = _yaml(tmp_path / "plans" / "plan.yaml", {"start": "quick", "recipe": {key: str(outside)}})
    res = runner.invoke(app, ["study", "heads", str(plan), "--out", str(tmp_path / "run")])
    err = _one_line_error(res, f"'recipe.{key}:'", "--allow-outside")
    assert SECRET not in err and str(outside) not in err
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()  # nothing tokenized or written
    _yaml(plan, {"start": "quick", "recipe": {key: "../outside"}})
    with pytest.raises(InputError, match="leads outside"):
        load_head_study_plan(plan)


def test_plan_recipe_paths_resolve_against_the_plan_not_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "plans" / "texts").mkdir(parents=True)
    (tmp_path / "cwd" / "texts").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd")
    plan = load_head_study_plan(_yaml(tmp_path / "plans" / "p.yaml", {"start": "quick",
                                                                       "recipe": {"corpus": "texts"}}))
    assert Path(plan.base.corpus) == tmp_path / "plans" / "texts"
    same = load_head_study_plan(_yaml(tmp_path / "plans" / "q.yaml", {"start": "quick",
                                                                       "recipe": {"corpus": "stdlib"}}))
    assert same.base.corpus == "stdlib"  # built-in names are not paths
    allowed = load_head_study_plan(_yaml(tmp_path / "plans" / "r.yaml", {"start": "quick", "recipe": {
        "corpus": str(tmp_path / "cwd" / "texts")}}), allow_outside=True)
    assert Path(allowed.base.corpus) == tmp_path / "cwd" / "texts"


# ---- item 7: zoo: names -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["zoo:attn-only-2l/../../../../victim", "zoo:attn-only-2l/seed-0/../../victim",
                                  "zoo:attn-only-2l//seed-0", "zoo:attn-only-2l/seed-0/", "zoo:attn-only-2l/seed-01",
                                  "zoo:attn-only-2l/seed-x", "zoo:../attn-only-2l/seed-0", "zoo:attn-only-2l",
                                  f"zoo:{SECRET}/seed-0"])
def test_zoo_names_take_a_recipe_and_a_seed_and_nothing_else(name):
    with pytest.raises(InputError, match="zoo:RECIPE/seed-S") as e:
        LOCAL.resolve(name)
    assert "victim" not in str(e.value) and SECRET not in str(e.value)


def test_a_zoo_seed_linked_out_of_the_zoo_is_refused(tmp_path, monkeypatch):
    import circuitstat.pipelines.zoo

    root = tmp_path / "zoo" / "attn-only-2l-key"
    root.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "model.safetensors").write_bytes(b"x")
    (root / "seed-0").symlink_to(victim, target_is_directory=True)
    monkeypatch.setattr(circuitstat.pipelines.zoo, "recipe_dir", lambda name, *a, **k: root)
    with pytest.raises(InputError, match="symbolic link out of the zoo"):
        LOCAL.resolve("zoo:attn-only-2l/seed-0")


# ---- item 8: bare model names resolve against the spec ------------------------------------------------
def test_a_bare_model_name_never_resolves_against_the_current_directory(tmp_path, monkeypatch):
    from circuitstat.circuits.model import CircuitModel, ModelConfig
    from circuitstat.pipelines.sources import LOCAL

    cwd = tmp_path / "cwd"
    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_head=8, d_mlp=32, vocab_size=50, n_ctx=16)
    CircuitModel(cfg).init_weights(1).save(cwd / "victim_model")
    CircuitModel(cfg).init_weights(1).save(cwd / "org" / "victim")
    monkeypatch.chdir(cwd)
    base = {"task": {"name": "induction", "n": 8}, "methods": ["eap"], "k": [2]}
    with pytest.raises(InputError, match="names nothing in the spec's directory"):
        load_spec(_yaml(tmp_path / "specs" / "a.yaml", {"model": "victim_model", **base}))
    spec = load_spec(_yaml(tmp_path / "specs" / "b.yaml", {"model": "org/victim", **base}))
    assert spec.model == "hf:org/victim"  # a hub id: the Hugging Face cache only
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(InputError, match="not in the local Hugging Face cache"):
        LOCAL.load(spec.model)
    CircuitModel(cfg).init_weights(2).save(tmp_path / "specs" / "victim_model")
    spec = load_spec(_yaml(tmp_path / "specs" / "a.yaml", {"model": "victim_model", **base}))
    assert Path(spec.model) == tmp_path / "specs" / "victim_model"  # the spec's own directory


@pytest.mark.parametrize("task_file", ["prompts.jsonl"])
def test_a_task_file_resolves_against_the_spec_even_when_missing(tmp_path, monkeypatch, task_file):
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / task_file).write_text('{"clean": "a", "corrupted": "b", "answer": "c", "wrong_answer": "d"}\n')
    monkeypatch.chdir(tmp_path / "cwd")
    spec = load_spec(_yaml(tmp_path / "specs" / "s.yaml", {"model": "random:gpt2", "task": {"name": task_file}}))
    assert Path(spec.task.name) == tmp_path / "specs" / task_file


# ---- item 9: no value of a spec reached through a claims file is quoted --------------------------------
@pytest.mark.parametrize("spec", [
    {"model": f"random:{SECRET}", "task": {"name": "induction", "n": 8}},
    {"model": "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=32",
     "task": {"name": "induction", "n": 8, "options": {SECRET: 1}}},
    {"model": f"random:gpt2?{SECRET}=3", "task": {"name": "induction", "n": 8}},
    {"model": "zoo:attn-only-2l/../../../../victim", "task": {"name": "induction", "n": 8}},
])
def test_errors_running_a_spec_from_outside_the_claims_tree_quote_nothing_of_it(tmp_path, spec):
    """A spec that --allow-outside let lie outside the claims file's tree keeps its values withheld when
    running its audit fails; the claims file's own spec (issue 38) has its reason shown."""
    _yaml(tmp_path / "outer" / "spec.yaml", {**spec, "methods": ["eap"], "k": [2], "faithfulness": False})
    claim = {"kind": "circuit_stability", "method": "eap", "k": 2, "statistic": "jaccard_mean", "min": 0.1}
    claims = _yaml(tmp_path / "inner" / "claims.yaml", {"spec": "../outer/spec.yaml", "run": "run", "claims": [claim]})
    res = runner.invoke(app, ["check", str(claims), "--allow-outside", "--run-audit"])
    assert res.exit_code == 2, res.output + res.stderr
    note, err = res.stderr.strip().splitlines()  # check says it runs the audit, then fails on one line
    assert note.startswith("running the audit of") and err.startswith("error: ") and "circuitstat audit" in err
    assert SECRET not in res.output + res.stderr and "victim" not in err
    assert not (tmp_path / "inner" / "run").exists()
    # the same spec beside the claims file: its own, so the reason is shown (no "not shown because ...")
    (tmp_path / "outer" / "spec.yaml").rename(tmp_path / "inner" / "spec.yaml")
    claims = _yaml(tmp_path / "inner" / "claims.yaml", {"spec": "spec.yaml", "run": "run", "claims": [claim]})
    res = runner.invoke(app, ["check", str(claims), "--run-audit"])
    assert res.exit_code == 2, res.output + res.stderr
    note, err = res.stderr.strip().splitlines()
    assert err.startswith("error: running the audit of") and "not shown" not in err, err
    if "SECRET" in str(spec):
        assert SECRET in err  # the value the audit refused is named
    assert not (tmp_path / "inner" / "run").exists()


# ---- item 10: query ------------------------------------------------------------------------------------
@pytest.fixture
def run_dir(tmp_path) -> Path:
    with RunDir(tmp_path / "run", seed=1) as run:
        run.stage("a", lambda: {"a": matrix_to_table(np.ones((3, 2), np.float32))}, ["a"])
    return tmp_path / "run"


def test_a_table_linked_out_of_the_run_is_refused(tmp_path, run_dir):
    outside = tmp_path / "private"
    outside.mkdir()
    with RunDir(outside / "r", seed=2) as run:
        run.stage("s", lambda: {"secret": matrix_to_table(np.full((2, 2), 7.0, np.float32))}, ["secret"])
    (run_dir / "secret.parquet").symlink_to(outside / "r" / "secret.parquet")
    res = runner.invoke(app, ["query", "SELECT * FROM secret", str(run_dir)])
    _one_line_error(res, "secret.parquet", "symbolic link")
    (run_dir / "secret.parquet").unlink()
    (run_dir / "alias.parquet").symlink_to(run_dir / "a.parquet")  # a link inside the run is its own table
    assert query("SELECT count(*) AS n FROM alias", [run_dir]).column("n").to_pylist() == [3]


def test_a_fifo_named_like_a_table_is_refused_not_waited_on(run_dir):
    os.mkfifo(run_dir / "pipe.parquet")
    with pytest.raises(ValueError, match="not a regular file"):
        query("SELECT 1", [run_dir])


def test_query_time_memory_and_rows_are_capped(run_dir):
    from circuitstat.core.query import QueryLimits

    res = runner.invoke(app, ["query", "SELECT count(*) FROM range(100000000000)", str(run_dir), "--timeout", "1"])
    _one_line_error(res, "longer than its limit of 1 s")
    res = runner.invoke(app, ["query", "SELECT length(repeat('x', 4000000000)) AS n", str(run_dir)])
    _one_line_error(res, "memory limit")
    res = runner.invoke(app, ["query", "SELECT * FROM range(2000)", str(run_dir), "--max-rows", "1000"])
    _one_line_error(res, "more than 1,000 rows")
    assert query("SELECT count(*) AS n FROM range(1000)", [run_dir], limits=QueryLimits(max_rows=1)).num_rows == 1


def test_sql_cannot_lift_the_caps(run_dir):
    import duckdb

    from circuitstat.core.query import QueryLimits

    con = connect([run_dir], limits=QueryLimits(memory_bytes=64 * 2**20, threads=1))
    try:
        assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 1
        for sql in ("SET memory_limit = '100GB'", "RESET memory_limit", "SET threads = 64",
                    "SET enable_external_access = true", "SET temp_directory = '/tmp'"):
            with pytest.raises(duckdb.Error, match="locked"):
                con.execute(sql)
    finally:
        con.close()
