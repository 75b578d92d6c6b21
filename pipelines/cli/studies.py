"""Commands that train and study: ``train``, ``heads``, ``demo`` and the ``study`` group
(``study heads``, ``study variance``, ``study calibration``, ``study groundtruth``)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from circuitstat.core.errors import InputError
from circuitstat.core.params import (D_MLP, INIT_STD, MIN_LR_RATIO, N_JOBS, N_RESAMPLES, REPEAT_FRACTION, SEED,
                                          WARMUP_STEPS)

from circuitstat.pipelines.kinds import kind

from .app import ALLOW_LARGE_HELP, ALLOW_PICKLE_HELP, app, check_out, choices, echo, study_app

MAX_SEEDS_HELP = "1000"  # circuitstat.pipelines.training.MAX_SEEDS, written out so that --help does not import training


Match = choices("Match", "max", "hungarian")  # how heads of two refits are matched
Pairs = choices("Pairs", "anchor", "all")  # which refit pairs are compared
Null = choices("Null", "prompts", "untrained", "none")  # the null distribution of head stability
CIOver = choices("CIOver", "both", "prompts", "refits")  # what the head bootstrap resamples
Optimizer = choices("Optimizer", "adam", "adamw")
Norm = choices("Norm", "layernorm", "rmsnorm", "none")
Positional = choices("Positional", "learned", "rotary")
# the MLP activations circuitstat.circuits.engine.config.ACTIVATIONS implements (without its aliases), written out so
# that --help does not import torch; tests/pipelines/test_train_options.py checks they are a subset
Activation = choices("Activation", "gelu_new", "gelu", "relu", "silu")


@app.command("heads")
def heads_command(
    models: list[str] = typer.Option(..., "--models", help="model directory, cached hub id or hub/id@revision; "
                                     "repeat the option (or separate by commas) for each refit, the first is the anchor"),
    match: Match = typer.Option(Match("max"), "--match", help="max (the paper) or hungarian (one-to-one)"),
    pairs: Pairs = typer.Option(Pairs("anchor"), "--pairs", help="anchor (the paper: refit 0 against each other) or all"),
    anchor: int = typer.Option(0, "--anchor", min=0, help="index of the anchor refit"),
    drop_bos: bool = typer.Option(False, "--drop-bos", help="drop the BOS column of every pattern"),
    null: Null = typer.Option(Null("prompts"), "--null", help="shuffled prompts, random-init models, or none"),
    n_probe: int = typer.Option(100, "--n-probe", min=2, help="probe prompts (held-out corpus snippets)"),
    probe_len: int | None = typer.Option(None, "--probe-len", min=2,
                                         help="tokens per probe prompt, BOS included (default 64, or n_ctx if smaller)"),
    probe_file: Path | None = typer.Option(None, "--probe-file", help=".txt (one prompt per line) or .jsonl (field text)"),
    bos: bool = typer.Option(True, "--bos/--no-bos", help="prepend the BOS token to every probe prompt"),
    corpus: str | None = typer.Option(None, "--corpus", help="corpus of the probe snippets (its held-out probe split); "
                                      "default: the models' training corpus if it is stdlib"),
    hooks: str = typer.Option("pre,post", "--hooks", help="residual hooks: pre (before attention), post (after attention)"),
    n_resamples: int | None = typer.Option(None, "--n-resamples", **N_RESAMPLES.option, help=f"bootstrap resamples (default {N_RESAMPLES.default_for('heads')})"),
    n_boot: int | None = typer.Option(None, "--n-boot", **N_RESAMPLES.option, hidden=True, help="old name of --n-resamples"),
    ci_over: CIOver = typer.Option(CIOver("both"), "--ci-over", help="what the bootstrap resamples"),
    seed: int = typer.Option(SEED.default, "--seed", **SEED.option),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda, cuda:N or mps"),
    n_jobs: int = typer.Option(N_JOBS.default, "--n-jobs", min=N_JOBS.minimum, help="BLAS / torch threads inside the fit (1 to the CPU count)"),
    out: Path = typer.Option(..., "--out", help="run directory: heads/layers/residual.parquet and more, manifest.json"),
    force: bool = typer.Option(False, "--force", help="recompute if the directory holds a different spec"),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help=ALLOW_PICKLE_HELP),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
) -> None:
    """Cross-seed stability of attention heads and of the residual stream, with refit-level and bootstrap CIs.

    Cost: about a minute for 5 zoo-sized models with the default 100 probe prompts and 200 resamples
    (scales with models x probe prompts x resamples); across-seed intervals need at least 3 models."""
    from circuitstat.pipelines.build import check_n_jobs
    from circuitstat.pipelines.runs.heads.stability import HeadsRun, HeadStability

    if n_boot is not None:
        from circuitstat.core.errors import warn_renamed

        warn_renamed("--n-boot", "--n-resamples", "heads")
        if n_resamples is not None and n_resamples != n_boot:
            raise InputError("--n-boot (the old flag) and --n-resamples differ; give --n-resamples only")
        n_resamples = n_boot
    est = HeadStability(match=match.value, pairs=pairs.value, anchor=anchor, drop_bos=drop_bos, null=null.value,
                        n_resamples=N_RESAMPLES.default_for("heads") if n_resamples is None else n_resamples, ci_over=ci_over.value,
                        n_probe=n_probe, probe_len=probe_len, bos=bos,
                        probe_file=str(probe_file) if probe_file else None, corpus=corpus,
                        hooks=tuple(h.strip() for h in hooks.split(",") if h.strip()), seed=seed,
                        n_jobs=check_n_jobs(n_jobs, "--n-jobs"))
    spec = HeadsRun(est, tuple(p for m in models for p in str(m).split(",") if p))
    res = kind("heads").run(spec, out, device=device, force=force, command=sys.argv, allow_pickle=allow_pickle,
                            allow_large=allow_large)
    echo(res.summary())
    echo(f"-> {out}")


@app.command("train")
def train_command(
    layers: int = typer.Option(2, "--layers", min=1, help="transformer layers"),
    heads: int = typer.Option(4, "--heads", min=1, help="attention heads per layer"),
    d_model: int = typer.Option(128, "--d-model", min=1, help="residual stream width"),
    attn_only: bool = typer.Option(False, "--attn-only", "--no-mlp", help="attention-only model (no MLP layers)"),
    optimizer: Optimizer = typer.Option(Optimizer("adamw"), "--optimizer", help="optimizer"),
    weight_decay: float = typer.Option(0.01, "--weight-decay", min=0.0,
                                       help="weight decay (decoupled for adamw, L2 for adam)"),
    # training steps, learning rate and batch are TrainRecipe's own, not the mask fits' Params of the same names
    train_steps: int = typer.Option(1000, "--steps", min=1, help="optimizer steps"),
    seeds: str = typer.Option("0-4", "--seeds", help=f"seeds, e.g. 0-4 or 0,2,5; one model per seed (at most "
                              f"{MAX_SEEDS_HELP} without --allow-large)"),
    out: Path = typer.Option(..., "--out", help="output folder; models go to OUT/seed-S"),
    peak_lr: float = typer.Option(1e-3, "--lr", min=0.0, help="peak learning rate"),
    train_batch_size: int = typer.Option(16, "--batch-size", min=1, help="sequences per step"),
    n_ctx: int = typer.Option(128, "--n-ctx", min=2, help="sequence length (context)"),
    norm: Norm = typer.Option(Norm("layernorm"), "--norm", help="normalisation"),
    positional: Positional = typer.Option(Positional("learned"), "--positional", help="position encoding"),
    d_mlp: int | None = typer.Option(None, "--d-mlp", **D_MLP.option, help="MLP hidden width (default 4 x d_model)"),
    activation: Activation = typer.Option(Activation("gelu_new"), "--activation", help="MLP activation"),
    init_std: float | None = typer.Option(None, "--init-std", **INIT_STD.option,
                                          help="std of the weight matrices at step 0 (default GPT-2's 0.02; "
                                               "the zoo: 1/sqrt(d_model))"),
    warmup_steps: int = typer.Option(WARMUP_STEPS.default, "--warmup", **WARMUP_STEPS.option,
                                     help="steps of linear learning-rate warmup"),
    min_lr_ratio: float = typer.Option(MIN_LR_RATIO.default, "--min-lr-ratio", **MIN_LR_RATIO.option,
                                       help="final learning rate as a share of --lr (cosine decay; 1: constant)"),
    repeat_fraction: float = typer.Option(REPEAT_FRACTION.default, "--repeat-fraction", **REPEAT_FRACTION.option,
                                          help="share of training sequences in which a span of the text is copied "
                                               "later (the zoo: 1.0, so induction heads form)"),
    vocab_size: int = typer.Option(4096, "--vocab-size", min=2, help="size of the BPE trained on the corpus"),
    tokenizer: str = typer.Option("bpe", "--tokenizer", help="bpe (trained on the corpus), gpt2, or a tokenizer path"),
    corpus: str = typer.Option("stdlib", "--corpus", help="stdlib, a folder of text files, or a Parquet file (column text)"),
    checkpoint_every: int = typer.Option(100, "--checkpoint-every", min=1, help="steps between checkpoints"),
    eval_every: int = typer.Option(100, "--eval-every", min=1, help="steps between validation-loss evaluations"),
    threads: int = typer.Option(1, "--threads", min=1, help="torch threads per model (fixed for reproducibility)"),
    n_jobs: int = typer.Option(N_JOBS.default, "--n-jobs", min=N_JOBS.minimum, help="models trained in parallel (1 to the CPU count)"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP + " and on the number of seeds"),
) -> None:
    """Train one small GPT-style model per seed on a corpus (deterministic, resumable).

    Cost: a zoo-sized model (2 layers, d_model 64, 3,500 steps of 32 x 64 tokens) takes about 2.5 min on
    one core; time grows with --steps, --batch-size x --n-ctx and the model's size. Try a few --steps first."""
    import json

    from circuitstat.pipelines.build import check_device, check_n_jobs
    from circuitstat.pipelines.training import TrainRecipe, check_out_dir, parse_seeds, train_models

    # every option is checked before anything is written
    out = check_out_dir(out)
    device = check_device(device)
    n_jobs = check_n_jobs(n_jobs)
    seed_list = parse_seeds(seeds, allow_large=allow_large)
    recipe = TrainRecipe(
        n_layers=layers, n_heads=heads, d_model=d_model, attn_only=attn_only, n_ctx=n_ctx, norm=norm.value,
        positional=positional.value, tokenizer=tokenizer, vocab_size=vocab_size, corpus=corpus,
        optimizer=optimizer.value, lr=peak_lr, weight_decay=weight_decay, batch_size=train_batch_size, steps=train_steps,
        eval_every=eval_every, checkpoint_every=checkpoint_every, threads=threads, d_mlp=d_mlp,
        act=activation.value, init_std=init_std, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio,
        repeat_fraction=repeat_fraction,
    )
    if attn_only and (d_mlp is not None or activation.value != "gelu_new"):
        raise InputError("--d-mlp and --activation set the MLP, and --attn-only has none; drop one of them")
    recipe.validate(allow_large=allow_large)
    from circuitstat.pipelines.work import check_training

    check_training(recipe, len(seed_list), allow_large=allow_large)  # steps x seeds x size, before anything is written
    for p in train_models(recipe, seed_list, out, n_jobs=n_jobs, device=device, allow_large=allow_large):
        meta = json.loads((p / "config.json").read_text())
        t = meta["meta"]["training"]
        echo(f"{p}  val_loss {t['final_val_loss']:.4f}  weights {meta['weight_hash'][:16]}  "
                   f"{t['train_seconds']:.0f}s")


@app.command("demo")
def demo_command(
    out: Path = typer.Option(Path("runs/demo"), "--out", help="run directory"),
    n_jobs: int | None = typer.Option(None, "--n-jobs", min=N_JOBS.minimum,
                                      help="parallel workers, 1 to this machine's CPU count (default: up to 2)"),
    quick: bool = typer.Option(False, "--quick", help="fewer examples and resamples"),
) -> None:
    """Train or reuse the zoo's attention-only models, audit their induction circuit, write the report.

    Cost: from an empty cache about 9 min on 2 cores (training 5 models about 6.3 min, audit and report
    about 35 s); with the models cached, about 35 s."""
    from circuitstat.pipelines.build import check_n_jobs, max_jobs
    from circuitstat.pipelines.demo import DEMO_RECIPE, demo_spec, print_summary
    from circuitstat.pipelines.zoo import ZOO_RECIPES, ZOO_SEEDS, default_zoo
    from circuitstat.reports.html import render_report

    check_out(out)
    n_jobs = check_n_jobs(min(2, max_jobs()) if n_jobs is None else n_jobs)
    echo(f"circuitstat demo: the zoo's {DEMO_RECIPE} model ({len(ZOO_SEEDS)} seeds; trained once, about 6 "
               "minutes on 2 cores, then cached) → induction-circuit audit with exact patching and EAP → head "
               "stability across seeds → HTML report")
    default_zoo(n_jobs=n_jobs, recipes={DEMO_RECIPE: ZOO_RECIPES[DEMO_RECIPE]})  # only what the demo audits
    kind("audit").run(demo_spec(n_jobs, quick), out, n_jobs=None)  # the spec's workers
    report = render_report(out)
    print_summary(out, echo=echo)
    echo(f"\nreport: {report.resolve()}")


@study_app.command("heads")
def study_heads_command(
    plan: Path | None = typer.Argument(None, help="study plan (YAML; see circuitstat.pipelines.runs.heads.study.HeadStudySpec); "
                                       "default: the full study of docs/results.md"),
    out: Path = typer.Option(..., "--out", help="run directory of the study"),
    quick: bool = typer.Option(False, "--quick", help="a tiny version (1/2/4 layers, 3 seeds, a few steps) for smoke tests"),
    n_jobs: int = typer.Option(N_JOBS.default_for("study heads"), "--n-jobs", min=N_JOBS.minimum,
                               help="parallel training / analysis processes"),
    device: str = typer.Option("cpu", "--device", help="training device"),
    force: bool = typer.Option(False, "--force", help="recompute analyses that already finished with a different spec"),
    allow_outside: bool = typer.Option(False, "--allow-outside",
                                       help="let the plan's recipe.corpus / recipe.tokenizer leave its directory"),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
) -> None:
    """Train a grid of models (cached) and test the head-stability claims of Bali et al. (2026) with CIs.

    Cost: the default plan trains 30 models (3 depths x 2 optimizers x 5 seeds): 34 min on an idle 2-core
    machine, 115 min on a loaded one, then about 4 min of analysis; cached models are reused. --quick:
    about 15 s."""
    from circuitstat.pipelines.build import check_device, check_n_jobs
    from circuitstat.pipelines.runs.heads.study import HeadStudyRun, load_head_study_plan

    check_out(out, "study heads", force=force)
    n_jobs, device = check_n_jobs(n_jobs), check_device(device)
    study_plan = load_head_study_plan(plan, allow_outside=allow_outside) if plan is not None else None
    spec = HeadStudyRun(plan=study_plan, quick=quick)  # refuses a plan and --quick together
    res = kind("study heads").run(spec, out, n_jobs=n_jobs, device=device,
                                  force=force, command=sys.argv, allow_large=allow_large)  # work checked first
    from circuitstat.stats.intervals import interval_text

    t = res.to_table("summary").to_pydict()
    w = max(len(i) for i in t["item"])
    for i, v, lo, hi, vd in zip(t["item"], t["value"], t["ci_low"], t["ci_high"], t["verdict"]):
        echo(f"{i:<{w}}  {interval_text(v, lo, hi, digits=4, missing='not estimable from this study'):<34} "
             f"{vd}".rstrip())
    echo(f"-> {out}  ({res.timings})")


@study_app.command("variance")
def study_variance_command(
    spec: Path = typer.Argument(..., help="variance-study spec (YAML)"),
    out: Path = typer.Option(..., "--out", help="run directory (resumes if it exists)"),
    n_jobs: int | None = typer.Option(None, "--n-jobs", min=N_JOBS.minimum,
                                      help="parallel workers, 1 to this machine's CPU count (default: the spec's)"),
    force: bool = typer.Option(False, "--force", help="recompute stages whose spec changed"),
    report: bool = typer.Option(True, "--report/--no-report", help="write report.html at the end"),
    allow_outside: bool = typer.Option(False, "--allow-outside",
                                       help="let paths in the spec leave its directory (absolute, .., ~)"),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help=ALLOW_PICKLE_HELP),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
) -> None:
    """Variance study: where the uncertainty of a circuit comes from (examples, counterfactuals, estimators, seeds).

    Cost: examples/variance-zoo.yaml computes score matrices for every estimator, seed and counterfactual
    draw, then 3-4 min of statistics on 2 cores (mostly the selection stage's faithfulness curves); it
    needs the zoo's attention-only seeds 0-2 (trained on first use). A killed run resumes."""
    from circuitstat.pipelines.runs.variance import load_variance_spec, summary_lines

    check_out(out, "study variance", force=force)
    parsed = load_variance_spec(spec, allow_outside=allow_outside)  # validated before anything is created
    kind("study variance").run(parsed, out, n_jobs=n_jobs, force=force, allow_pickle=allow_pickle,
                               allow_large=allow_large)
    echo(f"variance study written to {out}")
    for line in summary_lines(Path(out)):
        echo(line)
    if report:
        from circuitstat.reports.html import render_report

        echo(f"report: {render_report(out)}")


@study_app.command("calibration")
def study_calibration_command(
    spec: Path | None = typer.Argument(None, help="calibration spec (YAML): model, task (n = population size), "
                                                  "sizes; optional with --scores"),
    out: Path = typer.Option(..., "--out", help="run directory (resumes if it exists)"),
    scores: Path | None = typer.Option(None, "--scores",
                                       help="an attribution run (`circuitstat attribute --out DIR`) whose "
                                            "per-example scores are the population (overrides the spec's scores)"),
    n_jobs: int | None = typer.Option(None, "--n-jobs", min=N_JOBS.minimum, help="parallel workers for the attribution"),
    force: bool = typer.Option(False, "--force", help="recompute stages whose spec changed"),
    allow_outside: bool = typer.Option(False, "--allow-outside",
                                       help="let paths in the spec leave its directory (absolute, .., ~)"),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help=ALLOW_PICKLE_HELP),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
) -> None:
    """Empirical coverage of the audit's intervals on your model and task, per dataset size N.

    Cost: exact attribution of the whole population first (1024 prompts in examples/calibration-zoo.yaml),
    then the resampled datasets: about 3 min of CPU for that example (165 s: edge kinds ~4 s, stability
    ~46 s, the rest faithfulness; docs/calibration.md). Drop kinds from `intervals` to go faster."""
    from circuitstat.pipelines.runs.calibration.study import load_calibration_spec, parse_calibration_spec, summary_lines

    check_out(out, "study calibration", force=force)
    if spec is None and scores is None:
        raise InputError("give a calibration spec, or --scores DIR (an attribution run) to calibrate on its scores")
    if spec is None:
        parsed = parse_calibration_spec({"scores": str(scores)}, "--scores")
    else:
        parsed = load_calibration_spec(spec, allow_outside=allow_outside, scores=scores)
    res = kind("study calibration").run(parsed, out, n_jobs=n_jobs, force=force, allow_pickle=allow_pickle,
                                        allow_large=allow_large)
    for line in summary_lines(res.to_table("coverage").to_pylist(), parsed.confidence_level, out,
                              res.to_table("coverage_by_kurtosis").to_pylist()):
        echo(line)


@study_app.command("groundtruth")
def study_groundtruth_command(
    spec: Path = typer.Argument(..., help="ground-truth spec (YAML; see circuitstat.pipelines.runs.groundtruth.study): models, methods, sizes"),
    out: Path = typer.Option(..., "--out", help="run directory (resumes if it exists)"),
    n_jobs: int | None = typer.Option(None, "--n-jobs", min=N_JOBS.minimum, help="parallel workers for the attribution"),
    force: bool = typer.Option(False, "--force", help="recompute stages whose spec changed"),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
) -> None:
    """Score discovery methods and circuitstat's error statements against models whose circuit is known."""
    from circuitstat.pipelines.runs.groundtruth.study import load_groundtruth_spec, summary_lines
    from circuitstat.reports.html import render_report

    check_out(out, "study groundtruth", force=force)
    parsed = load_groundtruth_spec(spec)
    res = kind("study groundtruth").run(parsed, out, n_jobs=n_jobs, force=force, allow_large=allow_large)
    for line in summary_lines(res.tables(), parsed.alphas[0]):
        echo(line)
    echo(f"-> {out}\nreport: {render_report(out)}")
