"""circuitstat stats layer: resampling, intervals, tests, stability, variance, similarity.

Works on arrays and tables only (numpy/scipy/pandas/pyarrow); every estimator returns a
`stats.results.Result` with its estimate, uncertainty and `.to_table()`.
"""

from .intervals import (BootstrapResult, bootstrap_edges, bootstrap_statistic,
                        intervals_from_distribution)
from .resampling import (PoissonBootstrapAccumulator, ResamplingPlan, map_edge_chunks,
                         resample_statistic, resampled_means, spawn_seeds)
from .results import ConfidenceInterval, Result
from .similarity import (HeadMatchResult, SimilarityResult, attention_similarity, debiased_cka,
                         head_distinctness, head_matching, linear_cka, match_heads,
                         procrustes_distance, rbf_cka, similarity_test)
from .stability import (StabilityResult, chance_jaccard, circuit_stability, nogueira_stability,
                        rank_biased_overlap, selection_error_bounds, topk_indices)
from .testing import (EdgeTestResult, adjust_pvalues, bh_adjust, by_adjust, resampling_pvalue,
                      t_test_edges, z_test_edges)
from .variance import ICCResult, VarianceComponentsResult, icc, variance_components

__all__ = [
    "BootstrapResult", "ConfidenceInterval", "EdgeTestResult", "HeadMatchResult", "ICCResult",
    "PoissonBootstrapAccumulator", "ResamplingPlan", "Result", "SimilarityResult",
    "StabilityResult", "VarianceComponentsResult", "adjust_pvalues", "attention_similarity",
    "bh_adjust", "bootstrap_edges", "bootstrap_statistic", "by_adjust", "chance_jaccard",
    "circuit_stability", "debiased_cka", "head_distinctness", "head_matching", "icc",
    "intervals_from_distribution", "linear_cka", "map_edge_chunks", "match_heads",
    "nogueira_stability", "procrustes_distance", "rank_biased_overlap", "rbf_cka",
    "resample_statistic", "resampled_means", "resampling_pvalue", "selection_error_bounds",
    "similarity_test", "spawn_seeds", "t_test_edges", "topk_indices", "variance_components",
    "z_test_edges",
]
