"""The audit's stages, each declared once: a :class:`Stage` says when it runs (from the spec alone), how it runs
(on an :class:`AuditContext`), what it costs (FLOPs from the spec and a model config) and which tables it writes.

:data:`STAGES` is the one tuple, in run order: ``run_audit`` loops over it, ``audit_stages()`` lists it and
``audit/pricing.audit_flops`` sums it, so the three cannot disagree (tests/pipelines/test_audit_stages.py).
Adding a stage is one function here and one entry in the tuple.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import numpy as np

from circuitstat.pipelines.runs.audit import common as R
from circuitstat.pipelines.runs.audit.masks import MASK_OUTPUTS, mask_faithfulness_table, mask_methods, mask_stability_tables, \
    pruning_audit_flops, read_refits, score_methods
from circuitstat.pipelines.runs.audit.pricing import faithfulness_flops, heads_flops, tests_flops
from circuitstat.pipelines.runs.audit.scores import RunScores
from circuitstat.pipelines.runs.audit.tables import approximation_tables, concat_parts, edge_stats_table, stability_tables
from circuitstat.pipelines.spec import AuditSpec
from circuitstat.pipelines.sources import LOCAL, RunInputs

__all__ = ["Stage", "AuditContext", "STAGES", "HEADS_OUTPUTS", "stage_names", "audit_flops"]

HEADS_OUTPUTS = ("heads", "layers", "residual", "head_details", "correlation", "summary")


def _free(spec: AuditSpec, cfg: Any) -> float:
    return 0.0


@dataclass(frozen=True)
class Stage:
    """One audit stage: ``when(spec)`` it runs, ``run(ctx)`` writes it, ``flops(spec, cfg)`` prices it and
    ``outputs(spec)`` names its tables. ``names(spec)``: the RunDir stage names when one record writes several
    (the scores stage writes ``scores_<method>`` per score method); otherwise the stage's own name."""

    name: str
    when: Callable[[AuditSpec], bool]
    run: Callable[["AuditContext"], None]
    outputs: Callable[[AuditSpec], list[str]]
    flops: Callable[[AuditSpec, Any], float] = _free
    names: Callable[[AuditSpec], list[str]] | None = None

    def stage_names(self, spec: AuditSpec) -> list[str]:
        """The RunDir stages this record writes for ``spec`` (none when it does not run)."""
        if not self.when(spec):
            return []
        return self.names(spec) if self.names is not None else [self.name]


@dataclass
class AuditContext:
    """What the stages of one audit share: the run directory, the spec (k already holding a published circuit's
    sizes), model 0, the task, the workers and the loading options; the stage being run is ``stage``."""

    run: Any
    spec: AuditSpec
    model: Any
    task: Any
    workers: int
    force: bool
    sources: list[str]
    circuit: Any = None
    allow_pickle: bool = False
    allow_large: bool = False
    inputs: RunInputs = LOCAL
    names: list[str] = field(default_factory=list)  # the edge or node names (the index stage sets them)
    stage: Stage | None = None

    def write(self, fn, *, params: Any = None, depends_on: list[str] = (), name: str | None = None,
              outputs: list[str] | None = None) -> None:
        """Run ``fn`` as the current stage (or ``name``), recording its declared outputs (or ``outputs``)."""
        R.run_stage(self.run, name or self.stage.name, fn, list(outputs or self.stage.outputs(self.spec)),
                    params=params, depends_on=list(depends_on), force=self.force)

    @property
    def n(self) -> int:
        """The number of prompts."""
        return self.task.clean.shape[0]

    @property
    def groups(self):
        """The prompts' templates, or None."""
        return None if self.task.group is None else self.task.group.numpy()

    @property
    def base(self) -> dict:
        """The model and task identity every scores and masks stage records."""
        return {"weight_hash": self.model.weight_hash(), "task_hash": self.task.content_hash}

    @cached_property
    def scores(self) -> RunScores:
        """The score methods' [N, E] scores, read in blocks or whole within a bound."""
        return RunScores(self.run, score_methods(self.spec), allow_large=self.allow_large)

    @cached_property
    def verified(self) -> dict:
        """{verified method: (pseudo-scores, strata)} (reads the verified stage)."""
        return verified_circuit_methods(self.run, self.spec)

    @cached_property
    def fits(self) -> dict:
        """{mask method: (fit [E], refits [R, E])} (reads the masks stage)."""
        return {m: read_refits(self.run.table("mask_fits"), m) for m in mask_methods(self.spec)}

    def plan(self, for_intervals: bool, stage: str = "resampling"):
        """The run's resampling plan (circuitstat.pipelines.runs.audit.run.resampling_plan)."""
        return R.resampling_plan(self.spec, self.n, self.groups, self.run.stage_seed(stage), for_intervals=for_intervals)

    def resampling_params(self) -> dict:
        """The params the resampling stages record."""
        return {"bootstrap": self.spec.bootstrap.model_dump(), "k": list(self.spec.k), "ranking": self.spec.ranking}

    def score_deps(self) -> list[str]:
        """The scores stages every analysis depends on."""
        return [f"scores_{m}" for m in score_methods(self.spec)]

    def circuit_deps(self) -> list[str]:
        """The stages a circuit-selecting stage depends on (scores, verified, masks)."""
        return (self.score_deps() + (["verified"] if self.verified else [])
                + (["masks"] if mask_methods(self.spec) else []))


def verified_circuit_methods(run, spec: AuditSpec) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"<approx>+verified": (pseudo-scores [N, E], strata [N])} of a verified run on every edge, else {} (with
    ``verify.edges`` only a sample of edges has estimates, so no circuit over the graph is selected from them; nor
    with the active design, whose estimates have no pseudo-scores)."""
    from circuitstat.pipelines import verify as V

    if spec.verify is None or spec.verify.edges is not None or spec.verify.design == "active":
        return {}  # the active design writes no pseudo-scores (its cells are no stratum of prompts)
    table = run.table("verified_pseudo")
    return {V.verified_method(m): V.read_pseudo(table, m) for m in score_methods(spec) if m != "exact"}


def _estimand(spec: AuditSpec, strata: np.ndarray) -> str:
    """The ranked_by words of a verified method: its estimates' estimand, with n and N."""
    from circuitstat.stats.verified import verified_estimand

    return f"{verified_estimand(int(strata.sum()), strata.size)} (PPI++ estimates)"


def _index(ctx: AuditContext) -> None:
    from circuitstat.circuits.scores import ScoreMatrix

    spec, graph = ctx.spec, ctx.model.graph
    n_cols = graph.n_edges if spec.level == "edge" else graph.n_senders
    (table,) = _index_outputs(spec)
    sm0 = ScoreMatrix(np.zeros((1, n_cols), np.float32), graph, spec.level, "none", spec.ablation, "none")
    ctx.write(lambda: {table: sm0.tables()[table]}, params=ctx.base)
    ctx.names = sm0.names


def _index_outputs(spec: AuditSpec) -> list[str]:
    return ["edges" if spec.level == "edge" else "nodes"]


def _scores_provenance(task) -> dict:
    """The scores tables' provenance: the task, and its templates (one label per prompt) where it has them, so a
    cluster-scheme run is a sample-size pilot (circuitstat.pipelines.runs.sample_size.simulate)."""
    out = {"task": task.describe()}
    if task.group is not None:
        out["groups"] = [int(g) for g in task.group.tolist()]
    return out


def _scores(ctx: AuditContext) -> None:
    spec, doc = ctx.spec, R.audit_spec_doc(ctx.spec)
    attr_keys = ("level", "ablation", "input_node", "batch_size", "ig_steps", "seed") + (
        ("moe_nodes",) if spec.moe_nodes != "block" else ())
    for method in score_methods(spec):
        params = {**ctx.base, "method": method, "task": spec.task.model_dump(), **{k: doc[k] for k in attr_keys}}
        ctx.write(lambda method=method: {f"scores_{method}": R.attribution_scores(
            ctx.model, ctx.task, method, spec, ctx.workers).tables(_scores_provenance(ctx.task))["scores"]},
            params=params, name=f"scores_{method}", outputs=[f"scores_{method}"])


def _scores_flops(spec: AuditSpec, cfg) -> float:
    from circuitstat.pipelines.build import attribution_flops

    return sum(attribution_flops(cfg, spec, m, spec.task.n, ig_steps=spec.ig_steps, level=spec.level)
               for m in score_methods(spec))


def _masks(ctx: AuditContext) -> None:
    from circuitstat.pipelines.runs.audit.masks import mask_tables

    spec = ctx.spec
    params = {**ctx.base, "methods": mask_methods(spec), "edge_pruning": spec.edge_pruning.model_dump(),
              **({"ugs": spec.ugs.model_dump()} if "ugs" in spec.methods else {}),
              "task": spec.task.model_dump(), "bootstrap": spec.bootstrap.model_dump(),
              **{k: getattr(spec, k) for k in ("ablation", "input_node", "batch_size", "seed")}}
    ctx.write(lambda: mask_tables(ctx.model, ctx.task, spec, ctx.names,
                                  {m: R.refit_plan(spec, ctx.n, ctx.groups, ctx.run.stage_seed("resampling"), m)
                                   for m in mask_methods(spec)}), params=params)


def _masks_flops(spec: AuditSpec, cfg) -> float:
    from circuitstat.pipelines.build import task_positions

    positions = task_positions(spec.task.name, spec.task.options or {}) or min(int(cfg.n_ctx), 64)
    return pruning_audit_flops(spec, cfg, positions)  # edge pruning's fits and refits


def _verified(ctx: AuditContext) -> None:
    """Exact patching on a random subset checks every approximate method (pipelines.verify)."""
    from circuitstat.pipelines import verify as V

    spec, scores, names = ctx.spec, ctx.scores, ctx.names
    held = len(score_methods(spec))
    seed = V.draw_seed(spec.verify.seed, ctx.run.stage_seed("verified"))
    params = {"verify": spec.verify.model_dump(), "seed": seed, "confidence_level": spec.bootstrap.confidence_level}
    if spec.verify.combine is not None:  # recorded only then: other runs' stage parameters stay as before
        params["combined"] = {V.combined_method(spec.verify.combine): _combined_design(spec)}

    def compute():
        approx = {m: scores.whole(m, "verified", held) for m in score_methods(spec) if m != "exact"}
        if spec.verify.design == "active":
            return _active_verified(ctx, approx, seed)
        plan = V.verify_plan(approx, spec.verify, seed)
        if "exact" in scores.methods:  # exact on every prompt already: its cells are the subset's, bit for bit
            cols = np.arange(len(names)) if plan.all_edges else plan.edges()
            exact = scores.whole("exact", "verified", held)[np.ix_(plan.rows, cols)].astype(np.float64)
        else:
            exact, cols = V.run_exact(ctx.model, ctx.task, plan, ablation=spec.ablation, seed=spec.seed,
                                      batch_size=spec.batch_size, input_node=spec.input_node)
        return V.verified_tables(approx, exact, cols, plan, names, confidence_level=spec.bootstrap.confidence_level,
                                 tau=spec.verify.tau, correction=spec.verify.correction, combine=spec.verify.combine)

    ctx.write(compute, params=params, depends_on=ctx.score_deps())


def _combined_design(spec: AuditSpec) -> str:
    """The library's name of the combination's design (circuitstat.stats.verified.multi's defaults, n verified)."""
    from circuitstat.stats.verified.multi import MULTI_FOLDS, MULTI_SHRINK, multi_label

    n = spec.verify.n
    return multi_label(len(spec.verify.combine), n if MULTI_FOLDS is None else MULTI_FOLDS, n, MULTI_SHRINK)


def _active_verified(ctx: AuditContext, approx: dict, seed: int) -> dict:
    """The verified stage's tables with the active design (pipelines.verify.active_tables): exact on the sampled
    cells, read from exact on every prompt when the audit computed it (its cells are the same bits)."""
    from circuitstat.pipelines import verify as V

    spec, held = ctx.spec, len(score_methods(ctx.spec))
    if "exact" in ctx.scores.methods:
        full = ctx.scores.whole("exact", "verified", held).astype(np.float64)
        exact = lambda cells: np.where(cells, full, np.nan)  # noqa: E731
    else:
        exact = lambda cells: V.exact_on_cells(ctx.model, ctx.task, cells, ablation=spec.ablation,  # noqa: E731
                                               seed=spec.seed, batch_size=spec.batch_size,
                                               input_node=spec.input_node)
    return V.active_tables(approx, exact, spec.verify.budget, seed, ctx.names,
                           confidence_level=spec.bootstrap.confidence_level, correction=spec.verify.correction)


def _verified_flops(spec: AuditSpec, cfg) -> float:
    scored = score_methods(spec)
    if "exact" in scored:  # with exact on all prompts, phase 2 is free
        return 0.0
    from circuitstat.pipelines.verify import phase2_flops

    return phase2_flops(cfg, spec, spec.verify, n_methods=sum(m != "exact" for m in scored))


def _edge_stats(ctx: AuditContext) -> None:
    def compute():
        plan = ctx.plan(for_intervals=True)
        return {"edge_stats": concat_parts([edge_stats_table(ctx.scores.columns(m), ctx.names, m, plan, ctx.spec,
                                                             ctx.workers) for m in score_methods(ctx.spec)])}

    ctx.write(compute, params=ctx.resampling_params(), depends_on=ctx.score_deps())


def _faithfulness(ctx: AuditContext) -> None:
    spec, ks = ctx.spec, list(ctx.spec.k)

    def compute():
        plan, seed = ctx.plan(for_intervals=True), ctx.run.stage_seed("faithfulness")
        model, task = ctx.model, ctx.task
        parts = [R.faithfulness_with_search(model, task, ctx.scores.whole(m, "faithfulness"), m, ks, plan, spec, seed)
                 for m in score_methods(spec)]
        parts += [mask_faithfulness_table(model, task, ctx.fits[m][0], m, ks, plan, spec, seed)
                  for m in mask_methods(spec)]
        parts += [R.faithfulness_with_search(model, task, C, vm, ks, plan, spec, seed, strata=strata,
                                             ranked_by=_estimand(spec, strata))
                  for vm, (C, strata) in ctx.verified.items()]
        return {"faithfulness_vs_k": concat_parts(parts)}

    ctx.write(compute, params={**ctx.resampling_params(), "k_search": spec.k_search}, depends_on=ctx.circuit_deps())


def _chosen_ks(run, spec: AuditSpec, ks: list[int]):
    """method -> the k grid plus the circuit size the verdict shows for it (a k the faithfulness search chose
    beyond the grid), so the report reads stability and inclusion at the circuit's own k."""
    if not spec.faithfulness:
        return lambda method: ks
    from circuitstat.reports.tableset import Tables
    from circuitstat.reports.verdicts import choose_k

    T = Tables(run.path)

    def at(method: str) -> list[int]:
        k, _ = choose_k(T, method)
        return sorted(set(ks) | ({int(k)} if k is not None else set()))

    return at


def _stability(ctx: AuditContext) -> None:
    spec, names, workers = ctx.spec, ctx.names, ctx.workers

    def compute():
        from circuitstat.stats import ResamplingPlan

        plan, seed = ctx.plan(for_intervals=False), ctx.run.stage_seed
        at = _chosen_ks(ctx.run, spec, list(spec.k))
        parts = [stability_tables(ctx.scores.columns(m), names, m, plan, at(m), spec, workers)
                 for m in score_methods(spec)]
        # refits over the same scheme's resamples, n_refits of them (the masks stage's plan)
        parts += [mask_stability_tables(ctx.fits[m][1], names, m, R.refit_plan(spec, ctx.n, ctx.groups, seed("resampling"), m),
                                        at(m))
                  for m in mask_methods(spec)]
        for vm, (C, strata) in ctx.verified.items():  # labelled and unlabelled prompts resampled apart
            vplan = ResamplingPlan.stratified(strata, spec.bootstrap.n_resamples, seed("resampling"))
            parts.append(stability_tables(C, names, vm, vplan, at(vm), spec, workers,
                                          ranked_by=_estimand(spec, strata)))
        return {"stability_vs_k": concat_parts([p[0] for p in parts]), "inclusion": concat_parts([p[1] for p in parts])}

    ctx.write(compute, params=ctx.resampling_params(),
              depends_on=ctx.circuit_deps() + (["faithfulness"] if spec.faithfulness else []))


def _approximation(ctx: AuditContext) -> None:
    spec, ks = ctx.spec, list(ctx.spec.k)
    others = [m for m in score_methods(spec) if m != "exact"]

    def compute():
        # prompts resampled as for the edge intervals (clusters when the task has templates)
        plan = ctx.plan(for_intervals=True, stage="approximation")
        exact = ctx.scores.whole("exact", "approximation", held=2)
        parts = [approximation_tables(exact, ctx.scores.whole(m, "approximation", held=2), ctx.names, m,
                                      ks[min(1, len(ks) - 1)], spec.ranking, plan, spec.bootstrap.confidence_level)
                 for m in others]
        return {"approximation": concat_parts([p[0] for p in parts]),
                "approximation_summary": concat_parts([p[1] for p in parts])}

    ctx.write(compute, params={"k": ks, "ranking": spec.ranking, "bootstrap": spec.bootstrap.model_dump()},
              depends_on=ctx.score_deps())


def _approximates(spec: AuditSpec) -> bool:
    scored = score_methods(spec)
    return "exact" in scored and any(m != "exact" for m in scored)


def _published(ctx: AuditContext) -> None:
    """The published circuit's faithfulness, CPR/CMD, edge support and inclusion."""
    import hashlib

    from circuitstat.pipelines.published import published_tables

    spec, circuit, scores = ctx.spec, ctx.circuit, ctx.scores
    digest = hashlib.sha256(circuit.edges.tobytes() + (b"" if circuit.scores is None else circuit.scores.tobytes()))
    deps = ["edge_stats", "stability"] + (["faithfulness"] if spec.faithfulness else [])
    params = {"circuit": {**spec.circuit.model_dump(exclude={"file"}), "sha256": digest.hexdigest()},
              "bootstrap": spec.bootstrap.model_dump(), "ranking": spec.ranking, "k": list(spec.k)}

    def compute():
        tables = {t: ctx.run.table(t) for t in ("edge_stats", "inclusion")}
        if spec.faithfulness:
            tables["faithfulness_vs_k"] = ctx.run.table("faithfulness_vs_k")
        means_of = {m: scores.columns(m) for m in scores.methods}  # the stage reads only their column means
        return published_tables(ctx.model, ctx.task, circuit, means_of, tables, ctx.plan(for_intervals=True), spec,
                                source=Path(spec.circuit.file).name)

    ctx.write(compute, params=params, depends_on=deps)


def _circuit_tests(ctx: AuditContext) -> None:
    """Hypothesis tests of one circuit, chosen on a selection half of the prompts and tested on the other
    (circuitstat.pipelines.circuit_tests)."""
    from circuitstat.pipelines.runs.audit.tables import ablation_of
    from circuitstat.pipelines.circuit_tests import circuit_tests_stage

    spec = ctx.spec
    method = spec.tests.method or score_methods(spec)[0]
    params = {"tests": spec.tests.model_dump(), "ranking": spec.ranking, "ablation": spec.ablation, "seed": spec.seed}
    ctx.write(lambda: circuit_tests_stage(ctx.model, ctx.task, {method: ctx.scores.whole(method, "circuit_tests")},
                                          ctx.names, spec, ctx.run.stage_seed("circuit_tests"),
                                          ablation_of(ctx.model, ctx.task, spec)),
              params=params, depends_on=[f"scores_{method}"])


def _heads(ctx: AuditContext) -> None:
    """Head stability across the spec's models (circuitstat.pipelines.runs.heads.stability). Model 0 is the loaded one;
    the other refits load the same way (the spec's dtype, on model 0's device), only when the stage runs."""
    from circuitstat.pipelines.runs.heads import stability as heads_mod

    spec, model, task = ctx.spec, ctx.model, ctx.task
    # min_excess is the verdict's threshold, not the stage's: changing it recomputes nothing
    params = {"models": spec.sources, **spec.heads.model_dump(exclude={"min_excess"}), "seed": spec.seed}

    def compute():
        h = spec.heads
        est = heads_mod.HeadStability(match=h.match, pairs=h.pairs, drop_bos=h.drop_bos, n_probe=h.n_probe,
                                      n_resamples=h.n_resamples, seed=spec.seed)
        models = [model, *(R.load_audit_model(spec, s, str(model.device), allow_pickle=ctx.allow_pickle,
                                              allow_large=ctx.allow_large, inputs=ctx.inputs)
                           for s in ctx.sources[1:])]
        # Without a tokenizer there are no corpus snippets: the task's clean prompts are the probe set.
        full = task.attention_mask.bool().all(1).numpy()
        probe = None if models[0].tokenizer is not None else heads_mod.ProbeSet.from_ids(
            task.clean.numpy()[full][: h.n_probe], source=f"task:{task.name}")
        tables = est.fit(models, probe).tables()
        return {name: tables[name] for name in HEADS_OUTPUTS}

    ctx.write(compute, params=params)


def _always(spec: AuditSpec) -> bool:
    return True


#: every stage of an audit, in run order (stability reads the k the faithfulness search chose; the verified stage
#: comes before the analyses, as circuits selected from verified estimates join them)
STAGES: tuple[Stage, ...] = (
    Stage("index", _always, _index, _index_outputs),
    Stage("scores", lambda s: bool(score_methods(s)), _scores, lambda s: [f"scores_{m}" for m in score_methods(s)],
          _scores_flops, names=lambda s: [f"scores_{m}" for m in score_methods(s)]),
    Stage("masks", lambda s: bool(mask_methods(s)), _masks, lambda s: list(MASK_OUTPUTS), _masks_flops),
    Stage("verified", lambda s: s.verify is not None, _verified, lambda s: R.verify_outputs(s.verify),
          _verified_flops),
    Stage("edge_stats", lambda s: bool(score_methods(s)), _edge_stats, lambda s: ["edge_stats"]),
    Stage("faithfulness", lambda s: s.faithfulness, _faithfulness, lambda s: ["faithfulness_vs_k"],
          faithfulness_flops),
    Stage("stability", _always, _stability, lambda s: ["stability_vs_k", "inclusion"]),
    Stage("approximation", _approximates, _approximation, lambda s: ["approximation", "approximation_summary"]),
    Stage("published", lambda s: s.circuit is not None, _published,
          lambda s: ["published_circuit", "published_circuit_edges"]),
    Stage("circuit_tests", lambda s: s.tests is not None, _circuit_tests,
          lambda s: ["circuit_tests", "circuit_minimality"], tests_flops),
    Stage("heads", lambda s: len(s.sources) > 1, _heads, lambda s: list(HEADS_OUTPUTS), heads_flops),
)


def stage_names(spec: AuditSpec) -> list[str]:
    """The RunDir stages an audit of ``spec`` writes, in order (from :data:`STAGES`)."""
    return [n for st in STAGES for n in st.stage_names(spec)]


def audit_flops(spec: AuditSpec, cfg) -> float:
    """The FLOPs of every stage of ``spec`` that runs, on models of config ``cfg``, summed over :data:`STAGES`: its
    methods' attribution, mask fits, the verification's second phase, faithfulness and the circuit tests (upper
    bounds) and head stability (circuitstat.pipelines.runs.audit.pricing prices each)."""
    return float(sum(st.flops(spec, cfg) for st in STAGES if st.when(spec)))
