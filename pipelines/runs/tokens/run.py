"""Token contribution weights and attention sinks as an estimator (issue 16): orchestration only.

:class:`TokenContributions` (scikit-learn style: parameters in ``__init__``; ``fit(model)``
returns the estimator with ``result_``) runs two stages:

1. **read-outs** (torch, ``circuitstat.circuits.contributions``): on the task's clean prompts, each measure's
   token importance at the read-out position (attention, value_norm, contribution, grad_input),
   the metric drop when the top-k tokens of each measure (and of ``n_random`` random orders, the
   null ``random``: their mean drop per prompt) are ablated, and per prompt and head the sink
   share, the mean output norm and the confidence gap. Per-prompt tables: ``token_weights``,
   ``token_drops``, ``sink_prompts``.
2. **statistics** (numpy, ``circuitstat.stats.token_importance`` and ``circuitstat.stats.sinks``) from those tables alone:
   ``token_importance``, ``token_importance_diffs``, ``sink_heads``, ``sink_fit`` and ``summary``.

``run(model, out)`` writes both stages to a run directory (circuitstat.core.rundir.RunDir): a killed run
resumes from the stage it finished, and a changed spec is refused unless ``force``.
``cross_seed(models, out)`` runs refits of one recipe into ``out/model-<i>/`` and compares them:
``token_stability`` (do the seeds pick the same top-k tokens? against hypergeometric chance),
``sink_stability`` (rank-matched sink rates per layer, number of sink heads, the relation per seed) and
``sink_matching`` (are the sink heads the same heads? heads matched across seeds by attention pattern as
in the head study, ``circuitstat.stats.sink_matching``, against a random one-to-one matching).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.estimator import Estimator
from circuitstat.core.results import Result
from circuitstat.core.seeds import as_seed_sequence, seed_record, spawn_seeds
from circuitstat.stats.resampling import ResamplingPlan
from circuitstat.stats.sinks import DEFAULT_THRESHOLD, SinkResult, confidence_gap, position_means, sink_relation, sink_shares
from circuitstat.stats.token_importance import TokenImportanceResult, token_importance_faithfulness
from circuitstat.pipelines.kinds import RunKind
from circuitstat.core.params import BATCH_SIZE, N_RESAMPLES, SEED

KIND_NAME = "tokens"
"""This run kind's name (circuitstat.pipelines.kinds), by which core.params names its defaults."""

__all__ = ["TokenContributions", "ContributionsResult", "CrossSeedResult", "READOUT_TABLES", "STAT_TABLES", "MEASURES",
           "RANDOM"]

#: the importance measures (circuitstat.circuits.contributions.MEASURES, written out so this module loads without torch)
MEASURES = ("attention", "value_norm", "contribution", "grad_input")
#: what ablating a token means (circuitstat.circuits.contributions.TOKEN_ABLATIONS, written out for the same reason)
TOKEN_ABLATIONS = ("zero", "mean", "mask")
RANDOM = "random"
MAX_RANDOM_ORDERS = 1000  # random token orders per prompt (the null), without --allow-large
READOUT_TABLES = ("token_weights", "token_drops", "sink_prompts")
#: cross-seed sink matching drops the first (BOS) column of the patterns: with it every sink head resembles every
#: other and the sink agreement would be built into the matching (docs/results.md, "Token contributions and
#: attention sinks")
MATCH_DROP_BOS = True
STAT_TABLES = ("token_importance", "token_importance_diffs", "sink_heads", "sink_fit", "summary")


# =============================================================================================
# Per-prompt read-outs <-> tables
# =============================================================================================
@dataclass
class Readouts:
    """Per-prompt arrays of stage 1: token importance [N, M, P], drops [N, M + 1, K], sink arrays [N, U]."""

    measures: tuple[str, ...]
    ks: tuple[int, ...]
    importance: np.ndarray
    tokens: np.ndarray
    mask: np.ndarray
    candidates: np.ndarray
    readout: np.ndarray
    drops: np.ndarray
    n_ablated: np.ndarray
    head_names: list[str]
    sink_share: np.ndarray
    output_norm: np.ndarray
    gap: np.ndarray

    def tables(self) -> dict[str, dict[str, Any]]:
        """Return the per-prompt tables ``token_weights``, ``token_drops``, ``sink_prompts`` as columns."""
        N, M, P = self.importance.shape
        n_idx, p_idx = np.nonzero(self.mask)  # real tokens up to each read-out, prompt-major
        weights: dict[str, Any] = {"prompt": n_idx.astype(np.int64), "position": p_idx.astype(np.int64),
                                   "token": self.tokens[n_idx, p_idx].astype(np.int64),
                                   "is_readout": p_idx == self.readout[n_idx],
                                   "candidate": self.candidates[n_idx, p_idx]}
        for mi, m in enumerate(self.measures):
            weights[m] = self.importance[n_idx, mi, p_idx]
        names = (*self.measures, RANDOM)
        K = len(self.ks)
        drops = {"prompt": np.repeat(np.arange(N, dtype=np.int64), len(names) * K),
                 "measure": np.tile(np.repeat(np.array(names, dtype=str), K), N),
                 "k": np.tile(np.array(self.ks, dtype=np.int64), N * len(names)),
                 "drop": self.drops.reshape(-1),
                 "n_ablated": np.repeat(self.n_ablated, len(names), axis=0).reshape(-1).astype(np.int64)}
        U = len(self.head_names)
        layer = np.array([int(h.split(".")[0][1:]) for h in self.head_names], dtype=np.int64)
        head = np.array([int(h.split(".h")[1]) for h in self.head_names], dtype=np.int64)
        sinks = {"prompt": np.repeat(np.arange(N, dtype=np.int64), U), "layer": np.tile(layer, N),
                 "head": np.tile(head, N), "sink_share": self.sink_share.reshape(-1),
                 "output_norm": self.output_norm.reshape(-1), "confidence_gap": self.gap.reshape(-1)}
        return {"token_weights": weights, "token_drops": drops, "sink_prompts": sinks}


def _drops_from_table(drops, measures: Sequence[str], ks: Sequence[int]) -> np.ndarray:
    """Return [N, M, K] drops from a ``token_drops`` table (pyarrow), in the given measure and k order."""
    d = drops.to_pydict()
    N = max(d["prompt"]) + 1
    out = np.full((N, len(measures), len(ks)), np.nan)
    mi = {m: i for i, m in enumerate(measures)}
    ki = {k: i for i, k in enumerate(ks)}
    for n, m, k, v in zip(d["prompt"], d["measure"], d["k"], d["drop"]):
        if m in mi and k in ki:
            out[n, mi[m], ki[k]] = v
    return out


def _sinks_from_table(sinks) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Return head names and [N, U] share, norm and gap from a ``sink_prompts`` table."""
    d = {k: np.asarray(v) for k, v in sinks.to_pydict().items()}
    heads = sorted(set(zip(d["layer"].tolist(), d["head"].tolist())))
    names = [f"a{layer}.h{head}" for layer, head in heads]
    col = {h: i for i, h in enumerate(heads)}
    N = int(d["prompt"].max()) + 1
    arrays = [np.full((N, len(heads)), np.nan) for _ in range(3)]
    cols = [col[(int(a), int(b))] for a, b in zip(d["layer"], d["head"])]
    for arr, key in zip(arrays, ("sink_share", "output_norm", "confidence_gap")):
        arr[d["prompt"], cols] = d[key]
    return names, *arrays


# =============================================================================================
# Result
# =============================================================================================
@dataclass(repr=False)
class ContributionsResult(Result):
    """Token-importance faithfulness and attention sinks; ``tables()`` gives every stat table and ``summary``."""

    importance: TokenImportanceResult
    sinks: SinkResult
    params: dict = field(default_factory=dict)
    main_table = "token_importance"

    def summary_rows(self) -> list[dict[str, Any]]:
        """Return the one-screen rows: each measure against the others at every k, and the sink relation."""
        rows = []
        if self.importance.differences is not None:
            diffs = self.importance.to_pandas("token_importance_diffs")
            for r in diffs.itertuples():
                rows.append({"item": f"drop {r.measure_a} - {r.measure_b} at k={r.k}", "value": r.difference,
                             "ci_low": r.ci_low, "ci_high": r.ci_high, "verdict": r.verdict, "pvalue": r.pvalue,
                             "pvalue_holm": r.pvalue_holm, "interval": self.importance.drops.method,
                             "multiplicity": r.multiplicity})
        for term in ("curvature", "spearman"):
            f = self.sinks.fit[term]
            rows.append({"item": f"sink rate vs output norm: {term}", "value": f["estimate"], "ci_low": f["ci_low"],
                         "ci_high": f["ci_high"], "verdict": f["verdict"], "pvalue": np.nan, "pvalue_holm": np.nan,
                         "interval": f["interval"], "multiplicity": f["multiplicity"]})
        return rows

    def _tables(self) -> dict[str, dict[str, Any]]:
        rows = self.summary_rows()
        summary = {k: np.array([r[k] for r in rows], dtype=np.float64)
                   for k in ("value", "ci_low", "ci_high", "pvalue", "pvalue_holm")}
        for k in ("item", "verdict", "interval", "multiplicity"):
            summary[k] = np.array([str(r[k]) for r in rows], dtype=str)
        order = ("item", "value", "ci_low", "ci_high", "verdict", "pvalue", "pvalue_holm", "interval", "multiplicity")
        return {**self.importance._tables(), **self.sinks._tables(), "summary": {k: summary[k] for k in order}}

    def _summary_items(self) -> list[tuple[str, Any]]:
        return self.importance._summary_items() + self.sinks._summary_items()[1:]


# =============================================================================================
# Estimator
# =============================================================================================
class TokenContributions(Estimator):
    """Token-importance faithfulness of contribution weights against attention, and attention sinks.

    Parameters
    ----------
    task, n, task_seed, metric, task_options : the task (``circuitstat.pipelines.build.build_task``).
    ks : numbers of top tokens ablated. measures : importance measures compared (plus ``random``).
    n_random : random orders per prompt averaged into the ``random`` null.
    ablation : 'zero' (token embedding set to 0, position kept), 'mean' (mean token embedding) or 'mask'
        (token hidden from attention in every layer, every token keeping its position; needs
        exclude_readout; grad_input then keeps the zero-embedding baseline).
    exclude_first, exclude_readout : never ablate the first token / the read-out token.
    pairs : the paired differences tested, as ``"a:b"`` (drop_a − drop_b), e.g.
        ``("contribution:attention", "contribution:random")``; default every pair of measures and
        ``random``. The Holm family is exactly these pairs at every k, so fewer pairs, more power.
    sink : 'first' (the first token) or 'detected' (per prompt, the most attended key).
    sink_threshold : attention to the sink above which a position counts as sinking.
    n_resamples, confidence_level, alpha : intervals over prompts and the Holm family-wise level.
    batch_size : prompts per forward. seed : root seed of every random draw (``random_state``, its old
        name, is still accepted with a warning).
    """

    _renamed = {"random_state": "seed"}

    def __init__(self, task: str = "induction", n: int = 64, task_seed: int = 0, metric: str | None = None,
                 task_options: dict | None = None, ks: Sequence[int] = (1, 2, 3, 5), measures: Sequence[str] = MEASURES,
                 n_random: int = 5, ablation: str = "zero", exclude_first: bool = False, exclude_readout: bool = False,
                 pairs: Sequence[str] | None = None, sink: str = "first", sink_threshold: float = DEFAULT_THRESHOLD,
                 n_resamples: int = N_RESAMPLES.default_for(KIND_NAME),
                 confidence_level: float = 0.95, alpha: float = 0.05,
                 batch_size: int = BATCH_SIZE.default_for(KIND_NAME), seed: int | None = SEED.default) -> None:
        self.task = task
        self.n = n
        self.task_seed = task_seed
        self.metric = metric
        self.task_options = task_options
        self.ks = ks
        self.measures = measures
        self.n_random = n_random
        self.ablation = ablation
        self.exclude_first = exclude_first
        self.exclude_readout = exclude_readout
        self.pairs = pairs
        self.sink = sink
        self.sink_threshold = sink_threshold
        self.n_resamples = n_resamples
        self.confidence_level = confidence_level
        self.alpha = alpha
        self.batch_size = batch_size
        self.seed = seed

    def validate(self) -> None:
        """None; InputError naming the first bad parameter (checked before any model work)."""
        bad = [m for m in self.measures if m not in MEASURES]
        if bad or not self.measures or len(set(self.measures)) != len(self.measures):
            raise InputError(f"measures {list(self.measures)} must be distinct names from {', '.join(MEASURES)}")
        if not self.ks or any(isinstance(k, bool) or int(k) != k or k < 1 for k in self.ks) or \
                len(set(self.ks)) != len(self.ks):
            raise InputError(f"ks {list(self.ks)} must be distinct positive integers, e.g. 1,2,3,5")
        for name, value, allowed in (("ablation", self.ablation, TOKEN_ABLATIONS),
                                     ("sink", self.sink, ("first", "detected"))):
            if value not in allowed:
                raise InputError(f"{name}={value!r} is not supported; use one of {', '.join(allowed)}")
        if self.ablation == "mask" and not self.exclude_readout:
            raise InputError("ablation='mask' cannot hide the read-out token (the metric's query); set "
                             "exclude_readout (--exclude-readout)")
        if int(self.n_random) < 1:
            raise InputError("n_random must be at least 1 (the random-token null)")
        if not 0.0 <= float(self.sink_threshold) < 1.0:
            raise InputError(f"sink_threshold is an attention weight in [0, 1), got {self.sink_threshold}")
        if not 0 < self.confidence_level < 1 or not 0 < self.alpha < 1:
            raise InputError("confidence_level and alpha must lie in (0, 1)")
        if int(self.n) < 2:
            raise InputError("n must be at least 2 prompts")
        self._pairs()

    def check_sizes(self, task=None, *, allow_large: bool = False) -> None:
        """None; InputError naming the minimum and maximum of each size before any work: the resample and
        random-draw counts (maxima lifted by ``allow_large``), and with ``task`` every k against the
        tokens its shortest prompt can ablate (never lifted: a k that ablates every candidate token
        makes every measure's top-k the same set) and the memory of the draws."""
        from circuitstat.circuits.limits import check_bytes, check_range

        from circuitstat.core.params import resamples_for_level

        check_range(int(self.n_resamples), N_RESAMPLES.minimum, N_RESAMPLES.maximum, "n_resamples (--n-resamples)",
                    allow_large=allow_large)
        resamples_for_level(int(self.n_resamples), self.confidence_level, "n_resamples (--n-resamples)")
        check_range(int(self.n_random), 1, MAX_RANDOM_ORDERS, "n_random (--n-random)", allow_large=allow_large)
        if task is None:
            return
        real = task.attention_mask.sum(1)
        ablatable = int(real.min()) - int(bool(self.exclude_first)) - int(bool(self.exclude_readout))
        if ablatable < 2:
            raise InputError(f"the shortest prompt has {int(real.min())} tokens, leaving {max(ablatable, 0)} to ablate; "
                             "use longer prompts or allow the first / read-out token")
        if max(self.ks) >= ablatable:
            raise InputError(f"k (--k) goes up to {max(self.ks)}, but the shortest prompt has {ablatable} tokens that "
                             f"may be ablated; use k from 1 to {ablatable - 1} (ablating all of them makes every "
                             "measure's top-k the same set)")
        N, P = int(task.clean.shape[0]), int(task.clean.shape[1])
        check_bytes(int(self.n_random) * N * P * 16 + int(self.n_resamples) * N * 12,
                    f"{int(self.n_random):,} random token orders and {int(self.n_resamples):,} resamples of {N:,} "
                    "prompts", allow_large=allow_large)

    def _pairs(self) -> list[tuple[str, str]]:
        """Return the tested (a, b) pairs; InputError for a malformed or unknown one."""
        names = (*self.measures, RANDOM)
        if self.pairs is None:
            return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
        out = []
        for p in self.pairs:
            a, sep, b = str(p).partition(":")
            if not sep or a not in names or b not in names or a == b:
                raise InputError(f"pair {p!r} must be 'a:b' with two different names from {', '.join(names)}")
            out.append((a, b))
        if not out or len(set(out)) != len(out):
            raise InputError("pairs must be a non-empty list without repeats, e.g. contribution:attention")
        return out

    def _seeds(self) -> dict[str, np.random.SeedSequence]:
        root = as_seed_sequence(self.seed)
        return dict(zip(("random_tokens", "bootstrap"), spawn_seeds(root, 2)))

    def build_task(self, model):
        """Return the task for ``model`` (built from ``task``, ``n``, ``task_seed``, ``metric``, ``task_options``)."""
        from circuitstat.pipelines.build import build_task

        return build_task(model, self.task, n=int(self.n), seed=int(self.task_seed), metric=self.metric,
                          **(self.task_options or {}))

    # -- stage 1 -------------------------------------------------------------------------------
    def readouts(self, model, task=None) -> Readouts:
        """Return the per-prompt read-outs of ``model`` on the task (torch work, no statistics)."""
        from circuitstat.circuits.contributions import (ablation_drops, candidate_mask, random_ranks, rank_tokens,
                                            sink_readouts, token_weights)

        self.validate()
        task = self.build_task(model) if task is None else task
        model.eval()
        w = token_weights(model, task, ablation=self.ablation, batch_size=self.batch_size)
        cand = candidate_mask(w, self.exclude_first, self.exclude_readout)
        importance = np.stack([w.importance(m) for m in self.measures], axis=1)  # [N, M, P]
        orders = np.stack([rank_tokens(importance[:, i], cand) for i in range(len(self.measures))])
        rng = np.random.default_rng(self._seeds()["random_tokens"])
        rand = random_ranks(cand, int(self.n_random), rng)
        drops = ablation_drops(model, task, np.concatenate([orders, rand]), self.ks, cand,
                               ablation=self.ablation, batch_size=max(self.batch_size, 64))
        M = len(self.measures)
        drops = np.concatenate([drops[:, :M], drops[:, M:].mean(axis=1, keepdims=True)], axis=1)
        n_ablated = np.minimum(np.array(self.ks)[None, :], cand.sum(1)[:, None])
        sr = sink_readouts(model, task.clean, task.attention_mask, sink=self.sink, batch_size=self.batch_size)
        N, L, H, P = sr.sink_attention.shape
        att = sr.sink_attention.reshape(N, L * H, P)
        share = sink_shares(att, sr.positions, self.sink_threshold)
        norm = position_means(sr.output_norm.reshape(N, L * H, P), sr.positions)
        gap = confidence_gap(att, sr.confidence, sr.positions)
        names = [f"a{layer}.h{head}" for layer in range(L) for head in range(H)]
        return Readouts(tuple(self.measures), tuple(self.ks), importance, task.clean.numpy(), w.mask, cand,
                        w.readout, drops,
                        n_ablated, names, share, norm, gap)

    # -- stage 2 -------------------------------------------------------------------------------
    def analyse(self, tables: dict) -> ContributionsResult:
        """Return the statistics from the per-prompt tables (``Readouts.tables()`` or read back from a run)."""
        import pyarrow as pa

        self.validate()
        t = {k: v if isinstance(v, pa.Table) else pa.table(v) for k, v in tables.items()}
        names = (*self.measures, RANDOM)
        drops = _drops_from_table(t["token_drops"], names, self.ks)
        seeds = self._seeds()
        N = drops.shape[0]
        plan = ResamplingPlan.bootstrap(N, int(self.n_resamples), seeds["bootstrap"])
        imp = token_importance_faithfulness(drops, names, self.ks, pairs=self._pairs(), plan=plan,
                                            confidence_level=self.confidence_level, alpha=self.alpha)
        head_names, share, norm, gap = _sinks_from_table(t["sink_prompts"])
        if share.shape[0] != N:
            raise InputError(f"the run's sink table has {share.shape[0]} prompts, its drops table {N}; "
                             "rerun with --force")
        sinks = sink_relation(share, norm, head_names, gap=gap, threshold=self.sink_threshold, plan=plan,
                              confidence_level=self.confidence_level)
        params = {"estimator": "TokenContributions", **{k: v for k, v in self.get_params().items()},
                  "seed": seed_record(as_seed_sequence(self.seed)), "plan": plan.describe()}
        return ContributionsResult(imp, sinks, params)

    def fit(self, model, task=None) -> "TokenContributions":
        """Read ``model`` out on the task and estimate everything; return self with ``result_`` and ``readouts_``."""
        self.readouts_ = self.readouts(model, task)
        self.result_ = self.analyse(self.readouts_.tables())
        return self

    def _spec(self, sources: list[str]) -> dict:
        return {"models": sources, **self.get_params()}

    def _stages(self, run, model, task, *, prefix: str = "", stage_prefix: str = "", force: bool = False
                ) -> tuple[ContributionsResult, dict]:
        """Return (result, read-out tables) after running or resuming one model's two stages in ``run``."""
        base = {"weight_hash": model.weight_hash(), "task_hash": task.content_hash}
        stage1 = {**base, **{k: v for k, v in self.get_params().items()
                             if k not in ("n_resamples", "confidence_level", "alpha")}}
        readouts = f"{stage_prefix}token_readouts"
        run.stage(readouts, lambda: {prefix + k: v for k, v in self.readouts(model, task).tables().items()},
                  [prefix + t for t in READOUT_TABLES], params=stage1, force=force)
        tables = {name: run.table(prefix + name) for name in READOUT_TABLES}
        result = self.analyse(tables)
        run.stage(f"{stage_prefix}token_stats", lambda: {prefix + k: v for k, v in result.tables().items()},
                  [prefix + t for t in STAT_TABLES], params={**base, **self.get_params()}, depends_on=[readouts],
                  force=force)
        return result, tables

    def run(self, model, out: str | os.PathLike, *, task=None, command: Any = None, force: bool = False,
            allow_large: bool = False) -> ContributionsResult:
        """Write both stages to run directory ``out`` (resumable) and return the result (sizes checked
        first by :meth:`check_sizes`)."""
        from circuitstat.core.rundir import RunDir

        self.validate()
        task = self.build_task(model) if task is None else task
        self.check_sizes(task, allow_large=allow_large)
        seed = self.seed if isinstance(self.seed, int) else None
        with RunDir(out, spec=self._spec([str(getattr(model, "source", "memory"))]), kind="tokens",
                    command=command if command is not None else sys.argv, seed=seed,
                    provenance={"model": model.identity(), "task": task.describe()}) as run:
            result, _ = self._stages(run, model, task, force=force)
        return result

    def cross_seed(self, models: Sequence[Any], out: str | os.PathLike, *, command: Any = None, force: bool = False,
                   allow_large: bool = False) -> "CrossSeedResult":
        """Run every model (refits of one architecture) into ``out/model-<i>/`` and compare them across seeds.

        Writes ``token_stability`` (top-k token agreement between seeds per measure, against chance),
        ``sink_stability`` (rank-matched sink rates per layer, number of sink heads, the sink-norm
        relation per seed) and ``sink_matching`` (sink-head agreement with heads matched by attention
        pattern, against random matching; its own stage, which reads the models' attention patterns on
        the task's prompts) at the top of ``out``; every stage resumes.
        """
        from circuitstat.core.rundir import RunDir
        from circuitstat.stats.sinks import sink_stability
        from circuitstat.stats.token_importance import token_stability

        self.validate()
        if len(models) < 2:
            raise InputError(f"cross-seed stability needs at least 2 models, got {len(models)}")
        shapes = {(m.cfg.n_layers, m.cfg.n_heads) for m in models}
        if len(shapes) > 1:
            raise InputError(f"the models differ in layers x heads {sorted(shapes)}; cross-seed needs refits of one "
                             "architecture")
        tasks = [self.build_task(m) for m in models]
        self.check_sizes(tasks[0], allow_large=allow_large)
        if any(t.content_hash != tasks[0].content_hash for t in tasks[1:]):
            raise InputError("the models tokenize the task differently; cross-seed stability needs one shared "
                             "tokenizer (refits of one recipe)")
        seed = self.seed if isinstance(self.seed, int) else None
        sources = [str(getattr(m, "source", "memory")) for m in models]
        with RunDir(out, spec=self._spec(sources), kind="tokens", command=command if command is not None else sys.argv, seed=seed,
                    provenance={"models": [m.identity() for m in models], "task": tasks[0].describe()}) as run:
            per_model = [self._stages(run, m, t, prefix=f"model-{i}/", stage_prefix=f"model{i}_", force=force)
                         for i, (m, t) in enumerate(zip(models, tasks))]
            results = [r for r, _ in per_model]
            orders, cand = _orders_from_tables([tables["token_weights"] for _, tables in per_model], self.measures)
            tokens = token_stability(orders, cand, self.ks, confidence_level=self.confidence_level)
            L, H = models[0].cfg.n_layers, models[0].cfg.n_heads
            rates = np.stack([np.asarray(r.sinks.sink_rate.estimate).reshape(L, H) for r in results])
            sinks = sink_stability(rates, np.array([r.sinks.fit["spearman"]["estimate"] for r in results]),
                                   np.array([r.sinks.fit["curvature"]["estimate"] for r in results]),
                                   sink_bar=self.sink_threshold, confidence_level=self.confidence_level)
            weights = [m.weight_hash() for m in models]
            model_stats = [f"model{i}_token_stats" for i in range(len(models))]
            run.stage("sink_matching", lambda: {"sink_matching": self._sink_matching(models, tasks[0], rates)},
                      ["sink_matching"], params={"weights": weights, "match_drop_bos": MATCH_DROP_BOS,
                                                 **self.get_params()}, depends_on=model_stats, force=force)
            matching = {k: np.asarray(v) for k, v in run.table("sink_matching").to_pydict().items()}
            study = CrossSeedResult(results, tokens, sinks, matching, {"models": sources, **self.get_params()})
            run.stage("cross_seed", lambda: {k: v for k, v in study.tables().items() if k != "sink_matching"},
                      ["token_stability", "sink_stability"], params={"weights": weights, **self.get_params()},
                      depends_on=model_stats, force=force)
        return study

    def _sink_matching(self, models: Sequence[Any], task, rates: np.ndarray) -> dict[str, np.ndarray]:
        """Return the ``sink_matching`` table: each model's attention patterns on the task, matched across seeds."""
        from circuitstat.circuits.readouts import attention_patterns
        from circuitstat.stats.sink_matching import matching_description, pattern_matchings, sink_matching

        ids, mask = task.clean.numpy(), task.attention_mask.numpy().astype(bool)
        patterns = [attention_patterns(m, ids, self.batch_size) for m in models]
        match, _ = pattern_matchings(patterns, drop_bos=MATCH_DROP_BOS, mask=mask)
        return sink_matching(rates, match, sink_bar=self.sink_threshold, confidence_level=self.confidence_level,
                             matching=matching_description(MATCH_DROP_BOS))


def _orders_from_tables(weights: Sequence[Any], measures: Sequence[str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Return {measure: [K, N, P] token orders} and the shared [N, P] candidates from each model's token_weights."""
    from circuitstat.circuits.contributions import rank_tokens

    cols = [{k: np.asarray(v) for k, v in w.to_pydict().items()} for w in weights]
    N, P = int(cols[0]["prompt"].max()) + 1, int(cols[0]["position"].max()) + 1
    cand = np.zeros((N, P), bool)
    cand[cols[0]["prompt"], cols[0]["position"]] = cols[0]["candidate"]
    orders: dict[str, list] = {m: [] for m in measures}
    for c in cols:
        if not (np.array_equal(c["token"], cols[0]["token"]) and np.array_equal(c["candidate"], cols[0]["candidate"])):
            raise InputError("the models' read-outs are on different tokens; cross-seed needs one shared task")
        for m in measures:
            score = np.full((N, P), np.nan)
            score[c["prompt"], c["position"]] = c[m]
            orders[m].append(rank_tokens(score, cand))
    return {m: np.stack(v) for m, v in orders.items()}, cand


@dataclass(repr=False)
class CrossSeedResult(Result):
    """Per-model results and their comparison across seeds.

    Tables ``token_stability``, ``sink_stability`` and ``sink_matching``.
    """

    results: list
    tokens: Any
    sinks: dict
    matching: dict
    params: dict = field(default_factory=dict)
    main_table = "token_stability"

    def _tables(self) -> dict[str, dict[str, Any]]:
        return {"token_stability": self.tokens.rows, "sink_stability": self.sinks, "sink_matching": self.matching}

    def _summary_items(self) -> list[tuple[str, Any]]:
        from circuitstat.stats.head_stability import seeds_interval_text

        items = [("models", len(self.results))] + self.tokens._summary_items()
        s = self.sinks
        for layer, item, v, lo, hi, K in zip(s["layer"], s["item"], s["value"], s["ci_low"], s["ci_high"],
                                             s["n_refits"]):
            where = "model" if layer < 0 else f"layer {layer}"
            items.append((f"{where}: {item}", seeds_interval_text(v, lo, hi, K)))
        m = self.matching
        for layer, item, v, lo, hi, null, verdict, K in zip(m["layer"], m["item"], m["value"], m["ci_low"],
                                                            m["ci_high"], m["null"], m["verdict"], m["n_refits"]):
            where = "all layers" if layer < 0 else f"layer {layer}"
            items.append((f"{where}: {item} (pattern-matched)",
                          f"{seeds_interval_text(v, lo, hi, K)}, random matching "
                          f"{f'{null:.3g}' if np.isfinite(null) else 'undefined'}: {verdict}"))
        return items


@dataclass(frozen=True)
class TokensSpec:
    """A ``tokens`` run: its estimator (every option, checked by TokenContributions.validate) and the sources of
    the models it runs on (several: refits of one recipe, compared across seeds)."""

    estimator: TokenContributions
    models: tuple[str, ...]

    @property
    def sources(self) -> list[str]:
        """The model sources, in order."""
        return list(self.models)


def run_tokens(spec: TokensSpec, out: str | os.PathLike, *, device: str = "cpu", force: bool = False,
               command: Any = None, allow_pickle: bool = False, allow_large: bool = False, inputs: Any = None):
    """The result (TokenImportanceResult; several models: CrossSeedResult) of the tokens run ``spec`` written into
    ``out``: the kind's run. Its options and sizes are checked before ``out`` is, the models' work before any runs."""
    from circuitstat.pipelines.build import check_device, check_work, task_positions
    from circuitstat.pipelines.kinds import check_run_out
    from circuitstat.pipelines.sources import LOCAL
    from circuitstat.pipelines.work import announce, check_tokens

    est, inputs = spec.estimator, inputs or LOCAL
    est.validate()  # every option is checked before the model loads or anything is written
    est.check_sizes(allow_large=allow_large)
    check_run_out(out, KIND_NAME, force=force)
    dev = check_device(device)
    loaded = [inputs.load(s, device=dev, allow_pickle=allow_pickle, allow_large=allow_large) for s in spec.models]
    positions = task_positions(est.task, est.task_options or {})
    for m in loaded:
        check_work(m, est.n, level="node", positions=positions, allow_large=allow_large)
    announce("tokens", check_tokens(est, loaded, positions, allow_large=allow_large))
    if len(loaded) == 1:
        return est.run(loaded[0], out, command=command, force=force, allow_large=allow_large)
    return est.cross_seed(loaded, out, command=command, force=force, allow_large=allow_large)


KIND = RunKind(KIND_NAME, "token contribution weights and attention sinks", run=run_tokens)
