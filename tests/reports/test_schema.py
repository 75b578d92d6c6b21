"""The one schema of run tables (core/schema.py): writers validate against it, readers use its names."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from circuitstat.core.rundir import RunDir
from circuitstat.core.schema import TABLES, SchemaError, claimable, columns, fill, schema_for

ROOT = Path(__file__).resolve().parents[2]


def _full(name: str, n: int = 2) -> dict:
    return fill(name, {}, n)


def test_every_schema_builds_and_has_unique_column_names() -> None:
    for name, t in TABLES.items():
        assert t.name == name
        assert len(set(t.names)) == len(t.names), name
        assert t.arrow().names == list(t.names)
        assert all(c.doc for c in t.columns), name


def test_interval_columns_name_what_they_cover() -> None:
    # docs/calibration.md: every interval names its estimand; a *_ci_low/_high column without "covers" fails
    for t in TABLES.values():
        for c in t.columns:
            if c.name.endswith(("_ci_low", "_ci_high")) or c.name in ("ci_low", "ci_high"):
                if t.name == "head_details" and c.name.startswith("stability_ci"):
                    continue
                assert "covers" in c.doc, f"{t.name}.{c.name}"


def test_rundir_writes_a_table_that_matches(tmp_path: Path) -> None:
    with RunDir(tmp_path / "r", spec={}, seed=0) as run:
        path = run.write_table("stability_vs_k", _full("stability_vs_k"))
    import pyarrow.parquet as pq

    assert pq.read_schema(path).names == list(columns("stability_vs_k"))


@pytest.mark.parametrize("change", ["missing", "extra", "wrong_type"])
def test_rundir_refuses_a_table_that_drifted(tmp_path: Path, change: str) -> None:
    t = _full("edge_stats")
    if change == "missing":
        del t["no_tail_seen"]
    elif change == "extra":
        t["meets_0_8"] = [True, False]
    else:
        t["k" if "k" in t else "n"] = [0.5, 1.5]  # a float where an integer is registered
    with RunDir(tmp_path / "r", spec={}, seed=0) as run:
        with pytest.raises(SchemaError, match="edge_stats"):
            run.write_table("edge_stats", t)
    assert not (tmp_path / "r" / "edge_stats.parquet").exists()


def test_integers_in_float_columns_and_empty_columns_are_cast(tmp_path: Path) -> None:
    t = _full("summary", 0)
    t["value"] = pa.array([], pa.null())
    with RunDir(tmp_path / "r", spec={}, seed=0) as run:
        run.write_table("summary", {**_full("summary", 1), "value": [3]})
        run.write_table("cond/summary", t)  # nested outputs are validated by their base name
        assert run.table("summary").schema.field("value").type == pa.float64()
        with pytest.raises(SchemaError):
            run.write_table("cond/summary", {"item": ["x"]})


def test_unregistered_tables_are_written_as_they_are(tmp_path: Path) -> None:
    with RunDir(tmp_path / "r", spec={}, seed=0) as run:
        run.write_table("my_table", {"anything": np.arange(3)})
    assert schema_for("my_table") is None


def test_fill_refuses_a_column_the_schema_does_not_know() -> None:
    with pytest.raises(KeyError, match="rbo_means"):
        fill("stability_vs_k", {"rbo_means": [1.0]}, 1)
    got = fill("heads", {"layer": [0], "head": [1]}, 1)
    assert got["n_refits"] == [-1] and np.isnan(got["stability"][0]) and got["match"] == [""]


def test_claim_statistics_are_the_claimable_columns() -> None:
    from circuitstat.pipelines import claims

    pairs = {claims.CircuitStabilityClaim: "stability_vs_k", claims.FaithfulnessClaim: "faithfulness_vs_k",
             claims.HeadStabilityClaim: "heads", claims.LayerStabilityClaim: "layers",
             claims.ApproximationClaim: "approximation_summary", claims.SinkClaim: "sink_heads",
             claims.TokenDropClaim: "token_importance",
             claims.SinkStabilityClaim: ("sink_stability", "sink_matching"),
             claims.TokenStabilityClaim: "token_stability"}
    for cls, tables in pairs.items():  # a kind that answers items of two tables takes either table's columns
        expect = tuple(dict.fromkeys(c for t in ([tables] if isinstance(tables, str) else tables) for c in claimable(t)))
        assert typing.get_args(cls.model_fields["statistic"].annotation) == expect
    # the Monte Carlo spread is not a data-level interval: it must not be claimable
    assert "jaccard_ci_low" not in claimable("stability_vs_k")
    assert {"jaccard_data_ci_low", "phi_data_ci_low", "jaccard_pop_ci_low"} <= set(claimable("stability_vs_k"))


def _string_calls(path: Path, method: str, own_tables: dict[str, str] | None = None) -> list[tuple[int, str, list[str]]]:
    """(line, table, columns) of every `<x>.method("table", [..literal columns..])` call in a file.

    With ``own_tables`` ({function name: table}), a call inside such a function whose table is
    ``<claim>.table`` (a claim evaluator reading its kind's own table) counts as that table."""
    out = []
    tree = ast.parse(path.read_text(), filename=str(path))
    scopes = [(f.name, f) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)] + [("", tree)]
    seen = set()
    for scope, root in scopes:
        for node in ast.walk(root):
            if id(node) in seen or not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                                        and node.func.attr == method and node.args):
                continue
            seen.add(id(node))
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                table = arg.value
            elif isinstance(arg, ast.Attribute) and arg.attr == "table" and scope in (own_tables or {}):
                table = own_tables[scope]
            else:
                continue
            cols = []
            if len(node.args) > 1 and isinstance(node.args[1], (ast.List, ast.Tuple)):
                cols = [e.value for e in node.args[1].elts if isinstance(e, ast.Constant)]
            out.append((node.lineno, table, cols))
    return out


def test_readers_ask_only_for_registered_columns() -> None:
    """The HTML report (Tables.need) and the claims (run.rows) read names the schema knows."""
    from circuitstat.pipelines.claims.kinds import KINDS

    own = {k.evaluate.__name__: k.table for k in KINDS.values()}  # evaluators read c.table
    claims_dir = ROOT / "pipelines" / "claims"
    checked = claims_checked = 0
    readers = [(p, "need") for p in sorted((ROOT / "reports" / "html").glob("*.py"))]  # the report's sections
    for path, method in (*readers, *((p, "rows") for p in sorted(claims_dir.glob("*.py")))):
        for line, table, cols in _string_calls(path, method, own):
            schema = schema_for(table)
            if schema is None:
                continue
            for c in cols:
                assert c in schema.names, f"{path.name}:{line} reads {table}.{c}, not in core/schema.py"
                checked += 1
                claims_checked += path.parent == claims_dir
    assert checked >= 10  # the scan found the readers (a refactor that hides them must update this test)
    assert claims_checked >= 10  # ... the claim evaluators' among them


def test_an_audit_writes_exactly_the_registered_columns(tmp_path: Path) -> None:
    """Every registered table an audit writes has the schema's columns in order (validated on write)."""
    import pyarrow.parquet as pq

    from circuitstat.pipelines.runs.audit.run import run_audit
    from circuitstat.pipelines.spec import parse_spec

    spec = parse_spec({"model": "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3",
                       "task": {"name": "induction", "n": 12, "options": {"seq_len": 5}},
                       "methods": ["exact", "eap"], "batch_size": 4, "bootstrap": {"n_resamples": 40},
                       "k": [3, 6]}, "<test>")
    run_audit(spec, tmp_path / "run")
    written = {p.stem for p in (tmp_path / "run").glob("*.parquet")}
    assert {"edges", "edge_stats", "stability_vs_k", "inclusion", "faithfulness_vs_k", "approximation",
            "approximation_summary"} <= written
    for name in written:
        schema = schema_for(name)
        if schema is not None:
            assert pq.read_schema(tmp_path / "run" / f"{name}.parquet").names == list(schema.names), name


def test_optional_columns_may_be_absent_but_not_misspelt(tmp_path: Path) -> None:
    base = fill("summary", {"item": ["x"], "value": [1.0]}, 1)
    minimal = {k: base[k] for k in ("item", "value", "ci_low", "ci_high", "verdict")}
    with RunDir(tmp_path / "r", spec={}, seed=0) as run:
        run.write_table("summary", minimal)  # the audit's summary: no p-values
        run.write_table("a/summary", {**minimal, "pvalue_holm": [0.01]})  # the head study's adds them
        assert run.table("a/summary").column_names == ["item", "value", "ci_low", "ci_high", "verdict", "pvalue_holm"]
        with pytest.raises(SchemaError, match="p_value_holm"):
            run.write_table("b/summary", {**minimal, "p_value_holm": [0.01]})


def test_the_shared_run_builder_writes_schema_tables(audit_run: Path) -> None:
    """tests/builders.py (the claims and HTML fixtures' run builder) writes what the audit writes."""
    import pyarrow.parquet as pq

    written = {p.stem: pq.read_schema(p).names for p in audit_run.glob("*.parquet")}
    assert {"edges", "edge_stats", "stability_vs_k", "faithfulness_vs_k", "heads"} <= set(written)
    for name, cols in written.items():
        assert cols == list(columns(name)), name
