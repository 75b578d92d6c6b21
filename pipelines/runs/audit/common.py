"""The audit's shared steps: attribution scores in fixed chunks, the resampling plans, the faithfulness curve with
the circuit choice's search, and how a stage is run and timed. The stages (circuitstat.pipelines.runs.audit.stages)
and the other runs (variance study, calibration, ground truth, sample size) call them; run.py re-exports them."""

from __future__ import annotations

import sys
import time

import numpy as np

from circuitstat.pipelines.runs.audit.tables import concat_parts, faithfulness_table
from circuitstat.pipelines.spec import AuditSpec
from circuitstat.pipelines.sources import LOCAL, RunInputs

__all__ = ["attribution_scores", "resampling_plan", "refit_plan", "faithfulness_with_search", "verify_outputs",
           "load_audit_model", "audit_spec_doc", "run_stage"]


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
    pseudo-scores circuits are selected from: circuitstat.stats.verified.pseudo); the active design writes
    verified_cells instead (which cells, with their probabilities) and no pseudo-scores (circuits selected from
    verified estimates need the uniform design); verify.combine adds verified_coefficients (each method's
    coefficient per edge in the combination)."""
    if verify.design == "active":
        return ["verified", "verified_cells"]
    return (["verified", "verified_prompts"] + (["missed_edges"] if verify.edges is not None else ["verified_pseudo"])
            + (["verified_coefficients"] if verify.combine is not None else []))


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
