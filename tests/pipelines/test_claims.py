"""Claims checks against synthetic run directories, the JUnit output, and the query command."""

from __future__ import annotations

import json
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from circuitstat.core.errors import InputError
from circuitstat.pipelines.claims import (
    CLAIM_KINDS,
    TOKEN_KINDS,
    check,
    evaluate_claims,
    junit_xml,
    load_claims,
    parse_claims,
    read_yaml_strict,
)
from circuitstat.pipelines.cli import app as APP
from builders import EDGES, audit_tables, make_run  # noqa: F401 - the shared run builder (tests/builders.py)

from circuitstat.core.tables import write_table

REPO = Path(__file__).resolve().parents[2]
PASSING = {
    "claims": [
        {"kind": "edge_in_circuit", "name": "induction-k-composition", "edge": "a0.h3 -> a1.h5<k>", "method": "exact",
         "k": 20, "min_inclusion": 0.9, "description": "a0.h3 -> a1.h5<k> is in the top-20 circuit in >= 90% of resamples"},
        {"kind": "circuit_stability", "method": "exact", "k": 20, "statistic": "jaccard_mean", "min": 0.8},
        {"kind": "circuit_stability", "method": "eap", "k": 10, "statistic": "phi_data_ci_low", "min": 0.6, "max": 1.0},
        {"kind": "faithfulness", "method": "exact", "k": 20, "statistic": "f_ci_low", "min": 0.7},
        {"kind": "faithfulness", "method": "eap", "statistic": "cmd", "max": 0.5},
        {"kind": "edge_effect", "edge": "a0.h3->a1.h5<k>", "method": "exact", "sign": "positive", "max_q": 0.05},
        {"kind": "edge_effect", "edge": "input->a1.h5<k>", "method": "eap", "sign": "negative", "max_q": 0.05},
        {"kind": "head_stability", "head": "1.5", "statistic": "stability", "min": 0.8},
        {"kind": "head_stability", "layer": 1, "head": 5, "statistic": "ci_low", "min": 0.85, "match": "max"},
        {"kind": "layer_stability", "layer": 1, "statistic": "stability", "max": 0.6},
        {"kind": "approximation", "method": "eap", "statistic": "spearman", "min": 0.8},
        {"kind": "approximation", "method": "eap", "statistic": "top_k_overlap", "k": 20, "min": 0.6},
        {"kind": "verified_edge", "edge": "a0.h3->a1.h5<k>", "method": "eap", "statistic": "ci_low", "min": 0.5},
        {"kind": "missed_edges", "method": "eap", "max": 1},
        {"kind": "published_circuit", "method": "eap", "statistic": "f_ci_low", "min": 0.6},
        {"kind": "published_edge", "edge": "a0.h3->a1.h5<k>", "method": "exact", "statistic": "q", "max": 0.05},
        {"kind": "circuit_equivalent", "method": "exact"},
        {"kind": "circuit_equivalent_tost"},
        {"kind": "circuit_independent", "alpha": 0.1},
        {"kind": "circuit_minimal"},
        {"kind": "circuit_sufficient"},
        {"kind": "circuit_partially_necessary", "alpha": 0.05},
    ]
}




def _write(path: Path, doc) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return path


def _invoke(*args):
    r = CliRunner().invoke(APP, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    return r


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("runs") / "zoo", verified=True, published=True, circuit_tests=True)


def test_every_claim_kind_passes_exit_0_and_junit(run_dir, tmp_path):
    assert {c["kind"] for c in PASSING["claims"]} == set(CLAIM_KINDS) - set(TOKEN_KINDS)  # tokens runs: below
    claims = _write(tmp_path / "claims.yaml", PASSING)
    junit = tmp_path / "out" / "claims.xml"
    junit.parent.mkdir()  # an output file goes into an existing directory (core/outpath.py)
    r = _invoke("check", claims, "--run", run_dir, "--junit", junit)
    assert r.exit_code == 0, r.output
    assert f"{len(PASSING['claims'])} claims: {len(PASSING['claims'])} hold, 0 fail, 0 cannot be evaluated" in r.output
    assert "induction-k-composition" in r.output and "0.95" in r.output
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites" and root.get("tests") == "22" and root.get("failures") == "0" and root.get("errors") == "0"
    assert len(root.findall("./testsuite/testcase")) == len(PASSING["claims"]) == 22
    assert not root.findall(".//failure") and not root.findall(".//error")


def test_record_puts_one_verdict_line_per_claim_into_the_report(tmp_path):
    """Without --record a check writes nothing into the run; with it, claims.parquet and the report's verdict."""
    import html
    import shutil

    import pyarrow.parquet as pq

    run = make_run(tmp_path / "run")
    doc = {"claims": PASSING["claims"][:3]}
    r = _invoke("check", _write(tmp_path / "c.yaml", doc), "--run", run)
    assert r.exit_code == 0 and not (run / "claims.parquet").exists(), r.output
    r = _invoke("check", _write(tmp_path / "c.yaml", doc), "--run", run, "--record")
    assert r.exit_code == 0, r.output
    table = pq.read_table(run / "claims.parquet").to_pylist()
    assert [t["status"] for t in table] == ["pass"] * 3 and [t["name"] for t in table] == [
        c.get("name", t["name"]) for c, t in zip(doc["claims"], table)]
    page = (run / "report.html").read_text()
    for t in table:
        assert f'{html.escape(t["name"])}: <span class="quote"' in page and html.escape(t["reason"]) in page
    shutil.rmtree(run)


def test_false_claim_exits_1_with_readable_reason(run_dir, tmp_path):
    doc = {"run": str(run_dir), "claims": PASSING["claims"][:2] + [
        {"kind": "circuit_stability", "name": "published-jaccard", "method": "exact", "k": 5, "statistic": "jaccard_mean", "min": 0.8},
        {"kind": "edge_effect", "edge": "a0.h1->a1.h2<v>", "method": "exact", "sign": "positive", "max_q": 0.05},
        {"kind": "edge_in_circuit", "edge": "a0.h1->a1.h2<v>", "method": "eap", "k": 10, "min_inclusion": 0.5},
    ]}
    junit = tmp_path / "j.xml"
    r = _invoke("check", _write(tmp_path / "c.yaml", doc), "--junit", junit, "--allow-outside")
    assert r.exit_code == 1, r.output
    assert "jaccard_mean at k=5 for exact is 0.7 < 0.8" in r.output
    assert "not significant after BH" in r.output
    assert "(never selected) is 0 < 0.5" in r.output
    assert "FAIL" in r.output and "5 claims: 2 hold, 3 fail, 0 cannot be evaluated" in r.output
    root = ET.parse(junit).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("5", "3", "0")
    fails = root.findall(".//testcase/failure")
    assert len(fails) == 3 and "0.7 < 0.8" in fails[0].get("message")
    assert root.find(".//testcase[@name='published-jaccard']/failure") is not None


def test_edge_effect_on_an_unreliable_interval_is_refused(run_dir, tmp_path):
    """The q-value inverts the edge's interval; when a few prompts carry the estimate (no_tail_seen = false)
    the claim cannot be evaluated (exit 2), even though q = 0.004 would pass."""
    doc = {"claims": [PASSING["claims"][5],
                      {"kind": "edge_effect", "edge": "a1.h5->logits", "method": "exact", "sign": "positive",
                       "max_q": 0.05}]}
    r = _invoke("check", _write(tmp_path / "c.yaml", doc), "--run", run_dir)
    assert r.exit_code == 2, r.output
    assert "of a1.h5->logits (exact) in edge_stats (no_tail_seen = false)" in r.output and "--n" in r.output
    assert "2 claims: 1 hold, 0 fail, 1 cannot be evaluated" in r.output


def test_missing_k_exits_2_naming_the_fix(run_dir, tmp_path):
    doc = {"claims": [PASSING["claims"][1],
                      {"kind": "circuit_stability", "method": "exact", "k": 50, "statistic": "jaccard_mean", "min": 0.8}]}
    junit = tmp_path / "j.xml"
    r = _invoke("check", _write(tmp_path / "c.yaml", doc), "--run", run_dir, "--junit", junit)
    assert r.exit_code == 2, r.output
    assert "k=50 is not in the run's k grid [5, 10, 20]" in r.output and "add it to the spec's k" in r.output
    root = ET.parse(junit).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("2", "0", "1")


@pytest.mark.parametrize("claim, needle", [
    ({"kind": "circuit_stability", "method": "eap-ig-inputs", "k": 5, "statistic": "phi", "min": 0.5},
     "method 'eap-ig-inputs' is not in the run's stability_vs_k (methods: ['eap', 'exact']); add it to the spec's methods"),
    ({"kind": "edge_in_circuit", "edge": "a0.h3->a1.h5<q>", "method": "exact", "k": 5, "min_inclusion": 0.5},
     "did you mean a0.h3->a1.h5<k>"),
    ({"kind": "head_stability", "head": "3.1", "statistic": "stability", "min": 0.5}, "head a3.h1 is not in the run's heads table"),
    ({"kind": "approximation", "method": "eap", "statistic": "top_k_overlap", "min": 0.5}, "differs by k; give 'k' (one of [5, 10, 20])"),
])
def test_claims_the_run_cannot_answer_are_errors(run_dir, claim, needle):
    (res,) = evaluate_claims(parse_claims({"claims": [claim]}), run_dir)
    assert res.status == "error" and needle in res.reason, res.reason


def test_missing_tables_name_what_the_audit_must_include(tmp_path):
    run = make_run(tmp_path / "r", manifest=False, heads=False, faithfulness=False, methods=("eap",))
    cf = parse_claims({"claims": [
        {"kind": "head_stability", "head": "1.5", "statistic": "stability", "min": 0.8},
        {"kind": "faithfulness", "method": "eap", "k": 5, "statistic": "f_ratio", "min": 0.8},
        {"kind": "approximation", "method": "eap", "statistic": "r2", "min": 0.5},
        {"kind": "circuit_stability", "method": "eap", "k": 5, "statistic": "jaccard_mean", "min": 0.5},
    ]})
    res = evaluate_claims(cf, run, trust_unrecorded=True)  # tables made by hand, no manifest
    assert [r.status for r in res] == ["error", "error", "error", "pass"]
    assert "list two or more models under 'models:'" in res[0].reason
    assert "set 'faithfulness: true' in the spec" in res[1].reason
    assert "needs 'exact' and the approximate method" in res[2].reason
    assert all(r.missing for r in res[:3])


def test_nan_statistic_is_an_error_not_a_pass(tmp_path):
    t = audit_tables()
    t["stability_vs_k"]["phi"] = [float("nan")] * len(t["stability_vs_k"]["phi"])
    (tmp_path / "r").mkdir()
    for name, tab in t.items():
        write_table(tab, tmp_path / "r" / f"{name}.parquet")
    (res,) = evaluate_claims(parse_claims({"claims": [
        {"kind": "circuit_stability", "method": "exact", "k": 5, "statistic": "phi", "min": 0.0}]}), tmp_path / "r",
        trust_unrecorded=True)  # tables made by hand, no manifest
    assert res.status == "error" and "NaN" in res.reason


def test_run_relative_to_claims_file_and_no_run_is_exit_2(run_dir, tmp_path):
    d = tmp_path / "sub"
    d.mkdir()
    make_run(d / "myrun")
    r = _invoke("check", _write(d / "c.yaml", {"run": "myrun", "claims": PASSING["claims"][:3]}))
    assert r.exit_code == 0, r.output
    r = _invoke("check", _write(tmp_path / "c.yaml", {"claims": PASSING["claims"][:1]}))
    assert r.exit_code == 2 and "no run to check: pass --run DIR" in r.output
    r = _invoke("check", _write(tmp_path / "c.yaml", {"run": "nope", "claims": PASSING["claims"][:1]}))
    assert r.exit_code == 2 and "does not exist" in r.output and "give 'spec:'" in r.output
    assert not (tmp_path / "nope").exists()


SPEC = {"model": "random:gpt2?n_layer=2&n_head=4&n_embd=64&vocab_size=512&n_positions=64",
        "task": {"name": "induction", "n": 32}, "methods": ["exact", "eap"], "k": [5, 10, 20]}


@pytest.fixture
def fake_audit(monkeypatch):
    """Install a stand-in circuitstat.pipelines.runs.audit.run whose run_audit writes a synthetic run."""
    calls = []

    def run_audit(spec, out, *, n_jobs=None, scheduler=None):
        calls.append((spec, Path(out)))
        make_run(Path(out), heads=False)
        return Path(out)

    monkeypatch.setattr("circuitstat.pipelines.runs.audit.run.run_audit", run_audit)
    return calls


def test_runs_the_audit_when_the_run_is_missing_only_with_run_audit(tmp_path, fake_audit):
    _write(tmp_path / "audit.yaml", SPEC)
    doc = {"spec": "audit.yaml", "run": "runs/zoo", "claims": PASSING["claims"][:4]}
    r = _invoke("check", _write(tmp_path / "c.yaml", doc))  # issue 38: a typo'd run must not start an audit
    assert r.exit_code == 2 and "runs/zoo does not exist" in r.output and "--run-audit" in r.output, r.output
    assert fake_audit == [] and not (tmp_path / "runs").exists()
    r = _invoke("check", tmp_path / "c.yaml", "--run-audit")
    assert r.exit_code == 0, r.output
    assert len(fake_audit) == 1 and fake_audit[0][1] == tmp_path / "runs" / "zoo" and fake_audit[0][0].k == [5, 10, 20]
    # The second check finds the finished run and runs nothing.
    r = _invoke("check", tmp_path / "c.yaml")
    assert r.exit_code == 0 and len(fake_audit) == 1


def test_default_run_dir_is_content_addressed_in_the_cache(tmp_path, fake_audit, monkeypatch):
    monkeypatch.setenv("CIRCUITSTAT_CACHE", str(tmp_path / "cache"))
    _write(tmp_path / "audit.yaml", SPEC)
    claims = _write(tmp_path / "c.yaml", {"spec": "audit.yaml", "claims": PASSING["claims"][1:2]})
    with pytest.raises(InputError, match="--run-audit"):
        check(claims)
    assert fake_audit == [] and not (tmp_path / "cache").exists()
    rep = check(claims, run_audit=True)
    assert rep.exit_code == 0 and rep.ran_audit
    assert not check(claims).ran_audit  # the finished run in the cache is read
    assert rep.run_dir.parent == tmp_path / "cache" / "runs" and rep.run_dir.name.startswith("audit-")


def test_spec_that_cannot_answer_a_claim_fails_before_the_audit(tmp_path, fake_audit):
    _write(tmp_path / "audit.yaml", {**SPEC, "k": [5, 10]})
    doc = {"spec": "audit.yaml", "run": "runs/zoo", "claims": PASSING["claims"][1:2] + PASSING["claims"][7:8]}
    r = _invoke("check", _write(tmp_path / "c.yaml", doc), "--run-audit")
    assert r.exit_code == 2, r.output
    assert "k=20 is not in the spec's k [5, 10]; add it to the spec's k" in r.output
    assert "list two or more models under 'models:' in the spec" in r.output
    assert fake_audit == [] and not (tmp_path / "runs").exists()
    # A malformed spec is a one-line error, exit 2, nothing created.
    (tmp_path / "audit.yaml").write_text("model: x\nmethods: [exact, magic]\n")
    r = _invoke("check", tmp_path / "c.yaml", "--run-audit")
    assert r.exit_code == 2 and "methods.1: must be" in r.output and "the spec named by 'spec:'" in r.output
    assert fake_audit == [] and not (tmp_path / "runs").exists()


def test_incomplete_run_is_resumed_when_a_spec_is_given(tmp_path, fake_audit):
    _write(tmp_path / "audit.yaml", SPEC)
    run = make_run(tmp_path / "r", faithfulness=False, heads=False)
    doc = {"spec": "audit.yaml", "run": "r", "claims": PASSING["claims"][3:4]}
    r = _invoke("check", _write(tmp_path / "c.yaml", doc))  # without --run-audit: read only, the claim is missing
    assert r.exit_code == 2 and "pass --run-audit" in r.output and fake_audit == [], r.output
    r = _invoke("check", tmp_path / "c.yaml", "--run-audit")
    assert r.exit_code == 0, r.output
    assert len(fake_audit) == 1 and fake_audit[0][1] == run
    # A stage left 'running' by a killed audit also makes check resume the run.
    m = json.loads((run / "manifest.json").read_text())
    m["stages"]["approximation"] = {"status": "running"}
    (run / "manifest.json").write_text(json.dumps(m))
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    for args in ([tmp_path / "c.yaml"], [_write(tmp_path / "c2.yaml", {"run": "r", "claims": doc["claims"]})]):
        r = _invoke("check", *args)  # an unfinished run is not read, with or without a spec, and nothing is written
        assert r.exit_code == 2 and "unfinished: stage(s) approximation did not finish" in r.output, r.output
        assert len(fake_audit) == 1 and {p.name: p.read_bytes() for p in run.iterdir()} == before
    r = _invoke("check", tmp_path / "c.yaml", "--run-audit")
    assert r.exit_code == 0 and len(fake_audit) == 2


def test_file_level_errors_name_the_key(tmp_path):
    cases = [
        ("claims: [{kind: circuit_stability, method: exact, k: 20, statistic: jacard, min: 0.8}]",
         "claims[0].statistic: must be 'jaccard_mean'"),
        ("claims: [{kind: circuit_stabilty}]",
         "unknown kind 'circuit_stabilty'; did you mean 'circuit_stability'? kinds: edge_in_circuit"),
        ("claims: [{kind: faithfulness, method: exact, k: 20, statistic: f_ratio, min: 0.8, minimum: 1}]",
         "claims[0].minimum: unknown key; did you mean 'min'? allowed keys: kind, name"),
        ("claims: [{kind: circuit_stability, method: exact, k: true, statistic: phi, min: 0.8}]", "claims[0].k: must be a valid integer"),
        ("claims: [{kind: head_stability, head: 1.5, statistic: stability, min: 0.8}]", 'head: "1.5" (quoted)'),
        ("claims: [{kind: edge_effect, edge: x, method: eap, sign: up, max_q: 0.05}]", "sign: must be 'positive', 'negative' or 'nonzero'"),
        ("claims: [{kind: edge_in_circuit, edge: x, method: eap, k: 5, min_inclusion: 1.5}]", "min_inclusion: Input should be less than or equal to 1"),
        ("claims: [{kind: layer_stability, layer: 0, statistic: stability}]", "give a bound: 'min' and/or 'max'"),
        ("claims: []", "list at least one claim"),
        ("- a\n- b", "the top level is a list"),
        ("", "the top level is empty"),
        ("claims: [a\n", "is not valid YAML"),
        ("claims: []\nclaims: []\n", "found duplicate key 'claims'"),
        ("run: 2024-13-01\nclaims: []", "quote it as a string"),
        ("claims: &a [*a]", "refers to itself"),
        ("[" * 5000, "maximum nesting depth"),
    ]
    for text, needle in cases:
        p = tmp_path / "c.yaml"
        p.write_text(text)
        with pytest.raises(InputError) as e:
            load_claims(p)
        assert needle in str(e.value), (text, str(e.value))
        r = _invoke("check", p, "--run", tmp_path, "--junit", tmp_path / "j.xml")
        assert r.exit_code == 2 and r.output.startswith("error: ") and len(r.output.strip().splitlines()) == 1, r.output
        assert not (tmp_path / "j.xml").exists()
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00claims")
    with pytest.raises(InputError, match="not UTF-8"):
        read_yaml_strict(tmp_path / "bin.yaml")
    with pytest.raises(InputError, match="not found"):
        load_claims(tmp_path / "missing.yaml")


def test_junit_is_well_formed_with_hostile_text(run_dir):
    cf = parse_claims({"claims": [{"kind": "circuit_stability", "name": "<&\"'\x01\x1b]0;x\x07>", "method": "exact",
                                   "k": 5, "statistic": "jaccard_mean", "min": 0.9, "description": "]]> <![CDATA["}]})
    res = evaluate_claims(cf, run_dir)
    root = ET.fromstring(junit_xml(res))
    assert root.get("failures") == "1" and root.find(".//failure").get("message").startswith("jaccard_mean")


def test_the_registry_declares_each_kind_and_its_tables_once():
    """Every kind is one registry entry carrying its model, evaluator, requirement and hint; the claims file's union,
    the evaluation, the preflight and the reader's hints are all read from it."""
    import typing

    import circuitstat.pipelines.runs.heads.stability
    import circuitstat.stats as stats
    from circuitstat.core.schema import schema_for
    from circuitstat.pipelines.claims import KINDS
    from circuitstat.pipelines.claims.claimsfile import KIND_MODELS
    from circuitstat.pipelines.claims.kinds import TABLE_HINTS, ClaimKind

    assert tuple(KIND_MODELS) == CLAIM_KINDS == tuple(KINDS)
    assert TOKEN_KINDS == ("sink", "token_importance", "token_drop", "sink_stability", "token_stability")
    assert len({k.model for k in KINDS.values()}) == len(KINDS)  # one model per kind
    for kind, entry in KINDS.items():
        assert entry.name == kind and KIND_MODELS[kind] is entry.model
        assert all(schema_for(t) is not None for t in entry.tables), kind  # its tables are registered run tables
        assert set(entry.tables) <= set(TABLE_HINTS), kind  # a run lacking one gets the kind's fix
        assert callable(entry.evaluate) and callable(entry.requires)
        if "statistic" in entry.model.model_fields:
            assert typing.get_args(entry.model.model_fields["statistic"].annotation) == entry.statistics, kind
    # claims and estimators never share a class name (HeadStabilityClaim is about circuitstat.pipelines.runs.heads.stability.HeadStability)
    estimators = {n for mod in (stats, circuitstat.pipelines.runs.heads.stability) for n in dir(mod) if n[:1].isupper()}
    assert not {m.__name__ for m in KIND_MODELS.values()} & estimators and "HeadStability" in estimators
    # a claim reads the table its kind declares
    claim = parse_claims({"claims": [PASSING["claims"][1]]}).claims[0]
    assert claim.table == KINDS["circuit_stability"].table == "stability_vs_k"
    # the k grid an audit needs holds the claims' circuit sizes, not approximation's top_k_overlap k
    from circuitstat.pipelines.claims import claim_sizes

    sized = parse_claims({"claims": [PASSING["claims"][0], {**PASSING["claims"][11], "k": 30}, {**PASSING["claims"][1], "k": 7}]})
    assert [c.kind for c in sized.claims] == ["edge_in_circuit", "approximation", "circuit_stability"]
    assert claim_sizes(sized) == [7, 20] and sized.claims[1].k == 30 and not KINDS["approximation"].k_is_circuit_size
    # an entry whose hints do not match its tables is refused where it is declared
    with pytest.raises(ValueError, match="2 hints for 1 tables"):
        ClaimKind(KINDS["faithfulness"].model, KINDS["faithfulness"].evaluate, KINDS["faithfulness"].requires, ("a", "b"))


def test_example_files_are_the_demo_spec_and_the_claims_fit_it():
    from circuitstat.pipelines.claims import spec_problem
    from circuitstat.pipelines.demo import demo_spec
    from circuitstat.pipelines.spec import load_spec

    cf = load_claims(REPO / "examples" / "claims-zoo.yaml")
    spec = load_spec(cf.spec_path())
    # `circuitstat check examples/claims-zoo.yaml --run runs/demo` checks the run `make demo` wrote
    assert spec.model_dump() == demo_spec().model_dump()
    assert [spec_problem(c, spec) for c in cf.claims] == [None] * len(cf.claims)
    kinds = {c.kind for c in cf.claims}
    assert {"edge_in_circuit", "circuit_stability", "faithfulness", "approximation", "head_stability"} <= kinds


# ---- query ---------------------------------------------------------------------------------
def test_query_command_formats_and_errors(run_dir, tmp_path):
    other = make_run(tmp_path / "other", methods=("exact",))
    sql = "SELECT method, k, jaccard_mean FROM stability_vs_k WHERE k = 20 ORDER BY run, method"
    r = _invoke("query", sql, run_dir, other)
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert lines[0].split() == ["method", "k", "jaccard_mean"] and len(lines) == 2 + 3
    r = _invoke("query", sql, run_dir, "--format", "csv")
    assert r.exit_code == 0 and r.output.splitlines()[0] == '"method","k","jaccard_mean"'
    r = _invoke("query", "SELECT name, q FROM edge_stats WHERE method = 'exact' ORDER BY edge LIMIT 2", run_dir, "--format", "json")
    assert r.exit_code == 0 and json.loads(r.output) == [{"name": EDGES[0], "q": 0.004}, {"name": EDGES[1], "q": 0.004}]
    for args, needle in [
        (("SELECT * FROM nope", run_dir), "Tables available"),
        (("SELECT nope FROM edges", run_dir), "nope"),
        (("SELEC 1", run_dir), "syntax error"),
        (("SELECT 1", tmp_path / "missing"), "does not exist"),
        (("SELECT 1", run_dir, "--format", "xml"), "'xml' is not one of 'table', 'csv', 'json'"),
    ]:
        r = _invoke("query", *args)
        assert r.exit_code == 2 and r.output.startswith("error: ") and needle in r.output, (args, r.output)


# ---- token contributions and attention sinks (runs of `circuitstat tokens`) -----------------------
# (measure_a, measure_b, k) -> (difference, ci_low, ci_high, holm p, verdict, interval reliable)
DIFFS = {("attention", "contribution", 1): (0.7, 0.1, 1.3, 0.2, "inconclusive", True),
         ("attention", "random", 1): (4.7, 3.8, 5.5, 0.02, "attention > random", True),
         ("contribution", "random", 1): (4.0, 3.3, 4.7, 0.02, "contribution > random", True),
         ("attention", "contribution", 3): (-0.5, -0.9, -0.1, 0.03, "attention < contribution", True),
         ("attention", "random", 3): (3.4, 2.5, 4.2, 0.02, "attention > random", True),
         ("contribution", "random", 3): (3.9, 0.1, 9.0, 0.04, "contribution > random", False)}
# (layer, head) -> (sink rate, ci_low, ci_high, interval reliable)
SINKS = {(0, 0): (0.02, 0.01, 0.03, True), (0, 1): (0.7, 0.2, 0.95, False),
         (1, 0): (0.05, 0.02, 0.08, True), (1, 1): (0.6, 0.55, 0.65, True)}
# (measure, k) -> (mean drop, ci_low, ci_high, interval reliable)
DROPS = {("attention", 1): (5.8, 4.8, 6.8, True), ("contribution", 1): (5.1, 4.3, 5.9, True),
         ("random", 1): (1.1, 0.2, 3.0, False), ("attention", 3): (5.7, 4.8, 6.7, True),
         ("contribution", 3): (6.2, 5.0, 7.4, True), ("random", 3): (2.4, 1.9, 2.8, True)}


def _token_tables(shift: float = 0.0) -> dict[str, dict]:
    """The stat tables of a tokens run with the known values above (every other column from the schema)."""
    from circuitstat.core.schema import fill

    keys = list(DIFFS)
    diffs = {"measure_a": [a for a, _, _ in keys], "measure_b": [b for _, b, _ in keys], "k": [k for *_, k in keys],
             **{c: [DIFFS[key][i] for key in keys] for i, c in enumerate(
                 ("difference", "ci_low", "ci_high", "pvalue_holm", "verdict", "interval_reliable"))}}
    heads = list(SINKS)
    sinks = {"layer": [layer for layer, _ in heads], "head": [h for _, h in heads],
             "node": [f"a{layer}.h{h}" for layer, h in heads], "threshold": [0.3] * len(heads),
             **{c: [SINKS[u][i] + shift if i < 3 else SINKS[u][i] for u in heads] for i, c in enumerate(
                 ("sink_rate", "ci_low", "ci_high", "interval_reliable"))}}
    drops = list(DROPS)
    imp = {"measure": [m for m, _ in drops], "k": [k for _, k in drops],
           **{c: [DROPS[d][i] for d in drops] for i, c in enumerate(("mean_drop", "ci_low", "ci_high", "interval_reliable"))}}
    return {name: fill(name, t, len(next(iter(t.values())))) for name, t in
            (("token_importance_diffs", diffs), ("sink_heads", sinks), ("token_importance", imp))}


def make_token_run(path: Path, n_models: int = 1) -> Path:
    """A synthetic tokens run: the tables at the top (one model) or under model-<i>/ (cross-seed)."""
    from circuitstat.core.rundir import RunDir

    from circuitstat.core.schema import fill

    with RunDir(path, spec={"synthetic": "tokens"}, seed=0) as run:
        for i in range(n_models):
            prefix = f"model-{i}/" if n_models > 1 else ""
            for name, t in _token_tables(shift=-0.1 * i).items():
                run.write_table(prefix + name, t)
        if n_models > 1:
            run.write_table("sink_stability", fill("sink_stability", {
                "layer": [0, 1, 1, -1], "item": ["rank 1 sink rate", "rank 1 sink rate", "heads with sink rate >= 0.3",
                                                 "spearman(sink rate, output norm)"],
                "value": [0.05, 0.6, 1.5, 0.1], "ci_low": [0.04, 0.52, 0.7, -0.3], "ci_high": [0.06, 0.68, 2.3, 0.5],
                "n_refits": [n_models] * 4}, 4))
            run.write_table("sink_matching", fill("sink_matching", {
                "layer": [1, -1], "item": ["sink-head Jaccard"] * 2, "value": [0.8, 0.8], "ci_low": [0.6, 0.6],
                "ci_high": [1.0, 1.0], "null": [0.25, 0.25], "excess": [0.55, 0.55], "excess_ci_low": [0.35, -0.05],
                "excess_ci_high": [0.75, 1.15], "verdict": ["stable", "inconclusive"], "n_refits": [n_models] * 2,
                "matching": ["hungarian on patterns"] * 2}, 2))
            run.write_table("token_stability", fill("token_stability", {
                "measure": ["attention", "contribution"], "k": [1, 1], "jaccard": [0.9, 0.4], "chance": [0.03, 0.03],
                "excess": [0.87, 0.37], "excess_ci_low": [0.65, 0.1], "excess_ci_high": [1.0, 0.6]}, 2))
    return path


@pytest.fixture(scope="module")
def seeds_run(tmp_path_factory):
    return make_token_run(tmp_path_factory.mktemp("seeds") / "run", n_models=2)


@pytest.mark.parametrize("claim, status, needle", [
    ({"kind": "sink_stability", "layer": 1, "item": "rank 1 sink rate", "min": 0.5}, "pass",
     "ci_low of rank 1 sink rate of layer 1 is 0.52 >= 0.5 (mean over 2 seeds 0.6 [0.52, 0.68])"),
    ({"kind": "sink_stability", "layer": 1, "item": "rank 1 sink rate", "min": 0.55}, "fail", "0.52 < 0.55"),
    ({"kind": "sink_stability", "layer": 0, "item": "rank 1 sink rate", "statistic": "ci_high", "max": 0.1}, "pass",
     "ci_high of rank 1 sink rate of layer 0 is 0.06 <= 0.1"),
    ({"kind": "sink_stability", "layer": -1, "item": "spearman(sink rate, output norm)", "min": 0.0}, "fail", "-0.3 < 0"),
    ({"kind": "sink_stability", "layer": 2, "item": "rank 1 sink rate", "min": 0.5}, "error",
     "layer 2 is not in the run's sink_stability (layers [-1, 0, 1]"),
    ({"kind": "sink_stability", "layer": 1, "item": "rank 2 sink rate", "min": 0.5}, "error",
     "item 'rank 2 sink rate' is not in the run's sink_stability for layer 1 (items: ['heads with sink rate >= 0.3'"),
    ({"kind": "sink_stability", "layer": 1, "item": "sink-head Jaccard", "statistic": "excess_ci_low", "min": 0.0},
     "pass", "excess_ci_low of sink-head Jaccard of layer 1 is 0.35 >= 0 (mean over ordered pairs of 2 seeds 0.8 [0.6, 1], "
     "random matching 0.25, verdict 'stable'; heads matched by hungarian on patterns)"),
    ({"kind": "sink_stability", "layer": -1, "item": "sink-head Jaccard", "statistic": "excess_ci_low", "min": 0.0},
     "fail", "excess_ci_low of sink-head Jaccard is -0.05 < 0"),
    ({"kind": "sink_stability", "layer": 0, "item": "sink-head Jaccard", "min": 0.5}, "error",
     "layer 0 is not in the run's sink_matching (layers [-1, 1]"),
    ({"kind": "sink_stability", "layer": 1, "item": "rank 1 sink rate", "statistic": "excess_ci_low", "min": 0.0},
     "error", "excess_ci_low is not a column of sink_stability"),
    ({"kind": "sink_stability", "layer": 1, "item": "rank 3 sink rate", "min": 0.0}, "error",
     "or one of ['sink-head Jaccard', 'share of sink heads matched to a sink', 'mean |sink-rate difference|']"),
    ({"kind": "token_stability", "measure": "attention", "k": 1, "min": 0.5}, "pass",
     "excess_ci_low of the top-1 attention token Jaccard between seeds is 0.65 >= 0.5 (Jaccard 0.9, chance 0.03)"),
    ({"kind": "token_stability", "measure": "contribution", "k": 1, "min": 0.5}, "fail", "is 0.1 < 0.5"),
    ({"kind": "token_stability", "measure": "contribution", "k": 1, "statistic": "jaccard", "min": 0.3}, "pass", "0.4 >= 0.3"),
    ({"kind": "token_stability", "measure": "attention", "k": 5, "min": 0.5}, "error", "k=5 is not in the run's k grid [1]"),
])
def test_claims_across_seeds(seeds_run, tmp_path, claim, status, needle):
    (res,) = evaluate_claims(parse_claims({"claims": [claim]}), seeds_run)
    assert res.status == status and needle in res.reason, res.reason
    # a single-model run has no cross-seed tables: the reason says how to make them
    (res,) = evaluate_claims(parse_claims({"claims": [claim]}), make_token_run(tmp_path / "one"))
    assert res.status == "error" and "need a cross-seed run" in res.reason, res.reason


TOKEN_CLAIMS = [  # (claim, expected status, text in the reason)
    ({"kind": "sink", "head": "a1.h1", "min": 0.5}, "pass", "ci_low of a1.h1 is 0.55 >= 0.5 (sink rate 0.6 [0.55, 0.65]"),
    ({"kind": "sink", "head": "1.1", "min": 0.6}, "fail", "ci_low of a1.h1 is 0.55 < 0.6"),  # the estimate alone would pass
    ({"kind": "sink", "layer": 1, "head": 0, "statistic": "sink_rate", "max": 0.1}, "pass", "sink_rate of a1.h0 is 0.05 <= 0.1"),
    ({"kind": "sink", "head": "a0.h1", "min": 0.1}, "error", "flagged unreliable in sink_heads"),
    ({"kind": "sink", "head": "a0.h1", "statistic": "sink_rate", "min": 0.5}, "pass", "sink_rate of a0.h1 is 0.7 >= 0.5"),
    ({"kind": "sink", "head": "a3.h1", "min": 0.5}, "error", "head a3.h1 is not in the run's sink_heads (layers [0, 1], heads [0, 1])"),
    ({"kind": "token_importance", "measure_a": "contribution", "measure_b": "random", "k": 1}, "pass",
     "drop contribution - random at k=1: 4 [3.3, 4.7], Holm p = 0.02: verdict 'contribution > random'"),
    ({"kind": "token_importance", "measure_a": "contribution", "measure_b": "attention", "k": 1}, "fail",
     "-0.7 [-1.3, -0.1], Holm p = 0.2: verdict 'inconclusive'"),  # read from the attention - contribution row
    ({"kind": "token_importance", "measure_a": "contribution", "measure_b": "attention", "k": 3}, "pass",
     "0.5 [0.1, 0.9], Holm p = 0.03: verdict 'contribution > attention'"),
    ({"kind": "token_importance", "measure_a": "attention", "measure_b": "contribution", "k": 3}, "fail",
     "verdict 'attention < contribution'"),
    ({"kind": "token_importance", "measure_a": "contribution", "measure_b": "random", "k": 3}, "error",
     "flagged unreliable in token_importance_diffs"),
    ({"kind": "token_importance", "measure_a": "contribution", "measure_b": "random", "k": 2}, "error",
     "k=2 is not in the run's k grid [1, 3] (token_importance_diffs)"),
    ({"kind": "token_importance", "measure_a": "contribution", "measure_b": "grad_input", "k": 1}, "error",
     "measure 'grad_input' is not in the run's token_importance_diffs (measures: ['attention', 'contribution', 'random'])"),
    ({"kind": "token_drop", "measure": "attention", "k": 1, "min": 4.5}, "pass",
     "ci_low of the metric drop from ablating attention's top-1 tokens is 4.8 >= 4.5"),
    ({"kind": "token_drop", "measure": "contribution", "k": 1, "min": 4.5}, "fail", "is 4.3 < 4.5"),
    ({"kind": "token_drop", "measure": "random", "k": 1, "statistic": "ci_high", "max": 3.5}, "error", "flagged unreliable"),
    ({"kind": "token_drop", "measure": "random", "k": 1, "statistic": "mean_drop", "max": 1.5}, "pass", "mean_drop"),
]


@pytest.fixture(scope="module")
def token_run(tmp_path_factory):
    return make_token_run(tmp_path_factory.mktemp("tokens") / "run")


@pytest.mark.parametrize("claim, status, needle", TOKEN_CLAIMS)
def test_token_and_sink_claims(token_run, claim, status, needle):
    (res,) = evaluate_claims(parse_claims({"claims": [claim]}), token_run)
    assert res.status == status and needle in res.reason, res.reason


def test_token_claims_in_a_cross_seed_run_name_their_model(tmp_path):
    run = make_token_run(tmp_path / "seeds", n_models=2)
    cf = parse_claims({"claims": [
        {"kind": "sink", "head": "a1.h1", "min": 0.5, "model": 0},
        {"kind": "sink", "head": "a1.h1", "min": 0.5, "model": 1},  # model 1's rates are 0.1 lower: 0.45
        {"kind": "sink", "head": "a1.h1", "min": 0.5},
        {"kind": "token_drop", "measure": "attention", "k": 1, "min": 4.5, "model": 2},
    ]})
    res = evaluate_claims(cf, run)
    assert [r.status for r in res] == ["pass", "fail", "error", "error"], [r.reason for r in res]
    assert "ci_low of a1.h1 (model 1) is 0.45 < 0.5" in res[1].reason
    assert "cross-seed run of 2 models" in res[2].reason and "give 'model:' (one of [0, 1])" in res[2].reason
    assert "model 2 is not in the run" in res[3].reason and "its models are [0, 1]" in res[3].reason
    # a single-model run refuses 'model:' rather than guess
    (r,) = evaluate_claims(parse_claims({"claims": [{"kind": "sink", "head": "a1.h1", "min": 0.5, "model": 0}]}),
                           make_token_run(tmp_path / "one"))
    assert r.status == "error" and "it holds one model: remove 'model:'" in r.reason


def test_token_claims_through_the_cli_exit_codes(token_run, tmp_path):
    ok = [c for c, status, _ in TOKEN_CLAIMS if status == "pass"]
    assert {c["kind"] for c in ok} == set(TOKEN_KINDS) - {"sink_stability", "token_stability"}  # cross-seed: above
    r = _invoke("check", _write(tmp_path / "ok.yaml", {"claims": ok}), "--run", token_run)
    assert r.exit_code == 0 and f"{len(ok)} claims: {len(ok)} hold" in r.output, r.output
    false = [c for c, status, _ in TOKEN_CLAIMS if status == "fail"]
    r = _invoke("check", _write(tmp_path / "false.yaml", {"claims": ok + false}), "--run", token_run)
    assert r.exit_code == 1 and f"{len(false)} fail, 0 cannot be evaluated" in r.output, r.output
    for bad, needle in ((TOKEN_CLAIMS[5][0], "head a3.h1 is not in the run's sink_heads"),
                        (TOKEN_CLAIMS[11][0], "k=2 is not in the run's k grid [1, 3]")):
        r = _invoke("check", _write(tmp_path / "bad.yaml", {"claims": ok + [bad]}), "--run", token_run)
        assert r.exit_code == 2 and needle in r.output and "1 cannot be evaluated" in r.output, r.output
    # the audit's runs lack these tables: the reason says which command makes them, and no audit is suggested
    r = _invoke("check", _write(tmp_path / "ok.yaml", {"claims": ok[:1]}), "--run", make_run(tmp_path / "audit"))
    assert r.exit_code == 2 and "need a `circuitstat tokens --out DIR` run" in r.output, r.output
    assert "give 'spec:'" not in r.output


def test_token_claims_are_refused_by_an_audit_spec(tmp_path, fake_audit):
    _write(tmp_path / "audit.yaml", SPEC)
    doc = {"spec": "audit.yaml", "run": "runs/zoo", "claims": [TOKEN_CLAIMS[0][0]]}
    r = _invoke("check", _write(tmp_path / "c.yaml", doc), "--run-audit")
    assert r.exit_code == 2 and "answered by `circuitstat tokens`, which the audit does not run" in r.output, r.output
    assert fake_audit == []


@pytest.mark.parametrize("claim, needle", [
    ({"kind": "token_importance", "measure_a": "attention", "measure_b": "attention", "k": 1}, "both 'attention'"),
    ({"kind": "sink", "head": "a1.h1"}, "give a bound"),
    ({"kind": "sink", "head": "a1.h1", "min": 0.5, "statistic": "gap_ci_low"}, "statistic: must be 'sink_rate'"),
    ({"kind": "sink", "head": "a1.h1", "min": 0.5, "model": -1}, "model: Input should be greater than or equal to 0"),
    ({"kind": "token_drop", "measure": "attention", "k": 0, "min": 1.0}, "k: Input should be greater than or equal to 1"),
])
def test_malformed_token_claims_name_the_key(claim, needle):
    with pytest.raises(InputError, match=None) as e:
        parse_claims({"claims": [claim]})
    assert needle in str(e.value), str(e.value)


def test_token_claims_on_a_real_run(tmp_path):
    """The claims read what TokenContributions writes: bounds just below / above the table's numbers."""
    import pyarrow.parquet as pq
    import torch

    from circuitstat.circuits.model import CircuitModel, ModelConfig
    from circuitstat.pipelines.runs.tokens.run import TokenContributions

    cfg = ModelConfig(n_layers=2, n_heads=2, d_model=16, d_head=8, d_mlp=32, vocab_size=50, n_ctx=32, act="relu")
    m = CircuitModel(cfg).init_weights(0)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(8.0) if p.ndim > 1 else None
    est = TokenContributions(n=12, task_options={"seq_len": 5}, ks=(1, 2), n_random=3, n_resamples=999, seed=3)
    est.run(m.eval(), tmp_path / "run", command=["test"])
    sinks = pq.read_table(tmp_path / "run" / "sink_heads.parquet").to_pylist()
    top = max((r for r in sinks if r["interval_reliable"]), key=lambda r: r["ci_low"])
    diffs = pq.read_table(tmp_path / "run" / "token_importance_diffs.parquet").to_pylist()
    d = next(r for r in diffs if r["interval_reliable"])
    claims = [{"kind": "sink", "head": top["node"], "min": top["ci_low"] - 1e-6},
              {"kind": "sink", "head": top["node"], "min": top["ci_low"] + 1e-6},
              {"kind": "token_importance", "measure_a": d["measure_a"], "measure_b": d["measure_b"], "k": d["k"]}]
    res = evaluate_claims(parse_claims({"claims": claims}), tmp_path / "run")
    assert [r.status for r in res[:2]] == ["pass", "fail"], [r.reason for r in res]
    assert res[2].status == ("pass" if d["verdict"] == f"{d['measure_a']} > {d['measure_b']}" else "fail")
    assert res[2].observed["difference"] == pytest.approx(d["difference"])


def test_the_zoo_tokens_example_parses_and_names_its_run_command():
    path = REPO / "examples" / "claims-zoo-tokens.yaml"
    cf = load_claims(path)
    assert {c.kind for c in cf.claims} == set(TOKEN_KINDS)
    # a cross-seed run: every per-model claim names its refit
    assert sorted({c.model for c in cf.claims if "model" in type(c).model_fields}) == [0, 1, 2, 3, 4]
    head = path.read_text().split("claims:")[0]
    assert "circuitstat tokens --model zoo:attn-only-2l/seed-0," in head and "--out /tmp/tokens-run" in head
    assert "circuitstat check examples/claims-zoo-tokens.yaml --run /tmp/tokens-run" in head


def _files(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file()}


def test_record_takes_the_run_lock_and_writes_nothing_when_it_is_held(tmp_path):
    """Issue 38 adversarial 5: `check --record` wrote claims.parquet and report.html under a live lock holder."""
    from circuitstat.core.lock import DirLock

    run = make_run(tmp_path / "run")
    claims = _write(tmp_path / "c.yaml", {"claims": PASSING["claims"][:3]})
    before = _files(run)
    with DirLock(run / ".lock"):  # a live holder: this very process, as an audit writing the run would be
        held = _files(run)
        r = _invoke("check", claims, "--run", run, "--record")
        assert r.exit_code == 2 and "not recorded" in r.output and "is locked by process" in r.output, r.output
        assert _files(run) == held  # no claims.parquet, no report.html, the holder's lock untouched
    assert _files(run) == before
    r = _invoke("check", claims, "--run", run, "--record")  # released: recorded, and the lock is gone again
    assert r.exit_code == 0 and (run / "claims.parquet").is_file() and (run / "report.html").is_file(), r.output
    assert not (run / ".lock").exists()


def test_record_of_a_check_that_cannot_evaluate_a_claim_writes_nothing(tmp_path):
    run = make_run(tmp_path / "run")
    doc = {"claims": PASSING["claims"][:1] + [{**PASSING["claims"][1], "k": 7}]}  # k=7 is not in the run's grid
    before = _files(run)
    r = _invoke("check", _write(tmp_path / "c.yaml", doc), "--run", run, "--record")
    assert r.exit_code == 2 and "not recorded: 1 claim(s) cannot be evaluated" in r.output, r.output
    assert _files(run) == before


def test_circuit_test_claims_fail_and_say_why(run_dir, tmp_path):
    from circuitstat.pipelines.claims import check

    doc = {"claims": [{"kind": "circuit_minimal", "alpha": 0.85}, {"kind": "circuit_sufficient", "alpha": 0.01},
                      {"kind": "circuit_equivalent", "alpha": 0.7},
                      {"kind": "circuit_equivalent_tost", "alpha": 0.005}]}  # TOST p = 0.01: not affirmed at 0.005
    report = check(_write(tmp_path / "c.yaml", doc), run=run_dir)
    assert [r.status for r in report.results] == ["fail", "fail", "fail", "fail"]
    assert "equivalence_tost" in report.results[3].reason and "p = 0.01 > 0.005" in report.results[3].reason
    assert "a0.h3->a1.h5<k> (p = 0.8), a0.h3->logits (p = 0.8)" in report.results[0].reason
    assert "p = 0.6 <= 0.7: H0 is false" in report.results[2].reason
    bare = check(_write(tmp_path / "c.yaml", doc), run=make_run(tmp_path / "bare"))
    assert all(r.status == "error" and "tests: {k: K}" in r.reason for r in bare.results)
