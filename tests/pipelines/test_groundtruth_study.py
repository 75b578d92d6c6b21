"""``circuitstat study groundtruth``: the study end to end, its HTML section, and FDR calibration on planted models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from circuitstat.circuits.attribution import attribute
from circuitstat.circuits.groundtruth.planted import PlantedSpec, planted_induction
from circuitstat.pipelines.cli import app
from circuitstat.pipelines.runs.groundtruth.study import TABLES
from circuitstat.reports.html.groundtruth import groundtruth_section
from circuitstat.core.run_tables import RunTables
from circuitstat.core.schema import schema_for
from circuitstat.stats.groundtruth import fdr_check, selection_metrics
from circuitstat.stats.groundtruth_scoring import score_dataset
from circuitstat.stats.testing import t_test_edges


def _spec(tmp_path: Path, **over) -> str:
    doc = {"models": ["tracr:frac_prevs", "planted:induction?background=1"], "methods": ["exact", "eap"],
           "sizes": [8, 16], "n_datasets": 5, "n_resamples": 100, "n_subsamples": 10, **over}
    p = tmp_path / "gt.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def test_study_writes_its_tables_summary_and_html(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["study", "groundtruth", _spec(tmp_path), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "tracr:frac_prevs" in r.output and "AUROC" in r.output
    tables = RunTables(out, TABLES, "groundtruth_summary", {}).tables()
    for name, t in tables.items():
        schema_for(name).validate(t)  # written through the schema: every column registered
    s = tables["groundtruth_summary"].to_pandas()
    exact = s[(s.model == "tracr:frac_prevs") & (s.method == "exact") & (s.statistic == "auroc")]
    assert list(exact.estimate) == [1.0, 1.0] and (exact.ci_low == 1.0).all()  # noise-free: every dataset perfect
    assert exact.estimand.iloc[0].startswith("the expected value of the statistic for a dataset of N prompts")
    eap = s[(s.model.str.startswith("planted")) & (s.method == "eap") & (s.statistic == "auroc") & (s.n == 16)]
    assert eap.estimate.iloc[0] < 0.95  # EAP misses the K-composition edges through saturated attention
    faith = s[(s.family == "faithfulness") & (s.statistic == "fixed_covers_truth")]
    assert len(faith) == 4 and (faith.method == "exact").all()
    models = tables["groundtruth_models"].to_pandas()
    assert list(models.n_true) == [3, 4] and list(models.population) == [80, 80]
    html = groundtruth_section(tables)
    assert html.count("<svg") == 6 and "FDR calibration" in html and "planted:induction" in html
    assert "t interval over R independent datasets" in html  # the estimand is named beside the figures
    assert "Fieller set covers 1" in html and "Fieller set bounded" in html  # a trivial cover is not read as one
    page = (out / "report.html").read_text()  # the study's report shows the section, and nothing the run lacks
    assert 'id="groundtruth"' in page and 'href="#groundtruth"' in page and 'id="stability"' not in page


def test_study_refuses_bad_specs(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["study", "groundtruth", _spec(tmp_path, colour=1), "--out", str(tmp_path / "a")])
    assert r.exit_code == 2 and "colour" in r.output
    r = CliRunner().invoke(app, ["study", "groundtruth", _spec(tmp_path, models=["tracr:nope"]),
                                 "--out", str(tmp_path / "b")])
    assert r.exit_code == 2 and "no compiled ground-truth fixture" in r.output
    r = CliRunner().invoke(app, ["study", "groundtruth", _spec(tmp_path, alphas=[1.5]), "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and "alphas" in r.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.slow
def test_fdr_is_calibrated_against_the_planted_truth() -> None:
    """Realised FDP at q = 0.05 and 0.1 is at most q plus 2 Monte Carlo SEs, and not trivially 0."""
    gt = planted_induction(PlantedSpec(background=1.0))
    N, R = 48, 100
    task = gt.task(N * R, 11)
    S = attribute(gt.model, task, "exact", progress=False, batch_size=96).scores.astype(np.float64)
    fdp: dict[tuple[str, float], list[float]] = {}
    power: dict[tuple[str, float], list[float]] = {}
    raw: dict[float, list[float]] = {0.05: [], 0.1: []}
    for r in range(R):
        D = S[r * N:(r + 1) * N]
        for fam, stat, par, v in score_dataset(D, gt.truth, ks=[4], n_resamples=1000, n_subsamples=10, seed=r):
            if fam.startswith("test:") and stat in ("fdp", "recall"):
                key = (fam.split(":")[1], float(par.split("=")[1]))
                (fdp if stat == "fdp" else power).setdefault(key, []).append(v)
        p = t_test_edges(D).pvalue
        for a in raw:  # negative control: no multiplicity correction
            raw[a].append(selection_metrics(np.nan_to_num(p, nan=1.0) <= a, gt.truth)["fdp"])
    for (test, a), values in fdp.items():
        c = fdr_check(np.asarray(values), a)
        assert c["verdict"] == "holds", (test, a, c)  # FDR <= alpha + 2 MC SE ...
        assert c["share_with_false"] >= 0.02 and c["fdr"] > 0.1 * a  # ... and not trivially 0
        assert np.mean(power[(test, a)]) > 0.9  # real edges are found
    for a, values in raw.items():
        assert fdr_check(np.asarray(values), a)["verdict"] == "exceeded"  # the check can fail


def test_spec_models_are_built_in_sources_only(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["study", "groundtruth", _spec(tmp_path, models=["/etc"]), "--out", str(tmp_path / "a")])
    assert r.exit_code == 2 and "not a built-in ground-truth source" in r.output
