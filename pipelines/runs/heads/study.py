"""The head-stability study: do the claims of Bali et al. (2026) hold on small models trained here?

A grid of {2, 4, 8} layers × {Adam, AdamW with weight decay 0.1} × 5 seeds of small GPT-style
models is trained on the standard-library corpus with :mod:`circuitstat.pipelines.training` (cached: a rerun
trains nothing), :class:`circuitstat.pipelines.runs.heads.stability.HeadStability` is fitted per condition with the paper's
metric (max matching, anchor refit), and ``summary.parquet`` tests each claim from intervals
and p-values, never from point estimates:

1. the least stable layers are in the middle: mean stability of the first and last layer minus
   that of the middle layers > 0 (conditions with >= 3 layers);
2. the gap (max − min layer stability) grows with depth: gap(deepest) − gap(shallowest) > 0;
3. less stable deep heads are more important: correlation of stability and importance over the
   heads of the second half of the layers < 0 (pooled Fisher z over conditions with >= 4 layers);
4. AdamW raises stability: mean head stability, AdamW − Adam > 0;
5. the residual stream is more stable than the heads: mean linear CKA (after attention) − mean
   head stability > 0;
6. (added) the heads are more stable than their null: mean head stability minus its
   shuffled-prompt null > 0; 4b. AdamW raises that excess.

Intervals: where the fitted conditions carry refit-level values (they do when fitted here), the
claims about mean, gap, ends-minus-middle, residual-minus-heads and excess use the jackknife
over training seeds (every refit an anchor; t on K − 1 df), paired by seed across conditions
(a seed fixes the initialisation, for a given depth, and the data order): the estimand is the
seed distribution, and with 5 seeds these intervals are wide. The excess gap (2b) has only
the bootstrap of the paper's setting (prompts and the anchor's comparison refits, anchor
fixed), paired by replicate across conditions. The ``interval`` column names which.

Verdicts: one family. Every directional row gets a two-sided p-value (t from the jackknife,
z from the bootstrap standard error, Fisher z for correlations); Holm's step-down adjustment
runs over all of them (``pvalue_holm``; ``multiplicity`` states the rule); "supported" when
the adjusted p-value is <= 0.05 with the value on the claimed side, "contradicted" when on the
other side, "negligible" when the value and its interval lie within 1e-4 of 0 (a degenerate
estimate, e.g. untrained models whose heads all attend alike: circuitstat.stats.intervals.RESOLUTION),
"inconclusive" otherwise. ``ci_low/ci_high`` are unadjusted 95% intervals.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

import numpy as np

from pydantic import Field

from circuitstat.core.errors import InputError
from circuitstat.core.params import N_JOBS, N_RESAMPLES, SEED
from circuitstat.pipelines.spec import StrictSpec
from circuitstat.pipelines.training import TrainRecipe, cache_dir
from circuitstat.core.run_tables import RunTables
from circuitstat.stats.head_stability import bootstrap_z_summary, jackknife_summary
from circuitstat.stats.study_claims import StudyDesign, claims_table, layer_points
from circuitstat.pipelines.kinds import RunKind

__all__ = ["StudyPlan", "HeadStudyResult", "full_plan", "quick_plan", "run_head_study",
           "claims_summary"]

KIND_NAME = "study heads"
"""This run kind's name (circuitstat.pipelines.kinds), by which core.params names its defaults."""
SUMMARY_COLUMNS = ("item", "value", "ci_low", "ci_high", "verdict", "pvalue", "pvalue_holm", "interval", "multiplicity")


@dataclass(frozen=True)
class StudyPlan:
    """What the study trains and how it analyses it."""

    base: TrainRecipe
    depths: tuple[int, ...] = (2, 4, 8)
    optimizers: tuple[tuple[str, float], ...] = (("adam", 0.0), ("adamw", 0.1))
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    n_probe: int = 100
    probe_len: int = 64
    n_resamples: int = N_RESAMPLES.default_for("heads")  # each cell is a HeadStability fit
    n_resamples_cka: int = 100
    n_null: int = 50
    n_permutations: int = 2000
    seed: int = SEED.default
    name: str = "full"

    def conditions(self) -> list[tuple[str, TrainRecipe]]:
        out = []
        for d in self.depths:
            for opt, wd in self.optimizers:
                out.append((condition_name(d, opt, wd), self.base.replace(n_layers=d, optimizer=opt, weight_decay=wd)))
        return out

    def to_dict(self) -> dict:
        return {"base": self.base.to_dict(), "depths": list(self.depths),
                "optimizers": [list(o) for o in self.optimizers], "seeds": list(self.seeds),
                "n_probe": self.n_probe, "probe_len": self.probe_len, "n_resamples": self.n_resamples,
                "n_resamples_cka": self.n_resamples_cka, "n_null": self.n_null, "n_permutations": self.n_permutations,
                "seed": self.seed, "name": self.name}

    @property
    def key(self) -> str:
        """Cache key: the recipes' non-default fields and the seeds (stable when TrainRecipe gains fields)."""
        doc = {"recipes": {n: _non_default(r) for n, r in self.conditions()}, "seeds": list(self.seeds), "version": 2}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def _non_default(recipe: TrainRecipe) -> dict:
    d, base = recipe.to_dict(), TrainRecipe().to_dict()
    return {k: v for k, v in d.items() if base.get(k, object()) != v}


def condition_name(depth: int, optimizer: str, weight_decay: float) -> str:
    return f"L{depth}-{optimizer}" + (f"-wd{weight_decay:g}" if weight_decay else "")


def full_plan() -> StudyPlan:
    """The study as run for docs/results.md: sized to fit 60 minutes on 2 cores (see there)."""
    base = TrainRecipe(n_layers=2, n_heads=4, d_model=64, d_mlp=256, n_ctx=64, vocab_size=2048, tokenizer="bpe",
                       corpus="stdlib", optimizer="adamw", lr=2e-3, weight_decay=0.1, warmup_steps=60,
                       batch_size=16, steps=1200, eval_every=200, eval_batches=8, checkpoint_every=200, threads=1)
    return StudyPlan(base=base, name="full")


def quick_plan() -> StudyPlan:
    """A tiny study for the tests: 1/2/4 layers, 3 seeds, a few steps (runs in seconds)."""
    base = TrainRecipe(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16, vocab_size=300, tokenizer="bpe",
                       corpus="stdlib", optimizer="adamw", lr=5e-3, weight_decay=0.1, warmup_steps=2,
                       batch_size=4, steps=12, eval_every=12, eval_batches=1, checkpoint_every=12, threads=1)
    return StudyPlan(base=base, depths=(1, 2, 4), seeds=(0, 1, 2), n_probe=12, probe_len=12, n_resamples=30,
                     n_resamples_cka=10, n_null=5, n_permutations=99, name="quick")


class _OptimizerSpec(StrictSpec):
    name: Literal["adam", "adamw"]
    weight_decay: float = Field(0.0, ge=0.0, le=10.0)


class HeadStudySpec(StrictSpec):
    """A head-study plan in YAML (``circuitstat study heads PLAN --out DIR``); absent keys keep the value of
    the built-in plan named by ``start``::

        start: full                      # or quick
        depths: [2, 4]
        optimizers: [{name: adam}, {name: adamw, weight_decay: 0.1}]
        seeds: [0, 1, 2, 3, 4, 5, 6, 7]  # more refits give narrower refit-level intervals
        recipe: {steps: 600, d_model: 64}  # overrides of the base training recipe (circuitstat.pipelines.training.TrainRecipe)
        n_resamples: 200                 # bootstrap resamples of the head analyses
    """

    _renamed = {"n_perm": "n_permutations"}

    start: Literal["full", "quick"] = "full"
    name: str | None = Field(None, min_length=1, max_length=80, pattern=r"^[A-Za-z0-9_.-]+$")
    depths: list[Annotated[int, Field(ge=1, le=48)]] | None = Field(None, min_length=1, max_length=12)
    optimizers: list[_OptimizerSpec] | None = Field(None, min_length=1, max_length=6)
    seeds: list[Annotated[int, Field(ge=SEED.minimum, le=SEED.maximum)]] | None = Field(None, min_length=3, max_length=1000)
    recipe: dict[str, int | float | str | bool] = Field(default_factory=dict, max_length=64)
    n_probe: int | None = Field(None, ge=4, le=100_000)
    probe_len: int | None = Field(None, ge=4, le=100_000)
    n_resamples: int | None = N_RESAMPLES.pydantic(default=None)
    n_resamples_cka: int | None = N_RESAMPLES.pydantic(default=None)
    n_null: int | None = Field(None, ge=2, le=100_000)
    n_permutations: int | None = Field(None, ge=99, le=1_000_000)
    seed: int | None = SEED.pydantic(default=None)

    def to_plan(self, source: str = "<plan>") -> StudyPlan:
        """Return the StudyPlan; InputError for duplicate seeds or a recipe key or value TrainRecipe refuses."""
        import dataclasses

        start = full_plan() if self.start == "full" else quick_plan()
        if self.seeds is not None and len(set(self.seeds)) != len(self.seeds):
            raise InputError(f"{source}: duplicate seeds; list each seed once")
        fields = {f.name: f for f in dataclasses.fields(TrainRecipe)}
        for key, value in self.recipe.items():
            if key not in fields or key == "betas":
                raise InputError(f"{source}: recipe.{key} is not a training-recipe setting; known: "
                                 f"{', '.join(sorted(k for k in fields if k != 'betas'))}")
            default = getattr(start.base, key)
            if default is not None and not isinstance(value, type(default)) and not (
                    isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool)):
                raise InputError(f"{source}: recipe.{key} must be of type {type(default).__name__}")
        base = start.base.replace(**self.recipe)
        base.validate()
        over = {"depths": self.depths and tuple(self.depths), "seeds": self.seeds and tuple(self.seeds),
                "optimizers": self.optimizers and tuple((o.name, float(o.weight_decay)) for o in self.optimizers),
                "n_probe": self.n_probe, "probe_len": self.probe_len, "n_resamples": self.n_resamples,
                "n_resamples_cka": self.n_resamples_cka, "n_null": self.n_null, "n_permutations": self.n_permutations,
                "seed": self.seed, "name": self.name or f"{self.start}+plan"}
        return dataclasses.replace(start, base=base, **{k: v for k, v in over.items() if v is not None})


BUILTIN_CORPORA = ("stdlib",)
BUILTIN_TOKENIZERS = ("bpe", "gpt2", "gpt2-bpe", "openai-community/gpt2", "gpt-2")


def confine_recipe_paths(spec: HeadStudySpec, plan_file: str | os.PathLike, *,
                         allow_outside: bool = False) -> HeadStudySpec:
    """``spec`` with ``recipe.corpus`` and ``recipe.tokenizer`` (when they are paths, not built-in names)
    resolved against the plan's directory and confined to its tree (circuitstat.core.confine), before
    anything is read: never against the current directory, never outside unless ``allow_outside``."""
    from circuitstat.core.confine import resolve_inside

    recipe = dict(spec.recipe)
    for key, builtin in (("corpus", BUILTIN_CORPORA), ("tokenizer", BUILTIN_TOKENIZERS)):
        value = recipe.get(key)
        if isinstance(value, str) and value.lower() not in builtin:
            recipe[key] = str(resolve_inside(plan_file, value, key=f"recipe.{key}", allow_outside=allow_outside))
    return spec.model_copy(update={"recipe": recipe}) if recipe != spec.recipe else spec


def load_head_study_plan(path: str | os.PathLike, *, allow_outside: bool = False) -> StudyPlan:
    """Return the StudyPlan of a head-study YAML file (bounded, strict YAML, its paths confined to its
    directory unless ``allow_outside``); InputError naming what is wrong."""
    from circuitstat.pipelines.spec import load_yaml, validate_spec

    spec = validate_spec(HeadStudySpec, load_yaml(path), str(path), kind="head-study plan",
                         keys="start, depths, optimizers, seeds, recipe, ...")
    return confine_recipe_paths(spec, path, allow_outside=allow_outside).to_plan(str(path))


# =============================================================================================
# Training
# =============================================================================================
def train_grid(plan: StudyPlan, n_jobs: int = N_JOBS.default_for(KIND_NAME), cache: str | os.PathLike | None = None, corpus=None,
               device: str = "cpu", progress: bool = False) -> dict[str, list[Path]]:
    """Model directories per condition (trained the first time, one joblib pool over every job)."""
    from circuitstat.pipelines.training import TrainJob, is_complete, prepare_data, run_train_jobs

    root = (Path(cache) if cache else cache_dir()) / "head-study" / plan.key
    conds = plan.conditions()
    data = prepare_data(conds[0][1], corpus=corpus, cache=cache)  # tokenizer/data do not depend on depth/optimizer
    run_train_jobs([TrainJob(r, s, root / name / f"seed-{s}", data) for name, r in conds for s in plan.seeds],
                   n_jobs, device=device, progress=progress)
    out = {}
    for name, r in conds:
        d = root / name
        (d / "recipe.json").write_text(json.dumps({"recipe": r.to_dict(), "seeds": list(plan.seeds),
                                                   "data_hash": data.content_hash}, indent=2))
        out[name] = [d / f"seed-{s}" for s in plan.seeds]
        missing = [p for p, s in zip(out[name], plan.seeds) if not is_complete(p, r, s, data.content_hash)]
        if missing:
            raise RuntimeError(f"training did not finish for {missing}")
    return out


# =============================================================================================
# Analysis
# =============================================================================================
def _estimator(plan: StudyPlan, corpus) -> Any:
    from circuitstat.pipelines.runs.heads.stability import HeadStability

    return HeadStability(match="max", pairs="anchor", anchor=0, null="prompts", n_null=plan.n_null,
                         n_resamples=plan.n_resamples, n_resamples_cka=plan.n_resamples_cka, ci_over="both",
                         importance=True, corr_refits="all", residual=True, hooks=("pre", "post"),
                         n_permutations=plan.n_permutations,
                         n_probe=plan.n_probe, probe_len=plan.probe_len, bos=True, corpus=corpus,
                         seed=plan.seed, n_jobs=1)


def _fit_condition(plan: StudyPlan, paths: Sequence[str], corpus) -> Any:
    return _estimator(plan, corpus).fit([str(p) for p in paths]).result_


def _replicate_table(res) -> dict:
    """Return the replicates table: bootstrap replicates, and per left-out refit the jackknife values."""
    rep = res.replicates
    rows = {"statistic": [], "replicate": [], "value": []}

    def put(name, arr):
        arr = np.asarray(arr, dtype=float).ravel()
        rows["statistic"] += [name] * arr.size
        rows["replicate"] += list(range(arr.size))
        rows["value"] += arr.tolist()

    for k in ("mean", "gap", "gap_excess", "argmin", "argmin_rel", "ends_minus_middle"):
        if k in rep:
            put(k, rep[k])
    for k, v in rep.items():
        if k.startswith("resid:"):
            put(k, v)
    for layer in range(rep["layer"].shape[1]):
        put(f"layer{layer}", rep["layer"][:, layer])
    for k, v in res.refit_replicates.items():  # estimate:<name> (one row), jackknife:<name> (one per refit)
        put(k, v)
    return {"statistic": np.array(rows["statistic"]), "replicate": np.array(rows["replicate"], dtype=np.int64),
            "value": np.array(rows["value"])}


def _reps(table) -> dict[str, np.ndarray]:
    d = table.to_pydict() if hasattr(table, "to_pydict") else table
    out: dict[str, list] = {}
    for s, r, v in zip(d["statistic"], d["replicate"], d["value"]):
        out.setdefault(s, []).append((r, v))
    return {k: np.array([v for _, v in sorted(x)]) for k, x in out.items()}


def _refit_stats(reps: dict[str, np.ndarray]) -> dict[str, tuple[float, np.ndarray]]:
    """Return {statistic: (estimate, leave-one-refit-out values)} from a condition's replicates."""
    return {k[len("jackknife:"):]: (float(reps["estimate:" + k[len("jackknife:"):]][0]), v)
            for k, v in reps.items() if k.startswith("jackknife:") and "estimate:" + k[len("jackknife:"):] in reps}


def claims_summary(plan: StudyPlan, reps: dict[str, dict[str, np.ndarray]], points: dict[str, dict[str, float]],
                   corr: dict[str, dict[str, float]], refit: dict[str, dict[str, tuple]] | None = None
                   ) -> dict[str, np.ndarray]:
    """Return the summary table testing the claims of ``plan``'s grid (circuitstat.stats.study_claims.claims_table)."""
    design = StudyDesign({name: r.n_layers for name, r in plan.conditions()}, tuple(plan.depths),
                         tuple(plan.optimizers), condition_name)
    return claims_table(design, reps, points, corr, refit)



def _points_from_tables(layers, residual) -> dict[str, float]:
    class _R:
        pass

    o = _R()
    ld = layers.to_pydict()
    order = np.argsort(ld["layer"])
    o.layer_stability = np.asarray(ld["stability"], dtype=float)[order]
    rd = residual.to_pydict()
    o.residual = {k: np.asarray(v) for k, v in rd.items()}
    return layer_points(o)


def _summary_value(summary, item: str) -> float:
    d = summary.to_pydict()
    for i, v in zip(d["item"], d["value"]):
        if i == item:
            return float(v)
    return math.nan


def _deep_corr(correlation) -> dict[str, float]:
    d = correlation.to_pydict()
    for i, s in enumerate(d["scope"]):
        if s == "deep":
            return {"r": float(d["r"][i]), "n_eff": float(d["n_eff"][i])}
    return {"r": math.nan, "n_eff": 0.0}


CONDITION_COLUMNS = ("condition", "n_layers", "optimizer", "weight_decay", "mean_stability", "mean_ci_low",
                     "mean_ci_high", "null_mean", "gap", "gap_ci_low", "gap_ci_high", "least_stable_layer",
                     "residual_linear_post", "val_loss", "excess_mean", "excess_ci_low", "excess_ci_high",
                     "n_refits")
STUDY_LAYER_COLUMNS = ("condition", "n_layers", "optimizer", "layer", "stability", "ci_low", "ci_high", "null_mean",
                       "stability_all_anchors", "refit_ci_low", "refit_ci_high", "excess", "excess_ci_low",
                       "excess_ci_high", "n_refits")


def _condition_row(name: str, recipe: TrainRecipe, point: dict, reps: dict, refit: dict, layers: dict,
                   val_loss: list) -> dict:
    """Return one row of the conditions table (bootstrap intervals of the anchor's numbers, refit-level excess)."""
    low, high, _ = bootstrap_z_summary(reps["mean"])
    gap_low, gap_high, _ = bootstrap_z_summary(reps["gap"])
    excess, excess_low, excess_high, n_refits = math.nan, math.nan, math.nan, 0
    if "excess_mean" in refit:
        excess, loo = refit["excess_mean"]
        excess_low, excess_high, _ = jackknife_summary(excess, loo)
        n_refits = len(loo)
    return {"condition": name, "n_layers": recipe.n_layers, "optimizer": recipe.optimizer,
            "weight_decay": recipe.weight_decay, "mean_stability": point["mean"], "mean_ci_low": low,
            "mean_ci_high": high, "null_mean": float(np.nanmean(layers["null_mean"])), "gap": point["gap"],
            "gap_ci_low": gap_low, "gap_ci_high": gap_high, "least_stable_layer": int(point["argmin"]),
            "residual_linear_post": point.get("resid:linear:post", math.nan),
            "val_loss": float(np.mean(val_loss)) if val_loss else math.nan, "excess_mean": excess,
            "excess_ci_low": excess_low, "excess_ci_high": excess_high, "n_refits": n_refits}


def _study_summary(run, plan: StudyPlan, headline: str) -> dict:
    """Return the study's summary, conditions and study_layers tables and the headline condition's tables."""
    reps, points, corr, refit = {}, {}, {}, {}
    cond_rows: dict[str, list] = {k: [] for k in CONDITION_COLUMNS}
    lay_rows: dict[str, list] = {k: [] for k in STUDY_LAYER_COLUMNS}
    models = run.table("models").to_pydict()
    for name, recipe in plan.conditions():
        reps[name] = _reps(run.table(f"{name}/replicates"))
        refit[name] = _refit_stats(reps[name])
        layers = run.table(f"{name}/layers")
        points[name] = _points_from_tables(layers, run.table(f"{name}/residual"))
        points[name]["gap_excess"] = _summary_value(run.table(f"{name}/summary"),
                                                    "excess gap (gap minus its shuffled-layers expectation)")
        corr[name] = _deep_corr(run.table(f"{name}/correlation"))
        ld = layers.to_pydict()
        for i in range(len(ld["layer"])):
            row = {"condition": name, "n_layers": recipe.n_layers, "optimizer": recipe.optimizer,
                   **{k: ld[k][i] if k in ld else math.nan for k in STUDY_LAYER_COLUMNS[3:]}}
            for k in STUDY_LAYER_COLUMNS:
                lay_rows[k].append(row[k])
        val_loss = [v for c, v in zip(models["condition"], models["val_loss"]) if c == name]
        row = _condition_row(name, recipe, points[name], reps[name], refit[name], ld, val_loss)
        for k in CONDITION_COLUMNS:
            cond_rows[k].append(row[k])
    lay_rows["n_refits"] = [0 if isinstance(v, float) and math.isnan(v) else int(v) for v in lay_rows["n_refits"]]
    complete = all("mean" in refit[n] and "resid:linear:post" in refit[n] for n in refit)
    summ = claims_summary(plan, reps, points, corr, refit if complete else None)
    top = {t: run.table(f"{headline}/{t}") for t in ("heads", "layers", "residual")}
    return {"summary": summ, "conditions": cond_rows, "study_layers": lay_rows, **top}


@dataclass(repr=False)
class HeadStudyResult(RunTables):
    """The head study's run directory as a result: tables read lazily; per-condition tables live under
    ``<condition>/``. ``conf_int()`` gives the summary rows' unadjusted 95% intervals (Holm-adjusted
    verdicts are in the table)."""

    timings: dict = field(default_factory=dict)
    plan: StudyPlan | None = None


HEAD_STUDY_TABLES = ("summary", "conditions", "study_layers", "models", "heads", "layers", "residual")


def _models_table(plan: StudyPlan, paths: dict[str, list[Path]]) -> dict[str, list]:
    """Return the ``models`` table: one row per condition and seed, from each trained model's config.json."""
    rows: dict[str, list] = {k: [] for k in ("condition", "n_layers", "optimizer", "weight_decay", "seed", "path",
                                             "weight_hash", "val_loss", "train_seconds")}
    for name, r in plan.conditions():
        for s, p in zip(plan.seeds, paths[name]):
            doc = json.loads((Path(p) / "config.json").read_text())
            t = doc["meta"]["training"]
            for key, value in (("condition", name), ("n_layers", r.n_layers), ("optimizer", r.optimizer),
                               ("weight_decay", r.weight_decay), ("seed", int(s)), ("path", str(p)),
                               ("weight_hash", doc["weight_hash"]),
                               ("val_loss", float(t.get("final_val_loss") or math.nan)),
                               ("train_seconds", float(t.get("train_seconds") or math.nan))):
                rows[key].append(value)
    return rows


def run_head_study(out: str | os.PathLike, quick: bool = False, n_jobs: int = N_JOBS.default_for(KIND_NAME), plan: StudyPlan | None = None,
                   cache: str | os.PathLike | None = None, corpus=None, device: str = "cpu", force: bool = False,
                   progress: bool = False, command: Any = None, allow_large: bool = False) -> HeadStudyResult:
    """Train (cached), analyse every condition, write the study's run directory; return a :class:`HeadStudyResult`.

    Writes ``summary.parquet`` (item, value, ci_low, ci_high, verdict, pvalue, pvalue_holm,
    interval, multiplicity), ``conditions.parquet``,
    ``models.parquet``, ``study_layers.parquet``, per condition ``<cond>/heads|layers|residual|
    correlation|summary|replicates.parquet``, and the deepest AdamW condition's tables again at
    the top level (heads, layers, residual) for the HTML report. The plan's estimated work is checked
    first (circuitstat.pipelines.work; ``allow_large`` lifts the limit): a refused plan trains and writes nothing.
    """
    from joblib import Parallel, delayed

    from circuitstat.core.rundir import RunDir

    from circuitstat.pipelines.work import check_head_study

    plan = plan or (quick_plan() if quick else full_plan())
    check_head_study(plan, allow_large=allow_large)
    t0 = time.time()
    corpus_obj = corpus
    if corpus_obj is None:
        from circuitstat.circuits.corpus import load_corpus

        corpus_obj = load_corpus(plan.base.corpus)
    spec = {"study": "heads", "plan": plan.to_dict(), "corpus_hash": corpus_obj.content_hash}
    timings: dict[str, float] = {}
    paths = train_grid(plan, n_jobs=n_jobs, cache=cache, corpus=corpus_obj, device=device, progress=progress)
    timings["train_s"] = round(time.time() - t0, 1)
    names = [n for n, _ in plan.conditions()]
    headline = condition_name(max(plan.depths), *plan.optimizers[-1])
    with RunDir(out, spec=spec, command=command, seed=plan.seed, kind="study heads",
                provenance={"study": plan.name, "corpus": {"name": corpus_obj.name, "sha256": corpus_obj.content_hash}}) as run:
        weights = {n: [json.loads((Path(p) / "config.json").read_text())["weight_hash"] for p in paths[n]] for n in names}
        run.stage("models", lambda: {"models": _models_table(plan, paths)}, ["models"], params={"weights": weights})
        todo = [n for n in names if not run.is_done(f"analysis-{n}") or force]
        t1 = time.time()
        fitted = {}
        if todo:
            results = Parallel(n_jobs=max(1, min(int(n_jobs), len(todo))), backend="loky")(
                delayed(_fit_condition)(plan, [str(p) for p in paths[n]], corpus_obj) for n in todo)
            fitted = dict(zip(todo, results))
        for n in names:
            outs = [f"{n}/{t}" for t in ("heads", "layers", "residual", "head_details", "correlation", "summary",
                                         "refits", "replicates")]

            def compute(n=n):
                res = fitted.get(n) or _fit_condition(plan, [str(p) for p in paths[n]], corpus_obj)
                tabs = res.tables()
                d = {f"{n}/{k}": v for k, v in tabs.items()}
                d[f"{n}/replicates"] = _replicate_table(res)
                return d

            run.stage(f"analysis-{n}", compute, outs, params={"plan": plan.to_dict(), "weights": weights[n]},
                      depends_on=["models"], force=force)
        timings["analysis_s"] = round(time.time() - t1, 1)

        def summary():
            return _study_summary(run, plan, headline)

        run.stage("summary", summary, ["summary", "conditions", "study_layers", "heads", "layers", "residual"],
                  params={"plan": plan.to_dict()}, depends_on=["models"] + [f"analysis-{n}" for n in names], force=force)
        timings["total_s"] = round(time.time() - t0, 1)
    (Path(out) / "timings.json").write_text(json.dumps(timings, indent=2))
    return HeadStudyResult(Path(out), HEAD_STUDY_TABLES, "summary",
                           {"study": "heads", "plan": plan.to_dict(), "corpus_hash": corpus_obj.content_hash,
                            "confidence_level": 0.95},  # the summary's unadjusted intervals (circuitstat.stats.study_claims)
                           timings=timings, plan=plan)


@dataclass(frozen=True)
class HeadStudyRun:
    """A ``study heads`` run: its plan (None: the full study of docs/results.md), or ``quick``, the built-in tiny
    plan (not both). Its models are trained by the study, so it loads no model source."""

    plan: StudyPlan | None = None
    quick: bool = False

    def __post_init__(self) -> None:
        if self.plan is not None and self.quick:
            raise InputError("give a plan file or --quick, not both (--quick is the built-in tiny plan)")

    @property
    def sources(self) -> list[str]:
        """No model source: the study trains its models."""
        return []


def run_head_study_spec(spec: HeadStudyRun, out: str | os.PathLike, *, n_jobs: int = N_JOBS.default_for(KIND_NAME),
                        device: str = "cpu", force: bool = False, command: Any = None, allow_large: bool = False,
                        allow_pickle: bool = False, inputs: Any = None) -> HeadStudyResult:
    """The HeadStudyResult of the study ``spec`` written into ``out``: the kind's run (run_head_study; the study
    trains its own models, so ``allow_pickle`` and ``inputs`` have no use here)."""
    return run_head_study(out, quick=spec.quick, plan=spec.plan, n_jobs=n_jobs, device=device, force=force,
                          command=command, allow_large=allow_large)


KIND = RunKind(KIND_NAME, "do the claims of Bali et al. (2026) on head stability hold on models trained here?",
               run=run_head_study_spec, sources=lambda spec: spec.sources)
