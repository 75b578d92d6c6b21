"""Calibration: empirical coverage of interval procedures on a finite population.

A user's question "is N = 64 prompts enough for my circuit?" has an empirical answer: treat a
large set of per-example scores as the population, draw many datasets of each size N from it
(with replacement, so the population's own values are the estimands), recompute each interval
from each dataset, and count how often it covers the population value. This module does that for
any interval procedure given as an `IntervalKind`; it knows nothing of models.

For each kind and N the result reports coverage (with its Monte Carlo standard error), mean and
median width, the rejection rate on null units (units whose population value is the null value)
where a kind has them, and, where the procedure flags units as reliable, coverage among the
flagged ones and their share.

Monte Carlo errors take the *dataset* as the unit. The units of one dataset (the edges, or the
circuit sizes k) are computed from the same prompts and are strongly correlated: one dataset that
misses the population's rare large scores undercovers on many edges at once. Counting the D x m
(dataset, unit) cells as independent Bernoulli draws understated the SE about twofold on the zoo
fixture. Each rate is a ratio of per-dataset sums, Σ_d a_d / Σ_d b_d, and its SE is the
linearised (cluster-robust) one with datasets as clusters (Cochran 1977, Sampling Techniques, ch. 6;
the same as statsmodels' cluster-robust SE of an intercept-only regression on the cells, which a
test uses as the oracle): sqrt(Σ_d (a_d − R b_d)² / (D (D − 1))) / mean(b). When every dataset
has the same m units this is the SD over datasets of each dataset's covered share, / sqrt(D).
The per-unit table's SE is binomial over datasets, which are independent draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from circuitstat.core.seeds import as_seed_sequence, seed_record
from circuitstat.core.results import Result

__all__ = ["IntervalKind", "CalibrationResult", "coverage_study", "shared_per_dataset", "clustered_rate"]

Intervals = dict[str, np.ndarray]
"""What an interval procedure returns for one dataset: ``low``, ``high`` ([m] each) and
optionally ``reliable`` ([m] bool) and ``truth`` ([m], a dataset-dependent estimand)."""


def shared_per_dataset(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` computed once per dataset: several kinds reading one computation (e.g. every interval
    method of one set of bootstrap resamples) share it; the first kind's seed is the one used.
    Extra arguments (the dataset's population rows) are passed through."""
    last: dict[str, Any] = {}

    def wrapped(X: np.ndarray, seed: Any, *rest: Any) -> Any:
        if last.get("X") is not X:
            last["X"], last["value"] = X, fn(X, seed, *rest)
        return last["value"]

    return wrapped


@dataclass
class IntervalKind:
    """One interval procedure to calibrate: how to compute it and what it should cover.

    ``compute(X, seed)`` gets one dataset X [N, E] and a SeedSequence (and, with ``with_rows``,
    also ``rows`` [N]: the population rows X was drawn from) and returns ``{"low": [m], "high":
    [m]}`` (plus ``"reliable": [m] bool`` if it flags units, and ``"truth": [m]`` where the
    estimand depends on the dataset, e.g. the population faithfulness of the circuit selected
    from it); ``truth(N)`` returns the [m] population values it should cover at dataset size N
    (many estimands, e.g. the expected Jaccard of two size-N circuits, depend on N; None when
    compute returns the truth); ``null`` marks units whose population value is ``null_value``
    (their rejection rate is a false-positive rate). Null units must carry information of their
    own: a copy of another unit shifted to the null adds nothing under a translation-equivariant
    interval (its rejection is exactly the original's non-coverage), so such copies are not units;
    ``unit_labels`` name the units in the per-unit table (e.g. "k=10"; default: their index).
    """

    name: str
    estimand: str
    compute: Callable[..., Intervals]
    truth: Callable[[int], np.ndarray] | None = None
    null: np.ndarray | None = None
    null_value: float = 0.0
    unit_labels: Sequence[str] | None = None
    with_rows: bool = False


@dataclass(repr=False)
class CalibrationResult(Result):
    """Coverage, width and null rejection rate per interval kind and dataset size."""

    rows: list[dict[str, Any]]
    per_unit: list[dict[str, Any]]
    confidence_level: float
    params: dict = field(default_factory=dict)
    main_table: str = "coverage"

    def _tables(self) -> dict[str, dict[str, Any]]:
        def columns(rows: list[dict[str, Any]]) -> dict[str, Any]:
            return {key: [r[key] for r in rows] for key in rows[0]} if rows else {}

        return {"coverage": columns(self.rows), "coverage_per_unit": columns(self.per_unit)}

    def _summary_items(self) -> list[tuple[str, Any]]:
        items: list[tuple[str, Any]] = [("nominal", self.confidence_level),
                                        ("datasets per N", self.params.get("n_datasets"))]
        for r in self.rows:
            reliable = "" if np.isnan(r["coverage_reliable"]) else f", reliable {r['coverage_reliable']:.3f}"
            fpr = "" if np.isnan(r["null_rejection_rate"]) else f", null rejection {r['null_rejection_rate']:.3f}"
            items.append((f"{r['kind']} N={r['n']}",
                          f"coverage {r['coverage']:.3f} ± {r['coverage_mc_se']:.3f} (MC SE over datasets)"
                          f"{reliable}{fpr}, mean finite width {r['mean_width']:.4g}"))
        return items


def _one_size(population: np.ndarray, n: int, n_datasets: int, kinds: Sequence[IntervalKind],
              seed: np.random.SeedSequence) -> list[dict[str, np.ndarray]]:
    """Per kind: hit, width, reject, reliable and truth, each [D, m] over D datasets of size n."""
    acc = [{"hit": [], "width": [], "reject": [], "reliable": [], "truth": []} for _ in kinds]
    truths = [None if k.truth is None else np.asarray(k.truth(n), dtype=np.float64) for k in kinds]
    for ss in seed.spawn(n_datasets):
        draw_seed, *kind_seeds = ss.spawn(1 + len(kinds))
        rows = np.random.default_rng(draw_seed).integers(0, population.shape[0], n)
        X = population[rows]
        for a, kind, fixed_truth, ks in zip(acc, kinds, truths, kind_seeds):
            out = kind.compute(X, ks, rows) if kind.with_rows else kind.compute(X, ks)
            truth = np.asarray(out["truth"], np.float64) if "truth" in out else fixed_truth
            if truth is None:
                raise ValueError(f"interval kind {kind.name!r} gives neither truth(N) nor a per-dataset 'truth'")
            lo, hi = np.asarray(out["low"], np.float64), np.asarray(out["high"], np.float64)
            a["truth"].append(truth)
            a["hit"].append((lo <= truth) & (truth <= hi))
            a["width"].append(hi - lo)
            a["reject"].append((lo > kind.null_value) | (hi < kind.null_value))
            if "reliable" in out:  # kinds that never flag units get no reliable coverage (NaN), not a copy
                a["reliable"].append(np.asarray(out["reliable"], bool))
    return [{key: np.asarray(v) for key, v in a.items()} for a in acc]


def _finite_mean(width: np.ndarray) -> float:
    """Mean of the finite widths (an infinite interval covers trivially; it is counted apart), inf if none."""
    finite = width[np.isfinite(width)]
    return float(np.mean(finite)) if finite.size else np.inf


def clustered_rate(numerator: np.ndarray, denominator: np.ndarray) -> tuple[float, float]:
    """Return (Σ numerator / Σ denominator, its Monte Carlo SE with each entry an independent cluster).

    ``numerator`` and ``denominator`` are per-dataset counts [D] (e.g. covered units, units). The
    SE is the linearised SE of a ratio estimator, sqrt(Σ (a_d − R b_d)² / (D (D − 1))) / mean(b):
    the cluster-robust SE with the D/(D − 1) correction. NaN rate when the denominator sums to 0,
    NaN SE with fewer than 2 datasets.
    """
    a, b = np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)
    total = float(b.sum())
    if total <= 0:
        return np.nan, np.nan
    rate = float(a.sum()) / total
    if a.size < 2:
        return rate, np.nan
    resid = a - rate * b
    return rate, float(np.sqrt(np.sum(resid ** 2) / (a.size * (a.size - 1))) / b.mean())


def _summarise(kind: IntervalKind, n: int, a: dict[str, np.ndarray], level: float) -> dict[str, Any]:
    """One coverage row for ``kind`` at size ``n`` from its per-dataset arrays [D, m]."""
    hit, rel = a["hit"], a["reliable"]
    n_data, n_units = hit.shape
    cov, cov_se = clustered_rate(hit.sum(1), np.full(n_data, n_units))
    null = kind.null
    fpr, fpr_se = np.nan, np.nan
    if null is not None and null.any():
        fpr, fpr_se = clustered_rate(a["reject"][:, null].sum(1), np.full(n_data, int(null.sum())))
    flags = rel.shape == hit.shape  # the kind flagged units in every dataset
    cov_rel, cov_rel_se = clustered_rate((hit & rel).sum(1), rel.sum(1)) if flags else (np.nan, np.nan)
    return {"kind": kind.name, "estimand": kind.estimand, "n": int(n), "n_datasets": int(n_data),
            "n_units": int(n_units), "coverage": cov, "coverage_mc_se": cov_se,
            "worst_unit_coverage": float(hit.mean(0).min()),
            # an infinite interval (e.g. bootstrap-t on a near-constant edge) covers trivially: count it apart
            "mean_width": _finite_mean(a["width"]),
            "median_width": float(np.nanmedian(a["width"])), "share_infinite": float(np.mean(~np.isfinite(a["width"]))),
            "null_rejection_rate": fpr, "null_rejection_mc_se": fpr_se,
            "coverage_reliable": cov_rel, "coverage_reliable_mc_se": cov_rel_se,
            "share_reliable": float(rel.mean()) if flags else np.nan,
            "confidence_level": float(level)}


def coverage_study(population: np.ndarray, sizes: Sequence[int], kinds: Sequence[IntervalKind], *,
                   n_datasets: int = 200, seed: Any = 0, confidence_level: float = 0.95) -> CalibrationResult:
    """CalibrationResult: coverage of each interval kind over ``n_datasets`` datasets of each size.

    Datasets are drawn with replacement from the rows of ``population`` [P, E]; each (size,
    dataset) gets its own spawned seed, so results do not depend on the order of kinds or sizes.
    """
    population = np.asarray(population, dtype=np.float64)
    if population.ndim != 2 or population.shape[0] < 2:
        raise ValueError(f"the population must be a [P, E] matrix with P >= 2 rows, got shape {population.shape}")
    if n_datasets < 20:
        raise ValueError(f"n_datasets={n_datasets} gives coverage to ±0.05 at best; use at least 20 (200 or more "
                         "to tell 0.90 from 0.95)")
    root = as_seed_sequence(seed)
    rows, per_unit = [], []
    for n, ss in zip(sizes, root.spawn(len(sizes))):
        if int(n) < 2:
            raise ValueError(f"dataset size {n} is below 2; every interval needs at least 2 examples")
        for kind, a in zip(kinds, _one_size(population, int(n), n_datasets, kinds, ss)):
            rows.append(_summarise(kind, int(n), a, confidence_level))
            labels = kind.unit_labels
            n_data = a["hit"].shape[0]
            for unit, c in enumerate(a["hit"].mean(0)):
                per_unit.append({"kind": kind.name, "n": int(n), "unit": unit,
                                 "unit_label": str(unit) if labels is None else str(labels[unit]),
                                 # datasets are independent draws: binomial over them
                                 "coverage": float(c), "coverage_mc_se": float(np.sqrt(c * (1 - c) / n_data)),
                                 "mean_width": _finite_mean(a["width"][:, unit]),
                                 # the estimand (its mean over datasets where it depends on the dataset)
                                 "truth": float(np.mean(a["truth"][:, unit]))})
    params = {"estimator": "coverage_study", "sizes": [int(n) for n in sizes], "n_datasets": int(n_datasets),
              "population_rows": int(population.shape[0]), "confidence_level": confidence_level,
              "kinds": [k.name for k in kinds], "seed": seed_record(root)}
    return CalibrationResult(rows=rows, per_unit=per_unit, confidence_level=confidence_level, params=params)
