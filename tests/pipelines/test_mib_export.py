"""``circuitstat export mib``: the submission loads as MIB's loader reads it, with the run's values.

The reader below is written from MIB's definitions (hannamw/MIB-circuit-track README "Submitting to the MIB
Leaderboard", MIB_circuit_track/circuit_loading.py, and EAP-IG's eap/graph.py ``Graph.from_model`` /
``from_json``), not from circuitstat's code: the edge set is rebuilt from the JSON's ``cfg`` as EAP-IG builds
it, every JSON edge must be one of them (EAP-IG's ``g.edges[name]`` raises otherwise), and every node but
``logits`` is looked up the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from eapig_format import eapig_graph

from circuitstat.pipelines.runs.audit.run import run_audit
from circuitstat.pipelines.cli import app
from circuitstat.pipelines.spec import parse_spec

SPEC = {"model": "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3",
        "task": {"name": "induction", "n": 12, "options": {"seq_len": 5}}, "methods": ["eap"], "batch_size": 4,
        "bootstrap": {"n_resamples": 20}, "k": [3, 6], "faithfulness": False, "ranking": "absolute"}
MIB_GRID = (.001, .002, .005, .01, .02, .05, .1, .2, .5, 1)  # MIB_circuit_track/evaluation.py percentages


def strict_json(path: Path) -> dict:
    """The file parsed as standard JSON (NaN/Infinity refused)."""
    def refuse(name):
        raise ValueError(f"{path.name}: non-standard JSON constant {name}")
    return json.loads(path.read_text(), parse_constant=refuse)


def load_like_mib(path: Path) -> dict:
    """{'nodes': {name: in_graph}, 'edges': {name: (score, in_graph)}} as circuit_loading.load_graph_from_json fills
    a Graph; AssertionError/KeyError where it would fail."""
    d = strict_json(path)
    assert all(k in d for k in ("cfg", "nodes", "edges")), "Bad input JSON format - Missing keys"
    for key in ("n_layers", "n_heads", "parallel_attn_mlp", "d_model"):  # what Graph.from_model reads from cfg
        assert key in d["cfg"], key
    node_names, edge_list = eapig_graph(d["cfg"])
    edge_names = set(edge_list)
    nodes = {}
    for name, entry in d["nodes"].items():
        if name == "logits":
            continue
        assert name in node_names, name
        nodes[name] = bool(entry["in_graph"])
    edges = {}
    for name, info in d["edges"].items():
        if name not in edge_names:
            raise KeyError(name)
        assert isinstance(info["score"], float) and isinstance(info["in_graph"], bool)
        edges[name] = (info["score"], info["in_graph"])
    return {"cfg": d["cfg"], "nodes": nodes, "edges": edges, "all_edges": edge_names}


def read_submission(root: Path) -> dict:
    """{folder: [loaded files]} of a submission directory, checked as MIB's README states it."""
    out = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        task, sep, model = folder.name.partition("_")
        assert sep and task and model and "_" not in model, folder.name
        files = sorted(p for p in folder.iterdir() if p.suffix in (".json", ".pt"))
        assert len(files) in (1, 9), [p.name for p in files]  # importances, or nine circuits
        out[folder.name] = {p.name: load_like_mib(p) for p in files}
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mib") / "run"
    run_audit(parse_spec(SPEC), out)
    return out


def _export(*args) -> object:
    return CliRunner().invoke(app, ["export", "mib", *map(str, args)])


def _mean_scores(run: Path) -> tuple[np.ndarray, list[str]]:
    t = pq.read_table(run / "scores_eap.parquet").to_pandas()
    names = pq.read_table(run / "edges.parquet").column("name").to_pylist()
    return np.stack(t["scores"]).astype(np.float64).mean(0), names


def test_importances_load_as_mib_reads_them_with_the_runs_scores(run, tmp_path):
    before = set(tmp_path.iterdir())
    r = _export(run, "--out", tmp_path / "sub", "--model-name", "gpt2", "--task-name", "ioi")
    assert r.exit_code == 0, r.output
    assert set(tmp_path.iterdir()) - before == {tmp_path / "sub"}  # nothing outside --out
    sub = read_submission(tmp_path / "sub")
    assert list(sub) == ["ioi_gpt2"] and list(sub["ioi_gpt2"]) == ["importances.json"]
    g = sub["ioi_gpt2"]["importances.json"]
    assert g["cfg"] == {"n_layers": 2, "n_heads": 2, "parallel_attn_mlp": False, "d_model": 32}
    assert set(g["edges"]) == g["all_edges"]  # every edge of the model has a score
    mean, names = _mean_scores(run)
    got = np.array([g["edges"][n][0] for n in names])
    np.testing.assert_allclose(got, mean, rtol=1e-5, atol=1e-7)
    # the intervals travel beside it, in a file MIB does not read
    side = pq.read_table(tmp_path / "sub" / "ioi_gpt2" / "circuitstat-edges.parquet").to_pandas()
    assert list(side["name"]) == names and set(side["method"]) == {"eap"}
    np.testing.assert_allclose(side["estimate"], mean, rtol=1e-5, atol=1e-7)
    assert (side["ci_low"] <= side["estimate"]).all() and side["estimand"].str.len().min() > 0


def test_nine_circuits_hold_at_most_their_share_of_the_top_edges(run, tmp_path):
    r = _export(run, "--out", tmp_path, "--model-name", "gpt2", "--form", "circuits")
    assert r.exit_code == 0, r.output
    files = read_submission(tmp_path)["induction_gpt2"]
    mean, names = _mean_scores(run)
    E = len(names)
    order = np.argsort(-np.abs(mean), kind="stable")
    sizes = []
    for frac in MIB_GRID[:-1]:
        g = files[f"edges_{100 * frac:g}pct.json"]
        kept = {n for n, (_, inside) in g["edges"].items() if inside}
        sizes.append(len(kept))
        assert len(kept) <= int(frac * E)  # "no more than" the README's percentage
        top = {names[i] for i in order[: int(frac * E)]}
        assert kept <= top  # pruned from the top-k by |mean score| (the run's ranking)
        for e in kept:  # pruned: each kept edge's sender is in the circuit
            assert e.split("->")[0] == "input" or g["nodes"][e.split("->")[0]]
    assert sizes == sorted(sizes) and sizes[-1] > 0


def test_existing_export_is_refused_without_force(run, tmp_path):
    assert _export(run, "--out", tmp_path, "--model-name", "gpt2").exit_code == 0
    r = _export(run, "--out", tmp_path, "--model-name", "gpt2", "--form", "circuits")
    assert r.exit_code == 2 and "--force" in r.output
    assert _export(run, "--out", tmp_path, "--model-name", "gpt2", "--form", "circuits", "--force").exit_code == 0
    assert len(read_submission(tmp_path)["induction_gpt2"]) == 9  # the old importances.json is gone
    r = _export(run, "--out", tmp_path / "x")  # a random model has no MIB name
    assert r.exit_code == 2 and "--model-name" in r.output and not (tmp_path / "x").exists()


def test_mib_names_of_the_sources_a_run_records():
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.mib_export import mib_folder, mib_model_name

    assert mib_model_name("hf:openai-community/gpt2") == "gpt2" and mib_model_name("hf:gpt2@main") == "gpt2"
    assert mib_model_name("hf:Qwen/Qwen2.5-0.5B") == "qwen2.5" and mib_model_name("random:gpt2?n_layer=2") is None
    assert mib_folder("arc_easy", "llama3") == "arc-easy_llama3"  # MIB writes the task's underscores as hyphens
    for bad in ("../x", "a/b", ""):
        with pytest.raises(InputError, match="--task-name"):
            mib_folder(bad, "gpt2")


MIB_PRUNE_FIXTURE = Path(__file__).parents[1] / "fixtures" / "mib-prune-eapig-7af394a.json"


def _digest(names) -> str:
    import hashlib

    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()


def _fixture_scores(case: dict, fixture: dict):
    """(graph, the case's float32 scores), checked against the digest recorded with MIB's output."""
    import hashlib

    from circuitstat.circuits.graph import ComponentGraph

    g = ComponentGraph(case["n_layers"], case["n_heads"], parallel=case["parallel"])
    scores = np.random.default_rng(case["seed"]).standard_t(2, size=g.n_edges).astype(np.float32)
    key = f"{case['n_layers']}x{case['n_heads']}-{case['seed']}"
    assert hashlib.sha256(scores.tobytes()).hexdigest() == fixture["score_sha256"][key], \
        "numpy's generator gives other scores than the fixture's: rerun tests/fixtures/make_mib_prune.py"
    return g, scores


@pytest.mark.parametrize("parallel", [False, True])
def test_prune_mib_and_complete_equal_mibs_own_graph_on_all_nine_sizes(parallel):
    """``prune: mib`` is EAP-IG's apply_topn(n, prune=True) (the commit MIB pins), ``prune: complete`` what its
    evaluate_graph patches after pruning again: edge for edge and node for node against EAP-IG's own Graph, run
    outside this repository (tests/fixtures/make_mib_prune.py), signed and absolute, on all nine sizes."""
    from circuitstat.pipelines.mib_export import MIB_CIRCUIT_FRACTIONS, circuit_file, mib_circuits

    fixture = json.loads(MIB_PRUNE_FIXTURE.read_text())
    cases = [c for c in fixture["cases"] if c["parallel"] == parallel]
    assert len(cases) == 2 * len(MIB_CIRCUIT_FRACTIONS)
    g, scores = _fixture_scores(cases[0], fixture)
    differ = 0
    for absolute in (True, False):
        ranking = "absolute" if absolute else "signed"
        got = {mode: mib_circuits(scores, g, ranking=ranking, prune=mode) for mode in ("mib", "complete")}
        for case in (c for c in cases if c["absolute"] == absolute):
            name = circuit_file(case["fraction"])
            assert case["n"] == int(case["fraction"] * g.n_edges)
            for mode, want in (("mib", case["one_pass"]), ("complete", case["evaluated"])):
                c = got[mode][name]
                edges = [g.edge_names[i] for i in np.flatnonzero(c.edges)]
                nodes = [g.nodes[i] for i in np.flatnonzero(c.nodes) if g.nodes[i] != "logits"]
                assert (len(edges), len(nodes)) == (want["n_edges"], want["n_nodes"]), (ranking, name, mode)
                assert _digest(edges) == want["sha256"] and _digest(nodes) == want["nodes_sha256"], (ranking, name, mode)
                if want["edges"] is not None:
                    assert sorted(edges) == want["edges"]
            differ += case["one_pass"]["sha256"] != case["evaluated"]["sha256"]
    assert differ >= 6  # the two modes are different circuits at most sizes: the fixture tells them apart


def test_prune_mib_keeps_dangling_edges_that_complete_removes():
    """Negative control on a hand-made circuit: a head fed only by a head that has no input of its own. One pass
    removes a0.h0 (no in-edge), but a1.h0 had its in-edge when the pass looked, so a1.h0 -> logits stays."""
    from circuitstat.circuits.circuit import Circuit
    from circuitstat.circuits.graph import ComponentGraph

    g = ComponentGraph(3, 2)
    c = Circuit.from_edges(g, ["a0.h0->a1.h0<v>", "a1.h0->logits", "input->m2", "m2->logits"])
    names = lambda circuit: sorted(g.edge_names[i] for i in np.flatnonzero(circuit.edges))  # noqa: E731
    assert names(c.prune("mib")) == ["a1.h0->logits", "input->m2", "m2->logits"]
    assert names(c.prune("complete")) == ["input->m2", "m2->logits"]
    assert names(c.prune("mib").prune("mib")) == names(c.prune("complete"))  # MIB's second prune() completes it
    with pytest.raises(ValueError, match="prune"):
        c.prune("twice")


def test_export_writes_the_chosen_pruning(run, tmp_path):
    from circuitstat.circuits.scores import ScoreMatrix
    from circuitstat.pipelines.mib_export import mib_circuits

    sm = ScoreMatrix.read(run, "scores_eap")
    for mode in ("mib", "complete"):
        r = _export(run, "--out", tmp_path / mode, "--model-name", "gpt2", "--form", "circuits", "--prune", mode)
        assert r.exit_code == 0, r.output
        files = read_submission(tmp_path / mode)["induction_gpt2"]
        want = mib_circuits(sm, ranking="absolute", prune=mode)
        for name, c in want.items():
            kept = {n for n, (_, inside) in files[name]["edges"].items() if inside}
            assert kept == {sm.graph.edge_names[i] for i in np.flatnonzero(c.edges)}, (mode, name)
        side = pq.read_table(tmp_path / mode / "induction_gpt2" / "circuitstat-edges.parquet")
        assert json.loads(side.schema.metadata[b"circuitstat.provenance"])["prune"] == mode
    r = _export(run, "--out", tmp_path / "x", "--model-name", "gpt2", "--form", "circuits", "--prune", "twice")
    assert r.exit_code == 2 and not (tmp_path / "x").exists()
