"""Minimality on an unpruned top-k circuit (issue 43 item 3): an edge on no input -> logits path inside the circuit
has a knockout effect of 0 (about 4e-16 in the report), and is named redundant *with that reason* by the stage's
table, the claims check and the report, rather than left to read as a finding."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
from builders import make_run

from circuitstat.core.schema import DANGLING_REASON


def test_dangling_edges_are_those_off_every_input_to_logits_path():
    from circuitstat.circuits.graph import ComponentGraph
    from circuitstat.pipelines.circuit_tests import dangling_edges

    g = ComponentGraph(2, 2)
    names = list(g.edge_names)
    circuit = np.zeros(g.n_edges, dtype=bool)
    path = ["input->a0.h0<v>", "a0.h0->a1.h0<k>", "a1.h0->logits"]
    for e in path + ["a1.h1->logits", "input->a0.h1<q>"]:  # a1.h1 reads nothing; a0.h1 writes nowhere
        circuit[names.index(e)] = True
    got = {names[i] for i in np.flatnonzero(dangling_edges(g, circuit))}
    assert got == {"a1.h1->logits", "input->a0.h1<q>"}
    full = np.zeros(g.n_edges, dtype=bool)
    for e in path:
        full[names.index(e)] = True
    assert not dangling_edges(g, full).any()  # a connected circuit has none (negative control)


def test_claims_check_and_report_give_the_reason(tmp_path):
    from circuitstat.pipelines.claims import check
    from circuitstat.reports.html.page import render_report

    from report_builders import write_recorded as write_table  # edits recorded, as the run records what it writes

    run = make_run(tmp_path / "run", circuit_tests=True)
    mini = pq.read_table(run / "circuit_minimality.parquet").to_pydict()
    assert mini["dangling"] == [False] * 3  # the builder fills the new column from the schema
    mini["pvalue_adjusted"] = [0.001, 1.0, 0.8]
    mini["effect"] = [4e-16, 2.0, 0.5]
    mini["dangling"] = [True, False, False]
    write_table(mini, run / "circuit_minimality.parquet")
    tests = pq.read_table(run / "circuit_tests.parquet").to_pydict()
    tests["pvalue"] = [0.001 if t == "minimality" else p for t, p in zip(tests["test"], tests["pvalue"])]
    write_table(tests, run / "circuit_tests.parquet")
    claims = tmp_path / "claims.yaml"
    claims.write_text("run: run\nclaims:\n  - kind: circuit_minimal\n    alpha: 0.05\n")
    (result,) = check(claims).results
    assert result.status == "fail" and f"{mini['name'][0]} (p = " in result.reason
    assert DANGLING_REASON in result.reason
    page = render_report(run).read_text(encoding="utf-8")
    assert "redundant (dangling: on no input -&gt; logits path" in page
    # an edge redundant by measurement is not given the reason (negative control)
    mini["dangling"] = [False, False, False]
    write_table(mini, run / "circuit_minimality.parquet")
    (result,) = check(claims).results
    assert result.status == "fail" and DANGLING_REASON not in result.reason
