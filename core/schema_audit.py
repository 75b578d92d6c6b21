"""The audit's run tables (core/schema.py merges them into the one registry): the edge index, per-edge
estimates, circuit stability and faithfulness, mask fits, published circuits, approximation error, the
hypothesis tests of a circuit, and the tables ``circuitstat check`` and the summary write into a run.
"""

from __future__ import annotations

from circuitstat.core.schema_core import (B, DATA_JACCARD, DATA_PHI, HALF_JACCARD, EDGE_ESTIMAND, F, FIXED_F, MC_JACCARD,
                                         MEDIAN_ESTIMAND, POP_JACCARD, SELECTED_F, CONDITIONAL_F, TRIMMED_ESTIMAND,
                                         I, S, K_COLUMN, METHOD_COLUMN, TableSchema, ci_columns, table_schema)

__all__ = ["AUDIT_TABLES", "CHECK_TABLES", "CIRCUIT_TEST_TABLES", "DANGLING_REASON"]

# the agreement intervals' estimands, as circuitstat.stats.approximation states them (reports imports nothing from stats)
AGREE_SPEARMAN = ("expected Spearman of the per-edge mean scores of N prompts from the task's distribution")
AGREE_R2 = "pooled per-example R^2 over the task's prompt distribution"
PUBLISHED_F = ("faithfulness of this fixed published circuit on the task's prompt distribution (not selected from "
               "these prompts: no selection to account for)")
PUBLISHED_CPR = ("the area under the faithfulness curve of the file's fixed score ranking, at MIB's percentages, "
                 "over the task's prompt distribution")

_RANKED_BY = ("ranked_by", S, "what the circuits are the top-k of: the method's mean score, or for a verified method "
              "(<approx>+verified) the PPI++ estimates, e.g. 'mean exact effect, verified on 16 of 512 prompts'",
              False, True)

# robust estimands beside the mean (circuitstat.stats.robust; docs/calibration.md "Robust estimands"): optional, so
# runs from before them still read; NaN with robust_note where they do not apply
_ROBUST_EDGE_COLUMNS = (
    ("median", F, "median per-example effect (the effect on a typical prompt; a few prompts cannot move it)", True, True),
    *((c[0], c[1], c[2], True, True) for c in ci_columns("median_ci", "the edge's median effect", MEDIAN_ESTIMAND)),
    ("median_p", F, "two-sided sign-test p-value of a zero median; <= 1 - level exactly when median_ci excludes 0",
     False, True),
    ("median_q", F, "Benjamini-Hochberg q-value of median_p over edges", True, True),
    ("trimmed_mean", F, "20%-trimmed mean per-example effect (mean of the middle 60% of prompts)", True, True),
    *((c[0], c[1], c[2], True, True) for c in ci_columns("trimmed_mean_ci", "the edge's trimmed mean effect",
                                                   TRIMMED_ESTIMAND)),
    ("trimmed_mean_p", F, "two-sided p-value of Yuen's trimmed t test; < 1 - level exactly when trimmed_mean_ci "
                          "excludes 0", False, True),
    ("trimmed_mean_q", F, "Benjamini-Hochberg q-value of trimmed_mean_p over edges", True, True),
    ("robust_note", S, "why the robust columns are NaN ('' when computed): their intervals assume independent "
                       "prompts, so a cluster bootstrap's run leaves them out", False, True),
)

AUDIT_TABLES: tuple[TableSchema, ...] = (
    table_schema("edges", "the edge index of the graph: one row per edge, in score-column order",
           ("index", I, "position of the edge in every score vector"), ("name", S, "EAP-IG style edge name"),
           ("sender", S, "sending node"), ("receiver", S, "receiving node (with <q>/<k>/<v> input)"),
           ("sender_layer", I, "layer of the sender (-1 for the input)"),
           ("receiver_layer", I, "layer of the receiver (n_layers for the logits)"),
           ("kind", S, "receiver input kind: q, k, v, mlp or logits")),
    table_schema("edge_stats", "per-edge mean effect with its interval, p- and q-value, one row per method and edge",
           METHOD_COLUMN, ("edge", I, "edge index"), ("name", S, "edge name"),
           ("estimate", F, "mean per-example effect"),
           ("se", F, "standard error of the mean: the bootstrap SE, or under the cluster scheme's wild_cluster_t / "
                     "cr2_t / wcr the CR2 cluster-robust SE the interval uses"),
           *ci_columns("ci", "the edge's mean effect", EDGE_ESTIMAND),
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
    table_schema("stability_vs_k", "circuit stability under resampling, one row per method and k",
           METHOD_COLUMN, K_COLUMN,
           ("jaccard_mean", F, "mean pairwise Jaccard of resample circuits (Meloux et al.)", True),
           ("jaccard_sd", F, "SD of the pairwise Jaccards"),
           *ci_columns("jaccard_ci", "jaccard_mean", MC_JACCARD, claimable=False),
           ("jaccard_chance", F, "expected Jaccard of two random k-subsets"),
           ("jaccard_corrected", F, "(jaccard_mean - chance) / (1 - chance)", True),
           ("phi", F, "mean pairwise Phi of inclusion indicators", True),
           *ci_columns("phi_ci", "phi", MC_JACCARD, claimable=False),
           ("consensus_size", I, "edges in at least the consensus threshold of resample circuits"),
           ("consensus_jaccard_mean", F, "mean Jaccard of resample circuits to the consensus circuit", True),
           ("rbo_mean", F, "mean rank-biased overlap of resample rankings"),
           ("jaccard_half", F, f"estimate of {HALF_JACCARD}: the primary data-level stability (mean Jaccard of "
                               "the top-k circuits of disjoint halves over random splits)", True),
           ("jaccard_half_se", F, "standard error of jaccard_half (bootstrap of the examples or templates with its bias term, "
                                  "plus its Monte Carlo error)"),
           *ci_columns("jaccard_half_ci", "jaccard_half", HALF_JACCARD),
           ("jaccard_half_mc_se", F, "Monte Carlo error of jaccard_half over its random splits (part of its se; "
                                     "NOT an interval for the data)"),
           ("jaccard_half_floor", F, "sampling-aware lower bound on J_{N/2} from the score gaps at the cut-off "
                                     "(circuitstat.stats.flip_bound); it lowers jaccard_half_ci_low only where every "
                                     "split's Jaccard is the same (no split disagrees), and is NaN (not computed) "
                                     "elsewhere"),
           ("jaccard_half_units", F, "units (examples, or templates under the cluster scheme) in each half"),
           ("jaccard_data", F, f"estimate of {DATA_JACCARD}: J_N (extrapolated, bracketed double bootstrap; "
                               "J_{N/2} is jaccard_half)", True),
           ("jaccard_data_se", F, "standard error of jaccard_data"),
           *ci_columns("jaccard_data_ci", "jaccard_data", DATA_JACCARD),
           ("jaccard_pop", F, f"estimate of {POP_JACCARD}", True),
           *ci_columns("jaccard_pop_ci", "jaccard_pop", POP_JACCARD),
           ("phi_data", F, f"estimate of {DATA_PHI}", True),
           *ci_columns("phi_data_ci", "phi_data", DATA_PHI),
           ("cutoff_ties_mean", F, "mean number of edges tied at the top-k cut-off (ties broken at random)"),
           ("cutoff_ties_excluded_mean", F, "mean number of those tied edges left out of the circuit"),
           ("tie_rule", S, "how ties at the top-k cut-off were broken (circuitstat.core.topk)"),
           ("spearman_mean", F, "mean Spearman correlation of full resample score vectors (k-free)"),
           ("data_level_note", S, "why the data-level columns (jaccard_data*, jaccard_pop*, phi_data*) are NaN, "
                                  "if they are"),
           _RANKED_BY),
    table_schema("inclusion", "how often each edge enters the top-k circuit over resamples (edges never selected: no row)",
           METHOD_COLUMN, K_COLUMN, ("edge", I, "edge index"), ("name", S, "edge name"),
           ("frequency", F, "share of resamples whose top-k circuit contains the edge")),
    table_schema("edge_masks", "a mask-learned method's learned mask, one row per method and edge (it has no per-example "
           "scores: method_notes says which tables have no rows for it and why)",
           METHOD_COLUMN, ("edge", I, "edge index"), ("name", S, "edge name"),
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
                                   "target"),
           ("node_target_sparsity", F, "edge pruning's target share of node (sender) gates closed (NaN: no node "
                                       "target)"),
           ("reached_node_sparsity", F, "share of node gates the fit's own mask closes (gate <= 1/2; NaN: no node "
                                        "masks)")),
    table_schema("mask_fits", "every fit of a mask-learned method: one row per method, fit and edge",
           METHOD_COLUMN, ("fit", I, "0: the fit on every prompt; i >= 1: the refit on resample i of the stability plan "
                               "(seed: child i - 1 of the run's seed)"),
           ("edge", I, "edge index"), ("log_alpha", F, "learned mask logit"),
           ("gate", F, "deterministic hard-concrete gate")),
    table_schema("method_notes", "tables in which a method has no rows by design, and why (e.g. per-edge intervals of a "
                           "mask-learned method, which has no per-example scores)",
           METHOD_COLUMN, ("table", S, "the table (or analysis) the method is absent from"),
           ("reason", S, "why it does not apply to this method")),
    table_schema("published_circuit", "a published circuit (spec key circuit) audited on this model and task, one row per "
                                "method (circuitstat.pipelines.published)",
           METHOD_COLUMN, ("circuit", S, "the circuit file's name"), ("format", S, "eap-ig (EAP-IG/MIB JSON) or edges"),
           ("n_edges", I, "edges in the circuit"), ("n_nodes", I, "nodes in the circuit"),
           ("f_ratio", F, "ratio-of-means faithfulness of the circuit on this run's prompts", True),
           ("f_mean", F, "mean per-example faithfulness"),
           *ci_columns("f_ci", "f_ratio", PUBLISHED_F), ("f_se", F, "bootstrap standard error of f_ratio"),
           ("f_ci_method", S, "interval method (fieller: Fieller's set of a ratio of means; -inf/inf ends when the "
                              "denominator is not distinguishable from 0)"),
           ("f_ci_estimand", S, "what the interval covers"),
           ("f_ci_note", S, "empty when Fieller's set is a bounded interval; else that the full model's effect over "
                            "the empty circuit is not distinguishable from 0, and what the set is"),
           ("cpr", F, "CPR of the file's scores at MIB's percentages (NaN without scores)", True),
           *ci_columns("cpr_ci", "cpr", PUBLISHED_CPR),
           ("cmd", F, "CMD of the file's scores at MIB's percentages (NaN without scores)", True),
           *ci_columns("cmd_ci", "cmd", PUBLISHED_CPR), ("area_note", S, "how CPR/CMD were computed, or why they are NaN"),
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
    table_schema("published_circuit_edges", "each edge of a published circuit: effect, q-value, support and inclusion",
           METHOD_COLUMN, ("edge", I, "edge index"), ("name", S, "edge name"),
           ("estimate", F, "mean per-example effect"), *ci_columns("ci", "the edge's mean effect", EDGE_ESTIMAND),
           ("q", F, "Benjamini-Hochberg q-value over all edges (edge_stats)", True),
           ("supported", B, "q <= q_level"),
           ("inclusion", F, "share of resamples whose top-k circuit (k = the circuit's size) contains the edge", True)),
    table_schema("faithfulness_vs_k", "faithfulness of the top-k circuit of the mean scores, one row per method and k",
           METHOD_COLUMN, K_COLUMN, ("edge_fraction", F, "k / number of edges"),
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
           *ci_columns("f_selected_ci", "f_selected", SELECTED_F),
           ("f_selected_method", S, "interval method of f_selected"),
           ("f_selected_estimand", S, "what f_selected_ci covers"),
           ("fold_circuit_jaccard", F, "mean Jaccard between the circuits selected on different folds"),
           ("f_selected_note", S, "how f_selected was computed, or why it is NaN"),
           ("f_conditional", F, "a mask-learned method's reported circuit: the top-k of one fit on half the prompts, "
            "its ratio-of-means faithfulness on the other half", True),
           *ci_columns("f_conditional_ci", "f_conditional", CONDITIONAL_F),
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
    table_schema("approximation", "per-edge error of an approximate method against exact patching",
           METHOD_COLUMN, ("edge", I, "edge index"), ("name", S, "edge name"),
           ("exact_mean", F, "mean exact effect"), ("approx_mean", F, "mean approximate score"),
           ("bias", F, "mean of approx - exact"), ("error_sd", F, "SD over prompts of approx - exact"),
           ("slope", F, "per-example regression slope of approx on exact"),
           ("intercept", F, "per-example regression intercept"), ("r2", F, "per-example R^2")),
    table_schema("approximation_summary", "agreement of an approximate method with exact, one row per method",
           METHOD_COLUMN, ("spearman", F, "Spearman of mean scores against exact", True),
           ("kendall", F, "Kendall tau of mean scores against exact", True),
           ("slope", F, "pooled per-example regression slope", True), ("r2", F, "pooled per-example R^2", True),
           ("bias_mean", F, "mean error over prompts and edges", True),
           ("top_k_overlap", F, "share of exact's top-k circuit in the method's top-k", True),
           ("k", I, "k of top_k_overlap"), ("tie_rule", S, "how ties at the top-k cut-off were broken (circuitstat.core.topk)"),
           ("cutoff_ties", I, "edges whose exact mean ties exact's k-th one"),
           ("cutoff_ties_approx", I, "edges whose mean by this method ties its k-th one"),
           *ci_columns("spearman_ci", "spearman", AGREE_SPEARMAN), *ci_columns("r2_ci", "r2", AGREE_R2),
           ("ci_method", S, "how the spearman and r2 intervals were computed"),
           ("spearman_estimand", S, "what spearman_ci covers"), ("r2_estimand", S, "what r2_ci covers"),
           ("n_resamples", I, "bootstrap resamples of the prompts behind the intervals (0: none)")),
)

#: the tables a check and the one-screen summary write into a run
CHECK_TABLES: tuple[TableSchema, ...] = (
    table_schema("claims", "results of `circuitstat check` against this run, one row per claim (the report's verdict lists them)",
           ("index", I, "the claim's position in its claims file, from 0"),
           ("name", S, "the claim's name (or its label)"), ("kind", S, "claim kind (circuitstat.pipelines.claims.kinds)"),
           ("status", S, "pass, fail or error"), ("observed", S, "the observed value(s) as the check printed them"),
           ("bound", S, "the claim's bound"), ("reason", S, "why it holds, fails or cannot be evaluated"),
           ("description", S, "the claim's description, or empty")),
    table_schema("summary", "one-screen summary: one row per reported item",
           ("item", S, "what is reported"), ("value", F, "estimate"),
           *ci_columns("ci", "value", "stated in the item", claimable=False),
           ("verdict", S, "met / not met / inconclusive against the item's bar (head study: supported / "
                          "contradicted / negligible / inconclusive), or empty"),
           ("pvalue", F, "p-value of the item's directional claim (head study)", False, True),
           ("pvalue_holm", F, "Holm-adjusted p-value over the study's verdicts (head study)", False, True),
           ("interval", S, "how the interval was computed (head study)", False, True),
           ("multiplicity", S, "the multiple-comparison rule of the verdicts (head study)", False, True)),
)

# Hypothesis tests of a circuit (circuitstat.pipelines.circuit_tests; Shi et al., NeurIPS 2024; issue 34)
CIRCUIT_TEST_TABLES: tuple[TableSchema, ...] = (
    table_schema("circuit_tests", "hypothesis tests of one circuit (equivalence, independence, minimality, sufficiency, "
           "partial necessity), one row per test, on the testing prompts only",
           METHOD_COLUMN, ("test", S, "equivalence, equivalence_tost, independence, minimality, sufficiency or "
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
    table_schema("circuit_minimality", "minimality of one circuit: each edge's knockout against references (one "
           "new edge knocked out of the circuit plus a random input -> logits path)",
           METHOD_COLUMN, ("edge", I, "edge index"), ("name", S, "edge name"),
           ("effect", F, "knockout effect: mean over prompts of (m(C) - m(C - e))^2"),
           ("count", I, "references whose knockout effect the edge's exceeds beyond float rounding"),
           ("pvalue", F, "P(Binomial(n_random, quantile) <= count): the null that the edge is needed"),
           ("pvalue_adjusted", F, "pvalue adjusted over the circuit's edges (correction)", True),
           ("correction", S, "holm (family-wise) or bh (FDR)"), ("quantile", F, "the null's quantile"),
           ("n_random", I, "references (inflated circuits)"),
           ("dangling", B, "the edge lies on no input -> logits path inside the circuit (an unpruned top-k keeps such "
                           "edges), so its knockout cannot change the metric: its effect is 0 up to rounding and it "
                           "is redundant by construction, not by measurement")),
)

#: why a dangling minimality row is redundant, in the words the claims check and the report both print
DANGLING_REASON = "dangling: on no input -> logits path inside the circuit, so its knockout changes nothing"
