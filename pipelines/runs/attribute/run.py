"""The ``attribute`` run kind: per-example attribution scores, checkpointed, into a run directory.

``circuitstat attribute`` and the service's attribute jobs both run :func:`run_attribute` (the command adds
``--plan`` and prints the top scores); every option is validated before the run directory is created.
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from circuitstat.pipelines.kinds import RunKind, check_run_out
from circuitstat.pipelines.options import ABLATION, DTYPES, INPUT_NODE, LEVEL, MASK_METHODS, METHOD, METRIC, MOE_NODES
from circuitstat.core.params import BATCH_SIZE, IG_STEPS, N_JOBS, N_REFITS, SEED
from circuitstat.pipelines.sources import LOCAL, RunInputs
from circuitstat.pipelines.spec import (MASK_SECTIONS, EdgePruningOptions, UGSOptions, VerifySpec, mask_draws,
                                        no_reserved_task_options)


def torch_dtype(name: str):
    """The torch dtype of a --dtype name (``bf16`` and ``bfloat16`` alike)."""
    import torch

    return getattr(torch, DTYPES[name])


def prepare_attribute(model: str, task: str, *, method: str, level: str, ablation: str, metric: str | None, n: int,
                      batch_size: int, ig_steps: int, seed: int, n_jobs: int, device: str, dtype: str,
                      max_memory: str | None, allow_pickle: bool, allow_large: bool, task_options: dict | None = None,
                      inputs: RunInputs = LOCAL, moe_nodes: str = "block", priced: Any = None):
    """(model, task, memory budget, n_jobs) of an ``attribute`` run after every check that needs no
    run directory (options, workers, device, sizes, the task and its options, ``moe_nodes``: the graph of a
    mixture-of-experts model, circuitstat.circuits.moe_nodes; with ``priced``, the run's AttributeSpec, its work by
    the --plan arithmetic, from the config before a weight is read); InputError on the first problem."""
    from circuitstat.circuits.attribution import check_options
    from circuitstat.circuits.plan import parse_bytes
    from circuitstat.pipelines.build import (build_task, check_device, check_n_jobs, check_work, load_with_graph,
                                             precheck_task, task_positions)

    options = dict(task_options or {})
    source = inputs.resolve(model)
    precheck_task(source.location, task, n=n, seed=seed, metric=metric, public=source.name, **options)  # before the model
    check_method_options(method, level, ablation, batch_size=batch_size, ig_steps=ig_steps)
    n_jobs = check_n_jobs(n_jobs, "--n-jobs")
    dev = check_device(device)
    from circuitstat.circuits.limits import check_budget

    # a run's budget must fit where it runs (--plan may plan for a larger machine)
    budget = None if max_memory is None else check_budget(parse_bytes(max_memory), device=dev)
    if priced is not None:
        from circuitstat.pipelines.work import check_run_work

        sk = inputs.skeleton(model, allow_pickle=allow_pickle, allow_large=allow_large, weights=False)
        check_work(sk, n, level=level, positions=task_positions(task, options), allow_large=allow_large)  # counts
        check_run_work("attribute", priced, sk.cfg, allow_large=allow_large,
                       shrink="--n, --steps, --n-samples, --n-refits, --ig-steps or the --verify sizes")
    if dev.startswith("cuda"):  # refused from the config's shapes, before a weight is read onto the device
        from circuitstat.circuits.limits import check_fits_device
        from circuitstat.circuits.plan import weight_bytes

        sk = inputs.skeleton(model, allow_pickle=allow_pickle, allow_large=allow_large)
        check_fits_device(weight_bytes(sk.cfg, torch_dtype(dtype).itemsize), dev)
    m = load_with_graph(inputs, model, moe_nodes, device=dev, dtype=torch_dtype(dtype), allow_pickle=allow_pickle,
                        allow_large=allow_large)
    check_work(m, n, level=level, positions=task_positions(task, options), allow_large=allow_large)
    return m, build_task(m, task, n=n, seed=seed, metric=metric, **options), budget, n_jobs


def check_method_options(method: str, level: str, ablation: str, *, batch_size: int, ig_steps: int) -> None:
    """None; InputError naming the first option of ``method`` that cannot run (a mask-learned method: edges only)."""
    from circuitstat.circuits.attribution import check_options
    from circuitstat.core.errors import InputError

    if method not in MASK_METHODS:
        check_options(method, level, ablation, batch_size=batch_size, ig_steps=ig_steps)
        return
    check_options("eap", "edge", ablation, batch_size=batch_size, ig_steps=ig_steps)  # the ablation and sizes
    if level != "edge":
        raise InputError(f"{method} learns a mask over edges: use --level edge")


def pruning_options(method: str, options: dict | None, n_refits: int | None):
    """The options (EdgePruningOptions, UGSOptions) of a mask-learned ``method`` (``options``: steps, lr, sparsity,
    init, objective, and n_samples for ugs; unset: the defaults of circuitstat.core.params), checked; None for a
    score method; InputError when one is given for a method that does not take it (the one guard,
    circuitstat.pipelines.mask_options.check_mask_options)."""
    from circuitstat.pipelines.mask_options import check_mask_options, place_mask_options
    from circuitstat.pipelines.spec import MASK_SECTIONS, validate_spec

    given = {k: v for k, v in (options or {}).items() if v is not None}
    check_mask_options(method, place_mask_options(method, given), refits=n_refits is not None)
    if method not in MASK_METHODS:
        return None
    cls = MASK_SECTIONS[method][1]
    return validate_spec(cls, given, f"{method} options", kind=f"{method} options", keys=", ".join(cls.model_fields))


def run_attribute(model: str, task: str, out: Path, *, method: str = "eap", level: str = "edge",
                  ablation: str = "counterfactual", input_node: str = "embeddings", metric: str | None = None,
                  n: int = 64, batch_size: int = BATCH_SIZE.default, ig_steps: int = IG_STEPS.default,
                  seed: int = SEED.default, n_jobs: int = N_JOBS.default, device: str = "cpu", dtype: str = "float32",
                  max_memory: str | None = None, checkpoint_every: int | None = None, resume: bool = True,
                  force: bool = False, allow_pickle: bool = False, allow_large: bool = False, verify=None,
                  task_options: dict | None = None, inputs: RunInputs = LOCAL, scheduler: str | None = None,
                  edge_pruning: dict | None = None, n_refits: int | None = None, moe_nodes: str = "block",
                  ugs: dict | None = None):
    """The ScoreMatrix of ``circuitstat attribute`` with these options, written into run directory
    ``out`` (validated first; resumed from its checkpoints where it stopped); ``inputs`` resolves the model;
    ``scheduler`` (a Dask address, or 'local') runs the chunks on that cluster, with the same scores.
    A mask-learned ``method`` (edge-pruning, ugs) writes its learned mask instead (:func:`masks_into`; options
    ``edge_pruning`` or ``ugs``, and ``n_refits``) and returns the edge_masks table. The options become the
    kind's AttributeSpec (validated there, as the command's and a service job's are) and run as it runs them."""
    spec = attribute_spec({
        "model": model, "task": task, "task_options": dict(task_options or {}), "method": method, "level": level,
        "ablation": ablation, "input_node": input_node, "metric": metric, "n": n, "batch_size": batch_size,
        "ig_steps": ig_steps, "seed": seed, "dtype": DTYPES.get(dtype, dtype), "checkpoint_every": checkpoint_every,
        "max_memory": max_memory, "verify": verify, "edge_pruning": edge_pruning, "ugs": ugs, "n_refits": n_refits,
        "moe_nodes": moe_nodes}, "(run_attribute)", allow_large=allow_large)
    return run_attribute_spec(spec, out, n_jobs=n_jobs, device=device, scheduler=scheduler, force=force,
                              resume=resume, allow_pickle=allow_pickle, allow_large=allow_large, inputs=inputs)


def run_attribute_spec(spec: "AttributeSpec", out: Path, *, n_jobs: int = N_JOBS.default, device: str = "cpu",
                       scheduler: str | None = None, force: bool = False, resume: bool = True,
                       allow_pickle: bool = False, allow_large: bool = False, inputs: RunInputs = LOCAL):
    """The ScoreMatrix (a mask-learned method: the edge_masks table) of the attribute run ``spec`` written into
    ``out``: the kind's run, for the command line, the library and the service alike. The keyword arguments are
    the machine's, never the request's: workers, device, Dask ``scheduler``, ``force``, ``resume`` and the
    ``allow_*`` limits (the service passes its own)."""
    from circuitstat.pipelines.parallel import backend

    pruning = None
    if spec.method in MASK_METHODS:
        section, options_class = MASK_SECTIONS[spec.method]
        pruning = getattr(spec, section) or options_class()
    check_run_out(out, "attribute", force=force)
    m, t, budget, n_jobs = prepare_attribute(
        spec.model, spec.task, method=spec.method, level=spec.level, ablation=spec.ablation, metric=spec.metric,
        n=spec.n, batch_size=spec.batch_size, ig_steps=spec.ig_steps, seed=spec.seed, n_jobs=n_jobs, device=device,
        dtype=spec.dtype, max_memory=spec.max_memory, allow_pickle=allow_pickle, allow_large=allow_large,
        inputs=inputs, task_options=spec.task_options, moe_nodes=spec.moe_nodes, priced=spec)
    check_attribute_verify(spec.verify, m, method=spec.method, level=spec.level, n=spec.n)
    common = {"model_arg": spec.model, "task_arg": spec.task, "task_options": spec.task_options,
              "method": spec.method, "ablation": spec.ablation, "input_node": spec.input_node, "n": spec.n,
              "batch_size": spec.batch_size, "seed": spec.seed, "dtype": spec.dtype, "force": force}
    if pruning is not None:
        return masks_into(m, t, out, options=pruning, n_refits=spec.n_refits, **common)
    with backend(n_jobs, scheduler) as workers:  # an unreachable scheduler is refused before --out is written
        return attribute_into(m, t, out, level=spec.level, ig_steps=spec.ig_steps, n_jobs=workers, budget=budget,
                              checkpoint_every=spec.checkpoint_every, resume=resume, verify=spec.verify,
                              moe_nodes=spec.moe_nodes, **common)


def masks_into(m, t, out: Path, *, model_arg: str, task_arg: str, task_options: dict, method: str, ablation: str,
               input_node: str, n: int, batch_size: int, seed: int, dtype: str, options, n_refits: int | None,
               force: bool):
    """The edge_masks table of a mask-learned method's run written into ``out``: stage ``masks`` fits it on the n
    prompts (seed ``seed``) and, with ``n_refits``, refits it on as many bootstrap resamples (the run's resampling
    seed; child i of ``seed`` for refit i): tables edge_masks, mask_fits, method_notes
    (circuitstat.pipelines.runs.audit.masks; docs/edge-pruning.md)."""
    from types import SimpleNamespace

    import numpy as np

    from circuitstat.circuits.scores import ScoreMatrix
    from circuitstat.core.rundir import RunDir
    from circuitstat.pipelines.runs.audit.masks import MASK_OUTPUTS, mask_tables
    from circuitstat.stats import ResamplingPlan

    spec = {"model": model_arg, "task": task_arg, "method": method, "level": "edge", "ablation": ablation,
            "input_node": input_node, "metric": t.metric_name, "n": n, "batch_size": batch_size, "seed": seed,
            "dtype": DTYPES[dtype], "max_rows": 0, MASK_SECTIONS[method][0]: options.model_dump(),
            "n_refits": n_refits}
    if task_options:
        spec["task_options"] = task_options
    if m.graph.experts:  # experts as nodes (circuitstat.circuits.moe_nodes): recorded only when chosen
        spec["moe_nodes"] = "experts"
    identity, task_record = m.identity(), _task_record(t)
    params = {**spec, "weight_hash": identity["weight_hash"], "task_hash": t.content_hash}
    fit = SimpleNamespace(methods=[method], ablation=ablation, input_node=input_node, seed=seed, batch_size=batch_size,
                          edge_pruning=options, ugs=options)
    edges = ScoreMatrix(np.zeros((1, m.graph.n_edges), np.float32), m.graph, "edge", method, ablation,
                        t.metric_name).tables()["edges"]
    with RunDir(out, spec=spec, command=sys.argv, seed=seed, kind="attribute",
                provenance={"model": identity, "task": task_record}) as run:
        def compute():
            plan = None if n_refits is None else ResamplingPlan.bootstrap(n, n_refits, run.stage_seed("resampling"))
            return {"edges": edges, **mask_tables(m, t, fit, m.graph.edge_names, plan)}

        run.stage("masks", compute, ["edges", *MASK_OUTPUTS], params=params, force=force)
        return run.table("edge_masks")


def check_attribute_verify(verify, m, *, method: str, level: str, n: int) -> None:
    """None; InputError when ``verify`` (a VerifySpec or None) cannot check this run (before any work)."""
    from circuitstat.pipelines.spec import check_verify

    check_verify(verify, methods=[method], n_prompts=n, level=level, n_edges=m.graph.n_edges)


def _engine_sizes(m, t, method: str, level: str, batch_size: int, budget: int | None) -> tuple[int, int]:
    """(batch_size, max_rows) for the engine: as asked (rows 256), or the largest that fit ``budget``."""
    if budget is None:
        return batch_size, 256
    from circuitstat.circuits.plan import fit_memory

    widest = batch_size * int(m.graph.n_upstream.max())  # more rows than one receiver has are never used
    return fit_memory(m.cfg, method, budget, positions=int(t.clean.shape[1]), level=level, batch_size=batch_size,
                      max_rows=widest, itemsize=m.dtype.itemsize)


def _scores_done(out: Path) -> bool:
    """True when ``out`` records a finished scores stage (its checkpoints are then redundant)."""
    from circuitstat.core.rundir import MANIFEST, RunDir

    if not (out / MANIFEST).is_file():
        return False
    return RunDir.read_manifest(out).get("stages", {}).get("scores", {}).get("status") == "done"


LONG_LIST = 64
"""Lists longer than this in a task's description are recorded by length and hash (see _task_record)."""


def _task_record(t) -> dict:
    """The task's description for provenance, with long lists (the induction token pool: 50,256 ids on
    GPT-2, 340 kB of JSON written into the manifest and both tables) as their length and sha256; the
    task's content hash covers its tokens either way. (To go once Task.describe does this itself.)"""
    from circuitstat.core.provenance import hash_json

    desc = t.describe()
    meta = {k: {"length": len(v), "sha256": hash_json(v)} if isinstance(v, list) and len(v) > LONG_LIST else v
            for k, v in desc.get("meta", {}).items()}
    return {**desc, "meta": meta}


def attribute_into(m, t, out: Path, *, model_arg: str, task_arg: str, task_options: dict, method: str, level: str,
                   ablation: str, input_node: str, n: int,
                   batch_size: int, ig_steps: int, seed: int, n_jobs: int, dtype: str, budget: int | None,
                   checkpoint_every: int | None, resume: bool, force: bool, verify=None, moe_nodes: str = "block"):
    """The ScoreMatrix of one checkpointed attribution run written into ``out`` (resumed where it stopped);
    with ``verify`` (a VerifySpec), a verified stage after it (pipelines.verify)."""
    from circuitstat.circuits.ablation import Ablation as Counterfactuals
    from circuitstat.circuits.scores import ScoreMatrix
    from circuitstat.pipelines.checkpoint import AttributionJob, CheckpointStore, chunk_bounds, run_checkpointed
    from circuitstat.core.rundir import RunDir

    batch_size, max_rows = _engine_sizes(m, t, method, level, batch_size, budget)
    spec = {"model": model_arg, "task": task_arg, "method": method, "level": level, "ablation": ablation,
            "input_node": input_node, "metric": t.metric_name, "n": n, "batch_size": batch_size, "ig_steps": ig_steps,
            "seed": seed,
            "dtype": DTYPES[dtype], "max_rows": max_rows}
    if task_options:  # recorded only when given, so runs without options resume as before
        spec["task_options"] = task_options
    if verify is not None:  # likewise
        spec["verify"] = verify.model_dump()
    options = {"batch_size": batch_size, "max_rows": max_rows, "ig_steps": ig_steps, "dtype": DTYPES[dtype],
               "device": m.device.type, "input_node": input_node}
    if moe_nodes != "block":  # likewise: experts as nodes is another graph (circuitstat.circuits.moe_nodes)
        spec["moe_nodes"] = options["moe_nodes"] = moe_nodes
    identity, task_record = m.identity(), _task_record(t)  # the model caches its weight hash
    job = AttributionJob(identity["weight_hash"], t.content_hash, t.metric_name, method, level, ablation, n,
                         len(m.graph.edge_names) if level == "edge" else m.graph.n_senders, seed, options)
    store = CheckpointStore(out, job, chunk_bounds(n, batch_size, checkpoint_every))
    reuse = [] if _scores_done(out) else store.check(resume=resume, force=force)  # refused before anything is written
    params = {**spec, "weight_hash": job.weight_hash, "task_hash": job.task_hash}
    index = "edges" if level == "edge" else "nodes"
    computed = []  # the ScoreMatrix when this call computes it (a finished stage is read back instead)
    with RunDir(out, spec=spec, command=sys.argv, seed=seed, kind="attribute",
                provenance={"model": identity, "task": task_record}) as run:
        def compute():
            import time

            t0 = time.perf_counter()
            # one counterfactual builder for every chunk: mean ablations average the whole dataset once
            abl = Counterfactuals(ablation, m, t, seed=seed, batch_size=batch_size, input_node=input_node)
            kw = {"level": level, "ablation": abl, "batch_size": batch_size, "ig_steps": ig_steps, "seed": seed,
                  "max_rows": max_rows}
            scores = run_checkpointed(store, m, t, method, kw, reuse=reuse, n_jobs=n_jobs, run_id=run.run_id)
            eparams = {"batch_size": batch_size, "seed": seed, "max_rows": max_rows, "input_node": input_node}
            if moe_nodes != "block":
                eparams["moe_nodes"] = moe_nodes
            from circuitstat.circuits.attribution import uses_ig_steps

            if uses_ig_steps(method):
                eparams["ig_steps"] = ig_steps
            sm = ScoreMatrix(scores, m.graph, level, method, ablation, t.metric_name, params=eparams,
                             provenance={"model": identity, "seconds": time.perf_counter() - t0,
                                         "resumed_chunks": len(reuse)})
            computed.append(sm)
            return sm.tables({"task": task_record})

        run.stage("scores", compute, ["scores", index], params=params, force=force)
        if verify is not None:
            _verify_stage(run, m, t, verify, method=method, ablation=ablation, seed=seed, batch_size=batch_size,
                          max_rows=max_rows, input_node=input_node, force=force)
    store.remove()  # the committed table holds every row now
    return computed[0] if computed else ScoreMatrix.read(out)


def _verify_stage(run, m, t, verify, *, method: str, force: bool, **exact_options) -> None:
    """The verified stage of an attribute run: exact on verify.n random prompts checks ``method``'s scores."""
    import numpy as np

    from circuitstat.core.tables import table_to_matrix
    from circuitstat.pipelines import verify as V
    from circuitstat.pipelines.runs.audit.run import verify_outputs

    seed = V.draw_seed(verify.seed, run.stage_seed("verified"))

    def compute():
        approx = {method: np.asarray(table_to_matrix(run.table("scores")), np.float64)}
        if verify.design == "active":  # exact on the sampled cells only (pipelines.verify.active_tables)
            return V.active_tables(approx, lambda cells: V.exact_on_cells(m, t, cells, **exact_options),
                                   verify.budget, seed, m.graph.edge_names, confidence_level=0.95,
                                   correction=verify.correction)
        plan = V.verify_plan(approx, verify, seed)
        exact, cols = V.run_exact(m, t, plan, **exact_options)
        return V.verified_tables(approx, exact, cols, plan, m.graph.edge_names, confidence_level=0.95, tau=verify.tau,
                                 correction=verify.correction)

    run.stage("verified", compute, verify_outputs(verify), params={"verify": verify.model_dump(), "seed": seed,
                                                                   "confidence_level": 0.95},
              depends_on=["scores"], force=force)


N_MAX = 1_000_000
"""The most prompts an attribute spec asks for (a service job can never lift it; the command line's --allow-large can)."""


class AttributeSpec(BaseModel):
    """The options of ``circuitstat attribute`` as a spec (``--out``, ``--plan``, ``--device`` and the
    CLI-only ``--allow-*`` flags are the server's, not the request's)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    model: str
    task: str = "induction"
    task_options: dict[str, Any] = Field(default_factory=dict)  # --task-option KEY=VALUE, typed as in an audit spec
    method: METHOD = "eap"
    level: LEVEL = "edge"
    ablation: ABLATION = "counterfactual"
    input_node: INPUT_NODE = "embeddings"
    metric: METRIC | None = None
    n: int = Field(64, ge=1)  # at most N_MAX prompts: the command line's --allow-large lifts that (_n_limit)
    batch_size: int = BATCH_SIZE.pydantic()
    ig_steps: int = IG_STEPS.pydantic()
    seed: int = SEED.pydantic()
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    checkpoint_every: int | None = Field(None, ge=1)
    max_memory: str | None = Field(None, max_length=32)
    verify: VerifySpec | None = None
    # method edge-pruning (ugs): each fit's options (None: the defaults) and the bootstrap refits (None: one fit)
    edge_pruning: EdgePruningOptions | None = None
    ugs: UGSOptions | None = None
    n_refits: int | None = N_REFITS.pydantic(default=None)
    moe_nodes: MOE_NODES = "block"  # experts: one sender per expert of a mixture-of-experts layer

    @field_validator("n")
    @classmethod
    def _n_limit(cls, v: int, info: ValidationInfo) -> int:
        # a request's limit; only the command line's --allow-large (validation context) lifts it, never a spec's key
        context = info.context or {}
        if v > N_MAX and not context.get("allow_large"):
            from circuitstat.core.errors import InputError

            raise InputError(f"--n {v} is above {N_MAX:,} prompts; --allow-large lifts this limit"
                             if context.get("words") == "flags" else f"must be at most {N_MAX}")
        return v

    @field_validator("task_options")
    @classmethod
    def _no_reserved(cls, v: dict[str, Any]) -> dict[str, Any]:
        return no_reserved_task_options(v, "")

    @model_validator(mode="before")
    @classmethod
    def _mask_options_fit(cls, data: Any) -> Any:
        # before the sections are validated: an option of another method is named as such, not as that method's
        # options' error (the one guard, circuitstat.pipelines.mask_options)
        from circuitstat.pipelines.mask_options import check_mask_options, section_of

        method = data.get("method", cls.model_fields["method"].default) if isinstance(data, dict) else None
        if method in typing.get_args(METHOD):  # an unknown method is named by the method field's own error
            sections = {}
            for name in {section_of(m) for m in MASK_METHODS}:
                given = data.get(name)
                if given is not None:
                    sections[name] = list(given) if isinstance(given, dict) else sorted(
                        getattr(given, "model_fields_set", ()))
            check_mask_options(method, sections, refits=data.get("n_refits") is not None)
        return data

    @model_validator(mode="after")
    def _options_fit(self, info: ValidationInfo) -> "AttributeSpec":
        # the rules across options, checked here once for the command line, the library and the service; an
        # InputError keeps its own message (attribute_spec), worded for flags when the command line built the spec
        from circuitstat.pipelines.spec import check_verify

        words = (info.context or {}).get("words", "spec")
        check_verify(self.verify, methods=[self.method], n_prompts=self.n, level=self.level, words=words)
        ep = self.edge_pruning
        # (node_target without node masks is refused by the options class itself, for audits too)
        if ep is not None and ep.node_sparsity is not None and not ep.node_masks:
            from circuitstat.core.errors import InputError

            raise InputError("--node-sparsity weighs the node gates: give --node-masks too" if words == "flags" else
                             "edge_pruning.node_sparsity weighs the node gates: give edge_pruning.node_masks: true too")
        return self

    @property
    def sources(self) -> list[str]:
        """The model source (one)."""
        return [self.model]


def _parse(data, source: str) -> AttributeSpec:
    from circuitstat.pipelines.spec import validate_spec

    return validate_spec(AttributeSpec, data, source, kind="attribute spec", keys="model, task, method, ...")


def attribute_spec(data: dict, source: str, *, words: str = "spec", allow_large: bool = False) -> AttributeSpec:
    """The AttributeSpec of ``data`` (validated: the one check of attribute's options, for the command line with
    ``words="flags"``, and the library); InputError with a rule's own message (a verified run that cannot be made,
    an option of another method, ...), else naming each bad option (as a flag with ``words="flags"``)."""
    from pydantic import ValidationError

    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.spec import format_error

    try:
        return AttributeSpec.model_validate(data, context={"words": words, "allow_large": allow_large})
    except ValidationError as exc:
        for err in exc.errors():
            rule = (err.get("ctx") or {}).get("error")
            if isinstance(rule, InputError):  # a rule across options (_options_fit): its message as it is
                raise InputError(str(rule)) from None
        if words == "flags":
            raise InputError("invalid options: " + option_errors(exc)) from None
        raise InputError(format_error(exc, source, AttributeSpec).replace("invalid spec", "invalid attribute spec",
                                                                          1)) from None


def option_errors(exc) -> str:
    """The errors of a ValidationError of attribute's options, each named by its flag (a mask fit's options by
    theirs: circuitstat.pipelines.mask_options.flag)."""
    from circuitstat.pipelines.mask_options import named

    parts = []
    for err in exc.errors()[:5]:
        keys = [str(p) for p in err["loc"] if isinstance(p, str)]
        msg = err["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
        if len(keys) == 1 and keys[0] in MASK_SECTIONS_BY_NAME:  # a rule of a mask fit's options as a whole
            parts.append(msg)
        else:
            parts.append(f"{named(keys[-1]) if keys else '(options)'}: {msg}")
    return "; ".join(parts)


MASK_SECTIONS_BY_NAME = {section for section, _ in MASK_SECTIONS.values()}


def attribute_flops(spec: AttributeSpec, cfg) -> float:
    """The FLOPs of ``spec``'s attribution on a model of config ``cfg`` (a mask-learned method's fit and refits:
    circuitstat.circuits.plan.pruning_cost)."""
    from circuitstat.pipelines.build import attribution_flops, task_positions

    if spec.method in MASK_METHODS:
        from circuitstat.circuits.plan import pruning_cost

        section, options_class = MASK_SECTIONS[spec.method]
        options = getattr(spec, section) or options_class()
        positions = task_positions(spec.task, spec.task_options or {}) or min(int(cfg.n_ctx), 64)
        steps = options.steps * mask_draws(spec.method, options)  # a step: one masked run per draw
        return pruning_cost(cfg, n=spec.n, positions=positions, steps=steps, fits=1 + (spec.n_refits or 0),
                            batch_size=spec.batch_size).flops

    total = attribution_flops(cfg, spec, spec.method, spec.n, ig_steps=spec.ig_steps, level=spec.level)
    if spec.verify is not None:
        from circuitstat.pipelines.verify import phase2_flops

        total += phase2_flops(cfg, spec, spec.verify, n_methods=1)
    return total


KIND = RunKind("attribute", "per-example attribution scores of one method", parse=_parse, run=run_attribute_spec,
               stages=lambda spec: (["masks"] if spec.method in MASK_METHODS else
                                    ["scores"] + (["verified"] if spec.verify is not None else [])),
               flops=attribute_flops)
