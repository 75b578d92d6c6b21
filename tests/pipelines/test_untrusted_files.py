"""Untrusted files (issue 14): confinement of paths read from files, refused resumes that change
nothing, errors that never echo a file reached through another file, YAML alias bombs, a
locked-down DuckDB, and file-system cases that are one-line errors (exit 2) writing nothing.

Every CLI case goes through the real app (``circuitstat.pipelines.cli.app``) and checks the exit code, a
single ``error:`` line without a traceback, and that the file system around the target is
unchanged (a snapshot of every entry's bytes and modification time before and after).
"""

from __future__ import annotations

import os
import sys
import tracemalloc
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from circuitstat.core.errors import InputError
from circuitstat.circuits.graph import ComponentGraph
from circuitstat.circuits.scores import ScoreMatrix
from circuitstat.pipelines.cli import app
from circuitstat.pipelines.claims import load_claims
from circuitstat.pipelines.spec import load_spec
from circuitstat.pipelines.yamlio import MAX_EXPANDED_NODES, read_yaml_strict
from circuitstat.core.query import connect
from circuitstat.core.rundir import RunDir, RunDirError, StageSpecChangedError
from circuitstat.core.schema import fill
from circuitstat.core.tables import read_table

SPEC = {"model": "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=16",
        "task": {"name": "induction", "n": 8}, "methods": ["exact"], "k": [5]}
STABILITY = {"kind": "circuit_stability", "method": "exact", "k": 5, "statistic": "jaccard_mean", "min": 0.5}
FAITHFULNESS = {"kind": "faithfulness", "method": "exact", "k": 5, "statistic": "f_ratio", "min": 0.5}
SECRET = "hunter2-s3cret"


# ---- helpers ------------------------------------------------------------------------------------
def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root` (root included): kind, bytes of files, modification time in ns."""
    out = {}
    for p in [root, *sorted(root.rglob("*"))]:
        st = p.lstat()
        if p.is_symlink():
            out[str(p.relative_to(root))] = ("link", os.readlink(p), st.st_mtime_ns)
        elif p.is_dir():
            out[str(p.relative_to(root))] = ("dir", None, st.st_mtime_ns)
        else:
            out[str(p.relative_to(root))] = ("file", p.read_bytes(), st.st_mtime_ns)
    return out


def invoke(*args) -> tuple[int, str]:
    """(exit code, output) of the real CLI; asserts it left through the error boundary."""
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    return r.exit_code, r.output


def assert_one_line_error(code: int, out: str, *needles: str) -> None:
    assert code == 2, out
    assert out.startswith("error: ") and len(out.strip().splitlines()) == 1, out
    for needle in needles:
        assert needle in out, (needle, out)


def write_yaml(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def stability_table(jaccard: float = 0.9) -> dict:
    return fill("stability_vs_k", {"method": ["exact"], "k": [5], "jaccard_mean": [jaccard]}, 1)


def make_run(path: Path, spec: dict | None = None) -> Path:
    """A finished run: an index stage with the spec's model as params, and a stability table."""
    spec = spec or SPEC
    with RunDir(path, spec=spec, seed=0) as run:
        run.stage("index", lambda: {"edges": fill("edges", {"index": [0], "name": ["input->logits"]}, 1)}, ["edges"],
                  params={"model": spec["model"]})
        run.stage("stability", lambda: {"stability_vs_k": stability_table()}, ["stability_vs_k"],
                  depends_on=["index"])
    return path


@pytest.fixture
def audit_like(monkeypatch):
    """circuitstat.pipelines.runs.audit.run.run_audit replaced by one that uses RunDir as the real audit does (index
    stage fingerprinted by the model, then the other stages), without loading a model."""
    calls = []

    def run_audit(spec, out, **kw):
        calls.append(Path(out))
        with RunDir(out, spec=spec.model_dump(), seed=spec.seed) as run:
            run.stage("index", lambda: {"edges": fill("edges", {"index": [0], "name": ["input->logits"]}, 1)}, ["edges"],
                      params={"model": spec.model})
            run.stage("stability", lambda: {"stability_vs_k": stability_table()}, ["stability_vs_k"],
                      depends_on=["index"])
            run.stage("faithfulness", lambda: {"faithfulness_vs_k": fill("faithfulness_vs_k", {"method": ["exact"], "k": [5], "f_ratio": [0.9]}, 1)},
                      ["faithfulness_vs_k"], depends_on=["index"])
        return Path(out)

    monkeypatch.setattr("circuitstat.pipelines.runs.audit.run.run_audit", run_audit)
    return calls


# ---- 1. confinement of paths read from a claims file ----------------------------------------------
@pytest.mark.parametrize("key, value, needle", [
    ("run", "../victim", "leads outside"),
    ("run", "sub/../../victim", "leads outside"),
    ("run", "ABSOLUTE", "absolute path"),
    ("run", "~/victim", "absolute path"),
    ("spec", "../spec.yaml", "leads outside"),
    ("spec", "ABSOLUTE", "absolute path"),
])
def test_paths_in_a_claims_file_may_not_leave_its_tree(tmp_path, audit_like, key, value, needle):
    (tmp_path / "victim").mkdir()
    write_yaml(tmp_path / "spec.yaml", SPEC)
    value = str(tmp_path / ("victim" if key == "run" else "spec.yaml")) if value == "ABSOLUTE" else value
    doc = {"spec": "spec.yaml", "run": "r", key: value, "claims": [STABILITY]}
    claims = write_yaml(tmp_path / "inner" / "claims.yaml", doc)
    (tmp_path / "inner" / "spec.yaml").write_text(yaml.safe_dump(SPEC))
    before = snapshot(tmp_path)
    code, out = invoke("check", claims)
    assert_one_line_error(code, out, f"'{key}:' in {claims}", needle, "--allow-outside")
    assert audit_like == [] and snapshot(tmp_path) == before


def test_a_symbolic_link_out_of_the_tree_is_refused(tmp_path, audit_like):
    victim = make_run(tmp_path / "victim")
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "r").symlink_to(victim)
    write_yaml(tmp_path / "inner" / "spec.yaml", SPEC)
    claims = write_yaml(tmp_path / "inner" / "claims.yaml", {"run": "r", "spec": "spec.yaml", "claims": [FAITHFULNESS]})
    before = snapshot(tmp_path)
    code, out = invoke("check", claims)
    assert_one_line_error(code, out, "leads outside", "symbolic link")
    assert audit_like == [] and snapshot(tmp_path) == before


def test_allow_outside_lets_the_file_name_a_run_elsewhere(tmp_path):
    make_run(tmp_path / "victim")
    claims = write_yaml(tmp_path / "inner" / "claims.yaml", {"run": "../victim", "claims": [STABILITY]})
    code, out = invoke("check", claims)
    assert code == 2 and "leads outside" in out
    code, out = invoke("check", claims, "--allow-outside")
    assert code == 0, out
    assert "1 claims: 1 hold" in out
    # a path inside the tree needs no flag, and --run on the command line is the user's own choice
    make_run(tmp_path / "inner" / "mine")
    assert invoke("check", write_yaml(tmp_path / "inner" / "c2.yaml", {"run": "mine", "claims": [STABILITY]}))[0] == 0
    assert invoke("check", claims, "--run", tmp_path / "victim")[0] == 2  # the file's own run: is still checked


# ---- 2. a refused resume changes nothing on disk --------------------------------------------------
def test_refused_resume_through_check_leaves_the_victim_run_unchanged(tmp_path, audit_like):
    victim = make_run(tmp_path / "runs" / "victim", spec={**SPEC, "model": "random:gpt2?n_layer=1&n_head=1"})
    write_yaml(tmp_path / "spec.yaml", SPEC)  # another model: the finished index stage differs
    claims = write_yaml(tmp_path / "claims.yaml", {"run": "runs/victim", "spec": "spec.yaml", "claims": [FAITHFULNESS]})
    before = snapshot(tmp_path)
    code, out = invoke("check", claims, "--run-audit")
    assert out.startswith("running the audit of")  # check's progress note, then the one-line error
    assert_one_line_error(code, out.split("\n", 1)[1], "stage 'index'", "already finished with a different spec")
    assert audit_like == [victim]  # the audit was asked to resume, and refused
    assert snapshot(tmp_path) == before  # manifest.json (bytes and mtime), tables, no lock, directory mtime


def test_refusals_on_open_and_by_a_stage_write_nothing(tmp_path):
    run = make_run(tmp_path / "r")
    before = snapshot(tmp_path)
    with pytest.raises(StageSpecChangedError):
        with RunDir(run, spec={"other": True}) as rd:
            rd.stage("index", lambda: {"edges": fill("edges", {"index": [1]}, 1)}, ["edges"], params={"model": "other"})
    assert snapshot(tmp_path) == before
    with pytest.raises(RunDirError, match="same seed"):
        RunDir(run, spec={"other": True}, seed=1).open()
    assert snapshot(tmp_path) == before
    # a new directory refused by a stage is removed again, with the parents open() made for it
    with pytest.raises(RuntimeError, match="boom"):
        with RunDir(tmp_path / "new" / "deeper", spec={}) as rd:
            raise RuntimeError("boom")
    assert snapshot(tmp_path) == before
    # the same run, accepted, does write its manifest
    with RunDir(run, spec=SPEC, seed=0):
        pass
    assert snapshot(tmp_path)["r/manifest.json"] != before["r/manifest.json"]


def test_run_dir_that_is_a_file_or_under_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("keep me")
    before = snapshot(tmp_path)
    for target, needle in [(tmp_path / "f", "is a file, not a directory"), (tmp_path / "f" / "sub", "cannot be created")]:
        with pytest.raises(RunDirError, match=needle):
            RunDir(target).open()
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_run_and_output_directories_are_refused(tmp_path):
    run = make_run(tmp_path / "r")
    os.chmod(run, 0o555)
    os.chmod(tmp_path, 0o555)
    try:
        before = snapshot(tmp_path)
        with pytest.raises(RunDirError, match="run directory .* is not writable"):
            RunDir(run).open()
        with pytest.raises(RunDirError, match="is not writable"):
            RunDir(tmp_path / "new").open()
        assert snapshot(tmp_path) == before
    finally:
        os.chmod(tmp_path, 0o755)
        os.chmod(run, 0o755)


def test_attribute_out_naming_a_file_is_exit_2(tmp_path):
    (tmp_path / "f").write_text("keep me")
    before = snapshot(tmp_path)
    code, out = invoke("attribute", "--model", SPEC["model"], "--out", tmp_path / "f")
    assert_one_line_error(code, out, "is a file")
    assert snapshot(tmp_path) == before


# ---- 3. a file reached through another file's path is never echoed -------------------------------
@pytest.mark.parametrize("text", [
    f"root:*:19000:0:99999:7:::\nadmin: {SECRET}\n",  # shadow-like: one key is a whole line
    f"password: {SECRET}\nmodel: x\n",  # key: value
    f"model: x\n{SECRET}_key: [1, 2\n",  # invalid YAML near the secret
    f"model: x\ntask: {{name: induction, options: {{{SECRET}: 1}}, n: {SECRET}}}\n",  # nested key and value
    f"model: x\nmethods: [exact, {SECRET}]\n",  # a bad value
    f"model: x\nseed: 2024-13-01\nx: {SECRET}\n",  # a value YAML cannot construct
    f"- {SECRET}\n- root:x:0:0\n",  # not a mapping
])
def test_a_spec_named_by_a_claims_file_is_never_quoted(tmp_path, text):
    (tmp_path / "target").write_text(text)
    claims = write_yaml(tmp_path / "claims.yaml", {"spec": "target", "run": "r", "claims": [STABILITY]})
    code, out = invoke("check", claims)
    assert_one_line_error(code, out, "the spec named by 'spec:'")
    message = out.replace(str(tmp_path), "")
    for leaked in (SECRET, "root", "password", "admin", "2024-13-01"):
        assert leaked not in message, out


def test_unknown_keys_are_given_by_position_and_schema_paths_kept(tmp_path):
    (tmp_path / "spec.yaml").write_text(f"model: x\n{SECRET}: 1\ntask: {{name: induction, bogus_{SECRET}: 2}}\n")
    claims = write_yaml(tmp_path / "claims.yaml", {"spec": "spec.yaml", "claims": [STABILITY]})
    code, out = invoke("check", claims)
    assert_one_line_error(code, out, "key #2: unknown key", "task.key #2: unknown key")
    assert SECRET not in out


def test_system_file_as_spec_with_allow_outside_prints_none_of_it(tmp_path):
    # a password-file stand-in outside the claims file's tree (the real /etc/passwd varies by machine)
    system = tmp_path / "etc" / "passwd"
    system.parent.mkdir()
    system.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
                      "backupuser:x:34:34:backup:/var/backups:/usr/sbin/nologin\n")
    work = tmp_path / "work"
    work.mkdir()
    claims = write_yaml(work / "claims.yaml", {"spec": str(system), "run": "r", "claims": [STABILITY]})
    code, out = invoke("check", claims, "--allow-outside")
    assert_one_line_error(code, out, str(system))
    words = {w for line in system.read_text().splitlines() for w in line.replace(":", " ").split() if len(w) > 3}
    message = out.replace(str(system), "").replace(str(tmp_path), "")
    assert not [w for w in words if w in message], message
    assert not (work / "r").exists()


# ---- 4. YAML alias bombs ---------------------------------------------------------------------------
def billion_laughs(levels: int = 9, width: int = 9) -> str:
    """A ~0.6 KB document that expands to width**levels (387 million) strings."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def merge_bomb(levels: int = 30) -> str:
    """Merge keys that double a mapping's entries at every level (2**30 entries once flattened)."""
    lines = ["m0: &m0 {a: 1}"]
    for i in range(1, levels):
        lines.append(f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}]}}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", ["claims top level", "claims value", "spec task.options", "merge keys"])
def test_alias_bombs_are_refused_while_loading(tmp_path, where):
    if where == "claims top level":
        text = billion_laughs() + "claims: [*l8]\n"
    elif where == "claims value":
        text = billion_laughs() + "claims: [{kind: circuit_stability, name: *l8}]\n"
    elif where == "merge keys":
        text = merge_bomb() + "claims: [*m29]\n"
    else:
        text = "model: x\ntask:\n  name: induction\n  options:\n" + "".join(
            "    " + line + "\n" for line in billion_laughs().splitlines())
    assert len(text) < 2000
    p = tmp_path / "file.yaml"
    p.write_text(text)
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as e:
            (load_spec if where.startswith("spec") else load_claims)(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"more than {MAX_EXPANDED_NODES:,} values once its YAML aliases" in str(e.value)
    assert peak < 50e6  # the expansion (hundreds of millions of values) was never built
    if where.startswith("spec"):
        claims = write_yaml(tmp_path / "claims.yaml", {"spec": "file.yaml", "claims": [STABILITY]})
    else:
        claims = p
    code, out = invoke("check", claims)
    assert_one_line_error(code, out, "YAML aliases")


def test_ordinary_aliases_and_self_reference(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("base: &b {kind: circuit_stability, method: exact, statistic: jaccard_mean}\n"
                 "x: &x [1, 2]\ny: [*x, *x, *x]\n")
    assert read_yaml_strict(p)["y"] == [[1, 2]] * 3
    p.write_text("a: &x {b: [1, *x]}\n")
    with pytest.raises(InputError, match="refers to itself"):
        read_yaml_strict(p)
    p.write_text("a: " + "[" * 250 + "]" * 250 + "\n")
    with pytest.raises(InputError, match="nested"):
        read_yaml_strict(p)


# ---- 5. query: DuckDB reads the run's tables and nothing else ----------------------------------
@pytest.fixture
def query_run(tmp_path):
    return make_run(tmp_path / "run")


@pytest.mark.parametrize("sql, needle", [
    ("COPY (SELECT 1) TO 'OUT/leak.csv'", "COPY"),
    ("COPY (SELECT 42 AS x) TO 'RUN/stability_vs_k.parquet' (FORMAT parquet, USE_TMP_FILE false)", "COPY"),
    ("SELECT * FROM read_text('/etc/passwd')", "disabled"),
    ("SELECT * FROM read_csv('/etc/passwd')", "disabled"),
    ("INSTALL httpfs", "LOAD"),
    ("ATTACH 'OUT/x.db' AS x", "ATTACH"),
    ("SET enable_external_access = true", "SET"),
    ("SELECT 1; COPY (SELECT 1) TO 'OUT/leak.csv'", "SELECT, COPY"),
    ("CALL pragma_version()", "CALL"),
])
def test_query_cannot_read_write_or_reconfigure(tmp_path, query_run, sql, needle):
    sql = sql.replace("OUT", str(tmp_path)).replace("RUN", str(query_run))
    before = snapshot(tmp_path)
    code, out = invoke("query", sql, query_run)
    assert_one_line_error(code, out, needle)
    assert "root:" not in out
    assert snapshot(tmp_path) == before


def test_query_selects_over_the_views_still_work(query_run):
    code, out = invoke("query", "SELECT method, k, jaccard_mean FROM stability_vs_k", query_run, "--format", "csv")
    assert code == 0, out
    assert out.splitlines()[1].split(",")[:2] == ['"exact"', "5"]
    # the lock-down holds on the connection itself, whatever SQL reaches it
    con = connect([query_run])
    try:
        assert con.sql("SELECT count(*) FROM edges").fetchall() == [(1,)]
        for sql in ("SELECT * FROM read_text('/etc/passwd')", "SET enable_external_access = true",
                    "SET lock_configuration = false"):
            with pytest.raises(Exception, match="disabled|locked"):
                con.sql(sql).fetchall()
    finally:
        con.close()


# ---- 6. other file cases ---------------------------------------------------------------------------
def scores_run(path: Path) -> Path:
    g = ComponentGraph(1, 2)
    rng = np.random.default_rng(0)
    sm = ScoreMatrix(rng.standard_normal((4, g.n_edges)).astype(np.float32), g, "edge", "eap", "counterfactual",
                     "logit_diff", provenance={"model": {"d_model": 16}})
    sm.write(path)
    return path


def test_circuit_json_naming_a_directory_is_exit_2(tmp_path):
    run = scores_run(tmp_path / "run")
    (tmp_path / "dir").mkdir()
    before = snapshot(tmp_path)
    for target in (tmp_path / "dir", tmp_path / "run" / "scores.parquet" / "x.json"):
        code, out = invoke("circuit", run, "--k", 3, "--json", target)
        assert code == 2 and out.strip().splitlines()[-1].startswith("error: "), out
        assert "Traceback" not in out
    assert snapshot(tmp_path) == before
    code, out = invoke("circuit", run, "--k", 3, "--json", tmp_path / "c.json")
    assert code == 0 and (tmp_path / "c.json").is_file()


def _trusted_circuit(run: Path) -> tuple[int, str]:
    """`circuit RUN --k 1 --trust-unrecorded`: (exit code, output after the warning naming the unchecked table)."""
    code, out = invoke("circuit", run, "--k", 1, "--trust-unrecorded")
    warning, _, rest = out.partition("\n")
    assert warning.startswith("warning: ") and "read unchecked (--trust-unrecorded" in warning and "scores.parquet" in warning
    return code, rest


def test_scores_parquet_of_the_wrong_schema(tmp_path):
    run = tmp_path / "run"
    run.mkdir()  # tables made by hand (no manifest): read with --trust-unrecorded
    pq.write_table(pa.table({"edge": [1, 2], "value": [0.1, 0.2]}), run / "scores.parquet")
    code, out = _trusted_circuit(run)
    assert_one_line_error(code, out, "is not a circuitstat scores table (missing column 'example')")
    (run / "scores.parquet").write_bytes(b"PAR1 not really")
    code, out = _trusted_circuit(run)
    assert_one_line_error(code, out, "is not a readable Parquet table")
    # a real scores table whose provenance claims a huge graph: refused before the graph is built
    scores_run(tmp_path / "good")
    t = read_table(tmp_path / "good" / "scores.parquet")
    meta = dict(t.schema.metadata)
    key = next(k for k in meta if b"provenance" in k)
    meta[key] = meta[key].replace(b'"n_layers": 1', b'"n_layers": 1000000000')
    assert meta[key] != dict(t.schema.metadata)[key]
    pq.write_table(t.replace_schema_metadata(meta), run / "scores.parquet")
    code, out = _trusted_circuit(run)
    assert_one_line_error(code, out, "more components than the matrix has columns")


def test_report_out_as_a_directory_or_a_file(tmp_path):
    run = make_run(tmp_path / "run")
    code, out = invoke("report", run, "--out", f"{tmp_path / 'newdir' / 'sub'}/")  # two new levels: not made
    assert_one_line_error(code, out, "does not exist; create it first")
    assert not (tmp_path / "newdir").exists()
    code, out = invoke("report", run, "--out", f"{tmp_path / 'newdir'}/")  # one new directory, as --out names it
    assert code == 0, out
    assert (tmp_path / "newdir" / "report.html").is_file()
    code, out = invoke("report", run, "--out", tmp_path / "named.html")
    assert code == 0 and (tmp_path / "named.html").is_file()
    (tmp_path / "plain").write_text("keep me")
    before = snapshot(tmp_path)
    code, out = invoke("report", run, "--out", tmp_path / "plain" / "sub")
    assert_one_line_error(code, out, "is a file, not a directory")
    code, out = invoke("report", run, "--out", tmp_path / "plain")  # a file of the user's, not a report
    assert_one_line_error(code, out, "is not an .html file")
    assert snapshot(tmp_path) == before
    code, out = invoke("report", run, "--out", tmp_path / "named.html")  # replacing a report is fine
    assert code == 0, out


def test_check_plan_makes_a_resume_all_or_nothing(tmp_path):
    """A spec that adds a stage (a new method) and changes a later finished one: without the plan
    the new stage would run and write before the refusal; with it nothing is written."""
    run = make_run(tmp_path / "r")
    before = snapshot(tmp_path)
    plan = [("index", {"model": SPEC["model"]}, ["edges"], []),
            ("scores_eap", {"method": "eap"}, ["scores_eap"], ["index"]),
            ("stability", None, ["stability_vs_k"], ["index", "scores_eap"])]  # now depends on the new stage
    with pytest.raises(StageSpecChangedError, match="stage 'stability'.*upstream stages"):
        with RunDir(run, spec={**SPEC, "methods": ["exact", "eap"]}) as rd:
            rd.check_plan(plan)
            rd.stage("scores_eap", lambda: {"scores_eap": {"x": [1]}}, ["scores_eap"], params={"method": "eap"},
                     depends_on=["index"])
    assert snapshot(tmp_path) == before
    # the unchanged plan passes, and its fingerprints are the ones stage() records
    with RunDir(run, spec=SPEC) as rd:
        rd.check_plan(plan[:1] + [("stability", None, ["stability_vs_k"], ["index"])])
        assert rd.stage("stability", lambda: None, ["stability_vs_k"], depends_on=["index"])  # done: not rerun
