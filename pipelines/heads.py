"""Cross-seed stability of attention heads and of the residual stream (Bali et al. 2026), with CIs.

Given K refits of one architecture (models that differ only by their training seed or recipe),
:class:`HeadStability` measures how reproducible each attention head is:

* a head's representation on a probe prompt is the lower triangle (with diagonal) of its
  attention pattern; the similarity of two heads is the cosine per prompt averaged over prompts
  (``stats.similarity``);
* a head's **stability** is the mean, over the other refits, of its best match among the heads
  of the same layer of that refit (``match='max'``, the paper's choice) or of its one-to-one
  Hungarian partner (``match='hungarian'``). ``pairs='anchor'`` (the paper) compares one anchor
  refit with every other; ``pairs='all'`` makes every refit the anchor in turn for the layer-level
  numbers (the per-head rows stay those of the anchor refit, whose heads they index);
* **layer stability** is the mean over a layer's heads, the **gap** is max − min over layers;
  **distinctness** = 1 − mean similarity to the other heads of its own layer; the **cross-layer
  best match** searches every layer of the other refit;
* **importance**: the rise in perplexity (next-token loss on the probe set) when the head's
  output is zero-ablated; its correlation with stability per layer (Fisher-z CI with n = H
  heads per layer, or pooled over refits; a permutation p-value);
* the **residual stream**: linear, RBF (median bandwidth) and debiased CKA between refits at an
  explicit hook (``pre``: the input of a layer; ``post``: after its attention), per layer.

Every number has a bootstrap CI: one replicate resamples prompts (with replacement) and refits
(the anchor's comparison refits, or all refits for pairs='all'), jointly by default
(``ci_over='both'``; ``'prompts'`` or ``'refits'`` for one source only). A null is shown beside
stability: prompts of the other refit shuffled (``null='prompts'``, content-matched structure
removed) or independently initialised, untrained models of the same architecture
(``null='untrained'``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from stats.resampling import ResamplingPlan, as_seed_sequence, seed_record, spawn_seeds
from stats.results import Result
from stats.similarity import (debiased_cka, head_matching, linear_cka, match_heads, per_prompt_cosine,
                              rbf_cka)

__all__ = [
    "ProbeSet",
    "build_probe",
    "attention_patterns",
    "residual_rows",
    "head_importance",
    "fisher_interval",
    "permutation_correlation",
    "HeadStability",
    "HeadStabilityResult",
    "load_source",
    "heads_command",
]

MATCHES = ("max", "hungarian")
PAIRS = ("anchor", "all")
NULLS = ("prompts", "untrained", "none")
HOOKS = ("pre", "post")
CKA_KINDS = {"linear": linear_cka, "rbf": rbf_cka, "debiased": debiased_cka}
CI_OVER = ("both", "prompts", "refits")


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


def load_source(source: str | os.PathLike, device: str = "cpu"):
    """A CircuitModel from a directory, a cached hub id, ``random:...``, or ``hub/id@revision``.

    A revision (branch, tag or commit, e.g. a training checkpoint) must be in the local Hugging
    Face cache; nothing is downloaded.
    """
    from circuits import load_model

    from .build import resolve_source

    src = resolve_source(str(source))
    if "@" in src and not Path(src).expanduser().exists() and not src.startswith("random:"):
        import torch
        import transformers

        from circuits.convert import from_hf
        from circuits.tokenizers import HFTokenizer

        repo, rev = src.rsplit("@", 1)
        try:
            hf = transformers.AutoModelForCausalLM.from_pretrained(
                repo, revision=rev, local_files_only=True, dtype=torch.float32, attn_implementation="eager").eval()
        except OSError:
            raise _input_error(f"{src!r}: revision {rev!r} of {repo!r} is not in the local Hugging Face cache; "
                               "download it on a machine with network access first") from None
        model = from_hf(hf, device=device)
        model.source = src
        try:
            model.tokenizer = HFTokenizer.from_pretrained(repo, revision=rev)
        except (OSError, ValueError):
            model.tokenizer = None
        return model
    return load_model(src, device=device)


# =============================================================================================
# Model read-outs
# =============================================================================================
def _batches(n: int, batch_size: int):
    for s in range(0, n, batch_size):
        yield slice(s, min(n, s + batch_size))


def attention_patterns(model, ids: np.ndarray, batch_size: int = 50) -> np.ndarray:
    """Attention probabilities ``[L, H, N, T, T]`` (float32) of every head on every prompt."""
    import torch

    out = []
    with torch.no_grad():
        for sl in _batches(ids.shape[0], batch_size):
            x = torch.tensor(ids[sl], device=model.device)
            r = model.run(x, keep_patterns=True, compute_logits=False)
            out.append(np.stack([p.float().cpu().numpy() for p in r.patterns]))  # [L, B, H, T, T]
    return np.concatenate(out, axis=1).transpose(0, 2, 1, 3, 4).astype(np.float32, copy=False)


def cka_positions(length: int, n_tokens: int) -> np.ndarray:
    """Token positions used as CKA rows: ``n_tokens`` evenly spaced, never the first token."""
    n_tokens = max(1, min(int(n_tokens), length - 1))
    return np.unique(np.linspace(1, length - 1, n_tokens).round().astype(np.int64))


def residual_rows(model, ids: np.ndarray, positions: np.ndarray, hooks: Sequence[str] = HOOKS,
                  batch_size: int = 50) -> dict[str, np.ndarray]:
    """Residual stream ``{hook: [L, N * len(positions), D]}`` (float64), rows prompt-major.

    ``pre``: the input of layer l (before attention); ``post``: after layer l's attention.
    """
    import torch

    acc: dict[str, list] = {h: [] for h in hooks}
    with torch.no_grad():
        for sl in _batches(ids.shape[0], batch_size):
            x = torch.tensor(ids[sl], device=model.device)
            r = model.run(x, keep_resid=True, compute_logits=False)
            for h in hooks:
                src = r.resid_pre if h == "pre" else r.resid_mid
                acc[h].append(np.stack([t[:, positions].double().cpu().numpy() for t in src]))  # [L, B, r, D]
    out = {}
    for h in hooks:
        a = np.concatenate(acc[h], axis=1)
        out[h] = a.reshape(a.shape[0], -1, a.shape[-1])
    return out


def _prompt_losses(model, x, intervention=None):
    import torch
    import torch.nn.functional as F

    logits = model.run(x, intervention=intervention).logits
    if logits.dtype != torch.float64:
        logits = logits.float()
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none")
    return nll.view(x.shape[0], -1).mean(1).double().cpu().numpy()


def head_importance(model, ids: np.ndarray, batch_size: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Per-prompt mean next-token loss: clean ``[N]`` and with each head zero-ablated ``[L, H, N]``.

    Zero ablation replaces the head's output (its pattern-weighted values times W_O) by zeros in
    the residual stream; the layer's output bias b_O is kept. Importance = exp(mean ablated loss)
    − exp(mean clean loss), the rise in perplexity.
    """
    import torch

    from circuits.interventions import Intervention

    cfg, g = model.cfg, model.graph
    N = ids.shape[0]
    clean = np.zeros(N)
    abl = np.zeros((cfg.n_layers, cfg.n_heads, N))
    zeros = torch.zeros(1, g.n_senders, 1, cfg.d_model, dtype=model.dtype, device=model.device)
    with torch.no_grad():
        for sl in _batches(N, batch_size):
            x = torch.tensor(ids[sl], device=model.device)
            clean[sl] = _prompt_losses(model, x)
            for layer in range(cfg.n_layers):
                for h in range(cfg.n_heads):
                    mask = torch.zeros(g.n_senders, dtype=torch.bool, device=model.device)
                    mask[g.head_sender(layer, h)] = True
                    abl[layer, h, sl] = _prompt_losses(model, x, Intervention.nodes(mask, zeros))
    return clean, abl


# =============================================================================================
# Correlation helpers
# =============================================================================================
def fisher_interval(r: float, n_eff: float, confidence_level: float = 0.95) -> tuple[float, float]:
    """Fisher-z interval of a correlation from ``n_eff`` pairs (se = 1/sqrt(n_eff − 3)); (−1, 1) if n_eff <= 3."""
    from scipy.stats import norm

    if not np.isfinite(r):
        return (math.nan, math.nan)
    if n_eff <= 3:
        return (-1.0, 1.0)
    z = math.atanh(float(np.clip(r, -1 + 1e-12, 1 - 1e-12)))
    q = norm.ppf(0.5 + confidence_level / 2) / math.sqrt(n_eff - 3)
    return (math.tanh(z - q), math.tanh(z + q))


def _ranks(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x)


def _centered_r(x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> float:
    """Pearson r after centring x and y within each group (a within-group correlation)."""
    xc, yc = x.astype(float).copy(), y.astype(float).copy()
    for gid in np.unique(groups):
        m = groups == gid
        xc[m] -= xc[m].mean()
        yc[m] -= yc[m].mean()
    den = math.sqrt(float(xc @ xc) * float(yc @ yc))
    return float(xc @ yc) / den if den > 0 else math.nan


def permutation_correlation(x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None, *,
                            method: str = "pearson", n_permutations: int = 9999, seed: Any = 0,
                            confidence_level: float = 0.95) -> dict:
    """Correlation of x and y within groups, Fisher-z CI and a two-sided permutation p-value.

    With one group this is the ordinary correlation (n_eff = n); with G groups (e.g. refits),
    x and y are centred within each group first and n_eff = n − (G − 1). The permutation null
    shuffles y within each group; with one group of at most 8 elements every permutation is
    enumerated (exact p-value).
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    groups = np.zeros(x.size, dtype=np.int64) if groups is None else np.asarray(groups)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y, groups = x[ok], y[ok], groups[ok]
    if method == "spearman":
        x, y = _ranks(x), _ranks(y)
    elif method != "pearson":
        raise _input_error(f"unknown correlation {method!r}; use pearson or spearman")
    n = x.size
    uniq = np.unique(groups)
    n_eff = n - (len(uniq) - 1)
    r = _centered_r(x, y, groups) if n >= 3 else math.nan
    lo, hi = fisher_interval(r, n_eff, confidence_level)
    if not np.isfinite(r):
        return {"r": r, "ci_low": lo, "ci_high": hi, "pvalue": math.nan, "n": int(n), "n_eff": int(n_eff),
                "permutations": 0, "exact": False}
    idx = [np.flatnonzero(groups == gid) for gid in uniq]
    tol = 1e-12 * max(1.0, abs(r))
    # centring within groups commutes with permuting within groups: permute the centred values
    xc, yc = x.copy(), y.copy()
    for ix in idx:
        xc[ix] -= xc[ix].mean()
        yc[ix] -= yc[ix].mean()
    den = math.sqrt(float(xc @ xc) * float(yc @ yc))
    if len(idx) == 1 and n <= 8:
        perms = np.array(list(itertools.permutations(range(n))))
        null = yc[perms] @ xc / den
        p = float(np.mean(np.abs(null) >= abs(r) - tol))
        return {"r": r, "ci_low": lo, "ci_high": hi, "pvalue": p, "n": int(n), "n_eff": int(n_eff),
                "permutations": len(perms), "exact": True}
    rng = np.random.default_rng(as_seed_sequence(seed))
    count = 0
    for start in range(0, n_permutations, 1000):
        b = min(1000, n_permutations - start)
        order = np.tile(np.arange(n), (b, 1))
        for ix in idx:
            order[:, ix] = ix[np.argsort(rng.random((b, ix.size)), axis=1)]
        count += int(np.sum(np.abs(yc[order] @ xc / den) >= abs(r) - tol))
    return {"r": r, "ci_low": lo, "ci_high": hi, "pvalue": (1 + count) / (1 + n_permutations), "n": int(n),
            "n_eff": int(n_eff), "permutations": n_permutations, "exact": False}


# =============================================================================================
# Matching helpers
# =============================================================================================
def _matched_scores(sim: np.ndarray, method: str) -> np.ndarray:
    """Matched similarity of every source head: ``sim [..., H1, H2] -> [..., H1]``."""
    if method == "max":
        s = np.where(np.isnan(sim), -np.inf, sim).max(axis=-1)
        return np.where(np.isneginf(s), np.nan, s)
    flat = sim.reshape(-1, *sim.shape[-2:])
    out = np.stack([match_heads(m, "hungarian")[1] for m in flat])
    return out.reshape(sim.shape[:-1])


def _weighted_mean_prompts(W: np.ndarray, cos: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Prompt-weighted mean of per-prompt cosines: W [R, P], cos/valid [P, ...] -> [R, ...]."""
    shp = cos.shape[1:]
    num = W @ cos.reshape(cos.shape[0], -1)
    den = W @ valid.reshape(valid.shape[0], -1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (num / den).reshape((W.shape[0],) + shp)


def _quantiles(x: np.ndarray, confidence_level: float) -> tuple[np.ndarray, np.ndarray]:
    a = (1 - confidence_level) / 2
    with np.errstate(invalid="ignore"), _quiet():
        lo, hi = np.nanquantile(x, [a, 1 - a], axis=0)
    return lo, hi


class _quiet:
    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *a):
        self._w.__exit__(*a)


def _blas_threads(n: int):
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(limits=n, user_api="blas")


def _nanmean(x, axis=None):
    with _quiet():
        return np.nanmean(x, axis=axis)


def _cka_pairs(kind: str, Xs: dict, pairs: list, row_idx: list | None) -> tuple[np.ndarray, np.ndarray | None]:
    """CKA of each (a, b) pair on all rows, and per bootstrap replicate of rows (``row_idx``).

    Linear CKA is recomputed on the resampled rows. RBF and debiased CKA index precomputed Gram
    matrices (the RBF bandwidth stays the full-sample median heuristic) and centre each model's
    resampled Gram once per replicate.
    """
    from stats.similarity import _center_gram, _cka_from_centered, _rbf_gram, _u_center_gram

    fn = CKA_KINDS[kind]
    v0 = np.array([fn(Xs[a], Xs[b]) for a, b in pairs])
    if row_idx is None:
        return v0, None
    vr = np.zeros((len(row_idx), len(pairs)))
    if kind == "linear":
        for r, ix in enumerate(row_idx):
            vr[r] = [fn(Xs[a][ix], Xs[b][ix]) for a, b in pairs]
        return v0, vr
    if kind == "rbf":
        grams, center = {m: _rbf_gram(np.asarray(X, dtype=np.float64), 1.0) for m, X in Xs.items()}, _center_gram
    else:
        grams, center = {m: X @ X.T for m, X in Xs.items()}, _u_center_gram
    for r, ix in enumerate(row_idx):
        cg = {m: center(G[np.ix_(ix, ix)]) for m, G in grams.items()}
        vr[r] = [_cka_from_centered(cg[a], cg[b]) for a, b in pairs]
    return v0, vr


# =============================================================================================
# Result
# =============================================================================================
@dataclass(repr=False)
class HeadStabilityResult(Result):
    """Head/layer stability, importance, residual CKA and their intervals; ``.tables()`` for Parquet.

    Tables: ``heads`` (layer, head, stability, ci_low, ci_high, null_mean, distinctness,
    importance, match, pairs), ``layers`` (layer, stability, ci_low, ci_high, null_mean),
    ``residual`` (layer, hook, kind, cka, ci_low, ci_high), ``head_details`` (the other CIs and
    the cross-layer match), ``correlation`` (stability vs importance), ``summary`` (item, value,
    ci_low, ci_high, verdict) and ``refits``. ``replicates`` keeps the bootstrap replicates of
    the layer-level numbers (same resampling scheme for every result with the same
    ``n_boot``), so independent results can be compared replicate by replicate.
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
    main_table = "heads"

    # --- convenience -------------------------------------------------------------------------
    @property
    def head_stability(self) -> np.ndarray:
        """[L, H] stability of the anchor's heads."""
        return np.asarray(self.heads["stability"]).reshape(self.n_layers, self.n_heads)

    @property
    def layer_stability(self) -> np.ndarray:
        return np.asarray(self.layers["stability"])

    @property
    def gap(self) -> float:
        s = self.layer_stability
        return float(np.nanmax(s) - np.nanmin(s))

    @property
    def least_stable_layer(self) -> int:
        return int(np.nanargmin(self.layer_stability))

    def item(self, name: str) -> dict:
        """The summary row called ``name``."""
        for row in self.summary_rows:
            if row["item"] == name:
                return row
        raise KeyError(f"no summary item {name!r}; have {[r['item'] for r in self.summary_rows]}")

    def _tables(self) -> dict[str, dict[str, Any]]:
        summ = {k: np.array([r[k] for r in self.summary_rows], dtype=object if k in ("item", "verdict") else float)
                for k in ("item", "value", "ci_low", "ci_high", "verdict")}
        summ["item"] = np.array([str(v) for v in summ["item"]])
        summ["verdict"] = np.array([str(v) for v in summ["verdict"]])
        return {"heads": self.heads, "layers": self.layers, "residual": self.residual,
                "head_details": self.head_details, "correlation": self.correlation, "summary": summ,
                "refits": self.refits}

    def _summary_items(self) -> list[tuple[str, Any]]:
        items = [("refits", len(self.refits["refit"])), ("layers x heads", f"{self.n_layers} x {self.n_heads}"),
                 ("match / pairs", f"{self.params.get('match')} / {self.params.get('pairs')}")]
        for r in self.summary_rows:
            lo, hi = r["ci_low"], r["ci_high"]
            ci = f" [{lo:.3g}, {hi:.3g}]" if np.isfinite(lo) else ""
            items.append((r["item"], f"{r['value']:.4g}{ci}"))
        return items

    # --- writing -----------------------------------------------------------------------------
    def provenance(self) -> dict:
        return {"models": self.params.get("models", []), "probe": self.params.get("probe", {}),
                "seed": self.params.get("random_state"), "method": "head_stability",
                "params": {k: v for k, v in self.params.items() if k not in ("models", "probe")}}

    def write(self, run_dir, *, spec: Any = None, command: Any = None, force: bool = False) -> dict[str, Path]:
        """Write every table as ``<run_dir>/<table>.parquet`` with provenance and a manifest.

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
class HeadStability:
    """Cross-seed head stability estimator (scikit-learn style: parameters here, ``fit(models)``).

    Parameters
    ----------
    match : 'max' (the paper) or 'hungarian' (one-to-one).
    pairs : 'anchor' (the paper: one anchor refit against each other) or 'all'.
    anchor : index of the anchor refit.
    drop_bos : drop the first (BOS) column of every pattern before the cosine.
    null : 'prompts' (prompts of the other refit shuffled), 'untrained' (matching against
        independently initialised untrained models of the same architecture) or 'none'.
    n_null : permutations (prompts null) or untrained models (untrained null; default K − 1).
    n_boot : bootstrap replicates; ``ci_over``: 'both' (prompts and refits jointly), 'prompts'
        or 'refits'. ``confidence_level`` of every interval.
    importance : compute zero-ablation importance of every head.
    corr_refits : correlate stability with importance over the anchor's heads only ('anchor': n = H
        per layer) or over the heads of every refit, each refit's stability measured against the
        others and both variables centred within refit ('all', the default: n = K·H − (K − 1)).
    residual : compute residual-stream CKA at ``hooks`` ('pre', 'post') with ``cka`` kinds on
        ``cka_tokens`` positions per prompt (rows sampled by prompt in the bootstrap).
    corr : 'pearson' or 'spearman' for stability vs importance; ``n_perm`` random permutations.
    n_probe, probe_len, bos, probe_file, corpus, probe_seed : the default probe set
        (see :func:`build_probe`); ``fit(models, probe=...)`` overrides it.
    random_state : int seed of every random draw (bootstrap, null, permutations).
    """

    def __init__(self, match: str = "max", pairs: str = "anchor", anchor: int = 0, drop_bos: bool = False,
                 null: str = "prompts", n_null: int | None = None, n_boot: int = 200, n_boot_cka: int | None = None,
                 ci_over: str = "both",
                 confidence_level: float = 0.95, importance: bool = True, residual: bool = True,
                 hooks: Sequence[str] = ("pre", "post"), corr_refits: str = "all", cka: Sequence[str] = ("linear", "rbf", "debiased"),
                 cka_tokens: int = 4, corr: str = "pearson", n_perm: int = 9999, n_probe: int = 100,
                 probe_len: int | None = None, bos: bool = True, probe_file: str | None = None, corpus: Any = None,
                 probe_seed: int = 0, batch_size: int = 50, random_state: int | None = 0, n_jobs: int = 1) -> None:
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

    def get_params(self) -> dict:
        return {k: getattr(self, k) for k in (
            "match", "pairs", "anchor", "drop_bos", "null", "n_null", "n_boot", "n_boot_cka", "ci_over", "confidence_level",
            "importance", "corr_refits", "residual", "hooks", "cka", "cka_tokens", "corr", "n_perm", "n_probe", "probe_len", "bos",
            "probe_file", "probe_seed", "batch_size", "random_state", "n_jobs")}

    def _validate(self) -> None:
        for name, val, allowed in (("match", self.match, MATCHES), ("pairs", self.pairs, PAIRS),
                                   ("corr_refits", self.corr_refits, ("anchor", "all")),
                                   ("null", self.null, NULLS), ("ci_over", self.ci_over, CI_OVER)):
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

    # -- fit ----------------------------------------------------------------------------------
    def fit(self, models: Sequence[Any], probe: ProbeSet | np.ndarray | None = None) -> HeadStabilityResult:
        """Estimate stability over ``models`` (CircuitModels or directories / sources).

        BLAS and torch run with ``n_jobs`` threads inside fit (restored after): the matrices
        here are small, and oversubscribed threads on a busy machine cost 10-50x.
        """
        import torch

        self._validate()
        prev = torch.get_num_threads()
        torch.set_num_threads(max(1, int(self.n_jobs)))
        try:
            with _blas_threads(max(1, int(self.n_jobs))):
                return self._fit(models, probe)
        finally:
            torch.set_num_threads(prev)

    def _fit(self, models, probe) -> HeadStabilityResult:
        models = self._load(models)
        K = len(models)
        if K < 2:
            raise _input_error(f"head stability needs at least 2 refits, got {K}")
        cfg0 = models[0].cfg
        for m in models[1:]:
            if (m.cfg.n_layers, m.cfg.n_heads) != (cfg0.n_layers, cfg0.n_heads):
                raise _input_error("all refits must share one architecture (layers and heads per layer); got "
                                   f"{cfg0.n_layers}x{cfg0.n_heads} and {m.cfg.n_layers}x{m.cfg.n_heads}")
        if not 0 <= self.anchor < K:
            raise _input_error(f"anchor={self.anchor} is not a refit index (0..{K - 1})")
        L, H = cfg0.n_layers, cfg0.n_heads
        if H < 2:
            raise _input_error("head matching needs at least 2 heads per layer")
        pr = self._probe(models, probe)
        ids = pr.ids
        if ids.max() >= min(m.cfg.vocab_size for m in models):
            raise _input_error("probe token ids exceed the models' vocabulary")
        P, T = ids.shape
        A = int(self.anchor)
        root = as_seed_sequence(self.random_state)
        s_prompts, s_refits, s_null, s_perm, s_untrained = spawn_seeds(root, 5)
        R, cl = int(self.n_boot), float(self.confidence_level)
        all_pairs = self.pairs == "all"
        corr_all = self.importance and self.corr_refits == "all"
        every = all_pairs or corr_all  # cosines of every ordered pair of refits are needed

        # ---- read-outs ---------------------------------------------------------------------
        pats = [attention_patterns(m, ids, self.batch_size) for m in models]  # [L, H, P, T, T]

        # ---- per-prompt cosines --------------------------------------------------------------
        targets = [b for b in range(K) if b != A]
        cross: dict[int, np.ndarray] = {}
        block: dict[tuple[int, int], np.ndarray] = {}  # (a, b) -> [P, L, H, H]
        for b in targets:
            full = per_prompt_cosine(pats[A].reshape(L * H, P, T, T), pats[b].reshape(L * H, P, T, T),
                                     drop_bos=self.drop_bos)  # [P, LH, LH]
            cross[b] = full
            f5 = full.reshape(P, L, H, L, H)
            blk = np.stack([f5[:, l, :, l, :] for l in range(L)], axis=1)  # [P, L, H, H]
            block[(A, b)] = blk
            if every:
                block[(b, A)] = blk.transpose(0, 1, 3, 2)
        if every:
            for a, b in itertools.combinations(targets, 2):
                blk = np.stack([per_prompt_cosine(pats[a][l], pats[b][l], drop_bos=self.drop_bos) for l in range(L)],
                               axis=1)
                block[(a, b)] = blk
                block[(b, a)] = blk.transpose(0, 1, 3, 2)
        self_blk = np.stack([per_prompt_cosine(pats[A][l], pats[A][l], drop_bos=self.drop_bos) for l in range(L)],
                            axis=1)  # [P, L, H, H]
        pair_list = sorted(block)
        pidx = {p: i for i, p in enumerate(pair_list)}
        C = np.stack([block[p] for p in pair_list], axis=1)  # [P, npairs, L, H, H]
        V = (~np.isnan(C)).astype(np.float64)
        C = np.nan_to_num(C, nan=0.0)

        # ---- resampling weights --------------------------------------------------------------
        use_p = self.ci_over in ("both", "prompts")
        use_r = self.ci_over in ("both", "refits")
        Wp = ResamplingPlan.bootstrap(P, R, s_prompts).counts.astype(np.float64) if use_p else np.ones((R, P))
        ones_p = np.ones((1, P))
        rr = np.random.default_rng(s_refits)
        if use_r:
            draw_t = rr.choice(np.asarray(targets), size=(R, len(targets)), replace=True)
            draw_a = rr.integers(0, K, size=(R, K))
        else:
            draw_t = np.tile(np.asarray(targets), (R, 1))
            draw_a = np.tile(np.arange(K), (R, 1))
        Ct = np.stack([np.bincount(d, minlength=K) for d in draw_t]).astype(np.float64)  # [R, K] target counts
        Ca = np.stack([np.bincount(d, minlength=K) for d in draw_a]).astype(np.float64)  # [R, K] refit counts
        ct0 = np.zeros(K)
        ct0[targets] = 1.0
        ca0 = np.ones(K)

        # ---- matched scores: point and replicates --------------------------------------------
        sims0 = _weighted_mean_prompts(ones_p, C, V)[0]  # [npairs, L, H, H]
        M0 = _matched_scores(sims0, self.match)  # [npairs, L, H]
        Mr = _matched_scores(_weighted_mean_prompts(Wp, C, V), self.match)  # [R, npairs, L, H]
        match_idx = {p: np.stack([match_heads(sims0[pidx[p], l], self.match)[0] for l in range(L)])
                     for p in pair_list if p[0] == A}

        anchor_rows = np.array([pidx[(A, b)] for b in targets])

        def head_stab(M, ct):  # M [..., npairs, L, H], ct [..., K] -> [..., L, H]
            w = ct[..., targets]  # [..., nt]
            num = np.einsum("...t,...tlh->...lh", w, M[..., anchor_rows, :, :])
            return num / w.sum(-1)[..., None, None]

        def layer_stab(M, ct, ca):  # -> [..., L]
            if not all_pairs:
                return _nanmean(head_stab(M, ct), axis=-1)
            pa = np.array([p[0] for p in pair_list])
            pb = np.array([p[1] for p in pair_list])
            w = ca[..., pa] * ca[..., pb]  # [..., npairs]
            mh = _nanmean(M, axis=-1)  # [..., npairs, L]
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.einsum("...p,...pl->...l", w, mh) / w.sum(-1)[..., None]

        hs0 = head_stab(M0, ct0)  # [L, H]
        hsr = head_stab(Mr, Ct)  # [R, L, H]
        ls0 = layer_stab(M0, ct0, ca0)  # [L]
        lsr = layer_stab(Mr, Ct, Ca)  # [R, L]

        # per-source head stability (point) for the correlation with importance
        sources = list(range(K)) if all_pairs else [A]  # anchors of the layer-level numbers and the null
        corr_sources = list(range(K)) if (all_pairs or corr_all) else [A]
        src_stab = {}
        for a in corr_sources:
            rows = [pidx[(a, b)] for b in range(K) if b != a]
            src_stab[a] = M0[rows].mean(0)  # [L, H]

        # ---- distinctness (anchor) -------------------------------------------------------------
        Vs = (~np.isnan(self_blk)).astype(np.float64)
        Cs = np.nan_to_num(self_blk, nan=0.0)
        off = ~np.eye(H, dtype=bool)

        def distinct(S):  # [..., L, H, H] -> [..., L, H]
            return 1.0 - np.where(off, S, 0.0).sum(-1) / (H - 1)

        d0 = distinct(_weighted_mean_prompts(ones_p, Cs, Vs)[0])
        dr = distinct(_weighted_mean_prompts(Wp, Cs, Vs))

        # ---- cross-layer best match (anchor heads) ------------------------------------------------
        layer_of = np.repeat(np.arange(L), H)
        best_sim0, best_layer0 = [], []
        best_sim_r = np.zeros((R, L * H))
        for b in targets:
            Vb = (~np.isnan(cross[b])).astype(np.float64)
            Cb = np.nan_to_num(cross[b], nan=0.0)
            s0 = _weighted_mean_prompts(ones_p, Cb, Vb)[0]  # [LH, LH]
            s0m = np.where(np.isnan(s0), -np.inf, s0)
            best_sim0.append(s0m.max(-1))
            best_layer0.append(layer_of[s0m.argmax(-1)])
            sr = _weighted_mean_prompts(Wp, Cb, Vb)
            best_sim_r += Ct[:, [b]] * np.where(np.isnan(sr), -np.inf, sr).max(-1)
        best_sim0 = np.mean(best_sim0, axis=0)
        best_sim_r /= Ct[:, targets].sum(1, keepdims=True)
        best_layer0 = np.stack(best_layer0)  # [nt, LH]
        same_share = (best_layer0 == layer_of[None]).mean(0)
        modal_layer = np.array([np.bincount(best_layer0[:, i], minlength=L).argmax() for i in range(L * H)])

        # ---- null --------------------------------------------------------------------------
        null_head = np.full((L, H), np.nan)
        null_layer = np.full(L, np.nan)
        null_desc = self.null
        if self.null == "prompts":
            n_null = 50 if self.n_null is None else int(self.n_null)
            src_pairs = [(a, b) for a in sources for b in range(K) if b != a]
            seeds = spawn_seeds(s_null, len(src_pairs) * L)
            nh = {}
            for i, (a, b) in enumerate(src_pairs):
                nh[(a, b)] = np.stack([
                    head_matching(pats[a][l], pats[b][l], method=self.match, drop_bos=self.drop_bos,
                                  n_permutations=n_null, n_bootstrap=0, seed=seeds[i * L + l],
                                  n_jobs=self.n_jobs).null_head_mean for l in range(L)])
            null_head = np.mean([nh[(A, b)] for b in targets], axis=0)
            null_layer = np.mean([_nanmean(nh[p], axis=-1) for p in src_pairs], axis=0)
            null_desc = f"prompts of the other refit shuffled ({n_null} permutations)"
        elif self.null == "untrained":
            from circuits.model import CircuitModel

            n_u = max(2, K - 1) if self.n_null is None else int(self.n_null)
            useeds = [int(s.generate_state(1)[0]) for s in spawn_seeds(s_untrained, n_u)]
            per_src: dict[int, list] = {a: [] for a in sources}
            for us in useeds:
                um = CircuitModel(cfg0).init_weights(us).to(models[0].device).eval()
                up = attention_patterns(um, ids, self.batch_size)
                for a in sources:
                    sims = np.stack([np.nanmean(per_prompt_cosine(pats[a][l], up[l], drop_bos=self.drop_bos), axis=0)
                                     for l in range(L)])
                    per_src[a].append(_matched_scores(sims, self.match))
                del up, um
            null_head = np.mean(per_src[A], axis=0)
            null_layer = np.mean([_nanmean(np.mean(per_src[a], axis=0), axis=-1) for a in sources], axis=0)
            null_desc = f"independently initialised untrained models ({n_u}, seeds {useeds})"

        # ---- importance ------------------------------------------------------------------------
        imp0 = np.full((L, H), np.nan)
        imp_lo = np.full((L, H), np.nan)
        imp_hi = np.full((L, H), np.nan)
        corr_rows: dict[str, list] = {k: [] for k in ("scope", "layer", "r", "ci_low", "ci_high", "pvalue", "n",
                                                      "n_eff", "refits", "method")}
        importance_by_src = {}
        if self.importance:
            for a in corr_sources:
                clean, abl = head_importance(models[a], ids, self.batch_size)
                importance_by_src[a] = np.exp(abl.mean(-1)) - math.exp(clean.mean())
                if a == A:
                    tot = Wp.sum(1)
                    cr = (Wp @ clean) / tot  # [R]
                    ar = np.einsum("rp,lhp->rlh", Wp, abl) / tot[:, None, None]
                    imp_r = np.exp(ar) - np.exp(cr)[:, None, None]
                    imp0 = importance_by_src[A]
                    imp_lo, imp_hi = _quantiles(imp_r, cl)
            pseeds = spawn_seeds(s_perm, L + 1)
            deep = list(range(L // 2, L)) if L > 1 else [0]
            scopes = [("layer", [l], pseeds[l]) for l in range(L)] + [("deep", deep, pseeds[L])]
            for scope, lays, ps in scopes:
                xs, ys, gs = [], [], []
                for gi, (a, l) in enumerate(itertools.product(corr_sources, lays)):
                    xs.append(src_stab[a][l])
                    ys.append(importance_by_src[a][l])
                    gs.append(np.full(H, gi))
                res = permutation_correlation(np.concatenate(xs), np.concatenate(ys), np.concatenate(gs),
                                              method=self.corr, n_permutations=self.n_perm, seed=ps,
                                              confidence_level=cl)
                corr_rows["scope"].append(scope)
                corr_rows["layer"].append(lays[0] if scope == "layer" else -1)
                for k in ("r", "ci_low", "ci_high", "pvalue", "n", "n_eff"):
                    corr_rows[k].append(res[k])
                corr_rows["refits"].append(len(corr_sources))
                corr_rows["method"].append(self.corr)

        # ---- residual stream -------------------------------------------------------------------
        res_rows: dict[str, list] = {k: [] for k in ("layer", "hook", "kind", "cka", "ci_low", "ci_high")}
        resid_rep: dict[str, np.ndarray] = {}
        if self.residual and self.hooks and self.cka:
            pos = cka_positions(T, self.cka_tokens)
            r_per = pos.size
            res = [residual_rows(m, ids, pos, self.hooks, self.batch_size) for m in models]
            rpairs = [(A, b) for b in targets] if not all_pairs else list(itertools.combinations(range(K), 2))
            Rc = R if self.n_boot_cka is None else max(1, min(R, int(self.n_boot_cka)))  # first Rc replicates
            prompt_idx = [np.repeat(np.arange(P), Wp[r].astype(np.int64)) for r in range(Rc)]
            row_idx = [(pi[:, None] * r_per + np.arange(r_per)).ravel() for pi in prompt_idx]
            if all_pairs:
                wts = np.stack([Ca[:Rc, a] * Ca[:Rc, b] for a, b in rpairs], axis=1)  # [Rc, npairs]
            else:
                wts = np.stack([Ct[:Rc, b] for _, b in rpairs], axis=1)
            w0 = np.ones(len(rpairs))
            for hook in self.hooks:
                for kind in self.cka:
                    vals0 = np.zeros((L, len(rpairs)))
                    valsr = np.zeros((Rc, L, len(rpairs)))
                    for l in range(L):
                        Xs = {m: res[m][hook][l] for m in {i for p in rpairs for i in p}}
                        v0, vr = _cka_pairs(kind, Xs, rpairs, row_idx if use_p else None)
                        vals0[l], valsr[:, l] = v0, (vr if use_p else v0[None])
                    c0 = vals0 @ w0 / w0.sum()
                    with np.errstate(invalid="ignore", divide="ignore"):
                        cr = np.einsum("rlj,rj->rl", valsr, wts) / wts.sum(1)[:, None]
                    lo, hi = _quantiles(cr, cl)
                    resid_rep[f"{kind}:{hook}"] = cr
                    for l in range(L):
                        res_rows["layer"].append(l)
                        res_rows["hook"].append(hook)
                        res_rows["kind"].append(kind)
                        res_rows["cka"].append(c0[l])
                        res_rows["ci_low"].append(lo[l])
                        res_rows["ci_high"].append(hi[l])
            del res

        # ---- layer-level derived numbers ----------------------------------------------------------
        def derived(ls):  # [..., L] -> dict of [...]
            with _quiet():
                return _derived(ls)

        def _derived(ls):
            out = {"mean": _nanmean(ls, axis=-1),
                   "gap": np.nanmax(ls, axis=-1) - np.nanmin(ls, axis=-1),
                   "argmin": np.nanargmin(np.where(np.isnan(ls), np.inf, ls), axis=-1).astype(float)}
            out["argmin_rel"] = out["argmin"] / (L - 1) if L > 1 else out["argmin"] * np.nan
            if L >= 3:
                ends = (ls[..., 0] + ls[..., -1]) / 2
                mid = _nanmean(ls[..., 1:-1], axis=-1)
                out["ends_minus_middle"] = ends - mid
                out["middle_min"] = ((out["argmin"] > 0) & (out["argmin"] < L - 1)).astype(float)
            return out

        der0, derr = derived(ls0), derived(lsr)
        # the gap a layer structure-free model would show: the anchor's head stabilities shuffled
        # across layers (a max - min over more layers grows with L even without any layer effect)
        shuf = np.random.default_rng(spawn_seeds(s_perm, L + 2)[L + 1])
        n_shuf = 50
        perms = np.argsort(shuf.random((n_shuf, L * H)), axis=1)

        def shuffled_gap(hs):  # [..., L, H] -> [...]
            flat = hs.reshape(hs.shape[:-2] + (L * H,))
            lm = _nanmean(flat[..., perms].reshape(hs.shape[:-2] + (n_shuf, L, H)), axis=-1)
            with _quiet():
                return np.nanmean(np.nanmax(lm, axis=-1) - np.nanmin(lm, axis=-1), axis=-1)

        der0["gap_shuffled"], derr["gap_shuffled"] = shuffled_gap(hs0), shuffled_gap(hsr)
        der0["gap_excess"] = der0["gap"] - der0["gap_shuffled"]
        derr["gap_excess"] = derr["gap"] - derr["gap_shuffled"]
        summary_rows = []

        def add(item, value, reps=None, verdict="", discrete=False):
            lo, hi = (_quantiles(reps, cl) if reps is not None else (np.nan, np.nan))
            if discrete and reps is not None and np.isfinite(reps).any():  # a layer index: no interpolation
                a = (1 - cl) / 2
                lo, hi = np.quantile(reps[np.isfinite(reps)], [a, 1 - a], method="inverted_cdf")
            summary_rows.append({"item": item, "value": float(value), "ci_low": float(lo), "ci_high": float(hi),
                                 "verdict": verdict})

        add("mean head stability", der0["mean"], derr["mean"])
        add("mean null", float(np.nanmean(null_layer)) if np.isfinite(null_layer).any() else np.nan)
        add("gap (max - min layer stability)", der0["gap"], derr["gap"])
        add("gap expected with heads shuffled across layers", der0["gap_shuffled"], derr["gap_shuffled"])
        add("excess gap (gap minus its shuffled-layers expectation)", der0["gap_excess"], derr["gap_excess"])
        add("least stable layer", der0["argmin"], derr["argmin"], discrete=True)
        add("least stable layer (relative position)", der0["argmin_rel"], derr["argmin_rel"], discrete=True)
        if L >= 3:
            add("ends minus middle layer stability", der0["ends_minus_middle"], derr["ends_minus_middle"])
            add("share of replicates with the least stable layer in the middle", float(derr["middle_min"].mean()))
        add("mean distinctness", float(np.nanmean(d0)), _nanmean(dr.reshape(R, -1), axis=1))
        add("mean cross-layer best match", float(np.nanmean(best_sim0)), _nanmean(best_sim_r, axis=1))
        add("share of heads whose cross-layer best match is in their own layer", float(same_share.mean()))
        for key, cr in resid_rep.items():
            kind, hook = key.split(":")
            mean0 = float(np.mean([c for c, k_, h_ in zip(res_rows["cka"], res_rows["kind"], res_rows["hook"])
                                   if k_ == kind and h_ == hook]))
            add(f"mean residual {kind} CKA ({hook})", mean0, _nanmean(cr, axis=1))
            add(f"mean residual {kind} CKA ({hook}) minus mean head stability",
                mean0 - float(der0["mean"]), _nanmean(cr, axis=1) - derr["mean"][:cr.shape[0]])
        if corr_rows["scope"]:
            j = corr_rows["scope"].index("deep")
            summary_rows.append({"item": "correlation of stability and importance (deep layers)",
                                 "value": float(corr_rows["r"][j]), "ci_low": float(corr_rows["ci_low"][j]),
                                 "ci_high": float(corr_rows["ci_high"][j]), "verdict": ""})

        # ---- tables ------------------------------------------------------------------------------
        hlo, hhi = _quantiles(hsr, cl)
        llo, lhi = _quantiles(lsr, cl)
        dlo, dhi = _quantiles(dr, cl)
        blo, bhi = _quantiles(best_sim_r, cl)
        # the same stability with one source of uncertainty only (for the detail table)
        hs_p = head_stab(Mr, np.broadcast_to(ct0, Ct.shape))
        hs_r = head_stab(np.broadcast_to(M0, Mr.shape), Ct)
        plo, phi = _quantiles(hs_p, cl)
        rlo, rhi = _quantiles(hs_r, cl)
        LL, HH = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
        match_txt = []
        for l in range(L):
            for h in range(H):
                match_txt.append(" ".join(f"r{b}:h{int(match_idx[(A, b)][l, h])}" for b in targets))
        pairs_txt = "anchor" if not all_pairs else "all"
        heads = {"layer": LL.ravel().astype(np.int64), "head": HH.ravel().astype(np.int64),
                 "stability": hs0.ravel(), "ci_low": hlo.ravel(), "ci_high": hhi.ravel(),
                 "null_mean": null_head.ravel(), "distinctness": d0.ravel(), "importance": imp0.ravel(),
                 "match": np.array(match_txt), "pairs": np.array([pairs_txt] * (L * H))}
        layers = {"layer": np.arange(L, dtype=np.int64), "stability": ls0, "ci_low": llo, "ci_high": lhi,
                  "null_mean": null_layer}
        residual = {"layer": np.asarray(res_rows["layer"], dtype=np.int64),
                    "hook": np.asarray(res_rows["hook"], dtype=str), "kind": np.asarray(res_rows["kind"], dtype=str),
                    "cka": np.asarray(res_rows["cka"], dtype=float), "ci_low": np.asarray(res_rows["ci_low"], dtype=float),
                    "ci_high": np.asarray(res_rows["ci_high"], dtype=float)}
        details = {"layer": LL.ravel().astype(np.int64), "head": HH.ravel().astype(np.int64),
                   "stability_ci_low_prompts": plo.ravel(), "stability_ci_high_prompts": phi.ravel(),
                   "stability_ci_low_refits": rlo.ravel(), "stability_ci_high_refits": rhi.ravel(),
                   "distinctness_ci_low": dlo.ravel(), "distinctness_ci_high": dhi.ravel(),
                   "importance_ci_low": imp_lo.ravel(), "importance_ci_high": imp_hi.ravel(),
                   "cross_layer_similarity": best_sim0, "cross_layer_ci_low": blo, "cross_layer_ci_high": bhi,
                   "cross_layer_best_layer": modal_layer.astype(np.int64), "cross_layer_same_layer_share": same_share}
        correlation = {"scope": np.asarray(corr_rows["scope"], dtype=str),
                       "layer": np.asarray(corr_rows["layer"], dtype=np.int64),
                       **{k: np.asarray(corr_rows[k], dtype=float) for k in ("r", "ci_low", "ci_high", "pvalue")},
                       **{k: np.asarray(corr_rows[k], dtype=np.int64) for k in ("n", "n_eff", "refits")},
                       "method": np.asarray(corr_rows["method"], dtype=str)}
        ident = []
        for i, m in enumerate(models):
            t = getattr(m, "meta", {}).get("training", {})
            ident.append({"refit": i, "source": str(getattr(m, "source", "memory")), "weight_hash": m.weight_hash(),
                          "seed": t.get("seed"), "role": "anchor" if i == A else "refit"})
        refits = {"refit": np.arange(K, dtype=np.int64), "source": np.array([d["source"] for d in ident]),
                  "weight_hash": np.array([d["weight_hash"] for d in ident]),
                  "seed": np.array([-1 if d["seed"] is None else int(d["seed"]) for d in ident], dtype=np.int64),
                  "role": np.array([d["role"] for d in ident])}
        params = {**self.get_params(), "estimator": "HeadStability", "null_description": null_desc,
                  "models": ident, "probe": pr.describe(), "n_refits": K, "n_layers": L, "n_heads": H,
                  "seed_record": seed_record(root),
                  "similarity": "cosine of lower-triangle (with diagonal) attention patterns per prompt, mean over prompts",
                  "importance_definition": "exp(mean next-token loss, head zero-ablated) - exp(mean clean loss) on the probe set",
                  "bootstrap": f"{R} replicates; resampled: {self.ci_over}; percentile intervals"}
        replicates = {"layer": lsr, **{k: v for k, v in derr.items()}, "head": hsr,
                      **{f"resid:{k}": _nanmean(v, axis=1) for k, v in resid_rep.items()}}
        return HeadStabilityResult(L, H, heads, layers, residual, details, correlation, summary_rows, refits,
                                   replicates, params)


# =============================================================================================
# CLI
# =============================================================================================
try:  # typer is a declared dependency; keep the module importable without it
    import typer as _typer

    _Opt = _typer.Option
    _Arg = _typer.Argument
except ImportError:  # pragma: no cover
    def _Opt(default, *a, **k):  # type: ignore
        return default

    _Arg = _Opt  # type: ignore


def heads_command(
    models: list[str] = _Opt(..., "--models", help="model directory, cached hub id or hub/id@revision; repeat the "
                             "option (or separate by commas) for each refit, the first is the anchor"),
    match: str = _Opt("max", "--match", help="max (the paper) or hungarian (one-to-one)"),
    pairs: str = _Opt("anchor", "--pairs", help="anchor (the paper: refit 0 against each other) or all"),
    anchor: int = _Opt(0, "--anchor", help="index of the anchor refit"),
    drop_bos: bool = _Opt(False, "--drop-bos", help="drop the BOS column of every pattern"),
    null: str = _Opt("prompts", "--null", help="prompts (shuffled prompts), untrained (random-init models) or none"),
    n_probe: int = _Opt(100, "--n-probe", help="probe prompts (held-out corpus snippets)"),
    probe_len: int | None = _Opt(None, "--probe-len", help="tokens per probe prompt, BOS included (default 64, or n_ctx if smaller)"),
    probe_file: Path | None = _Opt(None, "--probe-file", help=".txt (one prompt per line) or .jsonl (field text)"),
    bos: bool = _Opt(True, "--bos/--no-bos", help="prepend the BOS token to every probe prompt"),
    corpus: str | None = _Opt(None, "--corpus", help="corpus of the probe snippets (its held-out probe split); "
                              "default: the models' training corpus if it is stdlib"),
    hooks: str = _Opt("pre,post", "--hooks", help="residual hooks: pre (before attention), post (after attention)"),
    n_boot: int = _Opt(200, "--n-boot", help="bootstrap replicates"),
    ci_over: str = _Opt("both", "--ci-over", help="both, prompts or refits"),
    seed: int = _Opt(0, "--seed"),
    device: str = _Opt("cpu", "--device"),
    out: Path = _Opt(..., "--out", help="run directory: heads/layers/residual.parquet and more, manifest.json"),
    force: bool = _Opt(False, "--force", help="recompute if the directory holds a different spec"),
) -> HeadStabilityResult:
    """Cross-seed stability of attention heads and of the residual stream, with bootstrap CIs."""
    import sys

    models = [p for m in models for p in str(m).split(",") if p]
    if len(models) < 2:
        raise _input_error("pass at least 2 models (--models DIR --models DIR ..., or --models DIR,DIR,...)")
    loaded = [load_source(m, device=device) for m in models]
    est = HeadStability(match=match, pairs=pairs, anchor=anchor, drop_bos=drop_bos, null=null, n_boot=n_boot,
                        ci_over=ci_over, n_probe=n_probe, probe_len=probe_len, bos=bos,
                        probe_file=str(probe_file) if probe_file else None, corpus=corpus,
                        hooks=tuple(h.strip() for h in hooks.split(",") if h.strip()), random_state=seed)
    res = est.fit(loaded)
    spec = {"models": list(models), "corpus": corpus, **est.get_params()}
    res.write(out, spec=spec, command=sys.argv, force=force)
    print(res.summary())
    print(f"-> {out}")
    return res
