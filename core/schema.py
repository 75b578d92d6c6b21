"""The one schema of every run table: names, Arrow types and meanings of tables and their columns.

Writers (``RunDir.write_table``) validate a table against its schema before writing it, so a
misspelt or missing column is a bug caught where it is made, not a blank part of a report. Readers
(claims, the HTML report, the demo summary, the query command's documentation, test fixtures)
take table and column names from here; the claimable statistics of each claim kind are the
columns marked ``claimable``. Interval columns say what they cover in ``doc`` (docs/calibration.md: every
interval names its estimand).

Tables not registered here (a study's own tables) are written unvalidated; registering one is
adding a ``_table(...)`` below. The tables of the Result classes are registered in
core/schema_results.py and merged here; the building blocks are in core/schema_core.py.
"""

from __future__ import annotations

from typing import Any, Mapping

from circuitstat.core.schema_core import (B, DATA_JACCARD, DATA_PHI, HALF_JACCARD, EDGE_ESTIMAND, F, FIXED_F, MC_JACCARD,
                                          MEDIAN_ESTIMAND, POP_JACCARD, REFIT, SELECTED_F, CONDITIONAL_F, TRIMMED_ESTIMAND,
                                          I, S, Column, SchemaError, TableSchema, _ci, _table)
from circuitstat.core.schema_results import RESULT_TABLES

# the agreement intervals' estimands, as circuitstat.stats.approximation states them (reports imports nothing from stats)
AGREE_SPEARMAN = ("expected Spearman of the per-edge mean scores of N prompts from the task's distribution")
AGREE_R2 = "pooled per-example R^2 over the task's prompt distribution"
PUBLISHED_F = ("faithfulness of this fixed published circuit on the task's prompt distribution (not selected from "
               "these prompts: no selection to account for)")
PUBLISHED_CPR = ("the area under the faithfulness curve of the file's fixed score ranking, at MIB's percentages, "
                 "over the task's prompt distribution")

__all__ = ["Column", "TableSchema", "SchemaError", "TABLES", "RENAMED_COLUMNS", "schema_for", "claimable", "columns",
           "fill", "renamed", "stored_names", "tail_flag"]

_METHOD = ("method", S, "discovery method: attribution (exact, eap, eap-ig-inputs, eap-ig-activations, clean-corrupted, "
           "atp-qkfix, atp-graddrop, atpstar, ensemble) or mask-learned (edge-pruning, ugs)")
_K = ("k", I, "circuit size: number of edges (or nodes) kept")
_RANKED_BY = ("ranked_by", S, "what the circuits are the top-k of: the method's mean score, or for a verified method "
              "(<approx>+verified) the PPI++ estimates, e.g. 'mean exact effect, verified on 16 of 512 prompts'",
              False, True)

# robust estimands beside the mean (circuitstat.stats.robust; docs/calibration.md "Robust estimands"): optional, so
# runs from before them still read; NaN with robust_note where they do not apply
_ROBUST_EDGE_COLUMNS = (
    ("median", F, "median per-example effect (the effect on a typical prompt; a few prompts cannot move it)", True, True),
    *((c[0], c[1], c[2], True, True) for c in _ci("median_ci", "the edge's median effect", MEDIAN_ESTIMAND)),
    ("median_p", F, "two-sided sign-test p-value of a zero median; <= 1 - level exactly when median_ci excludes 0",
     False, True),
    ("median_q", F, "Benjamini-Hochberg q-value of median_p over edges", True, True),
    ("trimmed_mean", F, "20%-trimmed mean per-example effect (mean of the middle 60% of prompts)", True, True),
    *((c[0], c[1], c[2], True, True) for c in _ci("trimmed_mean_ci", "the edge's trimmed mean effect",
                                                   TRIMMED_ESTIMAND)),
    ("trimmed_mean_p", F, "two-sided p-value of Yuen's trimmed t test; < 1 - level exactly when trimmed_mean_ci "
                          "excludes 0", False, True),
    ("trimmed_mean_q", F, "Benjamini-Hochberg q-value of trimmed_mean_p over edges", True, True),
    ("robust_note", S, "why the robust columns are NaN ('' when computed): their intervals assume independent "
                       "prompts, so a cluster bootstrap's run leaves them out", False, True),
)

TABLES: dict[str, TableSchema] = {t.name: t for t in (
    _table("edges", "the edge index of the graph: one row per edge, in score-column order",
           ("index", I, "position of the edge in every score vector"), ("name", S, "EAP-IG style edge name"),
           ("sender", S, "sending node"), ("receiver", S, "receiving node (with <q>/<k>/<v> input)"),
           ("sender_layer", I, "layer of the sender (-1 for the input)"),
           ("receiver_layer", I, "layer of the receiver (n_layers for the logits)"),
           ("kind", S, "receiver input kind: q, k, v, mlp or logits")),
    _table("edge_stats", "per-edge mean effect with its interval, p- and q-value, one row per method and edge",
           _METHOD, ("edge", I, "edge index"), ("name", S, "edge name"),
           ("estimate", F, "mean per-example effect"),
           ("se", F, "standard error of the mean: the bootstrap SE, or under the cluster scheme's wild_cluster_t / "
                     "cr2_t the CR2 cluster-robust SE the interval uses"),
           *_ci("ci", "the edge's mean effect", EDGE_ESTIMAND),
           ("p", F, "two-sided p-value of zero effect, inverting the reported interval"),
           ("q", F, "Benjamini-Hochberg q-value over edges", True), ("n", I, "number of prompts"),
           ("ci_method", S, "interval method"), ("estimand", S, "what the interval covers"),
           ("tail_share", F, "share of sum |x - median| carried by the ceil(sqrt N) most extreme prompts"),
           ("no_tail_seen", B, "true when tail_share <= 0.6: no few prompts carry the estimate in this sample. It "
                               "does NOT mean the interval covers: a prompt rarer than 1/N carrying the mean is "
                               "invisible to any sample (docs/calibration.md). Older runs call it "
                               "interval_reliable; it is read as no_tail_seen (RENAMED_COLUMNS)"),
           ("n_clusters", I, "independent units resampled: the templates (groups) a cluster bootstrap resamples "
                             "whole; n when prompts are resampled one by one"),
           ("ci_method_note", S, "why this interval method (the spec's choice, or the default and why)"),
           ("p_floor", F, "smallest p-value the method can give: 1/(B+1) for a resampling p-value, 0 for an "
                          "analytic one; a p at the floor means the data's p-value is at most this"),
           *_ROBUST_EDGE_COLUMNS),
    _table("stability_vs_k", "circuit stability under resampling, one row per method and k",
           _METHOD, _K,
           ("jaccard_mean", F, "mean pairwise Jaccard of resample circuits (Meloux et al.)", True),
           ("jaccard_sd", F, "SD of the pairwise Jaccards"),
           *_ci("jaccard_ci", "jaccard_mean", MC_JACCARD, claimable=False),
           ("jaccard_chance", F, "expected Jaccard of two random k-subsets"),
           ("jaccard_corrected", F, "(jaccard_mean - chance) / (1 - chance)", True),
           ("phi", F, "mean pairwise Phi of inclusion indicators", True),
           *_ci("phi_ci", "phi", MC_JACCARD, claimable=False),
           ("consensus_size", I, "edges in at least the consensus threshold of resample circuits"),
           ("consensus_jaccard_mean", F, "mean Jaccard of resample circuits to the consensus circuit", True),
           ("rbo_mean", F, "mean rank-biased overlap of resample rankings"),
           ("jaccard_half", F, f"estimate of {HALF_JACCARD}: the primary data-level stability (mean Jaccard of "
                               "the top-k circuits of disjoint halves over random splits)", True),
           ("jaccard_half_se", F, "standard error of jaccard_half (grouped jackknife over examples or templates, "
                                  "plus its Monte Carlo error)"),
           *_ci("jaccard_half_ci", "jaccard_half", HALF_JACCARD),
           ("jaccard_half_mc_se", F, "Monte Carlo error of jaccard_half over its random splits (part of its se; "
                                     "NOT an interval for the data)"),
           ("jaccard_half_floor", F, "sampling-aware lower bound on J_{N/2} from the score gaps at the cut-off "
                                     "(circuitstat.stats.flip_bound); it lowers jaccard_half_ci_low only where fewer "
                                     "than 10 splits' Jaccards differ from their most frequent value, and is NaN (not computed) elsewhere"),
           ("jaccard_half_units", F, "units (examples, or templates under the cluster scheme) in each half"),
           ("jaccard_data", F, f"estimate of {DATA_JACCARD}: J_N (extrapolated, bracketed double bootstrap; "
                               "J_{N/2} is jaccard_half)", True),
           ("jaccard_data_se", F, "standard error of jaccard_data"),
           *_ci("jaccard_data_ci", "jaccard_data", DATA_JACCARD),
           ("jaccard_pop", F, f"estimate of {POP_JACCARD}", True),
           *_ci("jaccard_pop_ci", "jaccard_pop", POP_JACCARD),
           ("phi_data", F, f"estimate of {DATA_PHI}", True),
           *_ci("phi_data_ci", "phi_data", DATA_PHI),
           ("cutoff_ties_mean", F, "mean number of edges tied at the top-k cut-off (ties broken at random)"),
           ("cutoff_ties_excluded_mean", F, "mean number of those tied edges left out of the circuit"),
           ("tie_rule", S, "how ties at the top-k cut-off were broken (circuitstat.core.topk)"),
           ("spearman_mean", F, "mean Spearman correlation of full resample score vectors (k-free)"),
           ("data_level_note", S, "why the data-level columns (jaccard_data*, jaccard_pop*, phi_data*) are NaN, "
                                  "if they are"),
           _RANKED_BY),
    _table("inclusion", "how often each edge enters the top-k circuit over resamples (edges never selected: no row)",
           _METHOD, _K, ("edge", I, "edge index"), ("name", S, "edge name"),
           ("frequency", F, "share of resamples whose top-k circuit contains the edge")),
    _table("edge_masks", "a mask-learned method's learned mask, one row per method and edge (it has no per-example "
           "scores: method_notes says which tables have no rows for it and why)",
           _METHOD, ("edge", I, "edge index"), ("name", S, "edge name"),
           ("log_alpha", F, "learned mask logit of the fit on every prompt (the ranking score; larger is more open)"),
           ("gate", F, "its deterministic hard-concrete gate in [0, 1] (1: the edge carries the clean flow)"),
           ("in_mask", B, "gate > 1/2: the edge is in the fit's own circuit (whose size the sparsity sets)"),
           ("rank", I, "rank of log_alpha, 1 = largest (the order of the top-k circuits)"),
           ("refit_frequency", F, "share of the refits (bootstrap resamples of the prompts, a fresh seed each) whose "
                                  "mask keeps the edge (gate > 1/2)", True),
           ("refit_log_alpha_mean", F, "mean of log_alpha over the refits"),
           ("refit_log_alpha_sd", F, "SD of log_alpha over the refits (Monte Carlo spread over resamples and seeds, "
                                     "not an interval of an estimand)"),
           ("n_refits", I, "refits behind refit_frequency"), ("n_prompts", I, "prompts the fit used"),
           ("final_loss", F, "the fit's loss at its last step (faithfulness term + sparsity x expected share kept)"),
           ("label", S, "what ran: e.g. 'UGS (optimal ablation)', 'UGS optimiser, counterfactual ablation', 'edge "
                        "pruning, counterfactual ablation, target sparsity 0.9 (Lagrangian)'"),
           ("target_sparsity", F, "edge pruning's target share of edges removed (NaN: no target)"),
           ("reached_sparsity", F, "share of edges the fit's own mask removes (gate <= 1/2), to set against the "
                                   "target")),
    _table("mask_fits", "every fit of a mask-learned method: one row per method, fit and edge",
           _METHOD, ("fit", I, "0: the fit on every prompt; i >= 1: the refit on resample i of the stability plan "
                               "(seed: child i - 1 of the run's seed)"),
           ("edge", I, "edge index"), ("log_alpha", F, "learned mask logit"),
           ("gate", F, "deterministic hard-concrete gate")),
    _table("method_notes", "tables in which a method has no rows by design, and why (e.g. per-edge intervals of a "
                           "mask-learned method, which has no per-example scores)",
           _METHOD, ("table", S, "the table (or analysis) the method is absent from"),
           ("reason", S, "why it does not apply to this method")),
    _table("published_circuit", "a published circuit (spec key circuit) audited on this model and task, one row per "
                                "method (circuitstat.pipelines.published)",
           _METHOD, ("circuit", S, "the circuit file's name"), ("format", S, "eap-ig (EAP-IG/MIB JSON) or edges"),
           ("n_edges", I, "edges in the circuit"), ("n_nodes", I, "nodes in the circuit"),
           ("f_ratio", F, "ratio-of-means faithfulness of the circuit on this run's prompts", True),
           ("f_mean", F, "mean per-example faithfulness"),
           *_ci("f_ci", "f_ratio", PUBLISHED_F), ("f_se", F, "bootstrap standard error of f_ratio"),
           ("f_ci_method", S, "interval method (fieller: Fieller's set of a ratio of means; -inf/inf ends when the "
                              "denominator is not distinguishable from 0)"),
           ("f_ci_estimand", S, "what the interval covers"),
           ("f_ci_note", S, "empty when Fieller's set is a bounded interval; else that the full model's effect over "
                            "the empty circuit is not distinguishable from 0, and what the set is"),
           ("cpr", F, "CPR of the file's scores at MIB's percentages (NaN without scores)", True),
           *_ci("cpr_ci", "cpr", PUBLISHED_CPR),
           ("cmd", F, "CMD of the file's scores at MIB's percentages (NaN without scores)", True),
           *_ci("cmd_ci", "cmd", PUBLISHED_CPR), ("area_note", S, "how CPR/CMD were computed, or why they are NaN"),
           ("q_level", F, "an edge is supported when its BH q-value is at most this (spec circuit.q)"),
           ("n_unsupported", I, "circuit edges whose effect is not supported at q_level", True),
           ("share_unsupported", F, "n_unsupported / n_edges", True),
           ("inclusion_mean", F, "mean over the circuit's edges of their inclusion frequency in the audit's "
                                 "top-k circuits of the same size over resamples", True),
           ("inclusion_min", F, "least inclusion frequency of a circuit edge", True),
           ("topk_jaccard", F, "Jaccard between the circuit and this run's top-k circuit of the same size", True),
           ("topk_f_ratio", F, "faithfulness of this run's top-k circuit of the same size (faithfulness_vs_k)"),
           ("topk_f_selected", F, "its selection-aware faithfulness (faithfulness_vs_k)"),
           ("n_undefined", I, "prompts with m(clean) = m(empty): per-example f undefined")),
    _table("published_circuit_edges", "each edge of a published circuit: effect, q-value, support and inclusion",
           _METHOD, ("edge", I, "edge index"), ("name", S, "edge name"),
           ("estimate", F, "mean per-example effect"), *_ci("ci", "the edge's mean effect", EDGE_ESTIMAND),
           ("q", F, "Benjamini-Hochberg q-value over all edges (edge_stats)", True),
           ("supported", B, "q <= q_level"),
           ("inclusion", F, "share of resamples whose top-k circuit (k = the circuit's size) contains the edge", True)),
    _table("faithfulness_vs_k", "faithfulness of the top-k circuit of the mean scores, one row per method and k",
           _METHOD, _K, ("edge_fraction", F, "k / number of edges"),
           ("f_ratio", F, "ratio of means (m_circuit - m_empty) / (m_clean - m_empty)", True),
           ("f_mean", F, "mean per-example faithfulness", True),
           ("f_ci_low", F, f"lower end of the interval of f_ratio (covers: {FIXED_F})", True),
           ("f_ci_high", F, f"upper end of the interval of f_ratio (covers: {FIXED_F})", True),
           ("f_se", F, "bootstrap standard error of f_ratio"),
           ("f_ci_method", S, "interval method of f_ci (fieller: Fieller's set of a ratio of means; -inf/inf ends "
                              "when the denominator is not distinguishable from 0)"),
           ("f_ci_estimand", S, "what f_ci covers"),
           ("f_ci_note", S, "empty when Fieller's set is a bounded interval; else that the full model's effect over "
                            "the empty circuit is not distinguishable from 0, and what the set is"),
           ("cpr", F, "circuit performance ratio: area under the faithfulness curve", True),
           ("cmd", F, "circuit-model distance: area between the curve and 1", True),
           ("area_note", S, "why cpr/cmd are NaN, if they are"),
           ("n_undefined", I, "examples whose per-example faithfulness is undefined (clean = empty)"),
           ("f_selected", F, "cross-fitted faithfulness of circuits selected on other folds", True),
           ("f_selected_se", F, "standard error of f_selected (corrected for fold overlap)"),
           *_ci("f_selected_ci", "f_selected", SELECTED_F),
           ("f_selected_method", S, "interval method of f_selected"),
           ("f_selected_estimand", S, "what f_selected_ci covers"),
           ("fold_circuit_jaccard", F, "mean Jaccard between the circuits selected on different folds"),
           ("f_selected_note", S, "how f_selected was computed, or why it is NaN"),
           ("f_conditional", F, "a mask-learned method's reported circuit: the top-k of one fit on half the prompts, "
            "its ratio-of-means faithfulness on the other half", True),
           *_ci("f_conditional_ci", "f_conditional", CONDITIONAL_F),
           ("f_conditional_shape", S, "the Fieller set of f_conditional: bounded, union or unbounded (hull stored)"),
           ("f_conditional_estimand", S, "what f_conditional_ci covers"),
           ("conditional_circuit_jaccard", F, "Jaccard between the half-fit circuit (f_conditional's) and the fit on "
            "every prompt (f_ratio's)"),
           ("f_conditional_note", S, "how f_conditional was computed, or why it is NaN"),
           ("tie_rule", S, "how ties at the top-k cut-off were broken (circuitstat.core.topk), the rule of every circuit here"),
           ("cutoff_ties", I, "edges (nodes) whose mean score ties the k-th one of the fixed circuit"),
           ("cutoff_ties_excluded", I, "of those, left out of the fixed circuit by the tie rule"),
           ("connected", B, "the fixed circuit has a path from input to logits (false: it computes what the empty "
            "circuit computes, so f = 0 up to rounding)"),
           ("circuit_note", S, "why f is what it is, when the circuit explains it (no input -> logits path)"),
           ("k_source", S, "grid: a k of the spec's grid; search: an extra k the circuit choice evaluated "
            "(fixed-sequence test down every k from the grid's largest, spec key k_search)"),
           _RANKED_BY),
    _table("approximation", "per-edge error of an approximate method against exact patching",
           _METHOD, ("edge", I, "edge index"), ("name", S, "edge name"),
           ("exact_mean", F, "mean exact effect"), ("approx_mean", F, "mean approximate score"),
           ("bias", F, "mean of approx - exact"), ("error_sd", F, "SD over prompts of approx - exact"),
           ("slope", F, "per-example regression slope of approx on exact"),
           ("intercept", F, "per-example regression intercept"), ("r2", F, "per-example R^2")),
    _table("approximation_summary", "agreement of an approximate method with exact, one row per method",
           _METHOD, ("spearman", F, "Spearman of mean scores against exact", True),
           ("kendall", F, "Kendall tau of mean scores against exact", True),
           ("slope", F, "pooled per-example regression slope", True), ("r2", F, "pooled per-example R^2", True),
           ("bias_mean", F, "mean error over prompts and edges", True),
           ("top_k_overlap", F, "share of exact's top-k circuit in the method's top-k", True),
           ("k", I, "k of top_k_overlap"), ("tie_rule", S, "how ties at the top-k cut-off were broken (circuitstat.core.topk)"),
           ("cutoff_ties", I, "edges whose exact mean ties exact's k-th one"),
           ("cutoff_ties_approx", I, "edges whose mean by this method ties its k-th one"),
           *_ci("spearman_ci", "spearman", AGREE_SPEARMAN), *_ci("r2_ci", "r2", AGREE_R2),
           ("ci_method", S, "how the spearman and r2 intervals were computed"),
           ("spearman_estimand", S, "what spearman_ci covers"), ("r2_estimand", S, "what r2_ci covers"),
           ("n_resamples", I, "bootstrap resamples of the prompts behind the intervals (0: none)")),
    _table("heads", "cross-seed stability of each head (matched to the other refits), one row per head",
           ("layer", I, "layer"), ("head", I, "head"),
           ("stability", F, "mean best-match similarity to the other refits", True),
           *_ci("ci", "stability", "resampling of prompts and refits with one anchor refit"),
           ("null_mean", F, "stability under the shuffled-prompt null"),
           ("distinctness", F, "1 - max similarity to the other heads of the same layer", True),
           ("importance", F, "head importance (ablation effect on the loss)"),
           ("match", S, "matching rule"), ("pairs", S, "which refit pairs are compared"),
           ("excess", F, "stability - null_mean", True),
           *_ci("refit_ci", "stability", REFIT), *_ci("excess_ci", "excess", REFIT),
           ("n_refits", I, "number of refits the refit interval rests on")),
    _table("layers", "cross-seed stability of each layer (mean over its heads)",
           ("layer", I, "layer"), ("stability", F, "mean head stability of the layer (anchor refit)", True),
           *_ci("ci", "stability", "resampling of prompts and refits with one anchor refit"),
           ("null_mean", F, "stability under the shuffled-prompt null"),
           ("stability_all_anchors", F, "layer stability averaged over every refit as anchor", True),
           *_ci("refit_ci", "stability_all_anchors", REFIT), ("excess", F, "stability - null_mean", True),
           *_ci("excess_ci", "excess", REFIT), ("n_refits", I, "number of refits the interval rests on")),
    _table("residual", "cross-seed similarity of the residual stream (CKA) per layer and kind",
           ("layer", I, "layer"), ("hook", S, "residual hook"), ("kind", S, "linear or debiased CKA"),
           ("cka", F, "mean CKA to the anchor refit"),
           *_ci("ci", "cka", "resampling half-samples of prompts, without duplicated rows", claimable=False),
           ("cka_all_pairs", F, "mean CKA over all refit pairs"),
           *_ci("refit_ci", "cka_all_pairs", REFIT, claimable=False),
           ("n_refits", I, "number of refits"),
           ("interval_reliable", B, "false for linear and RBF CKA: their finite-sample bias makes both "
            "intervals miss the population CKA (simulated coverage 0.38-0.94); the debiased kind's cover")),
    _table("refits", "the refits a head-stability fit compared, one row per refit",
           ("refit", I, "index of the refit"), ("source", S, "where the model was loaded from"),
           ("weight_hash", S, "sha256 of the model's weights"),
           ("seed", I, "training seed recorded with the model (-1 if unknown)"), ("role", S, "anchor or refit")),
    _table("conditions", "head study: one row per training condition (depth x optimizer)",
           ("condition", S, "condition name"), ("n_layers", I, "layers of the condition's models"),
           ("optimizer", S, "adam or adamw"), ("weight_decay", F, "weight decay"),
           ("mean_stability", F, "mean head stability of the anchor refit", True),
           *_ci("mean_ci", "mean_stability", "resampling of prompts and the anchor's comparison refits (anchor fixed)"),
           ("null_mean", F, "mean stability under the shuffled-prompt null"),
           ("gap", F, "max - min layer stability", True), *_ci("gap_ci", "gap", "resampling of prompts and the anchor's comparison refits (anchor fixed)"),
           ("least_stable_layer", I, "layer with the lowest stability (anchor refit)"),
           ("residual_linear_post", F, "mean linear CKA of the residual stream after attention (biased kind)"),
           ("val_loss", F, "mean validation loss of the condition's models"),
           ("excess_mean", F, "mean head stability minus its null, every refit an anchor", True),
           *_ci("excess_ci", "excess_mean", REFIT), ("n_refits", I, "refits the excess interval rests on (0: none)")),
    _table("study_layers", "head study: layer stability per condition and layer",
           ("condition", S, "condition name"), ("n_layers", I, "layers of the condition's models"),
           ("optimizer", S, "adam or adamw"), ("layer", I, "layer"),
           ("stability", F, "mean head stability of the layer (anchor refit)", True),
           *_ci("ci", "stability", "resampling of prompts and the anchor's comparison refits (anchor fixed)"), ("null_mean", F, "stability under the shuffled-prompt null"),
           ("stability_all_anchors", F, "layer stability averaged over every refit as anchor", True),
           *_ci("refit_ci", "stability_all_anchors", REFIT), ("excess", F, "stability - null_mean", True),
           *_ci("excess_ci", "excess", REFIT), ("n_refits", I, "refits the refit intervals rest on")),
    _table("models", "head study: the trained models, one row per condition and seed",
           ("condition", S, "condition name"), ("n_layers", I, "layers"), ("optimizer", S, "adam or adamw"),
           ("weight_decay", F, "weight decay"), ("seed", I, "training seed"), ("path", S, "model directory"),
           ("weight_hash", S, "sha256 of the model's weights"), ("val_loss", F, "final validation loss"),
           ("train_seconds", F, "training wall time")),
    _table("replicates", "head study: per condition, bootstrap replicates and leave-one-refit-out values of each statistic",
           ("statistic", S, "statistic name (estimate:<name> and jackknife:<name> for the refit level)"),
           ("replicate", I, "replicate (or left-out refit) index"), ("value", F, "the statistic's value")),
    _table("head_details", "per-head intervals by source and cross-layer similarity",
           ("layer", I, "layer"), ("head", I, "head"),
           ("stability_ci_low_prompts", F, "lower end, prompts resampled only"),
           ("stability_ci_high_prompts", F, "upper end, prompts resampled only"),
           ("stability_ci_low_refits", F, "lower end, refits resampled only"),
           ("stability_ci_high_refits", F, "upper end, refits resampled only"),
           *_ci("distinctness_ci", "distinctness", "resampling of prompts and refits", claimable=False),
           *_ci("importance_ci", "importance", "resampling of prompts", claimable=False),
           ("cross_layer_similarity", F, "best match to a head of another layer"),
           *_ci("cross_layer_ci", "cross_layer_similarity", "resampling of prompts and refits", claimable=False),
           ("cross_layer_best_layer", I, "layer of the best cross-layer match"),
           ("cross_layer_same_layer_share", F, "share of refits whose best match is in the same layer")),
    _table("correlation", "correlation of head stability with importance, pooled and per layer",
           ("scope", S, "pooled or layer"), ("layer", I, "layer (-1 pooled)"), ("r", F, "correlation"),
           *_ci("ci", "r", "Fisher-z interval with the effective number of heads", claimable=False),
           ("pvalue", F, "permutation p-value"), ("n", I, "number of heads"),
           ("n_eff", I, "effective number of independent heads"), ("refits", I, "number of refits"),
           ("method", S, "correlation method")),
    _table("variance_components", "per-edge variance components of the variance study's crossed design",
           ("edge", I, "edge index"), ("name", S, "edge name"), ("source", S, "variance component (factor or interaction)"),
           ("variance", F, "ANOVA estimate of the component"), ("share", F, "component / sum of components"),
           ("se", F, "normal-theory standard error"),
           *_ci("ci", "variance", "the component under normal theory (labelled in 'interval'; heavy tails undercover)",
                claimable=False),
           ("negative_estimate", B, "the ANOVA estimate was negative (reported as is, not clipped)"),
           ("interval", S, "how the interval was computed")),
    _table("variance_anova", "ANOVA mean squares per edge and term",
           ("edge", I, "edge index"), ("term", S, "ANOVA term"), ("df", I, "degrees of freedom"),
           ("mean_square", F, "mean square")),
    _table("variance_shares", "variance shares pooled over the top edges, with intervals",
           ("source", S, "variance component"), ("variance", F, "pooled component per edge"),
           *_ci("variance_ci", "variance", "the pooled component in the population (see 'interval')", claimable=False),
           ("share", F, "pooled share of the component"),
           *_ci("ci", "share", "the component's share in the population of prompts (see 'estimand')", claimable=False),
           ("df", I, "degrees of freedom of the term"), ("effective_df", F, "Wishart effective df over edges"),
           ("n_edges", I, "edges pooled"),
           ("interval_reliable", B, "false when the interval rests on the few levels of a non-example factor"),
           ("interval", S, "bootstrap over prompts, or the generalized pivot where no prompts enter the term"),
           ("estimand", S, "what the interval covers"), ("n_resamples", I, "bootstrap resamples"),
           ("factors", S, "the crossed factors")),
    _table("variance_stability", "Jaccard of each factor level's top-k circuit to the reference circuit",
           ("factor", S, "source of variation"), ("level", S, "level of the factor"), _K,
           ("jaccard_mean", F, "estimate of the row's estimand"),
           *_ci("ci", "jaccard_mean", "the row's estimand (column 'estimand')", claimable=False),
           ("estimand", S, "what the interval covers"), ("interval", S, "how the interval was computed"),
           ("se", F, "standard error of the estimate"), ("bias", F, "double-bootstrap bias estimate"),
           ("split", F, "split-half estimate"), ("jaccard_full_data", F, "Jaccard of the full-data circuits"),
           ("spread_low", F, "2.5% point of per-resample Jaccards (resampling spread, not an interval)"),
           ("spread_high", F, "97.5% point of per-resample Jaccards (resampling spread, not an interval)"),
           ("cutoff_ties", I, "edges tied at the top-k cut-off (broken at random)"),
           ("chance", F, "expected Jaccard of two random k-subsets"), ("n_resamples", I, "bootstrap resamples"),
           ("spread_label", S, "what spread_low/high are"),
           ("tie_rule", S, "how ties at the top-k cut-off were broken (circuitstat.core.topk)")),
    _table("variance_summary", "per factor: Jaccard to the reference circuit at the summary k, its interval and verdict",
           ("factor", S, "source of variation"), ("level", S, "level, or the mean over levels"),
           ("jaccard_to_reference", F, "estimate"),
           *_ci("ci", "jaccard_to_reference", "the row's estimand (column 'estimand')", claimable=False),
           ("bar", F, "the stability bar of the spec"), ("meets_bar", B, "the estimate is at least the bar"),
           ("verdict", S, "met (interval above the bar), not met (below), inconclusive (across)"),
           _K, ("jaccard_full_data", F, "Jaccard of the full-data circuits"), ("n_levels", I, "levels averaged"),
           ("estimand", S, "what the interval covers"), ("interval", S, "how the interval was computed"),
           ("multiplicity", S, "the multiple-comparison rule of the verdicts")),
    _table("intrinsic", "per-edge variation of per-example scores",
           ("edge", I, "edge index"), ("name", S, "edge name"), ("mean", F, "mean score"), ("sd", F, "SD over prompts"),
           ("cv", F, "SD / |mean|"), ("sign_consistency", F, "share of prompts with the mean's sign"),
           ("snr", F, "|mean| / SD"), ("excess_kurtosis", F, "sample excess kurtosis"),
           ("top5_share", F, "share of squared deviations carried by the top 5% of prompts"),
           ("top5_share_gaussian_q99", F, "99th percentile of top5_share for Gaussian scores of this N"),
           ("heavy_tailed", B, "top5_share above its Gaussian 99th percentile"), ("n", I, "prompts"),
           ("rank", I, "rank of the edge by |mean|")),
    _table("selection", "smallest circuit reaching the faithfulness target, per method",
           _METHOD, ("target", F, "faithfulness target"), ("k_star", I, "smallest k with f_ratio >= target (-1: none)"),
           ("k_low", I, "smallest k whose upper f bound reaches the target"),
           ("k_high", I, "smallest k whose lower f bound reaches the target (-1: none does)"),
           ("f_at_k_star", F, "f_ratio at k_star"), ("reached", B, "whether any k reached the target")),
    _table("coverage", "calibration study: empirical coverage of each interval kind at each dataset size N",
           ("kind", S, "interval family/method, e.g. edge/studentized_symmetric, stability/jaccard_data"),
           ("estimand", S, "what the interval is checked against"), ("n", I, "dataset size N"),
           ("n_datasets", I, "datasets drawn from the population"), ("n_units", I, "edges or k values per dataset"),
           ("coverage", F, "share of (dataset, unit) intervals that contain the unit's true value"),
           ("coverage_mc_se", F, "Monte Carlo SE of coverage with the dataset as the unit (the units of one dataset "
                                 "are correlated): SD over datasets of each one's covered share / sqrt(n_datasets)"),
           ("worst_unit", S, "name of the unit (edge or k) with the lowest coverage"),
           ("worst_unit_coverage", F, "lowest coverage of one unit"),
           ("worst_unit_abs_mean_rank", F, "the worst unit's rank by |population mean| (1 = largest; NaN: not an edge)"),
           ("worst_unit_excess_kurtosis", F, "the worst unit's excess kurtosis over the population (NaN: not an edge)"),
           ("worst_unit_top_prompt_share", F, "share of the worst unit's total effect carried by its largest prompt"),
           ("n_units_below_floor", I, "units whose coverage is below coverage_floor"),
           ("worst_reliable_unit", S, "unit with the lowest coverage among the cells flagged reliable (over units "
                                      "with at least min_reliable_cells such cells; empty: none)"),
           ("worst_reliable_unit_coverage", F, "its coverage among its cells flagged reliable"),
           ("worst_reliable_unit_cells", I, "its number of cells (datasets) flagged reliable"),
           ("worst_reliable_unit_abs_mean_rank", F, "its rank by |population mean|"),
           ("worst_reliable_unit_excess_kurtosis", F, "its excess kurtosis over the population"),
           ("worst_reliable_unit_top_prompt_share", F, "share of its total effect carried by its largest prompt"),
           ("n_units_reliable_below_floor", I, "units whose coverage among cells flagged reliable is below "
                                               "coverage_floor (units with at least min_reliable_cells such cells)"),
           ("mean_width", F, "mean finite width"),
           ("median_width", F, "median width"), ("share_infinite", F, "share of infinite intervals"),
           ("null_rejection_rate", F, "share of null units whose interval excludes the null (NaN: the kind has no "
                                      "null units, as every kind of the calibration study)"),
           ("null_rejection_mc_se", F, "Monte Carlo SE of null_rejection_rate, the dataset as the unit"),
           ("coverage_reliable", F, "coverage among units the kind's flag passes (edge kinds: no_tail_seen true, which "
                                 "does not make them cover; NaN: the kind flags none)"),
           ("coverage_reliable_mc_se", F, "Monte Carlo SE of coverage_reliable (ratio estimator, the dataset as "
                                          "the unit)"),
           ("share_reliable", F, "share of units the kind's flag passes (edge kinds: no_tail_seen true; NaN: none)"),
           ("coverage_unreliable", F, "coverage among cells the kind's flag does not pass (NaN: the kind flags none)"),
           ("coverage_unreliable_mc_se", F, "Monte Carlo SE of coverage_unreliable (the dataset as the unit)"),
           ("coverage_floor", F, "the floor n_units_below_floor counts against"),
           ("confidence_level", F, "nominal level")),
    _table("coverage_per_unit", "calibration study: coverage of each unit (edge or k) per kind and N",
           ("kind", S, "interval kind"), ("n", I, "dataset size N"), ("unit", I, "unit index"),
           ("unit_label", S, "unit name (edge index or k=...)"), ("coverage", F, "coverage of this unit"),
           ("coverage_mc_se", F, "Monte Carlo SE of this unit's coverage (binomial over the independent datasets)"),
           ("coverage_reliable", F, "coverage of this unit among its cells (datasets) flagged reliable"),
           ("n_reliable_cells", I, "datasets in which this unit's interval is flagged reliable"),
           ("coverage_unreliable", F, "coverage of this unit among its cells flagged unreliable"),
           ("n_unreliable_cells", I, "datasets in which this unit's interval is flagged unreliable"),
           ("mean_width", F, "mean width for this unit"),
           ("truth", F, "the unit's true value (mean over datasets where it depends on the dataset)"),
           ("abs_mean_rank", F, "rank of the edge by |population mean| (1 = largest; NaN: not an edge)"),
           ("excess_kurtosis", F, "the edge's excess kurtosis over the population (circuitstat.stats.tails)"),
           ("top_prompt_share", F, "share of the edge's total effect carried by its largest prompt")),
    _table("coverage_by_kurtosis", "calibration study: coverage of the edge kinds by decile of the edges' excess "
                                   "kurtosis over the population",
           ("kind", S, "interval kind"), ("n", I, "dataset size N"), ("decile", I, "kurtosis decile, 1 = lightest"),
           ("kurtosis_low", F, "smallest excess kurtosis in the decile"),
           ("kurtosis_high", F, "largest excess kurtosis in the decile"), ("n_units", I, "edges in the decile"),
           ("coverage", F, "share of (dataset, edge) intervals of the decile's edges covering the edge's mean"),
           ("coverage_mc_se", F, "Monte Carlo SE of coverage, the dataset as the unit"),
           ("worst_unit_coverage", F, "lowest coverage of one edge of the decile"),
           ("coverage_reliable", F, "coverage among the decile's cells flagged reliable"),
           ("coverage_reliable_mc_se", F, "Monte Carlo SE of coverage_reliable, the dataset as the unit"),
           ("share_reliable", F, "share of the decile's cells flagged reliable")),
    _table("claims", "results of `circuitstat check` against this run, one row per claim (the report's verdict lists them)",
           ("index", I, "the claim's position in its claims file, from 0"),
           ("name", S, "the claim's name (or its label)"), ("kind", S, "claim kind (circuitstat.pipelines.claims.kinds)"),
           ("status", S, "pass, fail or error"), ("observed", S, "the observed value(s) as the check printed them"),
           ("bound", S, "the claim's bound"), ("reason", S, "why it holds, fails or cannot be evaluated"),
           ("description", S, "the claim's description, or empty")),
    _table("summary", "one-screen summary: one row per reported item",
           ("item", S, "what is reported"), ("value", F, "estimate"),
           *_ci("ci", "value", "stated in the item", claimable=False),
           ("verdict", S, "met / not met / inconclusive against the item's bar (head study: supported / "
                          "contradicted / negligible / inconclusive), or empty"),
           ("pvalue", F, "p-value of the item's directional claim (head study)", False, True),
           ("pvalue_holm", F, "Holm-adjusted p-value over the study's verdicts (head study)", False, True),
           ("interval", S, "how the interval was computed (head study)", False, True),
           ("multiplicity", S, "the multiple-comparison rule of the verdicts (head study)", False, True)),
)}

# Token contribution weights and attention sinks (circuitstat.pipelines.contributions; issue 16)
DROP = "the mean metric drop over the task's prompt distribution when the measure's top-k tokens are ablated"
DROP_DIFF = "the mean paired difference of drops between the two measures over the prompt distribution"
SINK_RATE = "the head's sink rate (share of query positions above the threshold) over the prompt distribution"
SINK_FIT = "the stated coefficient of head output norm on head sink rate across heads; prompts resampled, heads fixed"
TOKEN_SEEDS = "the expected top-k token Jaccard between two training seeds (jackknife over seeds; prompts fixed)"
SINK_SEEDS = "the mean over the distribution of training seeds (t interval over seeds)"
SINK_MATCHED = ("the mean over ordered pairs of training seeds, i.e. over the distribution of training seeds (jackknife "
                "over seeds, t on K-1 df; prompts fixed)")
_MEASURE_WEIGHT = "importance of the token at the read-out position by the {} measure (circuitstat.circuits.contributions)"
TABLES.update({t.name: t for t in (
    _table("token_weights", "per-token importance at each prompt's read-out position, one row per prompt and token",
           ("prompt", I, "prompt index in the task"), ("position", I, "token position"), ("token", I, "token id"),
           ("is_readout", B, "the token where the metric is read"), ("candidate", B, "whether the token may be ablated"),
           *((m, F, _MEASURE_WEIGHT.format(m), False, True)
             for m in ("attention", "value_norm", "contribution", "grad_input"))),
    _table("token_drops", "per-prompt metric drop when the top-k tokens of a measure are ablated",
           ("prompt", I, "prompt index in the task"),
           ("measure", S, "importance measure, or random (mean over the random orders)"), _K,
           ("drop", F, "metric(clean) - metric(top-k tokens ablated)"),
           ("n_ablated", I, "tokens ablated (k, or all candidates when a prompt has fewer)")),
    _table("token_importance", "token-importance faithfulness: mean metric drop per measure and k",
           ("measure", S, "importance measure (random: the null)"), _K, ("n", I, "number of prompts"),
           ("mean_drop", F, "mean metric drop over prompts", True),
           ("standard_error", F, "bootstrap standard error of mean_drop"),
           *_ci("ci", "mean_drop", DROP), ("pvalue", F, "two-sided p-value of zero drop, inverting the interval"),
           ("tail_share", F, "share of sum |x - median| carried by the ceil(sqrt N) most extreme prompts"),
           ("interval_reliable", B, "false when tail_share > 0.6: a few prompts carry the estimate"),
           ("interval", S, "interval method"), ("estimand", S, "what the interval covers")),
    _table("token_importance_diffs", "paired differences of mean drops between measures, one row per pair and k",
           ("measure_a", S, "first measure"), ("measure_b", S, "second measure"), _K,
           ("difference", F, "mean over prompts of drop_a - drop_b", True),
           ("standard_error", F, "bootstrap standard error of the difference"),
           *_ci("ci", "difference", DROP_DIFF), ("pvalue", F, "two-sided p-value of zero difference, inverting the interval"),
           ("pvalue_holm", F, "Holm-adjusted p-value over every pair and k"),
           ("verdict", S, "'a > b', 'a < b' or inconclusive (Holm, family-wise alpha)"),
           ("interval_reliable", B, "false when a few prompts carry the difference"),
           ("multiplicity", S, "the multiple-comparison rule of the verdicts"), ("estimand", S, "what the interval covers")),
    _table("sink_prompts", "per prompt and head: sink share, mean output norm and confidence gap",
           ("prompt", I, "prompt index"), ("layer", I, "layer"), ("head", I, "head"),
           ("sink_share", F, "share of query positions attending to the sink token above the threshold"),
           ("output_norm", F, "mean norm of the head's output over the same positions"),
           ("confidence_gap", F, "mean sink attention at low- minus high-confidence positions")),
    _table("sink_heads", "attention sinks: per-head sink rate, output norm and confidence gap with intervals",
           ("layer", I, "layer"), ("head", I, "head"), ("node", S, "head node name a{L}.h{H}"),
           ("sink_rate", F, "mean over prompts of the share of positions attending to the sink above the threshold",
            True),
           *_ci("ci", "sink_rate", SINK_RATE), ("output_norm", F, "mean head output norm", True),
           *_ci("norm_ci", "output_norm", "the head's mean output norm over the prompt distribution"),
           ("confidence_gap", F, "mean sink attention at low- minus high-confidence positions"),
           *_ci("gap_ci", "confidence_gap", "the head's confidence gap over the prompt distribution", claimable=False),
           ("threshold", F, "sink threshold on the attention weight"), ("n", I, "number of prompts"),
           ("interval_reliable", B, "false when a few prompts carry the sink rate")),
    _table("sink_fit", "relation of head output norm to head sink rate across heads (quadratic and Spearman)",
           ("term", S, "intercept, slope, curvature (quadratic least squares) or spearman"),
           ("estimate", F, "the coefficient or rho", True), *_ci("ci", "estimate", SINK_FIT),
           ("interval", S, "interval method"), ("verdict", S, "convex/concave or increasing/decreasing or inconclusive"),
           ("estimand", S, "what the interval covers"), ("multiplicity", S, "the multiple-comparison rule of the verdicts")),
    _table("token_stability", "do independently trained seeds pick the same top-k tokens? one row per measure and k",
           ("measure", S, "importance measure"), _K,
           ("jaccard", F, "mean over seed pairs and prompts of the top-k token Jaccard", True),
           *_ci("ci", "jaccard", TOKEN_SEEDS), ("chance", F, "expected Jaccard of two random k-subsets of the candidates"),
           ("excess", F, "jaccard minus chance", True), *_ci("excess_ci", "excess", TOKEN_SEEDS),
           ("n_refits", I, "number of seeds"), ("n_prompts", I, "number of prompts"),
           ("estimand", S, "what the interval covers")),
    _table("sink_stability", "are the sink heads and the sink-norm relation the same across seeds? one row per item",
           ("layer", I, "layer (-1: the whole model)"), ("item", S, "what is compared across seeds"),
           ("value", F, "mean over seeds", True), *_ci("ci", "value", SINK_SEEDS),
           ("sd", F, "standard deviation over seeds"), ("min", F, "smallest seed value"), ("max", F, "largest seed value"),
           ("n_refits", I, "number of seeds"), ("estimand", S, "what the interval covers")),
    _table("sink_matching", "are the sink heads the same heads across seeds? heads matched within each layer by "
           "attention pattern (as in the head study); one row per layer and item, against a random one-to-one matching",
           ("layer", I, "layer (-1: all layers pooled)"),
           ("item", S, "sink-head Jaccard, share of sink heads matched to a sink, or mean |sink-rate difference| of "
                       "matched heads"),
           ("value", F, "mean over ordered seed pairs where the item is defined", True), *_ci("ci", "value", SINK_MATCHED),
           ("null", F, "exact expectation of the item under a uniformly random one-to-one matching of the layer's heads"),
           ("excess", F, "value - null (null - value for the rate difference): positive = more alike than chance", True),
           *_ci("excess_ci", "excess", SINK_MATCHED),
           ("verdict", S, "stable (excess interval above 0), less than chance (below 0), inconclusive, or undefined "
                          "(no interval); each row from its own interval, not adjusted for multiplicity"),
           ("n_refits", I, "number of seeds"), ("n_pairs", I, "ordered seed pairs where the item is defined"),
           ("n_pairs_undefined", I, "ordered seed pairs left out: no sink head in either seed (Jaccard) or in the "
                                    "first seed (share)"),
           ("sink_bar", F, "sink rate at or above which a head is a sink head"),
           ("matching", S, "how heads were matched across seeds"), ("estimand", S, "what the interval covers")),
)})

# Ground-truth study (circuitstat.pipelines.groundtruth; issue 27)
GT_DATASETS = ("the expected value of the statistic for a dataset of N prompts from the task's distribution "
               "(t interval over R independent datasets)")
_GT_KEYS = (("model", S, "model with a known circuit (tracr:NAME or planted:...)"), _METHOD,
            ("n", I, "dataset size N (prompts)"))
TABLES.update({t.name: t for t in (
    _table("groundtruth_models", "ground-truth study: the models and their true circuits, one row per model",
           ("model", S, "model source"), ("kind", S, "compiled (tracr) or planted"), ("describe", S, "what it computes"),
           ("n_edges", I, "edges of the model's graph"), ("n_true", I, "edges of the true circuit"),
           ("n_null", I, "edges whose population mean effect is exactly zero"),
           ("n_per_example_nulls", I, "null edges whose per-example effect is not zero"),
           ("n_structural", I, "edges of a compiled program's structural circuit (-1: planted)"),
           ("population", I, "prompts drawn: R datasets of the largest N, disjoint"),
           ("weight_hash", S, "sha256 of the model's weights"), ("true_edges", S, "the true edges, comma-separated")),
    _table("groundtruth_datasets", "ground-truth study: every statistic of every dataset, one row per value",
           *_GT_KEYS, ("dataset", I, "dataset index r (disjoint prompts)"),
           ("family", S, "ranking, topk, test:bootstrap, test:t, stability, faithfulness or roc"),
           ("statistic", S, "the statistic (auroc, fdp, recall, false_edges, fixed_covers_truth, ...)"),
           ("param", S, "its setting (k=.., q=.., pi=.., fpr=..; empty if none)"), ("value", F, "its value")),
    _table("groundtruth_summary", "ground-truth study: each statistic's mean over datasets with its interval",
           *_GT_KEYS, ("family", S, "statistic family"), ("statistic", S, "statistic"), ("param", S, "its setting"),
           ("estimate", F, "mean over the R datasets", True), ("se", F, "standard error of the mean over datasets"),
           *_ci("ci", "estimate", GT_DATASETS),
           ("spread_low", F, "2.5% of the per-dataset values (spread over datasets, not an interval for the mean)"),
           ("spread_high", F, "97.5% of the per-dataset values (spread over datasets, not an interval for the mean)"),
           ("n_datasets", I, "datasets averaged (NaN values dropped)"), ("estimand", S, "what the interval covers")),
    _table("groundtruth_fdr", "ground-truth study: realised FDR of q-value selections against the level",
           *_GT_KEYS, ("test", S, "per-edge test: bootstrap (the audit's default: inverted interval, BH) or t (BH)"),
           ("alpha", F, "FDR level: edges with q <= alpha are selected"),
           ("fdr", F, "realised FDR: mean over datasets of the false discovery proportion", True),
           ("fdr_mc_se", F, "Monte Carlo standard error of fdr over datasets"),
           ("bound", F, "alpha + 2 Monte Carlo SEs: what fdr may reach and still hold"),
           ("verdict", S, "holds, exceeded, or trivial (no dataset made a false discovery)"),
           ("share_with_false", F, "share of datasets with at least one false discovery"),
           ("power", F, "mean recall of the true circuit", True),
           *_ci("power_ci", "power", GT_DATASETS + "; its ends kept within [0, 1], which the power cannot leave, "
                "so its coverage is the t interval's"), ("n_datasets", I, "datasets")),
    _table("groundtruth_roc", "ground-truth study: edge ROC curves averaged over datasets (vertical averaging)",
           *_GT_KEYS, ("fpr", F, "false positive rate"), ("tpr", F, "mean true positive rate at that FPR"),
           *_ci("tpr_ci", "tpr", GT_DATASETS), ("estimand", S, "what the interval covers")),
)})

# Hypothesis tests of a circuit (circuitstat.pipelines.circuit_tests; Shi et al., NeurIPS 2024; issue 34)
TABLES.update({t.name: t for t in (
    _table("circuit_tests", "hypothesis tests of one circuit (equivalence, independence, minimality, sufficiency, "
           "partial necessity), one row per test, on the testing prompts only",
           _METHOD, ("test", S, "equivalence, equivalence_tost, independence, minimality, sufficiency or "
                                "partial_necessity"),
           ("statistic", F, "equivalence / equivalence_tost: P̂(Δ > 0), the share of prompts where the circuit "
                            "scores above the model; independence: HSIC; minimality: the weakest edge's share of "
                            "references (an edge of a random path added to the circuit) it beats; sufficiency / "
                            "partial_necessity: Ĝ, the share of random connected circuits of its size it beats"),
           ("statistic_low", F, "lower end of the interval for the statistic (covers: the test's binomial "
                                "proportion, P(Δ > 0) or G; Clopper-Pearson 95%; NaN for independence)", False, True),
           ("statistic_high", F, "upper end of the interval for the statistic (covers: the test's binomial "
                                 "proportion, P(Δ > 0) or G; Clopper-Pearson 95%; NaN for independence)", False, True),
           ("pvalue", F, "p-value of the test's null (minimality: the smallest Holm/BH-adjusted edge p-value)", True),
           ("null", S, "the null hypothesis"), ("rejection_means", S, "what rejecting the null says"),
           ("parameter", F, "equivalence / equivalence_tost: margin; minimality: quantile; sufficiency / "
                            "partial_necessity: quantile (default 0.9, the paper's; NaN: exact rank p-value)"),
           ("k", I, "edges in the circuit"),
           ("n_random", I, "random connected circuits / inflated circuits (random paths added)"),
           ("n_test", I, "prompts the tests used"), ("n_select", I, "prompts the circuit was chosen on (disjoint)"),
           ("correction", S, "multiplicity correction of the minimality family: holm (family-wise) or bh (FDR)"),
           ("selection", S, "how the circuit was chosen"),
           ("split_seed", S, "the seed of the selection/testing split and of the top-k ties (SeedSequence record)")),
    _table("circuit_minimality", "minimality of one circuit: each edge's knockout against references (one "
           "new edge knocked out of the circuit plus a random input -> logits path)",
           _METHOD, ("edge", I, "edge index"), ("name", S, "edge name"),
           ("effect", F, "knockout effect: mean over prompts of (m(C) - m(C - e))^2"),
           ("count", I, "references whose knockout effect the edge's exceeds beyond float rounding"),
           ("pvalue", F, "P(Binomial(n_random, quantile) <= count): the null that the edge is needed"),
           ("pvalue_adjusted", F, "pvalue adjusted over the circuit's edges (correction)", True),
           ("correction", S, "holm (family-wise) or bh (FDR)"), ("quantile", F, "the null's quantile"),
           ("n_random", I, "references (inflated circuits)"),
           ("dangling", B, "the edge lies on no input -> logits path inside the circuit (an unpruned top-k keeps such "
                           "edges), so its knockout cannot change the metric: its effect is 0 up to rounding and it "
                           "is redundant by construction, not by measurement")),
)})

#: why a dangling minimality row is redundant, in the words the claims check and the report both print
DANGLING_REASON = "dangling: on no input -> logits path inside the circuit, so its knockout changes nothing"

# The tables of the Result classes (Result.write validates against them); their names are unique
assert not set(RESULT_TABLES) & set(TABLES), sorted(set(RESULT_TABLES) & set(TABLES))
TABLES.update(RESULT_TABLES)

SCORES_PREFIX = "scores_"

#: columns renamed since runs were written, {table: {old name: current name}}. A run directory written before a
#: rename still reads: circuitstat.core.tables.read_table, which every reader of run tables goes through, maps the
#: old names to the current ones (:func:`renamed`), so claims, the report and compare see only current names.
RENAMED_COLUMNS: dict[str, dict[str, str]] = {
    # issue 34: no sample statistic can promise that a mean's interval covers (a spike the sample missed is
    # invisible; docs/calibration.md), so the per-edge mean tables' flag says only what it sees
    "edge_stats": {"interval_reliable": "no_tail_seen"},
    "verified": {"interval_reliable": "no_tail_seen"},
    "bootstrap": {"interval_reliable": "no_tail_seen"},
}


def renamed(name: str, table: Any) -> Any:
    """Return pyarrow ``table`` (run table ``name``) with old column names (RENAMED_COLUMNS) replaced by current ones."""
    old = RENAMED_COLUMNS.get(name, {})
    have = set(table.column_names)
    if not old or not have & set(old):
        return table
    # a file holding both the old and the current name keeps both as they are: nothing is overwritten
    out = table.rename_columns([old[c] if c in old and old[c] not in have else c for c in table.column_names])
    return out.replace_schema_metadata(table.schema.metadata)  # rename_columns drops it (the provenance)


def tail_flag(name: str) -> str | None:
    """Return the column of run table ``name`` (``model-<i>/`` prefix allowed) that is false where a few prompts carry
    the estimate: no_tail_seen in the per-edge mean tables, interval_reliable in the others; None if it has none."""
    schema = TABLES.get(name.rsplit("/", 1)[-1])
    return next((c for c in ("no_tail_seen", "interval_reliable") if schema is not None and c in schema.names), None)


def stored_names(name: str, wanted: list[str], stored: list[str]) -> list[str]:
    """Return ``wanted`` (current column names of run table ``name``) as a file with columns ``stored`` spells them."""
    back = {new: old for old, new in RENAMED_COLUMNS.get(name, {}).items()}
    return [back[c] if c not in stored and back.get(c) in stored else c for c in wanted]


def schema_for(name: str) -> TableSchema | None:
    """Return the registered schema of run table ``name`` (None for unregistered and per-method score tables)."""
    return TABLES.get(name)


def columns(name: str) -> tuple[str, ...]:
    """Return the column names of registered table ``name``; KeyError for an unregistered one."""
    return TABLES[name].names


def claimable(name: str) -> tuple[str, ...]:
    """Return the columns of table ``name`` a claim may bound, in schema order."""
    return tuple(c.name for c in TABLES[name].columns if c.claimable)


def fill(name: str, rows: Mapping[str, Any], n: int) -> dict[str, list]:
    """Return ``rows`` completed to the full schema of table ``name`` (NaN, -1, '' or False fill
    the absent columns); KeyError for a column the schema does not know. For test fixtures."""
    schema = TABLES[name]
    for key in rows:
        schema.column(key)
    blank = {F: float("nan"), I: -1, S: "", B: False}
    return {c.name: list(rows[c.name]) if c.name in rows else [blank[c.type]] * n for c in schema.columns}
