"""Issue 45 items 5 and 6: inputs that ended in a traceback (exit 3) or were taken silently now exit 2 with a
message naming the problem and the fix; each with a negative control (the valid neighbour still works)."""

from __future__ import annotations

import json
import socket
import struct
import threading

import numpy as np
import pytest
from typer.testing import CliRunner

from circuitstat.core.errors import InputError
from circuitstat.pipelines.cli import app

M = "random:gpt2?n_layer=2&n_head=4&n_embd=64&vocab_size=512&n_positions=64"
LLAMA = ("random:llama?num_hidden_layers=2&hidden_size=32&num_attention_heads=2&num_key_value_heads=2"
         "&intermediate_size=64&vocab_size=256&max_position_embeddings=64")
runner = CliRunner()


def _exit2(args: list, *needles: str) -> str:
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 2, res.output + repr(res.exception)
    err = res.stderr.strip().splitlines()[-1]  # (a library may log a warning line before it)
    assert err.startswith("error: ") and "Traceback" not in res.output, res.stderr
    for needle in needles:
        assert needle in err, (needle, err)
    return err


# ---- rope_scaling / rope_parameters given whole ---------------------------------------------------------------
@pytest.mark.parametrize("field", ["rope_scaling", "rope_parameters"])
def test_a_whole_rope_mapping_in_json_is_the_same_as_key_by_key(field):
    from circuitstat.circuits.loading import random_hf_model

    whole = random_hf_model(f'{LLAMA}&{field}={{"rope_type":"linear","factor":2}}').config.rope_parameters
    keyed = random_hf_model(f"{LLAMA}&{field}.rope_type=linear&{field}.factor=2").config.rope_parameters
    assert whole == keyed and whole["rope_type"] == "linear" and whole["factor"] == 2


@pytest.mark.parametrize("value", ["bogus", "3", "[1,2]", '{"rope_type":', "[" * 5000, '{"rope_type":"nosuch"}'])
def test_a_rope_value_that_is_no_valid_mapping_exits_2(value):
    err = _exit2(["model", f"{LLAMA}&rope_scaling={value}", "--logits-only"])
    # a value so long that the whole source passes the grammar's 4096-character cap is refused for its length first
    assert "rope" in err or "invalid config value" in err or (len(value) > 4096 and "longer than 4096" in err)


# ---- circuit JSON -------------------------------------------------------------------------------------------
@pytest.fixture
def graph_json(tmp_path):
    from circuitstat.circuits.circuit import Circuit
    from circuitstat.circuits.graph import ComponentGraph

    g = ComponentGraph(2, 2)
    path = tmp_path / "c.json"
    Circuit.from_edges(g, g.edge_names[:3]).to_json(path, d_model=16)
    return g, path, json.loads(path.read_text())


def _read(g, path, fmt="eap-ig"):
    from circuitstat.pipelines.published import read_circuit_file

    return read_circuit_file(path, fmt, g)


def test_the_valid_circuit_file_reads_its_edges(graph_json):
    g, path, _ = graph_json
    assert sorted(_read(g, path).edge_names) == sorted(g.edge_names[:3])


def test_deep_nesting_and_huge_integers_are_input_errors(graph_json, tmp_path):
    g, path, doc = graph_json
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000)
    with pytest.raises(InputError, match="too deeply"):
        _read(g, deep)
    name = g.edge_names[0]
    text = path.read_text()
    huge = json.dumps(doc).replace(f'"{name}": {{"score": {json.dumps(doc["edges"][name]["score"])}',
                                   f'"{name}": {{"score": 1{"0" * 5000}')
    assert huge != json.dumps(doc)
    path.write_text(huge)
    with pytest.raises(InputError, match="number too long"):
        _read(g, path)
    path.write_text(text)


def test_repeated_keys_are_refused_not_resolved_last_wins(graph_json):
    g, path, doc = graph_json
    body = json.dumps(doc)
    path.write_text(body[:-1] + ', "edges": {}}')  # a second top-level edges object: it would empty the circuit
    with pytest.raises(InputError, match="'edges' appears more than once"):
        _read(g, path)
    name = g.edge_names[0]
    path.write_text(body.replace(f'"{name}": {{', f'"{name}": {{"in_graph": false, ', 1))
    with pytest.raises(InputError, match="'in_graph' appears more than once"):
        _read(g, path)


@pytest.mark.parametrize("value", [1, 0, "true", None])
def test_in_graph_must_be_a_json_boolean(graph_json, value):
    g, path, doc = graph_json
    doc["edges"][g.edge_names[0]]["in_graph"] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="in_graph must be true or false"):
        _read(g, path)


def test_an_edge_list_read_from_a_json_file_names_the_format_without_quoting_it(graph_json):
    g, path, _ = graph_json
    path.write_text(json.dumps(json.loads(path.read_text())))  # one long line
    with pytest.raises(InputError) as e:
        _read(g, path, "edges")
    assert "eap-ig" in str(e.value) and '"cfg"' not in str(e.value) and len(str(e.value)) < 300


# ---- --verify-seed -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", ["18446744073709551615", "1e23", "9223372036854775808"])
def test_verify_seed_above_63_bits_exits_2_before_anything_runs(tmp_path, seed):
    _exit2(["attribute", "--model", M, "--n", "8", "--verify", "6", "--verify-seed", seed, "--out", tmp_path / "r"],
           "--verify-seed")
    assert not (tmp_path / "r").exists()


def test_verify_seed_in_a_spec_is_bounded_as_a_seed():
    from circuitstat.pipelines.spec import VerifySpec, validate_spec

    assert validate_spec(VerifySpec, {"n": 6, "seed": 2**63 - 1}, "s").seed == 2**63 - 1
    with pytest.raises(InputError, match="seed"):
        validate_spec(VerifySpec, {"n": 6, "seed": 2**64 - 1}, "s")


# ---- --scheduler ---------------------------------------------------------------------------------------------
def _serve(behaviour):
    """A loopback listener whose every connection gets ``behaviour(conn)``; its tcp:// address."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    conns = []

    def loop():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conns.append(conn)
            behaviour(conn)

    threading.Thread(target=loop, daemon=True).start()
    return f"tcp://127.0.0.1:{server.getsockname()[1]}", server


def _http(conn):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")


def _silent(conn):
    pass


def _dask_like(conn):
    conn.sendall(struct.pack("Q", 120) + b"\x01" + b"\x00" * 7)


@pytest.mark.parametrize("behaviour, needle", [(_http, "not with Dask's protocol"), (_silent, "no Dask handshake")])
def test_a_peer_that_is_not_a_dask_scheduler_is_refused(behaviour, needle):
    from circuitstat.pipelines.parallel import probe_scheduler

    address, server = _serve(behaviour)
    try:
        with pytest.raises(InputError, match=needle):
            probe_scheduler(address, timeout=0.5)
    finally:
        server.close()


def test_a_closed_port_and_a_malformed_address_are_refused():
    from circuitstat.pipelines.parallel import probe_scheduler

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(InputError, match="cannot reach"):
        probe_scheduler(f"tcp://127.0.0.1:{port}", timeout=0.5)
    with pytest.raises(InputError, match="not an address"):
        probe_scheduler("tcp://nohost", timeout=0.5)


def test_dask_framing_passes_the_probe_and_a_real_scheduler_does_too():
    from circuitstat.pipelines.parallel import probe_scheduler

    address, server = _serve(_dask_like)
    try:
        probe_scheduler(address, timeout=2)  # the negative control: the probe passes Dask's framing
    finally:
        server.close()
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster:
        probe_scheduler(cluster.scheduler_address, timeout=10)


def test_attribute_with_an_http_scheduler_exits_2(tmp_path, monkeypatch):
    import circuitstat.pipelines.parallel as parallel

    monkeypatch.setattr(parallel, "CONNECT_TIMEOUT_S", 0.5)
    for behaviour in (_http, _silent):
        address, server = _serve(behaviour)
        try:
            _exit2(["attribute", "--model", M, "--n", "4", "--scheduler", address, "--out", tmp_path / "r"],
                   address)
        finally:
            server.close()


# ---- users ---------------------------------------------------------------------------------------------------
def test_users_bad_database_urls_files_and_configs_exit_2(tmp_path):
    notdb = tmp_path / "notdb.txt"
    notdb.write_text("not a database\n")
    _exit2(["users", "list", "--database", "bogus://x"], "'bogus'")
    _exit2(["users", "list", "--database", f"sqlite:///{notdb}"], "not a SQLite database")
    assert notdb.read_text() == "not a database\n" and sorted(p.name for p in tmp_path.iterdir()) == ["notdb.txt"]
    config = tmp_path / "config.yaml"
    config.write_text("just a string\n")
    _exit2(["users", "list", "--data", tmp_path, "--config", config], "mapping")


def test_users_token_on_a_new_directory_creates_nothing_and_labels_are_capped(tmp_path):
    new = tmp_path / "NEW" / "DIR"
    _exit2(["users", "token", "bob", "--data", new], "no service database", "users add")
    assert not (tmp_path / "NEW").exists()
    data = tmp_path / "data"
    assert runner.invoke(app, ["users", "add", "bob", "--data", str(data)]).exit_code == 0
    _exit2(["users", "token", "bob", "--data", data, "--label", "x" * 100_000], "100,000 characters", "64")
    ok = runner.invoke(app, ["users", "token", "bob", "--data", str(data), "--label", "x" * 64])
    assert ok.exit_code == 0 and ok.stdout.strip().startswith("csk_")


# ---- sample-size on NaN scores, check on "stages": [] ---------------------------------------------------------
def test_sample_size_on_nan_scores_is_an_input_error():
    from circuitstat.pipelines.runs.sample_size.simulate import sample_size

    S = np.random.default_rng(0).standard_normal((32, 20))
    S[3, 4] = np.nan
    with pytest.raises(InputError, match="NaN"):
        sample_size(S, [f"e{i}" for i in range(20)], "eap", [64], [3], 0.5)


def test_claims_reader_refuses_a_manifest_whose_stages_is_a_list(tmp_path):
    from circuitstat.core.rundir import FORMAT
    from circuitstat.pipelines.claims.reader import RunReader

    (tmp_path / "manifest.json").write_text(json.dumps({"format": FORMAT, "spec": {}, "stages": []}))
    with pytest.raises(InputError, match="stages as a list"):
        RunReader(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": FORMAT, "spec": {}, "stages": {}}))
    assert RunReader(tmp_path).unfinished == []


# ---- item 6: the plan refuses what the run refuses; sections of methods not run ---------------------------------
def test_plan_refuses_verify_edges_the_run_refuses(tmp_path):
    args = ["attribute", "--model", M, "--n", "16", "--verify", "6", "--verify-edges", "100,100", "--verify-tau",
            "0.01"]
    planned = _exit2([*args, "--plan"], "100 + 100 edges of the model's 110")
    run = _exit2([*args, "--out", tmp_path / "r"])
    assert planned == run and not (tmp_path / "r").exists()
    ok = runner.invoke(app, ["attribute", "--model", M, "--n", "16", "--verify", "6", "--verify-edges", "50,50",
                             "--verify-tau", "0.01", "--plan"])
    assert ok.exit_code == 0 and "verified run" in ok.output


@pytest.mark.parametrize("section, method", [("ugs", "ugs"), ("edge_pruning", "edge-pruning")])
def test_a_mask_section_without_its_method_is_refused(section, method):
    from circuitstat.pipelines.runs.audit.run import audit_spec_doc
    from circuitstat.pipelines.spec import AuditSpec, parse_spec

    doc = {"model": M, "methods": ["eap"], section: {"steps": 3}}  # (a section of its defaults changes nothing)
    with pytest.raises(InputError, match=f"add {method} to methods"):
        parse_spec(doc, "s.yaml")
    spec = parse_spec({**doc, "methods": ["eap", method]}, "s.yaml")  # with its method: accepted
    assert getattr(spec, section).steps == 3
    # a run's recorded spec (every section written out) still reads back
    plain = parse_spec({"model": M, "methods": ["eap"]}, "s.yaml")
    assert AuditSpec.model_validate(audit_spec_doc(plain)).methods == ["eap"]
    assert parse_spec(plain.model_dump(), "s.yaml") == plain  # the service writes every section out, defaults too
