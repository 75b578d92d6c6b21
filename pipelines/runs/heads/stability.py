"""Cross-seed stability of attention heads and of the residual stream (Bali et al. 2026): orchestration.

Given K refits of one architecture (models that differ only by their training seed or recipe),
:class:`HeadStability` (a scikit-learn style estimator: parameters in ``__init__``,
``fit(models)`` returns the estimator with the result in ``result_``) measures how reproducible
each attention head is. This module loads models, builds the probe set (``circuitstat.circuits.probes``),
reads the models out (``circuitstat.circuits.readouts``) and hands the stages' outputs to
:mod:`circuitstat.pipelines.runs.heads.result`, which assembles the tables; every statistic is computed in
``circuitstat.stats.head_stability``, ``circuitstat.stats.head_pairs``, ``circuitstat.stats.head_nulls`` and ``circuitstat.stats.similarity``:

* a head's representation on a probe prompt is the lower triangle (with diagonal) of its
  attention pattern; the similarity of two heads is the cosine per prompt averaged over prompts;
* a head's **stability** is the mean, over the other refits, of its best match among the heads
  of the same layer of that refit (``match='max'``, the paper's choice) or of its one-to-one
  Hungarian partner (``match='hungarian'``). ``pairs='anchor'`` (the paper) compares one anchor
  refit with every other; ``pairs='all'`` makes every refit the anchor in turn for the layer-level
  numbers (the per-head rows stay those of the anchor refit, whose heads they index);
* **layer stability** is the mean over a layer's heads, the **gap** is max − min over layers;
  **distinctness** = 1 − mean similarity to the other heads of its own layer; the **cross-layer
  best match** searches every layer of the other refit;
* **importance**: the rise in perplexity when the head's output is zero-ablated, and its
  correlation with stability per layer (Fisher-z CI, permutation p-value);
* the **residual stream**: linear, RBF (median bandwidth) and debiased CKA between refits at an
  explicit hook (``pre``: the input of a layer; ``post``: after its attention), per layer.

Intervals, each labelled with its estimand (``ESTIMANDS``, also in the tables' metadata):

* ``refit_ci_low/high`` (heads, layers, residual, and the summary rows that say so): stability
  over the distribution of training seeds. Every refit is an anchor in turn (layers: jackknife
  over refits of the all-pairs mean, t on K − 1 df; heads: t interval over the anchor's
  comparison refits, anchor fixed); ``n_refits`` says how many refits it rests on (>= 3 needed).
  Chosen by simulated coverage (tests/stats/test_head_stability_coverage.py).
* ``excess`` = stability − null, with ``excess_ci_low/high`` over refits in the same way: a
  claim about stability is a claim about excess over the null.
* ``ci_low/ci_high``: the bootstrap of the paper's setting (prompts with replacement and the
  anchor's comparison refits, ``ci_over``); the anchor is fixed, so it is not an interval for
  the seed distribution. CKA's prompt resampling is half-sampling without replacement
  (duplicated rows bias CKA upwards).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from circuitstat.circuits.probes import ProbeSet, build_probe
from circuitstat.core.estimator import Estimator
from circuitstat.core.seeds import as_seed_sequence, spawn_seeds
from circuitstat.stats.head_nulls import (importance_correlations, layer_summaries_with_shuffled_gap, prompt_null_pairs,
                              untrained_null_pairs)
from circuitstat.stats.head_pairs import (PairSimilarities, null_means, pair_similarities, quiet_nanmean, residual_cka,
                              untrained_null_scores)
from circuitstat.stats.head_stability import (CKA_KINDS, all_pairs_layer_stability, anchor_head_stability,
                                  cross_layer_best_match, fisher_interval, head_distinctness_from_similarity,
                                  matched_similarity, pair_matrix, percentile_interval, permutation_correlation,
                                  perplexity_rise, prompt_resampled_similarity, refit_bootstrap_counts,
                                  refit_level_summaries, refit_pair_weights)
from circuitstat.stats.resampling import ResamplingPlan
from circuitstat.stats.similarity import match_heads

from circuitstat.pipelines.sources import LOCAL
from circuitstat.pipelines.runs.heads.result import (FitContext, ESTIMANDS, HeadStabilityResult, refit_replicates, refits_table, result_params,
                          result_tables, summary_rows)
from circuitstat.pipelines.kinds import RunKind
from circuitstat.core.params import BATCH_SIZE, N_JOBS, N_RESAMPLES, SEED

KIND_NAME = "heads"
"""This run kind's name (circuitstat.pipelines.kinds), by which core.params names its defaults."""

__all__ = [
    "write_heads_run",
    "ProbeSet",
    "build_probe",
    "fisher_interval",
    "permutation_correlation",
    "HeadStability",
    "HeadStabilityResult",
    "ESTIMANDS",
]


MATCHES = ("max", "hungarian")
PAIRS = ("anchor", "all")
NULLS = ("prompts", "untrained", "none")
HOOKS = ("pre", "post")
CI_OVER = ("both", "prompts", "refits")


def _input_error(msg: str) -> Exception:
    from circuitstat.core.errors import InputError

    return InputError(msg)


def _blas_threads(n: int):
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(limits=n, user_api="blas")


# =============================================================================================
# Read-outs and pair similarities
# =============================================================================================
def _untrained_null(models: list, patterns: list[np.ndarray], ids: np.ndarray, match: str, drop_bos: bool,
                    n_models: int, seed: np.random.SeedSequence, batch_size: int) -> tuple[np.ndarray, list[int]]:
    """Return each refit's matched score against untrained models ``[K, L, H]`` and their seeds."""
    from circuitstat.circuits.model import CircuitModel
    from circuitstat.circuits.readouts import attention_patterns

    seeds = [int(s.generate_state(1)[0]) for s in spawn_seeds(seed, n_models)]
    untrained = [attention_patterns(CircuitModel(models[0].cfg).init_weights(s).to(models[0].device).eval(), ids,
                                    batch_size) for s in seeds]
    return untrained_null_scores(patterns, untrained, match, drop_bos), seeds




# =============================================================================================
# Estimator
# =============================================================================================


class HeadStability(Estimator):
    """Cross-seed head stability estimator (scikit-learn style: parameters here, ``fit(models)``).

    The old names ``n_boot``, ``n_boot_cka``, ``n_perm`` and ``random_state`` are still accepted, with a
    warning naming the new one.

    Parameters
    ----------
    match : 'max' (the paper) or 'hungarian' (one-to-one).
    pairs : 'anchor' (the paper: one anchor refit against each other) or 'all' (every refit an
        anchor in turn for the layer-level numbers). The refit-level intervals always use every
        refit as an anchor.
    anchor : index of the anchor refit.
    drop_bos : drop the first (BOS) column of every pattern before the cosine.
    null : 'prompts' (prompts of the other refit shuffled), 'untrained' (matching against
        independently initialised untrained models of the same architecture) or 'none'.
    n_null : permutations (prompts null) or untrained models (untrained null; default K − 1).
    n_resamples : bootstrap replicates of the paper's interval; ``n_resamples_cka`` half-samples for CKA
        (default ``n_resamples``); ``ci_over``: 'both' (prompts and refits jointly), 'prompts' or
        'refits'. ``confidence_level`` of every interval.
    importance : compute zero-ablation importance of every head.
    residual, hooks, cka, cka_tokens : residual-stream CKA at ``hooks`` ('pre', 'post') with
        ``cka`` kinds on ``cka_tokens`` positions per prompt.
    corr_refits : correlate stability with importance over the anchor's heads only ('anchor') or
        over the heads of every refit, centred within refit ('all').
    corr : 'pearson' or 'spearman'; ``n_permutations`` random permutations.
    n_probe, probe_len, bos, probe_file, corpus, probe_seed : the default probe set (see
        :func:`build_probe`); ``fit(models, probe=...)`` overrides it.
    batch_size : prompts per forward pass. seed : seed of every random draw.
    n_jobs : BLAS / torch threads inside fit.
    """

    _renamed = {"n_boot": "n_resamples", "n_boot_cka": "n_resamples_cka", "n_perm": "n_permutations",
                "random_state": "seed"}

    def __init__(self, match: str = "max", pairs: str = "anchor", anchor: int = 0, drop_bos: bool = False,
                 null: str = "prompts", n_null: int | None = None,
                 n_resamples: int = N_RESAMPLES.default_for(KIND_NAME),
                 n_resamples_cka: int | None = None,
                 ci_over: str = "both", confidence_level: float = 0.95, importance: bool = True,
                 residual: bool = True, hooks: Sequence[str] = ("pre", "post"), corr_refits: str = "all",
                 cka: Sequence[str] = ("linear", "rbf", "debiased"), cka_tokens: int = 4, corr: str = "pearson",
                 n_permutations: int = 9999, n_probe: int = 100, probe_len: int | None = None, bos: bool = True,
                 probe_file: str | None = None, corpus: Any = None, probe_seed: int = 0,
                 batch_size: int = BATCH_SIZE.default_for(KIND_NAME), seed: int | None = SEED.default,
                 n_jobs: int = N_JOBS.default) -> None:
        self.match = match
        self.pairs = pairs
        self.anchor = anchor
        self.drop_bos = drop_bos
        self.null = null
        self.n_null = n_null
        self.n_resamples = n_resamples
        self.n_resamples_cka = n_resamples_cka
        self.ci_over = ci_over
        self.confidence_level = confidence_level
        self.importance = importance
        self.residual = residual
        self.hooks = hooks
        self.corr_refits = corr_refits
        self.cka = cka
        self.cka_tokens = cka_tokens
        self.corr = corr
        self.n_permutations = n_permutations
        self.n_probe = n_probe
        self.probe_len = probe_len
        self.bos = bos
        self.probe_file = probe_file
        self.corpus = corpus
        self.probe_seed = probe_seed
        self.batch_size = batch_size
        self.seed = seed
        self.n_jobs = n_jobs

    def tables(self) -> dict:
        """Return the fitted result's tables (``result_.tables()``), for callers of the former fit API."""
        return self.result_.tables()

    def _validate(self) -> None:
        for name, val, allowed in (("match", self.match, MATCHES), ("pairs", self.pairs, PAIRS),
                                   ("corr_refits", self.corr_refits, ("anchor", "all")),
                                   ("null", self.null, NULLS), ("ci_over", self.ci_over, CI_OVER),
                                   ("corr", self.corr, ("pearson", "spearman"))):
            if val not in allowed:
                raise _input_error(f"{name}={val!r} is not supported; use one of {', '.join(allowed)}")
        for h in self.hooks:
            if h not in HOOKS:
                raise _input_error(f"hook {h!r} is not supported; use 'pre' (before attention) or 'post' (after attention)")
        for k in self.cka:
            if k not in CKA_KINDS:
                raise _input_error(f"CKA kind {k!r} is not supported; use {', '.join(CKA_KINDS)}")
        for name in ("n_resamples", "n_resamples_cka"):
            if getattr(self, name) is not None:
                N_RESAMPLES.check(getattr(self, name), name)
        if not 0 < self.confidence_level < 1:
            raise _input_error("confidence_level must be in (0, 1)")

    # -- inputs -------------------------------------------------------------------------------
    @staticmethod
    def _load(models) -> list:
        return [LOCAL.load(m) if isinstance(m, (str, os.PathLike)) else m for m in models]

    def _probe(self, models, probe) -> ProbeSet:
        if probe is not None:
            return probe if isinstance(probe, ProbeSet) else ProbeSet.from_ids(np.asarray(probe), bos=self.bos)
        toks = [getattr(m, "tokenizer", None) for m in models]
        hashes = {getattr(t, "content_hash", None) for t in toks if t is not None}
        if len(hashes) > 1:
            raise _input_error("the models have different tokenizers; head stability needs one shared tokenizer")
        tok = next((t for t in toks if t is not None), None)
        n_ctx = min(m.cfg.n_ctx for m in models)
        length = min(64, n_ctx) if self.probe_len is None else int(self.probe_len)
        if length > n_ctx:
            raise _input_error(f"probe length {length} exceeds the models' context n_ctx={n_ctx}")
        corpus = self.corpus
        if corpus is None and self.probe_file is None:
            from circuitstat.circuits.corpus import load_corpus

            hashes = {getattr(m, "meta", {}).get("training", {}).get("corpus_hash") for m in models} - {None}
            corpus = load_corpus("stdlib")
            if hashes and hashes != {corpus.content_hash}:
                raise _input_error("the models were trained on a corpus other than this Python's standard library; "
                                   "pass the corpus (--corpus) so the probe snippets come from its held-out split, "
                                   "or a probe file")
        return build_probe(tok, n=self.n_probe, length=length, bos=self.bos, file=self.probe_file, corpus=corpus,
                           seed=self.probe_seed)

    def _context(self, models, probe) -> FitContext:
        """Return the shared state of a fit after checking the models and the probe set."""
        models = self._load(models)
        if len(models) < 2:
            raise _input_error(f"head stability needs at least 2 refits, got {len(models)}")
        cfg0 = models[0].cfg
        for m in models[1:]:
            if (m.cfg.n_layers, m.cfg.n_heads) != (cfg0.n_layers, cfg0.n_heads):
                raise _input_error("all refits must share one architecture (layers and heads per layer); got "
                                   f"{cfg0.n_layers}x{cfg0.n_heads} and {m.cfg.n_layers}x{m.cfg.n_heads}")
        if not 0 <= self.anchor < len(models):
            raise _input_error(f"anchor={self.anchor} is not a refit index (0..{len(models) - 1})")
        if cfg0.n_heads < 2:
            raise _input_error("head matching needs at least 2 heads per layer")
        probe_set = self._probe(models, probe)
        if probe_set.ids.max() >= min(m.cfg.vocab_size for m in models):
            raise _input_error("probe token ids exceed the models' vocabulary")
        root = as_seed_sequence(self.seed)
        seeds = dict(zip(("prompts", "refits", "null", "perm", "untrained", "cka"), spawn_seeds(root, 6)))
        n_resamples = int(self.n_resamples)
        prompt_plan = (ResamplingPlan.bootstrap(probe_set.n, n_resamples, seeds["prompts"])
                       if self.ci_over in ("both", "prompts") else None)
        target_counts, refit_counts = refit_bootstrap_counts(
            np.random.default_rng(seeds["refits"]), len(models), int(self.anchor), n_resamples,
            self.ci_over in ("both", "refits"))
        return FitContext(models, probe_set, int(self.anchor), cfg0.n_layers, cfg0.n_heads, seeds, root, n_resamples,
                        float(self.confidence_level), prompt_plan, target_counts, refit_counts)

    # -- fit ----------------------------------------------------------------------------------
    def fit(self, models: Sequence[Any], probe: ProbeSet | np.ndarray | None = None) -> "HeadStability":
        """Estimate stability over ``models`` (CircuitModels or sources); return self with ``result_``.

        BLAS and torch run with ``n_jobs`` threads inside fit (restored after): the matrices
        here are small, and oversubscribed threads on a busy machine cost 10-50x.
        """
        import torch

        self._validate()
        previous = torch.get_num_threads()
        torch.set_num_threads(max(1, int(self.n_jobs)))
        try:
            with _blas_threads(max(1, int(self.n_jobs))):
                self.result_ = self._fit(models, probe)
        finally:
            torch.set_num_threads(previous)
        return self

    def _fit(self, models, probe) -> HeadStabilityResult:
        from circuitstat.circuits.readouts import attention_patterns

        ctx = self._context(models, probe)
        ctx.patterns = [attention_patterns(m, ctx.probe.ids, self.batch_size) for m in ctx.models]
        sims = pair_similarities(ctx.patterns, ctx.anchor, self.drop_bos, ctx.prompt_plan, ctx.n_resamples)
        stability = self._stability(ctx, sims)
        null = self._nulls(ctx, sims)
        matched_pairs = pair_matrix(stability["matched"], sims.pairs, ctx.n_refits)  # [K, K, L, H]
        excess_pairs = None if null["pairs"] is None else matched_pairs - null["pairs"]
        refit_level = refit_level_summaries(matched_pairs, excess_pairs, ctx.confidence_level)
        shape = self._distinctness_and_cross_layer(ctx, sims)
        importance = self._importance(ctx, matched_pairs)
        residual = self._residual(ctx)
        # the layer summaries with the gap of heads shuffled across layers (child L + 1 of the perm seed;
        # children 0..L are the importance correlations')
        derived = layer_summaries_with_shuffled_gap(stability["layers"], stability["layer_reps"], stability["heads"],
                                                    stability["head_reps"],
                                                    spawn_seeds(ctx.seeds["perm"], ctx.n_layers + 2)[-1])
        summary = summary_rows(ctx, derived, null, refit_level, shape, importance, residual)
        replicates = {"layer": stability["layer_reps"], **derived[1], "head": stability["head_reps"],
                      **{f"resid:{k}": quiet_nanmean(v, axis=1) for k, v in residual["replicates"].items()}}
        tables = result_tables(ctx, self.pairs, stability, null, refit_level, matched_pairs, excess_pairs, shape,
                               importance, residual)
        return HeadStabilityResult(ctx.n_layers, ctx.n_heads, *tables, summary, refits_table(ctx), replicates,
                                   result_params(ctx, null, self.get_params()), refit_replicates(refit_level, residual))

    # -- stages -------------------------------------------------------------------------------
    def _stability(self, ctx: FitContext, sims: PairSimilarities) -> dict[str, Any]:
        """Return matched scores and the anchor's head / layer stability with bootstrap replicates."""
        matched = matched_similarity(sims.point, self.match)  # [n_pairs, L, H]
        matched_reps = matched_similarity(sims.replicates, self.match)  # [R, n_pairs, L, H]
        anchor_rows = np.array([sims.index(ctx.anchor, b) for b in ctx.targets])
        point_counts = np.zeros(ctx.n_refits)
        point_counts[ctx.targets] = 1.0
        heads = anchor_head_stability(matched, point_counts, anchor_rows, ctx.targets)
        head_reps = anchor_head_stability(matched_reps, ctx.target_counts, anchor_rows, ctx.targets)
        if self.pairs == "all":
            layers = all_pairs_layer_stability(matched, np.ones(ctx.n_refits), sims.pairs)
            layer_reps = all_pairs_layer_stability(matched_reps, ctx.refit_counts, sims.pairs)
        else:
            layers, layer_reps = quiet_nanmean(heads, axis=-1), quiet_nanmean(head_reps, axis=-1)
        match_index = {b: np.stack([match_heads(sims.point[sims.index(ctx.anchor, b), layer], self.match)[0]
                                    for layer in range(ctx.n_layers)]) for b in ctx.targets}
        # the same head stability with one source of uncertainty only (for the detail table)
        only_prompts = anchor_head_stability(matched_reps, np.broadcast_to(point_counts, ctx.target_counts.shape),
                                             anchor_rows, ctx.targets)
        only_refits = anchor_head_stability(np.broadcast_to(matched, matched_reps.shape), ctx.target_counts,
                                            anchor_rows, ctx.targets)
        return {"matched": matched, "heads": heads, "head_reps": head_reps, "layers": layers,
                "layer_reps": layer_reps, "match_index": match_index, "only_prompts": only_prompts,
                "only_refits": only_refits}

    def _nulls(self, ctx: FitContext, sims: PairSimilarities) -> dict[str, Any]:
        """Return the null matched scores: per ordered pair ``[K, K, L, H]``, the anchor's heads and layers."""
        nan_heads = np.full((ctx.n_layers, ctx.n_heads), np.nan)
        out = {"pairs": None, "head": nan_heads, "layer": np.full(ctx.n_layers, np.nan), "description": self.null}
        sources = list(range(ctx.n_refits)) if self.pairs == "all" else [ctx.anchor]
        if self.null == "prompts":
            n_null = 50 if self.n_null is None else int(self.n_null)
            out["pairs"] = prompt_null_pairs(ctx.patterns, ctx.anchor, sims.pairs, self.match, self.drop_bos, n_null,
                                             ctx.seeds["null"], self.n_jobs)
            out["description"] = f"prompts of the other refit shuffled ({n_null} permutations)"
        elif self.null == "untrained":
            n_models = max(2, ctx.n_refits - 1) if self.n_null is None else int(self.n_null)
            per_refit, seeds = _untrained_null(ctx.models, ctx.patterns, ctx.probe.ids, self.match, self.drop_bos,
                                               n_models, ctx.seeds["untrained"], self.batch_size)
            out["pairs"] = untrained_null_pairs(per_refit)
            out["description"] = f"independently initialised untrained models ({n_models}, seeds {seeds})"
        if out["pairs"] is not None:
            out["head"], out["layer"] = null_means(out["pairs"], ctx.anchor, ctx.targets, sources)
        return out

    def _distinctness_and_cross_layer(self, ctx: FitContext, sims: PairSimilarities) -> dict[str, np.ndarray]:
        """Return the anchor's distinctness and cross-layer best match, point and bootstrap replicates."""
        self_point = prompt_resampled_similarity(sims.anchor_self, None)[0]
        self_reps = (prompt_resampled_similarity(sims.anchor_self, ctx.prompt_plan) if ctx.prompt_plan is not None
                     else np.broadcast_to(self_point, (ctx.n_resamples,) + self_point.shape))
        point = {b: prompt_resampled_similarity(sims.anchor_cross[b], None)[0] for b in ctx.targets}
        reps = {b: (prompt_resampled_similarity(sims.anchor_cross[b], ctx.prompt_plan) if ctx.prompt_plan is not None
                    else point[b][None]) for b in ctx.targets}
        return {"distinctness": head_distinctness_from_similarity(self_point),
                "distinctness_reps": head_distinctness_from_similarity(self_reps),
                **cross_layer_best_match(point, reps, ctx.target_counts, ctx.n_layers, ctx.n_heads)}

    def _importance(self, ctx: FitContext, matched_pairs: np.ndarray) -> dict[str, Any]:
        """Return the anchor's importance with bootstrap interval and the stability-importance correlations."""
        from circuitstat.circuits.readouts import head_importance

        nan_heads = np.full((ctx.n_layers, ctx.n_heads), np.nan)
        out: dict[str, Any] = {"value": nan_heads, "low": nan_heads, "high": nan_heads, "rows": []}
        if not self.importance:
            return out
        every = self.pairs == "all" or self.corr_refits == "all"
        sources = list(range(ctx.n_refits)) if every else [ctx.anchor]
        by_source = {}
        for a in sources:
            clean, ablated = head_importance(ctx.models[a], ctx.probe.ids, self.batch_size)
            by_source[a] = perplexity_rise(clean, ablated)
            if a == ctx.anchor:
                plan = ctx.prompt_plan or ResamplingPlan.from_counts(np.ones((ctx.n_resamples, ctx.probe.n), np.int64))
                out["low"], out["high"] = percentile_interval(perplexity_rise(clean, ablated, plan),
                                                              ctx.confidence_level)
        out["value"] = by_source[ctx.anchor]
        out["rows"] = importance_correlations(matched_pairs, by_source, method=self.corr,
                                              n_permutations=self.n_permutations,
                                              seed=ctx.seeds["perm"], confidence_level=ctx.confidence_level)
        return out

    def _residual(self, ctx: FitContext) -> dict[str, Any]:
        """Return residual-stream CKA per layer, hook and kind: point, half-sample replicates, refit-level."""
        from circuitstat.circuits.readouts import cka_positions, residual_rows

        out: dict[str, Any] = {"rows": [], "replicates": {}, "refit": {}}
        if not (self.residual and self.hooks and self.cka):
            return out
        positions = cka_positions(ctx.probe.length, self.cka_tokens)
        rows = [residual_rows(m, ctx.probe.ids, positions, self.hooks, self.batch_size) for m in ctx.models]
        point_pairs = ([(a, b) for a, b in zip(*np.triu_indices(ctx.n_refits, 1))] if self.pairs == "all"
                       else [(ctx.anchor, b) for b in ctx.targets])
        n_half = (ctx.n_resamples if self.n_resamples_cka is None
                  else max(1, min(ctx.n_resamples, int(self.n_resamples_cka))))
        plan = (ResamplingPlan.subsample(ctx.probe.n, n_half, ctx.seeds["cka"])
                if self.ci_over in ("both", "prompts") and ctx.probe.n >= 4 else None)
        # refits drawn by the bootstrap weight each pair's CKA (the first n_half replicates' draws)
        pair_weights = refit_pair_weights(ctx.refit_counts[:n_half] if self.pairs == "all" else ctx.target_counts[:n_half],
                                          point_pairs, both_sides=self.pairs == "all")
        for hook in self.hooks:
            by_layer = [{m: rows[m][hook][layer] for m in range(ctx.n_refits)} for layer in range(ctx.n_layers)]
            for kind in self.cka:
                r = residual_cka(by_layer, point_pairs, kind, positions.size, plan, n_half, pair_weights,
                                 ctx.confidence_level)
                out["replicates"][f"{kind}:{hook}"] = r["replicates"]
                out["refit"][f"{kind}:{hook}"] = {k: r[k] for k in ("estimate", "leave_one_out", "mean_interval")}
                for layer in range(ctx.n_layers):
                    out["rows"].append({"layer": layer, "hook": hook, "kind": kind, "cka": r["point"][layer].mean(),
                                        "ci_low": r["boot_low"][layer], "ci_high": r["boot_high"][layer],
                                        "cka_all_pairs": r["estimate"][layer], "refit_ci_low": r["low"][layer],
                                        "refit_ci_high": r["high"][layer], "n_refits": ctx.n_refits,
                                        "interval_reliable": r["interval_reliable"]})
        return out


def write_heads_run(result: HeadStabilityResult, out: str | os.PathLike, *, spec: Any = None, command: Any = None,
                    force: bool = False) -> dict:
    """Write ``result``'s tables into run directory ``out`` as its resumable stage ``heads``; return their paths.

    A rerun with another spec, other models or another probe set is refused (StageSpecChangedError)
    unless ``force``: the directory never mixes two fits.
    """
    from circuitstat.core.rundir import RunDir

    prov = result.table_provenance()
    spec = spec if spec is not None else {k: v for k, v in result.params.items() if k != "models"}
    seed = result.params.get("seed")
    # the run's kind recorded, so that `heads` can resume or --force its own run (check_run_out refuses a kindless one)
    with RunDir(out, spec=spec, command=command, seed=seed if isinstance(seed, int) else None, kind=KIND_NAME,
                provenance={"models": prov["models"], "probe": prov["probe"]}) as run:
        return run.stage("heads", lambda: result.write(run) and None, result.table_names(),
                         params={"spec": spec, "weights": [m.get("weight_hash") for m in prov["models"]],
                                 "probe": prov["probe"].get("sha256")}, force=force)


@dataclass(frozen=True)
class HeadsRun:
    """A ``heads`` run: its estimator (every option) and the sources of the refits it compares (the first is the
    anchor)."""

    estimator: HeadStability
    models: tuple[str, ...]

    @property
    def sources(self) -> list[str]:
        """The model sources, in order."""
        return list(self.models)


def run_heads(spec: HeadsRun, out: str | os.PathLike, *, device: str = "cpu", force: bool = False,
              command: Any = None, allow_pickle: bool = False, allow_large: bool = False,
              inputs: Any = None) -> HeadStabilityResult:
    """The HeadStabilityResult of the heads run ``spec`` written into ``out``: the kind's run (its work is checked
    before the probe set is built or a model runs)."""
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.build import check_device
    from circuitstat.pipelines.kinds import check_run_out
    from circuitstat.pipelines.sources import LOCAL
    from circuitstat.pipelines.work import check_heads

    if len(spec.models) < 2:
        raise InputError("pass at least 2 models (--models DIR --models DIR ..., or --models DIR,DIR,...)")
    check_run_out(out, KIND_NAME, force=force)
    device, inputs = check_device(device), inputs or LOCAL
    loaded = [inputs.load(m, device=device, allow_pickle=allow_pickle, allow_large=allow_large) for m in spec.models]
    est = spec.estimator
    check_heads(est, loaded, allow_large=allow_large)
    res = est.fit(loaded).result_
    # threads change no result: the spec (which a rerun must match) leaves them out
    params = {k: v for k, v in est.get_params().items() if k != "n_jobs"}
    write_heads_run(res, out, spec={"models": list(spec.models), **params}, command=command, force=force)
    return res


KIND = RunKind(KIND_NAME, "cross-seed stability of attention heads and of the residual stream", run=run_heads)
