"""One name per concept (n_resamples, n_permutations, seed, ranking): the old names still work, with a warning
that names the new one, so no user's spec, script or command line breaks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from circuitstat.core.errors import DeprecatedNameWarning, InputError


def _read(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in caught if issubclass(w.category, DeprecatedNameWarning)]


def test_old_audit_spec_key_is_read_with_a_warning_naming_the_new_one() -> None:
    from circuitstat.pipelines.spec import parse_spec

    base = {"model": "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64"}
    spec, msgs = _read(lambda: parse_spec({**base, "heads": {"n_boot": 50}}))
    assert spec.heads.n_resamples == 50 and spec == parse_spec({**base, "heads": {"n_resamples": 50}})
    assert len(msgs) == 1 and "'heads.n_boot'" in msgs[0] and "'heads.n_resamples'" in msgs[0]
    _, none = _read(lambda: parse_spec({**base, "heads": {"n_resamples": 50}}))
    assert none == []
    with pytest.raises(InputError, match="heads.n_resamples only"):
        parse_spec({**base, "heads": {"n_boot": 50, "n_resamples": 60}})
    with pytest.raises(InputError, match="greater than or equal to 10"):  # the old key is validated as the new one
        parse_spec({**base, "heads": {"n_boot": 3}})


def test_old_head_study_plan_key_is_read(tmp_path) -> None:
    from circuitstat.pipelines.runs.heads.study import load_head_study_plan

    path = tmp_path / "plan.yaml"
    path.write_text("start: quick\nn_perm: 199\n")
    plan, msgs = _read(lambda: load_head_study_plan(path))
    assert plan.n_permutations == 199 and any("'n_permutations'" in m for m in msgs)


def test_old_estimator_parameters_are_read() -> None:
    from circuitstat.pipelines.runs.tokens.run import TokenContributions
    from circuitstat.pipelines.runs.heads.stability import HeadStability

    est, msgs = _read(lambda: HeadStability(n_boot=30, n_boot_cka=5, n_perm=199, random_state=7))
    assert (est.n_resamples, est.n_resamples_cka, est.n_permutations, est.seed) == (30, 5, 199, 7)
    assert sorted(m.split("'")[3] for m in msgs) == ["n_permutations", "n_resamples", "n_resamples_cka", "seed"]
    assert "n_boot" not in est.get_params() and est.get_params()["n_resamples"] == 30
    again, _ = _read(lambda: HeadStability().set_params(n_boot=30))
    assert again.n_resamples == 30
    with pytest.raises(InputError, match="'seed' only"):
        HeadStability(random_state=1, seed=2)
    tc, msgs = _read(lambda: TokenContributions(random_state=4))
    assert tc.seed == 4 and msgs


def test_old_ranking_keyword_of_circuits_and_curves() -> None:
    from circuitstat.circuits.circuit import Circuit
    from circuitstat.circuits.graph import ComponentGraph

    g = ComponentGraph(2, 2)
    s = np.random.default_rng(0).standard_normal(g.n_edges)
    old, msgs = _read(lambda: Circuit.greedy(s, 4, absolute=True, graph=g))
    assert old == Circuit.greedy(s, 4, ranking="absolute", graph=g) and "ranking='absolute'" in msgs[0]
    node = np.random.default_rng(1).standard_normal(g.n_senders)
    old, msgs = _read(lambda: Circuit.from_node_scores(node, 2, absolute=False, graph=g))
    assert old == Circuit.from_node_scores(node, 2, ranking="signed", graph=g) and msgs


def test_old_cli_flag_of_heads_is_read() -> None:
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    # refused before any model loads (one model), so only the flag handling runs
    r = CliRunner().invoke(app, ["heads", "--models", "a", "--n-boot", "50", "--out", "x"])
    assert r.exit_code == 2 and "at least 2 models" in r.output
    r = CliRunner().invoke(app, ["heads", "--help"])
    assert "--n-resamples" in r.output and "--n-boot" not in r.output  # the old flag is hidden


def _old_name(path, false_at: str | None = None) -> None:
    """Rewrite a run table as a run from before issue 34 wrote it: its tail flag called interval_reliable (the
    provenance kept), with the row of edge ``false_at`` flagged."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    flag = t.column("no_tail_seen").to_pylist()
    if false_at is not None:
        names = t.column("edge_name").to_pylist()
        flag = [f and n != false_at for f, n in zip(flag, names)]
    old = t.drop_columns(["no_tail_seen"]).append_column("interval_reliable", pa.array(flag, pa.bool_()))
    pq.write_table(old.replace_schema_metadata(t.schema.metadata), path)
    from circuitstat.core.run_check import record_tables

    record_tables(path.parent, [path])  # written by that old run: recorded in its manifest


def test_old_runs_tail_flag_interval_reliable_is_read_reported_and_checked_as_no_tail_seen(tmp_path) -> None:
    """The per-edge mean tables' flag was renamed interval_reliable -> no_tail_seen (it cannot promise coverage):
    a run written before reads, reports, checks and compares as if written with the new name."""
    import pyarrow.parquet as pq
    from builders import make_run

    from circuitstat.core.query import query
    from circuitstat.core.run_tables import RunTables
    from circuitstat.core.tables import read_provenance, read_table
    from circuitstat.pipelines.claims import evaluate_claims, parse_claims
    from circuitstat.reports.compare import compare_runs
    from circuitstat.reports.html.page import render_report
    from circuitstat.reports.verdicts import verdict

    new = make_run(tmp_path / "new", verified=True)
    run = make_run(tmp_path / "old", verified=True)
    _old_name(run / "edge_stats.parquet")
    _old_name(run / "verified.parquet", false_at="a0.h3->a1.h5<k>")
    assert "interval_reliable" in pq.read_schema(run / "edge_stats.parquet").names  # the file has the old name
    t = read_table(run / "edge_stats.parquet")
    assert "no_tail_seen" in t.column_names and "interval_reliable" not in t.column_names
    assert t.column("no_tail_seen").to_pylist() == read_table(new / "edge_stats.parquet").column("no_tail_seen").to_pylist()
    assert read_provenance(t) and read_table(run / "edge_stats.parquet", ["no_tail_seen"]).num_columns == 1
    assert "no_tail_seen" in RunTables(run, ("verified",), "verified").to_table().column_names
    # reported: a1.h5->logits rests on a few prompts, in the verdict and the forest plot's table
    top = next(ln for ln in verdict(run).lines if ln.label == "top edges")
    assert top.cis[2].reliable is False and top.cis[2].flag == "no_tail_seen" and "0.800 [0.600, 1.00]!" in top.text()
    assert "! few prompts" in render_report(run).read_text("utf-8")
    # checked: the mean's interval of that edge, and the flagged verified edge, are refused; the others are read
    claims = parse_claims({"claims": [
        {"kind": "edge_effect", "edge": "a1.h5->logits", "method": "exact", "sign": "positive", "max_q": 0.05},
        {"kind": "edge_effect", "edge": "input->a0.h0<q>", "method": "exact", "sign": "positive", "max_q": 0.05},
        {"kind": "verified_edge", "edge": "a0.h3->a1.h5<k>", "method": "eap", "statistic": "ci_low", "min": 0.5},
        {"kind": "verified_edge", "edge": "input->a1.h5<k>", "method": "eap", "statistic": "ci_high", "max": 0.0}]})
    got = [(r.status, r.reason) for r in evaluate_claims(claims, run)]
    assert [s for s, _ in got] == ["error", "pass", "error", "pass"], got
    assert "no_tail_seen = false" in got[0][1] and "no_tail_seen = false" in got[2][1]
    # compared: the old run's flag sits beside the new run's under the new name
    edges = compare_runs(run, new).edges
    assert [r["no_tail_seen_a"] for r in edges] == [r["no_tail_seen_b"] for r in edges]
    assert sum(r["no_tail_seen_a"] is False for r in edges) == 2  # a1.h5->logits, for exact and eap
    # queried: SQL over the old and the new run together sees one column, under the new name
    q = query("SELECT run, count(*) AS n FROM edge_stats WHERE NOT no_tail_seen GROUP BY run ORDER BY run",
              {"new": new, "old": run})
    assert q.to_pydict() == {"run": ["new", "old"], "n": [2, 2]}
