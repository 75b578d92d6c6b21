"""The tables of the Result classes (``Result.write`` validates against these; core/schema.py merges them).

A result's table names are run-table names: ``result.write(run_dir)`` writes ``<name>.parquet``
through :class:`circuitstat.core.rundir.RunDir`, which checks each against its entry here, so a result
whose columns drift fails where it is written. Results that produce run tables the audit or a study
also writes (``heads``, ``token_importance``, ``coverage``, ...) use those entries in
core/schema.py. Interval columns are declared with ``ci_columns`` and say what they cover, which is
what ``Result.conf_int`` reports as the estimand.
"""

from __future__ import annotations

from circuitstat.core.schema_core import (B, DATA_JACCARD, DATA_PHI, HALF_JACCARD, F, I, MATRIX, MC_JACCARD, POP_JACCARD, S, TableSchema,
                                 ci_columns, table_schema)

__all__ = ["RESULT_TABLES", "INTERVAL_METHODS"]

#: interval methods of circuitstat.stats.intervals; a result's secondary intervals are ``ci_<method>_low/_high``
INTERVAL_METHODS = ("percentile", "basic", "bca", "t", "studentized", "studentized_symmetric")
F32 = MATRIX.value_type  # float32 columns (per-example metrics)

ROW_MEAN = "the mean of each column over the population the rows were drawn from (params['estimand'] names it)"
ROW_ESTIMAND = "the row's estimand (column 'estimand')"
COMPONENT = "the variance component under normal theory (Satterthwaite; heavy-tailed scores undercover)"
ICC_COVERS = "the ICC of the population of targets and raters (F-distribution interval, as pingouin computes it)"
NULL_COVERS = ("the similarity expected by chance: central interval of the shuffled-rows null distribution "
               "(not an interval for the estimate)")
MATCH_COVERS = "the matched similarity over the prompt distribution, this pair of refits fixed (prompts resampled)"
_EDGE = ("edge", I, "column (edge) index")
_EDGE_NAME = ("edge_name", S, "edge name", False, True)
_K = ("k", I, "circuit size: number of edges kept")


def _optional(cols: tuple[tuple, ...]) -> tuple[tuple, ...]:
    """The same columns, optional (written by some results only)."""
    return tuple((*c[:3], c[3] if len(c) > 3 else False, True) for c in cols)


def _methods(covers: str) -> tuple[tuple, ...]:
    """Optional secondary intervals and their p-values, one per interval method."""
    out: tuple[tuple, ...] = ()
    for m in INTERVAL_METHODS:
        out += _optional(ci_columns(f"ci_{m}", f"the estimate by the {m} method", covers, claimable=False))
        out += ((f"pvalue_{m}", F, f"p-value inverting the {m} interval", False, True),)
    return out


def _data_level(name: str, covers: str) -> tuple[tuple, ...]:
    """The data-level estimate of ``name`` with its SE, bias, interval, split-half and 2N values."""
    return ((name, F, f"estimate of {covers}"), (f"{name}_se", F, f"standard error of {name}"),
            (f"{name}_bias", F, f"double-bootstrap bias estimate of {name}"),
            *ci_columns(f"{name}_ci", name, covers, claimable=False))


VERIFIED_COVERS = ("the mean exact effect over the task's prompt distribution, verified on n of N prompts "
                   "(PPI++; column 'estimand' names n and N)")
SAMPLE_WIDTH = ("the width of the per-edge interval one dataset of n prompts will show (a prediction interval "
                "at the level in params, from the pilot)")
SAMPLE_JACCARD = ("the expected Jaccard between the top-k circuits of two independent datasets of n prompts "
                  "(a prediction interval from the pilot)")
SAMPLE_JACCARD_HALF = ("the expected Jaccard between the top-k circuits of two independent datasets of floor(n/2) "
                       "prompts: the expectation of the jaccard_half an audit of n prompts reports (a prediction "
                       "interval from the pilot)")
MISSED_COVERS = "the number of unverified edges whose mean exact effect exceeds tau (a one-sided bound; 'level' column)"
MASS_COVERS = ("the sum of |mean exact effect| over the unverified edges (a one-sided bound; 'mass_level' column; "
               "absent before issue 48 item 5)")

# a verified audit or attribute run writes one verified / missed_edges table for all its approximate methods
_VERIFIED_METHOD = ("method", S, "the approximate method verified (a run's tables; absent from a lone result)", False, True)

RESULT_TABLES: dict[str, TableSchema] = {t.name: t for t in (
    table_schema("verified_prompts", "the prompts a verified run patched exactly: drawn uniformly from a recorded seed",
           ("row", I, "example index (row of the scores)"),
           ("seed", I, "the seed the rows were drawn from: numpy.random.default_rng(seed), without replacement"),
           ("n_prompts", I, "prompts the approximation was computed on (N)")),
    table_schema("verified_cells", "the (prompt, edge) cells an active-design verified run patched exactly "
                 "(circuitstat.stats.verified.active): one row per method and sampled cell, with its probability",
           _VERIFIED_METHOD, ("row", I, "example index (row of the scores)"), _EDGE,
           ("probability", F, "the cell's probability pi of exact patching (active_probabilities of the method's "
                              "scores and the budget); its Horvitz-Thompson weight is 1/pi"),
           ("seed", I, "the method's cells are active_sample(pi, numpy.random.SeedSequence([seed, stream]))"),
           ("stream", I, "the method's place among the run's approximate methods (0, 1, ...)"),
           ("budget", F, "expected exact cells per edge (verify.budget)"),
           ("n_prompts", I, "prompts the approximation was computed on (N)")),
    table_schema("verified", "circuitstat.stats.verified.VerifiedResult: per-edge PPI++ estimate of the mean exact effect",
           _VERIFIED_METHOD, _EDGE, _EDGE_NAME, ("estimate", F, "PPI++ estimate of the mean exact effect", True),
           ("standard_error", F, "its standard error"), *ci_columns("ci", "the estimate", VERIFIED_COVERS, True),
           ("df", F, "degrees of freedom of the interval's t quantile (inf for z)"),
           ("pvalue", F, "two-sided p-value of mean exact effect 0: the interval form applied to the cross-fitted "
                         "estimate (estimate_crossfit; params: pvalues), or inverting the interval in older runs"),
           ("qvalue", F, "FDR-adjusted p-value over edges (params: correction)", True),
           ("lam", F, "power-tuning weight (0: exact only, 1: plain PPI); a combination's rows (method "
                      "'<m1>+<m2>'): the sum of its coefficients (each in verified_coefficients)"),
           ("approx_mean", F, "the approximation's own mean over all N prompts (not the verified estimand); a "
                              "combination's rows: its first method's"),
           ("rectifier_share", F, "share of the labelled rectifier's spread carried by its most extreme prompt (the active "
                                  "design: of the Horvitz-Thompson residual terms (Y - lam Yhat)/pi over the sampled cells)"),
           ("approx_tail_share", F, "tail share of the approximation over the unlabelled prompts (the active design: the "
                                    "edge's unsampled cells): the share of sum |x - median| its max(ceil sqrt N_u, "
                                    "ceil 4.5% of N_u) most extreme prompts carry (ceil sqrt N_u before issue 48 "
                                    "item 2; the same up to N_u = 511)"),
           ("width_vs_exact_on_labelled", F, "interval width over the t interval of exact on the n labelled prompts "
                                             "(SD without the most extreme one; the active design: on as many prompts as "
                                             "the edge's cells, pi-weighted SD); absent before issue 48", False, True),
           ("estimate_crossfit", F, "PPI++ estimate with λ left out per labelled prompt (the active design: λ from the "
                                    "other of 2 folds of prompts; unbiased; the p-value's); absent before issue 48",
            False, True),
           ("width_vs_exact_on_all", F, "interval width over the estimated z interval of exact on all N prompts, "
                                        "2 z SD / sqrt(N) with the yardstick's SD (width_vs_exact_on_labelled's); "
                                        "absent before issue 48 item 1's cap", False, True),
           ("width_vs_exact_on_all_max", F, "a certain upper bound on the interval width over the t interval of exact on "
                                            "all N prompts: the labelled prompts (the active design: the edge's "
                                            "cells) are among the N, so SD_N^2 >= (n - 1) SD_n^2 / (N - 1); "
                                            "needs no assumption about the other prompts; absent before issue 48's "
                                            "certain bound", True, True),
           ("no_tail_seen", B, "true when no few prompts carry the estimate in this sample (rectifier_share, "
                               "approx_tail_share), the interval is at most 2x exact on the labelled prompts "
                               "(width_vs_exact_on_labelled) and 20x exact on all N's estimated width "
                               "(width_vs_exact_on_all), and >= 16 were patched; not that the interval covers: an unseen "
                               "spike is invisible. Older runs call it interval_reliable (read as no_tail_seen). "
                               "The active design: >= 16 cells, Horvitz-Thompson residual share (rectifier_share) <= 0.5, "
                               "the approximation's tail over the unsampled cells <= 0.6, width <= 2x exact on as many "
                               "prompts as the edge's cells and <= 20x exact on all N (stats/verified/active_flag.py). "
                               "Null: not assessed (active-design runs made before that flag)"),
           ("n_labelled", I, "prompts patched exactly (n); the active design: this edge's sampled cells"), ("n_prompts", I, "prompts with the approximation (N)"),
           ("estimand", S, "what the interval covers, with n and N")),
    table_schema("verified_coefficients", "several predictors as control variates (circuitstat.stats.verified.multi): "
                 "each predictor's coefficient per edge (lam in verified is their sum); one row per edge and predictor",
           _VERIFIED_METHOD, _EDGE, _EDGE_NAME,
           ("predictor", S, "the approximate method this coefficient weighs (a member of the combination)"),
           ("coefficient", F, "its coefficient, averaged over the cross-fitting folds (the mean of the held-out "
                              "coefficients over the labelled prompts)"),
           ("design", S, "the design's name, e.g. 'PPI++, 2 predictors, cross-fitted β (K = 16, leave-one-out), "
                         "shrunk across edges (m = 4)'")),
    table_schema("verified_pseudo", "pseudo-scores of a verified run (circuitstat.stats.verified.pseudo): column means are "
           "the PPI++ estimates; not per-prompt effects. One row per method and prompt",
           _VERIFIED_METHOD, ("example", I, "example index (row of the scores)"),
           ("labelled", B, "patched exactly (the stratum resampling keeps apart)"),
           ("scores", MATRIX, "(N/n)(Y - lam Yhat) on labelled prompts, (N/N_u) lam Yhat on the others, per edge")),
    table_schema("missed_edges", "circuitstat.stats.verified.MissedEdgesResult: bound on unverified edges above a threshold",
           _VERIFIED_METHOD, ("tau", F, "threshold on |mean exact effect|"), ("n_top", I, "top candidate edges verified"),
           ("n_remaining", I, "edges outside the top the random sample was drawn from (R)"),
           ("n_sampled", I, "randomly sampled edges verified (r)"), ("n_unverified", I, "R - r"),
           ("sampled_above", I, "sampled edges whose interval does not exclude |effect| > tau"),
           *ci_columns("missed", "the count of unverified edges above tau", MISSED_COVERS, True),
           ("remaining_above_high", I, "upper bound on all R remaining edges above tau"),
           ("level", F, "level the bound holds at (hypergeometric and classification errors, Bonferroni)"),
           *_optional(ci_columns("mass", "the summed |mean exact effect| of the unverified edges", MASS_COVERS, True)),
           ("mass_estimate", F, "prediction of that mass (|cross-fitted estimates|, Horvitz-Thompson; biased up)",
            False, True),
           ("mass_strata", I, "approximation-rank blocks the edge sample was post-stratified into", False, True),
           ("mass_level", F, "level the mass bound holds at (on its own)", False, True),
           ("mass_method", S, "how the mass bound was made (blocks, Cantelli or t)", False, True),
           ("estimand", S, "what the bound covers")),
    table_schema("bootstrap", "circuitstat.stats.intervals.BootstrapResult: per column (edge) estimate, SE, intervals and p-values",
           _EDGE, _EDGE_NAME, ("estimate", F, "mean over rows"), ("standard_error", F, "bootstrap standard error"),
           ("bias", F, "bootstrap bias estimate"), *ci_columns("ci", "the estimate (primary method)", ROW_MEAN, False),
           ("pvalue", F, "two-sided p-value inverting the primary interval"),
           ("qvalue", F, "Benjamini-Hochberg q-value", False, True),
           ("tail_share", F, "share of sum |x - median| carried by the most extreme rows", False, True),
           ("no_tail_seen", B, "true when no few rows carry the estimate (tail_share <= 0.6); not that the "
                               "interval covers: an unseen spike is invisible. Formerly interval_reliable",
            False, True),
           *_methods(ROW_MEAN), ("bca_z0", F, "BCa bias correction", False, True),
           ("bca_acceleration", F, "BCa acceleration", False, True),
           ("degenerate", B, "the primary interval could not be computed")),
    table_schema("edge_tests", "circuitstat.stats.testing.EdgeTestResult: per-edge test statistic, p-value and FDR decision",
           _EDGE, _EDGE_NAME, ("estimate", F, "mean"), ("standard_error", F, "standard error"),
           ("statistic", F, "t or z statistic"), ("pvalue", F, "p-value"),
           ("pvalue_adjusted", F, "FDR-adjusted p-value"), ("reject", B, "rejected at the FDR level")),
    table_schema("stability", "circuitstat.stats.stability.StabilityResult: circuit stability under resampling, one row per k", _K,
           ("jaccard_mean", F, "mean pairwise Jaccard of resample circuits"), ("jaccard_sd", F, "SD of the Jaccards"),
           ("jaccard_se", F, "standard error of jaccard_mean"),
           *ci_columns("jaccard_ci", "jaccard_mean", MC_JACCARD, False), ("jaccard_pairs", I, "resample pairs compared"),
           ("jaccard_chance", F, "expected Jaccard of two random k-subsets"),
           ("jaccard_corrected", F, "(jaccard_mean - chance) / (1 - chance)"),
           ("consensus_size", I, "edges in at least the consensus threshold of resample circuits"),
           ("consensus_jaccard_mean", F, "mean Jaccard of resample circuits to the consensus"),
           ("consensus_jaccard_sd", F, "SD of those Jaccards"), ("consensus_jaccard_q05", F, "their 5% point"),
           ("consensus_jaccard_median", F, "their median"), ("consensus_jaccard_q95", F, "their 95% point"),
           ("full_data_jaccard_mean", F, "mean Jaccard of resample circuits to the full-data circuit"),
           ("full_data_jaccard_se", F, "its standard error"), ("phi", F, "Nogueira's stability Phi"),
           ("phi_variance", F, "variance of Phi"), *ci_columns("phi_ci", "phi", MC_JACCARD, False),
           ("rbo_mean", F, "mean rank-biased overlap"), ("rbo_sd", F, "its SD"), ("rbo_p", F, "RBO persistence p"),
           ("resamples_with_cutoff_ties", I, "resamples whose k-th edge is tied with one left out"),
           ("cutoff_ties_mean", F, "mean number of edges tied at the cut-off (ties broken at random)"),
           ("cutoff_ties_excluded_mean", F, "mean number of tied edges left out"),
           ("cutoff_ties_excluded_max", I, "most tied edges left out in one resample"),
           ("tie_rule", S, "how ties at the top-k cut-off were broken (circuitstat.core.topk)"),
           ("jaccard_half", F, f"estimate of {HALF_JACCARD} (the primary data-level stability)"),
           ("jaccard_half_se", F, "standard error of jaccard_half (bias-corrected bootstrap plus Monte Carlo error)"),
           *ci_columns("jaccard_half_ci", "jaccard_half", HALF_JACCARD, claimable=False),
           ("jaccard_half_mc_se", F, "Monte Carlo error of jaccard_half over its random splits"),
           ("jaccard_half_floor", F, "lower bound on J_{N/2} from the score gaps at the cut-off (NaN where not needed)"),
           ("jaccard_half_units", F, "units (examples or templates) in each half"),
           *_data_level("jaccard_data", DATA_JACCARD), ("jaccard_data_split", F, "split-half estimate"),
           ("jaccard_data_2n", F, "estimate at twice the sample size"), *_data_level("jaccard_pop", POP_JACCARD),
           *_data_level("phi_data", DATA_PHI), ("phi_data_split", F, "split-half estimate"),
           ("phi_data_2n", F, "estimate at twice the sample size")),
    table_schema("stability_inclusion", "circuitstat.stats.stability.StabilityResult: how often each edge enters the top-k circuit",
           _K, _EDGE, _EDGE_NAME, ("count", I, "resamples whose top-k circuit holds the edge"),
           ("frequency", F, "count / resamples"), ("in_consensus", B, "frequency at or above the consensus threshold")),
    table_schema("rank_correlation", "circuitstat.stats.stability.StabilityResult: rank agreement of full resampled score vectors",
           ("resample_a", I, "first resample"), ("resample_b", I, "second resample"),
           ("spearman", F, "Spearman correlation"), ("kendall", F, "Kendall tau (NaN for pairs not computed)")),
    table_schema("selection_bounds", "circuitstat.stats.stability.StabilityResult: stability-selection error bounds (half-size "
           "subsamples only)", _K, ("threshold", F, "inclusion-frequency threshold"),
           ("pfer_mb", F, "Meinshausen-Buhlmann bound on the expected false selections"),
           ("pfer_cpss", F, "Shah-Samworth bound (complementary pairs)", False, True),
           ("pfer_cpss_unimodal", F, "Shah-Samworth bound under unimodality", False, True),
           ("n_selected", I, "edges at or above the threshold")),
    table_schema("approximation_agreement", "circuitstat.stats.approximation.ApproximationResult: agreement with exact, one row",
           ("spearman", F, "Spearman of mean scores against exact"), ("kendall", F, "Kendall tau of mean scores"),
           ("slope", F, "pooled per-example regression slope"), ("r2", F, "pooled per-example R^2"),
           ("bias_mean", F, "mean error over prompts and edges"),
           ("top_k_overlap", F, "share of exact's top-k circuit in the method's top-k"), ("k", I, "k of the overlap"),
           ("tie_rule", S, "how ties at the top-k cut-off were broken (circuitstat.core.topk)"),
           ("cutoff_ties", I, "edges whose exact mean ties the k-th one"),
           ("cutoff_ties_approx", I, "edges whose approximate mean ties the k-th one")),
    table_schema("approximation_edges", "circuitstat.stats.approximation.ApproximationResult: per-edge error against exact",
           _EDGE, ("name", S, "edge name", False, True), ("exact_mean", F, "mean exact effect"),
           ("approx_mean", F, "mean approximate score"), ("bias", F, "mean of approx - exact"),
           ("error_sd", F, "SD over prompts of approx - exact"), ("slope", F, "regression slope of approx on exact"),
           ("intercept", F, "regression intercept"), ("r2", F, "per-example R^2")),
    table_schema("variance_estimates", "circuitstat.stats.variance.VarianceComponentsResult: per-edge components with intervals",
           _EDGE, _EDGE_NAME, ("component", S, "factor, interaction or residual"),
           ("variance", F, "ANOVA estimate"), ("standard_error", F, "normal-theory standard error"),
           *ci_columns("ci", "variance", COMPONENT, False), ("df_satterthwaite", F, "Satterthwaite degrees of freedom"),
           ("share", F, "component / total"), ("negative_estimate", B, "the raw estimate was negative")),
    table_schema("variance_ems", "circuitstat.stats.variance.VarianceComponentsResult: expected-mean-square coefficients",
           ("term", S, "mean square"), ("component", S, "variance component"), ("coefficient", F, "its coefficient")),
    table_schema("icc", "circuitstat.stats.variance.ICCResult: the six ICCs per edge with F tests and intervals",
           _EDGE, _EDGE_NAME, ("type", S, "ICC1 ... ICC3k"), ("label", S, "Shrout-Fleiss / McGraw-Wong label"),
           ("icc", F, "intraclass correlation"), ("F", F, "F statistic"), ("df1", F, "numerator df"),
           ("df2", F, "denominator df"), ("pvalue", F, "p-value of the F test"), *ci_columns("ci", "icc", ICC_COVERS, False)),
    table_schema("faithfulness_intervals", "circuitstat.stats.faithfulness.FaithfulnessInterval: faithfulness per circuit with "
           "its interval", ("circuit", I, "circuit index"), ("k", I, "circuit size", False, True),
           ("label", S, "circuit label", False, True), ("estimate", F, "faithfulness (ratio of means)"),
           ("standard_error", F, "standard error"), *ci_columns("ci", "estimate (primary method)", ROW_ESTIMAND, False),
           *_optional(tuple(c for m in INTERVAL_METHODS for c in ci_columns(f"ci_{m}", f"estimate by {m}", ROW_ESTIMAND,
                                                                      False))),
           ("fold_circuit_jaccard", F, "mean Jaccard between circuits selected on different folds", False, True),
           ("t_df", I, "degrees of freedom of the corrected t", False, True),
           ("f_in_sample", F, "in-sample faithfulness of the selected circuit", False, True),
           ("distinct_circuits", I, "distinct circuits selected over resamples", False, True),
           ("evaluated_circuit_rows", I, "(example, circuit) rows the model evaluated", False, True),
           ("cost_vs_fixed", F, "evaluated rows / the fixed circuit's rows", False, True),
           ("scheme", S, "fixed circuit, crossfit or reselect"), ("interval_method", S, "primary interval method"),
           ("estimand", S, "what the interval covers"), ("n", I, "prompts"), ("n_resamples", I, "resamples drawn"),
           ("n_undefined_resamples", I, "resamples left out: m(M) ~ m(empty)")),
    table_schema("faithfulness_circuits", "circuitstat.circuits.faithfulness.FaithfulnessResult: faithfulness of each circuit",
           ("circuit", I, "circuit index"), ("label", S, "circuit label"), ("k", I, "grid size (-1: not a curve)"),
           ("n_edges", I, "edges evaluated"), ("fraction", F, "n_edges / edges of the graph (after pruning)"),
           ("x", F, "nominal size CPR and CMD integrate over: the requested fraction of all edges (MIB's "
                    "percentages) or k / edges; NaN when not a curve"),
           ("faithfulness", F, "ratio of means (m(C) - m(empty)) / (m(M) - m(empty))"),
           ("mean_per_example", F, "mean of the per-example faithfulness over defined examples"),
           ("n_defined", I, "examples whose faithfulness is defined"), ("mean_m_circuit", F, "mean m(C)"),
           ("mean_m_clean", F, "mean m(M)"), ("mean_m_empty", F, "mean m(empty)"),
           ("tie_rule", S, "how ties at the top-k cut-off were broken (circuitstat.core.topk; empty: not a top-k circuit)"),
           ("cutoff_ties", I, "edges (nodes) whose score ties the k-th one (-1: not a top-k circuit)"),
           ("cutoff_ties_excluded", I, "of those, left out by the tie rule (-1: not a top-k circuit)")),
    table_schema("faithfulness_examples", "circuitstat.circuits.faithfulness.FaithfulnessResult: per-example metrics, one row per "
           "example", ("example", I, "example index"), ("m_clean", F32, "metric of the clean run"),
           ("m_empty", F32, "metric with every edge patched"), ("undefined", B, "m(M) ~ m(empty): f undefined"),
           ("faithfulness", MATRIX, "per-example faithfulness of each circuit (NaN where undefined)"),
           ("m_circuit", MATRIX, "per-example metric of each circuit")),
    table_schema("faithfulness_areas", "circuitstat.circuits.faithfulness.FaithfulnessResult: MIB's CPR and CMD of the curve",
           ("statistic", S, "cpr or cmd"), ("ratio_of_means", F, "area under the ratio-of-means curve"),
           ("mean_per_example", F, "mean of the per-example areas"), ("n_defined", I, "examples with a defined area"),
           ("log_x", B, "integrated over log edge fraction")),
    table_schema("similarity_test", "circuitstat.stats.similarity.SimilarityResult: a similarity with its permutation null",
           ("measure", S, "similarity measure"), ("estimate", F, "similarity"), ("null_mean", F, "mean of the null"),
           *ci_columns("null", "the null distribution", NULL_COVERS, False), ("pvalue", F, "permutation p-value"),
           ("n_permutations", I, "permutations"), ("n_samples", I, "rows")),
    table_schema("similarity_null", "circuitstat.stats.similarity.SimilarityResult: the permutation null distribution",
           ("permutation", I, "permutation index"), ("value", F, "similarity with the rows of Y shuffled")),
    table_schema("head_match", "circuitstat.stats.similarity.HeadMatchResult: each head of A matched to a head of B",
           ("head", I, "head of A"), ("match", I, "matched head of B (-1: none)"), ("score", F, "matched similarity"),
           *ci_columns("ci", "score", MATCH_COVERS, False), ("null_mean", F, "matched similarity, prompts of B shuffled")),
    table_schema("head_match_layer", "circuitstat.stats.similarity.HeadMatchResult: the mean matched similarity of the layer",
           ("method", S, "max or hungarian"), ("estimate", F, "mean matched similarity"),
           *ci_columns("ci", "estimate", MATCH_COVERS, False), ("null_mean", F, "its null mean"),
           ("pvalue", F, "permutation p-value"), ("drop_bos", B, "BOS column dropped")),
    table_schema("head_match_similarity", "circuitstat.stats.similarity.HeadMatchResult: the head-by-head similarity matrix",
           ("head_a", I, "head of A"), ("head_b", I, "head of B"), ("similarity", F, "mean cosine over prompts")),
    table_schema("sample_size_widths", "circuitstat.stats.sample_size.predict_widths: each edge's interval width at n",
           ("n", I, "prompts of the full run predicted for"), _EDGE, ("name", S, "edge name"),
           ("width", F, "predicted width of the default per-edge interval at n"),
           ("width_upper", F, "upper prediction bound for the width at n at the prediction level (plan with this)"),
           ("width_upper_below_pilot", B, "width_upper < pilot_width: the bound is below the width the pilot itself "
                                          "shows, so the pilot can promise that n prompts narrow the interval; false: "
                                          "the bound plans nothing (tails the pilot cannot bound, n not far enough "
                                          "above the pilot's size, or an edge constant in the pilot): take a larger "
                                          "pilot. Not that the bound holds: informative edges are mostly those whose "
                                          "pilot drew no spike, and on spiky populations their bounds held less often "
                                          "(docs/sample-size.md). Absent in runs made before it (not assessed)",
            False, True),
           ("kurtosis", F, "the edge's kurtosis, shrunk halfway to the pooled (floor 3), times the pilot's growth factor"),
           ("calibration", F, "log-scale inflation of the bound measured inside the pilot, halves to the pilot, at the tail "
                              "level 1 - (1 - level) / (D + 1), D = max(1, log2(n / n0)) (>= 1)"),
           *ci_columns("width_pi", "the width at n", SAMPLE_WIDTH, False),
           ("q", F, "predicted |t*| quantile of the symmetric studentized bootstrap at n"),
           ("sd", F, "expected SD of the scores at n (pilot SD, bootstrap bias-corrected)"),
           ("pilot_width", F, "the pilot's own interval width"),
           ("rel_error", F, "SD of the log width prediction (jackknife of the pilot's log SD, and at n)")),
    table_schema("sample_size_stability", "circuitstat.stats.sample_size.predict_stability: expected data-level Jaccard "
           "at n: J_{n/2} (primary, the audit's jaccard_half) and J_n (extrapolated, the audit's jaccard_data)",
           ("n", I, "prompts of the full run predicted for"), _K,
           ("half_units", I, "units in each of the audit's two disjoint halves, floor(units / 2): prompts, or templates "
                             "under the cluster scheme (params unit; the audit's jaccard_half_units)"),
           ("jaccard_half", F, "primary: predicted J_{n/2}, the expected jaccard_half of an audit of n prompts"),
           ("jaccard_half_se", F, "its spread over bootstrap refits of the pilot (Monte Carlo part removed)"),
           ("jaccard_half_plugin", F, "the same prediction from the pilot's plain means (upper end of the bracket)"),
           *ci_columns("jaccard_half_pi", "J_{n/2}", SAMPLE_JACCARD_HALF, False),
           ("jaccard", F, "predicted J_n (extrapolated) from the model fitted to the pilot (pilot rows; means per params "
                            "means: deconvolved, or tied where means_tied)"),
           ("jaccard_se", F, "its spread over bootstrap refits of the pilot (Monte Carlo part removed)"),
           ("jaccard_plugin", F, "the same prediction from the pilot's plain means (upper end of the bracket)"),
           *ci_columns("jaccard_pi", "J_n", SAMPLE_JACCARD, False),
           ("jaccard_pilot_halves", F, "J between disjoint halves of the pilot (unbiased for J at n0/2; lower end of "
                                       "both brackets)"),
           ("jaccard_chance", F, "expected Jaccard of two random k-sets"),
           ("pilot_homogeneity_p", F, "p-value of 'every edge's mean is c' on the pilot (0 for absolute ranking, the "
                                      "mean over edges for signed; circuitstat.stats.pilot_model.homogeneity_pvalue); "
                                      "absent before the test", False, True),
           ("means_tied", B, "true when means = tested found no edge told apart (pilot_homogeneity_p > 0.05), so the "
                             "simulated population's means are all c: J is predicted from noise alone; absent before "
                             "the test", False, True),
           ("p_clear_half", F, "primary: chance the audit's J_{n/2} interval (jaccard_half_ci_low) at n is >= target "
                               "(simulated; NaN: n < 32)"),
           ("p_clear_half_se", F, "binomial Monte Carlo error of p_clear_half"),
           ("p_clear", F, "chance the J_n interval's lower end (jaccard_data_ci_low) at n is >= target (simulated; "
                          "NaN: n < 32)"),
           ("p_clear_se", F, "binomial Monte Carlo error of p_clear"), ("target", F, "the Jaccard target")),
    table_schema("sample_size_claims", "circuitstat.pipelines.runs.sample_size.simulate: the chance each claim passes on n prompts",
           ("claim", I, "claim index in the file"), ("label", S, "claim label"), ("kind", S, "claim kind"),
           ("n", I, "prompts"), ("p_pass", F, "share of simulated datasets of n on which the claim passes"),
           ("p_pass_se", F, "binomial Monte Carlo error of p_pass"), ("n_datasets", I, "simulated datasets"),
           ("note", S, "why p_pass is NaN (kind not simulated, another method, n < 32)")),
    table_schema("sample_size_cost", "circuitstat.pipelines.runs.sample_size.simulate.cost_rows: each n's attribution cost on the model",
           ("n", I, "prompts"), ("method", S, "attribution method"), ("forwards", I, "full forwards"),
           ("backwards", I, "backwards"), ("suffix_rows", I, "exact patching's suffix rows"),
           ("flops", F, "FLOPs (circuitstat.circuits.plan.method_cost)"),
           ("seconds_at_rate", F, "the FLOPs at the machine's matmul rate (a lower bound)")),
    table_schema("scores", "circuitstat.circuits.scores.ScoreMatrix: per-example scores, one row per example",
           ("example", I, "example id", False, True), ("scores", MATRIX, "scores of every edge (or node), float32")),
    table_schema("nodes", "circuitstat.circuits.scores.ScoreMatrix: the node index of node-level scores, one row per sender",
           ("index", I, "position in every score vector"), ("name", S, "sender name"), ("layer", I, "layer"),
           ("kind", S, "input, head or mlp")),
    table_schema("circuit", "circuitstat.circuits.circuit.Circuit: one row per graph edge, with its score and membership",
           ("index", I, "edge index"), ("name", S, "edge name"), ("sender", S, "sending node"),
           ("receiver", S, "receiving node"), ("kind", S, "receiver input kind"), ("sender_layer", I, "sender layer"),
           ("receiver_layer", I, "receiver layer"), ("score", F32, "score the rule ranked (NaN: none)"),
           ("in_circuit", B, "the edge is in the circuit"),
           ("tied_at_cutoff", B, "top-k rule: the edge's score ties the k-th one, so the seeded random tie "
                                 "break (circuitstat.core.topk) decided whether it is in")),
    table_schema("circuit_nodes", "circuitstat.circuits.circuit.Circuit: one row per node",
           ("name", S, "node name"), ("layer", I, "layer"), ("score", F32, "node score (NaN: none)"),
           ("in_circuit", B, "the node is in the circuit")),
)}
