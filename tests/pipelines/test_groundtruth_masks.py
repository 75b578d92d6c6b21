"""``study groundtruth`` with a mask-learning method (edge pruning) and the stability:refit family."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml
from typer.testing import CliRunner

from circuitstat.core.run_tables import RunTables
from circuitstat.core.schema import schema_for
from circuitstat.pipelines.cli import app
from circuitstat.pipelines.runs.groundtruth.study import TABLES


def _spec(tmp_path: Path, **over) -> str:
    doc = {"models": ["planted:induction?background=0.25"], "methods": ["eap", "edge-pruning"], "sizes": [8],
           "n_datasets": 5, "n_resamples": 50, "n_subsamples": 10, "faithfulness_methods": [], "refits": 3,
           "edge_pruning": {"steps": 3}, **over}
    p = tmp_path / "gt.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def test_edge_pruning_is_scored_with_refit_stability_beside_attribution(tmp_path: Path) -> None:
    out = tmp_path / "run"
    spec = _spec(tmp_path, faithfulness_methods=["edge-pruning"], sizes=[16])
    r = CliRunner().invoke(app, ["study", "groundtruth", spec, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "edge-pruning" in r.output
    tables = RunTables(out, TABLES, "groundtruth_summary", {}).tables()
    for name, t in tables.items():
        schema_for(name).validate(t)
    d = tables["groundtruth_datasets"].to_pandas()
    ep, eap = d[d.method == "edge-pruning"], d[d.method == "eap"]
    # no per-example tests or subsamples; the faithfulness family only where asked for
    assert set(ep.family) == {"ranking", "topk", "roc", "stability:refit", "faithfulness"}
    assert "faithfulness" not in set(eap.family)
    assert {"test:bootstrap", "stability", "stability:refit"} <= set(eap.family)
    for rows in (ep, eap):  # one refit-stability value per dataset and statistic, each a proper value
        refit = rows[rows.family == "stability:refit"]
        assert len(refit) == 5 * 5 and refit.value[refit.statistic == "jaccard_mean"].between(0, 1).all()
    auc = ep.value[ep.statistic == "auroc"]
    assert len(auc) == 5 and auc.between(0, 1).all() and auc.nunique() > 1  # a fit per dataset
    assert not list(out.glob("**/scores_*edge_pruning*"))  # no per-example scores stage for a mask method
    f = ep[ep.family == "faithfulness"]
    assert set(f.statistic) == {"fixed_estimate", "fixed_covers_truth", "fixed_bounded", "fixed_covers_truth_bounded",
                                "fixed_width_bounded", "fixed_bca_covers_truth", "fixed_bca_width", "selected_estimate",
                                "selected_covers_own", "selected_covers_truth", "selected_is_truth"}
    assert (f.groupby("statistic").size() == 5).all()  # one value per dataset
    for st in ("fixed_covers_truth", "fixed_bounded", "fixed_bca_covers_truth", "selected_covers_own",
               "selected_covers_truth", "selected_is_truth"):
        assert f.value[f.statistic == st].isin([0.0, 1.0]).all()
    bounded = f.value[f.statistic == "fixed_bounded"].to_numpy() == 1.0  # NaN exactly where the set is unbounded
    assert np.array_equal(~np.isnan(f.value[f.statistic == "fixed_covers_truth_bounded"].to_numpy()), bounded)
    assert f.value[f.statistic == "selected_estimate"].nunique() > 1  # a cross-fit per dataset


def test_a_study_of_mask_methods_alone_has_an_empty_fdr_table_and_a_summary() -> None:
    """With only mask methods there are no per-edge tests: the FDR table is empty but valid, the summary prints."""
    import pyarrow as pa

    from circuitstat.pipelines.runs.groundtruth.study import KEYS, _columns, summary_lines
    from circuitstat.stats.groundtruth_scoring import summarise

    rows = [{"model": "m", "method": "edge-pruning", "n": 8, "dataset": r, "family": "ranking", "statistic": "auroc",
             "param": "", "value": 0.5 + 0.1 * r} for r in range(3)]
    fdr = schema_for("groundtruth_fdr").validate(pa.table(_columns([], "groundtruth_fdr")))
    assert fdr.num_rows == 0 and "fdr" in fdr.column_names
    tables = {"groundtruth_summary": pa.table(_columns(summarise(rows, KEYS))), "groundtruth_fdr": fdr,
              "groundtruth_models": pa.table({"model": ["m"], "n_true": [4]})}
    text = "\n".join(summary_lines(tables))
    assert "3 datasets" in text and "edge-pruning" in text and "0.60 [" in text


def test_mask_method_spec_errors(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["study", "groundtruth", _spec(tmp_path, refits=2), "--out", str(tmp_path / "a")])
    assert r.exit_code == 2 and "refits" in r.output
    r = CliRunner().invoke(app, ["study", "groundtruth", _spec(tmp_path, methods=["eap"],
                                                               faithfulness_methods=["edge-pruning"]),
                                 "--out", str(tmp_path / "b")])
    assert r.exit_code == 2 and "faithfulness_methods" in r.output  # only among the methods
    r = CliRunner().invoke(app, ["study", "groundtruth", _spec(tmp_path, edge_pruning={"steps": 0}),
                                 "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and "steps" in r.output
    assert not any((tmp_path / x).exists() for x in "abc")


def test_edge_pruning_stability_refits_each_resample_with_its_weights() -> None:
    """Refit b is the fit on resample b's counts with seed child b (bit for bit); the stability counts their top-k."""
    from circuitstat.circuits.edge_pruning import fit_edge_pruning
    from circuitstat.circuits.groundtruth.planted import PlantedSpec, planted_induction
    from circuitstat.core.seeds import spawn_seeds
    from circuitstat.pipelines.runs.groundtruth.masks import edge_pruning_stability, refit_mask
    from circuitstat.stats import ResamplingPlan

    gt = planted_induction(PlantedSpec(background=0.25))
    task = gt.task(6, 1)
    plan = ResamplingPlan.bootstrap(6, 3, 5)
    V = refit_mask(gt.model, task, plan, seed=9, steps=3)
    for b, child in enumerate(spawn_seeds(9, 3)):
        ref = fit_edge_pruning(gt.model, task, weights=plan.counts[b], seed=child, steps=3).log_alpha
        np.testing.assert_array_equal(V[b], ref)
    assert np.abs(V[0] - V[1]).max() > 0  # different resamples and seeds give different fits
    res = edge_pruning_stability(gt.model, task, plan, [4], seed=9, steps=3)
    assert res.n_resamples == 3 and res.params["plan"]["n_resamples"] == 3
    assert res.inclusion_counts[0].sum() == 3 * 4 and res.ranking == "signed"


def test_edge_pruning_faithfulness_refits_once_per_fold_each_an_independent_fit() -> None:
    """The cross-fit calls the refit once per fold; each fold's logits are bit for bit edge pruning fitted on the
    other folds' prompts alone with that fold's seed; the folds' held-out prompts partition the dataset."""
    from circuitstat.circuits.edge_pruning import fit_edge_pruning
    from circuitstat.circuits.faithfulness import faithfulness
    from circuitstat.circuits.groundtruth.planted import PlantedSpec, planted_induction
    from circuitstat.pipelines.runs.groundtruth.masks import fold_refit
    from circuitstat.stats.faithfulness_refit import refit_selection_faithfulness

    gt = planted_induction(PlantedSpec(background=0.25))
    task = gt.task(24, 1)
    rows = np.arange(4, 20)  # a dataset of 16 prompts inside the population
    inner, calls = fold_refit(gt.model, task, rows, steps=3), []

    def refit(train, seed):
        calls.append((np.array(train), seed, inner(train, seed)))
        return calls[-1][2]

    def evaluate(masks, r):
        res = faithfulness(gt.model, task, masks, rows=rows[r], progress=False)
        return res.m_circuit, res.m_clean, res.m_empty

    full = fit_edge_pruning(gt.model, task, rows=rows, steps=3, seed=0).log_alpha
    sel = refit_selection_faithfulness(refit, full, evaluate, [4], n_obs=16, n_folds=4, seed=3)
    assert len(calls) == 4 and sel.extra["refits"][0] == 4
    held = [np.setdiff1d(np.arange(16), t) for t, _, _ in calls]
    assert np.array_equal(np.sort(np.concatenate(held)), np.arange(16))
    assert len({tuple(s.spawn_key) for _, s, _ in calls}) == 4
    for train, seed, v in calls:
        np.testing.assert_array_equal(v, fit_edge_pruning(gt.model, task, rows=rows[train], steps=3, seed=seed).log_alpha)
    lo, hi = sel.conf_int().to_array()[0, :2]
    assert lo < sel.estimate[0] < hi and np.isfinite([lo, hi]).all()


def test_ugs_is_scored_as_edge_pruning_is_and_its_bad_options_exit_2(tmp_path: Path) -> None:
    """UGS (a mask method like edge pruning): a fit per dataset (ranking, top-k, ROC) and the refit family; its
    options are checked before any work (exit 2)."""
    from circuitstat.circuits.groundtruth import load_groundtruth
    from circuitstat.circuits.ugs import fit_ugs
    from circuitstat.core.seeds import spawn_seeds
    from circuitstat.pipelines.runs.groundtruth.masks import _datasets
    from circuitstat.stats.groundtruth import auroc

    out = tmp_path / "run"
    spec = _spec(tmp_path, methods=["ugs"], ugs={"steps": 2, "n_samples": 1}, edge_pruning={})
    r = CliRunner().invoke(app, ["study", "groundtruth", spec, "--out", str(out)])
    assert r.exit_code == 0, r.output
    d = RunTables(out, TABLES, "groundtruth_summary", {}).tables()["groundtruth_datasets"].to_pandas()
    assert set(d.method) == {"ugs"} and set(d.family) == {"ranking", "topk", "roc", "stability:refit"}
    refit = d[d.family == "stability:refit"]
    assert len(refit) == 5 * 5 and refit.value[refit.statistic == "jaccard_mean"].between(0, 1).all()
    # dataset 0's AUROC is fit_ugs's on that dataset's prompts, at the study's seed for it (an independent call)
    from circuitstat.core.rundir import RunDir
    from circuitstat.pipelines.runs.groundtruth.study import _population_seed, _unused_keys, parse_groundtruth_spec

    gs = parse_groundtruth_spec(yaml.safe_load(Path(spec).read_text()), spec)
    src = "planted:induction?background=0.25"
    gt = load_groundtruth(src)
    with RunDir(out, spec=gs.model_dump(exclude=_unused_keys(gs))) as run:
        seed = run.stage_seed(f"ugs:{src}")
        task = gt.task(5 * 8, _population_seed(run, src))
    n, _, rows, s = next(iter(_datasets(gs, seed)))
    fit = fit_ugs(gt.model, task, rows=rows, seed=spawn_seeds(s, 4)[0], batch_size=gs.batch_size, steps=2, n_samples=1)
    got = d[(d.statistic == "auroc") & (d.dataset == 0)].value.iloc[0]
    assert got == auroc(fit.log_alpha, gt.truth)
    bad = CliRunner().invoke(app, ["study", "groundtruth", _spec(tmp_path, methods=["ugs"], ugs={"n_samples": 0}),
                                   "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "n_samples" in bad.output and not (tmp_path / "bad").exists()
