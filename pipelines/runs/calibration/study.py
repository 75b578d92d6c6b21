"""Calibration study: do the audit's intervals cover on *this* model and task, at *this* N?

``circuitstat study calibration SPEC --out DIR`` computes per-example scores on a large population
of prompts (synthetic tasks make thousands cheap), then draws many datasets of each size N in the
spec's grid from that population and recomputes every interval the audit reports from each one
(circuitstat.stats.calibration). It writes empirical coverage with its Monte Carlo error, and width, per
interval type and N: the answer to "is N = 64 enough for my circuit?".

A spec::

    model: zoo:attn-only-2l/seed-0
    task: {name: induction, n: 1024, options: {seq_len: 10}}   # n: the population size
    method: exact
    sizes: [32, 64, 128]
    n_datasets: 200
    intervals: [edge, stability]   # which interval families to recompute per dataset
    ks: [5, 10, 20]                # circuit sizes of the stability and faithfulness intervals (below the edge count)

An existing attribution run can be the population instead (``scores: runs/a``, the directory
``circuitstat attribute --out`` wrote, or ``--scores DIR`` on the command line): its per-example
scores are used as they are, and its method and ablation are the study's (setting ``method``,
``ablation`` or ``ig_steps`` as well is refused). The edge and stability families need nothing
else; the faithfulness family re-runs the model on the population prompts, so it also needs
``model`` and ``task`` as the run was made, checked against the run's weight and task hashes.

Interval families (``intervals``):

* ``edge``: every per-edge interval method (circuitstat.stats.intervals.METHODS) against the population mean
  effect of each edge;
* ``stability``: the audit's data-level circuit-stability intervals (circuit_stability with
  data_level=True: jaccard_data, jaccard_pop, phi_data) at each k of ``ks``, against their
  population values at each N, computed by Monte Carlo over ``n_truth_pairs`` pairs of size-N
  datasets (circuitstat.stats.calibration_kinds); and the resampling-spread interval of the mean Jaccard
  (jaccard_ci_*), labelled as Monte Carlo error, against the same J_N to show it does not cover it.
  Circuits are chosen by ``ranking`` (as the audit's spec).
* ``faithfulness``: the audit's two faithfulness intervals at each k of ``ks`` (the fixed-circuit
  Fieller set, with the former BCa bootstrap beside it as ``fixed_bca``, and the selection-aware cross-fitted
  one) against f_pop(C(D)), the faithfulness
  over the whole population of the top-k circuit selected from each dataset. Every distinct
  selected circuit is run on every population prompt once (cached per prompt), so this family
  costs model forwards: on the zoo about 150 distinct circuits x 1024 prompts plus the
  cross-fitting folds. Only per-example ablations (counterfactual, zero): with mean or resample
  ablation a prompt's metric depends on the reference set, which differs between a dataset and
  the population.

Monte Carlo error: ``coverage_mc_se`` takes the dataset as the unit (circuitstat.stats.calibration): the edges
or circuit sizes of one dataset share its prompts and are not independent draws. There is no
null-rejection column for these families: every per-edge method is translation-equivariant, so
the false-positive rate of "the interval excludes 0" at a null edge shaped like edge e is
1 − e's coverage (circuitstat.stats.calibration_kinds.edge_interval_kinds).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from circuitstat.core.errors import InputError

if TYPE_CHECKING:  # the result type; imported when the study returns
    from circuitstat.core.run_tables import RunTables

from circuitstat.pipelines.runs.calibration.population import prepare_population
from circuitstat.pipelines.runs.calibration.spec import (CalibrationSpec, check_calibration_spec, load_calibration_spec,
                                                    parse_calibration_spec)
from circuitstat.pipelines.kinds import RunKind
from circuitstat.pipelines.sources import LOCAL, RunInputs

__all__ = ["CalibrationSpec", "parse_calibration_spec", "check_calibration_spec", "load_calibration_spec",
           "run_calibration_study", "summary_lines"]

#: the study's tables: coverage per kind and N, per unit, and by decile of the edges' kurtosis
TABLES = ("coverage", "coverage_per_unit", "coverage_by_kurtosis")


def edge_interval_kinds(population: np.ndarray, spec: CalibrationSpec, edge_names=None) -> list:
    """IntervalKinds for every per-edge interval method, against each edge's population mean (units named by
    ``edge_names``)."""
    from circuitstat.stats.calibration_kinds import edge_interval_kinds as kinds

    return kinds(population, n_resamples=spec.n_resamples, confidence_level=spec.confidence_level,
                 edge_names=edge_names)


def stability_kinds(population: np.ndarray, spec: CalibrationSpec, seed) -> list:
    """IntervalKinds of the data-level circuit-stability intervals (circuitstat.stats.calibration_kinds)."""
    from circuitstat.stats.calibration_kinds import stability_interval_kinds

    return stability_interval_kinds(population, spec.ks, ranking=spec.ranking, n_resamples=spec.n_resamples,
                                    confidence_level=spec.confidence_level, n_truth_pairs=spec.n_truth_pairs,
                                    seed=seed)


def faithfulness_kinds(population: np.ndarray, spec: CalibrationSpec, model, task) -> list:
    """IntervalKinds of the audit's two faithfulness intervals, each circuit run once per population prompt."""
    import warnings

    from circuitstat.circuits.ablation import Ablation
    from circuitstat.circuits.faithfulness import faithfulness
    from circuitstat.stats.calibration_kinds import PopulationEvaluations, faithfulness_interval_kinds

    ablation = Ablation(spec.ablation, model, task, seed=spec.seed, batch_size=spec.batch_size)

    def evaluate(masks: np.ndarray, rows: np.ndarray):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # undefined examples: f is NaN, and the row says so
            r = faithfulness(model, task, masks, ablation=ablation, rows=rows, seed=spec.seed,
                             batch_size=spec.batch_size, progress=False)
        return r.m_circuit, r.m_clean, r.m_empty

    evaluations = PopulationEvaluations(evaluate, population.shape[0], population.shape[1])
    return faithfulness_interval_kinds(evaluations, spec.ks, ranking=spec.ranking, n_resamples=spec.n_resamples,
                                       confidence_level=spec.confidence_level)


def interval_kinds(population: np.ndarray, spec: CalibrationSpec, truth_seed, model=None, task=None,
                   edge_names=None) -> list:
    """The IntervalKinds of every family in ``spec.intervals`` (each once, in the spec's order)."""
    build = {"edge": lambda: edge_interval_kinds(population, spec, edge_names),
             "stability": lambda: stability_kinds(population, spec, truth_seed),
             "faithfulness": lambda: faithfulness_kinds(population, spec, model, task)}
    return [k for family in dict.fromkeys(spec.intervals) for k in build[family]()]


def check_ks(spec: CalibrationSpec, n_edges: int) -> None:
    """InputError (before any attribution runs) when a circuit size k is not below the model's edge count."""
    if {"stability", "faithfulness"} & set(spec.intervals) and spec.ks[-1] >= n_edges:
        raise InputError(f"invalid calibration spec: ks go up to {spec.ks[-1]} but the model has {n_edges} edges; "
                         f"every k must be below {n_edges}")


def run_calibration_study(spec: CalibrationSpec, out: str | Path, *, n_jobs: int | None = None,
                          force: bool = False, allow_pickle: bool = False, allow_large: bool = False,
                          inputs: RunInputs = LOCAL) -> RunTables:
    """Run (or resume) the calibration study of ``spec`` into run directory ``out``; return its tables as a
    result read lazily (main table ``coverage``). ``allow_pickle`` / ``allow_large``: as for load_model."""
    from circuitstat.core.run_tables import RunTables
    from circuitstat.core.rundir import RunDir
    from circuitstat.core.tables import table_to_matrix
    from circuitstat.stats.calibration import coverage_study

    from circuitstat.pipelines.training import use_deterministic

    use_deterministic()  # CUBLAS_WORKSPACE_CONFIG too, before any model loads
    src = prepare_population(spec, n_jobs=n_jobs, allow_pickle=allow_pickle, allow_large=allow_large, inputs=inputs)
    spec = src.spec  # with what a scores run decides (method, ablation) filled in
    check_ks(spec, src.n_edges)
    doc = spec.model_dump()
    with RunDir(out, spec=doc, command=sys.argv, seed=spec.seed, kind="study calibration", provenance=src.provenance) as run:
        name = f"scores_{spec.method}"
        run.stage(name, lambda: {name: src.scores_table()}, [name], params=src.params, force=force)
        population = np.asarray(table_to_matrix(run.table(name)), dtype=np.float64)

        def calibrate() -> dict:
            kinds = interval_kinds(population, spec, run.stage_seed("calibration-truth"), src.model, src.task,
                                   src.edge_names)
            res = coverage_study(population, spec.sizes, kinds, n_datasets=spec.n_datasets,
                                 seed=run.stage_seed("calibration"), confidence_level=spec.confidence_level)
            return res.tables()

        keys = ("sizes", "n_datasets", "n_resamples", "confidence_level", "intervals", "ks", "ranking",
                "n_truth_pairs")
        run.stage("calibration", calibrate, list(TABLES),
                  params={k: doc[k] for k in keys}, depends_on=[name], force=force)
    from circuitstat.core.run_tables import RunTables

    return RunTables(Path(out), TABLES, "coverage",
                     {"study": "calibration", "spec": doc, "confidence_level": spec.confidence_level})


def summary_lines(rows: list[dict], confidence_level: float, out: Path | str,
                  by_kurtosis: list[dict] | None = None) -> list[str]:
    """The one-screen summary: one line per interval kind and N, the worst unit of each (overall and among cells
    flagged reliable), coverage by kurtosis decile of the default edge method, then what each family covers."""

    def opt(v: float) -> str:
        return f"{v:>9.3f}" if np.isfinite(v) else f"{'—':>9}"  # the kind flags no unit reliable

    lines = [f"{'interval':<28} {'N':>5} {'coverage':>9} {'±MC':>6} {'worst':>6} {'reliable':>9} "
             f"{'mean width':>11} {'infinite':>8}"]
    for r in rows:
        lines.append(f"{r['kind']:<28} {r['n']:>5} {r['coverage']:>9.3f} {r['coverage_mc_se']:>6.3f} "
                     f"{r['worst_unit_coverage']:>6.3f} {opt(r['coverage_reliable'])} {r['mean_width']:>11.4g} "
                     f"{r['share_infinite']:>8.3f}")
    lines += _worst_unit_lines(rows) + _kurtosis_lines(by_kurtosis or [])
    covers: dict[str, str] = {}
    for r in rows:  # the edge methods share one estimand: one line for all of them
        covers.setdefault("edge/*" if r["kind"].startswith("edge/") else r["kind"], r["estimand"])
    lines += ["what each interval is checked against:"] + [f"  {kind}: {est}" for kind, est in covers.items()]
    lines.append(f"nominal {confidence_level}; ±MC: Monte Carlo SE of coverage, each dataset one unit; worst: the "
                 f"lowest coverage of one unit (edge or k); reliable: coverage of the units the interval's flag passes "
                 f"(edge kinds: no_tail_seen true, which does not make them cover; — where it flags none); tables in {out}")
    return lines


def _worst_unit_lines(rows: list[dict]) -> list[str]:
    """Per kind and N: the worst unit (name, coverage, |mean| rank, kurtosis), how many units cover below the
    floor, the same among cells flagged reliable, and the coverage of the cells flagged unreliable."""
    if not rows:
        return []

    def num(v: float, fmt: str, width: int) -> str:
        return f"{v:>{width}{fmt}}" if v is not None and np.isfinite(v) else f"{'—':>{width}}"

    floor = rows[0].get("coverage_floor", 0.9)
    lines = [f"per unit: the worst unit, units below {floor:.2f}, the worst among cells flagged reliable "
             f"(units with enough such cells), coverage of the cells flagged unreliable",
             f"{'interval':<28} {'N':>5} {'worst unit':<22} {'cov':>6} {'rank':>5} {'kurt':>7} {'<floor':>6} "
             f"{'worst reliable':<22} {'cov':>6} {'cells':>5} {'<floor':>6} {'unreliable':>10}"]
    for r in rows:
        rel = r["worst_reliable_unit"] or "—"
        lines.append(
            f"{r['kind']:<28} {r['n']:>5} {str(r['worst_unit'])[:22]:<22} {r['worst_unit_coverage']:>6.3f} "
            f"{num(r['worst_unit_abs_mean_rank'], '.0f', 5)} {num(r['worst_unit_excess_kurtosis'], '.0f', 7)} "
            f"{r['n_units_below_floor']:>6} {rel[:22]:<22} {num(r['worst_reliable_unit_coverage'], '.3f', 6)} "
            f"{r['worst_reliable_unit_cells']:>5} {r['n_units_reliable_below_floor']:>6} "
            f"{num(r['coverage_unreliable'], '.3f', 10)}")
    return lines


def _kurtosis_lines(by_kurtosis: list[dict]) -> list[str]:
    """Coverage by decile of the edges' excess kurtosis, for the audit's default edge method, one line per N."""
    from circuitstat.stats.intervals import DEFAULT_METHOD

    mine = [r for r in by_kurtosis if r["kind"] == f"edge/{DEFAULT_METHOD}"]
    if not mine:
        return []
    tops = ", ".join(f"{r['kurtosis_high']:.3g}" for r in mine if r["n"] == mine[0]["n"])
    lines = [f"coverage by decile of the edges' excess kurtosis (edge/{DEFAULT_METHOD}; lightest first; "
             f"kurtosis up to {tops})"]
    for n in dict.fromkeys(r["n"] for r in mine):
        cov = " ".join(f"{r['coverage']:.3f}" for r in mine if r["n"] == n)
        rel = " ".join("—" if not np.isfinite(r["coverage_reliable"]) else f"{r['coverage_reliable']:.3f}"
                       for r in mine if r["n"] == n)
        lines += [f"N={n:<5} all       {cov}", f"N={n:<5} reliable  {rel}"]
    return lines


def calibration_stages(spec: CalibrationSpec) -> list[str]:
    """The RunDir stages :func:`run_calibration_study` writes for ``spec``, in order."""
    return [f"scores_{spec.method}", "calibration"]


def calibration_flops(spec: CalibrationSpec, cfg) -> float:
    """The attribution FLOPs of the study's population on a model of config ``cfg`` (0 when it reads scores)."""
    from circuitstat.pipelines.build import attribution_flops

    if spec.scores is not None:
        return 0.0
    return attribution_flops(cfg, spec, spec.method, spec.task.n, ig_steps=spec.ig_steps)


KIND = RunKind("study calibration", "do the audit's intervals cover on this model and task, at this N?",
               parse=parse_calibration_spec, run=run_calibration_study, stages=calibration_stages, flops=calibration_flops,
               sources=lambda spec: [] if spec.model is None else [spec.model])
