"""The head-stability study: claim verdicts from intervals, and the quick study end to end."""

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from circuitstat.circuits.corpus import Corpus
from circuitstat.pipelines.runs.heads.study import StudyPlan, claims_summary, condition_name, quick_plan, run_head_study

SUMMARY_COLUMNS = ["item", "value", "ci_low", "ci_high", "verdict", "pvalue", "pvalue_holm", "interval", "multiplicity"]
LAYERS_COLUMNS = ["layer", "stability", "ci_low", "ci_high", "null_mean", "stability_all_anchors", "refit_ci_low",
                  "refit_ci_high", "excess", "excess_ci_low", "excess_ci_high", "n_refits"]


def _corpus():
    items = [(f"m{i}.py", "\n".join(f"def f{i}_{j}(x, y):\n    return x * {j} + y_{i % 7} - {i + j}" for j in range(12)))
             for i in range(200)]
    return Corpus.from_texts(items, name="tiny-study")


def _plan():
    q = quick_plan()
    return StudyPlan(base=q.base, depths=(1, 3), seeds=(0, 1, 2), n_probe=10, probe_len=10, n_resamples=20,
                     n_resamples_cka=10, n_null=4, n_permutations=49, name="test")


def test_claim_verdicts_follow_the_intervals():
    plan = StudyPlan(base=quick_plan().base, depths=(2, 4, 8), seeds=(0, 1))
    rng = np.random.default_rng(0)
    R = 400
    reps, points, corr = {}, {}, {}
    for d in plan.depths:
        for opt, wd in plan.optimizers:
            n = condition_name(d, opt, wd)
            shift = 0.05 if opt == "adamw" else 0.0  # AdamW clearly more stable
            mean = 0.6 + shift + rng.normal(0, 0.005, R)
            gap = 0.2 + rng.normal(0, 0.01, R)  # the same gap at every depth: claim 2 inconclusive
            emm = -0.1 + rng.normal(0, 0.01, R)  # middle layers MORE stable: claim 1 contradicted
            reps[n] = {"mean": mean, "gap": gap, "ends_minus_middle": emm,
                       "resid:linear:post": mean + 0.2 + rng.normal(0, 0.01, R)}
            points[n] = {"mean": 0.6 + shift, "gap": 0.2, "ends_minus_middle": -0.1, "resid:linear:post": 0.8 + shift}
            corr[n] = {"r": -0.6, "n_eff": 60}
    t = claims_summary(plan, reps, points, corr)
    verdict = dict(zip(t["item"], t["verdict"]))
    final = {k[:2]: v for k, v in verdict.items() if "[" not in k}
    assert final == {"1.": "contradicted", "2.": "inconclusive", "3.": "supported", "4.": "supported",
                     "5.": "supported"}
    assert all(v in ("supported", "contradicted", "inconclusive", "") for v in t["verdict"])
    i = list(t["item"]).index("4. AdamW raises stability (AdamW minus Adam, mean over depths)")
    assert t["value"][i] == pytest.approx(0.05) and 0.04 < t["ci_low"][i] < 0.05 < t["ci_high"][i] < 0.06


def test_quick_study_end_to_end(tmp_path):
    corpus, cache, out = _corpus(), tmp_path / "cache", tmp_path / "study"
    plan = _plan()
    res = run_head_study(out, plan=plan, n_jobs=1, cache=cache, corpus=corpus)
    summary = pq.read_table(out / "summary.parquet")
    assert summary.column_names == SUMMARY_COLUMNS
    s = summary.to_pydict()
    claims = {i[:2] for i in s["item"]}
    assert {"1.", "2.", "3.", "4.", "5."} <= claims
    assert set(s["verdict"]) <= {"supported", "contradicted", "inconclusive", "negligible", ""}
    # a degenerate estimate (untrained models: stabilities all near 1) is never a finding
    for v, lo, hi, vd in zip(s["value"], s["ci_low"], s["ci_high"], s["verdict"]):
        if max(abs(v), abs(lo), abs(hi)) <= 1e-4:
            assert vd in ("negligible", ""), (v, lo, hi, vd)
    for v, lo, hi, vd in zip(s["value"], s["ci_low"], s["ci_high"], s["verdict"]):
        if vd in ("supported", "contradicted") and math.isfinite(lo):
            assert lo <= hi
    for name in ("heads", "layers", "residual", "conditions", "study_layers", "models"):
        assert (out / f"{name}.parquet").exists()
    for n, _ in plan.conditions():
        layers = pq.read_table(out / n / "layers.parquet")
        assert layers.column_names == LAYERS_COLUMNS
        assert layers.num_rows == int(n.split("-")[0][1:])
    models = pq.read_table(out / "models.parquet").to_pydict()
    assert len(models["path"]) == len(plan.conditions()) * len(plan.seeds)
    assert len(set(models["weight_hash"])) == len(models["weight_hash"])  # every seed/condition differs
    man = json.loads((out / "manifest.json").read_text())
    assert all(st["status"] == "done" for st in man["stages"].values())
    # a rerun trains nothing and recomputes nothing
    mtimes = {p: (p / "model.safetensors").stat().st_mtime_ns for p in map(__import__("pathlib").Path, models["path"])}
    before = (out / "summary.parquet").stat().st_mtime_ns
    run_head_study(out, plan=plan, n_jobs=1, cache=cache, corpus=corpus)
    assert (out / "summary.parquet").stat().st_mtime_ns == before
    assert all((p / "model.safetensors").stat().st_mtime_ns == t for p, t in mtimes.items())
    assert res.to_table("summary").num_rows == summary.num_rows
    assert res.to_table().column("item").equals(summary.column("item"))  # lazily read, the main table
    np.testing.assert_array_equal(res.conf_int().low, s["ci_low"])
    assert "run directory" in res.summary() and res.write(out)["conditions"] == out / "conditions.parquet"


def test_cached_models_survive_new_recipe_fields(tmp_path):
    from circuitstat.pipelines.training import is_complete, prepare_data, train_model

    corpus, plan = _corpus(), _plan()
    name, recipe = plan.conditions()[0]
    data = prepare_data(recipe, corpus=corpus, cache=tmp_path)
    d = train_model(recipe, 0, tmp_path / "m", data=data, progress=False)
    assert is_complete(d, recipe, 0, data.content_hash)
    assert not is_complete(d, recipe, 1, data.content_hash)
    cfg = d / "config.json"
    doc = json.loads(cfg.read_text())
    t = doc["meta"]["training"]
    # as if trained before TrainRecipe had the field grad_clip (now at its default): still valid
    t["recipe_hash"] = "older"
    del t["recipe"]["grad_clip"]
    cfg.write_text(json.dumps(doc))
    assert is_complete(d, recipe, 0, data.content_hash)
    assert not is_complete(d, recipe.replace(grad_clip=0.5), 0, data.content_hash)
    t["recipe"]["lr"] = 1.0  # a stored field that differs: not this recipe's model
    cfg.write_text(json.dumps(doc))
    assert not is_complete(d, recipe, 0, data.content_hash)


def test_claims_over_seeds_use_the_jackknife_and_holm_over_every_directional_row():
    from scipy import stats as sps
    from statsmodels.stats.multitest import multipletests

    plan = StudyPlan(base=quick_plan().base, depths=(2, 4), seeds=(0, 1, 2, 3, 4))
    rng = np.random.default_rng(1)
    R, K = 200, len(plan.seeds)
    reps, points, corr, refit = {}, {}, {}, {}
    for d in plan.depths:
        for opt, wd in plan.optimizers:
            n = condition_name(d, opt, wd)
            reps[n] = {k: rng.normal(0.5, 0.01, R) for k in ("mean", "gap", "ends_minus_middle", "resid:linear:post")}
            points[n] = {k: 0.5 for k in reps[n]}
            corr[n] = {"r": -0.55, "n_eff": 20}  # p = 0.011 alone: not after adjusting for ~20 rows
            # leave-one-seed-out values: excess over the null clearly positive, residual minus heads unclear
            refit[n] = {"mean": (0.6, 0.6 + rng.normal(0, 0.01, K)),
                        "excess_mean": (0.2, 0.2 + rng.normal(0, 0.01, K)),
                        "resid:linear:post": (0.61, 0.61 + rng.normal(0, 0.02, K)),
                        "gap": (0.1, 0.1 + rng.normal(0, 0.01, K))}
    t = claims_summary(plan, reps, points, corr, refit)
    rows = {i: k for k, i in enumerate(t["item"])}
    pooled6 = rows["6. heads are more stable than their null (excess, mean over conditions)"]
    assert t["interval"][pooled6].startswith("jackknife over training seeds") and t["verdict"][pooled6] == "supported"
    # the jackknife interval of a per-condition excess: t on K - 1 df around the estimate
    i = rows["6. mean head stability minus its shuffled-prompt null [L2-adam]"]
    loo = refit["L2-adam"]["excess_mean"][1]
    se = np.sqrt((K - 1) / K * ((loo - loo.mean()) ** 2).sum())
    assert t["ci_high"][i] - 0.2 == pytest.approx(sps.t.ppf(0.975, K - 1) * se)
    # Holm over every directional row, as statsmodels computes it
    directional = t["multiplicity"] != ""
    assert directional.sum() > 10 and set(t["verdict"][~directional]) == {""}
    np.testing.assert_allclose(t["pvalue_holm"][directional],
                               multipletests(t["pvalue"][directional], method="holm")[1])
    assert f"Holm over the {directional.sum()} directional rows" in t["multiplicity"][pooled6]
    # a row significant alone but not after the adjustment is inconclusive
    for p, ph, v in zip(t["pvalue"][directional], t["pvalue_holm"][directional], t["verdict"][directional]):
        assert (v == "inconclusive") == (not ph <= 0.05)
    assert any(p <= 0.05 < ph for p, ph in zip(t["pvalue"][directional], t["pvalue_holm"][directional]))


# ---- the YAML plan of `study heads PLAN` ------------------------------------------------------
def _write_plan(tmp_path, text: str):
    p = tmp_path / "plan.yaml"
    p.write_text(text)
    return p


def test_a_yaml_plan_overrides_the_built_in_one(tmp_path):
    from circuitstat.pipelines.runs.heads.study import full_plan, load_head_study_plan

    plan = load_head_study_plan(_write_plan(tmp_path, """
start: full
depths: [2, 4]
optimizers: [{name: adam}, {name: adamw, weight_decay: 0.1}]
seeds: [0, 1, 2, 3, 4, 5, 6, 7]
recipe: {steps: 600, lr: 0.001}
n_resamples: 300
"""))
    full = full_plan()
    assert plan.depths == (2, 4) and plan.seeds == tuple(range(8)) and plan.n_resamples == 300
    assert plan.optimizers == (("adam", 0.0), ("adamw", 0.1))
    assert plan.base.steps == 600 and plan.base.lr == 0.001
    assert plan.base.replace(steps=full.base.steps, lr=full.base.lr) == full.base  # nothing else changed
    assert (plan.n_probe, plan.n_null, plan.n_permutations) == (full.n_probe, full.n_null, full.n_permutations)
    assert [n for n, _ in plan.conditions()] == ["L2-adam", "L2-adamw-wd0.1", "L4-adam", "L4-adamw-wd0.1"]
    # the cache key follows the recipes and seeds, so a changed plan never reuses other models
    assert plan.key != full.key


@pytest.mark.parametrize("text, fragment", [
    ("depth: [2]\n", "unknown key"),
    ("seeds: [0, 1, 1]\n", "duplicate seeds"),
    ("seeds: [0, 1]\n", "seeds"),
    ("recipe: {stepz: 10}\n", "recipe.stepz is not a training-recipe setting"),
    ("recipe: {steps: '10'}\n", "recipe.steps must be of type int"),
    ("recipe: {norm: bogus}\n", "norm"),
    ("optimizers: [{name: sgd}]\n", "optimizers"),
    ("n_resamples: 3\n", "n_resamples"),
    ("- 1\n- 2\n", "top level"),
])
def test_a_bad_plan_is_refused_with_exit_2_before_anything_is_written(tmp_path, text, fragment):
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["study", "heads", str(_write_plan(tmp_path, text)), "--out", str(out)])
    assert r.exit_code == 2 and r.output.startswith("error: ") and fragment in r.output, r.output
    assert not out.exists()


def test_the_example_plan_loads():
    from pathlib import Path

    from circuitstat.pipelines.runs.heads.study import load_head_study_plan

    plan = load_head_study_plan(Path(__file__).resolve().parents[2] / "examples" / "head-study-seeds.yaml")
    assert plan.depths == (2, 4) and len(plan.seeds) == 10 and len(plan.conditions()) == 4


def test_a_plan_and_quick_together_are_refused(tmp_path):
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    r = CliRunner().invoke(app, ["study", "heads", str(_write_plan(tmp_path, "start: quick\n")), "--quick",
                                 "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "not both" in r.output
