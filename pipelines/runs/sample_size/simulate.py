"""``circuitstat sample-size``: how many prompts a full run needs, predicted from a pilot run's per-example scores.

The statistics are circuitstat.stats.sample_size (widths, expected data-level Jaccard, simulated datasets). Here:
reading the pilot (an ``attribute`` or ``audit`` run), the chance that a claims file passes at N -- the claims'
own evaluators (circuitstat.pipelines.claims) run on the tables the audit would write (its own table builders,
circuitstat.pipelines.runs.audit.tables) for each simulated dataset -- and the cost of each N (``--plan``: the cost
model of circuitstat.circuits.plan, priced at the machine's matmul rate).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.params import BATCH_SIZE, IG_STEPS, N_JOBS, SEED
from circuitstat.core.results import Result
from circuitstat.pipelines.options import SAMPLE_SIZE_DATASETS, SAMPLE_SIZE_LEVEL, SAMPLE_SIZE_MEANS

__all__ = ["SIMULATED_KINDS", "SampleSizeResult", "read_pilot", "pilot_groups", "sample_size", "cost_rows"]

#: claim kinds answered from simulated tables (the others need model runs: faithfulness, heads, tests ...)
SIMULATED_KINDS = ("edge_effect", "circuit_stability", "edge_in_circuit")


def read_pilot(run: str | Path, method: str | None = None, *, trust_unrecorded: bool = False):
    """Return (ScoreMatrix, the run's AuditSpec or None) of a pilot run directory; InputError naming the fix,
    IntegrityError when its tables are not the ones it recorded (circuitstat.core.run_check)."""
    from circuitstat.circuits.scores import ScoreMatrix
    from circuitstat.core.run_check import verify_outputs

    path = Path(run)
    if not path.is_dir():
        raise InputError(f"pilot run {path} is not a directory; give the --out of `circuitstat attribute` or "
                         "`circuitstat audit`")
    verify_outputs(path, trust_unrecorded=trust_unrecorded)  # the pilot's scores are the ones it wrote
    if (path / "scores.parquet").is_file() and method is None:
        return ScoreMatrix.read(path), None
    found = sorted(p.stem[len("scores_"):] for p in path.glob("scores_*.parquet"))
    if method is None:
        if len(found) != 1:
            raise InputError(f"pilot run {path} holds {'no' if not found else 'several'} per-example score tables"
                             + (f" ({', '.join(found)}); pick one with --method" if found else
                                "; give the --out of `circuitstat attribute` or an audit run"))
        method = found[0]
    if method not in found:
        raise InputError(f"pilot run {path} has no scores of method {method!r}"
                         + (f"; it has {', '.join(found)}" if found else "") + " (--method)")
    sm = ScoreMatrix.read(path, f"scores_{method}")
    return sm, _audit_spec(path)


def pilot_groups(sm) -> np.ndarray | None:
    """The templates an audit recorded with its scores (one integer label per prompt), None where it recorded none;
    the file is untrusted, so anything else is an InputError (its content is not echoed)."""
    groups = (sm.provenance or {}).get("groups")
    if groups is None:
        return None
    if not isinstance(groups, list) or len(groups) != sm.scores.shape[0] or not all(
            isinstance(g, int) and not isinstance(g, bool) for g in groups):
        raise InputError(f"the pilot's recorded templates are not one integer per prompt ({sm.scores.shape[0]}); "
                         "rerun its scores stage (`circuitstat audit SPEC --out RUN --force`)")
    return np.asarray(groups, dtype=np.int64)


def _audit_spec(path: Path):
    """The AuditSpec an audit run recorded in its manifest (None when it has none)."""
    from circuitstat.core.rundir import MANIFEST, RunDir
    from circuitstat.pipelines.spec import AuditSpec

    if not (path / MANIFEST).is_file():
        return None
    spec = RunDir.read_manifest(path).get("spec")
    try:
        return AuditSpec.model_validate(spec)
    except Exception:  # noqa: BLE001 - another kind's spec: the defaults are used
        return None


@dataclass(repr=False)
class SampleSizeResult(Result):
    """Predictions at each N from a pilot: per-edge widths, stability, claims and (with --plan) cost tables."""

    run_kind = "sample-size"  # the run kind its run directory records (circuitstat.pipelines.kinds)

    widths: dict
    stability: dict
    claims: dict | None = None
    cost: dict | None = None
    params: dict = field(default_factory=dict)
    main_table = "sample_size_stability"

    def _tables(self) -> dict:
        out = {"sample_size_stability": self.stability, "sample_size_widths": self.widths}
        if self.claims is not None:
            out["sample_size_claims"] = self.claims
        if self.cost is not None:
            out["sample_size_cost"] = self.cost
        return out

    def _summary_items(self) -> list:
        return [("pilot examples", self.params.get("n_pilot")), ("N", self.params.get("ns"))]


def _claims_pass(cf, D: np.ndarray, names: list[str], method: str, ks: list[int], spec, seed, n_jobs: int,
                 need_edges: bool, groups: np.ndarray | None = None) -> tuple[np.ndarray, list[str]]:
    """([2, k] lower ends of J_{N/2}'s and J_N's data-level intervals, status per claim) of one simulated dataset D (its templates ``groups`` under the
    cluster scheme), through the audit's table builders and the claims' own evaluators (tables in a temporary
    directory, removed after)."""
    from circuitstat.core.tables import write_table
    from circuitstat.pipelines.runs.audit.run import resampling_plan
    from circuitstat.pipelines.runs.audit.tables import edge_stats_table, stability_tables
    from circuitstat.pipelines.claims.evaluation import evaluate_claims

    plan = resampling_plan(spec, D.shape[0], groups, seed, for_intervals=True)
    stab, inc = stability_tables(D, names, method, plan, ks, spec, n_jobs)
    lows = np.array([stab["jaccard_half_ci_low"], stab["jaccard_data_ci_low"]], dtype=np.float64)
    if cf is None:
        return lows, []
    with tempfile.TemporaryDirectory(prefix="circuitstat-sample-size-") as tmp:
        write_table(stab, Path(tmp) / "stability_vs_k.parquet")
        write_table(inc, Path(tmp) / "inclusion.parquet")
        if need_edges:
            write_table(edge_stats_table(D, names, method, plan, spec, n_jobs), Path(tmp) / "edge_stats.parquet")
        results = evaluate_claims(cf, tmp, trust_unrecorded=True)  # tables made just now, in a private directory
    return lows, [r.status for r in results]


def _simulate(S: np.ndarray, names: list[str], method: str, n: int, ks: list[int], cf, spec, *, n_datasets: int,
              seed: Any, means: str, n_jobs: int, groups: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """([n_datasets, 2, k] lower ends of J_{N/2}'s and J_N's intervals, [n_datasets, claims] passes) over simulated datasets of n (with the
    pilot's templates ``groups``: of whole templates, as many as n prompts hold at the pilot's prompts per template)."""
    from circuitstat.core.seeds import spawn_seeds
    from circuitstat.stats.sample_size import simulated_datasets
    from circuitstat.stats.sample_size_templates import simulated_template_datasets, template_counts

    c_data, c_plans = spawn_seeds(seed, 2)
    need_edges = cf is not None and any(c.kind == "edge_effect" for c in cf.claims)
    if groups is None:
        data = ((D, None) for D in simulated_datasets(S, n, n_datasets, ranking=spec.ranking, seed=c_data,
                                                       means=means))
    else:
        g = int(template_counts([n], S.shape[0], np.unique(groups).size)[0])
        data = simulated_template_datasets(S, groups, g, n_datasets, ranking=spec.ranking, seed=c_data, means=means)
    lows, passes = [], []
    for d, (D, labels) in enumerate(data):
        low, status = _claims_pass(cf, D, names, method, ks, spec, spawn_seeds(c_plans, n_datasets)[d], n_jobs,
                                   need_edges, labels)
        lows.append(low)
        passes.append([s == "pass" for s in status])
    return np.asarray(lows), np.asarray(passes, dtype=bool).reshape(n_datasets, -1)


def _split_claims(cf, method: str):
    """(the claims file of the simulated claims or None, {claim index: why it is not simulated})."""
    from circuitstat.pipelines.claims.claimsfile import ClaimsFile

    skip = {}
    for i, c in enumerate(cf.claims):
        if c.kind not in SIMULATED_KINDS:
            skip[i] = (f"kind {c.kind} is not simulated (it needs model runs); simulated kinds: "
                       f"{', '.join(SIMULATED_KINDS)}")
        elif c.method != method:
            skip[i] = f"the pilot's scores are {method}, the claim's method is {c.method}"
    kept = [c for i, c in enumerate(cf.claims) if i not in skip]
    return (cf.model_copy(update={"claims": kept}) if kept else None), skip


def _claims_table(cf, skip: dict, ns: np.ndarray, passes: dict, n_datasets: int) -> dict:
    """Rows per (claim, n): the chance it passes on a dataset of n (NaN where not simulated, with why)."""
    rows: dict[str, list] = {k: [] for k in ("claim", "label", "kind", "n", "p_pass", "p_pass_se", "n_datasets",
                                             "note")}
    sim_index = [i for i in range(len(cf.claims)) if i not in skip]
    for i, c in enumerate(cf.claims):
        for n in ns:
            got = passes.get(int(n))
            if i in skip or got is None:
                p = math.nan
                note = skip.get(i, "the audit's data-level intervals need N >= 32: not simulated at this N")
            else:
                p, note = float(got[:, sim_index.index(i)].mean()), ""
            for key, v in (("claim", i), ("label", c.label(i)), ("kind", c.kind), ("n", int(n)), ("p_pass", p),
                           ("p_pass_se", math.sqrt(p * (1 - p) / n_datasets) if p == p else math.nan),
                           ("n_datasets", n_datasets if p == p else 0), ("note", note)):
                rows[key].append(v)
    return rows


def sample_size(S: np.ndarray, names: Sequence[str], method: str, ns: Sequence[int], ks: Sequence[int],
                target: float, *, claims=None, spec=None, n_datasets: int = SAMPLE_SIZE_DATASETS,
                seed: Any = SEED.default, means: str = SAMPLE_SIZE_MEANS[0],
                prediction_level: float = SAMPLE_SIZE_LEVEL, n_jobs: int = N_JOBS.default,
                cost: dict | None = None, groups: np.ndarray | None = None,
                allow_large: bool = False) -> SampleSizeResult:
    """Return the SampleSizeResult of pilot scores S [n0, E] (method ``method``) at sizes ns and circuit sizes ks.

    spec: the audit settings the full run will use (its bootstrap and ranking; default AuditSpec's);
    claims: a ClaimsFile whose simulated kinds get a pass probability; n_datasets simulated datasets per N.
    groups [n0]: the pilot's templates; under the cluster scheme (spec.bootstrap.scheme 'clusters') a dataset of N
    prompts holds round(N G0 / n0) whole templates, the widths and Jaccard are predicted from the template means
    as units, and the claims are simulated on datasets of whole pilot templates with the cluster scheme's tables.
    The work is priced first (circuitstat.pipelines.work.check_sample_size; ``allow_large`` lifts the limits).
    """
    from circuitstat.core.seeds import as_seed_sequence, seed_record, spawn_seeds
    from circuitstat.pipelines.spec import AuditSpec
    from circuitstat.stats.sample_size import check_pilot, predict_stability, predict_widths
    from circuitstat.stats.stability_data import MIN_OBS

    spec = spec if spec is not None else AuditSpec(model="pilot")
    S, ns_arr = check_pilot(S, ns, prediction_level=prediction_level)
    if not 0 <= float(target) <= 1:
        raise InputError(f"--target is a Jaccard and must lie in [0, 1], got {target}")
    if int(n_datasets) < 2:
        raise InputError(f"--datasets must be at least 2, got {n_datasets}")
    cf, skip = _split_claims(claims, method) if claims is not None else (None, {})
    claim_ks = sorted({c.k for c in (cf.claims if cf is not None else []) if getattr(c, "k", None) is not None})
    ks_sim = sorted(set(int(k) for k in ks) | set(claim_ks))
    from circuitstat.pipelines.work import check_sample_size

    check_sample_size(S.shape[0], S.shape[1], ns_arr, n_datasets=int(n_datasets), n_resamples=spec.bootstrap.n_resamples,
                      n_ks=len(ks_sim), edge_claims=cf is not None and any(c.kind == "edge_effect" for c in cf.claims),
                      allow_large=allow_large)
    root = as_seed_sequence(seed)
    c_w, c_s, c_sim = spawn_seeds(root, 3)
    groups = _pilot_groups(spec, groups, S.shape[0])
    units, unit_ns = (S, ns_arr) if groups is None else _template_units(S, groups, ns_arr)
    widths = predict_widths(units, unit_ns, confidence_level=spec.bootstrap.confidence_level,
                            prediction_level=prediction_level, n_resamples=spec.bootstrap.n_resamples, seed=c_w)
    stab = predict_stability(units, unit_ns, ks, ranking=spec.ranking, seed=c_s, means=means,
                             prediction_level=prediction_level)
    for table in (widths, stab):  # rows by units (templates under the cluster scheme) back to prompts
        table["n"] = ns_arr[np.searchsorted(unit_ns, table["n"])]
    widths["name"] = np.asarray(names, dtype=object)[widths["edge"]]
    p_clear, p_half = np.full(stab["n"].size, np.nan), np.full(stab["n"].size, np.nan)
    passes = {}
    for n, c in zip(ns_arr, spawn_seeds(c_sim, ns_arr.size)):
        if n < MIN_OBS:
            continue
        lows, passes[int(n)] = _simulate(S, list(names), method, int(n), ks_sim, cf, spec, n_datasets=n_datasets,
                                         seed=c, means=means, n_jobs=n_jobs, groups=groups)
        for j, k in enumerate(ks_sim):
            at = (stab["n"] == n) & (stab["k"] == k)
            p_half[at], p_clear[at] = (lows[:, 0, j] >= target).mean(), (lows[:, 1, j] >= target).mean()
    # p_clear_half: the primary (J_{N/2}, jaccard_half_ci_low); p_clear: J_N's (jaccard_data_ci_low), as before
    stab.update(p_clear_half=p_half, p_clear_half_se=np.sqrt(p_half * (1 - p_half) / n_datasets),
                p_clear=p_clear, p_clear_se=np.sqrt(p_clear * (1 - p_clear) / n_datasets),
                target=np.full(p_clear.size, float(target)))
    params = {"estimator": "sample_size", "n_pilot": int(S.shape[0]), "method": method, "ns": ns_arr,
              "ks": list(ks), "target": float(target), "n_datasets": int(n_datasets), "means": means,
              "prediction_level": prediction_level, "ranking": spec.ranking, "seed": seed_record(root),
              "bootstrap": spec.bootstrap.model_dump(), "confidence_level": prediction_level}
    if groups is not None:
        from circuitstat.stats.sample_size_templates import template_counts

        params.update(unit="templates", n_templates_pilot=int(np.unique(groups).size),
                      n_templates=template_counts(ns_arr, S.shape[0], np.unique(groups).size))
    table = _claims_table(claims, skip, ns_arr, passes, int(n_datasets)) if claims is not None else None
    return SampleSizeResult(widths, stab, table, cost, params)


def _pilot_groups(spec, groups, n0: int) -> np.ndarray | None:
    """The pilot's templates when the full run resamples them (scheme 'clusters'), checked; None otherwise."""
    if spec.bootstrap.scheme != "clusters":
        return None
    if groups is None:
        raise InputError("the full run resamples templates (bootstrap scheme 'clusters') but the pilot's scores do not "
                         "record them; rerun the pilot's scores stage (`circuitstat audit SPEC --out RUN --force`) "
                         "with a task that has a group column")
    groups = np.asarray(groups)
    if groups.ndim != 1 or groups.size != n0:
        raise InputError(f"the pilot's templates must give one label per prompt ({n0}), got {groups.size}; rerun its "
                         "scores stage")
    return groups


def _template_units(S: np.ndarray, groups: np.ndarray, ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(template means [G0, E], the template count of each n): the cluster scheme's units, at the pilot's size."""
    from circuitstat.stats.sample_size import MIN_PILOT
    from circuitstat.stats.sample_size_templates import template_counts, template_means

    M = template_means(S, groups)
    if M.shape[0] < MIN_PILOT:
        raise InputError(f"under the cluster scheme a pilot's units are its templates: it needs at least {MIN_PILOT}, "
                         f"got G = {M.shape[0]}; add templates to the pilot's task, or plan with scheme 'examples'")
    unit_ns = template_counts(ns, S.shape[0], M.shape[0])
    if np.unique(unit_ns).size != unit_ns.size:
        raise InputError(f"the sizes N {ns.tolist()} give the same number of templates ({unit_ns.tolist()}) at "
                         f"{S.shape[0] / M.shape[0]:.3g} prompts per template; give sizes further apart")
    return M, unit_ns


def cost_rows(cfg, ns: Sequence[int], positions: int, methods: Sequence[str], rate_tflops: float,
              *, batch_size: int = BATCH_SIZE.default, ig_steps: int = IG_STEPS.default) -> dict:
    """Rows per (n, method): the cost model's passes and FLOPs (circuitstat.circuits.plan.method_cost) and
    the seconds they take at ``rate_tflops`` (a lower bound: per-call overhead and memory-bound work left out)."""
    from circuitstat.circuits.plan import method_cost

    rows: dict[str, list] = {k: [] for k in ("n", "method", "forwards", "backwards", "suffix_rows", "flops",
                                             "seconds_at_rate")}
    for n in ns:
        for m in methods:
            c = method_cost(cfg, m, n=int(n), positions=int(positions), batch_size=batch_size, ig_steps=ig_steps)
            for key, v in (("n", int(n)), ("method", m), ("forwards", c.forwards), ("backwards", c.backwards),
                           ("suffix_rows", c.suffix_rows), ("flops", c.flops),
                           ("seconds_at_rate", c.flops / (rate_tflops * 1e12))):
                rows[key].append(v)
    return rows
