"""Commands that compute: ``model`` (describe and check a model), ``attribute`` (per-example scores),
``audit`` (the stability audit), ``circuit`` (a run's top-k circuit) and ``report`` (its HTML)."""

from __future__ import annotations

import sys
import typing
from pathlib import Path
from typing import Any

import typer

from circuitstat.pipelines.options import MASK_METHODS, MOE_NODES, OBJECTIVE, VERIFY_DESIGN
from circuitstat.core.params import (BATCH_SIZE, IG_STEPS, LR_CONSTANTS, N_JOBS, N_REFITS, PRUNING_LR,
                                           PRUNING_SPARSITY, PRUNING_TARGET, PRUNING_WARMUP, NODE_TARGET,
                                          PRUNING_STEPS, SEED, UGS_SAMPLES, VERIFY_BUDGET)

from .app import (trust_option, verified, ALLOW_LARGE_HELP, ALLOW_PICKLE_HELP, TASK_HELP, TASK_OPTION_HELP, Ablation, DType, Level,
               Method, MetricName, app, check_out, choices, echo, fail)
from circuitstat.reports.thresholds import MIN_EXCESS, MIN_EXCESS_BOUNDS

MIN_EXCESS_HELP = ("count a head as stable across seeds when its interval's lower end exceeds this excess over its "
                   "shuffled-prompt null (a cosine similarity)")


Rule = choices("Rule", "top-k", "greedy")  # how `circuit` selects edges
InputNode = choices("InputNode", "embeddings", "tokens")  # circuitstat.circuits.ablation
MoeNodes = choices("MoeNodes", *typing.get_args(MOE_NODES))  # circuitstat.circuits.moe_nodes (pipelines.options)
Objective = choices("Objective", *typing.get_args(OBJECTIVE))  # edge pruning's (circuitstat.pipelines.options)
Ranking = choices("Ranking", "signed", "absolute")  # circuitstat.core.topk.RANKINGS: signed score or |score|


def ranking_option(ranking, absolute: bool | None, command: str) -> str | None:
    """The ranking of ``--ranking``, or of the old ``--absolute/--signed`` flags (with a warning naming the new
    one); None when neither is given."""
    from circuitstat.core.errors import warn_renamed

    if absolute is None:
        return None if ranking is None else ranking.value
    old = "absolute" if absolute else "signed"
    warn_renamed(f"--{old}", f"--ranking {old}", command)
    if ranking is not None and ranking.value != old:
        fail(f"--{old} (the old flag) contradicts --ranking {ranking.value}; give --ranking only")
    return old


@app.command("model")
def model_command(
    source: str = typer.Argument(..., help="model directory, cached hub id, or random:ARCH?key=value&... (a nested "
                                         "field key by key: rope_parameters.rope_type=linear&rope_parameters.factor=2)"),
    n_inputs: int = typer.Option(4, "--n-inputs", min=1, max=4096, help="random inputs for the logits check"),
    length: int = typer.Option(16, "--length", min=1, help="tokens per random input (capped at the context)"),
    seed: int = typer.Option(SEED.default, "--seed", **SEED.option),
    tolerance: float = typer.Option(1e-4, "--tolerance", min=0.0,
                                    help="max |logit difference| (and relative gradient difference) allowed"),
    logits_only: bool = typer.Option(False, "--logits-only",
                                     help="check logits only (skip the gradient and exact-patching parity checks)"),
    moe_nodes: MoeNodes = typer.Option(
        "block", "--moe-nodes",
        help="the graph to describe: mixture-of-experts layers as one sender (block) or one per expert "
             "(experts), as attribute --moe-nodes builds it; the checks run on that graph"),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help=ALLOW_PICKLE_HELP),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
) -> None:
    """Describe a model and check CircuitModel against the Hugging Face model: logits, receiver gradients
    against HF autograd, exact patching against brute force."""
    from circuitstat.circuits import load_hf, load_model
    from circuitstat.pipelines.sources import LOCAL

    source = LOCAL.resolve(source).location
    path = Path(source)
    try:  # a long random: spec is no file name (ENAMETOOLONG), and no directory of ours
        own = path.is_dir() and (path / "config.json").exists() and '"circuitstat"' in (path / "config.json").read_text()
    except OSError:
        own = False
    if own:
        model, hf = load_model(source, allow_pickle=allow_pickle, allow_large=allow_large), None
    else:
        hf = load_hf(source, allow_pickle=allow_pickle, allow_large=allow_large)
        # the model as every command loads it (its cached conversion, checked), not a fresh conversion:
        # the logits check then vouches for what attribute and audit compute with
        model = load_model(source, allow_pickle=allow_pickle, allow_large=allow_large)
    cfg, g = model.cfg, model.graph
    if moe_nodes.value != "block":  # the graph attribute --moe-nodes builds (InputError on a dense model); the
        from circuitstat.circuits.moe_nodes import set_moe_nodes  # checks below run on that graph

        g = set_moe_nodes(model, moe_nodes.value).graph
    echo(f"source        {source}")
    echo(f"architecture  {cfg.arch}{' (parallel attention+MLP)' if cfg.parallel else ''}")
    echo(f"layers        {cfg.n_layers}")
    kv = f" (K/V heads {cfg.n_kv_heads}, ungrouped per query head)" if cfg.n_kv_heads and cfg.n_kv_heads != cfg.n_heads else ""
    echo(f"heads         {cfg.n_heads}{kv}")
    echo(f"d_model       {cfg.d_model}   d_head {cfg.d_head}   d_mlp {cfg.d_mlp if cfg.has_mlp else '-'}")
    echo(f"norm          {cfg.norm}   positions {cfg.positional}   mlp {cfg.mlp} ({cfg.act})")
    from circuitstat.circuits.describe import feature_lines

    for line in feature_lines(cfg):
        echo(line)
    echo(f"nodes         {len(g.nodes)} ({g.n_senders} senders, {g.n_receivers} receivers)")
    per = f" (--moe-nodes {moe_nodes.value}: one sender per expert, m{{L}}.e{{J}})" if moe_nodes.value != "block" else ""
    echo(f"edges         {g.n_edges}{per}")
    echo(f"weight hash   {model.weight_hash()[:16]}")
    if hf is None:
        echo("logits check  skipped (a circuitstat model has no Hugging Face counterpart)")
        return
    from circuitstat.circuits.parity import check_parity

    p = check_parity(hf, model, n_inputs=n_inputs, length=length, seed=seed, gradients=not logits_only)
    ok = p.logits <= tolerance
    echo(f"logits check  max |HF - CircuitModel| = {p.logits:.3e} on {n_inputs} inputs "
               f"({'ok' if ok else 'FAILED'}, tolerance {tolerance:g})")
    if p.gradients is not None:
        ok_g, ok_e = p.gradients <= tolerance, p.exact <= tolerance
        echo(f"EAP check     receiver gradients vs HF autograd: max relative difference {p.gradients:.3e} "
                   f"({'ok' if ok_g else 'FAILED'})")
        echo(f"exact check   suffix patching vs brute force on {p.exact_edges} edges: max |logit difference| "
                   f"{p.exact:.3e} ({'ok' if ok_e else 'FAILED'})")
        ok = ok and ok_g and ok_e
    if not ok:
        raise typer.Exit(1)


# `attribute`'s options that take more than a line, by concept: what is scored
INPUT_NODE_OPTION = typer.Option(
    "embeddings", "--input-node",
    help="what a zero/mean-ablated input sender is: embeddings (token + position) or tokens (token "
         "embedding only, as EAP-IG and MIB)")
METRIC_OPTION = typer.Option(None, "--metric",
                             help="task metric (default: the task's own, logit_diff for most)")
MOE_NODES_OPTION = typer.Option(
    "block", "--moe-nodes",
    help="mixture-of-experts layers: the MLP as one sender (block) or one sender per expert, m{L}.e{J} "
         "(experts; docs/families.md)")

# ... how the run is computed, written and printed
BATCH_SIZE_OPTION = typer.Option(BATCH_SIZE.default, "--batch-size", **BATCH_SIZE.option,
                                 help="examples per forward; does not change the scores")
N_JOBS_OPTION = typer.Option(N_JOBS.default, "--n-jobs", min=N_JOBS.minimum,
                             help="parallel workers, 1 to this machine's CPU count; does not change the scores")
SCHEDULER_OPTION = typer.Option(
    None, "--scheduler", help="Dask scheduler tcp://HOST:PORT (or 'local'): the chunks run on its workers, "
                              "checkpointed here; the same scores as one process (docs/usage.md)")
FORCE_OPTION = typer.Option(False, "--force",
                            help="recompute even if the directory holds a different spec or other checkpoints")
CHECKPOINT_EVERY_OPTION = typer.Option(
    None, "--checkpoint-every", min=1,
    help="examples per checkpoint (rounded up to whole batches; default one batch)")
RESUME_OPTION = typer.Option(True, "--resume/--no-resume",
                             help="reuse the finished chunks of an interrupted run in --out (--no-resume refuses "
                                  "to; --force discards them)")
MAX_MEMORY_OPTION = typer.Option(
    None, "--max-memory", help="memory budget such as 2GiB: batch size and exact's rows are chosen to fit it")
PLAN_OPTION = typer.Option(False, "--plan",
                           help="print each method's edges, passes, FLOPs, memory and estimated time; run nothing")
RANKING_OPTION = typer.Option("absolute", "--ranking",
                              help="order of the printed top 10: by |mean| (absolute) or by signed mean "
                                   "(signed); the scores written do not depend on it")

# ... a verified run (docs/verified.md)
VERIFY_OPTION = typer.Option(
    None, "--verify", min=4,
    help="verify the method on N random prompts with exact patching: intervals for the mean exact effect "
         "(verified.parquet; docs/verified.md)")
VERIFY_EDGES_OPTION = typer.Option(
    None, "--verify-edges", help="TOP,RANDOM: verify only the top candidate edges and a random sample of the "
                                 "rest, and bound the unverified edges above --verify-tau (missed_edges.parquet)")
VERIFY_TAU_OPTION = typer.Option(None, "--verify-tau", min=0.0,
                                 help="threshold on |mean exact effect| the missed-edges bound counts")
VERIFY_SEED_OPTION = typer.Option(None, "--verify-seed", **SEED.option,
                                  help="seed of the verified prompts (default: from --seed)")
VerifyDesign = choices("VerifyDesign", *typing.get_args(VERIFY_DESIGN))
VERIFY_DESIGN_OPTION = typer.Option(
    None, "--verify-design", help="uniform (default with --verify N: exact on N random prompts, every edge) or active: "
                                  "exact on (prompt, edge) cells sampled with probabilities from the method's scores, "
                                  "--verify-budget per edge (verified_cells.parquet; docs/verified.md)")
VERIFY_SHARE_OPTION = typer.Option(
    None, "--verify-share", min=0.0, max=1.0, clamp=False,
    help="with --plan: the largest verified run of each design (uniform --verify N, active --verify-budget B) whose "
         "two phases cost at most this share of exact patching on all prompts (e.g. 0.1)")
VerifyCorrection = choices("VerifyCorrection", "bh", "by")
VERIFY_CORRECTION_OPTION = typer.Option(
    None, "--verify-correction", help="the verified q-values' correction over edges: bh (Benjamini-Hochberg, the "
                                      "default: FDR under independence or positive dependence) or by "
                                      "(Benjamini-Yekutieli: FDR under any dependence, more conservative)")
VERIFY_BUDGET_OPTION = typer.Option(None, "--verify-budget", **VERIFY_BUDGET.option,
                                    help="--verify-design active: expected exact cells per edge (e.g. 51 of 512 prompts)")

# ... the mask-learned methods, edge-pruning and ugs (which takes which: circuitstat.pipelines.mask_options;
# docs/edge-pruning.md)
STEPS_OPTION = typer.Option(None, "--steps", **PRUNING_STEPS.option,
                            help=f"edge-pruning and ugs only: Adam steps of the fit "
                                 f"(default {PRUNING_STEPS.default})")
LR_OPTION = typer.Option(None, "--lr", **PRUNING_LR.option,
                         help=f"edge-pruning and ugs only: learning rate (default {PRUNING_LR.default}; "
                              f"ugs {PRUNING_LR.default_for('ugs')})")
SPARSITY_OPTION = typer.Option(
    None, "--sparsity", **PRUNING_SPARSITY.option,
    help=f"edge-pruning and ugs only: weight of the expected share of open gates "
         f"(default {PRUNING_SPARSITY.default})")
OBJECTIVE_OPTION = typer.Option(
    None, "--objective",
    help="edge-pruning and ugs only: faithfulness term (default mean_metric; docs/edge-pruning.md)")
N_SAMPLES_OPTION = typer.Option(
    None, "--n-samples", **UGS_SAMPLES.option,
    help=f"ugs only: mask draws per prompt and step (default {UGS_SAMPLES.default})")
MASK_ABLATION_OPTION = typer.Option(
    None, "--mask-ablation",
    help="edge-pruning and ugs only: 'run' (ablated edges carry --ablation's values, the default) or 'optimal' "
         "(learned constants, Li & Janson 2024; docs/edge-pruning.md)")
LR_CONSTANTS_OPTION = typer.Option(
    None, "--lr-constants", **LR_CONSTANTS.option,
    help=f"edge-pruning and ugs only: learning rate of the optimal-ablation constants "
         f"(default {LR_CONSTANTS.default})")
TARGET_OPTION = typer.Option(
    None, "--target", **PRUNING_TARGET.option,
    help="edge-pruning only: target share of edges removed (Bhaskar et al.'s Lagrangian; unset: fixed penalty)")
WARMUP_OPTION = typer.Option(
    None, "--warmup", **PRUNING_WARMUP.option,
    help="edge-pruning only: steps of the target's linear warm-up (default half the steps; needs --target)")
NODE_MASKS_OPTION = typer.Option(
    False, "--node-masks",
    help="edge-pruning only: also learn a gate per sender on all its outgoing edges (Bhaskar et al.'s node "
         "masks; docs/edge-pruning.md)")
NODE_SPARSITY_OPTION = typer.Option(
    None, "--node-sparsity", min=0.0,
    help="edge-pruning only, with --node-masks: weight of the expected share of open node gates (default 1.0)")
NODE_TARGET_OPTION = typer.Option(
    None, "--node-target", **NODE_TARGET.option,
    help="edge-pruning only, with --node-masks: target share of node gates closed (Bhaskar et al.'s second "
         "Lagrangian; the fixed node penalty then defaults to 0)")
N_REFITS_OPTION = typer.Option(
    None, "--n-refits", **N_REFITS.option,
    help="edge-pruning and ugs only: refit on this many bootstrap resamples of the prompts "
         "(refit_frequency per edge)")


@app.command("attribute")
def attribute_command(
    model: str = typer.Option(..., "--model", help="model directory, cached hub id, or random:ARCH?..."),
    task: str = typer.Option("induction", "--task", help=TASK_HELP),
    task_option: list[str] = typer.Option([], "--task-option", help=TASK_OPTION_HELP),
    method: Method = typer.Option("eap", "--method", help="attribution method"),
    level: Level = typer.Option("edge", "--level", help="score edges or nodes (senders)"),
    ablation: Ablation = typer.Option("counterfactual", "--ablation", help="what a patched component carries"),
    input_node: InputNode = INPUT_NODE_OPTION,
    metric: MetricName | None = METRIC_OPTION,
    moe_nodes: MoeNodes = MOE_NODES_OPTION,
    n: int = typer.Option(64, "--n", min=1, help="number of examples"),
    batch_size: int = BATCH_SIZE_OPTION,
    ig_steps: int = typer.Option(IG_STEPS.default, "--ig-steps", **IG_STEPS.option, help="integration steps for EAP-IG"),
    seed: int = typer.Option(SEED.default, "--seed", **SEED.option),
    n_jobs: int = N_JOBS_OPTION,
    scheduler: str | None = SCHEDULER_OPTION,
    device: str = typer.Option("cpu", "--device", help="cpu, cuda, cuda:N or mps"),
    dtype: DType = typer.Option("float32", "--dtype", help="model weights' dtype (scores accumulate in float32)"),
    out: Path | None = typer.Option(None, "--out", help="run directory to write (not needed with --plan)"),
    force: bool = FORCE_OPTION,
    checkpoint_every: int | None = CHECKPOINT_EVERY_OPTION,
    resume: bool = RESUME_OPTION,
    max_memory: str | None = MAX_MEMORY_OPTION,
    plan: bool = PLAN_OPTION,
    ranking: Ranking = RANKING_OPTION,
    verify: int | None = VERIFY_OPTION,
    verify_edges: str | None = VERIFY_EDGES_OPTION,
    verify_tau: float | None = VERIFY_TAU_OPTION,
    verify_seed: int | None = VERIFY_SEED_OPTION,
    verify_design: VerifyDesign | None = VERIFY_DESIGN_OPTION,
    verify_budget: float | None = VERIFY_BUDGET_OPTION,
    verify_correction: VerifyCorrection | None = VERIFY_CORRECTION_OPTION,
    verify_share: float | None = VERIFY_SHARE_OPTION,
    steps: int | None = STEPS_OPTION,
    lr: float | None = LR_OPTION,
    sparsity: float | None = SPARSITY_OPTION,
    objective: Objective | None = OBJECTIVE_OPTION,
    n_samples: int | None = N_SAMPLES_OPTION,
    mask_ablation: str | None = MASK_ABLATION_OPTION,
    lr_constants: float | None = LR_CONSTANTS_OPTION,
    target: float | None = TARGET_OPTION,
    warmup: int | None = WARMUP_OPTION,
    node_masks: bool = NODE_MASKS_OPTION,
    node_sparsity: float | None = NODE_SPARSITY_OPTION,
    node_target: float | None = NODE_TARGET_OPTION,
    n_refits: int | None = N_REFITS_OPTION,
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help=ALLOW_PICKLE_HELP),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
) -> None:
    """Per-example attribution scores: writes scores.parquet, edges.parquet and manifest.json.

    --method edge-pruning (or ugs) learns one mask logit per edge instead (no per-example scores): writes
    edge_masks.parquet, mask_fits.parquet and method_notes.parquet (docs/edge-pruning.md).

    A task file (.jsonl, .csv or .parquet) has one example per row with columns clean, corrupted
    (the same number of tokens), answer and wrong_answer (one token each, e.g. " Mary"), and
    optionally group (the template, kept whole by cluster bootstraps and cross-fitting folds); see
    docs/usage.md for a five-row example. Text prompts need the model's tokenizer: a random: model has one
    only with vocab_size=50257 (the bundled GPT-2 tokenizer). The file is checked before the model is built,
    every bad row and column named. The examples are computed in chunks, each saved in
    OUT/checkpoints as soon as it is finished: a killed run continues where it stopped when the same
    command is run again. Cost: --plan prints each method's estimated time on this machine first."""
    from types import SimpleNamespace

    # every option by name, a choice as its name: the spec is built of them (and checked there), then planned or run
    o = SimpleNamespace(**{k: getattr(v, "value", v) for k, v in locals().items()})
    spec = _attribute_spec(o)
    if o.plan:
        _plan_attribute(o, spec)
    else:
        _run_attribute(o, spec)


def _run_attribute(o: Any, spec: Any) -> None:
    """Run the attribute spec ``spec`` into ``o.out`` through the kind's run and print its top scores (or edges)."""
    from circuitstat.pipelines.kinds import kind

    # the run as the service runs a job: the kind's run of the spec; what only this machine decides (workers,
    # device, Dask scheduler, --force, --resume, the --allow-* limits) are its keyword arguments
    result = kind("attribute").run(spec, o.out, n_jobs=o.n_jobs, device=o.device, scheduler=o.scheduler,
                                   force=o.force, resume=o.resume, allow_pickle=o.allow_pickle,
                                   allow_large=o.allow_large)
    if spec.method in MASK_METHODS:
        _print_masks(result, spec.method, o.out)
        return
    _print_top(result, spec.method, spec.level, o.out, ranking=o.ranking)
    if spec.verify is not None:
        from circuitstat.reports.verdicts.verified import verified_lines

        for line in verified_lines(o.out):
            echo(line)


def _attribute_spec(o: Any) -> Any:
    """The AttributeSpec of `attribute`'s options ``o`` (the one the service's attribute jobs are read into),
    validated there; InputError naming a bad option: everything is checked before the run directory exists."""
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.runs.attribute.run import attribute_spec
    from circuitstat.pipelines.build import parse_task_options
    from circuitstat.pipelines.mask_options import place_mask_options
    from circuitstat.pipelines.options import DTYPES
    from circuitstat.pipelines.verify import verify_from_options

    mask = {"steps": o.steps, "lr": o.lr, "sparsity": o.sparsity, "objective": o.objective, "n_samples": o.n_samples,
            "ablation": o.mask_ablation, "lr_constants": o.lr_constants, "target": o.target, "warmup": o.warmup,
            "node_masks": True if o.node_masks else None, "node_sparsity": o.node_sparsity,
            "node_target": o.node_target}
    data = {"model": o.model, "task": o.task, "task_options": parse_task_options(o.task, o.task_option),
            "method": o.method, "level": o.level, "ablation": o.ablation, "input_node": o.input_node,
            "metric": o.metric, "moe_nodes": o.moe_nodes, "n": o.n, "batch_size": o.batch_size,
            "ig_steps": o.ig_steps, "seed": o.seed, "dtype": DTYPES[o.dtype], "checkpoint_every": o.checkpoint_every,
            "max_memory": o.max_memory, "n_refits": o.n_refits,
            "verify": verify_from_options(o.verify, o.verify_edges, o.verify_tau, o.verify_seed, o.verify_design,
                                          o.verify_budget, o.verify_correction),
            **place_mask_options(o.method, mask)}
    # a plan prices any size (the rows over this machine's limits are marked, not refused): only a run is limited
    spec = attribute_spec(data, "the command line", words="flags", allow_large=o.allow_large or o.plan)
    if o.out is None and not o.plan:
        raise InputError("--out is required: give the run directory to write (or pass --plan to only plan the run)")
    if o.verify_share is not None and not o.plan:
        raise InputError("--verify-share prices verified runs in a plan: add --plan (or choose --verify N or "
                         "--verify-budget B and run)")
    return spec


def _plan_attribute(o: Any, spec: Any) -> None:
    """Print the plan of the attribute run ``spec`` (on the meta device: no weights are allocated)."""
    from circuitstat.circuits.plan import parse_bytes
    from circuitstat.pipelines.runs.attribute.run import check_method_options
    from circuitstat.pipelines.build import check_device, check_n_jobs
    from circuitstat.pipelines.spec import MASK_SECTIONS, mask_draws

    check_method_options(spec.method, spec.level, spec.ablation, batch_size=spec.batch_size, ig_steps=spec.ig_steps)
    budget = None if spec.max_memory is None else parse_bytes(spec.max_memory)
    pruning = None
    if spec.method in MASK_METHODS:
        section, options_class = MASK_SECTIONS[spec.method]
        options = getattr(spec, section) or options_class()
        pruning = (options.steps, 1 + (spec.n_refits or 0), mask_draws(spec.method, options))
    _plan(spec.model, spec.task, spec.task_options, n=spec.n, seed=spec.seed, metric=spec.metric, level=spec.level,
          batch_size=spec.batch_size, ig_steps=spec.ig_steps, budget=budget, n_jobs=check_n_jobs(o.n_jobs, "--n-jobs"),
          device=check_device(o.device), dtype=spec.dtype, allow_pickle=o.allow_pickle, allow_large=o.allow_large,
          verify=spec.verify, method=spec.method, pruning=pruning, moe_nodes=spec.moe_nodes,
          verify_share=o.verify_share)


def _print_masks(masks, method: str, out: Path, top: int = 10) -> None:
    """The ``top`` edges of a mask-learned method's fit by learned log alpha, with their gate and refit frequency."""
    d = masks.to_pydict()
    order = sorted(range(len(d["edge"])), key=lambda i: (-d["log_alpha"][i], d["edge"][i]))[:top]
    kept = sum(bool(v) for v in d["in_mask"])
    echo(f"{method}: {kept} of {len(d['edge'])} edges in its mask (gate > 1/2); top {len(order)} by log alpha "
         "(no per-example scores, so no intervals: run an audit for stability and faithfulness)")
    for i in order:
        freq = d["refit_frequency"][i]
        refit = "" if freq != freq else f"  kept by {freq:.0%} of {d['n_refits'][i]} refits"
        echo(f"  {d['name'][i]:<32} log alpha {d['log_alpha'][i]:+.4f}  gate {d['gate'][i]:.3f}{refit}")
    echo(f"wrote {out}")


def _print_top(sm, method: str, level: str, out: Path, top: int = 10, ranking: str = "absolute") -> None:
    """The ``top`` scores of a finished attribution run by ``ranking`` (circuitstat.core.topk: |mean| or signed mean;
    ties: the lower index first), with their SD over examples."""
    import numpy as np

    from circuitstat.core.topk import ranking_key

    mean = sm.mean()
    sd = sm.scores.std(0, ddof=1) if sm.n_examples > 1 else mean * 0
    key = ranking_key(np.asarray(mean, dtype=np.float64), ranking)
    order = np.lexsort((np.arange(key.size), -key))[:top]
    echo(f"{method} scores ({sm.metric}) for {len(sm.names)} {level}s on {sm.n_examples} examples -> {out}")
    echo(f"top {len(order)} by {'|mean|' if ranking == 'absolute' else 'signed mean'} (--ranking {ranking})")
    echo(f"{'rank':>4}  {'mean':>10}  {'sd':>9}  name")
    for r, i in enumerate(order, 1):
        echo(f"{r:>4}  {mean[i]:>10.4f}  {sd[i]:>9.4f}  {sm.names[i]}")


def _plan(source: str, task: str, options: dict, *, n: int, seed: int, metric, level: str, batch_size: int, ig_steps: int,
          budget, n_jobs: int, device: str, dtype: str, allow_pickle: bool, allow_large: bool, verify=None,
          method: str = "eap", pruning: tuple[int, ...] | None = None, moe_nodes: str = "block",
          verify_share: float | None = None) -> None:
    """Print the plan of an attribute run: counts from the model's skeleton on the meta device (no weight
    is read or allocated, whatever the config's size); timings from the loaded model only when its
    weights fit the memory limit (circuitstat.circuits.limits.MAX_BYTES, which --allow-large does not lift here) and
    circuitstat.pipelines.plan_fit.TIMING_BYTES; otherwise the time is priced by FLOPs (circuitstat.pipelines.plan.flop_rate).
    A plan never refuses a size: the rows over this machine's limits are marked (--allow-large is for running)."""
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.runs.attribute.run import torch_dtype
    from circuitstat.pipelines.build import build_task, check_work, precheck_task, task_positions
    from circuitstat.pipelines.plan import plan_lines
    from circuitstat.pipelines.plan_fit import parameters_line, run_limits, untimed_reason
    from circuitstat.pipelines.sources import LOCAL

    resolved = LOCAL.resolve(source)
    precheck_task(resolved.location, task, n=n, seed=seed, metric=metric, public=resolved.name, **options)
    # a plan reads no weights: a directory with only config.json (weights not downloaded yet) is planned too
    skeleton = LOCAL.skeleton(source, allow_pickle=allow_pickle, allow_large=True, weights=False)
    skeleton = skeleton.to(dtype=torch_dtype(dtype))  # on meta: only the itemsize changes
    if moe_nodes != "block":  # experts as nodes: the plan counts that graph's edges (InputError on a dense model)
        from circuitstat.circuits.moe_nodes import set_moe_nodes

        set_moe_nodes(skeleton, moe_nodes)
    try:  # a run's score matrices over the limit: said after the table, not refused
        check_work(skeleton, n, level=level, positions=task_positions(task, options), allow_large=allow_large)
        refused = ""
    except InputError as e:
        refused = f"does not fit: a run would be refused: {e}"
    from circuitstat.pipelines.runs.attribute.run import check_attribute_verify

    check_attribute_verify(verify, skeleton, method=method, level=level, n=n)  # refused as the run refuses it
    t = build_task(skeleton, task, n=n, seed=seed, metric=metric, **options)
    why = untimed_reason(skeleton, skeleton.directory)
    timing = None
    if not why:
        timing = LOCAL.load(source, device=device, dtype=torch_dtype(dtype), allow_pickle=allow_pickle,
                            allow_large=allow_large)
        if moe_nodes != "block":
            from circuitstat.circuits.moe_nodes import set_moe_nodes

            set_moe_nodes(timing, moe_nodes)
    for line in plan_lines(skeleton, t, level=level, batch_size=batch_size, ig_steps=ig_steps, budget=budget,
                           n_jobs=n_jobs, timing_model=timing, untimed=why, device=str(device), verify=verify,
                           verify_method=method, pruning=pruning,
                           limits=run_limits(budget, allow_large=allow_large, device=str(device)),
                           header=(parameters_line(skeleton),), verify_share=verify_share):
        echo(line)
    if refused:
        echo(refused)


@app.command("audit")
def audit_command(
    spec: Path = typer.Argument(..., help="audit spec (YAML)"),
    out: Path = typer.Option(..., "--out", help="run directory (resumes if it exists)"),
    n_jobs: int | None = typer.Option(None, "--n-jobs", min=N_JOBS.minimum,
                                      help="parallel workers, 1 to this machine's CPU count (default: the spec's)"),
    scheduler: str | None = typer.Option(None, "--scheduler", help="Dask scheduler ADDRESS, or 'local'"),
    force: bool = typer.Option(False, "--force", help="recompute stages whose spec changed"),
    report: bool = typer.Option(True, "--report/--no-report", help="write report.html at the end"),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help=ALLOW_PICKLE_HELP),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
    allow_outside: bool = typer.Option(False, "--allow-outside",
                                       help="let paths in the spec leave its directory (absolute, .., ~)"),
    min_excess: float | None = typer.Option(None, "--min-excess", min=MIN_EXCESS_BOUNDS[0], max=MIN_EXCESS_BOUNDS[1],
                                            help=MIN_EXCESS_HELP + " (default: the spec's heads.min_excess, "
                                            f"else {MIN_EXCESS:g})"),
) -> None:
    """Run a stability audit: attribution, CIs, stability vs k, faithfulness, approximation, heads.

    The spec's task is a built-in (induction, ioi, greater-than; its builder's options under
    task.options) or a task file: one example per row with columns clean, corrupted (the same number
    of tokens), answer and wrong_answer (one token each) and optionally group (its template; cross-fitting
    folds keep a group whole, faithfulness_folds sets their number); docs/usage.md has a five-row example.
    Cost: minutes for the zoo's 2-layer models (the demo's audit of 64 prompts: about 35 s); exact
    patching grows with the edges, so plan a large model with `circuitstat attribute --plan` first."""
    from circuitstat.pipelines.kinds import kind
    from circuitstat.pipelines.spec import load_spec

    check_out(out, "audit", force=force)
    parsed = load_spec(spec, allow_outside=allow_outside)  # validated before anything is created
    if min_excess is not None:  # recorded in the run's spec, where the verdict and the report read it
        parsed = parsed.model_copy(update={"heads": parsed.heads.model_copy(update={"min_excess": min_excess})})
    kind("audit").run(parsed, out, n_jobs=n_jobs, scheduler=scheduler, force=force, allow_pickle=allow_pickle,
                      allow_large=allow_large)
    echo(f"audit written to {out}")
    if report:
        from circuitstat.reports.html import render_report

        echo(f"report: {render_report(out)}")
    from circuitstat.pipelines.demo import print_summary

    print_summary(out, echo=echo)  # the one-screen verdict, as `circuitstat demo` ends (it reads the spec's min_excess)


@app.command("report")
def report_command(
    run: Path = typer.Argument(..., help="run directory"),
    out: Path | None = typer.Option(None, "--out", help="output file or directory (default RUN/report.html)"),
    min_excess: float | None = typer.Option(None, "--min-excess", min=MIN_EXCESS_BOUNDS[0], max=MIN_EXCESS_BOUNDS[1],
                                            help=MIN_EXCESS_HELP + " (default: the run spec's heads.min_excess, "
                                            f"else {MIN_EXCESS:g})"),
    trust_unrecorded: bool = trust_option(),
) -> None:
    """Write one self-contained report.html for a run directory."""
    from circuitstat.reports.html import render_report

    if run.is_dir():
        verified(run, trust_unrecorded)
    echo(str(render_report(run, out, min_excess=min_excess, trust_unrecorded=trust_unrecorded)))


@app.command("circuit")
def circuit_command(
    run: Path = typer.Argument(..., help="run directory with scores (from attribute or audit)"),
    k: int = typer.Option(..., "--k", min=1, help="number of edges"),
    ranking: Ranking | None = typer.Option(None, "--ranking", help="rank edges by |score| (absolute) or by signed "
                                           "score (default: an audit's recorded ranking, else absolute)"),
    absolute: bool | None = typer.Option(None, "--absolute/--signed", hidden=True, help="old name of --ranking"),
    seed: int = typer.Option(SEED.default, "--seed", **SEED.option, help="seed of the random tie-break at the cut-off (circuitstat.core.topk)"),
    method: Method | None = typer.Option(None, "--method",
                                         help="which method's scores in an audit run (default: exact if present)"),
    rule: Rule = typer.Option(Rule("top-k"), "--rule", help="top-k edges, or greedy growth from the logits"),
    prune: bool = typer.Option(True, "--prune/--no-prune", help="drop nodes with no path input -> logits"),
    json_out: Path | None = typer.Option(None, "--json", help="export to EAP-IG / MIB JSON"),
    trust_unrecorded: bool = trust_option(),
) -> None:
    """Print (and export) the circuit of the top-k edges of a run's mean scores, saying which method and
    ranking it used; an empty circuit says why and what to pass instead. A run whose tables changed since
    it wrote them (sha256 in its manifest) is refused (exit 2), as check and report refuse it."""
    from circuitstat.circuits.circuit import Circuit
    from circuitstat.circuits.scores import ScoreMatrix
    from circuitstat.pipelines.circuit_choice import choose_scores, default_ranking, empty_explanation, header_line
    from circuitstat.core.outpath import check_output_file

    if json_out is not None:
        check_output_file(json_out, flag="--json")  # before any work: never a device, FIFO, link or a run's record
    verified(run, trust_unrecorded)  # the scores are the ones the run wrote (sha256 in its manifest)
    choice = choose_scores(run, None if method is None else method.value)
    chosen, why = ranking_option(ranking, absolute, "circuit"), "as asked"
    if chosen is None:
        chosen, why = default_ranking(run)
    sm = ScoreMatrix.read_means(run, choice.table)  # column means, read in blocks: any graph size
    make = Circuit.top_k if rule.value == "top-k" else Circuit.greedy
    selected = make(sm, k, ranking=chosen, seed=seed)
    circuit = selected.prune() if prune else selected
    echo(header_line(choice, chosen, why, k, rule.value, prune))
    echo(circuit.summary())
    if circuit.n_edges == 0:
        echo("note: " + empty_explanation(selected.scores, selected.edges, k, chosen, prune))
    if json_out is not None:
        circuit.to_json(json_out)
        echo(f"written {json_out}")
