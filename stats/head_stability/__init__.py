"""Statistics of head stability across refits (Bali et al. 2026), as array code without torch.

Inputs are per-prompt cosines of attention patterns (``circuitstat.stats.similarity.per_prompt_cosine``),
matched similarities per ordered pair of refits, and residual-stream rows; outputs are the
stability numbers and their intervals. Two sources of uncertainty are kept apart:

* **refits** (the estimand readers care about: stability over the distribution of training
  seeds). Every refit is an anchor in turn: the layer-level statistic is the mean over ordered
  pairs of refits, a U-statistic of order 2 in the refits, and its interval is a leave-one-refit-
  out jackknife with a t quantile on K − 1 degrees of freedom (:func:`refit_jackknife`). Per head
  (heads are only identified inside one refit) the interval is a t interval over the anchor's
  K − 1 comparison refits, conditional on the anchor (:func:`comparison_t_interval`). Both need
  at least 3 refits and say how many they rest on.
* **prompts** (Monte Carlo error of one probe set): resampled through the engine in
  ``circuitstat.stats.resampling`` (:func:`prompt_resampled_similarity`); CKA is resampled by half-size
  subsamples of prompts without replacement (:func:`cka_half_sample_replicates`), because
  duplicated rows bias CKA upwards.

Also here: Fisher-z intervals and permutation tests of correlations, the importance of a head,
and excess over a null. Holm's adjustment and scalar z/t p-values are in ``circuitstat.stats.testing``.

Modules: matching (matched similarities, prompt-resampled means, distinctness, cross-layer
matches), bootstrap (the paper's bootstrap over refits and prompts), refits (the jackknife over
refits and its t intervals, the refit-level summaries), layers (layer-level derived numbers),
cka (CKA kinds and half-sample replicates), correlation (Fisher z, permutation tests),
importance (perplexity rise) and quiet (NaN means without warnings).
"""

from __future__ import annotations

from ..intervals import percentile_interval  # the one home of percentile intervals; re-exported
from .bootstrap import (all_pairs_layer_stability, anchor_head_stability, bootstrap_z_summary, pair_matrix,
                        refit_bootstrap_counts, refit_pair_weights, weighted_pair_mean)
from .cka import CKA_INTERVAL_RELIABLE, CKA_KINDS, cka_half_sample_replicates, cka_half_samples
from .correlation import fisher_interval, fisher_pvalue, permutation_correlation, pooled_fisher_z
from .importance import perplexity_rise
from .layers import layer_statistics, shuffled_layer_gap
from .matching import (cross_layer_best_match, head_distinctness_from_similarity, matched_similarity,
                       prompt_resampled_similarity)
from .quiet import quiet_nanmean
from .refits import (MIN_REFITS_FOR_INTERVAL, RefitLevel, comparison_t_interval, jackknife_summary,
                     leave_one_refit_out, ordered_pair_mean, refit_jackknife, refit_level_summaries,
                     seeds_interval_text)

__all__ = [
    "MIN_REFITS_FOR_INTERVAL",
    "seeds_interval_text",
    "matched_similarity",
    "prompt_resampled_similarity",
    "percentile_interval",
    "pair_matrix",
    "refit_bootstrap_counts",
    "anchor_head_stability",
    "all_pairs_layer_stability",
    "ordered_pair_mean",
    "leave_one_refit_out",
    "refit_jackknife",
    "comparison_t_interval",
    "layer_statistics",
    "RefitLevel",
    "refit_level_summaries",
    "refit_pair_weights",
    "weighted_pair_mean",
    "head_distinctness_from_similarity",
    "cross_layer_best_match",
    "shuffled_layer_gap",
    "cka_half_samples",
    "cka_half_sample_replicates",
    "fisher_interval",
    "permutation_correlation",
    "bootstrap_z_summary",
    "jackknife_summary",
    "pooled_fisher_z",
    "fisher_pvalue",
    "perplexity_rise",
    "quiet_nanmean",
    "CKA_KINDS",
    "CKA_INTERVAL_RELIABLE",
]
