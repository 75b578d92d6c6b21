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


def main() -> None:
    """Entry point: run the app, turning bad-input errors into one line and exit code 2."""
    from circuits.errors import InputError

    try:
        app()
    except InputError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
