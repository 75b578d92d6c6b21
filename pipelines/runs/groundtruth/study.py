"""Ground-truth study: how well discovery methods, and circuitstat's own error statements, recover known circuits.

``circuitstat study groundtruth SPEC --out DIR`` runs every method of the spec on every model with a
known circuit (circuitstat.circuits.groundtruth: tracr-compiled programs, planted circuits), on R disjoint datasets
of each size N drawn from the model's task, and scores each dataset against the truth
(circuitstat.stats.groundtruth_scoring).  A spec::

    models: [tracr:reverse, tracr:hist, tracr:sort, tracr:frac_prevs, tracr:detect_abc, tracr:dyck,
             "planted:induction?background=1", "planted:induction?background=3"]
    methods: [exact, eap, eap-ig-inputs, eap-ig-activations, clean-corrupted, atp-qkfix, atp-graddrop, atpstar]
    sizes: [16, 64, 256]
    n_datasets: 20        # R: datasets of each size, disjoint, so they are independent draws
    alphas: [0.05, 0.1]   # FDR levels of the q-value selections
    k_multiples: [0.5, 1, 2]   # top-k circuit sizes, as multiples of the true circuit's size
    faithfulness_methods: [exact]   # any of methods, edge-pruning too (cross-fitted with one refit per fold)
    verify: [16]          # optional: each approximate method verified on 16 prompts per dataset ("eap+verify16")
    refits: 10            # optional: bootstrap refits per dataset, the stability:refit family for every method
    edge_pruning: {steps: 50, lr: 0.2, sparsity: 1.0}   # when methods include edge-pruning (mask learning)
    ugs: {steps: 50, lr: 0.1, sparsity: 1.0, n_samples: 4}   # when methods include ugs (uniform gradient sampling)

Per model the population is R x max(N) prompts of its task; method scores are computed once on it
(a resumable stage per model and method) and dataset r of size N is the first N prompts of the r-th
block, so datasets of one N never share a prompt.  Tables (core/schema.py):
``groundtruth_models``, ``groundtruth_datasets`` (every per-dataset value), ``groundtruth_summary``
(means over datasets with t intervals; the estimand is in each row), ``groundtruth_fdr`` (realised FDR
against alpha), ``groundtruth_roc`` (ROC curves averaged over datasets).  The pipeline orchestrates;
every number comes from stats/.
"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from circuitstat.core.errors import InputError

from circuitstat.core.params import BATCH_SIZE, IG_STEPS, N_RESAMPLES, resamples_for_level
from circuitstat.pipelines.spec import METHOD, KGrid, RunOptions, load_yaml, validate_spec
from circuitstat.pipelines.kinds import RunKind
from circuitstat.pipelines.runs.groundtruth.masks import MASK_METHODS, EdgePruningOptions
from circuitstat.pipelines.spec import UGSOptions

if TYPE_CHECKING:
    from circuitstat.core.run_tables import RunTables

__all__ = ["GroundTruthSpec", "load_groundtruth_spec", "run_groundtruth_study", "summary_lines", "TABLES",
           "population_evaluations",
           "DEFAULT_MODELS"]

DEFAULT_MODELS = ["tracr:frac_prevs", "tracr:reverse", "tracr:hist", "tracr:sort", "tracr:detect_abc", "tracr:dyck",
                  "planted:induction?background=1", "planted:induction?background=3"]
TABLES = ("groundtruth_models", "groundtruth_datasets", "groundtruth_summary", "groundtruth_fdr", "groundtruth_roc")
ROC_GRID = np.linspace(0.0, 1.0, 21)
KEYS = ("model", "method", "n")
# attribution methods, and methods without per-example scores (circuitstat.pipelines.runs.groundtruth.masks)
GT_METHOD = Literal[METHOD, "edge-pruning"]


class GroundTruthSpec(RunOptions):
    """What a ground-truth study runs; see the module docstring."""

    models: list[str] = Field(default_factory=lambda: list(DEFAULT_MODELS), min_length=1)
    methods: list[GT_METHOD] = Field(default_factory=lambda: ["exact", "eap", "eap-ig-inputs", "eap-ig-activations",
                                                           "clean-corrupted", "atp-qkfix", "atp-graddrop", "atpstar"],
                                  min_length=1)
    sizes: KGrid = Field(default_factory=lambda: [16, 64, 256], min_length=1)
    n_datasets: int = Field(20, ge=5, le=10_000)
    alphas: list[float] = Field(default_factory=lambda: [0.05, 0.1], min_length=1)
    k_multiples: list[float] = Field(default_factory=lambda: [0.5, 1.0, 2.0], min_length=1)
    ranking: Literal["absolute", "signed"] = "absolute"
    n_resamples: int = N_RESAMPLES.pydantic("groundtruth")  # the audit's default: its p-value floor 1/(B+1) lets BH reject
    thresholds: list[float] = Field(default_factory=lambda: [0.6, 0.75, 0.9], min_length=1)
    n_subsamples: int = Field(100, ge=10, le=100_000)
    faithfulness_methods: list[GT_METHOD] = Field(default_factory=lambda: ["exact"])
    ig_steps: int = IG_STEPS.pydantic()
    confidence_level: float = Field(0.95, gt=0.5, lt=1.0)
    batch_size: int = BATCH_SIZE.pydantic("groundtruth")
    # verified runs as methods (docs/verified.md): each approximate method verified on n of each dataset's prompts,
    # scored as "<method>+verify<n>"; the exact cells come from the exact scores of the population (bit for bit
    # what circuitstat.circuits.verify.exact_subset computes), so "exact" must be among the methods
    verify: list[int] = Field(default_factory=list)
    # bootstrap refits per dataset (0: none): edge pruning refitted on each, per-example methods' resampled means
    refits: int = Field(0, ge=0, le=10_000)
    edge_pruning: EdgePruningOptions = Field(default_factory=EdgePruningOptions)
    ugs: UGSOptions = Field(default_factory=UGSOptions)  # when methods include ugs (docs/edge-pruning.md)

    @property
    def level(self) -> str:
        """Attribution level: the truth is a set of edges."""
        return "edge"

    @property
    def ablation(self) -> str:
        """Edges outside a circuit carry the corrupted prompt's values (the truth is derived for that)."""
        return "counterfactual"


def parse_groundtruth_spec(data: Any, source: str = "<spec>") -> GroundTruthSpec:
    """A validated GroundTruthSpec from parsed YAML, or InputError naming each bad key."""
    spec = validate_spec(GroundTruthSpec, data, source, kind="ground-truth spec", keys="models, methods, sizes, ...")
    bad = [a for a in spec.alphas if not 0 < a < 1] + [m for m in spec.k_multiples if m <= 0]
    if bad:
        raise InputError(f"invalid ground-truth spec {source}: alphas must lie in (0, 1) and k_multiples be "
                         f"positive; got {bad[0]}")
    if any(not 0.5 < t <= 1 for t in spec.thresholds):
        raise InputError(f"invalid ground-truth spec {source}: stability thresholds must lie in (0.5, 1]")
    if not set(spec.faithfulness_methods) <= set(spec.methods):
        raise InputError(f"invalid ground-truth spec {source}: faithfulness_methods must be among methods")
    bad = [m for m in spec.models if not m.startswith(("tracr:", "planted:"))]
    if bad:
        raise InputError(f"invalid ground-truth spec {source}: model {bad[0]!r} is not a built-in ground-truth source; "
                         "use tracr:NAME or planted:induction?... (fixture directories load from Python only)")
    resamples_for_level(spec.n_resamples, spec.confidence_level, f"invalid ground-truth spec {source}: n_resamples")
    for m in spec.models:  # each source's knobs and sizes are in range before anything is built
        if m.startswith("planted:"):
            from circuitstat.circuits.groundtruth import parse_planted

            parse_planted(m)
    slugs: dict[str, str] = {}
    for m in spec.models:  # table names come from the source: two sources must never share one
        other = slugs.setdefault(_slug(m), m)
        if other != m or spec.models.count(m) > 1:
            raise InputError(f"invalid ground-truth spec {source}: models {other!r} and {m!r} would write the same "
                             f"tables (scores_{_slug(m)}_*); list each model once, written differently")
    if spec.sizes[0] < 4:
        raise InputError(f"invalid ground-truth spec {source}: sizes must be at least 4 prompts")
    if spec.refits in (1, 2):
        raise InputError(f"invalid ground-truth spec {source}: refits must be 0 (none) or at least 3 (the pairwise "
                         "Jaccard of refits and its jackknife need three)")
    if spec.verify and "exact" not in spec.methods:
        raise InputError(f"invalid ground-truth spec {source}: verify needs 'exact' among the methods (its cells on "
                         "the verified prompts)")
    if spec.verify and not all(4 <= n <= spec.sizes[0] - 2 for n in spec.verify):
        raise InputError(f"invalid ground-truth spec {source}: each verify n must lie in [4, {spec.sizes[0] - 2}] "
                         "(at least 2 of the smallest dataset's prompts left unverified)")
    return spec


def verified_name(method: str, n: int) -> str:
    """The method name a verified run of ``method`` on ``n`` prompts is scored under, e.g. ``eap+verify16``."""
    return f"{method}+verify{n}"


def _verified_rows(S: np.ndarray, X: np.ndarray, gt, spec: GroundTruthSpec, method: str, n_verify: int,
                   seed) -> list[dict]:
    """Every per-dataset row of ``method`` verified on ``n_verify`` prompts of each dataset (drawn from ``seed``)."""
    from circuitstat.core.seeds import spawn_seeds
    from circuitstat.stats.groundtruth_scoring import score_verified_dataset

    k_true = int(gt.truth.sum())
    ks = sorted({max(1, int(round(m * k_true))) for m in spec.k_multiples} - {gt.truth.size})
    block, out = max(spec.sizes), []
    seeds = iter(spawn_seeds(seed, len(spec.sizes) * spec.n_datasets))
    name = verified_name(method, n_verify)
    for n in spec.sizes:
        for r in range(spec.n_datasets):
            rows = np.arange(r * block, r * block + n)
            s = next(seeds)
            lab = np.sort(np.random.default_rng(s).choice(n, size=n_verify, replace=False))
            vals = score_verified_dataset(S[rows], X[rows][lab], lab, gt.truth, ks=ks, alphas=spec.alphas,
                                          ranking=spec.ranking, seed=s)
            out += [{"model": "", "method": name, "n": n, "dataset": r, "family": f, "statistic": st,
                     "param": p, "value": float(v)} for f, st, p, v in vals]
    return out


def load_groundtruth_spec(path: str | Path) -> GroundTruthSpec:
    """The validated ground-truth spec in a YAML file (its models are built-in sources, never paths)."""
    return parse_groundtruth_spec(load_yaml(path), str(path))


def _slug(source: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", source).strip("_")


def _population_seed(run, source: str) -> int:
    return int(run.stage_seed(f"task:{source}").generate_state(1)[0] % (2**31))


def _model_row(gt, source: str, population: int) -> dict:
    return {"model": source, "kind": gt.kind, "describe": gt.describe, "n_edges": int(gt.truth.size),
            "n_true": int(gt.truth.sum()), "n_null": int(gt.null_edges.sum()),
            "n_per_example_nulls": int(gt.per_example_nulls.sum()) if gt.per_example_nulls is not None else 0,
            "n_structural": int(gt.extra["structural"].sum()) if "structural" in gt.extra else -1,
            "population": population, "weight_hash": gt.model.weight_hash(), "true_edges": ",".join(gt.truth_names())}


def population_evaluations(gt, task, spec: GroundTruthSpec):
    """PopulationEvaluations of the model's circuits on every population prompt (faithfulness family)."""
    from circuitstat.circuits.faithfulness import faithfulness
    from circuitstat.stats.calibration_kinds import PopulationEvaluations

    def evaluate(masks: np.ndarray, rows: np.ndarray):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # undefined examples are NaN and counted there
            r = faithfulness(gt.model, task, masks, rows=rows, seed=spec.seed, batch_size=spec.batch_size,
                             progress=False)
        return r.m_circuit, r.m_clean, r.m_empty

    return PopulationEvaluations(evaluate, task.n, gt.truth.size)


def _dataset_rows(S: np.ndarray, gt, spec: GroundTruthSpec, method: str, evals, seed) -> list[dict]:
    """Every per-dataset row of one model and method (circuitstat.stats.groundtruth_scoring), with ROC points."""
    from circuitstat.stats.groundtruth import roc_on_grid
    from circuitstat.stats.groundtruth_scoring import faithfulness_dataset, score_dataset
    from circuitstat.core.seeds import spawn_seeds
    from circuitstat.core.topk import ranking_key

    k_true = int(gt.truth.sum())
    ks = sorted({max(1, int(round(m * k_true))) for m in spec.k_multiples} - {gt.truth.size})
    block, out = max(spec.sizes), []
    seeds = iter(spawn_seeds(seed, len(spec.sizes) * spec.n_datasets))
    for n in spec.sizes:
        for r in range(spec.n_datasets):
            rows = np.arange(r * block, r * block + n)
            s = next(seeds)
            vals = score_dataset(S[rows], gt.truth, ks=ks, alphas=spec.alphas, ranking=spec.ranking,
                                 n_resamples=spec.n_resamples, thresholds=spec.thresholds,
                                 n_subsamples=spec.n_subsamples, seed=s)
            if evals is not None:
                vals += faithfulness_dataset(S[rows], rows, gt.truth, evals, true_value=1.0, ranking=spec.ranking,
                                             n_resamples=spec.n_resamples, confidence_level=spec.confidence_level,
                                             seed=s)
            key = ranking_key(S[rows].sum(0) / n, spec.ranking)
            vals += [("roc", "tpr", f"fpr={x:.2f}", float(t)) for x, t in zip(ROC_GRID, roc_on_grid(key, gt.truth,
                                                                                                 ROC_GRID))]
            out += [{"model": "", "method": method, "n": n, "dataset": r, "family": f, "statistic": st,
                     "param": p, "value": float(v)} for f, st, p, v in vals]
    return out


def _roc_table(summary: list[dict]) -> dict[str, list]:
    rows = [r for r in summary if r["family"] == "roc"]
    return {"model": [r["model"] for r in rows], "method": [r["method"] for r in rows], "n": [r["n"] for r in rows],
            "fpr": [float(r["param"].split("=")[1]) for r in rows], "tpr": [r["estimate"] for r in rows],
            "tpr_ci_low": [r["ci_low"] for r in rows], "tpr_ci_high": [r["ci_high"] for r in rows],
            "estimand": [r["estimand"] for r in rows]}


def _columns(rows: list[dict], table: str | None = None) -> dict[str, list]:
    """Rows as columns; no rows (e.g. no FDR rows when every method is a mask method): the table's columns, empty."""
    from circuitstat.core.schema import columns

    if rows:
        return {k: [r[k] for r in rows] for k in rows[0]}
    return {c: [] for c in columns(table)} if table else {}


def _check_circuit_sizes(spec: GroundTruthSpec, loaded: dict) -> None:
    """Raise InputError when a circuit size the study selects (k_multiples x the true circuit's size) exceeds a
    model's graph; None when every size fits."""
    for m, gt in loaded.items():
        k_true, n_edges = int(gt.truth.sum()), int(gt.truth.size)
        if max(1, round(max(spec.k_multiples) * k_true)) > n_edges:
            raise InputError(f"k_multiples up to {max(spec.k_multiples):g} x the true circuit ({k_true} edges) exceed "
                             f"the {n_edges} edges of {m}; use k_multiples of at most {n_edges / k_true:g}")


def run_groundtruth_study(spec: GroundTruthSpec, out: str | Path, *, n_jobs: int | None = None,
                          force: bool = False, allow_large: bool = False) -> RunTables:
    """Run (or resume) the ground-truth study of ``spec`` into run directory ``out``; return its tables.

    Its work is estimated first (circuitstat.pipelines.work.groundtruth_operations) and refused above the limit
    unless ``allow_large``."""
    from circuitstat.circuits.groundtruth import load_groundtruth
    from circuitstat.core.rundir import RunDir
    from circuitstat.core.run_tables import RunTables
    from circuitstat.core.tables import table_to_matrix
    from circuitstat.stats.groundtruth_scoring import fdr_rows, summarise

    from circuitstat.pipelines.runs.audit.run import attribution_scores
    from circuitstat.pipelines.runs.groundtruth.masks import pruning_rows, refit_stability_rows
    from circuitstat.pipelines.training import use_deterministic

    use_deterministic()
    loaded = {m: load_groundtruth(m) for m in spec.models}  # every source is checked before anything is written
    _check_circuit_sizes(spec, loaded)  # before any attribution
    from circuitstat.pipelines.work import announce, check_groundtruth

    announce("study groundtruth", check_groundtruth(spec, loaded, allow_large=allow_large))  # before any work
    doc = spec.model_dump(exclude=_unused_keys(spec))  # older runs resume unchanged
    population = spec.n_datasets * max(spec.sizes)
    with RunDir(out, spec=doc, command=sys.argv, seed=spec.seed, kind="study groundtruth",
                provenance={"models": {m: gt.identity() for m, gt in loaded.items()}}) as run:
        tasks = {m: gt.task(population, _population_seed(run, m)) for m, gt in loaded.items()}
        for m, gt in loaded.items():
            for method in _score_methods(spec):
                name = f"scores_{_slug(m)}_{method.replace('-', '_')}"
                params = {"weight_hash": gt.model.weight_hash(), "task_hash": tasks[m].content_hash, "method": method,
                          **{k: doc[k] for k in ("ig_steps", "batch_size", "seed")}}
                run.stage(name, lambda gt=gt, m=m, method=method, name=name: {name: attribution_scores(
                    gt.model, tasks[m], method, spec, n_jobs or spec.n_jobs).tables({"task": tasks[m].describe()})[
                    "scores"]}, [name], params=params, force=force)

        def evaluate() -> dict:
            per_dataset, models = [], []
            for m, gt in loaded.items():
                models.append(_model_row(gt, m, population))
                evals = population_evaluations(gt, tasks[m], spec) if spec.faithfulness_methods else None
                for mm, stage in (("edge-pruning", "prune"), ("ugs", "ugs")):  # the mask-learned methods
                    if mm in spec.methods:
                        ep_evals = evals if mm in spec.faithfulness_methods else None
                        per_dataset += _with_model(m, pruning_rows(gt, tasks[m], spec, run.stage_seed(f"{stage}:{m}"),
                                                                   ROC_GRID, ep_evals, method=mm))
                for method in _score_methods(spec):
                    S = np.asarray(table_to_matrix(run.table(f"scores_{_slug(m)}_{method.replace('-', '_')}")),
                                   dtype=np.float64)
                    rows = _dataset_rows(S, gt, spec, method, evals if method in spec.faithfulness_methods else None,
                                         run.stage_seed(f"evaluate:{m}:{method}"))
                    for r in rows:
                        r["model"] = m
                    per_dataset += rows
                    if spec.refits >= 3:
                        per_dataset += _with_model(m, refit_stability_rows(S, gt, spec, method,
                                                                           run.stage_seed(f"refit:{m}:{method}")))
                    if method == "exact" or not spec.verify:
                        continue
                    X = np.asarray(table_to_matrix(run.table(f"scores_{_slug(m)}_exact")), dtype=np.float64)
                    for nv in spec.verify:
                        rows = _verified_rows(S, X, gt, spec, method, nv,
                                              run.stage_seed(f"verify:{m}:{method}:{nv}"))
                        for r in rows:
                            r["model"] = m
                        per_dataset += rows
            summary = summarise(per_dataset, KEYS, spec.confidence_level)
            return {"groundtruth_models": _columns(models), "groundtruth_datasets": _columns(per_dataset),
                    "groundtruth_summary": _columns([r for r in summary if r["family"] != "roc"]),
                    "groundtruth_fdr": _columns(fdr_rows(per_dataset, KEYS), "groundtruth_fdr"), "groundtruth_roc": _roc_table(summary)}

        keys = ("sizes", "n_datasets", "alphas", "k_multiples", "ranking", "n_resamples", "thresholds", "n_subsamples",
                "faithfulness_methods", "confidence_level") + tuple(k for k in ("verify", "refits", "edge_pruning", "ugs")
                                                                   if k in doc)
        deps = [f"scores_{_slug(m)}_{method.replace('-', '_')}" for m in spec.models for method in _score_methods(spec)]
        run.stage("evaluate", evaluate, list(TABLES), params={k: doc[k] for k in keys}, depends_on=deps, force=force)
    return RunTables(Path(out), TABLES, "groundtruth_summary", {"study": "groundtruth", "spec": doc})


def _score_methods(spec: GroundTruthSpec) -> list[str]:
    """The spec's methods with per-example scores (a scores stage each); mask methods are fitted per dataset."""
    return [m for m in spec.methods if m not in MASK_METHODS]


def _unused_keys(spec: GroundTruthSpec) -> set[str]:
    """Spec keys left out of the recorded spec when unused, so runs from before they existed resume unchanged."""
    out = set() if spec.verify else {"verify"}
    if not spec.refits:
        out.add("refits")
    if "edge-pruning" not in spec.methods:
        out.add("edge_pruning")
    if "ugs" not in spec.methods:
        out.add("ugs")
    return out


def _with_model(model: str, rows: list[dict]) -> list[dict]:
    for r in rows:
        r["model"] = model
    return rows


def _pick(summary: dict[str, list], model: str, method: str, n: int, family: str, statistic: str,
          param: str = "") -> tuple[float, float, float]:
    for i in range(len(summary["model"])):
        if (summary["model"][i], summary["method"][i], summary["n"][i], summary["family"][i], summary["statistic"][i],
                summary["param"][i]) == (model, method, n, family, statistic, param):
            return summary["estimate"][i], summary["ci_low"][i], summary["ci_high"][i]
    return float("nan"), float("nan"), float("nan")


def summary_lines(tables: dict[str, Any], alpha: float = 0.05) -> list[str]:
    """The one-screen summary: per model and method at the largest N, AUROCs, F1 at the true size, FDR."""
    s = tables["groundtruth_summary"].to_pydict()
    fdr = tables["groundtruth_fdr"].to_pydict()
    models = tables["groundtruth_models"].to_pydict()
    n = max(s["n"])

    def ci(v: tuple[float, float, float]) -> str:
        return f"{v[0]:.2f} [{v[1]:.2f},{v[2]:.2f}]" if np.isfinite(v[0]) else "—"

    lines = [f"ground truth at N = {n} ({max(s['n_datasets'])} datasets; [..]: 95% t interval over datasets of "
             f"the expected value for a dataset of N prompts)",
             f"{'model':<34} {'method':<19} {'AUROC':>17} {'pessimistic':>17} {'F1 top-|C|':>17} "
             f"{'FDR q=' + format(alpha, 'g'):>14} {'power':>17}"]
    for i, m in enumerate(models["model"]):
        k = models["n_true"][i]
        for method in dict.fromkeys(s["method"]):
            a = _pick(s, m, method, n, "ranking", "auroc")
            if not np.isfinite(a[0]):
                continue
            test = "verified" if "+verify" in method else "bootstrap"
            f = [j for j in range(len(fdr["model"])) if (fdr["model"][j], fdr["method"][j], fdr["n"][j],
                                                          fdr["test"][j], fdr["alpha"][j]) == (m, method, n,
                                                                                              test, alpha)]
            fd = f"{fdr['fdr'][f[0]]:.3f} {fdr['verdict'][f[0]]}" if f else "—"  # the whole verdict: 'trivial'
            pw = ci((fdr["power"][f[0]], fdr["power_ci_low"][f[0]], fdr["power_ci_high"][f[0]])) if f else "—"
            lines.append(f"{m[:34]:<34} {method:<19} {ci(a):>17} {ci(_pick(s, m, method, n, 'ranking', 'auroc_pessimistic')):>17} "
                         f"{ci(_pick(s, m, method, n, 'topk', 'f1', f'k={k}')):>17} {fd:>14} {pw:>17}")
    return lines


def _run_kind(spec: GroundTruthSpec, out, *, n_jobs: int | None = None, force: bool = False,
              allow_pickle: bool = False, allow_large: bool = False, inputs=None) -> RunTables:
    # its models are built in (no sources to resolve, no pickles to read): allow_pickle and inputs have no use here
    return run_groundtruth_study(spec, out, n_jobs=n_jobs, force=force, allow_large=allow_large)


KIND = RunKind("study groundtruth", "discovery methods and circuitstat's own error statements against known circuits",
               parse=parse_groundtruth_spec, run=_run_kind, sources=lambda spec: list(spec.models))
