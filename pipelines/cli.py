"""The ``circuitstat`` command line.

Exit codes: 0 success, 1 a check or claim failed, 2 bad input (one-line error naming the fix).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Statistical circuit discovery and stability audits of transformer language models.")


@app.callback()
def _root() -> None:
    """Statistical circuit discovery and stability audits of transformer language models."""


def fail(message: str, code: int = 2) -> None:
    """Print a one-line error and exit with ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@app.command("model")
def model_command(
    source: str = typer.Argument(..., help="model directory, cached hub id, or random:ARCH?key=value&..."),
    n_inputs: int = typer.Option(4, "--n-inputs", help="random inputs for the logits check"),
    length: int = typer.Option(16, "--length", help="tokens per random input"),
    seed: int = typer.Option(0, "--seed"),
    tolerance: float = typer.Option(1e-4, "--tolerance", help="max |logit difference| allowed"),
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
        model, hf = load_model(source), None
    else:
        hf = load_hf(source)
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


DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}


def _torch_dtype(name: str):
    import torch

    if name not in DTYPES:
        fail(f"unknown dtype {name!r}; use float32, bfloat16 or float16")
    return getattr(torch, DTYPES[name])


@app.command("attribute")
def attribute_command(
    model: str = typer.Option(..., "--model", help="model directory, cached hub id, or random:ARCH?..."),
    task: str = typer.Option("induction", "--task", help="induction, ioi, greater-than, or a .jsonl/.csv/.parquet file"),
    method: str = typer.Option("eap", "--method", help="exact, eap, eap-ig-inputs, eap-ig-activations, clean-corrupted"),
    level: str = typer.Option("edge", "--level", help="edge or node"),
    ablation: str = typer.Option("counterfactual", "--ablation",
                                 help="counterfactual, mean, mean-positional, zero, resample"),
    metric: str | None = typer.Option(None, "--metric", help="logit_diff, prob_diff, kl, kl_mean, cross_entropy"),
    n: int = typer.Option(64, "--n", help="number of examples"),
    batch_size: int = typer.Option(16, "--batch-size"),
    ig_steps: int = typer.Option(5, "--ig-steps", help="integration steps for EAP-IG"),
    seed: int = typer.Option(0, "--seed"),
    device: str = typer.Option("cpu", "--device"),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16 (scores accumulate in float32)"),
    out: Path = typer.Option(..., "--out", help="run directory to write"),
    force: bool = typer.Option(False, "--force", help="recompute even if the directory holds a different spec"),
) -> None:
    """Per-example attribution scores: writes scores.parquet, edges.parquet and manifest.json."""
    from circuits import load_model
    from circuits.attribution import attribute
    from pipelines.build import build_task, resolve_source
    from reports.rundir import RunDir

    m = load_model(resolve_source(model), device=device, dtype=_torch_dtype(dtype))
    t = build_task(m, task, n=n, seed=seed, metric=metric)
    spec = {"model": model, "task": task, "method": method, "level": level, "ablation": ablation,
            "metric": t.metric_name, "n": n, "batch_size": batch_size, "ig_steps": ig_steps, "seed": seed,
            "dtype": DTYPES[dtype]}
    params = {**spec, "weight_hash": m.weight_hash(), "task_hash": t.content_hash}
    index = "edges" if level == "edge" else "nodes"
    with RunDir(out, spec=spec, command=sys.argv, seed=seed,
                provenance={"model": m.identity(), "task": t.describe()}) as run:
        def compute():
            sm = attribute(m, t, method, level=level, ablation=ablation, batch_size=batch_size,
                           ig_steps=ig_steps, seed=seed)
            return sm.tables({"task": t.describe()})

        run.stage("scores", compute, ["scores", index], params=params, force=force)
    from circuits.scores import ScoreMatrix

    sm = ScoreMatrix.read(out)
    mean = sm.mean()
    sd = sm.scores.std(0, ddof=1) if sm.n_examples > 1 else mean * 0
    top = abs(mean).argsort()[::-1][:10]
    typer.echo(f"{method} scores for {len(sm.names)} {level}s on {sm.n_examples} examples -> {out}")
    typer.echo(f"{'rank':>4}  {'mean':>10}  {'sd':>9}  name")
    for r, i in enumerate(top, 1):
        typer.echo(f"{r:>4}  {mean[i]:>10.4f}  {sd[i]:>9.4f}  {sm.names[i]}")


@app.command("audit")
def audit_command(
    spec: Path = typer.Argument(..., help="audit spec (YAML)"),
    out: Path = typer.Option(..., "--out", help="run directory (resumes if it exists)"),
    n_jobs: int | None = typer.Option(None, "--n-jobs", help="parallel workers (default: the spec's n_jobs)"),
    scheduler: str | None = typer.Option(None, "--scheduler", help="Dask scheduler ADDRESS, or 'local'"),
    force: bool = typer.Option(False, "--force", help="recompute stages whose spec changed"),
    report: bool = typer.Option(True, "--report/--no-report", help="write report.html at the end"),
) -> None:
    """Run a stability audit: attribution, CIs, stability vs k, faithfulness, approximation, heads."""
    from pipelines.audit import run_audit
    from pipelines.spec import load_spec

    parsed = load_spec(spec)  # validated before anything is created
    run_audit(parsed, out, n_jobs=n_jobs, scheduler=scheduler, force=force)
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
    k: int = typer.Option(..., "--k", help="number of edges"),
    absolute: bool = typer.Option(False, "--absolute/--signed", help="rank by |score| or by signed score"),
    method: str | None = typer.Option(None, "--method", help="which method's scores in an audit run"),
    rule: str = typer.Option("top-k", "--rule", help="top-k or greedy"),
    prune: bool = typer.Option(True, "--prune/--no-prune", help="drop nodes with no path input -> logits"),
    json_out: Path | None = typer.Option(None, "--json", help="export to EAP-IG / MIB JSON"),
) -> None:
    """Print (and export) the circuit of the top-k edges of a run's mean scores."""
    from circuits.circuit import Circuit
    from circuits.scores import ScoreMatrix

    name = "scores" if method is None else f"scores_{method}"
    if method is None and not (run / "scores.parquet").exists():
        found = sorted(p.stem[len("scores_"):] for p in run.glob("scores_*.parquet"))
        if not found:
            fail(f"{run} has no scores; run `circuitstat attribute` or `circuitstat audit` first")
        name = f"scores_{found[0]}"
    sm = ScoreMatrix.read(run, name)
    if rule not in ("top-k", "greedy"):
        fail(f"unknown rule {rule!r}; use top-k or greedy")
    make = Circuit.top_k if rule == "top-k" else Circuit.greedy
    circuit = make(sm, k, absolute=absolute)
    if prune:
        circuit = circuit.prune()
    typer.echo(circuit.summary())
    if json_out is not None:
        circuit.to_json(json_out)
        typer.echo(f"written {json_out}")


study_app = typer.Typer(no_args_is_help=True, help="Studies: where uncertainty comes from, head stability.")
app.add_typer(study_app, name="study")


def _register() -> None:
    """Commands whose functions live beside the pipelines they drive."""
    from pipelines import claims, demo, head_study, heads, query_command, training, variance_study

    study_app.command("variance")(variance_study.study_variance_command)
    study_app.command("heads")(head_study.study_heads_command)
    app.command("heads")(heads.heads_command)
    app.command("train")(training.train_command)
    app.command("demo")(demo.demo_command)
    app.command("check")(claims.check_command)
    app.command("query")(query_command.query_command)


_register()


def main() -> None:
    """Entry point: run the app, turning bad-input errors into one line and exit code 2."""
    from reports.lock import RunLockedError
    from reports.rundir import RunDirError

    try:
        app()  # usage errors exit 2 inside; our own errors propagate to here
    except (ValueError, FileNotFoundError, RunDirError, RunLockedError) as exc:  # InputError is a ValueError
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
