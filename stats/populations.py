"""Finite heavy-tailed populations of per-example scores, for measuring interval coverage.

A coverage study needs a population whose estimand is known exactly. Here a population is a
finite matrix P [n_pop, E] of per-example scores; a dataset is N rows drawn from it with
replacement (`draw_datasets`), so the estimand of every per-edge interval is exactly the
population's column mean `P.mean(axis=0)`. Null edges are built with column mean zero (up to
float rounding, ~1e-17 of their scale), so "the interval excludes 0" on them is a false positive.

Two generators with different tail shapes, so a method can be chosen on one and checked on the
other:

* `spiky_population`: like real attribution scores (excess kurtosis in the tens to hundreds on
  many edges): most examples near a small edge-specific effect, rare large spikes that carry a
  large part of the mean; other edges have a skewed continuous body.
* `smooth_tail_population`: no spikes; each edge is a shifted, scaled draw from a skewed
  lognormal or a symmetric Student-t(2.5), both heavy-tailed without point masses.
"""

from __future__ import annotations

import numpy as np

from circuitstat.core.seeds import as_seed_sequence

__all__ = ["spiky_population", "smooth_tail_population", "single_spike_population", "draw_datasets",
           "stack_datasets", "templated_datasets"]


def _check_shape(n_pop: int, n_edges: int, null_share: float) -> None:
    """Raise ValueError for an empty population or a null share outside [0, 1]."""
    if int(n_pop) < 2 or int(n_edges) < 1:
        raise ValueError(f"a population needs n_pop >= 2 and n_edges >= 1, got {n_pop}, {n_edges}")
    if not 0.0 <= null_share <= 1.0:
        raise ValueError(f"null_share must lie in [0, 1], got {null_share}")


def _null_columns(n_edges: int, null_share: float, rng: np.random.Generator) -> np.ndarray:
    """Return a boolean mask of exactly round(null_share * E) null edges at random positions."""
    mask = np.zeros(n_edges, dtype=bool)
    mask[rng.permutation(n_edges)[: int(round(null_share * n_edges))]] = True
    return mask


def _center(pop: np.ndarray, null: np.ndarray) -> np.ndarray:
    """Return pop with the columns in `null` shifted to population mean zero."""
    pop[:, null] -= pop[:, null].mean(axis=0)
    return pop


def spiky_population(n_pop: int, n_edges: int, *, seed: int | np.random.SeedSequence,
                     null_share: float = 0.3, spike_share: float = 0.5,
                     spike_prob: tuple[float, float] = (0.003, 0.05),
                     return_null: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Return a seeded finite population [n_pop, n_edges] of heavy-tailed per-example scores.

    A share `spike_share` of edges are spiky: each example is its edge's small effect plus
    unit-scale noise, and with probability p_e (log-uniform in `spike_prob`) a spike of
    lognormal size (median 15, sigma 0.8) whose sign is + with an edge-specific probability in
    [0.5, 1] (exactly 1/2 on null edges); their excess kurtosis is roughly 1/p_e, i.e. 20 to
    300. The other edges have a skewed continuous body: effect + scale * sign * (Gamma(k_e) -
    k_e) / sqrt(k_e) with k_e in [0.3, 4] (excess kurtosis 6/k_e: 1.5 to 20). A share `null_share` of edges (of both kinds,
    at random positions) is centred to population mean exactly zero, keeping their skew.
    With return_null=True returns (population, null_mask).
    """
    _check_shape(n_pop, n_edges, null_share)
    rng = np.random.default_rng(as_seed_sequence(seed))
    null = _null_columns(n_edges, null_share, rng)
    spiky = rng.random(n_edges) < spike_share
    effect = rng.normal(0.0, 0.5, n_edges)
    pop = np.empty((n_pop, n_edges), dtype=np.float64)

    ks = np.flatnonzero(spiky)
    lo, hi = np.log(spike_prob[0]), np.log(spike_prob[1])
    p = np.exp(rng.uniform(lo, hi, ks.size))
    # null spiky edges get symmetric spikes (sign + or - with probability 1/2): a real null edge
    # is not a rare one-sided spike offset exactly by a small shift of every other example
    plus = np.where(null[ks], 0.5, rng.uniform(0.5, 1.0, ks.size))
    hit = rng.random((n_pop, ks.size)) < p
    size = np.exp(rng.normal(np.log(15.0), 0.8, (n_pop, ks.size)))
    sign = np.where(rng.random((n_pop, ks.size)) < plus, 1.0, -1.0)
    pop[:, ks] = (0.2 * effect[ks] + rng.normal(0.0, 1.0, (n_pop, ks.size))
                  + hit * sign * size)

    kb = np.flatnonzero(~spiky)
    shape = np.exp(rng.uniform(np.log(0.3), np.log(4.0), kb.size))
    sgn = np.where(rng.random(kb.size) < 0.7, -1.0, 1.0)  # real scores lean one way (negative)
    scale = np.exp(rng.normal(0.0, 0.5, kb.size))
    g = rng.gamma(shape, 1.0, (n_pop, kb.size)) - shape
    pop[:, kb] = effect[kb] + scale * sgn * g / np.sqrt(shape)
    pop = _center(pop, null)
    return (pop, null) if return_null else pop


def smooth_tail_population(n_pop: int, n_edges: int, *, seed: int | np.random.SeedSequence,
                           null_share: float = 0.3, return_null: bool = False
                           ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Return a seeded finite population [n_pop, n_edges] of spike-free heavy-tailed scores.

    Half the edges (at random) are effect + sign * (LogNormal(0, s_e) - its mean) with s_e in
    [0.5, 1.5] (skewed; excess kurtosis from about 5 to several hundred), the other half are
    effect + scale * Student-t(2.5) (symmetric, infinite population kurtosis). Effects are
    N(0, 0.3) in units of the edge's scale; `null_share` of edges are centred to mean zero.
    """
    _check_shape(n_pop, n_edges, null_share)
    rng = np.random.default_rng(as_seed_sequence(seed))
    null = _null_columns(n_edges, null_share, rng)
    logn = rng.random(n_edges) < 0.5
    effect = rng.normal(0.0, 0.3, n_edges)
    pop = np.empty((n_pop, n_edges), dtype=np.float64)
    kl, kt = np.flatnonzero(logn), np.flatnonzero(~logn)
    s = rng.uniform(0.5, 1.5, kl.size)
    sgn = np.where(rng.random(kl.size) < 0.5, -1.0, 1.0)
    ln = np.exp(rng.normal(0.0, 1.0, (n_pop, kl.size)) * s) - np.exp(s**2 / 2)
    pop[:, kl] = effect[kl] + sgn * ln / np.sqrt(np.expm1(s**2) * np.exp(s**2))
    pop[:, kt] = effect[kt] + rng.standard_t(2.5, (n_pop, kt.size)) / np.sqrt(5.0)
    pop = _center(pop, null)
    return (pop, null) if return_null else pop


def single_spike_population(n_pop: int, n_edges: int, *, seed: int | np.random.SeedSequence,
                            spike_share: float = 0.5, carried: tuple[float, float] = (0.5, 0.95)
                            ) -> np.ndarray:
    """Return a seeded population [n_pop, n_edges] in which one prompt carries most of some edges' means.

    On a share `spike_share` of edges (at random) exactly one prompt (a random row) carries a share c_e,
    uniform in `carried`, of the edge's population mean m_e (|m_e| uniform in [0.3, 1], random sign): the
    other prompts are (1 - c_e) m_e + N(0, 1) noise, centred so the mean is exact. This is the edge of
    issue 34 (one prompt in 2,048 carrying 91% of the mean): a dataset of N prompts misses that prompt with
    chance (1 - 1/n_pop)^N and then looks Gaussian. The other edges are m_e + N(0, 1) with m_e ~ N(0, 0.5).
    """
    _check_shape(n_pop, n_edges, 0.0)
    rng = np.random.default_rng(as_seed_sequence(seed))
    spiky = rng.random(n_edges) < spike_share
    mean = np.where(spiky, rng.uniform(0.3, 1.0, n_edges) * rng.choice([-1.0, 1.0], n_edges),
                    rng.normal(0.0, 0.5, n_edges))
    c = np.where(spiky, rng.uniform(carried[0], carried[1], n_edges), 0.0)
    noise = rng.normal(0.0, 1.0, (n_pop, n_edges))
    pop = (1.0 - c) * mean + noise - noise.mean(axis=0)  # the body's mean is exactly (1 - c) m
    row = rng.integers(0, n_pop, n_edges)
    cols = np.flatnonzero(spiky)
    # the spike row's excess over the body: c m n_pop, so the column mean is exactly m
    pop[row[cols], cols] += c[cols] * mean[cols] * n_pop
    return pop


def draw_datasets(population: np.ndarray, n: int, n_datasets: int, *,
                  seed: int | np.random.SeedSequence) -> np.ndarray:
    """Return row indices [n_datasets, n] drawn with replacement from the population's rows."""
    n_pop = np.asarray(population).shape[0]
    if int(n) < 1 or int(n_datasets) < 1:
        raise ValueError(f"need n >= 1 and n_datasets >= 1, got {n}, {n_datasets}")
    rng = np.random.default_rng(as_seed_sequence(seed))
    return rng.integers(0, n_pop, (int(n_datasets), int(n)))


def stack_datasets(population: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Return datasets side by side as one score matrix [n, n_datasets * E] (dataset-major).

    Column d * E + e is edge e of dataset d. One bootstrap over the rows of this matrix gives
    every dataset its own (valid) bootstrap with shared resample indices, so a whole coverage
    simulation is one call of the ordinary per-edge estimator.
    """
    pop = np.asarray(population)
    idx = np.asarray(indices)
    d, n = idx.shape
    return pop[idx.T].reshape(n, d * pop.shape[1])


def templated_datasets(population: np.ndarray, n_groups: int, per_group: int, icc: float, n_datasets: int, *,
                       seed: int | np.random.SeedSequence) -> tuple[np.ndarray, np.ndarray]:
    """Return (datasets [n, n_datasets * E] side by side as stack_datasets lays them out, groups [n]) of templated prompts.

    Each dataset draws `n_groups` templates and `per_group` prompts per template; a prompt's scores are
    mu + sqrt(icc) (P[r_g] - mu) + sqrt(1 - icc) (P[r_i] - mu), with r_g (the template's row) and r_i (the
    prompt's row) drawn uniformly from the population P's rows and mu = P.mean(axis=0). Every edge keeps P's
    variance and tails, prompts of one template correlate by `icc`, and the estimand (the mean over the
    template and prompt distribution) is exactly mu."""
    pop = np.asarray(population, dtype=np.float64)
    if not 0.0 <= icc <= 1.0:
        raise ValueError(f"icc must lie in [0, 1], got {icc}")
    if int(n_groups) < 1 or int(per_group) < 1 or int(n_datasets) < 1:
        raise ValueError(f"need n_groups, per_group, n_datasets >= 1, got {n_groups}, {per_group}, {n_datasets}")
    rng = np.random.default_rng(as_seed_sequence(seed))
    mu = pop.mean(axis=0)
    dev = pop - mu
    n = int(n_groups) * int(per_group)
    groups = np.repeat(np.arange(int(n_groups)), int(per_group))
    rg = rng.integers(0, pop.shape[0], (int(n_datasets), int(n_groups)))
    ri = rng.integers(0, pop.shape[0], (int(n_datasets), n))
    x = mu + np.sqrt(icc) * dev[rg[:, groups]] + np.sqrt(1.0 - icc) * dev[ri]  # [D, n, E]
    return np.ascontiguousarray(x.transpose(1, 0, 2).reshape(n, -1)), groups
