"""The report of a run over a large graph stays readable (issue 36, item 4): at 231,877 edges (24 layers x 16
heads) the page is a bounded number of bytes, names the edge count and how many edges it shows, and says where
the rest are; the claims check and the circuit command on such a run read no score matrix whole."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from report_builders import _heads, _stability, graph_edges

from circuitstat.core.rundir import RunDir
from circuitstat.core.schema import TABLES
from circuitstat.core.tables import write_table
from circuitstat.reports.html import render_report
from circuitstat.core.run_check import record_tables

LAYERS, HEADS = 24, 16
METHODS = ("exact", "eap")


def _write(name: str, cols: dict, path: Path) -> None:
    """Write table ``name`` from numpy columns, completed to its registered schema (blank columns filled)."""
    n = len(next(iter(cols.values())))
    blank = {pa.float64(): np.full(n, np.nan), pa.int64(): np.full(n, -1), pa.string(): np.full(n, "", object),
             pa.bool_(): np.zeros(n, bool)}
    write_table({c.name: cols[c.name] if c.name in cols else blank[c.type] for c in TABLES[name].columns}, path)
    record_tables(path.parent, [path])  # a table the run wrote: recorded in its manifest


def _write_edges(edges: dict, path: Path) -> None:
    write_table(edges, path)
    record_tables(path.parent, [path])


def make_large_run(root: Path, seed: int = 0) -> tuple[Path, int]:
    """A synthetic audit's tables over the 24-layer, 16-head graph (no model, no scores): (run directory, E)."""
    rng = np.random.default_rng(seed)
    run = root / "run"
    spec = {"model": "zoo:big", "task": {"name": "induction", "n": 64}, "methods": list(METHODS), "ranking": "absolute",
            "seed": 7, "bootstrap": {"confidence_level": 0.95}}
    with RunDir(run, spec=spec, seed=7):
        pass
    edges = graph_edges(LAYERS, HEADS)
    E = len(edges["index"])
    names = np.asarray(edges["name"], dtype=object)
    _write_edges({k: np.asarray(v, dtype=object if isinstance(v[0], str) else None) for k, v in edges.items()},
                 run / "edges.parquet")
    effect = 0.4 * rng.standard_normal(E) * np.exp(-rng.permutation(E) / 20.0)
    stats = {c: [] for c in ("method", "edge", "name", "estimate", "se", "ci_low", "ci_high", "p", "q", "n",
                             "no_tail_seen")}
    for j, m in enumerate(METHODS):
        est, se = effect * (1 + 0.1 * j), 0.05 + 0.02 * rng.random(E)
        p = np.clip(np.exp(-np.abs(est / se)), 1e-12, 1)
        for c, v in (("method", np.full(E, m, dtype=object)), ("edge", np.arange(E)), ("name", names),
                     ("estimate", est), ("se", se), ("ci_low", est - 1.96 * se), ("ci_high", est + 1.96 * se),
                     ("p", p), ("q", np.minimum(p * E / (np.argsort(np.argsort(p)) + 1), 1)),
                     ("n", np.full(E, 64)), ("no_tail_seen", np.ones(E, bool))):
            stats[c].append(v)
    _write("edge_stats", {c: np.concatenate(v) for c, v in stats.items()}, run / "edge_stats.parquet")
    a = 0.8 * effect + rng.normal(0, 0.05, E)
    _write("approximation", {"method": np.full(E, "eap", dtype=object), "edge": np.arange(E), "name": names,
                             "exact_mean": effect, "approx_mean": a, "bias": a - effect}, run / "approximation.parquet")
    _write("approximation_summary", {"method": np.array(["eap"], dtype=object), "spearman": np.array([0.9]),
                                     "r2": np.array([0.8]), "k": np.array([20])}, run / "approximation_summary.parquet")
    for name, table in zip(("inclusion", "stability_vs_k", "faithfulness_vs_k"),
                           _stability(effect, list(names), METHODS, rng)):
        _write(name, {c: np.asarray(v, dtype=object if isinstance(v[0], str) else None) for c, v in table.items()},
               run / f"{name}.parquet")
    for name, table in zip(("heads", "layers"), _heads(LAYERS, HEADS, rng)[:2]):
        _write(name, {c: np.asarray(v, dtype=object if isinstance(v[0], str) else None) for c, v in table.items()},
               run / f"{name}.parquet")
    return run, E


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> tuple[Path, int]:
    return make_large_run(tmp_path_factory.mktemp("large"))


@pytest.mark.slow
def test_report_of_a_large_graph_is_bounded_and_names_what_it_shows(large):
    run, E = large
    assert E == 231_877
    path = render_report(run)
    size = path.stat().st_size
    assert size < 4_000_000, size  # a few MB, never a row per edge (231,877 rows would be tens of MB)
    page = path.read_text()
    assert f"of {E:,} edges" in page
    forest = re.search(r'<p class="shown">(showing (\d+) of ([\d,]+) edges[^<]*)</p>', page)
    assert forest and int(forest.group(2)) == 20 and forest.group(3) == f"{E:,}"
    assert "query edge_stats.parquet for the rest" in forest.group(1)
    assert len(re.findall(r"<tr", page)) < 2_000
