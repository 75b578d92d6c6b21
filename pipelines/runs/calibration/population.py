"""The calibration study's population: scores attributed by the study, or read from an attribution run.

Everything here runs before the study's run directory exists, so a bad source (a run that is not
an edge-level attribution, sizes above its prompt count, a model or task that is not the one the
run was made with) is refused with nothing written.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.pipelines.sources import LOCAL, RunInputs

if TYPE_CHECKING:
    from circuitstat.pipelines.runs.calibration.spec import CalibrationSpec

__all__ = ["PopulationSource", "prepare_population"]


@dataclass
class PopulationSource:
    """Where the study's population comes from, checked: the spec as run, model and task, the scores stage."""

    spec: "CalibrationSpec"  # with what an attribution run decides (method, ablation, ig_steps) filled in
    scores_table: Callable[[], Any]  # the per-example scores table the study stores as its first stage
    params: dict  # the scores stage's fingerprint
    n_edges: int
    model: Any = None  # None: a scores run without a model (edge and stability families only)
    task: Any = None
    provenance: dict = field(default_factory=dict)
    edge_names: list[str] | None = None  # the units of the per-edge coverage table (EAP-IG names, a0.h1->m1)


def prepare_population(spec: "CalibrationSpec", *, n_jobs: int | None, allow_pickle: bool,
                       allow_large: bool, inputs: RunInputs = LOCAL) -> PopulationSource:
    """The checked PopulationSource of ``spec``: its ``scores`` run if it names one, else an attribution here
    (``inputs`` resolves the model source)."""
    if spec.scores is not None:
        return _from_scores_run(spec, allow_pickle=allow_pickle, allow_large=allow_large, inputs=inputs)
    return _attributed(spec, n_jobs=n_jobs, allow_pickle=allow_pickle, allow_large=allow_large, inputs=inputs)


def _load(source: str, spec: "CalibrationSpec", allow_pickle: bool, allow_large: bool, inputs: RunInputs):
    return inputs.load(source, device=spec.device, dtype=spec.dtype, allow_pickle=allow_pickle,
                       allow_large=allow_large)


def _build_task(model, spec: "CalibrationSpec"):
    from circuitstat.pipelines.build import build_task

    t = spec.task
    return build_task(model, t.name, n=t.n, seed=t.seed, metric=t.metric, **t.options)


def _attributed(spec: "CalibrationSpec", *, n_jobs: int | None, allow_pickle: bool,
                allow_large: bool, inputs: RunInputs) -> PopulationSource:
    """Scores computed by the study itself: spec.method on spec.task.n prompts of spec.model."""
    from circuitstat.pipelines.runs.audit.run import attribution_scores

    from circuitstat.pipelines.build import check_work as check_memory, task_positions
    from circuitstat.pipelines.work import check_calibration

    model = _load(spec.model, spec, allow_pickle, allow_large, inputs)
    positions = task_positions(spec.task.name, spec.task.options) or min(int(model.cfg.n_ctx), 64)
    check_memory(model, spec.task.n, level="edge", positions=positions, allow_large=allow_large)
    # the population's attribution and every interval's resampling, before the task is built or anything written
    check_calibration(spec, model.cfg, model.graph.n_edges, positions, n_population=spec.task.n,
                      allow_large=allow_large)
    task = _build_task(model, spec)
    doc = spec.model_dump()
    params = {"weight_hash": model.weight_hash(), "task_hash": task.content_hash,
              **{k: doc[k] for k in ("method", "ablation", "ig_steps", "batch_size", "seed")}}

    def table():
        scores = attribution_scores(model, task, spec.method, spec, n_jobs or spec.n_jobs)
        return scores.tables({"task": task.describe()})["scores"]

    return PopulationSource(spec, table, params, model.graph.n_edges, model, task,
                            {"model": model.identity(), "task": task.describe()},
                            edge_names=list(model.graph.edge_names))


def read_scores_run(directory: str | Path):
    """The ScoreMatrix of an attribution run directory, or InputError saying what to pass instead."""
    from circuitstat.circuits.scores import ScoreMatrix

    from circuitstat.core.rundir import MANIFEST, RunDir

    path = Path(directory)
    if not (path / "scores.parquet").is_file():
        raise InputError(f"scores: {path} holds no scores.parquet; give the directory that "
                         "`circuitstat attribute ... --out DIR` wrote")
    if (path / MANIFEST).is_file() and not RunDir(path).is_done("scores"):
        # the digest its run recorded (circuitstat.core.rundir): a damaged population must not be calibrated on
        raise InputError(f"scores: {path / 'scores.parquet'} does not match the digest its run recorded when the "
                         "scores stage finished (edited, damaged or unfinished); run `circuitstat attribute` again")
    return ScoreMatrix.read(path)


def _from_scores_run(spec: "CalibrationSpec", *, allow_pickle: bool, allow_large: bool,
                     inputs: RunInputs) -> PopulationSource:
    """The population of an existing attribution run, its model and task checked where the study needs them."""
    sm = read_scores_run(spec.scores)
    n_pop, where = sm.n_examples, f"the attribution run {spec.scores}"
    if sm.level != "edge":
        raise InputError(f"{where} scored {sm.level}s; the calibration study needs edge scores "
                         "(`circuitstat attribute --level edge`)")
    if spec.sizes[-1] > n_pop:
        raise InputError(f"invalid calibration spec: sizes go up to {spec.sizes[-1]} but {where} has {n_pop} "
                         f"prompts; lower the sizes or attribute at least 8x the largest size (--n)")
    ig_steps = int(sm.params.get("ig_steps", spec.ig_steps))
    spec = spec.model_copy(update={"method": sm.method, "ablation": sm.ablation, "ig_steps": ig_steps})
    from circuitstat.pipelines.work import check_calibration

    cfg = None
    if spec.model is not None:
        cfg = inputs.skeleton(spec.model, allow_pickle=allow_pickle, allow_large=allow_large).cfg
    positions = int(sm.provenance.get("task", {}).get("n_positions") or 64)
    check_calibration(spec, cfg, int(sm.scores.shape[1]), positions, n_population=n_pop, attributed=False,
                      allow_large=allow_large)  # every interval's resampling, before anything is written
    model, task = _checked_model_and_task(spec, sm, allow_pickle, allow_large, inputs)
    prov = sm.provenance
    digest = hashlib.sha256(np.ascontiguousarray(sm.scores, dtype=np.float32).tobytes()).hexdigest()
    params = {"population": "attribution run", "scores_sha256": digest, "method": sm.method,
              "ablation": sm.ablation, "n_examples": n_pop,
              "weight_hash": (prov.get("model") or {}).get("weight_hash"),
              "task_hash": (prov.get("task") or {}).get("content_hash")}
    record = {"scores_run": str(spec.scores), "n_examples": n_pop, "method": sm.method, "ablation": sm.ablation}
    provenance = {"model": model.identity() if model is not None else prov.get("model"),
                  "task": task.describe() if task is not None else prov.get("task"), "population": record}
    return PopulationSource(spec, lambda: sm.tables()["scores"], params, int(sm.scores.shape[1]), model, task,
                            provenance, edge_names=[str(n) for n in sm.names])


def _checked_model_and_task(spec: "CalibrationSpec", sm, allow_pickle: bool, allow_large: bool, inputs: RunInputs):
    """(model, task) named in the spec, each checked against the scores run's hashes; None where not given."""
    from circuitstat.pipelines.runs.calibration.spec import PER_EXAMPLE_ABLATIONS

    where = f"the attribution run {spec.scores}"
    faithful = "faithfulness" in spec.intervals
    if faithful and (spec.model is None or spec.task is None):
        raise InputError(f"the faithfulness intervals re-run the model on the population's prompts: with scores "
                         f"({spec.scores}) give model and task as that run was made (name, n, seed, options); "
                         "their weight and task hashes are checked against the run")
    if faithful and spec.ablation not in PER_EXAMPLE_ABLATIONS:
        raise InputError(f"{where} used the {spec.ablation!r} ablation; the faithfulness intervals need a "
                         f"per-example one ({' or '.join(PER_EXAMPLE_ABLATIONS)}): drop faithfulness from intervals")
    if spec.task is not None and spec.model is None:
        raise InputError("task is given but model is not: the task's prompts are built with the model's "
                         "tokenizer; give model too, or drop task")
    if spec.model is None:
        return None, None
    model = _load(spec.model, spec, allow_pickle, allow_large, inputs)
    want = (sm.provenance.get("model") or {}).get("weight_hash")
    if model.weight_hash() != want:
        raise InputError(f"model {spec.model} is not the model of {where} (weight hash "
                         f"{model.weight_hash()[:12]} vs {str(want)[:12]}); give the model the run was made with")
    if spec.task is None:
        return model, None
    task = _build_task(model, spec)
    want = (sm.provenance.get("task") or {}).get("content_hash")
    if task.content_hash != want or len(task) != sm.n_examples:
        raise InputError(f"task {spec.task.name} (n={spec.task.n}, seed={spec.task.seed}) does not rebuild the "
                         f"prompts of {where} (task hash {task.content_hash[:12]} vs {str(want)[:12]}); give "
                         "the task name, n, seed and options the run was made with")
    if not np.array_equal(np.asarray(sm.example_ids), np.arange(sm.n_examples)):
        raise InputError(f"{where} holds examples out of order or a subset of the task; the faithfulness "
                         "intervals need its rows to be the task's examples 0..n-1 in order")
    return model, task
