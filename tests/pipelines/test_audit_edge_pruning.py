"""Edge pruning as an audit method: its tables, the stages that do not apply to it, the report, claims, and
its circuit against fit_edge_pruning called directly (circuitstat.pipelines.runs.audit.masks)."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow.parquet as pq
import pytest

from builders import small_mask_audit_spec
from circuitstat.core.errors import InputError
from circuitstat.pipelines.runs.audit.run import run_audit
from circuitstat.pipelines.spec import parse_spec

SPEC = small_mask_audit_spec(["eap", "edge-pruning"], edge_pruning={"steps": 4, "n_refits": 3, "lr": 0.3})


def _without(doc: dict, key: str) -> dict:
    """``doc`` without ``key``: a mask method's section is refused when its method is not run (issue 45 item 6)."""
    return {k: v for k, v in doc.items() if k != key}


def _read(out, name):
    return pq.read_table(out / f"{name}.parquet").to_pandas()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ep") / "run"
    run_audit(parse_spec(SPEC), out)
    return out


def _jaccard_mean(V: np.ndarray, k: int) -> float:
    """Brute force: the mean pairwise Jaccard of the refits' top-k (largest log alpha) edge sets."""
    sets = [set(np.argsort(-v, kind="stable")[:k].tolist()) for v in V]
    return float(np.mean([len(a & b) / len(a | b) for a, b in itertools.combinations(sets, 2)]))


def test_audit_with_edge_pruning_writes_its_tables_and_says_what_does_not_apply(run):
    import json

    stages = json.loads((run / "manifest.json").read_text())["stages"]
    assert all(stages[s]["status"] == "done" for s in ("scores_eap", "masks", "edge_stats", "stability", "faithfulness"))
    assert "scores_edge-pruning" not in stages  # no per-example score matrix
    masks, fits = _read(run, "edge_masks"), _read(run, "mask_fits")
    E = len(_read(run, "edges"))
    assert len(masks) == E and sorted(fits["fit"].unique()) == [0, 1, 2, 3]
    G = np.stack([fits[fits.fit == f].sort_values("edge")["gate"].to_numpy() for f in range(4)])
    assert np.array_equal(masks.sort_values("edge")["refit_frequency"].to_numpy(), (G[1:] > 0.5).mean(0))
    # per-example stages: no rows for edge pruning, and the reason is recorded (never a silent gap)
    assert set(_read(run, "edge_stats")["method"]) == {"eap"}
    notes = _read(run, "method_notes")
    assert {"edge_stats", "approximation"} <= set(notes[notes.method == "edge-pruning"]["table"])
    assert notes["reason"].str.len().min() > 20
    # stability: refits' top-k circuits, Jaccard as brute force computes it; data-level NaN with why
    V = np.stack([fits[fits.fit == f].sort_values("edge")["log_alpha"].to_numpy() for f in (1, 2, 3)])
    stab = _read(run, "stability_vs_k").set_index(["method", "k"])
    for k in (3, 6):
        row = stab.loc[("edge-pruning", k)]
        assert row["jaccard_mean"] == pytest.approx(_jaccard_mean(V, k), abs=1e-12)
        assert np.isnan(row["jaccard_data"]) and "refit" in row["data_level_note"]
    inc = _read(run, "inclusion")
    top3 = inc[(inc.method == "edge-pruning") & (inc.k == 3)]
    assert top3["frequency"].sum() == pytest.approx(3.0)  # 3 edges per refit circuit, averaged over refits
    # faithfulness: the refit selection-aware interval, with its estimate inside
    f = _read(run, "faithfulness_vs_k")
    f = f[f.method == "edge-pruning"]
    assert len(f) == 2 and f["f_selected"].notna().all()
    assert ((f["f_selected_ci_low"] <= f["f_selected"]) & (f["f_selected"] <= f["f_selected_ci_high"])).all()
    assert f["f_selected_note"].str.contains("refitted").all()


def test_report_renders_edge_pruning_and_claims_evaluate(run, tmp_path):
    from circuitstat.pipelines.claims import evaluate_claims, parse_claims
    from circuitstat.reports.html.page import render_report

    html = render_report(run, tmp_path / "report.html").read_text()
    assert "edge-pruning: learned edge mask (edge pruning, counterfactual ablation, fixed sparsity penalty)" in html and "No per-edge interval, p- or q-value" in html
    jac = float(_read(run, "stability_vs_k").query("method == 'edge-pruning' and k == 6")["jaccard_mean"].iloc[0])
    claims = parse_claims({"claims": [
        {"kind": "circuit_stability", "method": "edge-pruning", "k": 6, "statistic": "jaccard_mean", "min": 0.0},
        {"kind": "faithfulness", "method": "edge-pruning", "k": 6, "statistic": "f_selected", "min": 2.0},
        {"kind": "edge_effect", "method": "edge-pruning", "edge": "input->a0.h0<q>", "sign": "positive",
         "max_q": 0.05}]})
    stab, faith, edge = evaluate_claims(claims, run)
    assert stab.status == "pass" and stab.observed["jaccard_mean"] == pytest.approx(jac)
    assert faith.status == "fail"  # faithfulness above 2 cannot hold: the claim is evaluated, not skipped
    assert edge.status == "error" and "by design" in edge.reason and "per-example scores" in edge.reason


def test_audit_edge_pruning_circuit_is_fit_edge_pruning_called_directly(run):
    """Oracle: fit 0 is fit_edge_pruning at the spec's seed; refit i is it on resample i of the stability plan with
    child i of that seed (weights = the resample's counts), bit for bit."""
    from circuitstat.circuits.edge_pruning import fit_edge_pruning
    from circuitstat.core.rundir import RunDir
    from circuitstat.core.seeds import spawn_seeds
    from circuitstat.pipelines.runs.audit.run import prepare_audit, refit_plan

    spec = parse_spec(SPEC)
    _, model, task = prepare_audit(spec)
    opts = {"steps": 4, "lr": 0.3, "batch_size": 6}
    fits = _read(run, "mask_fits")
    got = fits[fits.fit == 0].sort_values("edge")["log_alpha"].to_numpy()
    want = fit_edge_pruning(model, task, seed=5, **opts).log_alpha
    assert np.array_equal(got, want.astype(np.float64))
    with RunDir(run, spec=spec.model_dump()) as rd:
        plan = refit_plan(spec, 12, None, rd.stage_seed("resampling"))
    child = spawn_seeds(5, 3)[1]
    want2 = fit_edge_pruning(model, task, weights=plan.counts[1], seed=child, **opts).log_alpha
    assert np.array_equal(fits[fits.fit == 2].sort_values("edge")["log_alpha"].to_numpy(), want2.astype(np.float64))
    assert not np.array_equal(want, want2)


def test_pruning_cost_counts_the_forwards_a_fit_runs(monkeypatch):
    """circuits/plan.py's pruning_cost: example forwards of one fit, counted on the model's run calls."""
    from circuitstat.circuits.edge_pruning import fit_edge_pruning
    from circuitstat.circuits.plan import pruning_cost
    from circuitstat.pipelines.runs.audit.run import prepare_audit

    spec = parse_spec({**_without(SPEC, "edge_pruning"), "methods": ["eap"]})
    _, model, task = prepare_audit(spec)
    rows = []
    real = type(model).run

    def counting(self, ids, *a, **kw):
        rows.append(int(ids.shape[0]))
        return real(self, ids, *a, **kw)

    monkeypatch.setattr(type(model), "run", counting)
    fit_edge_pruning(model, task, steps=3, batch_size=5, seed=0)
    cost = pruning_cost(model.cfg, n=12, positions=int(task.clean.shape[1]), steps=3, batch_size=5)
    assert sum(rows) == cost.forwards == 12 * (3 + 3) and cost.backwards == 12 * 3


def test_plan_prices_edge_pruning_fits_and_refits():
    from circuitstat.circuits.plan import pruning_cost
    from circuitstat.pipelines.runs.audit.stages import audit_flops
    from circuitstat.pipelines.sources import LOCAL

    cfg = LOCAL.skeleton(SPEC["model"]).cfg
    base = {**SPEC, "faithfulness": False}
    with_ep, without = parse_spec(base), parse_spec({**_without(base, "edge_pruning"), "methods": ["eap"]})
    more = parse_spec({**base, "edge_pruning": {**SPEC["edge_pruning"], "n_refits": 7}})
    one = pruning_cost(cfg, n=12, positions=10, steps=4, batch_size=6).flops
    assert audit_flops(with_ep, cfg) - audit_flops(without, cfg) == pytest.approx(4 * one)  # the fit + 3 refits
    assert audit_flops(more, cfg) - audit_flops(with_ep, cfg) == pytest.approx(4 * one)  # 4 more refits


@pytest.mark.parametrize("change, words", [
    ({"level": "node"}, "level: edge"),
    ({"methods": ["edge-pruning"], "tests": {"k": 3}}, "add an attribution method"),
    ({"edge_pruning": {"lr": 0}}, "lr"),
    ({"edge_pruning": {"n_refits": 1}}, "n_refits"),
    ({"edge_pruning": {"objective": "mse"}}, "objective"),
    ({"methods": ["edge-pruning"], "verify": {"n": 4}}, "per-example scores"),
])
def test_edge_pruning_spec_errors(change, words):
    with pytest.raises(InputError, match=words):
        parse_spec({**SPEC, **change})


def test_attribute_command_fits_edge_pruning_and_refuses_its_options_elsewhere(tmp_path):
    """`circuitstat attribute --method edge-pruning`: the mask of fit_edge_pruning at --seed, refits as asked; its
    options with an attribution method are an input error (exit 2)."""
    from typer.testing import CliRunner

    from circuitstat.circuits.edge_pruning import fit_edge_pruning
    from circuitstat.pipelines.runs.audit.run import prepare_audit
    from circuitstat.pipelines.cli import app
    from circuitstat.pipelines.kinds import kind

    args = ["attribute", "--model", SPEC["model"], "--task", "induction", "--task-option", "seq_len=5", "--n", "8",
            "--seed", "2", "--steps", "3", "--objective", "metric"]
    res = CliRunner().invoke(app, [*args, "--method", "edge-pruning", "--n-refits", "2", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "kept by" in res.output and "no per-example scores" in res.output
    masks, fits = _read(tmp_path / "a", "edge_masks"), _read(tmp_path / "a", "mask_fits")
    _, model, task = prepare_audit(
        parse_spec({**_without(SPEC, "edge_pruning"), "task": {**SPEC["task"], "n": 8, "seed": 2}, "methods": ["eap"]}))  # --seed seeds the task too
    want = fit_edge_pruning(model, task, steps=3, objective="metric", seed=2, batch_size=16).log_alpha
    assert np.array_equal(masks.sort_values("edge")["log_alpha"].to_numpy(), want.astype(np.float64))
    assert sorted(fits["fit"].unique()) == [0, 1, 2] and (masks["n_refits"] == 2).all()
    assert kind("attribute").stages(kind("attribute").parse({"model": "m", "method": "edge-pruning"}, "x")) == ["masks"]
    bad = CliRunner().invoke(app, [*args, "--method", "eap", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "--method edge-pruning" in bad.output and not (tmp_path / "b").exists()


def test_attribute_plan_prices_edge_pruning_fits_and_refits():
    """`attribute --method edge-pruning --plan`: an edge-pruning row of (1 + refits) fits, each (3 + steps) forwards
    and steps backwards per prompt."""
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    res = CliRunner().invoke(app, ["attribute", "--model", SPEC["model"], "--task", "induction", "--task-option",
                                   "seq_len=5", "--n", "8", "--method", "edge-pruning", "--steps", "7",
                                   "--n-refits", "2", "--plan"])
    assert res.exit_code == 0, res.output
    row = next(line.split() for line in res.output.splitlines() if line.startswith("edge-pruning"))
    assert row[2:4] == [f"{3 * 8 * (3 + 7):,}", f"{3 * 8 * 7:,}"]


def test_conditional_columns_are_one_half_fit_and_fieller_on_the_other_half(run):
    """Oracle (issue 47, item 8): f_conditional is fit_edge_pruning called directly on one half of the prompts (weight
    1 there, 0 elsewhere), its top-k circuit evaluated by circuits.faithfulness on the other half, and Fieller's set
    of those metrics; the score method's rows are NaN with why; the verdict, the page and a claim read the same."""
    from circuitstat.circuits.edge_pruning import fit_edge_pruning
    from circuitstat.circuits.faithfulness import faithfulness
    from circuitstat.core.rundir import RunDir
    from circuitstat.core.seeds import as_seed_sequence, spawn_seeds
    from circuitstat.pipelines.runs.audit.run import prepare_audit
    from circuitstat.stats.faithfulness_refit import conditional_faithfulness
    from circuitstat.stats.fieller import fieller_faithfulness

    spec = parse_spec(SPEC)
    _, model, task = prepare_audit(spec)
    with RunDir(run, spec=spec.model_dump()) as rd:
        seed = rd.stage_seed("faithfulness")
    halves: list = []

    def refit(rows, s):
        w = np.zeros(12)
        w[rows] = 1.0
        return fit_edge_pruning(model, task, weights=w, seed=s, steps=4, lr=0.3, batch_size=6).log_alpha

    def evaluate(masks, rows):
        halves.append(rows)
        r = faithfulness(model, task, masks, rows=rows, seed=5, batch_size=6, progress=False)
        return r.m_circuit, r.m_clean, r.m_empty

    want = conditional_faithfulness(refit, evaluate, [3, 6], n_obs=12, seed=spawn_seeds(as_seed_sequence(seed), 5)[4])
    r = faithfulness(model, task, want.masks, rows=halves[0], seed=5, batch_size=6, progress=False)
    fi = fieller_faithfulness(r.m_circuit, r.m_clean, r.m_empty)
    f = _read(run, "faithfulness_vs_k").set_index(["method", "k"])
    for i, k in enumerate((3, 6)):
        row = f.loc[("edge-pruning", k)]
        assert row["f_conditional"] == pytest.approx(float(fi.estimate[i]), rel=1e-9, abs=1e-12)
        assert row["f_conditional_ci_low"] == fi.low[i] or row["f_conditional_ci_low"] == pytest.approx(fi.low[i])
        assert row["f_conditional_ci_high"] == fi.high[i] or row["f_conditional_ci_high"] == pytest.approx(fi.high[i])
        assert row["f_conditional_shape"] == fi.shape[i]
        assert "half-fit circuit is the reported one" in row["f_conditional_note"]
        assert "procedure" in row["f_selected_estimand"] and "reported circuit" in row["f_conditional_estimand"]
        eap = f.loc[("eap", k)]
        assert np.isnan(eap["f_conditional"]) and "mask-learned" in eap["f_conditional_note"]
    assert len(halves[0]) == 6  # the other half of the 12 prompts


def test_conditional_interval_reaches_the_page_the_verdict_and_claims(run, tmp_path):
    from circuitstat.pipelines.claims import evaluate_claims, parse_claims
    from circuitstat.reports.html.page import render_report

    row = _read(run, "faithfulness_vs_k").query("method == 'edge-pruning' and k == 6").iloc[0]
    html = render_report(run, tmp_path / "report.html").read_text()
    assert "reported circuit f (mask fit on half, Fieller on the other half)" in html
    assert "procedure-level" in html
    from circuitstat.reports.ci import Ci

    ci = Ci.of("faithfulness_vs_k", row.to_dict(), ("method", "k"), "f_conditional_ci", est="f_conditional", decimals=3)
    assert ci.bounds() and ci.bounds() in html  # the page prints the interval the table (and the claim) hold
    claims = parse_claims({"claims": [
        {"kind": "faithfulness", "method": "edge-pruning", "k": 6, "statistic": "f_conditional", "min": -1e9},
        {"kind": "faithfulness", "method": "edge-pruning", "k": 6, "statistic": "f_conditional_ci_low", "min": 0.5}]})
    est, low = evaluate_claims(claims, run)
    assert est.status == "pass" and est.observed["f_conditional"] == pytest.approx(row["f_conditional"])
    # the lower end the table holds decides the claim: a finite end above 0.5 passes, else (an unbounded set) it fails
    assert low.status == ("pass" if row["f_conditional_ci_low"] >= 0.5 else "fail")
