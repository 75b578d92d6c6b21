"""circuitstat stats layer: resampling, intervals, tests, stability, variance, similarity.

Works on arrays and tables only (numpy/scipy/pandas/pyarrow); every estimator returns a
`circuitstat.core.results.Result` (the ground floor) with its estimate, uncertainty and `.to_table()`.

Names load lazily (PEP 562): importing one module (e.g. ``circuitstat.stats.resampling``) does not pull in scipy
through the others, so commands that only read tables start fast.
"""

from __future__ import annotations

from circuitstat.core.lazy import lazy_names

_MODULES = {
    ".intervals": ["BootstrapResult", "bootstrap_edges", "bootstrap_statistic", "intervals_from_distribution"],
    ".resampling": ["PoissonBootstrapAccumulator", "ResamplingPlan", "map_edge_chunks", "nested_bootstrap",
                    "resample_statistic", "resampled_means"],
    ".similarity": ["HeadMatchResult", "SimilarityResult", "attention_similarity", "debiased_cka",
                    "head_distinctness", "head_matching", "linear_cka", "match_heads", "procrustes_distance",
                    "rbf_cka", "similarity_test"],
    ".stability": ["StabilityResult", "chance_jaccard", "circuit_stability", "nogueira_stability",
                   "rank_biased_overlap", "selection_error_bounds", "topk_indices"],
    ".testing": ["EdgeTestResult", "adjust_pvalues", "bh_adjust", "by_adjust", "interval_test_edges",
                 "resampling_pvalue", "t_test_edges", "z_test_edges"],
    ".faithfulness": ["FaithfulnessInterval", "fixed_circuit_interval", "selection_aware_faithfulness"],
    ".calibration": ["CalibrationResult", "IntervalKind", "coverage_study"],
    ".variance": ["ICCResult", "VarianceComponentsResult", "icc", "variance_components"],
    ".token_importance": ["TokenImportanceResult", "TokenStabilityResult", "token_importance_faithfulness",
                          "token_stability"],
    ".sinks": ["SinkResult", "sink_relation", "sink_stability"],
    ".head_pairs": ["PairSimilarities", "pair_similarities", "residual_cka"],
    ".study_claims": ["StudyDesign", "claims_table"],
    ".verified": ["VerifiedResult", "verified_means", "MissedEdgesResult", "missed_edges_bound"],
    ".sample_size": ["predict_widths", "predict_stability", "clear_probability"],
    ".circuit_tests": ["CircuitTestResult", "MinimalityResult", "equivalence_test", "equivalence_tost",
                       "independence_test", "minimality_test", "sufficiency_test", "partial_necessity_test"],
}
__all__, __getattr__ = lazy_names(__name__, _MODULES)
