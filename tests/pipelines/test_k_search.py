"""The circuit choice's fine search over k (circuitstat.pipelines.k_search) and the faithfulness note of a circuit that
connects no input to the logits (issue 38: the demo chose k = 50 of 81 from the grid 5/10/20/50, and showed
f = 0.000 [0.000, 0.000] at k = 5 unexplained)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import circuitstat.pipelines.runs.audit.common as audit  # faithfulness_with_search and the faithfulness_table it calls
from circuitstat.pipelines.k_search import search_k
from circuitstat.pipelines.spec import parse_spec
from circuitstat.core.rundir import RunDir
from circuitstat.core.schema import fill
from circuitstat.reports.verdicts import choose_k

GRID = [5, 10, 20, 50]


def _lower(k: int) -> float:
    """A faithfulness lower bound that reaches the 0.8 bar from k = 33 up."""
    return 0.95 if k >= 33 else 0.5


def _table(ks, source="grid") -> dict:
    n = len(ks)
    return {"method": ["exact"] * n, "k": np.asarray(ks), "f_ratio": np.full(n, 0.9), "f_ci_low": np.full(n, np.nan),
            "f_selected_ci_low": np.asarray([_lower(k) for k in ks]), "f_selected_ci_high": np.full(n, 1.0),
            "f_selected": np.full(n, 0.97), "cpr": np.full(n, math.nan), "cmd": np.full(n, math.nan),
            "area_note": [""] * n, "k_source": [source] * n}


def test_search_walks_down_every_k_and_counts_its_evaluations():
    calls = []

    def evaluate(k):
        calls.append(k)
        return _table([k], "search")

    extra, why = search_k(evaluate, _table(GRID), budget=64, bar=0.8)
    assert calls == list(range(49, 31, -1)) and len(extra) == 18 and why == "k = 32 fails the bar"
    calls.clear()
    extra, why = search_k(evaluate, _table(GRID), budget=5, bar=0.8)
    assert calls == [49, 48, 47, 46, 45] and "budget of 5" in why
    calls.clear()
    low_top = _table(GRID)
    low_top["f_selected_ci_low"][-1] = 0.7  # the grid's largest fails: nothing below it is tested
    assert search_k(evaluate, low_top, budget=64, bar=0.8)[0] == [] and calls == []
    # a grid k on the way is reused, not evaluated again
    assert len(search_k(evaluate, _table([5, 10, 40, 50]), budget=64, bar=0.8)[0]) == 17


def test_audit_stage_adds_search_rows_and_the_verdict_chooses_the_smallest_k(tmp_path, monkeypatch):
    calls = []

    def fake_table(model, task, S, method, ks, plan, spec, seed=None, **kw):  # kw: a verified method's strata
        calls.append(list(ks))
        t = _table(ks)
        t["method"] = [method] * len(ks)
        return t

    monkeypatch.setattr(audit, "faithfulness_table", fake_table)
    spec = parse_spec({"model": "random:gpt2", "task": {"name": "induction"}, "k": GRID}, "<t>")
    assert spec.k_search == 64
    out = audit.faithfulness_with_search(None, None, None, "exact", GRID, None, spec, 0)
    assert calls[0] == GRID and calls[1:] == [[k] for k in range(49, 31, -1)]  # 18 extra evaluations, one k each
    assert out["k_source"].count("search") == 18 and sorted(out["k"])[:5] == [5, 10, 20, 32, 33]
    none = audit.faithfulness_with_search(None, None, None, "exact", GRID, None, spec.model_copy(update={"k_search": 0}), 0)
    assert list(none["k"]) == GRID  # k_search: 0 is the grid only
    with RunDir(tmp_path / "run", spec={"ranking": "absolute"}, seed=0) as run:
        run.write_table("faithfulness_vs_k", fill("faithfulness_vs_k", out, len(out["k"])))
    from circuitstat.reports.tableset import Tables

    k, why = choose_k(Tables(tmp_path / "run"), "exact")
    assert k == 33 and "every k from k = 50, 18 of them evaluated beyond the k grid" in why


def test_choice_never_skips_an_unevaluated_k(tmp_path):
    """A search stopped by its budget at 45 leaves 44..21 untested: the choice stops there, however the grid's
    k = 20 did."""
    rows = _table([5, 10, 20, 50])
    rows["f_selected_ci_low"][2] = 0.9  # k = 20 passes on the grid
    extra = _table(list(range(49, 44, -1)), "search")
    merged = {c: list(rows[c]) + list(extra[c]) for c in rows}
    with RunDir(tmp_path / "run", spec={}, seed=0) as run:
        run.write_table("faithfulness_vs_k", fill("faithfulness_vs_k", merged, len(merged["k"])))
    from circuitstat.reports.tableset import Tables

    assert choose_k(Tables(tmp_path / "run"), "exact")[0] == 45


def test_a_circuit_without_an_input_to_logits_path_says_why_f_is_zero():
    from circuitstat.circuits import load_model
    from circuitstat.pipelines.runs.audit.tables import faithfulness_table
    from circuitstat.pipelines.build import build_task
    from circuitstat.stats import ResamplingPlan

    model = load_model("random:gpt2?n_layer=2&n_head=2&n_embd=16&vocab_size=64&n_positions=32")
    task = build_task(model, "induction", n=16, seed=0, seq_len=5)
    idx = {n: i for i, n in enumerate(model.graph.edge_names)}
    S = np.zeros((16, len(idx)), np.float32)
    for rank, name in enumerate(["input->a0.h0<v>", "input->a0.h1<v>", "a0.h0->logits", "a0.h1->logits"]):
        S[:, idx[name]] = -10.0 + rank  # |effect| order: the two input edges first, then their heads' outputs
    spec = parse_spec({"model": "random:gpt2", "task": {"name": "induction", "n": 16}, "k": [2, 4],
                       "bootstrap": {"n_resamples": 40}}, "<t>")
    t = faithfulness_table(model, task, S, "exact", [2, 4], ResamplingPlan.bootstrap(16, 40, 0), spec, seed=0)
    assert list(t["connected"]) == [False, True]
    # the counterfactual's values, patched in as deltas: zero up to float rounding, in every resample (f_se)
    assert max(abs(t["f_ratio"][0]), abs(t["f_se"][0])) < 1e-4
    # f_ci is Fieller's set: this random model's full effect over the empty circuit has t ≈ 2 on 16 prompts, at the
    # critical t, so the set may be the whole line (with its note) or bounded, but it holds 0 either way
    assert t["f_ci_method"][0] == "fieller" and t["f_ci_low"][0] <= 0 <= t["f_ci_high"][0]
    assert (t["f_ci_note"][0] == "") == bool(np.isfinite([t["f_ci_low"][0], t["f_ci_high"][0]]).all())
    assert t["circuit_note"][0].startswith("the top-2 edges form no path from input to logits") and t["circuit_note"][1] == ""
    assert t["f_ratio"][1] != pytest.approx(0, abs=1e-6) and t["k_source"] == ["grid", "grid"]


def test_stability_line_reads_the_grids_nearest_k_above_a_searched_k(tmp_path):
    from circuitstat.reports.verdicts import verdict

    faith = _table(GRID)
    extra = _table(list(range(49, 31, -1)), "search")
    merged = {c: list(faith[c]) + list(extra[c]) for c in faith}
    stab = {"method": ["exact"] * 4, "k": GRID, "jaccard_data": [0.5, 0.7, 0.85, 0.92],
            "jaccard_data_ci_low": [0.4, 0.6, 0.75, 0.89], "jaccard_data_ci_high": [0.6, 0.8, 0.92, 0.97],
            "jaccard_chance": [0.05, 0.1, 0.14, 0.45]}
    with RunDir(tmp_path / "run", spec={}, seed=0) as run:
        run.write_table("faithfulness_vs_k", fill("faithfulness_vs_k", merged, len(merged["k"])))
        run.write_table("stability_vs_k", fill("stability_vs_k", stab, 4))
    v = verdict(tmp_path / "run")
    line = next(ln for ln in v.lines if ln.label == "stability")
    assert v.k == 33 and line.cis[0].key == (("method", "exact"), ("k", 50)) and line.verdict == "stable"
    assert "so at k = 50, the grid's nearest k above the chosen 33" in line.text()
