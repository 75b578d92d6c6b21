"""Interval kinds beyond per-edge effects for the calibration study: circuit stability.

The data-level circuit-stability intervals that circuit_stability(..., data_level=True) reports
(stats.stability_data) claim to cover quantities of the *prompt distribution* at dataset size N:

* jaccard_data: E[Jaccard(top-k of D1, top-k of D2)] for two independent datasets of N prompts;
* jaccard_pop: E[Jaccard(top-k of D, top-k of the population's mean scores)];
* phi_data: Nogueira's Phi of size-N datasets' top-k circuits, i.e. (equal set sizes) their
  expected Kuncheva index (|A ∩ B| E − k²) / (k (E − k)).

On a finite population (datasets drawn with replacement from its rows) these are expectations
over pairs of datasets. `stability_truth` estimates them by Monte Carlo over many independent
pairs (the exact expectation sums over P^N datasets); its Monte Carlo standard error is returned
with it and is far below the widths of the intervals being checked (±0.003 at 4000 pairs).
Top-k ties are broken at random (stats.topk), independently for every dataset and for the
population's circuit, as circuit_stability does.

`stability_interval_kinds` wraps one circuit_stability call per dataset into IntervalKinds for
stats.calibration.coverage_study: the three data-level intervals, and the resampling-spread
interval of the mean pairwise Jaccard (jaccard_ci_*), which is Monte Carlo error of one dataset's
statistic and is checked against the data-level estimand only to show that it does not cover it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from circuits.errors import InputError

from .calibration import IntervalKind, shared_per_dataset
from .resampling import as_seed_sequence
from .topk import topk

__all__ = ["StabilityTruth", "stability_truth", "stability_interval_kinds", "check_stability_ks",
           "STABILITY_ESTIMANDS"]

#: what each stability kind's interval is checked against (the estimand it claims, or for
#: jaccard_mc the data-level estimand it is often mistaken for)
STABILITY_ESTIMANDS = {
    "jaccard_data": "E[Jaccard(top-k of D1, top-k of D2)], two independent datasets of N prompts",
    "jaccard_pop": "E[Jaccard(top-k of a dataset of N prompts, top-k of the population)]",
    "phi_data": "Phi (Nogueira) of top-k circuits of independent datasets of N prompts (expected Kuncheva index)",
    "jaccard_mc": "Monte Carlo error of the mean resample Jaccard (jaccard_ci_*), checked against "
                  "E[Jaccard(D1, D2)]: NOT an interval for it",
}
#: circuit_stability's interval names read by each kind
_CONF_INT = {"jaccard_data": "jaccard_data", "jaccard_pop": "jaccard_pop", "phi_data": "phi_data",
             "jaccard_mc": "jaccard"}
#: the truth each kind is checked against
_TRUTH_OF = {"jaccard_data": "jaccard_data", "jaccard_pop": "jaccard_pop", "phi_data": "phi_data",
             "jaccard_mc": "jaccard_data"}


@dataclass(frozen=True)
class StabilityTruth:
    """Population values [len(ks)] of the data-level stability estimands at one dataset size."""

    ks: np.ndarray
    jaccard_data: np.ndarray
    jaccard_pop: np.ndarray
    phi_data: np.ndarray
    jaccard_data_mc_se: np.ndarray
    jaccard_pop_mc_se: np.ndarray
    phi_data_mc_se: np.ndarray
    n_pairs: int


def check_stability_ks(ks: Sequence[int], n_edges: int) -> list[int]:
    """Return ks sorted and deduplicated, or raise InputError unless each lies in [1, n_edges - 1]."""
    out = sorted({int(k) for k in ks})
    if not out or out[0] < 1 or out[-1] >= n_edges:
        raise InputError(f"stability ks must lie in [1, {n_edges - 1}] (below the {n_edges} edges), got {out}; "
                         "lower the largest k")
    return out


def _dataset_means(population: np.ndarray, n: int, n_draws: int, rng: np.random.Generator) -> np.ndarray:
    """Return [n_draws, E] mean scores of datasets of n rows drawn with replacement from population."""
    n_pop = population.shape[0]
    # n uniform draws with replacement = multinomial counts over the population's rows
    counts = rng.multinomial(n, np.full(n_pop, 1.0 / n_pop), size=n_draws)
    return counts @ population / n


def _masks(indices: np.ndarray, n_edges: int) -> np.ndarray:
    """Return boolean masks [rows, E] of edge index sets [rows, k]."""
    mask = np.zeros((indices.shape[0], n_edges), dtype=bool)
    np.put_along_axis(mask, indices, True, axis=1)
    return mask


def stability_truth(population: np.ndarray, n: int, ks: Sequence[int], *, ranking: str,
                    n_pairs: int = 4000, seed: Any = 0, chunk: int = 500) -> StabilityTruth:
    """StabilityTruth: Monte Carlo estimands of size-n datasets drawn from population [P, E].

    Each of n_pairs pairs draws two independent datasets of n rows with replacement; per k the
    Jaccard and Kuncheva index between their top-k circuits and the Jaccard of the first to the
    population's top-k (its ties broken afresh per pair) are averaged over pairs.
    """
    pop = np.asarray(population, dtype=np.float64)
    if pop.ndim != 2 or pop.shape[0] < 2:
        raise ValueError(f"the population must be a [P, E] matrix with P >= 2 rows, got shape {pop.shape}")
    n_edges = pop.shape[1]
    ks_arr = np.asarray(check_stability_ks(ks, n_edges), dtype=np.int64)
    if int(n_pairs) < 2:
        raise ValueError(f"n_pairs must be at least 2, got {n_pairs}")
    rng = np.random.default_rng(as_seed_sequence(seed))
    K = int(ks_arr[-1])
    pop_mean = pop.mean(axis=0)
    sums = {name: [] for name in ("jaccard_data", "jaccard_pop", "phi_data")}
    for start in range(0, int(n_pairs), chunk):
        c = min(chunk, int(n_pairs) - start)
        a = topk(_dataset_means(pop, n, c, rng), K, ranking=ranking, seed=rng).indices
        b = topk(_dataset_means(pop, n, c, rng), K, ranking=ranking, seed=rng).indices
        p = topk(np.repeat(pop_mean[None], c, axis=0), K, ranking=ranking, seed=rng).indices
        per_k = {name: np.empty((len(ks_arr), c)) for name in sums}
        for i, k in enumerate(ks_arr):
            # top-k lists are in rank order, so the top-k is the first k of the top-K
            ma, mb, mp = (_masks(x[:, :k], n_edges) for x in (a, b, p))
            inter, inter_p = (ma & mb).sum(1), (ma & mp).sum(1)
            per_k["jaccard_data"][i] = inter / (2 * k - inter)
            per_k["jaccard_pop"][i] = inter_p / (2 * k - inter_p)
            per_k["phi_data"][i] = (inter * n_edges - k * k) / (k * (n_edges - k))
        for name in sums:
            sums[name].append(per_k[name])
    vals = {name: np.concatenate(v, axis=1) for name, v in sums.items()}
    mean = {name: v.mean(axis=1) for name, v in vals.items()}
    se = {f"{name}_mc_se": v.std(axis=1, ddof=1) / np.sqrt(v.shape[1]) for name, v in vals.items()}
    return StabilityTruth(ks=ks_arr, n_pairs=int(n_pairs), **mean, **se)


def stability_interval_kinds(population: np.ndarray, ks: Sequence[int], *, ranking: str, n_resamples: int,
                             confidence_level: float = 0.95, n_truth_pairs: int = 4000,
                             seed: Any = 0, columns: slice | None = None) -> list[IntervalKind]:
    """IntervalKinds stability/{jaccard_data, jaccard_pop, phi_data, jaccard_mc}, one unit per k.

    population [P, E'] is the calibration population; ``columns`` selects the edges the circuits are
    chosen from (e.g. the real edges, not the null copies). Each dataset runs one
    circuit_stability(..., data_level=True) (n_resamples bootstrap resamples plus its default
    double bootstrap), shared by the four kinds; truths come from `stability_truth` per N, with a
    seed derived from ``seed`` and N so that every N's truth is reproducible on its own.
    """
    from .stability import circuit_stability  # the public API: method changes there flow in

    cols = slice(None) if columns is None else columns
    pop = np.asarray(population, dtype=np.float64)[:, cols]
    ks_list = check_stability_ks(ks, pop.shape[1])
    root = as_seed_sequence(seed)
    truths: dict[int, StabilityTruth] = {}

    def truth_at(n: int) -> StabilityTruth:
        if n not in truths:
            truth_seed = np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, int(n)))
            truths[n] = stability_truth(pop, n, ks_list, ranking=ranking, n_pairs=n_truth_pairs, seed=truth_seed)
        return truths[n]

    @shared_per_dataset
    def stability(X: np.ndarray, ds_seed: Any) -> Any:
        return circuit_stability(X[:, cols], None, ks_list, ranking=ranking, n_resamples=n_resamples, seed=ds_seed,
                                 n_rank_resamples=0, confidence_level=confidence_level, data_level=True)

    def kind(name: str) -> IntervalKind:
        def compute(X: np.ndarray, ds_seed: Any) -> dict[str, np.ndarray]:
            ci = stability(X, ds_seed).conf_int(_CONF_INT[name])
            return {"low": np.asarray(ci.low, np.float64), "high": np.asarray(ci.high, np.float64)}

        return IntervalKind(f"stability/{name}", STABILITY_ESTIMANDS[name], compute,
                            truth=lambda n: getattr(truth_at(int(n)), _TRUTH_OF[name]),
                            unit_labels=[f"k={k}" for k in ks_list])

    return [kind(name) for name in STABILITY_ESTIMANDS]
