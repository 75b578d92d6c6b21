"""The stability audit: attribution → resampling → stability → faithfulness → approximation → heads.

Each step is a resumable stage of a run directory (circuitstat.core.rundir.RunDir): a killed run resumes
with the same command and recomputes only unfinished stages; every stage's randomness comes
from the run's root seed and the stage name, so resumed, parallel and serial runs write
identical tables. This module only orchestrates: the tables' columns are built by
circuitstat.pipelines.audit.tables, from the estimators of stats/ and circuits/.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import numpy as np

from circuitstat.pipelines.audit.tables import (_concat, approximation_tables, crossfit_folds, edge_stats_table, faithfulness_table,
                           stability_tables)
from circuitstat.pipelines.audit.masks import (MASK_OUTPUTS, mask_faithfulness_table, mask_methods, mask_stability_tables,
                                               read_refits, score_methods)
from circuitstat.pipelines.audit.pricing import audit_flops
from circuitstat.pipelines.audit.scores import RunScores, check_whole_scores
from circuitstat.pipelines.spec import AuditSpec
from circuitstat.pipelines.kinds import RunKind
from circuitstat.pipelines.sources import LOCAL, RunInputs


def _chunks(n: int, batch_size: int, n_jobs: int) -> list[np.ndarray]:
    """Example rows split into whole batches, a few chunks per worker."""
    n_batches = -(-n // batch_size)
    per = max(1, -(-n_batches // max(1, 4 * n_jobs)))
    step = per * batch_size
    return [np.arange(s, min(s + step, n)) for s in range(0, n, step)]


def _attribute_rows(rows, model, task, method, spec: AuditSpec):
    from circuitstat.circuits.attribution import attribute

    return attribute(model, task, method, level=spec.level, ablation=spec.ablation, batch_size=spec.batch_size,
                     ig_steps=spec.ig_steps, seed=spec.seed, rows=rows, progress=False,
                     input_node=getattr(spec, "input_node", "embeddings")).scores


def attribution_scores(model, task, method: str, spec: AuditSpec, n_jobs: int):
    """ScoreMatrix of ``method`` on every example, computed in fixed chunks (any n_jobs gives the same).

    ``spec``: the AuditSpec, or any object with its level, ablation, batch_size, ig_steps and seed
    (the ``attribute`` command passes its options so)."""
    from circuitstat.circuits.scores import ScoreMatrix

    from circuitstat.pipelines.parallel import run_chunks

    n = task.clean.shape[0]
    t0 = time.perf_counter()
    parts = run_chunks(_attribute_rows, _chunks(n, spec.batch_size, n_jobs), n_jobs, model, task, method, spec,
                       desc=f"{method} scores")
    params = {"batch_size": spec.batch_size, "seed": spec.seed, "max_rows": 256,
              "input_node": getattr(spec, "input_node", "embeddings")}
    from circuitstat.circuits.attribution import uses_ig_steps

    if uses_ig_steps(method):
        params["ig_steps"] = spec.ig_steps
    return ScoreMatrix(np.concatenate(parts), model.graph, spec.level, method, spec.ablation, task.metric_name,
                       params=params, provenance={"model": model.identity(), "seconds": time.perf_counter() - t0})


def resampling_plan(spec: AuditSpec, n: int, groups, seed, *, for_intervals: bool):
    """The run's resampling plan: bootstrap over examples or clusters, or half-size subsamples."""
    from circuitstat.core.errors import InputError
    from circuitstat.stats import ResamplingPlan

    b = spec.bootstrap
    if b.scheme == "clusters":
        if groups is None:
            raise InputError("bootstrap scheme 'clusters' needs a task with groups (templates); "
                             "use scheme 'examples' or a task with a group column")
        return ResamplingPlan.cluster(np.asarray(groups), b.n_resamples, seed)
    if b.scheme == "half-splits" and not for_intervals:
        return ResamplingPlan.subsample(n, b.n_resamples, seed)
    return ResamplingPlan.bootstrap(n, b.n_resamples, seed)


def refit_plan(spec: AuditSpec, n: int, groups, seed, method: str = "edge-pruning"):
    """The refits' resampling plan of mask-learned ``method``: the stability layer's (spec.bootstrap.scheme, the
    run's resampling seed) with its section's ``n_refits`` resamples (``edge_pruning.n_refits``, ``ugs.n_refits``)."""
    from circuitstat.pipelines.spec import mask_spec

    boot = spec.bootstrap.model_copy(update={"n_resamples": mask_spec(spec, method).n_refits})
    return resampling_plan(spec.model_copy(update={"bootstrap": boot}), n, groups, seed, for_intervals=False)


def run_audit(spec: AuditSpec, out: str | Path, *, n_jobs: int | None = None, scheduler: str | None = None,
              force: bool = False, allow_pickle: bool = False, allow_large: bool = False,
              inputs: RunInputs = LOCAL) -> Path:
    """Run (or resume) the audit described by ``spec`` into run directory ``out``; returns ``out``. ``inputs``
    resolves its model sources (circuitstat.pipelines.sources).

    Everything a user can get wrong (devices, workers, sizes, k, resampling scheme, task options,
    an unreachable scheduler) is checked before the run directory is created. Each model is loaded
    once (model 0 by :func:`prepare_audit`, the other refits by the heads stage), with the spec's
    dtype on the checked device.
    """
    from circuitstat.core.rundir import RunDir

    from circuitstat.pipelines.build import check_n_jobs
    from circuitstat.pipelines.parallel import backend
    from circuitstat.pipelines.training import use_deterministic

    out = Path(out)
    n_jobs = check_n_jobs(spec.n_jobs if n_jobs is None else n_jobs, "--n-jobs" if n_jobs is not None else "n_jobs")
    use_deterministic()  # CUBLAS_WORKSPACE_CONFIG too, before any model loads
    sources, model, task = prepare_audit(spec, allow_pickle=allow_pickle, allow_large=allow_large, inputs=inputs)
    from circuitstat.pipelines.claims.binding import BINDING_KEY, spec_binding

    binding = spec_binding(audit_spec_doc(spec))  # the spec as asked for, before k gains the circuit's sizes (check compares it)
    circuit, spec = published_circuit(spec, model)  # checked against the model's graph before the run directory
    spec_doc = audit_spec_doc(spec)
    with backend(n_jobs, scheduler) as workers, RunDir(out, spec=spec_doc, command=sys.argv, seed=spec.seed,
                                                        provenance={"model": model.identity(),
                                                                    "task": task.describe(),
                                                                    BINDING_KEY: binding}) as run:
        names, scores = _score_stages(run, spec, model, task, workers, force, allow_large=allow_large)
        if spec.verify is not None:  # before the analyses: circuits selected from verified estimates join them
            _verify_stage(run, spec, model, task, scores, names, force)
        _analysis_stages(run, spec, model, task, scores, names, workers, force)
        if circuit is not None:
            _published_stage(run, spec, model, task, circuit, scores, force)
        if spec.tests is not None:
            _tests_stage(run, spec, model, task, scores, names, force)
        if len(sources) > 1:
            _heads_stage(run, spec, sources, model, task, force, allow_pickle=allow_pickle, allow_large=allow_large,
                         inputs=inputs)
    return out


def _score_stages(run, spec: AuditSpec, model, task, workers: int, force: bool, *,
                  allow_large: bool = False) -> tuple[list[str], RunScores]:
    """Run the index stage and one scores stage per method; return (edge or node names, the methods' [N, E] scores
    as RunScores: read in blocks, or whole within a bound, by the stages that follow)."""
    from circuitstat.circuits.scores import ScoreMatrix

    n_cols = model.graph.n_edges if spec.level == "edge" else model.graph.n_senders
    base = {"weight_hash": model.weight_hash(), "task_hash": task.content_hash}
    spec_doc = audit_spec_doc(spec)
    index_name = "edges" if spec.level == "edge" else "nodes"
    sm0 = ScoreMatrix(np.zeros((1, n_cols), np.float32), model.graph, spec.level, "none", spec.ablation, "none")
    run_stage(run, "index", lambda: {index_name: sm0.tables()[index_name]}, [index_name], params=base,
              force=force)
    attr_keys = ("level", "ablation", "input_node", "batch_size", "ig_steps", "seed") + (
        ("moe_nodes",) if spec.moe_nodes != "block" else ())
    for method in score_methods(spec):
        params = {**base, "method": method, "task": spec.task.model_dump(),
                  **{k: spec_doc[k] for k in attr_keys}}
        run_stage(run, f"scores_{method}",
                  lambda method=method: {f"scores_{method}": attribution_scores(
                      model, task, method, spec, workers).tables(_scores_provenance(task))["scores"]},
                  [f"scores_{method}"], params=params, force=force)
    if mask_methods(spec):
        _masks_stage(run, spec, model, task, sm0.names, base, force)
    return sm0.names, RunScores(run, score_methods(spec), allow_large=allow_large)


def _scores_provenance(task) -> dict:
    """The scores tables' provenance: the task, and its templates (one label per prompt) where it has them, so a
    cluster-scheme run is a sample-size pilot (circuitstat.pipelines.sample_size)."""
    out = {"task": task.describe()}
    if task.group is not None:
        out["groups"] = [int(g) for g in task.group.tolist()]
    return out


def _masks_stage(run, spec: AuditSpec, model, task, names: list[str], base: dict, force: bool) -> None:
    """The masks stage: every mask-learned method fitted on all prompts and refitted on the stability plan's
    resamples (circuitstat.pipelines.audit.masks)."""
    from circuitstat.pipelines.audit.masks import mask_tables

    N = task.clean.shape[0]
    groups = None if task.group is None else task.group.numpy()
    params = {**base, "methods": mask_methods(spec), "edge_pruning": spec.edge_pruning.model_dump(),
              **({"ugs": spec.ugs.model_dump()} if "ugs" in spec.methods else {}),
              "task": spec.task.model_dump(), "bootstrap": spec.bootstrap.model_dump(),
              **{k: getattr(spec, k) for k in ("ablation", "input_node", "batch_size", "seed")}}
    run_stage(run, "masks",
              lambda: mask_tables(model, task, spec, names,
                                  {m: refit_plan(spec, N, groups, run.stage_seed("resampling"), m)
                                   for m in mask_methods(spec)}),
              list(MASK_OUTPUTS), params=params, force=force)


def _analysis_stages(run, spec: AuditSpec, model, task, scores: RunScores, names: list[str], workers: int,
                     force: bool) -> None:
    """Run the edge_stats, stability, faithfulness and approximation stages over the methods' scores."""
    ks = list(spec.k)
    scored, masked = score_methods(spec), mask_methods(spec)
    deps = [f"scores_{m}" for m in scored]
    mask_deps = ["masks"] if masked else []
    N = task.clean.shape[0]
    groups = None if task.group is None else task.group.numpy()
    rs = {"bootstrap": spec.bootstrap.model_dump(), "k": ks, "ranking": spec.ranking}
    verified = verified_circuit_methods(run, spec)  # {name: (pseudo-scores, strata)}; reads the verified stage
    circuit_deps = deps + (["verified"] if verified else [])

    def stats_stage():
        plan = resampling_plan(spec, N, groups, run.stage_seed("resampling"), for_intervals=True)
        return {"edge_stats": _concat([edge_stats_table(scores.columns(m), names, m, plan, spec, workers)
                                       for m in scored])}

    if scored:  # a mask-learned method has no per-example scores: method_notes says so (masks stage)
        run_stage(run, "edge_stats", stats_stage, ["edge_stats"], params=rs, depends_on=deps, force=force)
    fits = {m: read_refits(run.table("mask_fits"), m) for m in masked}  # {method: (fit [E], refits [R, E])}

    if spec.faithfulness:
        def faith_stage():
            plan = resampling_plan(spec, N, groups, run.stage_seed("resampling"), for_intervals=True)
            seed = run.stage_seed("faithfulness")
            parts = [faithfulness_with_search(model, task, scores.whole(m, "faithfulness"), m, ks, plan, spec, seed)
                     for m in scored]
            parts += [mask_faithfulness_table(model, task, fits[m][0], m, ks, plan, spec, seed) for m in masked]
            parts += [faithfulness_with_search(model, task, C, vm, ks, plan, spec, seed, strata=strata,
                                               ranked_by=_estimand(spec, strata))
                      for vm, (C, strata) in verified.items()]
            return {"faithfulness_vs_k": _concat(parts)}

        run_stage(run, "faithfulness", faith_stage, ["faithfulness_vs_k"], params={**rs, "k_search": spec.k_search},
                  depends_on=circuit_deps + mask_deps, force=force)

    def stability_stage():
        plan = resampling_plan(spec, N, groups, run.stage_seed("resampling"), for_intervals=False)
        at = _chosen_ks(run, spec, ks)
        parts = [stability_tables(scores.columns(m), names, m, plan, at(m), spec, workers) for m in scored]
        if masked:  # refits over the same scheme's resamples, n_refits of them (the masks stage's plan)
            parts += [mask_stability_tables(fits[m][1], names, m,
                                            refit_plan(spec, N, groups, run.stage_seed("resampling"), m), at(m))
                      for m in masked]
        from circuitstat.stats import ResamplingPlan

        for vm, (C, strata) in verified.items():  # labelled and unlabelled prompts resampled apart
            vplan = ResamplingPlan.stratified(strata, spec.bootstrap.n_resamples, run.stage_seed("resampling"))
            parts.append(stability_tables(C, names, vm, vplan, at(vm), spec, workers,
                                          ranked_by=_estimand(spec, strata)))
        return {"stability_vs_k": _concat([p[0] for p in parts]), "inclusion": _concat([p[1] for p in parts])}

    run_stage(run, "stability", stability_stage, ["stability_vs_k", "inclusion"], params=rs,
              depends_on=circuit_deps + mask_deps + (["faithfulness"] if spec.faithfulness else []), force=force)

    others = [m for m in scored if m != "exact"]
    if "exact" in scored and others:
        def approx_stage():
            # prompts resampled as for the edge intervals (clusters when the task has templates)
            plan = resampling_plan(spec, N, groups, run.stage_seed("approximation"), for_intervals=True)
            exact = scores.whole("exact", "approximation", held=2)
            parts = [approximation_tables(exact, scores.whole(m, "approximation", held=2), names, m,
                                          ks[min(1, len(ks) - 1)], spec.ranking, plan, spec.bootstrap.confidence_level)
                     for m in others]
            return {"approximation": _concat([p[0] for p in parts]),
                    "approximation_summary": _concat([p[1] for p in parts])}

        run_stage(run, "approximation", approx_stage, ["approximation", "approximation_summary"],
                  params={"k": ks, "ranking": spec.ranking, "bootstrap": spec.bootstrap.model_dump()},
                  depends_on=deps, force=force)


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


def verified_circuit_methods(run, spec: AuditSpec) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"<approx>+verified": (pseudo-scores [N, E], strata [N])} of a verified run on every edge, else {} (with
    ``verify.edges`` only a sample of edges has estimates, so no circuit over the graph is selected from them)."""
    from circuitstat.pipelines import verify as V

    if spec.verify is None or spec.verify.edges is not None:
        return {}
    table = run.table("verified_pseudo")
    return {V.verified_method(m): V.read_pseudo(table, m) for m in score_methods(spec) if m != "exact"}


def _estimand(spec: AuditSpec, strata: np.ndarray) -> str:
    """The ranked_by words of a verified method: its estimates' estimand, with n and N."""
    from circuitstat.stats.verified import verified_estimand

    return f"{verified_estimand(int(strata.sum()), strata.size)} (PPI++ estimates)"


def published_circuit(spec: AuditSpec, model):
    """(the spec's published circuit checked against the model's graph, the spec with its size, half and double
    in the k grid), or (None, spec) when the spec names none (circuitstat.pipelines.published)."""
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.published import read_circuit_file, sizes_around

    if spec.circuit is None:
        return None, spec
    if spec.level != "edge":
        raise InputError("a published circuit is a set of edges: audit it with level: edge")
    circuit = read_circuit_file(spec.circuit.file, spec.circuit.file_format, model.graph, d_model=model.cfg.d_model)
    return circuit, spec.model_copy(update={"k": sizes_around(list(spec.k), circuit.n_edges, model.graph.n_edges)})


def _published_stage(run, spec: AuditSpec, model, task, circuit, scores: RunScores, force: bool) -> None:
    """The published stage: the published circuit's faithfulness, CPR/CMD, edge support and inclusion."""
    import hashlib

    from circuitstat.pipelines.published import published_tables

    N = task.clean.shape[0]
    groups = None if task.group is None else task.group.numpy()
    digest = hashlib.sha256(circuit.edges.tobytes() + (b"" if circuit.scores is None else circuit.scores.tobytes()))
    deps = ["edge_stats", "stability"] + (["faithfulness"] if spec.faithfulness else [])
    params = {"circuit": {**spec.circuit.model_dump(exclude={"file"}), "sha256": digest.hexdigest()},
              "bootstrap": spec.bootstrap.model_dump(), "ranking": spec.ranking, "k": list(spec.k)}

    def compute():
        plan = resampling_plan(spec, N, groups, run.stage_seed("resampling"), for_intervals=True)
        tables = {t: run.table(t) for t in ("edge_stats", "inclusion")}
        if spec.faithfulness:
            tables["faithfulness_vs_k"] = run.table("faithfulness_vs_k")
        means_of = {m: scores.columns(m) for m in scores.methods}  # the stage reads only their column means
        return published_tables(model, task, circuit, means_of, tables, plan, spec, source=Path(spec.circuit.file).name)

    run_stage(run, "published", compute, ["published_circuit", "published_circuit_edges"], params=params,
              depends_on=deps, force=force)


def faithfulness_with_search(model, task, S: np.ndarray, method: str, ks: list[int], plan, spec: AuditSpec, seed,
                             strata: np.ndarray | None = None, ranked_by: str | None = None) -> dict:
    """faithfulness_vs_k columns of ``method`` on the spec's k grid, then the circuit choice's extra k values
    (circuitstat.pipelines.k_search: fixed-sequence down every k from the grid's largest, at most spec.k_search of them).
    ``strata``/``ranked_by``: a verified method's (faithfulness_table)."""
    from circuitstat.reports.verdicts.model import BAR

    from circuitstat.pipelines.k_search import search_k

    kw = {"strata": strata, "ranked_by": ranked_by}
    grid = faithfulness_table(model, task, S, method, ks, plan, spec, seed=seed, **kw)
    if not spec.k_search:
        return grid

    def evaluate(k: int) -> dict:
        row = faithfulness_table(model, task, S, method, [k], plan, spec, seed=seed, **kw)
        # CPR and CMD are areas under the grid's curve: the extra rows carry the grid's
        row.update(cpr=grid["cpr"][:1].copy(), cmd=grid["cmd"][:1].copy(), area_note=grid["area_note"][:1],
                   k_source=["search"])
        return row

    extra, why = search_k(evaluate, grid, spec.k_search, BAR)
    print(f"faithfulness {method}: {len(extra)} extra k evaluated below k = {max(ks)}; {why}", file=sys.stderr)
    return _concat([grid, *extra])


def verify_outputs(verify) -> list[str]:
    """The tables a verified stage writes: missed_edges when some edges go unverified, else verified_pseudo (the
    pseudo-scores circuits are selected from: circuitstat.stats.verified.pseudo)."""
    return ["verified", "verified_prompts"] + (["missed_edges"] if verify.edges is not None else ["verified_pseudo"])


def _verify_stage(run, spec: AuditSpec, model, task, scores: RunScores, names: list[str], force: bool) -> None:
    """The verified stage: exact patching on a random subset checks every approximate method (pipelines.verify)."""
    from circuitstat.pipelines import verify as V

    held = len(score_methods(spec))
    seed = V.draw_seed(spec.verify.seed, run.stage_seed("verified"))
    params = {"verify": spec.verify.model_dump(), "seed": seed, "confidence_level": spec.bootstrap.confidence_level}

    def compute():
        approx = {m: scores.whole(m, "verified", held) for m in score_methods(spec) if m != "exact"}
        plan = V.verify_plan(approx, spec.verify, seed)
        if "exact" in scores.methods:  # exact on every prompt already: its cells are the subset's, bit for bit
            cols = np.arange(len(names)) if plan.all_edges else plan.edges()
            exact = scores.whole("exact", "verified", held)[np.ix_(plan.rows, cols)].astype(np.float64)
        else:
            exact, cols = V.run_exact(model, task, plan, ablation=spec.ablation, seed=spec.seed,
                                      batch_size=spec.batch_size, input_node=spec.input_node)
        return V.verified_tables(approx, exact, cols, plan, names, confidence_level=spec.bootstrap.confidence_level,
                                 tau=spec.verify.tau)

    run_stage(run, "verified", compute, verify_outputs(spec.verify), params=params,
              depends_on=[f"scores_{m}" for m in score_methods(spec)], force=force)


def _tests_stage(run, spec: AuditSpec, model, task, scores: RunScores, names: list[str], force: bool) -> None:
    """The circuit_tests stage: hypothesis tests of one circuit, chosen on a selection half of the prompts and
    tested on the other (circuitstat.pipelines.circuit_tests)."""
    from circuitstat.pipelines.audit.tables import _ablation
    from circuitstat.pipelines.circuit_tests import circuit_tests_stage

    method = spec.tests.method or score_methods(spec)[0]
    params = {"tests": spec.tests.model_dump(), "ranking": spec.ranking, "ablation": spec.ablation, "seed": spec.seed}
    run_stage(run, "circuit_tests",
              lambda: circuit_tests_stage(model, task, {method: scores.whole(method, "circuit_tests")}, names, spec,
                                          run.stage_seed("circuit_tests"),
                                          _ablation(model, task, spec)),
              ["circuit_tests", "circuit_minimality"], params=params, depends_on=[f"scores_{method}"], force=force)


def prepare_audit(spec: AuditSpec, *, allow_pickle: bool = False, allow_large: bool = False,
                  inputs: RunInputs = LOCAL):
    """(sources as named, model, task) of ``spec``, after every check that needs no run directory:
    device, sizes (lifted by ``allow_large``), task options, attribution options, k and the
    resampling scheme. InputError on the first problem."""
    from circuitstat.circuits.attribution import check_options
    from circuitstat.core.errors import InputError

    from circuitstat.pipelines.build import build_task, check_device, check_work, n_columns, precheck_task, task_positions
    from circuitstat.pipelines.spec import check_verify

    for method in score_methods(spec):
        check_options(method, spec.level, spec.ablation, batch_size=spec.batch_size, ig_steps=spec.ig_steps)
    device = check_device(spec.device)
    sources = list(spec.sources)
    first = inputs.resolve(sources[0])  # every source resolves before anything loads
    for s in sources[1:]:
        inputs.resolve(s)
    precheck_task(first.location, spec.task.name, n=spec.task.n, seed=spec.task.seed, metric=spec.task.metric,
                  public=first.name, **spec.task.options)  # a bad task file or a missing tokenizer: before any model
    model = load_audit_model(spec, sources[0], device, allow_pickle=allow_pickle, allow_large=allow_large,
                             inputs=inputs)
    check_work(model, spec.task.n, level=spec.level, n_matrices=len(score_methods(spec)),
               positions=task_positions(spec.task.name, spec.task.options),
               n_resamples=spec.bootstrap.n_resamples, allow_large=allow_large)
    from circuitstat.pipelines.work import check_run_work

    check_run_work("audit", spec, model.cfg, allow_large=allow_large,  # every stage, before the first forward
                   shrink="task.n, methods, k, the ugs:/edge_pruning: steps, n_samples and n_refits, or tests: sizes")
    task = build_task(model, spec.task.name, n=spec.task.n, seed=spec.task.seed, metric=spec.task.metric,
                      **spec.task.options)
    n_cols = n_columns(model, spec.level)
    check_verify(spec.verify, methods=spec.methods, n_prompts=task.clean.shape[0], level=spec.level, n_edges=n_cols)
    if spec.k[-1] >= n_cols:
        raise InputError(f"k={spec.k[-1]} is not below the number of {spec.level}s ({n_cols}); use smaller k")
    if spec.tests is not None:  # the tested circuit must exist in this model's graph: before any work
        if spec.tests.k is not None and spec.tests.k >= n_cols:
            raise InputError(f"tests.k={spec.tests.k} is not below the model's {n_cols} edges; use a smaller k")
        known = set(model.graph.edge_names)
        unknown = [e for e in (spec.tests.edges or []) if e not in known]
        if unknown:
            raise InputError(f"tests.edges names {unknown[0]!r}, not an edge of the model; edges look like "
                             f"{model.graph.edge_names[0]!r}")
    check_scheme(spec.bootstrap.scheme, task.group, task.name)
    check_whole_scores(spec, task.clean.shape[0], n_cols, allow_large=allow_large)  # stages that load scores whole
    if spec.faithfulness and spec.level == "edge":  # folds the groups cannot fill: refused before the run
        crossfit_folds(spec, task.clean.shape[0], None if task.group is None else task.group.numpy())
    return sources, model, task


def load_audit_model(spec: AuditSpec, source: str, device: str, *, allow_pickle: bool = False,
                     allow_large: bool = False, inputs: RunInputs = LOCAL):
    """Return ``source`` as a CircuitModel loaded as the audit loads each of its models: the spec's dtype,
    on ``device`` (already through build.check_device), resolved by ``inputs``, with the spec's ``moe_nodes``
    graph (InputError for 'experts' on a model without mixture-of-experts layers, before its weights load)."""
    from circuitstat.pipelines.build import load_with_graph

    return load_with_graph(inputs, source, spec.moe_nodes, device=device, dtype=spec.dtype, allow_pickle=allow_pickle,
                           allow_large=allow_large)


def audit_spec_doc(spec: AuditSpec) -> dict:
    """The spec as the run records it: ``moe_nodes`` only when not the default and ``ugs`` only when a method (records
    made before the options existed stay the same, so their runs resume)."""
    drop = ({"moe_nodes"} if spec.moe_nodes == "block" else set()) | (set() if "ugs" in spec.methods else {"ugs"})
    return spec.model_dump(exclude=drop or None)


def check_scheme(scheme: str, groups, task_name: str) -> None:
    """None; InputError when the resampling ``scheme`` cannot apply (clusters need the task's groups)."""
    from circuitstat.core.errors import InputError

    if scheme == "clusters" and groups is None:
        raise InputError(f"bootstrap scheme 'clusters' needs a task with groups (templates); task {task_name!r} "
                         "has none: use scheme 'examples' or a task with a group column")


def run_stage(run, name: str, fn, outputs, **kw) -> None:
    """``run.stage(name, fn, outputs, **kw)`` with ``fn`` pinned to one torch and one BLAS thread,
    and a line on stderr saying how long the stage took (or that it was already done)."""
    from circuitstat.pipelines.parallel import single_threaded

    ran = []
    t0 = time.perf_counter()

    def pinned():
        ran.append(True)
        print(f"stage {name}: running", file=sys.stderr, flush=True)
        with single_threaded():
            return fn()

    run.stage(name, pinned, outputs, **kw)
    what = f"done in {time.perf_counter() - t0:.1f} s" if ran else "already done (resumed)"
    print(f"stage {name}: {what}", file=sys.stderr, flush=True)


def _heads_stage(run, spec: AuditSpec, sources: list[str], model, task, force: bool, *, allow_pickle: bool = False,
                 allow_large: bool = False, inputs: RunInputs = LOCAL) -> None:
    """Head stability across the spec's models (the heads estimator of circuitstat.pipelines.heads.stability). ``model`` is
    ``sources[0]`` as prepare_audit loaded it; the other refits load the same way (the spec's dtype, on
    model 0's checked device), and only when the stage runs."""
    from circuitstat.pipelines.heads import stability as heads_mod

    # min_excess is the verdict's threshold, not the stage's: changing it recomputes nothing
    params = {"models": spec.sources, **spec.heads.model_dump(exclude={"min_excess"}), "seed": spec.seed}
    outputs = ["heads", "layers", "residual", "head_details", "correlation", "summary"]

    def compute():
        h = spec.heads
        est = heads_mod.HeadStability(match=h.match, pairs=h.pairs, drop_bos=h.drop_bos, n_probe=h.n_probe,
                                      n_resamples=h.n_resamples, seed=spec.seed)
        models = [model, *(load_audit_model(spec, s, str(model.device), allow_pickle=allow_pickle,
                                            allow_large=allow_large, inputs=inputs)
                           for s in sources[1:])]
        # Without a tokenizer there are no corpus snippets: the task's clean prompts are the probe set.
        full = task.attention_mask.bool().all(1).numpy()
        probe = None if models[0].tokenizer is not None else heads_mod.ProbeSet.from_ids(
            task.clean.numpy()[full][: h.n_probe], source=f"task:{task.name}")
        tables = est.fit(models, probe).tables()
        return {name: tables[name] for name in outputs}

    run_stage(run, "heads", compute, outputs, params=params, force=force)


#: every stage name an audit can write, whatever its spec (its scores stages are scores_<method>)
AUDIT_STAGE_NAMES = frozenset({"index", "masks", "edge_stats", "stability", "faithfulness", "approximation", "heads",
                               "verified", "published", "circuit_tests"})
SCORES_STAGE = re.compile(r"scores_[a-z0-9*+-]+")


def is_audit_stage(name: str) -> bool:
    """True for a stage name an audit writes (circuitstat.pipelines.claims: which runs an audit may resume)."""
    return name in AUDIT_STAGE_NAMES or SCORES_STAGE.fullmatch(name) is not None


def audit_stages(spec: AuditSpec) -> list[str]:
    """The RunDir stages :func:`run_audit` writes for ``spec``, in order."""
    scored = score_methods(spec)
    others = [m for m in scored if m != "exact"]
    return (["index", *(f"scores_{m}" for m in scored)]
            + (["masks"] if mask_methods(spec) else [])
            + (["verified"] if spec.verify is not None else [])
            + (["edge_stats"] if scored else [])
            + (["faithfulness"] if spec.faithfulness else []) + ["stability"]  # stability reads the chosen k
            + (["approximation"] if "exact" in scored and others else [])
            + (["published"] if spec.circuit is not None else [])
            + (["circuit_tests"] if spec.tests is not None else [])
            + (["heads"] if len(spec.sources) > 1 else []))


def _run_kind(spec: AuditSpec, out, *, n_jobs: int = 1, allow_pickle: bool = False, allow_large: bool = False,
              inputs: RunInputs = LOCAL) -> None:
    run_audit(spec, out, n_jobs=n_jobs, allow_pickle=allow_pickle, allow_large=allow_large, inputs=inputs)


def _parse(data, source: str) -> AuditSpec:
    from circuitstat.pipelines.spec import parse_spec

    return parse_spec(data, source)


KIND = RunKind("audit", "attribution, intervals, stability, faithfulness, approximation and heads of one task",
               parse=_parse, run=_run_kind, stages=audit_stages, flops=audit_flops, report=True)
