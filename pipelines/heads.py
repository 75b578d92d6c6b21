"""Cross-seed stability of attention heads and of the residual stream (Bali et al. 2026): orchestration.

Given K refits of one architecture (models that differ only by their training seed or recipe),
:class:`HeadStability` (a scikit-learn style estimator: parameters in ``__init__``,
``fit(models)`` returns the estimator with the result in ``result_``) measures how reproducible
each attention head is. This module loads models, builds the probe set, reads the models out
(``circuits.readouts``) and assembles tables; every statistic is computed in
``stats.head_stability`` and ``stats.similarity``:

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

import hashlib
import inspect
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from stats.head_pairs import (PairSimilarities, null_means, pair_similarities, prompt_shuffle_null, quiet_nanmean,
                               residual_cka, untrained_null_scores)
from stats.head_stability import (CKA_KINDS, RefitLevel, all_pairs_layer_stability, anchor_head_stability,
                                  comparison_t_interval, cross_layer_best_match, fisher_interval,
                                  head_distinctness_from_similarity, layer_statistics, matched_similarity,
                                  pair_matrix, percentile_interval, permutation_correlation, perplexity_rise,
                                  prompt_resampled_similarity, refit_bootstrap_counts, refit_jackknife,
                                  refit_level_summaries, refit_pair_weights, shuffled_layer_gap)
from stats.resampling import ResamplingPlan, as_seed_sequence, seed_record, spawn_seeds
from stats.results import ConfidenceInterval, Result
from stats.similarity import match_heads

from .build import load_source

__all__ = [
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

ESTIMANDS = {
    "refit_ci": "stability over the distribution of training seeds; layers, residual and summary: every refit an "
                "anchor in turn, jackknife over refits of the all-pairs mean (t, K-1 df); heads: the anchor's head "
                "against a new training seed, t interval over the anchor's K-1 comparison refits",
    "excess_ci": "stability minus its null, same refit-level interval as refit_ci",
    "ci": "bootstrap of prompts (with replacement) and of the anchor's comparison refits, anchor fixed: Monte Carlo "
          "uncertainty of the paper's setting, not an interval for the seed distribution; CKA: half-samples of "
          "prompts without replacement",
}


def _input_error(msg: str) -> Exception:
    from circuits.errors import InputError

    return InputError(msg)


# =============================================================================================
# Probe set
# =============================================================================================
@dataclass(frozen=True)
class ProbeSet:
    """Token ids [N, T] of the probe prompts (same length), and where they came from."""

    ids: np.ndarray
    bos: bool
    source: str
    n_dropped: int = 0
    tokenizer_hash: str | None = None

    def __post_init__(self) -> None:
        ids = np.asarray(self.ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[0] < 2 or ids.shape[1] < 2:
            raise _input_error(f"the probe set must be [N >= 2, T >= 2] token ids, got shape {ids.shape}")
        ids.setflags(write=False)
        object.__setattr__(self, "ids", ids)

    @property
    def n(self) -> int:
        return int(self.ids.shape[0])

    @property
    def length(self) -> int:
        return int(self.ids.shape[1])

    @property
    def content_hash(self) -> str:
        """sha256 of the ids (shape and bytes) and the BOS flag."""
        h = hashlib.sha256(b"circuitstat-probe-v1")
        h.update(str(self.ids.shape).encode())
        h.update(b"bos" if self.bos else b"nobos")
        h.update(np.ascontiguousarray(self.ids).tobytes())
        return h.hexdigest()

    def describe(self) -> dict:
        return {"n": self.n, "length": self.length, "bos": self.bos, "source": self.source,
                "n_dropped": self.n_dropped, "tokenizer_hash": self.tokenizer_hash,
                "sha256": self.content_hash}

    @classmethod
    def from_ids(cls, ids: np.ndarray, bos: bool = False, source: str = "ids") -> "ProbeSet":
        return cls(np.asarray(ids), bool(bos), source)


def _read_prompt_file(path: Path) -> list[str]:
    if not path.exists():
        raise _input_error(f"probe file {path} does not exist")
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".jsonl":
        out = []
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                raise _input_error(f"{path}:{i + 1} is not JSON; a .jsonl probe file needs one {{\"text\": ...}} per line") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
                raise _input_error(f"{path}:{i + 1} has no string field 'text'")
            out.append(doc["text"])
        return out
    return [line for line in text.splitlines() if line.strip()]


def _first_token_rows(tokenizer, texts, body: int, n: int) -> tuple[list[list[int]], int]:
    """The first ``body`` tokens of the first ``n`` texts that have that many, and how many
    shorter texts were skipped on the way."""
    rows, dropped = [], 0
    for t in texts:
        ids = tokenizer.encode(t)
        if len(ids) < body:
            dropped += 1
            continue
        rows.append(ids[:body])
        if len(rows) == n:
            break
    return rows, dropped

def build_probe(tokenizer, *, n: int = 100, length: int = 64, bos: bool = True, file: str | os.PathLike | None = None,
                corpus: Any = None, seed: int = 0) -> ProbeSet:
    """``n`` prompts of exactly ``length`` tokens (BOS included when ``bos``).

    Default: held-out snippets of the corpus' probe split (``corpus``: a Corpus or a spec for
    ``load_corpus``; default the standard-library corpus), drawn deterministically with ``seed``;
    each is tokenised and cut to ``length`` tokens, snippets that are too short are skipped (in
    the order drawn, so the set is a pure function of the arguments). ``file``: one prompt per
    line (``.txt``) or ``{"text": ...}`` per line (``.jsonl``); prompts shorter than ``length``
    tokens are dropped (counted in ``n_dropped``), the first ``n`` others are kept.
    """
    if tokenizer is None:
        raise _input_error("the models have no tokenizer; pass a probe set of token ids (ProbeSet.from_ids)")
    if n < 2:
        raise _input_error(f"the probe set needs at least 2 prompts, got n={n}")
    bos_id = None
    if bos:
        bos_id = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
        if bos_id is None:
            raise _input_error("the tokenizer has neither a BOS nor an EOS token; use bos=False (--no-bos)")
    body = length - (1 if bos else 0)
    if body < 1:
        raise _input_error(f"probe length {length} leaves no room for tokens after BOS")
    thash = getattr(tokenizer, "content_hash", None)
    if file is not None:
        texts = _read_prompt_file(Path(file))
        source = f"file:{Path(file).name}"
        rows, dropped = _first_token_rows(tokenizer, texts, body, n)
        if len(rows) < min(n, 2):
            raise _input_error(f"probe file {file}: only {len(rows)} prompts have >= {body} tokens; "
                               "lower the probe length or add longer prompts")
    else:
        from circuits.corpus import load_corpus

        corp = load_corpus(corpus if corpus is not None else "stdlib")
        source = f"corpus:{corp.name}:{corp.content_hash[:16]}:probe-split:seed{seed}"
        n_chars = max(200, 8 * body)
        pool = 2 * n
        while True:
            texts = corp.probe_snippets(n=pool, n_chars=n_chars, seed=seed)  # a prefix-stable draw
            rows, dropped = _first_token_rows(tokenizer, texts, body, n)
            if len(rows) == n:
                break
            if pool >= 16 * n:
                raise _input_error(f"could not draw {n} probe snippets of {body} tokens from corpus {corp.name!r}; "
                                   "lower n or the probe length")
            pool *= 2
    arr = np.asarray(rows, dtype=np.int64)
    if bos:
        arr = np.concatenate([np.full((arr.shape[0], 1), bos_id, dtype=np.int64), arr], axis=1)
    return ProbeSet(arr, bos, source, dropped, thash)


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
    from circuits.model import CircuitModel
    from circuits.readouts import attention_patterns

    seeds = [int(s.generate_state(1)[0]) for s in spawn_seeds(seed, n_models)]
    untrained = [attention_patterns(CircuitModel(models[0].cfg).init_weights(s).to(models[0].device).eval(), ids,
                                    batch_size) for s in seeds]
    return untrained_null_scores(patterns, untrained, match, drop_bos), seeds


# =============================================================================================
# Result
# =============================================================================================
@dataclass(repr=False)
class HeadStabilityResult(Result):
    """Head/layer stability, importance, residual CKA and their intervals; ``.tables()`` for Parquet.

    Tables: ``heads`` (layer, head, stability, ci_low, ci_high, null_mean, distinctness,
    importance, match, pairs, then excess, refit_ci_low, refit_ci_high, excess_ci_low,
    excess_ci_high, n_refits), ``layers`` (layer, stability, ci_low, ci_high, null_mean, then
    stability_all_anchors, refit_ci_low, refit_ci_high, excess, excess_ci_low, excess_ci_high,
    n_refits), ``residual`` (layer, hook, kind, cka, ci_low, ci_high, then cka_all_pairs,
    refit_ci_low, refit_ci_high, n_refits), ``head_details``, ``correlation``, ``summary`` (item,
    value, ci_low, ci_high, verdict) and ``refits``. Every interval's estimand is in
    ``params['estimands']`` (see :data:`ESTIMANDS`). ``replicates`` keeps the bootstrap
    replicates of the layer-level numbers (same resampling scheme for every result with the same
    ``n_boot``); ``refit_replicates`` the leave-one-refit-out values (``jackknife:<name>``) and
    estimates (``estimate:<name>``), so results on the same seeds can be compared refit by refit.
    """

    n_layers: int
    n_heads: int
    heads: dict
    layers: dict
    residual: dict
    head_details: dict
    correlation: dict
    summary_rows: list
    refits: dict
    replicates: dict
    params: dict = field(default_factory=dict)
    refit_replicates: dict = field(default_factory=dict)
    main_table = "heads"

    @property
    def head_stability(self) -> np.ndarray:
        """Return the [L, H] stability of the anchor's heads."""
        return np.asarray(self.heads["stability"]).reshape(self.n_layers, self.n_heads)

    @property
    def layer_stability(self) -> np.ndarray:
        """Return the [L] layer stability (the ``stability`` column of ``layers``)."""
        return np.asarray(self.layers["stability"])

    @property
    def gap(self) -> float:
        """Return max − min layer stability."""
        s = self.layer_stability
        return float(np.nanmax(s) - np.nanmin(s))

    @property
    def least_stable_layer(self) -> int:
        """Return the index of the least stable layer."""
        return int(np.nanargmin(self.layer_stability))

    def item(self, name: str) -> dict:
        """Return the summary row called ``name``."""
        for row in self.summary_rows:
            if row["item"] == name:
                return row
        raise KeyError(f"no summary item {name!r}; have {[r['item'] for r in self.summary_rows]}")

    def conf_int(self, table: str = "layers", kind: str = "refit") -> ConfidenceInterval:
        """Return the (low, high) arrays of one table's intervals: kind 'refit', 'excess' or 'bootstrap'."""
        prefix = {"refit": "refit_ci", "excess": "excess_ci", "bootstrap": "ci"}.get(kind)
        columns = self._tables().get(table, {})
        if prefix is None or f"{prefix}_low" not in columns:
            raise KeyError(f"table {table!r} has no {kind!r} interval; use heads, layers or residual with "
                           "refit, excess or bootstrap")
        return ConfidenceInterval(np.asarray(columns[f"{prefix}_low"]), np.asarray(columns[f"{prefix}_high"]))

    def _tables(self) -> dict[str, dict[str, Any]]:
        summary = {k: np.array([r[k] for r in self.summary_rows], dtype=float)
                   for k in ("value", "ci_low", "ci_high")}
        summary = {"item": np.array([str(r["item"]) for r in self.summary_rows]), **summary,
                   "verdict": np.array([str(r["verdict"]) for r in self.summary_rows])}
        return {"heads": self.heads, "layers": self.layers, "residual": self.residual,
                "head_details": self.head_details, "correlation": self.correlation, "summary": summary,
                "refits": self.refits}

    def _summary_items(self) -> list[tuple[str, Any]]:
        items = [("refits", len(self.refits["refit"])), ("layers x heads", f"{self.n_layers} x {self.n_heads}"),
                 ("match / pairs", f"{self.params.get('match')} / {self.params.get('pairs')}")]
        for r in self.summary_rows:
            ci = f" [{r['ci_low']:.3g}, {r['ci_high']:.3g}]" if np.isfinite(r["ci_low"]) else ""
            items.append((r["item"], f"{r['value']:.4g}{ci}"))
        return items

    def provenance(self) -> dict:
        """Return the models, probe, seed, method and parameters recorded with every table."""
        return {"models": self.params.get("models", []), "probe": self.params.get("probe", {}),
                "seed": self.params.get("random_state"), "method": "head_stability",
                "params": {k: v for k, v in self.params.items() if k not in ("models", "probe")}}

    def write(self, run_dir, *, spec: Any = None, command: Any = None, force: bool = False) -> dict[str, Path]:
        """Write every table as ``<run_dir>/<table>.parquet`` with provenance and a manifest; return paths.

        ``run_dir``: a path (opened as a :class:`reports.rundir.RunDir`) or an open RunDir (its
        tables are written directly, e.g. inside a stage of a larger run).
        """
        from reports.rundir import RunDir

        tables = self.tables()
        prov = self.provenance()
        if isinstance(run_dir, RunDir):
            return {n: run_dir.write_table(n, t, provenance=prov) for n, t in tables.items()}
        spec = spec if spec is not None else {k: v for k, v in self.params.items() if k != "models"}
        seed = self.params.get("random_state")
        with RunDir(run_dir, spec=spec, command=command, seed=seed if isinstance(seed, int) else None,
                    provenance={"models": prov["models"], "probe": prov["probe"]}) as run:
            return run.stage("heads", lambda: tables, list(tables),
                             params={"spec": spec, "weights": [m.get("weight_hash") for m in prov["models"]],
                                     "probe": prov["probe"].get("sha256")}, force=force)


# =============================================================================================
# Estimator
# =============================================================================================
@dataclass
class _Context:
    """What every stage of one fit shares: models, probe, sizes, seeds and resampling draws."""

    models: list
    probe: ProbeSet
    anchor: int
    n_layers: int
    n_heads: int
    seeds: dict[str, np.random.SeedSequence]
    root: np.random.SeedSequence
    n_resamples: int
    confidence_level: float
    prompt_plan: ResamplingPlan | None
    target_counts: np.ndarray  # [R, K] the anchor's comparison refits drawn
    refit_counts: np.ndarray  # [R, K] all refits drawn
    patterns: list[np.ndarray] = field(default_factory=list)

    @property
    def n_refits(self) -> int:
        return len(self.models)

    @property
    def targets(self) -> list[int]:
        return [b for b in range(self.n_refits) if b != self.anchor]


class HeadStability:
    """Cross-seed head stability estimator (scikit-learn style: parameters here, ``fit(models)``).

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
    n_boot : bootstrap replicates of the paper's interval; ``n_boot_cka`` half-samples for CKA
        (default ``n_boot``); ``ci_over``: 'both' (prompts and refits jointly), 'prompts' or
        'refits'. ``confidence_level`` of every interval.
    importance : compute zero-ablation importance of every head.
    residual, hooks, cka, cka_tokens : residual-stream CKA at ``hooks`` ('pre', 'post') with
        ``cka`` kinds on ``cka_tokens`` positions per prompt.
    corr_refits : correlate stability with importance over the anchor's heads only ('anchor') or
        over the heads of every refit, centred within refit ('all').
    corr : 'pearson' or 'spearman'; ``n_perm`` random permutations.
    n_probe, probe_len, bos, probe_file, corpus, probe_seed : the default probe set (see
        :func:`build_probe`); ``fit(models, probe=...)`` overrides it.
    batch_size : prompts per forward pass. random_state : seed of every random draw.
    n_jobs : BLAS / torch threads inside fit.
    """

    def __init__(self, match: str = "max", pairs: str = "anchor", anchor: int = 0, drop_bos: bool = False,
                 null: str = "prompts", n_null: int | None = None, n_boot: int = 200, n_boot_cka: int | None = None,
                 ci_over: str = "both", confidence_level: float = 0.95, importance: bool = True,
                 residual: bool = True, hooks: Sequence[str] = ("pre", "post"), corr_refits: str = "all",
                 cka: Sequence[str] = ("linear", "rbf", "debiased"), cka_tokens: int = 4, corr: str = "pearson",
                 n_perm: int = 9999, n_probe: int = 100, probe_len: int | None = None, bos: bool = True,
                 probe_file: str | None = None, corpus: Any = None, probe_seed: int = 0, batch_size: int = 50,
                 random_state: int | None = 0, n_jobs: int = 1) -> None:
        self.match = match
        self.pairs = pairs
        self.anchor = anchor
        self.drop_bos = drop_bos
        self.null = null
        self.n_null = n_null
        self.n_boot = n_boot
        self.n_boot_cka = n_boot_cka
        self.ci_over = ci_over
        self.confidence_level = confidence_level
        self.importance = importance
        self.residual = residual
        self.hooks = tuple(hooks)
        self.corr_refits = corr_refits
        self.cka = tuple(cka)
        self.cka_tokens = cka_tokens
        self.corr = corr
        self.n_perm = n_perm
        self.n_probe = n_probe
        self.probe_len = probe_len
        self.bos = bos
        self.probe_file = probe_file
        self.corpus = corpus
        self.probe_seed = probe_seed
        self.batch_size = batch_size
        self.random_state = random_state
        self.n_jobs = n_jobs

    # -- scikit-learn conventions ----------------------------------------------------------
    @classmethod
    def _param_names(cls) -> list[str]:
        """Return the parameter names, read from the signature of ``__init__``."""
        return [p.name for p in inspect.signature(cls.__init__).parameters.values()
                if p.name != "self" and p.kind == p.POSITIONAL_OR_KEYWORD]

    def get_params(self, deep: bool = False) -> dict:
        """Return every ``__init__`` parameter by name (``deep`` is accepted for scikit-learn)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> "HeadStability":
        """Set parameters by name; return the estimator."""
        unknown = sorted(set(params) - set(self._param_names()))
        if unknown:
            raise _input_error(f"unknown HeadStability parameter(s) {unknown}; use {', '.join(self._param_names())}")
        for name, value in params.items():
            setattr(self, name, tuple(value) if name in ("hooks", "cka") else value)
        return self

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
        if self.n_boot < 1:
            raise _input_error("n_boot must be at least 1")
        if not 0 < self.confidence_level < 1:
            raise _input_error("confidence_level must be in (0, 1)")

    # -- inputs -------------------------------------------------------------------------------
    @staticmethod
    def _load(models) -> list:
        return [load_source(m) if isinstance(m, (str, os.PathLike)) else m for m in models]

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
            from circuits.corpus import load_corpus

            hashes = {getattr(m, "meta", {}).get("training", {}).get("corpus_hash") for m in models} - {None}
            corpus = load_corpus("stdlib")
            if hashes and hashes != {corpus.content_hash}:
                raise _input_error("the models were trained on a corpus other than this Python's standard library; "
                                   "pass the corpus (--corpus) so the probe snippets come from its held-out split, "
                                   "or a probe file")
        return build_probe(tok, n=self.n_probe, length=length, bos=self.bos, file=self.probe_file, corpus=corpus,
                           seed=self.probe_seed)

    def _context(self, models, probe) -> _Context:
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
        root = as_seed_sequence(self.random_state)
        seeds = dict(zip(("prompts", "refits", "null", "perm", "untrained", "cka"), spawn_seeds(root, 6)))
        n_resamples = int(self.n_boot)
        prompt_plan = (ResamplingPlan.bootstrap(probe_set.n, n_resamples, seeds["prompts"])
                       if self.ci_over in ("both", "prompts") else None)
        target_counts, refit_counts = refit_bootstrap_counts(
            np.random.default_rng(seeds["refits"]), len(models), int(self.anchor), n_resamples,
            self.ci_over in ("both", "refits"))
        return _Context(models, probe_set, int(self.anchor), cfg0.n_layers, cfg0.n_heads, seeds, root, n_resamples,
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
        from circuits.readouts import attention_patterns

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
        derived = self._derived(ctx, stability)
        summary = self._summary_rows(ctx, derived, null, refit_level, shape, importance, residual)
        replicates = {"layer": stability["layer_reps"], **derived[1], "head": stability["head_reps"],
                      **{f"resid:{k}": quiet_nanmean(v, axis=1) for k, v in residual["replicates"].items()}}
        tables = self._tables(ctx, stability, null, refit_level, matched_pairs, excess_pairs, shape, importance,
                              residual)
        return HeadStabilityResult(ctx.n_layers, ctx.n_heads, *tables, summary, self._refits_table(ctx), replicates,
                                   self._result_params(ctx, null), self._refit_replicates(refit_level, residual))

    # -- stages -------------------------------------------------------------------------------
    def _stability(self, ctx: _Context, sims: PairSimilarities) -> dict[str, Any]:
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

    def _nulls(self, ctx: _Context, sims: PairSimilarities) -> dict[str, Any]:
        """Return the null matched scores: per ordered pair ``[K, K, L, H]``, the anchor's heads and layers."""
        nan_heads = np.full((ctx.n_layers, ctx.n_heads), np.nan)
        out = {"pairs": None, "head": nan_heads, "layer": np.full(ctx.n_layers, np.nan), "description": self.null}
        sources = list(range(ctx.n_refits)) if self.pairs == "all" else [ctx.anchor]
        if self.null == "prompts":
            n_null = 50 if self.n_null is None else int(self.n_null)
            # the anchor's pairs first: their seeds do not depend on how many other pairs follow
            order = ([(ctx.anchor, b) for b in ctx.targets]
                     + [p for p in sims.pairs if p[0] != ctx.anchor])
            null = prompt_shuffle_null(ctx.patterns, order, self.match, self.drop_bos, n_null, ctx.seeds["null"],
                                        self.n_jobs)
            out["pairs"] = pair_matrix(null, order, ctx.n_refits)
            out["description"] = f"prompts of the other refit shuffled ({n_null} permutations)"
        elif self.null == "untrained":
            n_models = max(2, ctx.n_refits - 1) if self.n_null is None else int(self.n_null)
            per_refit, seeds = _untrained_null(ctx.models, ctx.patterns, ctx.probe.ids, self.match, self.drop_bos,
                                               n_models, ctx.seeds["untrained"], self.batch_size)
            # a refit's null does not depend on the other refit of the pair
            out["pairs"] = np.broadcast_to(per_refit[:, None], (ctx.n_refits,) + per_refit.shape).copy()
            out["pairs"][np.arange(ctx.n_refits), np.arange(ctx.n_refits)] = np.nan
            out["description"] = f"independently initialised untrained models ({n_models}, seeds {seeds})"
        if out["pairs"] is not None:
            out["head"], out["layer"] = null_means(out["pairs"], ctx.anchor, ctx.targets, sources)
        return out

    def _distinctness_and_cross_layer(self, ctx: _Context, sims: PairSimilarities) -> dict[str, np.ndarray]:
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

    def _importance(self, ctx: _Context, matched_pairs: np.ndarray) -> dict[str, Any]:
        """Return the anchor's importance with bootstrap interval and the stability-importance correlations."""
        from circuits.readouts import head_importance

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
        stability_by_source = {a: quiet_nanmean(matched_pairs[a], axis=0) for a in sources}  # [L, H]
        seeds = spawn_seeds(ctx.seeds["perm"], ctx.n_layers + 1)
        deep = list(range(ctx.n_layers // 2, ctx.n_layers)) if ctx.n_layers > 1 else [0]
        scopes = [("layer", [layer], seeds[layer]) for layer in range(ctx.n_layers)] + [("deep", deep, seeds[-1])]
        for scope, layers, seed in scopes:
            cells = [(a, layer) for a in sources for layer in layers]
            stability = np.concatenate([stability_by_source[a][layer] for a, layer in cells])
            importance = np.concatenate([by_source[a][layer] for a, layer in cells])
            groups = np.repeat(np.arange(len(cells)), ctx.n_heads)
            res = permutation_correlation(stability, importance, groups, method=self.corr, n_permutations=self.n_perm,
                                          seed=seed, confidence_level=ctx.confidence_level)
            out["rows"].append({"scope": scope, "layer": layers[0] if scope == "layer" else -1,
                                **{k: res[k] for k in ("r", "ci_low", "ci_high", "pvalue", "n", "n_eff")},
                                "refits": len(sources), "method": self.corr})
        return out

    def _residual(self, ctx: _Context) -> dict[str, Any]:
        """Return residual-stream CKA per layer, hook and kind: point, half-sample replicates, refit-level."""
        from circuits.readouts import cka_positions, residual_rows

        out: dict[str, Any] = {"rows": [], "replicates": {}, "refit": {}}
        if not (self.residual and self.hooks and self.cka):
            return out
        positions = cka_positions(ctx.probe.length, self.cka_tokens)
        rows = [residual_rows(m, ctx.probe.ids, positions, self.hooks, self.batch_size) for m in ctx.models]
        point_pairs = ([(a, b) for a, b in zip(*np.triu_indices(ctx.n_refits, 1))] if self.pairs == "all"
                       else [(ctx.anchor, b) for b in ctx.targets])
        n_half = ctx.n_resamples if self.n_boot_cka is None else max(1, min(ctx.n_resamples, int(self.n_boot_cka)))
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

    @staticmethod
    def _derived(ctx: _Context, stability: dict) -> tuple[dict, dict]:
        """Return the layer summaries (mean, gap, shuffled gap, ...) at the point and per bootstrap replicate."""
        layer_point, layer_reps = layer_statistics(stability["layers"]), layer_statistics(stability["layer_reps"])
        # the gap a layer-structure-free model would show: the anchor's head stabilities shuffled
        # across layers (a max - min over more layers grows with L even without any layer effect)
        permutations = np.argsort(np.random.default_rng(spawn_seeds(ctx.seeds["perm"], ctx.n_layers + 2)[-1])
                                  .random((50, ctx.n_layers * ctx.n_heads)), axis=1)
        for derived, heads in ((layer_point, stability["heads"]), (layer_reps, stability["head_reps"])):
            derived["gap_shuffled"] = shuffled_layer_gap(heads, permutations)
            derived["gap_excess"] = derived["gap"] - derived["gap_shuffled"]
        return layer_point, layer_reps

    def _summary_rows(self, ctx: _Context, derived: tuple[dict, dict], null: dict, refit_level: RefitLevel,
                      shape: dict, importance: dict, residual: dict) -> list[dict]:
        """Return the rows of the ``summary`` table (item, value, ci_low, ci_high, verdict)."""
        rows: list[dict] = []
        level = ctx.confidence_level

        def add(item, value, low=np.nan, high=np.nan):
            rows.append({"item": item, "value": float(value), "ci_low": float(low), "ci_high": float(high),
                         "verdict": ""})

        def add_bootstrap(item, value, replicates, discrete=False):
            add(item, value, *percentile_interval(replicates, level, discrete=discrete))

        layer_point, layer_reps = derived
        add_bootstrap("mean head stability", layer_point["mean"], layer_reps["mean"])
        add("mean null", quiet_nanmean(null["layer"]) if np.isfinite(null["layer"]).any() else np.nan)
        add_bootstrap("gap (max - min layer stability)", layer_point["gap"], layer_reps["gap"])
        add_bootstrap("gap expected with heads shuffled across layers", layer_point["gap_shuffled"],
                      layer_reps["gap_shuffled"])
        add_bootstrap("excess gap (gap minus its shuffled-layers expectation)", layer_point["gap_excess"],
                      layer_reps["gap_excess"])
        add_bootstrap("least stable layer", layer_point["argmin"], layer_reps["argmin"], discrete=True)
        add_bootstrap("least stable layer (relative position)", layer_point["argmin_rel"], layer_reps["argmin_rel"],
                      discrete=True)
        if ctx.n_layers >= 3:
            add_bootstrap("ends minus middle layer stability", layer_point["ends_minus_middle"],
                          layer_reps["ends_minus_middle"])
            add("share of replicates with the least stable layer in the middle", layer_reps["middle_min"].mean())
        add_bootstrap("mean distinctness", quiet_nanmean(shape["distinctness"]),
                      quiet_nanmean(shape["distinctness_reps"].reshape(ctx.n_resamples, -1), axis=1))
        add_bootstrap("mean cross-layer best match", quiet_nanmean(shape["cross_layer"]),
                      quiet_nanmean(shape["cross_layer_reps"], axis=1))
        add("share of heads whose cross-layer best match is in their own layer", shape["same_layer_share"].mean())
        for key, reps in residual["replicates"].items():
            kind, hook = key.split(":")
            mean = np.mean([r["cka"] for r in residual["rows"] if (r["kind"], r["hook"]) == (kind, hook)])
            add_bootstrap(f"mean residual {kind} CKA ({hook})", mean, quiet_nanmean(reps, axis=1))
        rows.extend(self._refit_summary_rows(ctx, refit_level, residual))
        for row in importance["rows"]:
            if row["scope"] == "deep":
                add("correlation of stability and importance (deep layers)", row["r"], row["ci_low"], row["ci_high"])
        return rows

    @staticmethod
    def _refit_summary_rows(ctx: _Context, refit_level: RefitLevel, residual: dict) -> list[dict]:
        """Return summary rows whose interval is over training seeds (every refit an anchor, jackknife)."""
        tag = f"(every refit an anchor; jackknife over {ctx.n_refits} refits)"
        rows = []
        for name, item in (("mean", "mean head stability"), ("excess_mean", "mean excess stability over the null"),
                           ("gap", "gap (max - min layer stability)"),
                           ("ends_minus_middle", "ends minus middle layer stability")):
            if name in refit_level.estimates:
                low, high = refit_level.intervals[name]
                rows.append({"item": f"{item} {tag}", "value": float(refit_level.estimates[name]),
                             "ci_low": float(low), "ci_high": float(high), "verdict": ""})
        for key, refit in residual["refit"].items():
            kind, hook = key.split(":")
            difference = refit["estimate"].mean() - refit_level.estimates["mean"]
            leave_one_out = refit["leave_one_out"].mean(-1) - refit_level.leave_one_out["mean"]
            low, high, _ = refit_jackknife(difference, leave_one_out, ctx.confidence_level)
            mean_low, mean_high = refit["mean_interval"]
            rows.append({"item": f"mean residual {kind} CKA ({hook}) {tag}", "value": float(refit["estimate"].mean()),
                         "ci_low": float(mean_low), "ci_high": float(mean_high), "verdict": ""})
            rows.append({"item": f"mean residual {kind} CKA ({hook}) minus mean head stability {tag}",
                         "value": float(difference), "ci_low": float(low), "ci_high": float(high), "verdict": ""})
        return rows

    def _tables(self, ctx: _Context, stability: dict, null: dict, refit_level: RefitLevel, matched_pairs: np.ndarray,
                excess_pairs: np.ndarray | None, shape: dict, importance: dict, residual: dict) -> tuple[dict, ...]:
        """Return the heads, layers, residual, head_details and correlation tables (column dicts)."""
        n_layers, n_heads, level = ctx.n_layers, ctx.n_heads, ctx.confidence_level
        layer_index, head_index = (a.ravel().astype(np.int64) for a in
                                   np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij"))
        comparisons = matched_pairs[ctx.anchor, ctx.targets]  # [K-1, L, H]
        _, refit_low, refit_high = comparison_t_interval(comparisons, level)
        nan_heads = np.full((n_layers, n_heads), np.nan)
        excess_low = excess_high = nan_heads
        if excess_pairs is not None:
            _, excess_low, excess_high = comparison_t_interval(excess_pairs[ctx.anchor, ctx.targets], level)
        boot_low, boot_high = percentile_interval(stability["head_reps"], level)
        match_text = [" ".join(f"r{b}:h{int(stability['match_index'][b][layer, head])}" for b in ctx.targets)
                      for layer, head in zip(layer_index, head_index)]
        heads = {"layer": layer_index, "head": head_index, "stability": stability["heads"].ravel(),
                 "ci_low": boot_low.ravel(), "ci_high": boot_high.ravel(), "null_mean": null["head"].ravel(),
                 "distinctness": shape["distinctness"].ravel(), "importance": importance["value"].ravel(),
                 "match": np.array(match_text), "pairs": np.array([self.pairs] * (n_layers * n_heads)),
                 "excess": (stability["heads"] - null["head"]).ravel(), "refit_ci_low": refit_low.ravel(),
                 "refit_ci_high": refit_high.ravel(), "excess_ci_low": np.asarray(excess_low).ravel(),
                 "excess_ci_high": np.asarray(excess_high).ravel(),
                 "n_refits": np.full(n_layers * n_heads, ctx.n_refits, dtype=np.int64)}
        layer_low, layer_high = percentile_interval(stability["layer_reps"], level)
        nan_layers = np.full(n_layers, np.nan)
        excess = refit_level.estimates.get("excess", nan_layers)
        excess_ci = refit_level.intervals.get("excess", (nan_layers, nan_layers))
        layers = {"layer": np.arange(n_layers, dtype=np.int64), "stability": stability["layers"], "ci_low": layer_low,
                  "ci_high": layer_high, "null_mean": null["layer"],
                  "stability_all_anchors": refit_level.estimates["layer"],
                  "refit_ci_low": refit_level.intervals["layer"][0], "refit_ci_high": refit_level.intervals["layer"][1],
                  "excess": excess, "excess_ci_low": excess_ci[0], "excess_ci_high": excess_ci[1],
                  "n_refits": np.full(n_layers, ctx.n_refits, dtype=np.int64)}
        residual_table = self._residual_table(residual["rows"])
        details = self._details_table(ctx, stability, shape, importance, layer_index, head_index)
        correlation = {"scope": np.array([r["scope"] for r in importance["rows"]], dtype=str),
                       "layer": np.array([r["layer"] for r in importance["rows"]], dtype=np.int64),
                       **{k: np.array([r[k] for r in importance["rows"]], dtype=float)
                          for k in ("r", "ci_low", "ci_high", "pvalue")},
                       **{k: np.array([r[k] for r in importance["rows"]], dtype=np.int64)
                          for k in ("n", "n_eff", "refits")},
                       "method": np.array([r["method"] for r in importance["rows"]], dtype=str)}
        return heads, layers, residual_table, details, correlation

    @staticmethod
    def _residual_table(rows: list[dict]) -> dict:
        """Return the residual table's columns from its rows (typed even when empty)."""
        types = {"layer": np.int64, "hook": str, "kind": str, "cka": float, "ci_low": float, "ci_high": float,
                 "cka_all_pairs": float, "refit_ci_low": float, "refit_ci_high": float, "n_refits": np.int64,
                 "interval_reliable": bool}
        return {k: np.array([r[k] for r in rows], dtype=t) for k, t in types.items()}

    @staticmethod
    def _details_table(ctx: _Context, stability: dict, shape: dict, importance: dict, layer_index: np.ndarray,
                       head_index: np.ndarray) -> dict:
        """Return the head_details table: one-source intervals, distinctness, importance and cross-layer match."""
        level = ctx.confidence_level
        prompts_low, prompts_high = percentile_interval(stability["only_prompts"], level)
        refits_low, refits_high = percentile_interval(stability["only_refits"], level)
        distinct_low, distinct_high = percentile_interval(shape["distinctness_reps"], level)
        cross_low, cross_high = percentile_interval(shape["cross_layer_reps"], level)
        return {"layer": layer_index, "head": head_index,
                "stability_ci_low_prompts": prompts_low.ravel(), "stability_ci_high_prompts": prompts_high.ravel(),
                "stability_ci_low_refits": refits_low.ravel(), "stability_ci_high_refits": refits_high.ravel(),
                "distinctness_ci_low": distinct_low.ravel(), "distinctness_ci_high": distinct_high.ravel(),
                "importance_ci_low": np.asarray(importance["low"]).ravel(),
                "importance_ci_high": np.asarray(importance["high"]).ravel(),
                "cross_layer_similarity": shape["cross_layer"], "cross_layer_ci_low": cross_low,
                "cross_layer_ci_high": cross_high, "cross_layer_best_layer": shape["modal_layer"].astype(np.int64),
                "cross_layer_same_layer_share": shape["same_layer_share"]}

    @staticmethod
    def _refits_table(ctx: _Context) -> dict:
        """Return the refits table: source, weight hash, training seed and role of every refit."""
        seeds = [getattr(m, "meta", {}).get("training", {}).get("seed") for m in ctx.models]
        return {"refit": np.arange(ctx.n_refits, dtype=np.int64),
                "source": np.array([str(getattr(m, "source", "memory")) for m in ctx.models]),
                "weight_hash": np.array([m.weight_hash() for m in ctx.models]),
                "seed": np.array([-1 if s is None else int(s) for s in seeds], dtype=np.int64),
                "role": np.array(["anchor" if i == ctx.anchor else "refit" for i in range(ctx.n_refits)])}

    def _result_params(self, ctx: _Context, null: dict) -> dict:
        """Return the parameters, estimands and provenance recorded with every table."""
        models = [{"refit": i, "source": str(getattr(m, "source", "memory")), "weight_hash": m.weight_hash(),
                   "seed": getattr(m, "meta", {}).get("training", {}).get("seed"),
                   "role": "anchor" if i == ctx.anchor else "refit"} for i, m in enumerate(ctx.models)]
        return {**self.get_params(), "estimator": "HeadStability", "null_description": null["description"],
                "models": models, "probe": ctx.probe.describe(), "n_refits": ctx.n_refits, "n_layers": ctx.n_layers,
                "n_heads": ctx.n_heads, "seed_record": seed_record(ctx.root), "estimands": ESTIMANDS,
                "similarity": "cosine of lower-triangle (with diagonal) attention patterns per prompt, mean over prompts",
                "importance_definition": "exp(mean next-token loss, head zero-ablated) - exp(mean clean loss) on the probe set",
                "bootstrap": f"{ctx.n_resamples} replicates; resampled: {self.ci_over}; percentile intervals"}

    @staticmethod
    def _refit_replicates(refit_level: RefitLevel, residual: dict) -> dict:
        """Return leave-one-refit-out values and estimates of the refit-level statistics, by name."""
        out = {}
        for name in ("mean", "excess_mean", "gap", "ends_minus_middle"):
            if name in refit_level.estimates:
                out[f"estimate:{name}"] = np.atleast_1d(refit_level.estimates[name])
                out[f"jackknife:{name}"] = refit_level.leave_one_out[name]
        for key, refit in residual["refit"].items():
            out[f"estimate:resid:{key}"] = np.atleast_1d(refit["estimate"].mean())
            out[f"jackknife:resid:{key}"] = refit["leave_one_out"].mean(-1)
        return out
