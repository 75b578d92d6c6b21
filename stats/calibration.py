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

Coverage is reported per unit, never only pooled (a pooled 0.95 can hide an edge at 0.40): each row names
its worst unit and, where the kind describes its units (``unit_info``: for edges their |mean| rank, excess
kurtosis and top-prompt share, circuitstat.stats.tails), that unit's description; how many units cover below
``coverage_floor``; and, where the procedure flags cells (dataset, unit) as reliable, the worst unit among
the cells flagged reliable (over units with at least ``min_reliable_cells`` such cells, so that one
unlucky cell does not name a unit) and the coverage of the cells flagged unreliable. With an
``excess_kurtosis`` in unit_info, a third table gives coverage by decile of the units' kurtosis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from circuitstat.core.seeds import as_seed_sequence, seed_record
from circuitstat.core.results import Result

__all__ = ["IntervalKind", "CalibrationResult", "coverage_study", "shared_per_dataset", "clustered_rate",
           "COVERAGE_FLOOR", "MIN_RELIABLE_CELLS", "UNIT_INFO"]

#: a unit (edge) covering below this is counted in ``n_units_below_floor`` (issue 34's target for reliable cells)
COVERAGE_FLOOR = 0.90
#: a unit's coverage among cells flagged reliable counts towards the worst reliable unit only with this many cells
#: (binomial MC SE at most 0.07 at coverage 0.9)
MIN_RELIABLE_CELLS = 20
#: the unit descriptions the coverage table reports for its worst unit (NaN where a kind gives none)
UNIT_INFO = ("abs_mean_rank", "excess_kurtosis", "top_prompt_share")
_KURTOSIS_COLUMNS = ("kind", "n", "decile", "kurtosis_low", "kurtosis_high", "n_units", "coverage", "coverage_mc_se",
                     "worst_unit_coverage", "coverage_reliable", "coverage_reliable_mc_se", "share_reliable")

Intervals = dict[str, Any]
"""What an interval procedure returns for one dataset: ``low``, ``high`` ([m] each) and
optionally ``reliable`` ([m] bool), ``truth`` ([m], a dataset-dependent estimand) and ``covers``
(a callable values [m] -> [m] bool, for confidence sets that are not intervals: [low, high] is then
their hull, the width, and ``covers`` decides coverage and rejection)."""


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
    ``unit_labels`` name the units in the per-unit table (e.g. "k=10", an edge's name; default: their
    index); ``unit_info`` describes them ([m] arrays by name, e.g. circuitstat.stats.tails.EdgeTails.unit_info),
    copied into the per-unit table and used for the worst unit's description and the kurtosis deciles.
    """

    name: str
    estimand: str
    compute: Callable[..., Intervals]
    truth: Callable[[int], np.ndarray] | None = None
    null: np.ndarray | None = None
    null_value: float = 0.0
    unit_labels: Sequence[str] | None = None
    with_rows: bool = False
    unit_info: Mapping[str, np.ndarray] | None = None



def _empty_kurtosis_columns() -> dict[str, np.ndarray]:
    """Typed empty columns of coverage_by_kurtosis (a study without edge kinds): strings stay strings."""
    from circuitstat.core.schema import schema_for

    schema = schema_for("coverage_by_kurtosis")
    return {c.name: np.array([], dtype=c.type.to_pandas_dtype()) for c in schema.columns if c.name in _KURTOSIS_COLUMNS}

@dataclass(repr=False)
class CalibrationResult(Result):
    """Coverage, width and null rejection rate per interval kind and dataset size."""

    rows: list[dict[str, Any]]
    per_unit: list[dict[str, Any]]
    confidence_level: float
    params: dict = field(default_factory=dict)
    main_table: str = "coverage"
    by_kurtosis: list[dict[str, Any]] = field(default_factory=list)

    def _tables(self) -> dict[str, dict[str, Any]]:
        def columns(rows: list[dict[str, Any]]) -> dict[str, Any]:
            return {key: [r[key] for r in rows] for key in rows[0]} if rows else {}

        # a study without edge kinds has no kurtosis rows: an empty table with the columns, not a missing one
        by_kurtosis = columns(self.by_kurtosis) or _empty_kurtosis_columns()
        return {"coverage": columns(self.rows), "coverage_per_unit": columns(self.per_unit),
                "coverage_by_kurtosis": by_kurtosis}

    def _summary_items(self) -> list[tuple[str, Any]]:
        items: list[tuple[str, Any]] = [("nominal", self.confidence_level),
                                        ("datasets per N", self.params.get("n_datasets"))]
        for r in self.rows:
            reliable = "" if np.isnan(r["coverage_reliable"]) else f", reliable {r['coverage_reliable']:.3f}"
            fpr = "" if np.isnan(r["null_rejection_rate"]) else f", null rejection {r['null_rejection_rate']:.3f}"
            items.append((f"{r['kind']} N={r['n']}",
                          f"coverage {r['coverage']:.3f} ± {r['coverage_mc_se']:.3f} (MC SE over datasets)"
                          f"{reliable}{fpr}, mean finite width {r['mean_width']:.4g}; worst unit {r['worst_unit']} "
                          f"{r['worst_unit_coverage']:.3f}, {r['n_units_below_floor']} of {r['n_units']} below "
                          f"{r['coverage_floor']:.2f}"))
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
            # a set that is not an interval (Fieller's union of two rays) says which values it holds: its hull
            # [low, high] would count the gap between the rays as covered
            a["hit"].append(out["covers"](truth) if "covers" in out else (lo <= truth) & (truth <= hi))
            a["width"].append(hi - lo)
            a["reject"].append(~out["covers"](np.full(truth.shape, kind.null_value)) if "covers" in out
                               else (lo > kind.null_value) | (hi < kind.null_value))
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


def _label(kind: IntervalKind, unit: int) -> str:
    """The name of ``kind``'s unit ``unit`` (its index where the kind names none)."""
    return str(unit) if kind.unit_labels is None else str(kind.unit_labels[unit])


def _info(kind: IntervalKind, unit: int) -> dict[str, float]:
    """``kind``'s description of unit ``unit`` (UNIT_INFO keys, NaN where it gives none)."""
    info = kind.unit_info or {}
    return {key: float(info[key][unit]) if key in info else np.nan for key in UNIT_INFO}


def _per_unit_rates(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per unit [m]: coverage, and (where the kind flags cells) coverage and count of reliable and unreliable cells."""
    hit, rel = a["hit"], a["reliable"]
    out = {"coverage": hit.mean(0)}
    m = hit.shape[1]
    if rel.shape == hit.shape:
        n_rel, n_unrel = rel.sum(0), (~rel).sum(0)
        with np.errstate(invalid="ignore", divide="ignore"):
            out["coverage_reliable"] = np.where(n_rel > 0, (hit & rel).sum(0) / np.maximum(n_rel, 1), np.nan)
            out["coverage_unreliable"] = np.where(n_unrel > 0, (hit & ~rel).sum(0) / np.maximum(n_unrel, 1), np.nan)
        out["n_reliable_cells"], out["n_unreliable_cells"] = n_rel, n_unrel
    else:
        out["coverage_reliable"] = out["coverage_unreliable"] = np.full(m, np.nan)
        out["n_reliable_cells"] = out["n_unreliable_cells"] = np.zeros(m, dtype=np.int64)
    return out


def _worst_units(kind: IntervalKind, a: dict[str, np.ndarray], floor: float, min_cells: int) -> dict[str, Any]:
    """The worst unit overall and among cells flagged reliable, with counts of units below ``floor``."""
    rates = _per_unit_rates(a)
    cov = rates["coverage"]
    worst = int(np.argmin(cov))
    out: dict[str, Any] = {"worst_unit": _label(kind, worst), "worst_unit_coverage": float(cov[worst]),
                           **{f"worst_unit_{k}": v for k, v in _info(kind, worst).items()},
                           "n_units_below_floor": int(np.sum(cov < floor))}
    enough = rates["n_reliable_cells"] >= min_cells
    rel_cov = np.where(enough, rates["coverage_reliable"], np.inf)
    if enough.any():
        w = int(np.argmin(rel_cov))
        out.update({"worst_reliable_unit": _label(kind, w), "worst_reliable_unit_coverage": float(rel_cov[w]),
                    "worst_reliable_unit_cells": int(rates["n_reliable_cells"][w]),
                    **{f"worst_reliable_unit_{k}": v for k, v in _info(kind, w).items()},
                    "n_units_reliable_below_floor": int(np.sum(rel_cov < floor))})
    else:
        out.update({"worst_reliable_unit": "", "worst_reliable_unit_coverage": np.nan, "worst_reliable_unit_cells": 0,
                    **{f"worst_reliable_unit_{k}": np.nan for k in UNIT_INFO}, "n_units_reliable_below_floor": 0})
    return out


def _summarise(kind: IntervalKind, n: int, a: dict[str, np.ndarray], level: float, floor: float = COVERAGE_FLOOR,
               min_cells: int = MIN_RELIABLE_CELLS) -> dict[str, Any]:
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
    cov_unrel, cov_unrel_se = clustered_rate((hit & ~rel).sum(1), (~rel).sum(1)) if flags else (np.nan, np.nan)
    return {"kind": kind.name, "estimand": kind.estimand, "n": int(n), "n_datasets": int(n_data),
            "n_units": int(n_units), "coverage": cov, "coverage_mc_se": cov_se,
            **_worst_units(kind, a, floor, min_cells),
            # an infinite interval (e.g. bootstrap-t on a near-constant edge) covers trivially: count it apart
            "mean_width": _finite_mean(a["width"]),
            "median_width": float(np.nanmedian(a["width"])), "share_infinite": float(np.mean(~np.isfinite(a["width"]))),
            "null_rejection_rate": fpr, "null_rejection_mc_se": fpr_se,
            "coverage_reliable": cov_rel, "coverage_reliable_mc_se": cov_rel_se,
            "share_reliable": float(rel.mean()) if flags else np.nan,
            "coverage_unreliable": cov_unrel, "coverage_unreliable_mc_se": cov_unrel_se,
            "coverage_floor": float(floor), "confidence_level": float(level)}


def _unit_rows(kind: IntervalKind, n: int, a: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """The per-unit table's rows of ``kind`` at size ``n``."""
    rates, n_data = _per_unit_rates(a), a["hit"].shape[0]
    rows = []
    for unit, c in enumerate(rates["coverage"]):
        rows.append({"kind": kind.name, "n": int(n), "unit": unit, "unit_label": _label(kind, unit),
                     # datasets are independent draws: binomial over them
                     "coverage": float(c), "coverage_mc_se": float(np.sqrt(c * (1 - c) / n_data)),
                     "coverage_reliable": float(rates["coverage_reliable"][unit]),
                     "n_reliable_cells": int(rates["n_reliable_cells"][unit]),
                     "coverage_unreliable": float(rates["coverage_unreliable"][unit]),
                     "n_unreliable_cells": int(rates["n_unreliable_cells"][unit]),
                     "mean_width": _finite_mean(a["width"][:, unit]),
                     # the estimand (its mean over datasets where it depends on the dataset)
                     "truth": float(np.mean(a["truth"][:, unit])), **_info(kind, unit)})
    return rows


def _kurtosis_rows(kind: IntervalKind, n: int, a: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Coverage by decile of the units' excess kurtosis (none when the kind does not give it)."""
    from .tails import kurtosis_deciles

    if not kind.unit_info or "excess_kurtosis" not in kind.unit_info:
        return []
    kurt = np.asarray(kind.unit_info["excess_kurtosis"], dtype=np.float64)
    bins, edges = kurtosis_deciles(kurt)
    hit, rel = a["hit"], a["reliable"]
    flags = rel.shape == hit.shape
    rows = []
    for b in range(len(edges) - 1):
        cols = bins == b
        if not cols.any():
            continue
        h = hit[:, cols]
        cov, se = clustered_rate(h.sum(1), np.full(h.shape[0], int(cols.sum())))
        r = rel[:, cols] if flags else None
        cov_rel, se_rel = clustered_rate((h & r).sum(1), r.sum(1)) if flags else (np.nan, np.nan)
        rows.append({"kind": kind.name, "n": int(n), "decile": b + 1, "kurtosis_low": float(kurt[cols].min()),
                     "kurtosis_high": float(kurt[cols].max()), "n_units": int(cols.sum()), "coverage": cov,
                     "coverage_mc_se": se, "worst_unit_coverage": float(h.mean(0).min()),
                     "coverage_reliable": cov_rel, "coverage_reliable_mc_se": se_rel,
                     "share_reliable": float(r.mean()) if flags else np.nan})
    return rows


def coverage_study(population: np.ndarray, sizes: Sequence[int], kinds: Sequence[IntervalKind], *,
                   n_datasets: int = 200, seed: Any = 0, confidence_level: float = 0.95,
                   coverage_floor: float = COVERAGE_FLOOR, min_reliable_cells: int = MIN_RELIABLE_CELLS
                   ) -> CalibrationResult:
    """CalibrationResult: coverage of each interval kind over ``n_datasets`` datasets of each size.

    Datasets are drawn with replacement from the rows of ``population`` [P, E]; each (size,
    dataset) gets its own spawned seed, so results do not depend on the order of kinds or sizes.
    ``coverage_floor`` and ``min_reliable_cells``: see the module docstring.
    """
    population = np.asarray(population, dtype=np.float64)
    if population.ndim != 2 or population.shape[0] < 2:
        raise ValueError(f"the population must be a [P, E] matrix with P >= 2 rows, got shape {population.shape}")
    if n_datasets < 20:
        raise ValueError(f"n_datasets={n_datasets} gives coverage to ±0.05 at best; use at least 20 (200 or more "
                         "to tell 0.90 from 0.95)")
    if not 0.0 < coverage_floor < 1.0 or int(min_reliable_cells) < 1:
        raise ValueError(f"coverage_floor must lie in (0, 1) and min_reliable_cells be at least 1, got "
                         f"{coverage_floor}, {min_reliable_cells}")
    root = as_seed_sequence(seed)
    rows, per_unit, by_kurtosis = [], [], []
    for n, ss in zip(sizes, root.spawn(len(sizes))):
        if int(n) < 2:
            raise ValueError(f"dataset size {n} is below 2; every interval needs at least 2 examples")
        for kind, a in zip(kinds, _one_size(population, int(n), n_datasets, kinds, ss)):
            rows.append(_summarise(kind, int(n), a, confidence_level, coverage_floor, int(min_reliable_cells)))
            per_unit += _unit_rows(kind, int(n), a)
            by_kurtosis += _kurtosis_rows(kind, int(n), a)
    params = {"estimator": "coverage_study", "sizes": [int(n) for n in sizes], "n_datasets": int(n_datasets),
              "population_rows": int(population.shape[0]), "confidence_level": confidence_level,
              "coverage_floor": float(coverage_floor), "min_reliable_cells": int(min_reliable_cells),
              "kinds": [k.name for k in kinds], "seed": seed_record(root)}
    return CalibrationResult(rows=rows, per_unit=per_unit, confidence_level=confidence_level, params=params,
                             by_kurtosis=by_kurtosis)
