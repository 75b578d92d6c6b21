"""The stability audit: attribution → resampling → stability → faithfulness → approximation → heads.

Each step is a resumable stage of a run directory (circuitstat.core.rundir.RunDir): a killed run resumes
with the same command and recomputes only unfinished stages; every stage's randomness comes
from the run's root seed and the stage name, so resumed, parallel and serial runs write
identical tables. This module only orchestrates: the tables' columns are built by
circuitstat.pipelines.runs.audit.tables, from the estimators of stats/ and circuits/.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from circuitstat.pipelines.runs.audit.common import (attribution_scores, audit_spec_doc, faithfulness_with_search,  # noqa: F401
                                                load_audit_model, refit_plan, resampling_plan, run_stage,
                                                verify_outputs)
from circuitstat.pipelines.runs.audit.tables import crossfit_folds
from circuitstat.pipelines.runs.audit.masks import score_methods
from circuitstat.pipelines.runs.audit.stages import STAGES, AuditContext, audit_flops, stage_names
from circuitstat.pipelines.runs.audit.scores import check_whole_scores
from circuitstat.pipelines.spec import AuditSpec
from circuitstat.pipelines.kinds import RunKind
from circuitstat.pipelines.sources import LOCAL, RunInputs


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
                                                        kind="audit",
                                                        provenance={"model": model.identity(),
                                                                    "task": task.describe(),
                                                                    BINDING_KEY: binding}) as run:
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


def check_scheme(scheme: str, groups, task_name: str) -> None:
    """None; InputError when the resampling ``scheme`` cannot apply (clusters need the task's groups)."""
    from circuitstat.core.errors import InputError

    if scheme == "clusters" and groups is None:
        raise InputError(f"bootstrap scheme 'clusters' needs a task with groups (templates); task {task_name!r} "
                         "has none: use scheme 'examples' or a task with a group column")


SCORES_STAGE = re.compile(r"scores_[a-z0-9*+-]+")


def is_audit_stage(name: str) -> bool:
    """True for a stage name an audit writes (circuitstat.pipelines.claims: which runs an audit may resume)."""
    return any(name == st.name for st in STAGES if st.names is None) or SCORES_STAGE.fullmatch(name) is not None


def audit_stages(spec: AuditSpec) -> list[str]:
    """The RunDir stages :func:`run_audit` writes for ``spec``, in order (circuitstat.pipelines.runs.audit.stages.STAGES)."""
    return stage_names(spec)


def _parse(data, source: str) -> AuditSpec:
    from circuitstat.pipelines.spec import parse_spec

    return parse_spec(data, source)


def run_audit_kind(spec: AuditSpec, out: str | Path, **options: Any) -> Path:
    """``out`` with the audit ``spec`` run into it: the kind's run (run_audit, looked up when called, so that a test's
    stand-in for run_audit is what the command line, ``check --run-audit`` and the service run)."""
    return run_audit(spec, out, **options)


KIND = RunKind("audit", "attribution, intervals, stability, faithfulness, approximation and heads of one task",
               parse=_parse, run=run_audit_kind, stages=audit_stages, flops=audit_flops, report=True)
