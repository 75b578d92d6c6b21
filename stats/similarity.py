"""Representation similarity: attention-pattern cosine, CKA (linear, debiased, RBF), Procrustes,
head matching (max and Hungarian), each with a seeded shuffled-rows null.

Attention heads are represented per prompt by the lower triangle (with diagonal) of their
[T, T] pattern; similarity is the cosine per prompt averaged over prompts (Bali et al. 2026).
BOS attention sinks inflate that cosine, so the BOS column can be dropped, and every similarity
comes with a null from shuffling rows (prompts or samples) of one side. Null draws each get
their own child SeedSequence, so the null does not depend on n_jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from scipy.optimize import linear_sum_assignment

from circuitstat.core.seeds import as_seed_sequence, seed_record, spawn_seeds
from circuitstat.core.results import ConfidenceInterval, Result
from circuitstat.core.params import N_RESAMPLES

from .resampling import ResamplingPlan, resolve_jobs, resampled_means
from .intervals import interval_text
from .testing import resampling_pvalue

__all__ = [
    "attention_vectors",
    "per_prompt_cosine",
    "attention_similarity",
    "head_distinctness",
    "linear_cka",
    "debiased_cka",
    "rbf_cka",
    "procrustes_distance",
    "match_heads",
    "SimilarityResult",
    "similarity_test",
    "HeadMatchResult",
    "head_matching",
]


# --- attention patterns --------------------------------------------------------------------
def attention_vectors(patterns: np.ndarray, *, drop_bos: bool = False) -> np.ndarray:
    """Return the lower triangle (with diagonal) of [..., T, T] patterns as [..., D] vectors."""
    p = np.asarray(patterns)
    if p.ndim < 2 or p.shape[-1] != p.shape[-2]:
        raise ValueError(f"attention patterns must end in square [T, T] axes, got {p.shape}")
    t = p.shape[-1]
    rows, cols = np.tril_indices(t)
    if drop_bos:
        keep = cols != 0  # attention to the first (BOS) token: a sink shared by most heads
        rows, cols = rows[keep], cols[keep]
    return p[..., rows, cols]


def _unit(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (v / ||v|| along the last axis with zero vectors left zero, valid mask)."""
    v = np.asarray(v, dtype=np.float64)
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    ok = norm > 0
    return np.where(ok, v / np.where(ok, norm, 1.0), 0.0), ok[..., 0]


def per_prompt_cosine(A: np.ndarray, B: np.ndarray, *, drop_bos: bool = False) -> np.ndarray:
    """Return cosine per prompt [P, H1, H2] of heads A [H1, P, T, T] vs B [H2, P, T, T] (NaN if a pattern is zero)."""
    ua, oka = _unit(attention_vectors(A, drop_bos=drop_bos))
    ub, okb = _unit(attention_vectors(B, drop_bos=drop_bos))
    if ua.shape[1:] != ub.shape[1:]:
        raise ValueError(f"A and B must share prompts and length: {ua.shape[1:]} vs {ub.shape[1:]}")
    cos = np.einsum("hpd,gpd->phg", ua, ub)
    valid = oka.T[:, :, None] & okb.T[:, None, :]
    return np.where(valid, cos, np.nan)


def attention_similarity(A: np.ndarray, B: np.ndarray, *, drop_bos: bool = False) -> np.ndarray:
    """Return [H1, H2] similarity: per-prompt cosine of lower-triangle patterns, mean over prompts."""
    return np.nanmean(per_prompt_cosine(A, B, drop_bos=drop_bos), axis=0)


def head_distinctness(A: np.ndarray, *, drop_bos: bool = False) -> np.ndarray:
    """Return 1 - mean similarity of each head to the other heads of its layer [H]."""
    sim = attention_similarity(A, A, drop_bos=drop_bos)
    h = sim.shape[0]
    if h < 2:
        raise ValueError("distinctness needs at least 2 heads in the layer")
    off = ~np.eye(h, dtype=bool)
    return 1.0 - np.array([sim[i, off[i]].mean() for i in range(h)])


# --- representation similarity -------------------------------------------------------------
def _check_xy(X: np.ndarray, Y: np.ndarray, min_n: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Return X, Y as 2-D float64 arrays with the same number of rows (samples)."""
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    X = X[:, None] if X.ndim == 1 else X.reshape(X.shape[0], -1)
    Y = Y[:, None] if Y.ndim == 1 else Y.reshape(Y.shape[0], -1)
    if X.shape[0] != Y.shape[0]:
        raise ValueError(f"X and Y need the same samples (rows): {X.shape[0]} vs {Y.shape[0]}")
    if X.shape[0] < min_n:
        raise ValueError(f"need at least {min_n} samples, got {X.shape[0]}")
    if not (np.isfinite(X).all() and np.isfinite(Y).all()):
        raise ValueError("representations contain NaN/inf")
    return X, Y


def center_gram(K: np.ndarray) -> np.ndarray:
    """Return H K H (double-centred Gram matrix)."""
    K = K - K.mean(axis=0, keepdims=True)
    return K - K.mean(axis=1, keepdims=True)


def u_center_gram(K: np.ndarray) -> np.ndarray:
    """Return the U-centred Gram matrix (Székely & Rizzo 2014): <U(K), U(L)>/(n(n-3)) is unbiased HSIC."""
    n = K.shape[0]
    K = K.copy()
    np.fill_diagonal(K, 0.0)
    means = K.sum(axis=0) / (n - 2)
    means -= means.sum() / (2 * (n - 1))
    K -= means[:, None]
    K -= means[None, :]
    np.fill_diagonal(K, 0.0)
    return K


def cka_from_centered(Kc: np.ndarray, Lc: np.ndarray) -> float:
    """Return <Kc, Lc> / (||Kc|| ||Lc||) for centred Gram matrices."""
    num = float(np.vdot(Kc, Lc))
    den = np.sqrt(float(np.vdot(Kc, Kc)) * float(np.vdot(Lc, Lc)))
    return num / den if den > 0 else np.nan


def linear_cka(X: np.ndarray, Y: np.ndarray) -> float:
    """Return linear CKA ||Yc' Xc||_F^2 / (||Xc' Xc||_F ||Yc' Yc||_F) (Kornblith et al. 2019)."""
    X, Y = _check_xy(X, Y)
    X = X - X.mean(axis=0)
    Y = Y - Y.mean(axis=0)
    num = np.linalg.norm(Y.T @ X) ** 2
    den = np.linalg.norm(X.T @ X) * np.linalg.norm(Y.T @ Y)
    return float(num / den) if den > 0 else np.nan


def debiased_cka(X: np.ndarray, Y: np.ndarray) -> float:
    """Return linear CKA from unbiased HSIC (U-centred Grams); near 0 for independent data."""
    X, Y = _check_xy(X, Y, min_n=4)
    return cka_from_centered(u_center_gram(X @ X.T), u_center_gram(Y @ Y.T))


def rbf_gram(X: np.ndarray, threshold: float) -> np.ndarray:
    """Return the RBF Gram matrix with bandwidth^2 = threshold^2 * median squared distance."""
    sq = np.sum(X**2, axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * X @ X.T, 0.0)
    iu = np.triu_indices(X.shape[0], k=1)
    med = np.median(d2[iu])  # off-diagonal pairs only (the usual median heuristic)
    if med <= 0:
        raise ValueError("median pairwise distance is 0 (duplicated samples); RBF CKA undefined")
    return np.exp(-d2 / (2.0 * threshold**2 * med))


def rbf_cka(X: np.ndarray, Y: np.ndarray, *, threshold: float = 1.0) -> float:
    """Return RBF-kernel CKA with the median-heuristic bandwidth (scaled by `threshold`)."""
    X, Y = _check_xy(X, Y)
    return cka_from_centered(center_gram(rbf_gram(X, threshold)),
                              center_gram(rbf_gram(Y, threshold)))


def procrustes_distance(X: np.ndarray, Y: np.ndarray) -> float:
    """Return the squared orthogonal Procrustes distance 2 - 2||X'Y||_* of centred, unit-Frobenius X, Y."""
    X, Y = _check_xy(X, Y)
    X = X - X.mean(axis=0)
    Y = Y - Y.mean(axis=0)
    nx, ny = np.linalg.norm(X), np.linalg.norm(Y)
    if nx == 0 or ny == 0:
        raise ValueError("a representation is constant across samples; Procrustes undefined")
    nuc = np.linalg.svd((X / nx).T @ (Y / ny), compute_uv=False).sum()
    return float(max(0.0, 2.0 - 2.0 * nuc))


# --- permutation machinery -----------------------------------------------------------------
def _prepared(measure: str, X: np.ndarray, Y: np.ndarray,
              threshold: float) -> tuple[Callable[[np.ndarray | None], float], bool]:
    """Return (score(perm) for a row permutation of Y (None: identity), higher_is_more_similar)."""
    if measure in ("linear_cka", "debiased_cka", "rbf_cka"):
        if measure == "linear_cka":
            Kc, L, center = center_gram(X @ X.T), Y @ Y.T, center_gram
        elif measure == "debiased_cka":
            Kc, L, center = u_center_gram(X @ X.T), Y @ Y.T, u_center_gram
        else:
            Kc, L, center = center_gram(rbf_gram(X, threshold)), rbf_gram(Y, threshold), \
                center_gram

        def score(perm: np.ndarray | None) -> float:
            Lp = L if perm is None else L[np.ix_(perm, perm)]
            return cka_from_centered(Kc, center(Lp))

        return score, True
    if measure == "procrustes":
        Xc = X - X.mean(axis=0)
        Yc = Y - Y.mean(axis=0)
        Xc, Yc = Xc / np.linalg.norm(Xc), Yc / np.linalg.norm(Yc)

        def score(perm: np.ndarray | None) -> float:
            Yp = Yc if perm is None else Yc[perm]
            return float(max(0.0, 2.0 - 2.0 * np.linalg.svd(Xc.T @ Yp, compute_uv=False).sum()))

        return score, False
    raise ValueError(f"unknown measure {measure!r}; use linear_cka, debiased_cka, rbf_cka or "
                     "procrustes")


def _run_draws(fn: Callable[[np.random.SeedSequence], Any], seeds: list, n_jobs: int) -> list:
    """Return [fn(seed) for seed in seeds], in order, with joblib threads when n_jobs > 1."""
    jobs = resolve_jobs(n_jobs)
    if jobs == 1:
        return [fn(s) for s in seeds]
    from joblib import Parallel, delayed

    return Parallel(n_jobs=jobs, backend="threading")(delayed(fn)(s) for s in seeds)


@dataclass(repr=False)
class SimilarityResult(Result):
    """A similarity estimate with its shuffled-rows null distribution and permutation p-value."""

    measure: str
    estimate: float
    null_distribution: np.ndarray
    pvalue: float
    null_interval: ConfidenceInterval  # central interval of the null
    n_samples: int
    higher_is_similar: bool
    params: dict = field(default_factory=dict)
    main_table = "similarity_test"

    @property
    def null_mean(self) -> float:
        """Return the mean of the null distribution (the similarity expected by chance)."""
        return float(np.mean(self.null_distribution)) if self.null_distribution.size else np.nan

    def _tables(self) -> dict[str, dict[str, Any]]:
        main = {"measure": np.array([self.measure]), "estimate": np.array([self.estimate]),
                "null_mean": np.array([self.null_mean]),
                "null_low": np.array([self.null_interval.low]),
                "null_high": np.array([self.null_interval.high]),
                "pvalue": np.array([self.pvalue]),
                "n_permutations": np.array([self.null_distribution.size]),
                "n_samples": np.array([self.n_samples])}
        return {"similarity_test": main, "similarity_null": {"permutation": np.arange(self.null_distribution.size),
                                                             "value": self.null_distribution}}

    def _summary_items(self) -> list[tuple[str, Any]]:
        return [("measure", self.measure), ("estimate", self.estimate),
                ("null mean", self.null_mean), ("p-value", self.pvalue),
                ("permutations", self.null_distribution.size), ("samples", self.n_samples)]


def similarity_test(X: np.ndarray, Y: np.ndarray, measure: str = "linear_cka", *,
                    n_permutations: int = 200, seed: Any = None, threshold: float = 1.0,
                    confidence_level: float = 0.95, n_jobs: int = 1) -> SimilarityResult:
    """Return a similarity of X, Y [n, p] with a null from shuffling the rows of Y."""
    X, Y = _check_xy(X, Y, min_n=4 if measure == "debiased_cka" else 2)
    score, higher = _prepared(measure, X, Y, threshold)
    est = score(None)
    ss = as_seed_sequence(seed)
    n = X.shape[0]
    null = np.asarray(_run_draws(lambda s: score(np.random.default_rng(s).permutation(n)),
                                 spawn_seeds(ss, n_permutations), n_jobs), dtype=np.float64)
    if null.size:
        # more similar than chance: larger CKA, smaller Procrustes distance
        p = float(resampling_pvalue(null, est, "greater" if higher else "less"))
        lo, hi = np.quantile(null, [0.5 - confidence_level / 2, 0.5 + confidence_level / 2])
    else:
        p, lo, hi = np.nan, np.nan, np.nan
    params = {"estimator": "similarity_test", "measure": measure, "n_permutations": n_permutations,
              "confidence_level": confidence_level,
              "seed": seed_record(ss), "null": "rows of Y shuffled",
              "rbf_threshold": threshold if measure == "rbf_cka" else None}
    return SimilarityResult(measure, float(est), null, p, ConfidenceInterval(float(lo), float(hi)),
                            n, higher, params)


# --- head matching -------------------------------------------------------------------------
def match_heads(sim: np.ndarray, method: str = "hungarian") -> tuple[np.ndarray, np.ndarray]:
    """Return (matched column per row, matched similarity per row) of a [H1, H2] similarity.

    'max' lets several heads match the same head (inflates stability); 'hungarian' is the
    one-to-one assignment maximising total similarity (rows beyond H2 get -1 and NaN).
    """
    sim = np.asarray(sim, dtype=np.float64)
    if sim.ndim != 2:
        raise ValueError("similarity must be a [H1, H2] matrix")
    if method == "max":
        s = np.where(np.isnan(sim), -np.inf, sim)
        match = np.argmax(s, axis=1)
        return match, sim[np.arange(sim.shape[0]), match]
    if method == "hungarian":
        rows, cols = linear_sum_assignment(np.nan_to_num(sim, nan=-1e9), maximize=True)
        match = np.full(sim.shape[0], -1, dtype=np.int64)
        match[rows] = cols
        score = np.full(sim.shape[0], np.nan)
        score[rows] = sim[rows, cols]
        return match, score
    raise ValueError(f"unknown matching method {method!r}; use 'max' or 'hungarian'")


@dataclass(repr=False)
class HeadMatchResult(Result):
    """Head matching of two refits: per-head matched score with bootstrap CI and shuffled null."""

    similarity: np.ndarray  # [H1, H2]
    method: str
    match: np.ndarray
    score: np.ndarray  # per head of A
    estimate: float  # mean matched score (layer stability vs this refit)
    confidence_interval: ConfidenceInterval  # for `estimate`, bootstrap over prompts
    head_interval: ConfidenceInterval  # per head, bootstrap over prompts
    null_distribution: np.ndarray  # mean matched score with prompts of B shuffled
    null_head_mean: np.ndarray  # per head
    pvalue: float
    drop_bos: bool
    params: dict = field(default_factory=dict)
    main_table = "head_match"

    def _tables(self) -> dict[str, dict[str, Any]]:
        h = self.score.size
        main = {"head": np.arange(h, dtype=np.int64), "match": self.match.astype(np.int64),
                "score": self.score, "ci_low": self.head_interval.low,
                "ci_high": self.head_interval.high, "null_mean": self.null_head_mean}
        gi, gj = np.indices(self.similarity.shape)
        return {"head_match": main,
                "head_match_layer": {"method": np.array([self.method]), "estimate": np.array([self.estimate]),
                          "ci_low": np.array([self.confidence_interval.low]),
                          "ci_high": np.array([self.confidence_interval.high]),
                          "null_mean": np.array([np.mean(self.null_distribution)
                                                 if self.null_distribution.size else np.nan]),
                          "pvalue": np.array([self.pvalue]),
                          "drop_bos": np.array([self.drop_bos])},
                "head_match_similarity": {"head_a": gi.ravel(), "head_b": gj.ravel(),
                               "similarity": self.similarity.ravel()}}

    def _summary_items(self) -> list[tuple[str, Any]]:
        return [("method", self.method), ("heads", self.score.size), ("drop_bos", self.drop_bos),
                ("mean matched similarity", self.estimate),
                ("CI", interval_text(self.estimate, self.confidence_interval.low, self.confidence_interval.high,
                                     digits=4, missing="too few prompts")),
                ("null mean", float(np.mean(self.null_distribution))
                 if self.null_distribution.size else np.nan), ("p-value", self.pvalue)]


def head_matching(A: np.ndarray, B: np.ndarray, *, method: str = "hungarian",
                  drop_bos: bool = False, n_permutations: int = 200,
                  n_resamples: int = N_RESAMPLES.default_for("heads"),
                  seed: Any = None, confidence_level: float = 0.95,
                  n_jobs: int = 1) -> HeadMatchResult:
    """Return matching of heads A [H1, P, T, T] to heads B [H2, P, T, T] of another refit.

    Uncertainty: percentile CIs from a bootstrap over prompts (per-prompt cosines reweighted).
    Null: prompts of B shuffled (head g of B on prompt pi(p) against head h of A on prompt p).
    """
    ua, oka = _unit(attention_vectors(A, drop_bos=drop_bos))
    ub, okb = _unit(attention_vectors(B, drop_bos=drop_bos))
    if ua.shape[1:] != ub.shape[1:]:
        raise ValueError(f"A and B must share prompts and length: {ua.shape[1:]} vs {ub.shape[1:]}")
    n_prompts = ua.shape[1]
    cos = np.einsum("hpd,gpd->phg", ua, ub)  # zero where a pattern is zero
    valid = (oka.T[:, :, None] & okb.T[:, None, :]).astype(np.float64)
    with np.errstate(invalid="ignore"):
        sim = cos.sum(axis=0) / valid.sum(axis=0)
    match, score = match_heads(sim, method)
    root = as_seed_sequence(seed)
    boot_seed, null_seed = spawn_seeds(root, 2)
    alpha = (1 - confidence_level) / 2
    # bootstrap over prompts: resampled similarity = weighted sum of per-prompt cosines
    if n_resamples > 0:
        plan = ResamplingPlan.bootstrap(n_prompts, n_resamples, boot_seed)
        # the engine's resampled means of the cosines and of the valid-cosine indicator
        with np.errstate(invalid="ignore", divide="ignore"):
            sims = (resampled_means(cos.reshape(n_prompts, -1), plan)
                    / resampled_means(valid.reshape(n_prompts, -1), plan)).T.reshape((n_resamples,) + sim.shape)
        boot = np.stack([match_heads(s, method)[1] for s in sims])  # [B, H1]
        h_lo, h_hi = np.nanquantile(boot, [alpha, 1 - alpha], axis=0)
        m_lo, m_hi = np.quantile(np.nanmean(boot, axis=1), [alpha, 1 - alpha])
    else:
        h_lo = h_hi = np.full(score.shape, np.nan)
        m_lo = m_hi = np.nan

    flat_a = ua.reshape(ua.shape[0], -1)  # [H1, P*D]: one BLAS product per draw instead of an einsum
    # every prompt of A against every prompt of B once, [H1, H2, P, P], when it is small: a draw
    # then only gathers the P cosines of its permutation
    cross = None
    if ua.shape[0] * ub.shape[0] * n_prompts ** 2 <= 2 ** 24:
        cross = np.einsum("hpd,gqd->hgpq", ua, ub, optimize=True)
    rows = np.arange(n_prompts)

    def null_draw(s: np.random.SeedSequence) -> np.ndarray:
        perm = np.random.default_rng(s).permutation(n_prompts)
        if cross is not None:
            num = cross[:, :, rows, perm].sum(-1)
        else:
            num = flat_a @ ub[:, perm].reshape(ub.shape[0], -1).T
        den = oka.astype(np.float64) @ okb[:, perm].T.astype(np.float64)
        with np.errstate(invalid="ignore"):
            return match_heads(num / den, method)[1]

    nulls = _run_draws(null_draw, spawn_seeds(null_seed, n_permutations), n_jobs)
    null = np.stack(nulls) if nulls else np.zeros((0, score.size))
    null_mean_score = np.nanmean(null, axis=1) if null.size else np.zeros(0)
    est = float(np.nanmean(score))
    p = float(resampling_pvalue(null_mean_score, est, "greater")) if null.size else np.nan
    params = {"estimator": "head_matching", "method": method, "drop_bos": drop_bos,
              "n_permutations": n_permutations, "n_resamples": n_resamples,
              "seed": seed_record(root), "confidence_level": confidence_level,
              "similarity": "cosine of lower-triangle attention patterns, mean over prompts",
              "null": "prompts of B shuffled"}
    return HeadMatchResult(sim, method, match, score, est, ConfidenceInterval(m_lo, m_hi),
                           ConfidenceInterval(h_lo, h_hi), null_mean_score,
                           np.nanmean(null, axis=0) if null.size else np.full(score.shape, np.nan),
                           p, drop_bos, params)
