"""The ``tokens`` command: token contribution weights against attention, and attention sinks (issue 16)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from circuitstat.core.params import BATCH_SIZE, N_RESAMPLES, SEED

from .app import (ALLOW_LARGE_HELP, ALLOW_PICKLE_HELP, TASK_HELP, TASK_OPTION_HELP, MetricName, app, choices,
               echo)

TokenAblation = choices("TokenAblation", "zero", "mean", "mask")  # what an ablated token's embedding becomes
SinkToken = choices("SinkToken", "first", "detected")  # which key is the sink


def _ints(text: str, where: str) -> tuple[int, ...]:
    """``text`` such as ``1,2,3`` as a tuple of ints; InputError naming ``where`` otherwise."""
    from circuitstat.core.errors import InputError

    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise InputError(f"{where} takes comma-separated integers such as 1,2,3,5") from None


@app.command("tokens")
def tokens_command(
    models: list[str] = typer.Option(..., "--model", help="model directory, zoo:RECIPE/seed-S, cached hub id or "
                                     "random:ARCH?...; repeat (or separate by commas) for refits of one recipe: each "
                                     "is run into OUT/model-<i>/ and they are compared across seeds"),
    task: str = typer.Option("induction", "--task", help=TASK_HELP),
    task_option: list[str] = typer.Option([], "--task-option", help=TASK_OPTION_HELP),
    metric: MetricName | None = typer.Option(None, "--metric", help="task metric (default: the task's own)"),
    n: int = typer.Option(64, "--n", min=2, help="number of prompts"),
    ks: str = typer.Option("1,2,3,5", "--k", help="numbers of top tokens ablated, comma-separated"),
    measures: str = typer.Option("attention,value_norm,contribution,grad_input", "--measures",
                                 help="importance measures compared (random is always added as the null)"),
    pairs: str | None = typer.Option(None, "--pairs", help="differences tested, e.g. contribution:attention,"
                                     "contribution:random (default: every pair; Holm over exactly these x every k)"),
    n_random: int = typer.Option(5, "--n-random", min=1, help="random token orders per prompt (the null)"),
    ablation: TokenAblation = typer.Option(TokenAblation("zero"), "--ablation",
                                           help="zero: token embedding set to 0 (position kept); mean: mean embedding; "
                                                "mask: token hidden from attention, positions kept "
                                                "(needs --exclude-readout)"),
    exclude_first: bool = typer.Option(False, "--exclude-first", help="never ablate the first token"),
    exclude_readout: bool = typer.Option(False, "--exclude-readout", help="never ablate the read-out token"),
    sink: SinkToken = typer.Option(SinkToken("first"), "--sink", help="sink token: first, or detected per prompt"),
    sink_threshold: float = typer.Option(0.3, "--sink-threshold", min=0.0, max=0.999,
                                         help="attention to the sink above which a position counts as sinking"),
    n_resamples: int = typer.Option(N_RESAMPLES.default_for("tokens"), "--n-resamples", **N_RESAMPLES.option, help="bootstrap resamples over prompts"),
    batch_size: int = typer.Option(BATCH_SIZE.default_for("tokens"), "--batch-size", **BATCH_SIZE.option, help="prompts per forward"),
    seed: int = typer.Option(SEED.default, "--seed", **SEED.option, help="seed of the task, the random orders and the bootstrap"),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda, cuda:N or mps"),
    out: Path = typer.Option(..., "--out",
                             help="run directory: token_importance, sink_heads, ... .parquet, manifest.json"),
    force: bool = typer.Option(False, "--force", help="recompute if the directory holds a different spec"),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help=ALLOW_PICKLE_HELP),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
) -> None:
    """Do contribution weights find the tokens that matter better than attention? And which heads are sinks?

    Ablates the top-k tokens by each measure and reports mean metric drops and paired differences
    with intervals over prompts (Holm verdicts), and per-head sink rates, output norms and their
    relation across heads. With several --model refits, also whether the seeds agree on the important
    tokens and on the sink heads. A killed run resumes from the stage it finished.
    """
    from circuitstat.pipelines.build import parse_task_options
    from circuitstat.pipelines.runs.tokens.run import TokenContributions  # numpy and scipy only: bad options fail fast

    options = parse_task_options(task, task_option)
    est = TokenContributions(task=task, n=n, task_seed=seed, metric=None if metric is None else metric.value,
                             task_options=options or None,
                             ks=_ints(ks, "--k"), measures=tuple(m.strip() for m in measures.split(",") if m.strip()),
                             pairs=None if pairs is None else tuple(p.strip() for p in pairs.split(",") if p.strip()),
                             n_random=n_random, ablation=ablation.value, exclude_first=exclude_first,
                             exclude_readout=exclude_readout, sink=sink.value, sink_threshold=sink_threshold,
                             n_resamples=n_resamples, batch_size=batch_size, seed=seed)
    from circuitstat.pipelines.runs.tokens.run import TokensSpec
    from circuitstat.pipelines.kinds import kind

    spec = TokensSpec(est, tuple(p for m in models for p in str(m).split(",") if p))
    res = kind("tokens").run(spec, out, device=device, force=force, command=sys.argv, allow_pickle=allow_pickle,
                             allow_large=allow_large)
    echo(res.summary())
    echo(f"-> {out}")
