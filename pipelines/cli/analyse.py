"""Commands that compute: ``model`` (describe and check a model), ``attribute`` (per-example scores),
``audit`` (the stability audit), ``circuit`` (a run's top-k circuit) and ``report`` (its HTML)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from . import (ALLOW_LARGE_HELP, ALLOW_PICKLE_HELP, DTYPES, TASK_HELP, TASK_OPTION_HELP, Ablation, DType, Level,
               Method, MetricName, app, check_out, choices)


Rule = choices("Rule", "top-k", "greedy")  # how `circuit` selects edges


@app.command("model")
def model_command(
    source: str = typer.Argument(..., help="model directory, cached hub id, or random:ARCH?key=value&..."),
    n_inputs: int = typer.Option(4, "--n-inputs", min=1, max=4096, help="random inputs for the logits check"),
    length: int = typer.Option(16, "--length", min=1, help="tokens per random input (capped at the context)"),
    seed: int = typer.Option(0, "--seed", min=0),
    tolerance: float = typer.Option(1e-4, "--tolerance", min=0.0, help="max |logit difference| allowed"),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help=ALLOW_PICKLE_HELP),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
) -> None:
    """Describe a model and check CircuitModel logits against the Hugging Face model."""
    import torch

    from circuits import load_hf, load_model
    from circuits.convert import from_hf
    from pipelines.build import resolve_source

    source = resolve_source(source)
    path = Path(source)
    own = path.is_dir() and (path / "config.json").exists() and '"circuitstat"' in (path / "config.json").read_text()
    if own:
        model, hf = load_model(source, allow_pickle=allow_pickle, allow_large=allow_large), None
    else:
        hf = load_hf(source, allow_pickle=allow_pickle, allow_large=allow_large)
        model = from_hf(hf)
        model.source = source
    cfg, g = model.cfg, model.graph
    typer.echo(f"source        {source}")
    typer.echo(f"architecture  {cfg.arch}{' (parallel attention+MLP)' if cfg.parallel else ''}")
    typer.echo(f"layers        {cfg.n_layers}")
    kv = f" (K/V heads {cfg.n_kv_heads}, ungrouped per query head)" if cfg.n_kv_heads and cfg.n_kv_heads != cfg.n_heads else ""
    typer.echo(f"heads         {cfg.n_heads}{kv}")
    typer.echo(f"d_model       {cfg.d_model}   d_head {cfg.d_head}   d_mlp {cfg.d_mlp if cfg.has_mlp else '-'}")
    typer.echo(f"norm          {cfg.norm}   positions {cfg.positional}   mlp {cfg.mlp} ({cfg.act})")
    typer.echo(f"nodes         {len(g.nodes)} ({g.n_senders} senders, {g.n_receivers} receivers)")
    typer.echo(f"edges         {g.n_edges}")
    typer.echo(f"weight hash   {model.weight_hash()[:16]}")
    if hf is None:
        typer.echo("logits check  skipped (a circuitstat model has no Hugging Face counterpart)")
        return
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (n_inputs, min(length, cfg.n_ctx)), generator=gen)
    mask = torch.ones_like(ids)
    if n_inputs > 1:
        mask[-1, ids.shape[1] // 2 :] = 0  # one right-padded input
    with torch.no_grad():
        diff = (hf(ids, attention_mask=mask).logits - model(ids, mask)).abs()[mask.bool()].max().item()
    ok = diff <= tolerance
    typer.echo(f"logits check  max |HF - CircuitModel| = {diff:.3e} on {n_inputs} inputs "
               f"({'ok' if ok else 'FAILED'}, tolerance {tolerance:g})")
    if not ok:
        raise typer.Exit(1)


def _torch_dtype(name: str):
    import torch

    return getattr(torch, DTYPES[name])


@app.command("attribute")
def attribute_command(
    model: str = typer.Option(..., "--model", help="model directory, cached hub id, or random:ARCH?..."),
    task: str = typer.Option("induction", "--task", help=TASK_HELP),
    task_option: list[str] = typer.Option([], "--task-option", help=TASK_OPTION_HELP),
    method: Method = typer.Option("eap", "--method", help="attribution method"),
    level: Level = typer.Option("edge", "--level", help="score edges or nodes (senders)"),
    ablation: Ablation = typer.Option("counterfactual", "--ablation", help="what a patched component carries"),
    metric: MetricName | None = typer.Option(None, "--metric",
                                             help="task metric (default: the task's own, logit_diff for most)"),
    n: int = typer.Option(64, "--n", min=1, help="number of examples"),
    batch_size: int = typer.Option(16, "--batch-size", min=1, max=4096,
                                   help="examples per forward; does not change the scores"),
    ig_steps: int = typer.Option(5, "--ig-steps", min=1, max=1000, help="integration steps for EAP-IG"),
    seed: int = typer.Option(0, "--seed", min=0),
    n_jobs: int = typer.Option(1, "--n-jobs", min=1,
                               help="parallel workers, 1 to this machine's CPU count; does not change the scores"),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda, cuda:N or mps"),
    dtype: DType = typer.Option("float32", "--dtype", help="model weights' dtype (scores accumulate in float32)"),
    out: Path | None = typer.Option(None, "--out", help="run directory to write (not needed with --plan)"),
    force: bool = typer.Option(False, "--force",
                               help="recompute even if the directory holds a different spec or other checkpoints"),
    checkpoint_every: int | None = typer.Option(
        None, "--checkpoint-every", min=1,
        help="examples per checkpoint (rounded up to whole batches; default one batch)"),
    resume: bool = typer.Option(True, "--resume/--no-resume",
                                help="reuse the finished chunks of an interrupted run in --out (--no-resume refuses "
                                     "to; --force discards them)"),
    max_memory: str | None = typer.Option(
        None, "--max-memory", help="memory budget such as 2GiB: batch size and exact's rows are chosen to fit it"),
    plan: bool = typer.Option(False, "--plan",
                              help="print each method's edges, passes, FLOPs, memory and estimated time; run nothing"),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help=ALLOW_PICKLE_HELP),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
) -> None:
    """Per-example attribution scores: writes scores.parquet, edges.parquet and manifest.json.

    A task file (.jsonl, .csv or .parquet) has one example per row with columns clean, corrupted
    (the same number of tokens), answer and wrong_answer (one token each, e.g. " Mary"), and
    optionally group (the template, kept whole by cluster bootstraps and cross-fitting folds); see
    docs/usage.md for a five-row example. The examples are computed in chunks, each saved in
    OUT/checkpoints as soon as it is finished: a killed run continues where it stopped when the same
    command is run again. Cost: --plan prints each method's estimated time on this machine first."""
    from circuits import load_model
    from circuits.attribution import check_options
    from circuits.errors import InputError
    from circuits.plan import parse_bytes
    from pipelines.build import (build_task, check_device, check_n_jobs, check_work, parse_task_options,
                                 resolve_source, task_positions)

    method, level, ablation, dtype = method.value, level.value, ablation.value, dtype.value
    options = parse_task_options(task, task_option)
    metric = None if metric is None else metric.value
    # everything is validated before the run directory exists
    if out is None and not plan:
        raise InputError("--out is required: give the run directory to write (or pass --plan to only plan the run)")
    if out is not None:
        check_out(out)
    check_options(method, level, ablation, batch_size=batch_size, ig_steps=ig_steps)
    budget = None if max_memory is None else parse_bytes(max_memory)
    n_jobs = check_n_jobs(n_jobs, "--n-jobs")
    dev = check_device(device)
    m = load_model(resolve_source(model), device=dev, dtype=_torch_dtype(dtype), allow_pickle=allow_pickle,
                   allow_large=allow_large)
    check_work(m, n, level=level, positions=task_positions(task, options), allow_large=allow_large)
    t = build_task(m, task, n=n, seed=seed, metric=metric, **options)
    if plan:
        from pipelines.plan import plan_lines

        for line in plan_lines(m, t, level=level, batch_size=batch_size, ig_steps=ig_steps, budget=budget,
                               n_jobs=n_jobs):
            typer.echo(line)
        return
    sm = _attribute_run(m, t, out, model_arg=model, task_arg=task, task_options=options, method=method, level=level, ablation=ablation, n=n,
                        batch_size=batch_size, ig_steps=ig_steps, seed=seed, n_jobs=n_jobs, dtype=dtype,
                        budget=budget, checkpoint_every=checkpoint_every, resume=resume, force=force)
    _print_top(sm, method, level, out)


def _print_top(sm, method: str, level: str, out: Path, top: int = 10) -> None:
    """The ``top`` scores by |mean| of a finished attribution run, with their SD over examples."""
    mean = sm.mean()
    sd = sm.scores.std(0, ddof=1) if sm.n_examples > 1 else mean * 0
    typer.echo(f"{method} scores ({sm.metric}) for {len(sm.names)} {level}s on {sm.n_examples} examples -> {out}")
    typer.echo(f"{'rank':>4}  {'mean':>10}  {'sd':>9}  name")
    for r, i in enumerate(abs(mean).argsort()[::-1][:top], 1):
        typer.echo(f"{r:>4}  {mean[i]:>10.4f}  {sd[i]:>9.4f}  {sm.names[i]}")


def _engine_sizes(m, t, method: str, level: str, batch_size: int, budget: int | None) -> tuple[int, int]:
    """(batch_size, max_rows) for the engine: as asked (rows 256), or the largest that fit ``budget``."""
    if budget is None:
        return batch_size, 256
    from circuits.plan import fit_memory

    widest = batch_size * int(m.graph.n_upstream.max())  # more rows than one receiver has are never used
    return fit_memory(m.cfg, method, budget, positions=int(t.clean.shape[1]), level=level, batch_size=batch_size,
                      max_rows=widest, itemsize=m.dtype.itemsize)


def _scores_done(out: Path) -> bool:
    """True when ``out`` records a finished scores stage (its checkpoints are then redundant)."""
    from reports.rundir import MANIFEST, RunDir

    if not (out / MANIFEST).is_file():
        return False
    return RunDir.read_manifest(out).get("stages", {}).get("scores", {}).get("status") == "done"


LONG_LIST = 64
"""Lists longer than this in a task's description are recorded by length and hash (see _task_record)."""


def _task_record(t) -> dict:
    """The task's description for provenance, with long lists (the induction token pool: 50,256 ids on
    GPT-2, 340 kB of JSON written into the manifest and both tables) as their length and sha256; the
    task's content hash covers its tokens either way. (To go once Task.describe does this itself.)"""
    from reports.provenance import hash_json

    desc = t.describe()
    meta = {k: {"length": len(v), "sha256": hash_json(v)} if isinstance(v, list) and len(v) > LONG_LIST else v
            for k, v in desc.get("meta", {}).items()}
    return {**desc, "meta": meta}


def _attribute_run(m, t, out: Path, *, model_arg: str, task_arg: str, task_options: dict, method: str, level: str,
                   ablation: str, n: int,
                   batch_size: int, ig_steps: int, seed: int, n_jobs: int, dtype: str, budget: int | None,
                   checkpoint_every: int | None, resume: bool, force: bool):
    """The ScoreMatrix of one checkpointed attribution run written into ``out`` (resumed where it stopped)."""
    from circuits.ablation import Ablation as Counterfactuals
    from circuits.scores import ScoreMatrix
    from pipelines.checkpoint import AttributionJob, CheckpointStore, chunk_bounds, run_checkpointed
    from reports.rundir import RunDir

    batch_size, max_rows = _engine_sizes(m, t, method, level, batch_size, budget)
    spec = {"model": model_arg, "task": task_arg, "method": method, "level": level, "ablation": ablation,
            "metric": t.metric_name, "n": n, "batch_size": batch_size, "ig_steps": ig_steps, "seed": seed,
            "dtype": DTYPES[dtype], "max_rows": max_rows}
    if task_options:  # recorded only when given, so runs without options resume as before
        spec["task_options"] = task_options
    options = {"batch_size": batch_size, "max_rows": max_rows, "ig_steps": ig_steps, "dtype": DTYPES[dtype],
               "device": m.device.type}
    identity, task_record = m.identity(), _task_record(t)  # the model caches its weight hash
    job = AttributionJob(identity["weight_hash"], t.content_hash, t.metric_name, method, level, ablation, n,
                         len(m.graph.edge_names) if level == "edge" else m.graph.n_senders, seed, options)
    store = CheckpointStore(out, job, chunk_bounds(n, batch_size, checkpoint_every))
    reuse = [] if _scores_done(out) else store.check(resume=resume, force=force)  # refused before anything is written
    params = {**spec, "weight_hash": job.weight_hash, "task_hash": job.task_hash}
    index = "edges" if level == "edge" else "nodes"
    computed = []  # the ScoreMatrix when this call computes it (a finished stage is read back instead)
    with RunDir(out, spec=spec, command=sys.argv, seed=seed,
                provenance={"model": identity, "task": task_record}) as run:
        def compute():
            import time

            t0 = time.perf_counter()
            # one counterfactual builder for every chunk: mean ablations average the whole dataset once
            abl = Counterfactuals(ablation, m, t, seed=seed, batch_size=batch_size)
            kw = {"level": level, "ablation": abl, "batch_size": batch_size, "ig_steps": ig_steps, "seed": seed,
                  "max_rows": max_rows}
            scores = run_checkpointed(store, m, t, method, kw, reuse=reuse, n_jobs=n_jobs)
            eparams = {"batch_size": batch_size, "seed": seed, "max_rows": max_rows}
            if method.startswith("eap-ig"):
                eparams["ig_steps"] = ig_steps
            sm = ScoreMatrix(scores, m.graph, level, method, ablation, t.metric_name, params=eparams,
                             provenance={"model": identity, "seconds": time.perf_counter() - t0,
                                         "resumed_chunks": len(reuse)})
            computed.append(sm)
            return sm.tables({"task": task_record})

        run.stage("scores", compute, ["scores", index], params=params, force=force)
    store.remove()  # the committed table holds every row now
    return computed[0] if computed else ScoreMatrix.read(out)


@app.command("audit")
def audit_command(
    spec: Path = typer.Argument(..., help="audit spec (YAML)"),
    out: Path = typer.Option(..., "--out", help="run directory (resumes if it exists)"),
    n_jobs: int | None = typer.Option(None, "--n-jobs", min=1,
                                      help="parallel workers, 1 to this machine's CPU count (default: the spec's)"),
    scheduler: str | None = typer.Option(None, "--scheduler", help="Dask scheduler ADDRESS, or 'local'"),
    force: bool = typer.Option(False, "--force", help="recompute stages whose spec changed"),
    report: bool = typer.Option(True, "--report/--no-report", help="write report.html at the end"),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help=ALLOW_PICKLE_HELP),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
    allow_outside: bool = typer.Option(False, "--allow-outside",
                                       help="let paths in the spec leave its directory (absolute, .., ~)"),
) -> None:
    """Run a stability audit: attribution, CIs, stability vs k, faithfulness, approximation, heads.

    The spec's task is a built-in (induction, ioi, greater-than; its builder's options under
    task.options) or a task file: one example per row with columns clean, corrupted (the same number
    of tokens), answer and wrong_answer (one token each) and optionally group (its template; cross-fitting
    folds keep a group whole, faithfulness_folds sets their number); docs/usage.md has a five-row example.
    Cost: minutes for the zoo's 2-layer models (the demo's audit of 64 prompts: about 35 s); exact
    patching grows with the edges, so plan a large model with `circuitstat attribute --plan` first."""
    from pipelines.audit import run_audit
    from pipelines.spec import load_spec

    check_out(out)
    parsed = load_spec(spec, allow_outside=allow_outside)  # validated before anything is created
    run_audit(parsed, out, n_jobs=n_jobs, scheduler=scheduler, force=force, allow_pickle=allow_pickle,
              allow_large=allow_large)
    typer.echo(f"audit written to {out}")
    if report:
        from reports.html import render_report

        typer.echo(f"report: {render_report(out)}")


@app.command("report")
def report_command(
    run: Path = typer.Argument(..., help="run directory"),
    out: Path | None = typer.Option(None, "--out", help="output file or directory (default RUN/report.html)"),
) -> None:
    """Write one self-contained report.html for a run directory."""
    from reports.html import render_report

    typer.echo(str(render_report(run, out)))


@app.command("circuit")
def circuit_command(
    run: Path = typer.Argument(..., help="run directory with scores (from attribute or audit)"),
    k: int = typer.Option(..., "--k", min=1, help="number of edges"),
    absolute: bool | None = typer.Option(
        None, "--absolute/--signed",
        help="rank by |score| or by signed score (default: an audit's recorded ranking, else |score|)"),
    method: Method | None = typer.Option(None, "--method",
                                         help="which method's scores in an audit run (default: exact if present)"),
    rule: Rule = typer.Option(Rule("top-k"), "--rule", help="top-k edges, or greedy growth from the logits"),
    prune: bool = typer.Option(True, "--prune/--no-prune", help="drop nodes with no path input -> logits"),
    json_out: Path | None = typer.Option(None, "--json", help="export to EAP-IG / MIB JSON"),
) -> None:
    """Print (and export) the circuit of the top-k edges of a run's mean scores, saying which method and
    ranking it used; an empty circuit says why and what to pass instead."""
    from circuits.circuit import Circuit
    from circuits.scores import ScoreMatrix
    from pipelines.circuit_choice import choose_scores, default_ranking, empty_explanation, header_line

    choice = choose_scores(run, None if method is None else method.value)
    why = "as asked"
    if absolute is None:
        absolute, why = default_ranking(run)
    sm = ScoreMatrix.read(run, choice.table)
    make = Circuit.top_k if rule.value == "top-k" else Circuit.greedy
    selected = make(sm, k, absolute=absolute)
    circuit = selected.prune() if prune else selected
    typer.echo(header_line(choice, absolute, why, k, rule.value, prune))
    typer.echo(circuit.summary())
    if circuit.n_edges == 0:
        typer.echo("note: " + empty_explanation(selected.scores, selected.edges, k, absolute, prune))
    if json_out is not None:
        circuit.to_json(json_out)
        typer.echo(f"written {json_out}")
