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

from circuitstat.pipelines.audit.tables import concat_parts, crossfit_folds, faithfulness_table
from circuitstat.pipelines.audit.masks import score_methods
from circuitstat.pipelines.audit.pricing import audit_flops
from circuitstat.pipelines.audit.scores import check_whole_scores
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
    with backend(n_jobs, scheduler) as workers, RunDir(out, spec=spec_doc, command=sys.argv, seed=spec.seed, kind="audit",
                                                        provenance={"model": model.identity(),
                                                                    "task": task.describe(),
                                                                    BINDING_KEY: binding}) as run:
        from circuitstat.pipelines.audit.stages import STAGES, AuditContext

        ctx = AuditContext(run, spec, model, task, workers, force, sources, circuit, allow_pickle=allow_pickle,
                           allow_large=allow_large, inputs=inputs)
        for stage in STAGES:  # the one list of stages: audit_stages() and audit_flops() read it too
            if stage.when(spec):
                ctx.stage = stage
                stage.run(ctx)
    return out


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
    return concat_parts([grid, *extra])


def verify_outputs(verify) -> list[str]:
    """The tables a verified stage writes: missed_edges when some edges go unverified, else verified_pseudo (the
    pseudo-scores circuits are selected from: circuitstat.stats.verified.pseudo)."""
    return ["verified", "verified_prompts"] + (["missed_edges"] if verify.edges is not None else ["verified_pseudo"])


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


SCORES_STAGE = re.compile(r"scores_[a-z0-9*+-]+")


def is_audit_stage(name: str) -> bool:
    """True for a stage name an audit writes (circuitstat.pipelines.claims: which runs an audit may resume)."""
    from circuitstat.pipelines.audit.stages import STAGES

    return any(name == st.name for st in STAGES if st.names is None) or SCORES_STAGE.fullmatch(name) is not None


def audit_stages(spec: AuditSpec) -> list[str]:
    """The RunDir stages :func:`run_audit` writes for ``spec``, in order (circuitstat.pipelines.audit.stages.STAGES)."""
    from circuitstat.pipelines.audit.stages import stage_names

    return stage_names(spec)


def _run_kind(spec: AuditSpec, out, *, n_jobs: int = 1, allow_pickle: bool = False, allow_large: bool = False,
              inputs: RunInputs = LOCAL) -> None:
    run_audit(spec, out, n_jobs=n_jobs, allow_pickle=allow_pickle, allow_large=allow_large, inputs=inputs)


def _parse(data, source: str) -> AuditSpec:
    from circuitstat.pipelines.spec import parse_spec

    return parse_spec(data, source)


KIND = RunKind("audit", "attribution, intervals, stability, faithfulness, approximation and heads of one task",
               parse=_parse, run=_run_kind, stages=audit_stages, flops=audit_flops, report=True)
