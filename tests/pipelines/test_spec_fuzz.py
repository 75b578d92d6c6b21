"""Fuzzing malformed audit specs and claims files: always a clear error (exit 2), never a traceback,
a partial run directory or a silent default."""

from __future__ import annotations

import copy
import sys
import tempfile
import types
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from circuitstat.core.errors import InputError
from circuitstat.pipelines.claims import load_claims
from circuitstat.pipelines.claims.checking import _load_spec
from circuitstat.pipelines.cli import app as APP  # the real CLI, with its one error boundary
from circuitstat.pipelines.spec import AuditSpec, load_spec

REPO = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((REPO / "examples" / "audit-zoo.yaml").read_text())
SPEC["models"] = ["random:a", "random:b"]  # exercise the multi-model branch of the mutations too
SPEC.pop("model", None)
SPEC["heads"] = {"match": "hungarian", "pairs": "all", "drop_bos": True, "n_probe": 8, "n_resamples": 20}


FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---- mutations ---------------------------------------------------------------------------------
LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, -1.0, 1e308, 1e-320, 2.0, 0.0]),
    st.text(max_size=12), st.sampled_from(["exact", "eap", "phi", "1.5", "a0.h3->a1.h5<k>", "", "k", "yes", "null", "2024-13-01"]),
    st.lists(st.integers(-5, 50), max_size=3), st.dictionaries(st.text(max_size=6), st.integers(), max_size=2),
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _get(doc, path):
    for p in path:
        doc = doc[p]
    return doc


@st.composite
def mutated(draw, base):
    """`base` with 1-3 random structural mutations: drop, retype, unknown key, wrap, unwrap, duplicate."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["drop", "replace", "unknown", "wrap_list", "wrap_dict", "unwrap", "top"]))
        if not path:
            op = "top" if op in ("drop", "replace", "wrap_list", "wrap_dict", "unwrap", "top") else op
        if op == "top":
            doc = draw(st.one_of(LEAF, st.just([doc]), st.just(list(doc.items()) if isinstance(doc, dict) else doc)))
            continue
        if op == "unknown":
            target = _get(doc, path)
            if isinstance(target, dict):
                target[draw(st.sampled_from(["modle", "K", "method", "claim", "minimum", "extra", "kind "]))] = draw(LEAF)
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        if op == "drop":
            del parent[key]
        elif op == "replace":
            parent[key] = draw(LEAF)
        elif op == "wrap_list":
            parent[key] = [parent[key]]
        elif op == "wrap_dict":
            parent[key] = {draw(st.sampled_from(["value", "k", "min"])): parent[key]}
        elif op == "unwrap" and isinstance(parent[key], (list, dict)) and parent[key]:
            inner = parent[key]
            parent[key] = inner[0] if isinstance(inner, list) else next(iter(inner.values()))
    return doc


def _dump(doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


@st.composite
def mutated_text(draw, base):
    """A malformed file: a mutated document, a truncated/garbled YAML text, or random bytes."""
    kind = draw(st.sampled_from(["doc", "doc", "doc", "truncate", "splice", "bytes", "unicode", "yaml"]))
    if kind == "doc":
        return _dump(draw(mutated(base))).encode()
    text = _dump(base)
    if kind == "truncate":
        return text[: draw(st.integers(0, len(text)))].encode()
    if kind == "splice":
        i = draw(st.integers(0, len(text)))
        junk = draw(st.sampled_from(["\t", ":", "- ", "{", "]", "&a", "*a", "!!python/object:os.system", "\x00", "? ",
                                     "\n  bad: [", "'", "\"\\x", "%YAML 9.9\n", "---\n---\n", "@", "\ufeff"]))
        return (text[:i] + junk + text[i:]).encode("utf-8", "surrogatepass")
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "unicode":
        return draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")
    return draw(st.sampled_from([
        "[]", "null", "42", "'just a string'", "- claims\n- run", "~", "---", "...", "!!binary aGVsbG8=",
        "a: &x [*x, *x]", "{a: {b: {c: {d: [1, [2, [3]]]}}}}", "key: [1, 2\n", "model: !!float nan",
    ])).encode()


def _fresh_dir(base: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=base))


def _listing(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


# ---- specs -------------------------------------------------------------------------------------
def _validate_only(path: Path):
    """The validation-only path of `circuitstat audit`: load_spec, before any output exists."""
    try:
        return load_spec(path)
    except InputError as e:
        assert str(e) and "Traceback" not in str(e)
        return e


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@FUZZ
@given(doc=mutated(SPEC))
def test_mutated_spec_documents_are_valid_or_input_error(base_dir, doc):
    d = _fresh_dir(base_dir)
    p = d / "spec.yaml"
    p.write_text(_dump(doc))
    out = _validate_only(p)
    assert isinstance(out, (AuditSpec, InputError))
    if isinstance(out, InputError):
        assert str(out).startswith(f"invalid spec {p}") or "YAML" in str(out), str(out)
    assert _listing(d) == ["spec.yaml"]  # validation creates nothing


@FUZZ
@given(data=mutated_text(SPEC))
def test_malformed_spec_files_never_raise_anything_but_input_error(base_dir, data):
    d = _fresh_dir(base_dir)
    p = d / "spec.yaml"
    p.write_bytes(data)
    assert isinstance(_validate_only(p), (AuditSpec, InputError))
    assert _listing(d) == ["spec.yaml"]


# ---- claims ------------------------------------------------------------------------------------
def _helpers():
    """tests/pipelines/test_claims.py (its claims), however pytest put the test folders on the path."""
    try:
        from tests import test_claims
    except ImportError:
        import test_claims
    return test_claims


@pytest.fixture(scope="module")
def run_dir(base_dir):
    from builders import make_run

    return make_run(base_dir / "run")


@pytest.fixture(scope="module")
def fake_audit():
    """The audit kind's run (what `circuitstat audit` calls: kind("audit").run) replaced by a recorder that writes
    nothing."""
    import dataclasses

    from circuitstat.pipelines.runs.audit import run as audit_run

    calls = []
    mp = pytest.MonkeyPatch()
    mp.setattr(audit_run, "KIND", dataclasses.replace(audit_run.KIND, run=lambda spec, out, **kw: calls.append(out)))
    yield calls
    mp.undo()


def _claims_base(run_dir: Path) -> dict:
    return {"run": str(run_dir), "claims": copy.deepcopy(_helpers().PASSING["claims"])}


def _check(args) -> tuple[int, str]:
    r = CliRunner().invoke(APP, ["check", *map(str, args), "--allow-outside"])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    assert r.exit_code in (0, 1, 2), r.output
    return r.exit_code, r.output


def _assert_clean_claims_outcome(p: Path, code: int, out: str, d: Path, run_before: list[str], run_dir: Path):
    try:
        load_claims(p)
        malformed = None
    except InputError as e:
        malformed = str(e)
    if malformed is not None:
        assert code == 2, out
        assert out.startswith("error: ") and len(out.strip().splitlines()) == 1, out
        assert malformed.splitlines()[0] in out
    assert not (d / "j.xml").exists() or malformed is None
    assert set(_listing(d)) <= {"claims.yaml", "j.xml"}
    assert _listing(run_dir) == run_before  # the run is only read


@FUZZ
@given(data=st.data())
def test_mutated_claims_files_exit_cleanly(base_dir, run_dir, fake_audit, data):
    base = _claims_base(run_dir)
    raw = data.draw(st.one_of(mutated(base).map(lambda x: _dump(x).encode()), mutated_text(base)))
    d = _fresh_dir(base_dir)
    p = d / "claims.yaml"
    p.write_bytes(raw)
    before = _listing(run_dir)
    code, out = _check([p, "--junit", d / "j.xml"])
    event(f"exit {code}")
    _assert_clean_claims_outcome(p, code, out, d, before, run_dir)
    assert fake_audit == []  # no spec: the audit is never run


@FUZZ
@given(spec=mutated_text(SPEC))
def test_malformed_spec_named_by_claims_never_runs_or_creates_the_audit(base_dir, run_dir, fake_audit, spec):
    """A claims file whose spec is malformed: exit 2, no run directory, run_audit not called."""
    d = _fresh_dir(base_dir)
    (d / "audit.yaml").write_bytes(spec)
    claims = {"spec": "audit.yaml", "run": "runs/new", "claims": [
        {"kind": "circuit_stability", "method": "exact", "k": 20, "statistic": "jaccard_mean", "min": 0.5}]}
    (d / "claims.yaml").write_text(_dump(claims))
    n_calls = len(fake_audit)
    code, out = _check([d / "claims.yaml"])
    try:  # the reader check uses (libyaml, rejecting duplicate keys), then parse_spec
        _load_spec(d / "audit.yaml")
        valid = True
    except InputError:
        valid = False
    if not valid:
        assert code == 2 and out.startswith("error: ") and len(out.strip().splitlines()) == 1, out
        assert len(fake_audit) == n_calls
    assert code in (0, 1, 2)
    assert not (d / "runs").exists()  # the recorder writes nothing; nothing else may either


# ---- malformed or ambiguous specs that a lax loader accepted or crashed on --------------------
# Each must be a clear InputError from load_spec (strict YAML via circuitstat.pipelines.yamlio, strict pydantic).
SPEC_LOADER_GAPS = {
    "invalid date raises ValueError": "model: m\nseed: 2024-13-01\n",
    "deep nesting raises RecursionError": "model: m\ntask: {options: " + "[" * 1100 + "}\n",
    "duplicate key silently keeps the last": "model: random:a\nmodel: random:b\n",
    "bool silently coerced to an int": "model: m\nbatch_size: true\n",
    "string silently coerced to an int": "model: m\nn_jobs: '3'\n",
    "self-referential alias accepted (loops later)": "model: m\ntask: {options: &x {a: *x}}\n",
}


@pytest.mark.parametrize("case", sorted(SPEC_LOADER_GAPS))
def test_spec_loader_gaps(tmp_path, case):
    p = tmp_path / "spec.yaml"
    p.write_text(SPEC_LOADER_GAPS[case])
    with pytest.raises(InputError):
        load_spec(p)


@pytest.mark.parametrize("case", sorted(SPEC_LOADER_GAPS))
def test_claims_read_specs_strictly(tmp_path, case):
    p = tmp_path / "spec.yaml"
    p.write_text(SPEC_LOADER_GAPS[case])
    with pytest.raises(InputError):
        _load_spec(p)


# ---- through the real CLI entry point (circuitstat.pipelines.cli.main: errors -> one line, exit 2) ---------
def _main(argv: list[str]) -> tuple[int, str]:
    import contextlib
    import io

    from circuitstat.pipelines import cli

    err, out = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["circuitstat", *map(str, argv)]
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
            cli.main()
    finally:
        sys.argv = old
    code = e.value.code if isinstance(e.value.code, int) else (0 if e.value.code is None else 2)
    return code, err.getvalue() + out.getvalue()


@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=mutated_text(SPEC))
def test_audit_command_on_malformed_specs_exits_2_and_creates_nothing(base_dir, fake_audit, data):
    d = _fresh_dir(base_dir)
    (d / "spec.yaml").write_bytes(data)
    n_calls = len(fake_audit)
    code, out = _main(["audit", d / "spec.yaml", "--out", d / "out", "--no-report"])
    assert "Traceback" not in out
    if isinstance(_validate_only(d / "spec.yaml"), InputError):
        assert code == 2 and out.startswith("error: "), out
        assert len(out.strip().splitlines()) == 1, out
        assert len(fake_audit) == n_calls
    else:
        assert code == 0 and len(fake_audit) == n_calls + 1
    assert not (d / "out").exists()  # the recorder writes nothing: validation created nothing


def test_check_through_the_real_cli(tmp_path, run_dir):
    (tmp_path / "c.yaml").write_text("claims: [{kind: circuit_stability, method: exact, k: 5, statistic: phi, min: 2.0, maximum: 1}]")
    code, out = _main(["check", tmp_path / "c.yaml", "--run", run_dir])
    assert code == 2 and out.startswith("error: invalid claims file") and "maximum: unknown key" in out
    (tmp_path / "c.yaml").write_text("claims: [{kind: circuit_stability, method: exact, k: 5, statistic: jaccard_mean, min: 0.9}]")
    code, out = _main(["check", tmp_path / "c.yaml", "--run", run_dir])
    assert code == 1 and "jaccard_mean at k=5 for exact is 0.7 < 0.9" in out
