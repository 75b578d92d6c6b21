"""Coverage of verified-run intervals on paired populations (exact and approximate score for every prompt).

A paired population is two matrices X (exact) and A (approximation) [P, E] over the same P prompts. A
simulated verified run draws N prompts with replacement (so the estimand of every interval is exactly
the population's exact column mean X.mean(0)), computes the approximation on all N and exact on the
first n of them (the N are i.i.d., so the first n are a uniformly random subset), and builds the PPI++
interval with the other N − n as the unlabelled prompts. Datasets are simulated side by side as
columns (circuitstat.stats.populations.stack_datasets' layout), so one call of the per-edge code serves every
dataset.

Two references are simulated on the same datasets: exact on all N prompts (t interval; the cost a
verified run avoids) and exact on the n labelled prompts only (t interval; the same cost of exact
patching as the verified run, without the approximation).

`paired_population` is a synthetic generator (a spiky exact population and a biased, sometimes
failing approximation) for checking the interval forms beside the real fixtures.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from scipy import special

from circuitstat.core.seeds import as_seed_sequence, spawn_seeds
from circuitstat.stats.populations import spiky_population

from .active import active_crossfit, active_means, active_probabilities, active_sample
from .active_flag import ACTIVE_FLAG_RULES, active_reliability
from .crossfit import crossfit_fit
from .ppi import DEFAULT_INTERVAL, DEFAULT_TUNING, PPIFit, ppi_fit, ppi_intervals
from .reliability import verified_reliability

__all__ = ["paired_population", "synthetic_approximation", "multi_population", "simulate_verified", "simulate_designs",
           "simulate_active", "REFERENCES"]

#: the reference intervals simulated beside the verified ones
REFERENCES = ("exact_all", "exact_n")


def paired_population(n_pop: int, n_edges: int, *, seed: int | np.random.SeedSequence,
                      fail_share: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """Return (exact X, approximation A) [n_pop, n_edges]: a spiky exact population and a biased approximation.

    X is circuitstat.stats.populations.spiky_population. A = b_e X + c_e + noise: slope b_e in [0.3, 1.2], offset
    c_e ~ N(0, 0.3) SD(X), noise of SD s_e in [0.05, 1] times SD(X) (Student-t(3) on half the edges). On a
    share ``fail_share`` of edges the approximation also fails on a random q_e in [1%, 10%] of prompts,
    where it reads 0 (a saturated attention: EAP's typical miss).
    """
    s_pop, s_app = spawn_seeds(as_seed_sequence(seed), 2)
    X = spiky_population(n_pop, n_edges, seed=s_pop)
    return X, synthetic_approximation(X, seed=s_app, fail_share=fail_share)


def synthetic_approximation(X: np.ndarray, *, seed: int | np.random.SeedSequence, fail_share: float = 0.3
                            ) -> np.ndarray:
    """Return a biased, sometimes failing approximation [P, E] of exact X (``paired_population``'s error model)."""
    n_pop, n_edges = X.shape
    rng = np.random.default_rng(seed)
    sd = X.std(0) + 1e-12
    b, c = rng.uniform(0.3, 1.2, n_edges), rng.normal(0.0, 0.3, n_edges) * sd
    s = np.exp(rng.uniform(np.log(0.05), 0.0, n_edges)) * sd
    heavy = rng.random(n_edges) < 0.5
    noise = np.where(heavy, rng.standard_t(3, (n_pop, n_edges)) / np.sqrt(3.0), rng.normal(size=(n_pop, n_edges)))
    A = b * X + c + s * noise
    fails = rng.random(n_edges) < fail_share
    q = rng.uniform(0.01, 0.10, n_edges)
    return np.where(fails & (rng.random((n_pop, n_edges)) < q), 0.0, A)


def multi_population(n_pop: int, n_edges: int, *, seed: int | np.random.SeedSequence, p: int = 2,
                     fail_share: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """Return (exact X [n_pop, n_edges], approximations [n_pop, n_edges, p]) whose errors are independent draws.

    X and the first approximation are ``paired_population``'s with the same seed; each further approximation
    follows the same error model (its own slope, offset, noise and failing prompts), drawn independently, so
    the approximations' errors differ and a combination of them tracks X better than either.
    """
    s_pop, *s_apps = spawn_seeds(as_seed_sequence(seed), 1 + p)
    X = spiky_population(n_pop, n_edges, seed=s_pop)
    return X, np.stack([synthetic_approximation(X, seed=s, fail_share=fail_share) for s in s_apps], axis=2)


def _t_covered(S: np.ndarray, truth: np.ndarray, level: float, d: int, E: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (covered, width) [d, E] of the one-sample t interval of each column of S [rows, d·E]."""
    m = S.shape[0]
    mean, se = S.mean(0).reshape(d, E), (S.std(0, ddof=1) / np.sqrt(m)).reshape(d, E)
    q = special.stdtrit(m - 1, 0.5 + level / 2)
    return np.abs(mean - truth) <= q * se, 2 * q * se


def simulate_verified(X: np.ndarray, A: np.ndarray, N: int, n: int, n_datasets: int, *,
                      seed: int | np.random.SeedSequence, methods: Sequence[str] = (DEFAULT_INTERVAL,),
                      confidence_level: float = 0.95, tuning: str = DEFAULT_TUNING, chunk: int = 100,
                      crossfit: bool = False) -> dict[str, dict[str, np.ndarray]]:
    """Return {method: {covered, width, reliable, lam}} ([n_datasets, E] each) of simulated verified runs.

    Also {"exact_all": {covered, width}} and {"exact_n": {covered, width}}: the t intervals of exact on
    all N prompts and on the n labelled ones (``REFERENCES``). ``reliable`` is
    circuitstat.stats.verified.reliability's flag of each (dataset, edge) cell. ``crossfit``: λ̂ left out per
    labelled prompt (circuitstat.stats.verified.crossfit) instead of fitted on all of them.
    """
    X, A = np.asarray(X, np.float64), np.asarray(A, np.float64)
    if X.shape != A.shape or X.ndim != 2:
        raise ValueError(f"exact and approximation must be [P, E] of one shape, got {X.shape} and {A.shape}")
    if not 4 <= int(n) < int(N):
        raise ValueError(f"need 4 <= n < N, got n={n}, N={N}")
    P, E = X.shape
    truth = X.mean(0)
    idx = np.random.default_rng(as_seed_sequence(seed)).integers(0, P, (int(n_datasets), int(N)))
    keys = ("covered", "width", "reliable", "lam")
    out: dict[str, dict[str, list]] = {m: {k: [] for k in keys} for m in methods}
    out.update({r: {"covered": [], "width": []} for r in REFERENCES})
    for d0 in range(0, int(n_datasets), chunk):
        rows = idx[d0:d0 + chunk].T  # [N, d]
        d = rows.shape[1]
        Xs, As = X[rows].reshape(N, d * E), A[rows].reshape(N, d * E)
        fit = (crossfit_fit if crossfit else ppi_fit)(Xs[:n], As[:n], As[n:], tuning=tuning)
        for m in methods:
            r = ppi_intervals(fit, m, confidence_level)
            rel = verified_reliability(fit, r["high"] - r["low"], confidence_level)["reliable"].reshape(d, E)
            lo, hi = r["low"].reshape(d, E), r["high"].reshape(d, E)
            for k, v in zip(keys, ((lo <= truth) & (truth <= hi), hi - lo, rel, fit.lam.reshape(d, E))):
                out[m][k].append(v)
        for ref, S in zip(REFERENCES, (Xs, Xs[:n])):
            cov, wid = _t_covered(S, truth, confidence_level, d, E)
            out[ref]["covered"].append(cov)
            out[ref]["width"].append(wid)
    return {m: {k: np.concatenate(v) for k, v in cols.items()} for m, cols in out.items()}


def simulate_designs(X: np.ndarray, H: np.ndarray, N: int, n: int, n_datasets: int, *,
                     seed: int | np.random.SeedSequence, designs: dict[str, Callable[..., PPIFit]],
                     method: str = DEFAULT_INTERVAL, confidence_level: float = 0.95
                     ) -> dict[str, dict[str, np.ndarray]]:
    """Return {design: {covered, width, reliable, estimate}} ([n_datasets, E] each) and {"exact_all": {covered, width}}.

    ``H`` [P, E, p]: several approximations of the same prompts as X. Each design maps (Y [n, E], H [n, E, p],
    H_u [N − n, E, p]) of one dataset to a PPIFit (e.g. ``ppi_fit`` on one column, or a multi.py fit's ``.fit``).
    Datasets are fitted one at a time: a design that pools over edges must see one dataset's edges only.
    """
    X, H = np.asarray(X, np.float64), np.asarray(H, np.float64)
    if H.ndim != 3 or H.shape[:2] != X.shape:
        raise ValueError(f"approximations must be [P, E, p] over exact's [P, E] = {X.shape}, got {H.shape}")
    if not 4 <= int(n) < int(N):
        raise ValueError(f"need 4 <= n < N, got n={n}, N={N}")
    P, E = X.shape
    truth = X.mean(0)
    idx = np.random.default_rng(as_seed_sequence(seed)).integers(0, P, (int(n_datasets), int(N)))
    keys = ("covered", "width", "reliable", "estimate")
    out: dict[str, dict[str, list]] = {m: {k: [] for k in keys} for m in designs}
    out["exact_all"] = {"covered": [], "width": []}
    for rows in idx:
        Xs, Hs = X[rows], H[rows]
        for name, design in designs.items():
            fit = design(Xs[:n], Hs[:n], Hs[n:])
            r = ppi_intervals(fit, method, confidence_level)
            rel = verified_reliability(fit, r["high"] - r["low"], confidence_level)["reliable"]
            for k, v in zip(keys, ((r["low"] <= truth) & (truth <= r["high"]), r["high"] - r["low"], rel,
                                   fit.estimate)):
                out[name][k].append(v)
        cov, wid = _t_covered(Xs, truth, confidence_level, 1, E)
        out["exact_all"]["covered"].append(cov[0])
        out["exact_all"]["width"].append(wid[0])
    return {m: {k: np.asarray(v) for k, v in cols.items()} for m, cols in out.items()}


def simulate_active(X: np.ndarray, A: np.ndarray, N: int, budget: float, n_datasets: int, *,
                    seed: int | np.random.SeedSequence, confidence_level: float = 0.95, chunk: int = 100,
                    rules: tuple[str, ...] = ACTIVE_FLAG_RULES) -> dict[str, dict[str, np.ndarray]]:
    """Return {"active": {...}, "exact_all": {covered, width}} ([n_datasets, E] each) of simulated active runs.

    Per dataset: N prompts drawn with replacement from the paired population (the estimand is X's column mean),
    the approximation on all of them, exact on a Poisson sample of cells drawn with active_probabilities (``budget``
    expected cells per edge), active_means' interval and active_reliability's flag (with ``rules``). "active" holds
    covered, width, reliable, estimate, se, estimate_crossfit, se_crossfit (active_crossfit), cells and the flag's
    inputs (residual_share, approx_tail_share, width_ratio, width_vs_exact_all); "exact_all" the t interval of exact on all N of the same
    dataset. Datasets are columns side by side, as in ``simulate_verified`` (every step is per column).
    """
    X, A = np.asarray(X, np.float64), np.asarray(A, np.float64)
    if X.shape != A.shape or X.ndim != 2:
        raise ValueError(f"exact and approximation must be [P, E] of one shape, got {X.shape} and {A.shape}")
    P, E = X.shape
    truth = X.mean(0)
    s_idx, s_draw = spawn_seeds(as_seed_sequence(seed), 2)
    idx = np.random.default_rng(s_idx).integers(0, P, (int(n_datasets), int(N)))
    keys = ("covered", "width", "reliable", "estimate", "se", "estimate_crossfit", "se_crossfit", "cells",
            "residual_share", "approx_tail_share", "width_ratio", "width_vs_exact_all")
    out: dict[str, dict[str, list]] = {"active": {k: [] for k in keys}, "exact_all": {"covered": [], "width": []}}
    for d0, s in zip(range(0, int(n_datasets), chunk), spawn_seeds(s_draw, -(-int(n_datasets) // chunk))):
        rows = idx[d0:d0 + chunk].T  # [N, d]
        d = rows.shape[1]
        Xs, As = X[rows].reshape(N, d * E), A[rows].reshape(N, d * E)
        p = active_probabilities(As, budget)
        S = active_sample(p, s)
        r = active_means(As, Xs, S, p, confidence_level)
        cf = active_crossfit(As, Xs, S, p)
        flag = active_reliability(As, Xs, S, p, r["lam"], r["high"] - r["low"], confidence_level, rules)
        got = {"covered": (r["low"] <= np.tile(truth, d)) & (np.tile(truth, d) <= r["high"]),
               "width": r["high"] - r["low"], "estimate": r["estimate"], "se": r["se"],
               "estimate_crossfit": cf["estimate"], "se_crossfit": cf["se"], **flag}
        for k in keys:
            out["active"][k].append(np.asarray(got[k]).reshape(d, E))
        cov, wid = _t_covered(Xs, truth, confidence_level, d, E)
        out["exact_all"]["covered"].append(cov)
        out["exact_all"]["width"].append(wid)
    return {m: {k: np.concatenate(v) for k, v in cols.items()} for m, cols in out.items()}
