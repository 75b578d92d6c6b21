"""Work estimates of training and of the studies, checked before any work starts (circuitstat.circuits.limits).

Sizes in a spec or plan come from a file that may be someone else's: a grid of a thousand seeds, a
million training steps or a hundred thousand datasets of a million prompts would run for days and
leave a partial run directory behind. Each estimate here counts the arithmetic of the computation
from the shapes alone (FLOPs of the model passes from circuitstat.circuits.plan; multiply-adds of the
resampling), an upper bound of the same order as the work itself, and is refused above
:data:`circuitstat.circuits.limits.MAX_WORK` unless the command line passes ``--allow-large``. The checks run
before a model is trained, a corpus tokenized or a run directory created.
"""

from __future__ import annotations

import sys
from typing import Any

from circuitstat.circuits.limits import check_work
from circuitstat.circuits.methods import MASK_METHODS

GPT2_VOCAB = 50257


def _recipe_vocab(recipe: Any) -> int:
    """The vocabulary a recipe trains with, before its tokenizer exists (a BPE's size, GPT-2's)."""
    tok = str(recipe.tokenizer).lower()
    return GPT2_VOCAB if tok.startswith(("gpt2", "gpt-2", "openai-community/gpt2")) else int(recipe.vocab_size)


def training_operations(recipe: Any, vocab_size: int | None = None) -> float:
    """FLOPs of training one model of ``recipe``: steps x batch x (forward + backward, 3 forwards) of
    an ``n_ctx``-token sequence with logits at every position."""
    from circuitstat.circuits.plan import layer_flops

    cfg = recipe.model_config(vocab_size or _recipe_vocab(recipe))
    forward = cfg.n_layers * sum(layer_flops(cfg, cfg.n_ctx)) + 2 * cfg.d_model * cfg.vocab_size * cfg.n_ctx
    return float(recipe.steps) * recipe.batch_size * 3 * forward


def check_training(recipe: Any, n_models: int, *, allow_large: bool = False, what: str = "training") -> None:
    """None; InputError when training ``n_models`` models of ``recipe`` exceeds the work limit."""
    check_work(n_models * training_operations(recipe), f"{what} ({n_models:,} models x {recipe.steps:,} steps)",
               allow_large=allow_large, shrink="the seeds, steps, batch size, context or model size")


def head_study_operations(plan: Any) -> float:
    """Operations of a head study: training every condition's seeds, then per condition the probe
    forwards, all-pairs pattern similarities (every refit an anchor), their bootstrap and
    shuffled-prompt null, the residual CKA and its bootstrap, and the permutation tests."""
    total = 0.0
    K, n, T = len(plan.seeds), plan.n_probe, plan.probe_len
    for _, recipe in plan.conditions():
        total += K * training_operations(recipe)
        total += head_analysis_operations(recipe.model_config(_recipe_vocab(recipe)), K, n, T, n_null=plan.n_null,
                                          n_resamples=plan.n_resamples, n_resamples_cka=plan.n_resamples_cka,
                                          n_permutations=plan.n_permutations)
    return total


def head_analysis_operations(cfg: Any, K: int, n: int, T: int, *, n_null: int, n_resamples: int,
                             n_resamples_cka: int, n_permutations: int) -> float:
    """Operations of one head-stability analysis of ``K`` models of config ``cfg`` on ``n`` probe prompts of ``T``
    tokens: the probe forwards, all-pairs pattern similarities (every refit an anchor), their bootstrap and
    shuffled-prompt null, the residual CKA and its resamples (two hooks), and the permutation tests."""
    from circuitstat.circuits.plan import forward_flops

    heads = cfg.n_layers * cfg.n_heads * cfg.n_heads  # same-layer head pairs of two refits
    total = K * n * forward_flops(cfg, min(T, cfg.n_ctx))
    similarity = heads * n * T * T  # cosine of lower-triangle patterns, per prompt
    total += K * K * similarity * (1 + n_null) + n_resamples * K * K * heads * n
    tokens = n * T
    total += 2 * K * K * tokens * tokens * (cfg.d_model + n_resamples_cka)  # two hooks: Gram matrices, resampled
    return float(total + n_permutations * cfg.n_layers * cfg.n_heads * K)


def check_heads(est: Any, models: list, *, allow_large: bool = False) -> float:
    """The estimated operations of ``heads`` (a HeadStability ``est`` on loaded ``models``); InputError above the
    work limit, before the probe set is built."""
    cfg, K = models[0].cfg, len(models)
    T = min(64, int(cfg.n_ctx)) if est.probe_len is None else int(est.probe_len)
    n_null = (50 if est.null == "prompts" else max(2, K - 1)) if est.n_null is None else int(est.n_null)
    ops = head_analysis_operations(cfg, K, int(est.n_probe), T, n_null=n_null if est.null != "none" else 0,
                                   n_resamples=int(est.n_resamples),
                                   n_resamples_cka=int(est.n_resamples_cka or est.n_resamples),
                                   n_permutations=int(est.n_permutations))
    check_work(ops, f"heads ({K} models x {int(est.n_probe):,} probe prompts of {T} tokens)", allow_large=allow_large,
               shrink="--n-probe, --probe-len, --n-resamples or the models")
    announce("heads", ops)
    return ops


MAX_MODELS = 1000
"""Most models one study or ``train`` may train without ``--allow-large`` (each costs a process start,
data loading and a directory, whatever its size): circuitstat.pipelines.training.MAX_SEEDS."""


def check_head_study(plan: Any, *, allow_large: bool = False) -> None:
    """None; InputError when the head-study plan trains more than :data:`MAX_MODELS` models or exceeds
    the work limit (named sizes to shrink)."""
    from circuitstat.circuits.limits import check_count

    check_count(len(plan.conditions()) * len(plan.seeds), MAX_MODELS,
                f"the number of models the head-study plan trains ({len(plan.conditions())} conditions x "
                f"{len(plan.seeds)} seeds)", allow_large=allow_large)
    check_work(head_study_operations(plan), f"the head-study plan ({len(plan.conditions())} conditions x "
               f"{len(plan.seeds)} seeds x {plan.base.steps:,} steps)", allow_large=allow_large,
               shrink="depths, optimizers, seeds, recipe.steps, n_probe, probe_len or the resample counts")


def calibration_operations(spec: Any, cfg: Any, n_edges: int, positions: int, *, n_population: int,
                           attributed: bool = True) -> float:
    """Operations of a calibration study: attributing the population (when ``attributed``), then per
    dataset size and dataset the resampled means of every edge (several interval methods), the
    stability intervals and their Monte Carlo truth at every k, and the faithfulness runs of every
    selected circuit on every population prompt (``cfg`` None: no model, no faithfulness family)."""
    from circuitstat.circuits.plan import forward_flops, method_cost

    total = 0.0
    if attributed and cfg is not None:
        total += method_cost(cfg, spec.method, n=n_population, positions=positions, ig_steps=spec.ig_steps).flops
    D, B, ks = spec.n_datasets, spec.n_resamples, len(spec.ks)
    families = set(spec.intervals)
    for N in spec.sizes:
        if "edge" in families:
            total += D * 4 * 2 * B * N * n_edges  # percentile/BCa/t/studentized resampled means
        if "stability" in families:
            total += D * (2 * B * N * n_edges + ks * B * n_edges) + spec.n_truth_pairs * 2 * N * n_edges * ks
        if "faithfulness" in families and cfg is not None:
            total += D * ks * (n_population + 2 * N) * forward_flops(cfg, positions)  # every selected circuit
    return float(total)


def check_calibration(spec: Any, cfg: Any, n_edges: int, positions: int, *, n_population: int,
                      attributed: bool = True, allow_large: bool = False) -> float:
    """The estimated operations of the calibration study (calibration_operations, plus each dataset's call
    overhead and the population's prompts); InputError when they exceed the work limit."""
    ops = calibration_operations(spec, cfg, n_edges, positions, n_population=n_population, attributed=attributed)
    ops += spec.n_datasets * len(spec.sizes) * len(spec.intervals) * PER_CALL  # a round of interval calls each
    if attributed:
        ops += n_population * positions * PER_CALL / 1e3  # building the population's prompts
    check_work(ops, f"the calibration study ({len(spec.sizes)} sizes up to {max(spec.sizes):,} x "
               f"{spec.n_datasets:,} datasets x {spec.n_resamples:,} resamples on {n_edges:,} edges)",
               allow_large=allow_large, shrink="sizes, n_datasets, n_resamples, ks, n_truth_pairs or task.n")
    announce("study calibration", ops)
    return ops


PER_CALL = 1e6
"""Operations charged for each dataset a study evaluates, on top of its arithmetic: the Python and
library overhead of one round of interval calls (about 0.1 ms at the 1e10 operations per second that
:data:`circuitstat.circuits.limits.MAX_WORK` assumes), so a hundred thousand tiny datasets are priced as the
minutes they take and not as their few multiply-adds."""


def groundtruth_operations(spec: Any, loaded: dict) -> float:
    """Operations of a ground-truth study: per model (``loaded``: source -> GroundTruthModel) building and
    attributing its population of ``n_datasets x max(sizes)`` prompts with every method, then per method,
    size and dataset the bootstrap q-values, the subsampled stability, the top-k scores and (faithfulness
    methods) the circuits' runs on the population."""
    from circuitstat.circuits.plan import forward_flops, method_cost

    population = spec.n_datasets * max(spec.sizes)
    total = 0.0
    for gt in loaded.values():
        cfg, E = gt.model.cfg, int(gt.truth.size)
        P = int(cfg.n_ctx)  # every prompt fits the context: an upper bound of its length
        total += population * P * PER_CALL / 1e3  # building the prompts (a Python loop per prompt)
        for method in spec.methods:
            if method in MASK_METHODS:  # fitted per dataset (and refit), not attributed on the population
                from circuitstat.pipelines.runs.groundtruth.masks import pruning_flops

                total += pruning_flops(spec, cfg, E, method) + spec.n_datasets * len(spec.sizes) * PER_CALL
                continue
            m = min(population, 4096)  # method_cost walks the batches: price a slice and scale (linear in n)
            total += method_cost(cfg, method, n=m, positions=P, ig_steps=spec.ig_steps).flops * population / m
            for N in spec.sizes:
                per = 2 * spec.n_resamples * N * E + 2 * spec.n_subsamples * N * E + len(spec.k_multiples) * N * E
                per += 2 * getattr(spec, "refits", 0) * N * E  # the refit family's resampled means
                if method in spec.faithfulness_methods:
                    per += (population + 10 * N) * forward_flops(cfg, P)  # the true, selected and fold circuits
                total += spec.n_datasets * (per + PER_CALL)
    return float(total)


def check_groundtruth(spec: Any, loaded: dict, *, allow_large: bool = False) -> float:
    """The estimated operations of the ground-truth study; InputError when each model's population has more
    prompts than a task may (circuitstat.pipelines.build.MAX_EXAMPLES) or the work exceeds the limit."""
    from circuitstat.circuits.limits import check_count

    from .build import MAX_EXAMPLES

    check_count(spec.n_datasets * max(spec.sizes), MAX_EXAMPLES, f"the prompts of each model's population "
                f"(n_datasets {spec.n_datasets:,} x the largest size {max(spec.sizes):,})", allow_large=allow_large)
    ops = groundtruth_operations(spec, loaded)
    check_work(ops, f"the ground-truth study ({len(loaded)} models x {len(spec.methods)} methods x sizes up to "
               f"{max(spec.sizes):,} x {spec.n_datasets:,} datasets x {spec.n_resamples:,} resamples)",
               allow_large=allow_large, shrink="models, methods, sizes, n_datasets, n_resamples or n_subsamples")
    return ops


ANNOUNCE = 1e11
"""Estimated work from which a run says what it costs before starting (about ten seconds and more)."""


def announce(what: str, operations: float) -> None:
    """Print the estimated work of ``what`` and the limit to stderr before the work starts, when it is
    at least :data:`ANNOUNCE` (a quick run stays silent)."""
    from circuitstat.circuits.limits import MAX_WORK

    if operations < ANNOUNCE:
        return
    print(f"{what}: estimated work {operations:.2g} operations (the limit, about a day on two CPU cores, is "
          f"{MAX_WORK:.2g})", file=sys.stderr, flush=True)


def tokens_operations(est: Any, cfg: Any, positions: int) -> float:
    """Operations of ``tokens`` on one model: per prompt the token weights (a forward and a backward),
    one forward per measure or random order and k (the ablations) and the sink read-out, then the
    bootstrap of the per-prompt drops and of the heads' sink statistics."""
    from circuitstat.circuits.plan import forward_flops

    N, K = int(est.n), len(est.ks)
    orders = len(est.measures) + int(est.n_random)
    forwards = 3 + orders * K + 1
    heads = cfg.n_layers * cfg.n_heads
    resampled = 2 * int(est.n_resamples) * N * ((len(est.measures) + 1) * K + 3 * heads)
    return float(N * forwards * forward_flops(cfg, positions) + resampled + N * PER_CALL / 1e2)


def check_tokens(est: Any, models: list, positions: int | None, *, allow_large: bool = False) -> float:
    """The estimated operations of ``tokens`` on ``models``; InputError above the work limit."""
    ops = sum(tokens_operations(est, m.cfg, positions or min(int(m.cfg.n_ctx), 64)) for m in models)
    check_work(ops, f"tokens ({len(models)} model(s) x {int(est.n):,} prompts x {len(est.ks)} k x "
               f"{len(est.measures) + int(est.n_random)} orders)", allow_large=allow_large,
               shrink="--n, --k, --measures, --n-random or --n-resamples")
    return ops


def check_run_work(name: str, spec: Any, cfg: Any, *, allow_large: bool = False, shrink: str = "") -> float:
    """The estimated FLOPs of a run of kind ``name`` with ``spec`` on a model of config ``cfg`` (the kind's
    ``flops``: the ``--plan`` arithmetic, circuitstat.circuits.plan); InputError above the work limit, before any
    work starts (``allow_large`` lifts it)."""
    from circuitstat.pipelines.kinds import kind

    ops = float(kind(name).flops(spec, cfg))
    hours = ops / WORK_RATE / 3600
    check_work(ops, f"this {name} run (priced by the --plan arithmetic: about {hours:.3g} h at {WORK_RATE:.0e} "
               "operations per second)", allow_large=allow_large, shrink=shrink)
    return ops


WORK_RATE = 1e10
"""Operations per second the work limit assumes (circuitstat.circuits.limits.MAX_WORK: 1e15, about a day)."""


def sample_size_operations(n0: int, n_edges: int, ns: Any, *, n_datasets: int, n_resamples: int, n_ks: int,
                           edge_claims: bool = False) -> tuple[float, float]:
    """(operations, peak bytes) of ``sample-size`` on a pilot of ``n0`` prompts x ``n_edges`` edges at each N of
    ``ns``: per N and N // 2 the stability prediction's simulated datasets (index draws of N rows and their W.P means over the
    pilot, circuitstat.stats.sample_size.predict_stability), then, from N = MIN_OBS on, ``n_datasets`` simulated
    datasets [N, E] each with the audit's bootstrap of ``n_resamples`` resamples (edge intervals too with
    ``edge_claims``) and their top-k at ``n_ks`` sizes; the peak holds one index draw, one dataset and its plan."""
    import inspect

    from circuitstat.stats.sample_size import predict_stability
    from circuitstat.stats.stability_data import MIN_OBS

    defaults = inspect.signature(predict_stability).parameters
    n_sim, n_outer = int(defaults["n_sim"].default), int(defaults["n_outer"].default)
    draws = 4 * n_sim + n_outer * n_sim  # point and plug-in (2 n_sim each), and every refit's n_sim
    B, E, total, peak = int(n_resamples), int(n_edges), 0.0, 0.0
    ns = [int(v) for v in ns]
    for m in sorted(set(ns) | {N // 2 for N in ns}):  # J_N and the primary J_{N/2} are each predicted by simulation
        total += draws * (m + 2 * n0 * E) + n_outer * n0 * E
        peak = max(peak, 2 * n_sim * m * 8.0)
    for N in ns:
        if N < MIN_OBS:
            continue
        per = 4 * N * E + 2 * B * N + 2 * B * N * E * (5 if edge_claims else 1) + n_ks * B * E + PER_CALL
        total += n_datasets * per
        peak = max(peak, N * E * 8.0 + B * N * 12.0)
    return float(total), float(peak)


def check_sample_size(n0: int, n_edges: int, ns: Any, *, n_datasets: int, n_resamples: int, n_ks: int,
                      edge_claims: bool = False, allow_large: bool = False) -> float:
    """The estimated operations of ``sample-size`` (:func:`sample_size_operations`); InputError above the memory or
    work limit (``allow_large`` lifts both), before anything is simulated."""
    from circuitstat.circuits.limits import check_bytes

    ops, peak = sample_size_operations(n0, n_edges, ns, n_datasets=n_datasets, n_resamples=n_resamples, n_ks=n_ks,
                                       edge_claims=edge_claims)
    what = (f"sample-size up to N = {max(int(v) for v in ns):,} ({n_datasets:,} datasets x {n_resamples:,} "
            f"resamples on {n_edges:,} edges)")
    check_bytes(peak, what, allow_large=allow_large)
    check_work(ops, what, allow_large=allow_large, shrink="--n, --datasets, --resamples or --k")
    announce("sample-size", ops)
    return ops
