"""Interval kinds for the calibration study: per-edge effects, circuit stability, faithfulness.

The data-level circuit-stability intervals that circuit_stability(..., data_level=True) reports
(circuitstat.stats.stability_data) claim to cover quantities of the *prompt distribution* at dataset size N:

* jaccard_data: E[Jaccard(top-k of D1, top-k of D2)] for two independent datasets of N prompts;
* jaccard_pop: E[Jaccard(top-k of D, top-k of the population's mean scores)];
* phi_data: Nogueira's Phi of size-N datasets' top-k circuits, i.e. (equal set sizes) their
  expected Kuncheva index (|A ∩ B| E − k²) / (k (E − k)).

On a finite population (datasets drawn with replacement from its rows) these are expectations
over pairs of datasets. `stability_truth` estimates them by Monte Carlo over many independent
pairs (the exact expectation sums over P^N datasets); its Monte Carlo standard error is returned
with it and is far below the widths of the intervals being checked (±0.003 at 4000 pairs).
Top-k ties are broken at random (circuitstat.core.topk), independently for every dataset and for the
population's circuit, as circuit_stability does.

`stability_interval_kinds` wraps one circuit_stability call per dataset into IntervalKinds for
circuitstat.stats.calibration.coverage_study: the three data-level intervals, and the resampling-spread
interval of the mean pairwise Jaccard (jaccard_ci_*), which is Monte Carlo error of one dataset's
statistic and is checked against the data-level estimand only to show that it does not cover it.

Faithfulness (`faithfulness_interval_kinds`) is checked against f_pop(C(D)): the ratio-of-means
faithfulness over every population prompt of the top-k circuit C(D) selected from the dataset D,
so its truth differs per dataset. It needs the model, which comes in as a callable;
`PopulationEvaluations` runs each distinct circuit once per population prompt (on the zoo, 200
datasets of each of three sizes select about 150 distinct circuits at k = 5, 10, 20). One caveat of
the design: datasets are drawn with replacement, so a prompt can appear twice in one dataset and
land in both a selection fold and an evaluation fold of the cross-fitting (about N^2 / 2P pairs:
8 at N = 128 of P = 1024), a slight optimism that real datasets without repeats do not have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.seeds import as_seed_sequence
from circuitstat.core.topk import topk

from .calibration import IntervalKind, shared_per_dataset

__all__ = ["edge_interval_kinds", "StabilityTruth", "stability_truth", "stability_interval_kinds", "check_circuit_sizes",
           "STABILITY_ESTIMANDS", "FAITHFULNESS_ESTIMANDS", "PopulationEvaluations", "faithfulness_interval_kinds"]

def edge_interval_kinds(population: np.ndarray, *, n_resamples: int, confidence_level: float,
                        edge_names: Sequence[str] | None = None,
                        methods: Sequence[str] | None = None) -> list[IntervalKind]:
    """Return an IntervalKind per per-edge interval method; the truth of edge e is its population mean.

    ``population`` is [P, E]; ``edge_names`` name the units of the per-unit table (default: column
    indices); ``methods`` (default: all of circuitstat.stats.intervals.METHODS) the interval methods. Each
    edge is described by its |mean| rank, excess kurtosis and top-prompt share (circuitstat.stats.tails),
    for the study's worst edge and kurtosis deciles. One bootstrap_edges call per dataset serves every method. There are
    no null units: every method is translation-equivariant (the same resamples shifted by a
    constant give the same interval shifted; tests/stats/test_calibration.py checks it), so an
    edge centred to mean 0 would reject 0 exactly when the edge's own interval misses its mean.
    The false-positive rate of "the interval excludes 0" at a null edge shaped like edge e is
    therefore 1 − e's coverage, which the coverage columns already report.
    """
    from .intervals import DEFAULT_METHOD, ESTIMAND, METHODS, bootstrap_edges
    from .tails import edge_tails

    tails = edge_tails(population)
    truth = tails.mean
    todo = list(METHODS if methods is None else methods)
    unknown = [m for m in todo if m not in METHODS]
    if unknown or not todo:
        raise InputError(f"unknown edge interval methods {unknown}; choose from {', '.join(METHODS)}")
    if edge_names is not None and len(edge_names) != truth.shape[0]:
        raise InputError(f"{len(edge_names)} edge names for a population of {truth.shape[0]} edges")
    labels = None if edge_names is None else [str(n) for n in edge_names]

    @shared_per_dataset
    def all_methods(X: np.ndarray, seed) -> Any:
        return bootstrap_edges(X, n_resamples=n_resamples, seed=seed, method=DEFAULT_METHOD,
                               methods=todo, confidence_level=confidence_level)

    def kind(method: str) -> IntervalKind:
        def compute(X: np.ndarray, seed) -> dict[str, np.ndarray]:
            res = all_methods(X, seed)
            ci = res.conf_int(which=method)
            out = {"low": ci.low, "high": ci.high}
            if getattr(res, "reliable", None) is not None:
                out["reliable"] = np.asarray(res.reliable, bool)
            return out

        return IntervalKind(f"edge/{method}", ESTIMAND, compute, truth=lambda n: truth, unit_labels=labels,
                            unit_info=tails.unit_info())

    return [kind(m) for m in todo]


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
_CONF_INT = {"jaccard_data": "jaccard_data_ci", "jaccard_pop": "jaccard_pop_ci", "phi_data": "phi_data_ci",
             "jaccard_mc": "jaccard_ci"}
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


def check_circuit_sizes(ks: Sequence[int], n_edges: int) -> list[int]:
    """Return ks sorted and deduplicated, or raise InputError unless each lies in [1, n_edges - 1]."""
    out = sorted({int(k) for k in ks})
    if not out or out[0] < 1 or out[-1] >= n_edges:
        raise InputError(f"ks must lie in [1, {n_edges - 1}] (below the {n_edges} edges), got {out}; "
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
    ks_arr = np.asarray(check_circuit_sizes(ks, n_edges), dtype=np.int64)
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
                             seed: Any = 0) -> list[IntervalKind]:
    """IntervalKinds stability/{jaccard_data, jaccard_pop, phi_data, jaccard_mc}, one unit per k.

    population [P, E] is the calibration population, the circuits chosen from its edges. Each dataset runs one
    circuit_stability(..., data_level=True) (n_resamples bootstrap resamples plus its default
    double bootstrap), shared by the four kinds; truths come from `stability_truth` per N, with a
    seed derived from ``seed`` and N so that every N's truth is reproducible on its own.
    """
    from .stability import circuit_stability  # the public API: method changes there flow in

    pop = np.asarray(population, dtype=np.float64)
    ks_list = check_circuit_sizes(ks, pop.shape[1])
    root = as_seed_sequence(seed)
    truths: dict[int, StabilityTruth] = {}

    def truth_at(n: int) -> StabilityTruth:
        if n not in truths:
            truth_seed = np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, int(n)))
            truths[n] = stability_truth(pop, n, ks_list, ranking=ranking, n_pairs=n_truth_pairs, seed=truth_seed)
        return truths[n]

    @shared_per_dataset
    def stability(X: np.ndarray, ds_seed: Any) -> Any:
        return circuit_stability(X, None, ks_list, ranking=ranking, n_resamples=n_resamples, seed=ds_seed,
                                 n_rank_resamples=0, confidence_level=confidence_level, data_level=True)

    def kind(name: str) -> IntervalKind:
        def compute(X: np.ndarray, ds_seed: Any) -> dict[str, np.ndarray]:
            ci = stability(X, ds_seed).conf_int(which=_CONF_INT[name])
            return {"low": np.asarray(ci.low, np.float64), "high": np.asarray(ci.high, np.float64)}

        return IntervalKind(f"stability/{name}", STABILITY_ESTIMANDS[name], compute,
                            truth=lambda n: getattr(truth_at(int(n)), _TRUTH_OF[name]),
                            unit_labels=[f"k={k}" for k in ks_list])

    return [kind(name) for name in STABILITY_ESTIMANDS]


# --- faithfulness ---------------------------------------------------------------------------------
#: what the faithfulness kinds' intervals are checked against: f_pop(C(D)), the ratio-of-means
#: faithfulness over the whole population of the top-k circuit C(D) selected from the dataset
FAITHFULNESS_ESTIMANDS = {
    "selected": "faithfulness on the prompt distribution of the top-k circuit selected from N prompts "
                "(selection included; repeated cross-fitting, corrected t)",
    "fixed": "the same f_pop(C(D)); Fieller's set for the selected circuit held fixed (the audit's f_ci_*; "
             "selection not included; reliable = the set is bounded)",
    "fixed_bca": "the same f_pop(C(D)); the former fixed-circuit interval, BCa of the bootstrap ratio (selection "
                 "not included; no longer reported by the audit, kept for comparison)",
}

PopulationEvaluate = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
"""``evaluate(masks [C, E] bool, rows [n] population indices) -> (m_circuit [n, C], m_clean [n],
m_empty [n])``: the model's metric with only the circuit's edges live, clean and empty."""


class PopulationEvaluations:
    """Metric values m(C) per (circuit, population prompt), each run through ``evaluate`` once.

    Valid where a prompt's metric does not depend on which other prompts are evaluated with it
    (per-example ablations: counterfactual, zero); the calibration study refuses other ablations.
    """

    def __init__(self, evaluate: PopulationEvaluate, n_pop: int, n_edges: int) -> None:
        self.evaluate, self.n_pop, self.n_edges = evaluate, int(n_pop), int(n_edges)
        everything = np.arange(self.n_pop)
        # m_clean and m_empty of every prompt once: the empty circuit is the cheapest to ask for
        _, m_clean, m_empty = evaluate(np.zeros((1, self.n_edges), dtype=bool), everything)
        self.m_clean = np.asarray(m_clean, dtype=np.float64)
        self.m_empty = np.asarray(m_empty, dtype=np.float64)
        self.values: dict[bytes, np.ndarray] = {}  # mask bytes -> m(C) per population prompt, NaN = not yet
        self.circuit_rows = 0  # (prompt, circuit) pairs run through evaluate

    def get(self, masks: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return (m(C) [len(rows), C], m_clean, m_empty) for boolean masks [C, E] on population ``rows``."""
        masks, rows = np.atleast_2d(np.asarray(masks, dtype=bool)), np.asarray(rows, dtype=np.int64)
        keys = [m.tobytes() for m in masks]
        for key, mask in zip(keys, masks):
            self.values.setdefault(key, np.full(self.n_pop, np.nan))
        need = list({key: j for j, key in enumerate(keys) if np.isnan(self.values[key][rows]).any()}.values())
        if need:
            # one call for every circuit still missing some of these rows, on the union of what is missing
            todo = np.unique(np.concatenate([rows[np.isnan(self.values[keys[j]][rows])] for j in need]))
            mc = np.asarray(self.evaluate(masks[need].copy(), todo.copy())[0], dtype=np.float64)
            if mc.shape != (todo.size, len(need)) or not np.isfinite(mc).all():
                raise InputError(f"evaluate returned {mc.shape} values (NaN/inf or wrong shape) for {todo.size} "
                                 f"prompts x {len(need)} circuits; fix the metric first")
            self.circuit_rows += mc.size
            for col, j in enumerate(need):
                self.values[keys[j]][todo] = mc[:, col]
        return (np.stack([self.values[key][rows] for key in keys], axis=1), self.m_clean[rows],
                self.m_empty[rows])

    def population_faithfulness(self, masks: np.ndarray, *, rtol: float = 1e-4, atol: float = 1e-6) -> np.ndarray:
        """Return f_pop(C) [C]: ratio-of-means faithfulness of each circuit over every population prompt."""
        from .faithfulness import ratio_of_means

        mc, mM, m0 = self.get(masks, np.arange(self.n_pop))
        return ratio_of_means(mc, mM, m0, rtol=rtol, atol=atol)


def faithfulness_interval_kinds(evaluations: PopulationEvaluations, ks: Sequence[int], *, ranking: str,
                                n_resamples: int, confidence_level: float = 0.95) -> list[IntervalKind]:
    """IntervalKinds faithfulness/{selected, fixed, fixed_bca}, one unit per k, truth f_pop(C(D)) per dataset.

    Per dataset D (its population rows come with it): C(D) = top-k of D's mean scores (ties at
    random from the dataset's seed); the fixed-circuit set of C(D) on D's prompts as the audit computes it
    (circuitstat.stats.fieller.fieller_over_plan over a size-N bootstrap plan: Fieller's set, which covers by
    membership, a union of two rays not holding its gap; flagged reliable where bounded); the former BCa
    interval of the bootstrap ratio (n_resamples resamples), named as such; the selection-aware interval
    (circuitstat.stats.faithfulness.selection_aware_faithfulness: min(5, N // 4) folds, 2 repeats, as the audit
    runs it); and the truth f_pop(C(D)) from every population prompt.
    """
    from .faithfulness import fixed_circuit_interval, selection_aware_faithfulness
    from .fieller import fieller_over_plan
    from .folds import MIN_PER_FOLD
    from .resampling import ResamplingPlan
    from circuitstat.core.seeds import spawn_seeds

    ks_list = check_circuit_sizes(ks, evaluations.n_edges)

    @shared_per_dataset
    def both(X: np.ndarray, ds_seed: Any, rows: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
        S = np.asarray(X, dtype=np.float64)
        n = S.shape[0]
        tie_seed, plan_seed, sel_seed = spawn_seeds(as_seed_sequence(ds_seed), 3)
        order = topk(S.sum(0) / n, max(ks_list), ranking=ranking, seed=np.random.default_rng(tie_seed)).indices
        masks = np.zeros((len(ks_list), S.shape[1]), dtype=bool)
        for i, k in enumerate(ks_list):  # nested circuits: the top-k is the first k of the top-K
            masks[i, order[:k]] = True
        mc, mM, m0 = evaluations.get(masks, rows)
        plan = ResamplingPlan.bootstrap(n, n_resamples, plan_seed)
        bca = fixed_circuit_interval(mc, mM, m0, plan, method="bca", confidence_level=confidence_level)
        fie = fieller_over_plan(mc - m0[:, None], mM, m0, plan, confidence_level=confidence_level)
        sel = selection_aware_faithfulness(
            S, lambda m, r: evaluations.get(m, rows[r]), ks_list, ranking=ranking,
            n_folds=min(5, n // MIN_PER_FOLD), n_repeats=2, seed=sel_seed, confidence_level=confidence_level,
            known=(masks, mc, mM, m0))
        truth = evaluations.population_faithfulness(masks)
        out = {name: {"low": np.asarray(r.confidence_interval.low, np.float64),
                      "high": np.asarray(r.confidence_interval.high, np.float64), "truth": truth}
               for name, r in (("selected", sel), ("fixed_bca", bca))}
        out["fixed"] = {"low": np.asarray(fie.low, np.float64), "high": np.asarray(fie.high, np.float64),
                        "truth": truth, "covers": fie.covers, "reliable": fie.shape == "bounded"}
        return out

    def kind(name: str) -> IntervalKind:
        return IntervalKind(f"faithfulness/{name}", FAITHFULNESS_ESTIMANDS[name],
                            lambda X, s, rows: both(X, s, rows)[name], with_rows=True,
                            unit_labels=[f"k={k}" for k in ks_list])

    return [kind(name) for name in FAITHFULNESS_ESTIMANDS]
