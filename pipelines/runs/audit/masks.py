"""The audit's mask-learned methods (edge pruning, UGS): their fits, refits, stability and faithfulness columns.

A mask-learned method (circuitstat.circuits.edge_pruning, circuitstat.circuits.ugs; by name in
circuitstat.circuits.mask_methods) learns one mask logit log α per edge from all prompts at once: one vector per
fit, no per-example scores.  In an audit (docs/edge-pruning.md), per method, with its options section
(``edge_pruning`` or ``ugs``):

* the ``masks`` stage fits it once on every prompt (seed = the spec's seed, so the circuit equals
  ``fit_edge_pruning(model, task, seed=spec.seed, batch_size=spec.batch_size, **options)`` (``fit_ugs``) bit for
  bit) and refits it on each of ``<section>.n_refits`` resamples of the stability layer's plan (the spec's scheme; the
  resample's counts as example weights; child i of the spec's seed for refit i): tables ``edge_masks`` (per
  edge: the fit's log α and gate, the refits' inclusion frequency) and ``mask_fits`` (every fit's log α);
* the stability stage ranks each refit's log α (signed: a larger logit is a more open gate) and compares their
  top-k circuits (circuitstat.stats.stability.refit_stability): the Jaccard with its Monte Carlo interval, as
  the ground-truth study's ``stability:refit`` family; the data-level columns are NaN with the reason;
* the faithfulness stage evaluates the top-k circuit of the fit's log α with its fixed-circuit interval; the
  procedure-level interval of circuitstat.stats.faithfulness_refit (f_selected: one refit per cross-fitting fold,
  one repeat; the faithfulness of the selection procedure at N, averaged over refits); and the conditional interval
  of the reported circuit (f_conditional: one fit on a random half of the prompts, whose top-k circuit is the one
  reported in those columns, and its Fieller interval on the other half);
* the per-example stages (per-edge intervals, p- and q-values, approximation error, verification) do not
  apply: ``method_notes`` says so per table, and the claims and the report read the reason from it.
"""

from __future__ import annotations

import numpy as np

from circuitstat.pipelines.options import MASK_METHODS
from circuitstat.pipelines.spec import AuditSpec

__all__ = ["MASK_OUTPUTS", "mask_methods", "score_methods", "mask_tables", "read_refits", "mask_stability_tables",
           "mask_faithfulness_table", "conditional_mask_columns", "NOT_APPLICABLE", "mask_ranked_by", "pruning_audit_flops"]

#: the tables the masks stage writes
MASK_OUTPUTS = ("edge_masks", "mask_fits", "method_notes")
#: the tables a mask-learned method has no rows in, and why (written into method_notes)
NOT_APPLICABLE = {
    "scores": "no per-example score matrix: the method learns one mask logit per edge from all prompts at once "
              "(edge_masks and mask_fits hold them)",
    "edge_stats": "per-edge intervals, p- and q-values need per-example scores, which a mask-learned method does not "
                  "have; its per-edge output is the learned log alpha and the refits' inclusion frequency "
                  "(edge_masks); no interval is reported rather than one that covers nothing stated",
    "approximation": "approximation error compares per-example scores with exact patching's; a mask-learned "
                     "method has none",
    "verified": "verification checks an approximation's per-example scores against exact patching; a mask-learned "
                "method has none",
    "published_circuit": "a published circuit's edge support reads per-edge q-values (edge_stats), which a "
                         "mask-learned method does not have",
    "k_search": "the circuit choice's extra k (k_search) are not searched for a mask-learned method: each k's "
                "selection-aware interval would need its own refits; faithfulness_vs_k holds the grid's k only",
}


def mask_methods(spec: AuditSpec) -> list[str]:
    """The spec's mask-learned methods (edge-pruning, ugs), in its order."""
    return [m for m in spec.methods if m in MASK_METHODS]


def score_methods(spec: AuditSpec) -> list[str]:
    """The spec's methods with per-example scores, in its order."""
    return [m for m in spec.methods if m not in MASK_METHODS]


def mask_ranked_by(method: str) -> str:
    """The ranked_by words of a mask-learned method's circuits."""
    return f"{method} mask logit (log alpha, signed: a larger logit is a more open gate)"


def _fit_options(model, task, spec: AuditSpec, method: str) -> dict:
    """``method``'s fit keyword arguments for every fit of this audit (one counterfactual builder for all)."""
    from circuitstat.circuits.ablation import Ablation
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.spec import mask_spec

    options = mask_spec(spec, method).fit_options()
    if options.get("ablation") == "optimal":  # learned constants replace the run's ablation (Li & Janson 2024)
        if spec.input_node != "embeddings":
            raise InputError(f"{method} with ablation: optimal learns one constant for the whole input embedding; "
                             "use input_node: embeddings")
        return {"batch_size": spec.batch_size, **options}
    abl = Ablation(spec.ablation, model, task, seed=spec.seed, batch_size=spec.batch_size, input_node=spec.input_node)
    return {"batch_size": spec.batch_size, "ablation": abl, **options}


def mask_tables(model, task, spec: AuditSpec, names: list[str], plan) -> dict:
    """{edge_masks, mask_fits, method_notes} columns of every mask-learned method of ``spec``: a fit on all prompts
    (seed spec.seed) and one refit per resample of ``plan`` (a ResamplingPlan, or {method: plan}; child i of
    spec.seed for refit i; None: no refits, the refit columns NaN). ``spec``: an AuditSpec, or any object with its
    methods, ablation, input_node, seed, batch_size and options sections (the ``attribute`` command passes so)."""
    from circuitstat.circuits.mask_methods import fit_mask, mask_gates
    from circuitstat.pipelines.runs.audit.tables import concat_parts
    from circuitstat.pipelines.runs.groundtruth.masks import refit_mask

    masks, fits, notes = [], [], []
    N = int(task.clean.shape[0])
    for method in mask_methods(spec):
        opts = _fit_options(model, task, spec, method)
        fit = fit_mask(method, model, task, seed=spec.seed, **opts)
        E = fit.log_alpha.size
        mplan = plan.get(method) if isinstance(plan, dict) else plan
        V = np.zeros((0, E)) if mplan is None else refit_mask(model, task, mplan, seed=spec.seed,
                                                                      method=method, **opts)
        la = np.vstack([fit.log_alpha[None], V]).astype(np.float64)
        G = mask_gates(method, la)
        R = V.shape[0]
        order = np.argsort(-fit.log_alpha, kind="stable")
        rank = np.empty(E, dtype=np.int64)
        rank[order] = np.arange(1, E + 1)
        masks.append({"method": [method] * E, "edge": np.arange(E, dtype=np.int64), "name": list(names),
                      "log_alpha": la[0], "gate": G[0], "in_mask": G[0] > 0.5, "rank": rank,
                      "refit_frequency": (G[1:] > 0.5).mean(0) if R else np.full(E, np.nan),
                      "refit_log_alpha_mean": la[1:].mean(0) if R else np.full(E, np.nan),
                      "refit_log_alpha_sd": la[1:].std(0, ddof=1) if R > 1 else np.full(E, np.nan),
                      "n_refits": np.full(E, R, dtype=np.int64), "n_prompts": np.full(E, N, dtype=np.int64),
                      "final_loss": np.full(E, float(fit.loss[-1])), "label": [fit.params["label"]] * E,
                      "target_sparsity": np.full(E, np.nan if fit.params.get("target") is None
                                                 else float(fit.params["target"])),
                      "reached_sparsity": np.full(E, float((G[0] <= 0.5).mean())), **node_columns(fit.params, E)})
        fits.append({"method": [method] * (E * (R + 1)), "fit": np.repeat(np.arange(R + 1, dtype=np.int64), E),
                     "edge": np.tile(np.arange(E, dtype=np.int64), R + 1), "log_alpha": la.ravel(),
                     "gate": G.ravel()})
        notes.append({"method": [method] * len(NOT_APPLICABLE), "table": list(NOT_APPLICABLE),
                      "reason": list(NOT_APPLICABLE.values())})
    return {"edge_masks": concat_parts(masks), "mask_fits": concat_parts(fits), "method_notes": concat_parts(notes)}


def node_columns(params: dict, E: int) -> dict:
    """edge_masks' node-gate columns for one fit (E rows): its node target and the share of node gates its own
    mask closes; NaN for a fit without node masks (UGS, or edge pruning without them)."""
    target = params.get("node_target")
    reached = params.get("reached_node_sparsity")
    return {"node_target_sparsity": np.full(E, np.nan if target is None else float(target)),
            "reached_node_sparsity": np.full(E, np.nan if reached is None else float(reached))}


def read_refits(table, method: str) -> tuple[np.ndarray, np.ndarray]:
    """(the fit's log α [E], the refits' [R, E]) of ``method`` from a mask_fits table."""
    d = table.to_pydict()
    sel = np.asarray(d["method"]) == method
    fit, edge, la = (np.asarray(d[c])[sel] for c in ("fit", "edge", "log_alpha"))
    E, F = int(edge.max()) + 1, int(fit.max()) + 1
    out = np.full((F, E), np.nan)
    out[fit, edge] = la
    return out[0], out[1:]


def mask_stability_tables(V: np.ndarray, names: list[str], method: str, plan, ks: list[int]) -> tuple[dict, dict]:
    """(stability_vs_k, inclusion) columns of a mask-learned method from its refits ``V`` [R, E] on ``plan``."""
    from circuitstat.pipelines.runs.audit.tables import stability_columns
    from circuitstat.stats.stability import refit_stability

    res = refit_stability(V, plan, ks, ranking="signed", edge_names=names)
    return stability_columns(res, names, method, mask_ranked_by(method))


def mask_faithfulness_table(model, task, log_alpha: np.ndarray, method: str, ks: list[int], plan, spec: AuditSpec,
                            seed) -> dict:
    """faithfulness_vs_k columns of a mask-learned method: its fit's top-k circuits (fixed-circuit interval) and the
    selection-aware interval of the circuit a refit selects (circuitstat.stats.faithfulness_refit; one refit per
    cross-fitting fold, one repeat, a fresh seed per refit)."""
    from circuitstat.pipelines.runs.audit.tables import circuit_notes, circuit_evaluator, crossfit_folds, fixed_faithfulness_columns
    from circuitstat.pipelines.runs.groundtruth.masks import fold_refit
    from circuitstat.stats.faithfulness import ESTIMAND_SELECTED
    from circuitstat.stats.faithfulness_refit import refit_selection_faithfulness

    out, res = fixed_faithfulness_columns(model, task, log_alpha, "signed", method, ks, plan, spec, seed)
    C, N = len(out["k"]), int(task.clean.shape[0])
    groups = None if task.group is None else task.group.numpy()
    n_folds, why = crossfit_folds(spec, N, groups)
    sel = {"f_selected": np.full(C, np.nan), "f_selected_se": np.full(C, np.nan),
           "f_selected_ci_low": np.full(C, np.nan), "f_selected_ci_high": np.full(C, np.nan),
           "f_selected_method": ["corrected-t"] * C, "f_selected_estimand": [ESTIMAND_SELECTED] * C,
           "fold_circuit_jaccard": np.full(C, np.nan), "f_selected_note": [why] * C}
    if not why:
        n_repeats = 1 if n_folds >= 3 else 2  # the corrected t needs 3 splits at least; refits are costly
        refit = fold_refit(model, task, np.arange(N), method, **_fit_options(model, task, spec, method))
        r = refit_selection_faithfulness(refit, log_alpha, circuit_evaluator(model, task, spec), ks, n_obs=N,
                                         ranking="signed", n_folds=n_folds, n_repeats=n_repeats, seed=seed,
                                         confidence_level=spec.bootstrap.confidence_level, groups=groups)
        sel.update(f_selected=np.asarray(r.estimate, np.float64), f_selected_se=np.asarray(r.standard_error, np.float64),
                   f_selected_ci_low=np.asarray(r.confidence_interval.low, np.float64),
                   f_selected_ci_high=np.asarray(r.confidence_interval.high, np.float64),
                   f_selected_method=[r.method] * C,
                   fold_circuit_jaccard=np.asarray(r.extra["fold_circuit_jaccard"], np.float64),
                   f_selected_note=[f"{n_folds}-fold cross-fitting{' of whole groups' if groups is not None else ''}, "
                                    f"{n_repeats} repeat(s), {method} refitted on the other folds' prompts (a fresh seed per "
                                    "refit; circuitstat.stats.faithfulness_refit)"] * C)
    out.update(sel)
    out.update(conditional_mask_columns(model, task, method, ks, spec, seed, [c.edges for c in res.circuits]))
    out.update(circuit_notes(model, res, out, spec.level))
    out["k_source"] = ["grid"] * C
    out["ranked_by"] = [mask_ranked_by(method)] * C
    return out


def conditional_mask_columns(model, task, method: str, ks: list[int], spec: AuditSpec, seed,
                             full_circuits: list) -> dict:
    """The f_conditional columns: ``method`` fitted once on a random half of the prompts (whole groups), its top-k
    circuits (the reported circuits of these columns) and their Fieller interval on the other half
    (circuitstat.stats.faithfulness_refit.conditional_faithfulness); NaN with why when the prompts cannot be halved."""
    from circuitstat.core.seeds import as_seed_sequence, spawn_seeds
    from circuitstat.pipelines.runs.audit.tables import circuit_evaluator, conditional_columns
    from circuitstat.pipelines.runs.groundtruth.masks import fold_refit
    from circuitstat.stats.faithfulness_refit import conditional_faithfulness
    from circuitstat.stats.folds import MIN_PER_FOLD, fillable_folds

    C, N = len(ks), int(task.clean.shape[0])
    groups = None if task.group is None else task.group.numpy()
    if spec.level != "edge":
        return conditional_columns(C, "node-level circuits are not refitted on half the prompts")
    if fillable_folds(N, groups, 2) < 2 or (groups is not None and len(np.unique(groups)) < 4):
        unit = f"{N} prompts" + (f" in {len(np.unique(groups))} groups" if groups is not None else "")
        return conditional_columns(C, f"the conditional interval needs two halves of at least {MIN_PER_FOLD} "
                                      "prompts (two groups each, when prompts share templates) and "
                                      f"{unit} do not fill them: add prompts")
    refit = fold_refit(model, task, np.arange(N), method, **_fit_options(model, task, spec, method))
    r = conditional_faithfulness(refit, circuit_evaluator(model, task, spec), ks, n_obs=N, ranking="signed",
                                 seed=spawn_seeds(as_seed_sequence(seed), 5)[4],
                                 confidence_level=spec.bootstrap.confidence_level, groups=groups)
    full = np.asarray([np.asarray(c, bool) for c in full_circuits])
    inter, union = (r.masks & full).sum(1), (r.masks | full).sum(1)
    out = conditional_columns(C, "")
    out.update(f_conditional=np.asarray(r.estimate, np.float64), f_conditional_ci_low=np.asarray(r.interval.low, float),
               f_conditional_ci_high=np.asarray(r.interval.high, float),
               f_conditional_shape=[str(x) for x in r.interval.shape],
               conditional_circuit_jaccard=np.where(union > 0, inter / np.maximum(union, 1), 1.0),
               f_conditional_note=[r.note(i) + f" ({method} refitted once; that half-fit circuit is the reported one "
                                               "here, not the fit on every prompt)" for i in range(C)])
    return out


def pruning_audit_flops(spec: AuditSpec, cfg, positions: int) -> float:
    """FLOPs of an audit's mask-learning work on a model of config ``cfg`` (circuitstat.circuits.plan.pruning_cost;
    a UGS step priced as n_samples edge-pruning steps): per method 1 + n_refits fits on the task's prompts, plus
    with faithfulness one refit per cross-fitting fold on the other folds' prompts (``faithfulness_folds``, else at
    most 5), and the evaluation of its circuits (faithfulness_flops prices it as a method's)."""
    from circuitstat.circuits.plan import pruning_cost
    from circuitstat.pipelines.spec import mask_draws, mask_spec

    total, n = 0.0, spec.task.n
    folds = spec.faithfulness_folds or 5
    for method in mask_methods(spec):
        ep = mask_spec(spec, method)
        kw = {"positions": positions, "steps": ep.steps * mask_draws(method, ep), "batch_size": spec.batch_size}
        total += pruning_cost(cfg, n=n, fits=1 + ep.n_refits, **kw).flops
        if spec.faithfulness and spec.level == "edge":
            total += pruning_cost(cfg, n=max(1, n * (folds - 1) // folds), fits=folds, **kw).flops
            total += pruning_cost(cfg, n=max(1, n // 2), fits=1, **kw).flops  # the conditional interval's half fit
    return float(total)
