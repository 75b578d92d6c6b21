"""The stability audit: attribution → resampling → stability → faithfulness → approximation → heads.

Each step is a resumable stage of a run directory (reports.rundir.RunDir): a killed run resumes
with the same command and recomputes only unfinished stages; every stage's randomness comes
from the run's root seed and the stage name, so resumed, parallel and serial runs write
identical tables.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from reports.schema import columns

from .spec import AuditSpec


def _chunks(n: int, batch_size: int, n_jobs: int) -> list[np.ndarray]:
    """Example rows split into whole batches, a few chunks per worker."""
    n_batches = -(-n // batch_size)
    per = max(1, -(-n_batches // max(1, 4 * n_jobs)))
    step = per * batch_size
    return [np.arange(s, min(s + step, n)) for s in range(0, n, step)]


def _attribute_rows(rows, model, task, method, spec: AuditSpec):
    from circuits.attribution import attribute

    return attribute(model, task, method, level=spec.level, ablation=spec.ablation, batch_size=spec.batch_size,
                     ig_steps=spec.ig_steps, seed=spec.seed, rows=rows, progress=False).scores


def attribution_scores(model, task, method: str, spec: AuditSpec, n_jobs: int):
    """ScoreMatrix of ``method`` on every example, computed in fixed chunks (any n_jobs gives the same).

    ``spec``: the AuditSpec, or any object with its level, ablation, batch_size, ig_steps and seed
    (the ``attribute`` command passes its options so)."""
    from circuits.scores import ScoreMatrix

    from .parallel import run_chunks

    n = task.clean.shape[0]
    t0 = time.perf_counter()
    parts = run_chunks(_attribute_rows, _chunks(n, spec.batch_size, n_jobs), n_jobs, model, task, method, spec,
                       desc=f"{method} scores")
    params = {"batch_size": spec.batch_size, "seed": spec.seed, "max_rows": 256}
    if method.startswith("eap-ig"):
        params["ig_steps"] = spec.ig_steps
    return ScoreMatrix(np.concatenate(parts), model.graph, spec.level, method, spec.ablation, task.metric_name,
                       params=params, provenance={"model": model.identity(), "seconds": time.perf_counter() - t0})


def resampling_plan(spec: AuditSpec, n: int, groups, seed, *, for_intervals: bool):
    """The run's resampling plan: bootstrap over examples or clusters, or half-size subsamples."""
    from circuits.errors import InputError
    from stats import ResamplingPlan

    b = spec.bootstrap
    if b.scheme == "clusters":
        if groups is None:
            raise InputError("bootstrap scheme 'clusters' needs a task with groups (templates); "
                             "use scheme 'examples' or a task with a group column")
        return ResamplingPlan.cluster(np.asarray(groups), b.n_resamples, seed)
    if b.scheme == "half-splits" and not for_intervals:
        return ResamplingPlan.subsample(n, b.n_resamples, seed)
    return ResamplingPlan.bootstrap(n, b.n_resamples, seed)


def edge_stats_table(S: np.ndarray, names: list[str], method: str, plan, spec: AuditSpec, n_jobs: int) -> dict:
    """Per-edge mean, bootstrap SE and CI, the p-value that inverts that CI, BH q, and the reliability flag."""
    from stats import bootstrap_edges

    boot = bootstrap_edges(S, plan, method=spec.bootstrap.ci_method, confidence_level=spec.bootstrap.confidence_level,
                           n_jobs=n_jobs)
    E = S.shape[1]
    return {"method": [method] * E, "edge": np.arange(E, dtype=np.int64), "name": names,
            "estimate": np.asarray(boot.estimate, dtype=np.float64),
            "se": np.asarray(boot.standard_error, dtype=np.float64),
            "ci_low": np.asarray(boot.confidence_interval.low, dtype=np.float64),
            "ci_high": np.asarray(boot.confidence_interval.high, dtype=np.float64),
            "p": np.asarray(boot.pvalue, dtype=np.float64), "q": np.asarray(boot.qvalue, dtype=np.float64),
            "n": np.full(E, S.shape[0], dtype=np.int64),
            "ci_method": [boot.method] * E, "estimand": [boot.estimand] * E,
            "tail_share": np.asarray(boot.tail_share, dtype=np.float64),
            "interval_reliable": np.asarray(boot.reliable, dtype=bool)}


# the per-k columns of circuit_stability that the stability_vs_k table carries (reports/schema.py says what
# each covers: jaccard_ci_* / phi_ci_* are Monte Carlo spread, jaccard_data* / jaccard_pop* / phi_data* data-level)
STABILITY_COLUMNS = tuple(c for c in columns("stability_vs_k") if c not in ("method", "k", "spearman_mean"))


def stability_tables(S: np.ndarray, names: list[str], method: str, plan, ks: list[int], spec: AuditSpec,
                     n_jobs: int) -> tuple[dict, dict]:
    """(stability_vs_k, inclusion) columns for one method."""
    from stats import circuit_stability

    res = circuit_stability(S, plan, ks, ranking=spec.ranking, n_jobs=n_jobs, edge_names=names)
    per = res.per_k
    stab = {"method": [method] * len(res.ks), "k": res.ks.astype(np.int64)}
    for c in STABILITY_COLUMNS:
        v = np.asarray(per[c])
        stab[c] = v.astype(np.int64) if c == "consensus_size" else v.astype(np.float64)
    stab["spearman_mean"] = np.full(len(res.ks), res.spearman_mean)
    ki, ei = np.nonzero(res.inclusion_counts)
    inc = {"method": [method] * len(ki), "k": res.ks[ki].astype(np.int64), "edge": ei.astype(np.int64),
           "name": [names[e] for e in ei], "frequency": res.inclusion_counts[ki, ei] / res.n_resamples}
    return stab, inc


AREA_NEEDS_TWO_K = "CPR and CMD are areas under the faithfulness curve and need at least two k"


FIXED_CI_METHODS = ("percentile", "basic", "bca")


def faithfulness_table(model, task, S: np.ndarray, method: str, ks: list[int], plan, spec: AuditSpec,
                       seed=None) -> dict:
    """Faithfulness of the top-k circuit of the mean scores at each k, with two labelled intervals:
    the bootstrap interval of this fixed circuit (selection not included) and the cross-fitted one of
    the circuit selected from N prompts (selection included; edge level). CPR/CMD are NaN, with the
    reason in ``area_note``, when the grid has one k."""
    from circuits.faithfulness import faithfulness_curve
    from stats.faithfulness import fixed_circuit_interval

    level = getattr(spec, "level", "edge")
    mean = S.astype(np.float64).sum(0) / S.shape[0]
    res = faithfulness_curve(model, task, mean.astype(np.float32), absolute=spec.ranking == "absolute", ks=ks,
                             fractions=None, prune=False, ablation=spec.ablation, seed=spec.seed,
                             batch_size=spec.batch_size, progress=sys.stderr.isatty(), level=level)
    ci_method = spec.bootstrap.ci_method if spec.bootstrap.ci_method in FIXED_CI_METHODS else "bca"
    fixed = fixed_circuit_interval(res.m_circuit, res.m_clean, res.m_empty, plan, method=ci_method,
                                   confidence_level=spec.bootstrap.confidence_level, k=ks)
    C = len(res.ratio_of_means)
    out = {"method": [method] * C, "k": np.asarray(res.k, dtype=np.int64),
           "edge_fraction": np.asarray(res.fraction, dtype=np.float64),
           "f_ratio": np.asarray(res.ratio_of_means, dtype=np.float64),
           "f_mean": np.asarray(res.mean_per_example, dtype=np.float64),
           "f_ci_low": np.asarray(fixed.confidence_interval.low, dtype=np.float64),
           "f_ci_high": np.asarray(fixed.confidence_interval.high, dtype=np.float64),
           "f_se": np.asarray(fixed.standard_error, dtype=np.float64),
           "f_ci_method": [fixed.method] * C, "f_ci_estimand": [fixed.estimand] * C,
           "cpr": np.full(C, np.nan if res.cpr is None else float(res.cpr)),
           "cmd": np.full(C, np.nan if res.cmd is None else float(res.cmd)),
           "area_note": [AREA_NEEDS_TWO_K if res.cpr is None else ""] * C,
           "n_undefined": np.full(C, res.n_undefined, dtype=np.int64)}
    out.update(_selected_columns(model, task, S, ks, spec, res, spec.seed if seed is None else seed, C))
    return out


def _selected_columns(model, task, S: np.ndarray, ks: list[int], spec: AuditSpec, res, seed, C: int) -> dict:
    """The selection-aware faithfulness columns (stats.faithfulness, repeated cross-fitting), or NaN with why."""
    import warnings

    from circuits.faithfulness import faithfulness
    from stats.faithfulness import ESTIMAND_SELECTED, MIN_PER_FOLD, selection_aware_faithfulness

    N = S.shape[0]
    nan = {"f_selected": np.full(C, np.nan), "f_selected_se": np.full(C, np.nan),
           "f_selected_ci_low": np.full(C, np.nan), "f_selected_ci_high": np.full(C, np.nan),
           "f_selected_method": ["corrected-t"] * C, "f_selected_estimand": [ESTIMAND_SELECTED] * C,
           "fold_circuit_jaccard": np.full(C, np.nan)}
    n_folds = min(5, N // MIN_PER_FOLD)
    why = ("node-level circuits are not cross-fitted" if getattr(spec, "level", "edge") != "edge" else
           f"cross-fitting needs N >= {2 * MIN_PER_FOLD} prompts" if n_folds < 2 else "")
    if why:
        return {**nan, "f_selected_note": [why] * C}

    def evaluate(masks: np.ndarray, rows: np.ndarray):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the curve already warned about undefined examples
            r = faithfulness(model, task, masks, ablation=spec.ablation, rows=rows, seed=spec.seed,
                             batch_size=spec.batch_size, progress=False)
        return r.m_circuit, r.m_clean, r.m_empty

    # the full circuit (k = all edges) involves no selection: its columns stay NaN with the reason
    use = np.asarray([1 <= k < S.shape[1] for k in ks])
    if not use.any():
        return {**nan, "f_selected_note": ["k covers every edge: no selection to account for"] * C}
    known = (np.stack([c.edges for c in res.circuits]), res.m_circuit, res.m_clean, res.m_empty)
    sel = selection_aware_faithfulness(S, evaluate, [k for k, u in zip(ks, use) if u], ranking=spec.ranking,
                                       n_folds=n_folds, n_repeats=2, seed=seed,
                                       confidence_level=spec.bootstrap.confidence_level, known=known,
                                       groups=None if task.group is None else task.group.numpy())
    out = {**nan, "f_selected_method": [sel.method] * C,
           "f_selected_note": [f"{n_folds}-fold cross-fitting, 2 repeats" if u else "k covers every edge: no "
                               "selection to account for" for u in use]}
    for col, values in (("f_selected", sel.estimate), ("f_selected_se", sel.standard_error),
                        ("f_selected_ci_low", sel.confidence_interval.low),
                        ("f_selected_ci_high", sel.confidence_interval.high),
                        ("fold_circuit_jaccard", sel.extra.get("fold_circuit_jaccard", np.full(use.sum(), np.nan)))):
        out[col] = out[col].copy()
        out[col][use] = np.asarray(values, np.float64)
    return out


def approximation_tables(exact: np.ndarray, approx: np.ndarray, names: list[str], method: str, k: int,
                         ranking: str) -> tuple[dict, dict]:
    """(approximation, approximation_summary) columns of ``method`` against exact (stats.approximation)."""
    from stats.approximation import approximation_agreement

    res = approximation_agreement(exact, approx, k, ranking=ranking, seed=0, edge_names=names)
    per, summ = res.to_table("per_edge").to_pydict(), res.to_table("summary").to_pydict()
    return {"method": [method] * len(names), **per}, {"method": [method], **summ}


def _concat(parts: list[dict]) -> dict:
    out: dict = {}
    for p in parts:
        for key, v in p.items():
            out.setdefault(key, []).append(np.asarray(v) if not isinstance(v, list) else np.asarray(v, dtype=object))
    return {k: (np.concatenate(v).tolist() if v[0].dtype == object else np.concatenate(v)) for k, v in out.items()}


def run_audit(spec: AuditSpec, out: str | Path, *, n_jobs: int | None = None, scheduler: str | None = None,
              force: bool = False, allow_pickle: bool = False, allow_large: bool = False) -> Path:
    """Run (or resume) the audit described by ``spec`` into run directory ``out``; returns ``out``.

    Everything a user can get wrong (devices, workers, sizes, k, resampling scheme, task options,
    an unreachable scheduler) is checked before the run directory is created.
    """
    from circuits.scores import ScoreMatrix
    from reports.rundir import RunDir
    from reports.tables import table_to_matrix

    from .build import check_n_jobs
    from .parallel import backend
    from .training import use_deterministic

    out = Path(out)
    n_jobs = check_n_jobs(spec.n_jobs if n_jobs is None else n_jobs, "--n-jobs" if n_jobs is not None else "n_jobs")
    use_deterministic()  # CUBLAS_WORKSPACE_CONFIG too, before any model loads
    sources, model, task = prepare_audit(spec, allow_pickle=allow_pickle, allow_large=allow_large)
    ks = list(spec.k)
    n_cols = model.graph.n_edges if spec.level == "edge" else model.graph.n_senders
    base = {"weight_hash": model.weight_hash(), "task_hash": task.content_hash}
    spec_doc = spec.model_dump()
    with backend(n_jobs, scheduler) as workers, RunDir(out, spec=spec_doc, command=sys.argv, seed=spec.seed,
                                                        provenance={"model": model.identity(),
                                                                    "task": task.describe()}) as run:
        index_name = "edges" if spec.level == "edge" else "nodes"
        sm0 = ScoreMatrix(np.zeros((1, n_cols), np.float32), model.graph, spec.level, "none", spec.ablation, "none")
        run_stage(run, "index", lambda: {index_name: sm0.tables()[index_name]}, [index_name], params=base,
                  force=force)
        names = sm0.names
        attr_keys = ("level", "ablation", "batch_size", "ig_steps", "seed")
        for method in spec.methods:
            params = {**base, "method": method, "task": spec.task.model_dump(),
                      **{k: spec_doc[k] for k in attr_keys}}
            run_stage(run, f"scores_{method}",
                      lambda method=method: {f"scores_{method}": attribution_scores(
                          model, task, method, spec, workers).tables({"task": task.describe()})["scores"]},
                      [f"scores_{method}"], params=params, force=force)
        scores = {m: np.asarray(table_to_matrix(run.table(f"scores_{m}"))) for m in spec.methods}
        deps = [f"scores_{m}" for m in spec.methods]
        N = task.clean.shape[0]
        groups = None if task.group is None else task.group.numpy()
        rs = {"bootstrap": spec.bootstrap.model_dump(), "k": ks, "ranking": spec.ranking}

        def stats_stage():
            plan = resampling_plan(spec, N, groups, run.stage_seed("resampling"), for_intervals=True)
            return {"edge_stats": _concat([edge_stats_table(scores[m], names, m, plan, spec, workers)
                                           for m in spec.methods])}

        run_stage(run, "edge_stats", stats_stage, ["edge_stats"], params=rs, depends_on=deps, force=force)

        def stability_stage():
            plan = resampling_plan(spec, N, groups, run.stage_seed("resampling"), for_intervals=False)
            parts = [stability_tables(scores[m], names, m, plan, ks, spec, workers) for m in spec.methods]
            return {"stability_vs_k": _concat([p[0] for p in parts]), "inclusion": _concat([p[1] for p in parts])}

        run_stage(run, "stability", stability_stage, ["stability_vs_k", "inclusion"], params=rs, depends_on=deps,
                  force=force)

        if spec.faithfulness:
            def faith_stage():
                plan = resampling_plan(spec, N, groups, run.stage_seed("resampling"), for_intervals=True)
                return {"faithfulness_vs_k": _concat([faithfulness_table(model, task, scores[m], m, ks, plan, spec,
                                                                         seed=run.stage_seed("faithfulness"))
                                                      for m in spec.methods])}

            run_stage(run, "faithfulness", faith_stage, ["faithfulness_vs_k"], params=rs, depends_on=deps,
                      force=force)

        others = [m for m in spec.methods if m != "exact"]
        if "exact" in spec.methods and others:
            def approx_stage():
                parts = [approximation_tables(scores["exact"], scores[m], names, m, ks[min(1, len(ks) - 1)],
                                              spec.ranking) for m in others]
                return {"approximation": _concat([p[0] for p in parts]),
                        "approximation_summary": _concat([p[1] for p in parts])}

            run_stage(run, "approximation", approx_stage, ["approximation", "approximation_summary"],
                      params={"k": ks, "ranking": spec.ranking}, depends_on=deps, force=force)

        if len(sources) > 1:
            _heads_stage(run, spec, sources, task, force, allow_pickle=allow_pickle, allow_large=allow_large)
    return out


def prepare_audit(spec: AuditSpec, *, allow_pickle: bool = False, allow_large: bool = False):
    """(sources, model, task) of ``spec``, after every check that needs no run directory:
    device, sizes (lifted by ``allow_large``), task options, attribution options, k and the
    resampling scheme. InputError on the first problem."""
    from circuits.attribution import check_options
    from circuits.errors import InputError

    from .build import build_task, check_device, check_work, load_source, n_columns, resolve_source, task_positions

    for method in spec.methods:
        check_options(method, spec.level, spec.ablation, batch_size=spec.batch_size, ig_steps=spec.ig_steps)
    device = check_device(spec.device)
    sources = [resolve_source(s) for s in spec.sources]
    model = load_source(sources[0], device=device, dtype=spec.dtype, allow_pickle=allow_pickle,
                        allow_large=allow_large)
    check_work(model, spec.task.n, level=spec.level, n_matrices=len(spec.methods),
               positions=task_positions(spec.task.name, spec.task.options),
               n_resamples=spec.bootstrap.n_resamples, allow_large=allow_large)
    task = build_task(model, spec.task.name, n=spec.task.n, seed=spec.task.seed, metric=spec.task.metric,
                      **spec.task.options)
    n_cols = n_columns(model, spec.level)
    if spec.k[-1] >= n_cols:
        raise InputError(f"k={spec.k[-1]} is not below the number of {spec.level}s ({n_cols}); use smaller k")
    check_scheme(spec.bootstrap.scheme, task.group, task.name)
    return sources, model, task


def check_scheme(scheme: str, groups, task_name: str) -> None:
    """None; InputError when the resampling ``scheme`` cannot apply (clusters need the task's groups)."""
    from circuits.errors import InputError

    if scheme == "clusters" and groups is None:
        raise InputError(f"bootstrap scheme 'clusters' needs a task with groups (templates); task {task_name!r} "
                         "has none: use scheme 'examples' or a task with a group column")


def run_stage(run, name: str, fn, outputs, **kw) -> None:
    """``run.stage(name, fn, outputs, **kw)`` with ``fn`` pinned to one torch and one BLAS thread,
    and a line on stderr saying how long the stage took (or that it was already done)."""
    from .parallel import single_threaded

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


def _heads_stage(run, spec: AuditSpec, sources: list[str], task, force: bool, *, allow_pickle: bool = False,
                 allow_large: bool = False) -> None:
    """Head stability across the spec's models (the heads estimator of pipelines.heads)."""
    from . import heads as heads_mod
    from .build import load_source

    params = {"models": spec.sources, **spec.heads.model_dump(), "seed": spec.seed}
    outputs = ["heads", "layers", "residual", "head_details", "correlation", "summary"]

    def compute():
        h = spec.heads
        est = heads_mod.HeadStability(match=h.match, pairs=h.pairs, drop_bos=h.drop_bos, n_probe=h.n_probe,
                                      n_boot=h.n_boot, random_state=spec.seed)
        models = [load_source(s, device=spec.device, allow_pickle=allow_pickle, allow_large=allow_large)
                  for s in sources]
        # Without a tokenizer there are no corpus snippets: the task's clean prompts are the probe set.
        full = task.attention_mask.bool().all(1).numpy()
        probe = None if models[0].tokenizer is not None else heads_mod.ProbeSet.from_ids(
            task.clean.numpy()[full][: h.n_probe], source=f"task:{task.name}")
        tables = est.fit(models, probe).tables()
        return {name: tables[name] for name in outputs}

    run_stage(run, "heads", compute, outputs, params=params, force=force)
