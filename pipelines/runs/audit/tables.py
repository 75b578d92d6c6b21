"""The audit's table builders: the columns of edge_stats, stability_vs_k and inclusion, faithfulness_vs_k,
approximation and approximation_summary, built from score matrices by the estimators of stats/ and
circuits/ (circuitstat.pipelines.runs.audit.run runs them as resumable stages; the variance study reuses them).

Each builder returns ``{column: values}`` in the order core/schema.py registers; :func:`concat_parts`
stacks the per-method parts of one table.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from circuitstat.core.schema import columns
from circuitstat.core.topk import TIE_RULE

from circuitstat.pipelines.spec import AuditSpec


def edge_stats_table(S: np.ndarray, names: list[str], method: str, plan, spec: AuditSpec, n_jobs: int) -> dict:
    """Per-edge mean, bootstrap SE and CI, the p-value that inverts that CI, BH q, and the no_tail_seen flag."""
    from circuitstat.stats import bootstrap_edges

    boot = bootstrap_edges(S, plan, method=spec.bootstrap.ci_method, confidence_level=spec.bootstrap.confidence_level,
                           n_jobs=n_jobs)
    E = S.shape[1]
    return {"method": [method] * E, "edge": np.arange(E, dtype=np.int64), "name": names,
            "estimate": np.asarray(boot.estimate, dtype=np.float64),
            "se": np.asarray(boot.standard_error, dtype=np.float64),
            "ci_low": np.asarray(boot.confidence_interval.low, dtype=np.float64),
            "ci_high": np.asarray(boot.confidence_interval.high, dtype=np.float64),
            "p": np.asarray(boot.pvalue, dtype=np.float64), "q": np.asarray(boot.qvalue, dtype=np.float64),
            "n": np.full(E, S.shape[0], dtype=np.int64),
            "ci_method": [boot.method] * E, "estimand": [boot.estimand] * E,
            "tail_share": np.asarray(boot.tail_share, dtype=np.float64),
            "no_tail_seen": np.asarray(boot.reliable, dtype=bool),
            "n_clusters": np.full(E, plan.describe().get("n_clusters", S.shape[0]), dtype=np.int64),
            "ci_method_note": [boot.params["method_reason"]] * E,
            "p_floor": np.full(E, boot.params["pvalue_floor"], dtype=np.float64),
            **robust_edge_columns(S, plan, spec.bootstrap.confidence_level)}


def robust_edge_columns(S: np.ndarray, plan, confidence_level: float) -> dict:
    """The robust-estimand columns of edge_stats (median and 20%-trimmed mean, each with its interval, the p-value
    that inverts it and BH q over edges); NaN with the reason in robust_note under a cluster bootstrap."""
    from circuitstat.core.score_columns import column_blocks
    from circuitstat.stats.robust import median_interval, trimmed_mean_interval
    from circuitstat.stats.testing import bh_adjust

    E = S.shape[1]
    names = [c for c in columns("edge_stats") if c.startswith(("median", "trimmed_mean"))]
    if plan.kind == "cluster":
        note = ("not computed: the median's and trimmed mean's intervals assume independent prompts, and this run's "
                "prompts share templates (cluster bootstrap)")
        return {**{c: np.full(E, np.nan) for c in names}, "robust_note": [note] * E}
    parts: dict = {}
    for _, block in column_blocks(S):  # per-edge statistics: block by block, as a ParquetColumns is read
        for prefix, r in (("median", median_interval(block, confidence_level)),
                          ("trimmed_mean", trimmed_mean_interval(block, confidence_level=confidence_level))):
            for key, v in ((prefix, r.estimate), (f"{prefix}_ci_low", r.low), (f"{prefix}_ci_high", r.high),
                           (f"{prefix}_p", r.pvalue)):
                parts.setdefault(key, []).append(np.asarray(v, dtype=np.float64))
    out = {key: np.concatenate(v) for key, v in parts.items()}
    out.update({f"{prefix}_q": bh_adjust(out[f"{prefix}_p"]) for prefix in ("median", "trimmed_mean")})
    return {**{c: np.asarray(out[c], dtype=np.float64) for c in names}, "robust_note": [""] * E}


# the per-k columns of circuit_stability that the stability_vs_k table carries (core/schema.py says what
# each covers: jaccard_ci_* / phi_ci_* are Monte Carlo spread, jaccard_data* / jaccard_pop* / phi_data* data-level)
STABILITY_COLUMNS = tuple(c for c in columns("stability_vs_k")
                          if c not in ("method", "k", "spearman_mean", "tie_rule", "data_level_note", "ranked_by"))


def plain_ranked_by(method: str) -> str:
    """The ranked_by words of a plain method's circuits: the top-k of its mean score."""
    return f"mean {method} score"


def stability_tables(S: np.ndarray, names: list[str], method: str, plan, ks: list[int], spec: AuditSpec,
                     n_jobs: int, ranked_by: str | None = None) -> tuple[dict, dict]:
    """(stability_vs_k, inclusion) columns for one method; ``ranked_by`` names what S's column means estimate
    (a verified method's estimand; default: the method's mean score)."""
    from circuitstat.stats import circuit_stability

    res = circuit_stability(S, plan, ks, ranking=spec.ranking, n_jobs=n_jobs, edge_names=names)
    return stability_columns(res, names, method, ranked_by or plain_ranked_by(method))


def stability_columns(res, names: list[str], method: str, ranked_by: str) -> tuple[dict, dict]:
    """(stability_vs_k, inclusion) columns of one method's StabilityResult ``res`` (circuitstat.stats.stability:
    circuit_stability, or refit_stability for a mask-learned method, whose data-level note is a string)."""
    per = res.per_k
    stab = {"method": [method] * len(res.ks), "k": res.ks.astype(np.int64)}
    for c in STABILITY_COLUMNS:
        v = np.asarray(per[c])
        stab[c] = v.astype(np.int64) if c == "consensus_size" else v.astype(np.float64)
    stab["spearman_mean"] = np.full(len(res.ks), res.spearman_mean)
    stab["tie_rule"] = [TIE_RULE] * len(res.ks)
    data_level = res.params.get("data_level") or {}
    note = data_level if isinstance(data_level, str) else (data_level.get("reason") or "")
    stab["data_level_note"] = [note] * len(res.ks)
    stab["ranked_by"] = [ranked_by] * len(res.ks)
    ki, ei = np.nonzero(res.inclusion_counts)
    inc = {"method": [method] * len(ki), "k": res.ks[ki].astype(np.int64), "edge": ei.astype(np.int64),
           "name": [names[e] for e in ei], "frequency": res.inclusion_counts[ki, ei] / res.n_resamples}
    return stab, inc


AREA_NEEDS_TWO_K = "CPR and CMD are areas under the faithfulness curve and need at least two k"


def ablation_of(model: Any, task: Any, spec: Any) -> Any:
    """Return the spec's ablation for circuitstat.circuits.faithfulness: its name, or an Ablation object when the input node
    is MIB's token embedding (``input_node: tokens``), so circuits are evaluated as they were scored."""
    node = getattr(spec, "input_node", "embeddings")
    if node == "embeddings":
        return spec.ablation
    from circuitstat.circuits.ablation import Ablation

    return Ablation(spec.ablation, model, task, seed=spec.seed, batch_size=spec.batch_size, input_node=node)


def faithfulness_table(model, task, S: np.ndarray, method: str, ks: list[int], plan, spec: AuditSpec,
                       seed=None, strata: np.ndarray | None = None, ranked_by: str | None = None) -> dict:
    """Faithfulness of the top-k circuit of the mean scores at each k, with two labelled intervals:
    the bootstrap interval of this fixed circuit (selection not included) and the cross-fitted one of
    the circuit selected from N prompts (selection included; edge level). CPR/CMD are NaN, with the
    reason in ``area_note``, when the grid has one k. ``strata``: S are a verified run's pseudo-scores
    (circuitstat.stats.verified.pseudo), cross-fitted with stratified folds and stratum-weighted training
    means; ``ranked_by`` names their estimand (default: the method's mean score)."""
    level = getattr(spec, "level", "edge")
    mean = S.astype(np.float64).sum(0) / S.shape[0]
    seed = spec.seed if seed is None else seed
    out, res = fixed_faithfulness_columns(model, task, mean, spec.ranking, method, ks, plan, spec, seed)
    out.update(_selected_columns(model, task, S, ks, spec, res, seed, len(out["k"]), strata))
    out.update(conditional_columns(len(out["k"]), NOT_REFITTED))
    out.update(circuit_notes(model, res, out, level))
    out["k_source"] = ["grid"] * len(out["k"])
    out["ranked_by"] = [ranked_by or plain_ranked_by(method)] * len(out["k"])
    return out


NOT_REFITTED = ("a mask-learned method's column: this circuit is the top-k of the mean scores, and its fixed-circuit "
                "interval (f_ci) is the one for the circuit reported")


def conditional_columns(C: int, why: str) -> dict:
    """The f_conditional columns of faithfulness_vs_k, NaN with ``why`` (circuitstat.pipelines.runs.audit.masks fills them)."""
    from circuitstat.stats.faithfulness_refit import ESTIMAND_CONDITIONAL

    return {"f_conditional": np.full(C, np.nan), "f_conditional_ci_low": np.full(C, np.nan),
            "f_conditional_ci_high": np.full(C, np.nan), "f_conditional_shape": [""] * C,
            "f_conditional_estimand": [ESTIMAND_CONDITIONAL] * C, "conditional_circuit_jaccard": np.full(C, np.nan),
            "f_conditional_note": [why] * C}


def fixed_faithfulness_columns(model, task, ranked: np.ndarray, ranking: str, method: str, ks: list[int], plan,
                               spec: AuditSpec, seed) -> tuple[dict, object]:
    """(the fixed-circuit columns of faithfulness_vs_k, the FaithfulnessCurve) of the top-k circuits of the vector
    ``ranked`` [E] (a method's mean scores, or a mask-learned method's logits) under ``ranking``."""
    from circuitstat.circuits.faithfulness import faithfulness_curve
    from circuitstat.stats.faithfulness import fixed_circuit_interval
    from circuitstat.stats.fieller import FIELLER_ESTIMAND, fieller_over_plan

    level = getattr(spec, "level", "edge")
    # the one top-k (circuitstat.core.topk), ties at random from the seed: the rule stability and f_selected use
    res = faithfulness_curve(model, task, ranked.astype(np.float32), ranking=ranking, ks=ks,
                             fractions=None, prune=False, ablation=ablation_of(model, task, spec), seed=spec.seed,
                             batch_size=spec.batch_size, progress=sys.stderr.isatty(), level=level, tie_seed=seed)
    ties = res.to_table("faithfulness_circuits").select(["tie_rule", "cutoff_ties", "cutoff_ties_excluded"]).to_pydict()
    # f is a ratio of means: its interval is Fieller's set (circuitstat.stats.fieller, the one the published circuit
    # gets), unbounded where the full model's effect over the empty circuit is not distinguishable from 0; a
    # bootstrap interval of the ratio undercovers there (docs/mib.md). The bootstrap still gives f_se.
    conf = spec.bootstrap.confidence_level
    fixed = fixed_circuit_interval(res.m_circuit, res.m_clean, res.m_empty, plan, method="percentile",
                                   confidence_level=conf, k=ks)
    m0 = np.asarray(res.m_empty, dtype=np.float64)
    fie = fieller_over_plan(np.asarray(res.m_circuit, dtype=np.float64) - m0[:, None], res.m_clean, m0, plan,
                            confidence_level=conf)
    C = len(res.ratio_of_means)
    out = {"method": [method] * C, "k": np.asarray(res.k, dtype=np.int64),
           "edge_fraction": np.asarray(res.fraction, dtype=np.float64),
           "f_ratio": np.asarray(res.ratio_of_means, dtype=np.float64),
           "f_mean": np.asarray(res.mean_per_example, dtype=np.float64),
           "f_ci_low": np.asarray(fie.low, dtype=np.float64), "f_ci_high": np.asarray(fie.high, dtype=np.float64),
           "f_se": np.asarray(fixed.standard_error, dtype=np.float64),
           "f_ci_method": ["fieller"] * C, "f_ci_estimand": [FIELLER_ESTIMAND] * C, "f_ci_note": fie.notes(),
           "cpr": np.full(C, np.nan if res.cpr is None else float(res.cpr)),
           "cmd": np.full(C, np.nan if res.cmd is None else float(res.cmd)),
           "area_note": [AREA_NEEDS_TWO_K if res.cpr is None else ""] * C,
           "n_undefined": np.full(C, res.n_undefined, dtype=np.int64), "tie_rule": ties["tie_rule"],
           "cutoff_ties": np.asarray(ties["cutoff_ties"], dtype=np.int64),
           "cutoff_ties_excluded": np.asarray(ties["cutoff_ties_excluded"], dtype=np.int64)}
    return out, res


DISCONNECTED = ("the top-{k} edges form no path from input to logits, so the circuit computes exactly what the empty "
                "circuit computes: f = 0 by construction (up to float rounding), in every resample")


def circuit_notes(model: Any, res: Any, out: dict, level: str) -> dict:
    """Return whether each fixed circuit connects input to logits, and the note that explains f = 0 when it does not
    (a circuit whose edges reach the logits from no input carries only the counterfactual's values)."""
    from circuitstat.circuits.circuit.graph_ops import prune_edges

    C = len(out["k"])
    if level != "edge" or res.circuits is None:  # node circuits: no edge path to check
        return {"connected": np.ones(C, dtype=bool), "circuit_note": [""] * C}
    connected = np.array([bool(prune_edges(model.graph, np.asarray(c.edges, bool))[0].any()) for c in res.circuits])
    notes = []
    for i, (k, ok) in enumerate(zip(out["k"], connected)):
        note = "" if ok else DISCONNECTED.format(k=int(k))
        lo, hi = out["f_selected_ci_low"][i], out["f_selected_ci_high"][i]
        if not ok and abs(lo) < 1e-6 and abs(hi) < 1e-6:
            note += "; so did the circuit selected in every cross-fitting fold (f_selected = 0 too)"
        notes.append(note)
    return {"connected": connected, "circuit_note": notes}


def _selected_columns(model, task, S: np.ndarray, ks: list[int], spec: AuditSpec, res, seed, C: int,
                      strata: np.ndarray | None = None) -> dict:
    """The selection-aware faithfulness columns (circuitstat.stats.faithfulness, repeated cross-fitting), or NaN with why."""
    from circuitstat.stats.faithfulness import ESTIMAND_SELECTED, selection_aware_faithfulness

    N = S.shape[0]
    nan = {"f_selected": np.full(C, np.nan), "f_selected_se": np.full(C, np.nan),
           "f_selected_ci_low": np.full(C, np.nan), "f_selected_ci_high": np.full(C, np.nan),
           "f_selected_method": ["corrected-t"] * C, "f_selected_estimand": [ESTIMAND_SELECTED] * C,
           "fold_circuit_jaccard": np.full(C, np.nan)}
    if getattr(spec, "level", "edge") != "edge":
        return {**nan, "f_selected_note": ["node-level circuits are not cross-fitted"] * C}
    groups = None if task.group is None else task.group.numpy()
    n_folds, why = crossfit_folds(spec, N, groups)
    if why:
        return {**nan, "f_selected_note": [why] * C}

    evaluate = circuit_evaluator(model, task, spec)

    # the full circuit (k = all edges) involves no selection: its columns stay NaN with the reason
    use = np.asarray([1 <= k < S.shape[1] for k in ks])
    if not use.any():
        return {**nan, "f_selected_note": ["k covers every edge: no selection to account for"] * C}
    known = (np.stack([c.edges for c in res.circuits]), res.m_circuit, res.m_clean, res.m_empty)
    from circuitstat.core.errors import InputError

    try:
        sel = selection_aware_faithfulness(S, evaluate, [k for k, u in zip(ks, use) if u], ranking=spec.ranking,
                                           n_folds=n_folds, n_repeats=2, seed=seed,
                                           confidence_level=spec.bootstrap.confidence_level, known=known,
                                           groups=groups, strata=strata)
    except InputError as e:
        if strata is None:  # plain methods: checked before the run (crossfit_folds)
            raise
        # a verified method's folds of whole groups can leave a training set without verified prompts
        return {**nan, "f_selected_note": [f"not cross-fitted: {e}"] * C}
    folds = f"{n_folds}-fold cross-fitting{' of whole groups' if groups is not None else ''}, 2 repeats"
    if strata is not None:
        folds += ("; stratified by verified prompts, each fold's circuit the top-k of the PPI++ estimates on the "
                  "other folds (λ held at its full-sample value)")
    out = {**nan, "f_selected_method": [sel.method] * C,
           "f_selected_note": [folds if u else "k covers every edge: no "
                               "selection to account for" for u in use]}
    for col, values in (("f_selected", sel.estimate), ("f_selected_se", sel.standard_error),
                        ("f_selected_ci_low", sel.confidence_interval.low),
                        ("f_selected_ci_high", sel.confidence_interval.high),
                        ("fold_circuit_jaccard", sel.extra.get("fold_circuit_jaccard", np.full(use.sum(), np.nan)))):
        out[col] = out[col].copy()
        out[col][use] = np.asarray(values, np.float64)
    return out


def circuit_evaluator(model, task, spec):
    """``evaluate(masks [C, E], rows) -> (m_circuit, m_clean, m_empty)`` of circuitstat.stats.faithfulness: the
    circuits' metric on the given prompts under the spec's ablation (built once: a mean ablation averages once)."""
    import warnings

    from circuitstat.circuits.faithfulness import faithfulness

    abl = ablation_of(model, task, spec)

    def evaluate(masks: np.ndarray, rows: np.ndarray):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the curve already warned about undefined examples
            r = faithfulness(model, task, masks, ablation=abl, rows=rows, seed=spec.seed,
                             batch_size=spec.batch_size, progress=False)
        return r.m_circuit, r.m_clean, r.m_empty
    return evaluate


def crossfit_folds(spec, n: int, groups) -> tuple[int, str]:
    """(folds, "") of the selection-aware faithfulness interval, or (0, why it cannot be cross-fitted).

    The spec's ``faithfulness_folds`` when it sets them (InputError naming the key when the examples or
    groups cannot fill them), else the most folds up to 5 that they fill with MIN_PER_FOLD examples each."""
    from circuitstat.core.errors import InputError
    from circuitstat.stats.folds import DEFAULT_FOLDS, MIN_PER_FOLD, fillable_folds

    asked = getattr(spec, "faithfulness_folds", None)
    fits = fillable_folds(n, groups, DEFAULT_FOLDS if asked is None else asked)
    unit = (f"{n} examples in {len(np.unique(groups))} groups (a group stays in one fold)" if groups is not None
            else f"{n} examples")
    if asked is not None and fits < asked:
        fix = f"set faithfulness_folds to {fits} or fewer" if fits >= 2 else "add examples or groups"
        raise InputError(f"faithfulness_folds: {unit} cannot fill {asked} folds of at least {MIN_PER_FOLD} "
                         f"examples; {fix}, or remove the key to choose the folds automatically")
    if fits < 2:
        return 0, (f"cross-fitting needs 2 folds of at least {MIN_PER_FOLD} examples and {unit} fill "
                   f"{fits}: add examples or groups")
    return (fits if asked is None else asked), ""


def approximation_tables(exact: np.ndarray, approx: np.ndarray, names: list[str], method: str, k: int,
                         ranking: str, plan=None, confidence_level: float = 0.95) -> tuple[dict, dict]:
    """(approximation, approximation_summary) columns of ``method`` against exact (circuitstat.stats.approximation), the
    summary's Spearman and R² with their bootstrap intervals over ``plan`` (NaN, with why, without a plan)."""
    from circuitstat.stats.approximation import R2_ESTIMAND, SPEARMAN_ESTIMAND, agreement_intervals, approximation_agreement

    res = approximation_agreement(exact, approx, k, ranking=ranking, seed=0, edge_names=names)
    per, summ = res.to_table("approximation_edges").to_pydict(), res.to_table("approximation_agreement").to_pydict()
    if plan is not None:
        ci = agreement_intervals(exact, approx, plan, confidence_level)
    else:
        ci = {"spearman_ci_low": np.nan, "spearman_ci_high": np.nan, "r2_ci_low": np.nan, "r2_ci_high": np.nan,
              "ci_method": "none: this analysis resamples no prompts", "spearman_estimand": SPEARMAN_ESTIMAND,
              "r2_estimand": R2_ESTIMAND, "n_resamples": 0}
    return {"method": [method] * len(names), **per}, {"method": [method], **summ, **{c: [v] for c, v in ci.items()}}


def concat_parts(parts: list[dict]) -> dict:
    """Return the per-method parts of one table stacked column by column (lists of strings stay lists)."""
    out: dict = {}
    for p in parts:
        for key, v in p.items():
            out.setdefault(key, []).append(np.asarray(v) if not isinstance(v, list) else np.asarray(v, dtype=object))
    return {k: (np.concatenate(v).tolist() if v[0].dtype == object else np.concatenate(v)) for k, v in out.items()}


