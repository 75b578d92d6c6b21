"""The run tables of ``circuitstat tokens`` (core/schema.py merges them into the one registry): token
contribution weights, token-ablation drops, attention sinks and their stability across seeds.
"""

from __future__ import annotations

from circuitstat.core.schema_core import B, F, I, S, K_COLUMN, TableSchema, ci_columns, table_schema

__all__ = ["TOKEN_TABLES"]

# Token contribution weights and attention sinks (circuitstat.pipelines.runs.tokens.run; issue 16)
DROP = "the mean metric drop over the task's prompt distribution when the measure's top-k tokens are ablated"
DROP_DIFF = "the mean paired difference of drops between the two measures over the prompt distribution"
SINK_RATE = "the head's sink rate (share of query positions above the threshold) over the prompt distribution"
SINK_FIT = "the stated coefficient of head output norm on head sink rate across heads; prompts resampled, heads fixed"
TOKEN_SEEDS = "the expected top-k token Jaccard between two training seeds (jackknife over seeds; prompts fixed)"
SINK_SEEDS = "the mean over the distribution of training seeds (t interval over seeds)"
SINK_MATCHED = ("the mean over ordered pairs of training seeds, i.e. over the distribution of training seeds (jackknife "
                "over seeds, t on K-1 df; prompts fixed)")
_MEASURE_WEIGHT = "importance of the token at the read-out position by the {} measure (circuitstat.circuits.contributions)"
TOKEN_TABLES: tuple[TableSchema, ...] = (
    table_schema("token_weights", "per-token importance at each prompt's read-out position, one row per prompt and token",
           ("prompt", I, "prompt index in the task"), ("position", I, "token position"), ("token", I, "token id"),
           ("is_readout", B, "the token where the metric is read"), ("candidate", B, "whether the token may be ablated"),
           *((m, F, _MEASURE_WEIGHT.format(m), False, True)
             for m in ("attention", "value_norm", "contribution", "grad_input"))),
    table_schema("token_drops", "per-prompt metric drop when the top-k tokens of a measure are ablated",
           ("prompt", I, "prompt index in the task"),
           ("measure", S, "importance measure, or random (mean over the random orders)"), K_COLUMN,
           ("drop", F, "metric(clean) - metric(top-k tokens ablated)"),
           ("n_ablated", I, "tokens ablated (k, or all candidates when a prompt has fewer)")),
    table_schema("token_importance", "token-importance faithfulness: mean metric drop per measure and k",
           ("measure", S, "importance measure (random: the null)"), K_COLUMN, ("n", I, "number of prompts"),
           ("mean_drop", F, "mean metric drop over prompts", True),
           ("standard_error", F, "bootstrap standard error of mean_drop"),
           *ci_columns("ci", "mean_drop", DROP), ("pvalue", F, "two-sided p-value of zero drop, inverting the interval"),
           ("tail_share", F, "share of sum |x - median| carried by the ceil(sqrt N) most extreme prompts"),
           ("interval_reliable", B, "false when tail_share > 0.6: a few prompts carry the estimate"),
           ("interval", S, "interval method"), ("estimand", S, "what the interval covers")),
    table_schema("token_importance_diffs", "paired differences of mean drops between measures, one row per pair and k",
           ("measure_a", S, "first measure"), ("measure_b", S, "second measure"), K_COLUMN,
           ("difference", F, "mean over prompts of drop_a - drop_b", True),
           ("standard_error", F, "bootstrap standard error of the difference"),
           *ci_columns("ci", "difference", DROP_DIFF), ("pvalue", F, "two-sided p-value of zero difference, inverting the interval"),
           ("pvalue_holm", F, "Holm-adjusted p-value over every pair and k"),
           ("verdict", S, "'a > b', 'a < b' or inconclusive (Holm, family-wise alpha)"),
           ("interval_reliable", B, "false when a few prompts carry the difference"),
           ("multiplicity", S, "the multiple-comparison rule of the verdicts"), ("estimand", S, "what the interval covers")),
    table_schema("sink_prompts", "per prompt and head: sink share, mean output norm and confidence gap",
           ("prompt", I, "prompt index"), ("layer", I, "layer"), ("head", I, "head"),
           ("sink_share", F, "share of query positions attending to the sink token above the threshold"),
           ("output_norm", F, "mean norm of the head's output over the same positions"),
           ("confidence_gap", F, "mean sink attention at low- minus high-confidence positions")),
    table_schema("sink_heads", "attention sinks: per-head sink rate, output norm and confidence gap with intervals",
           ("layer", I, "layer"), ("head", I, "head"), ("node", S, "head node name a{L}.h{H}"),
           ("sink_rate", F, "mean over prompts of the share of positions attending to the sink above the threshold",
            True),
           *ci_columns("ci", "sink_rate", SINK_RATE), ("output_norm", F, "mean head output norm", True),
           *ci_columns("norm_ci", "output_norm", "the head's mean output norm over the prompt distribution"),
           ("confidence_gap", F, "mean sink attention at low- minus high-confidence positions"),
           *ci_columns("gap_ci", "confidence_gap", "the head's confidence gap over the prompt distribution", claimable=False),
           ("threshold", F, "sink threshold on the attention weight"), ("n", I, "number of prompts"),
           ("interval_reliable", B, "false when a few prompts carry the sink rate")),
    table_schema("sink_fit", "relation of head output norm to head sink rate across heads (quadratic and Spearman)",
           ("term", S, "intercept, slope, curvature (quadratic least squares) or spearman"),
           ("estimate", F, "the coefficient or rho", True), *ci_columns("ci", "estimate", SINK_FIT),
           ("interval", S, "interval method"), ("verdict", S, "convex/concave or increasing/decreasing or inconclusive"),
           ("estimand", S, "what the interval covers"), ("multiplicity", S, "the multiple-comparison rule of the verdicts")),
    table_schema("token_stability", "do independently trained seeds pick the same top-k tokens? one row per measure and k",
           ("measure", S, "importance measure"), K_COLUMN,
           ("jaccard", F, "mean over seed pairs and prompts of the top-k token Jaccard", True),
           *ci_columns("ci", "jaccard", TOKEN_SEEDS), ("chance", F, "expected Jaccard of two random k-subsets of the candidates"),
           ("excess", F, "jaccard minus chance", True), *ci_columns("excess_ci", "excess", TOKEN_SEEDS),
           ("n_refits", I, "number of seeds"), ("n_prompts", I, "number of prompts"),
           ("estimand", S, "what the interval covers")),
    table_schema("sink_stability", "are the sink heads and the sink-norm relation the same across seeds? one row per item",
           ("layer", I, "layer (-1: the whole model)"), ("item", S, "what is compared across seeds"),
           ("value", F, "mean over seeds", True), *ci_columns("ci", "value", SINK_SEEDS),
           ("sd", F, "standard deviation over seeds"), ("min", F, "smallest seed value"), ("max", F, "largest seed value"),
           ("n_refits", I, "number of seeds"), ("estimand", S, "what the interval covers")),
    table_schema("sink_matching", "are the sink heads the same heads across seeds? heads matched within each layer by "
           "attention pattern (as in the head study); one row per layer and item, against a random one-to-one matching",
           ("layer", I, "layer (-1: all layers pooled)"),
           ("item", S, "sink-head Jaccard, share of sink heads matched to a sink, or mean |sink-rate difference| of "
                       "matched heads"),
           ("value", F, "mean over ordered seed pairs where the item is defined", True), *ci_columns("ci", "value", SINK_MATCHED),
           ("null", F, "exact expectation of the item under a uniformly random one-to-one matching of the layer's heads"),
           ("excess", F, "value - null (null - value for the rate difference): positive = more alike than chance", True),
           *ci_columns("excess_ci", "excess", SINK_MATCHED),
           ("verdict", S, "stable (excess interval above 0), less than chance (below 0), inconclusive, or undefined "
                          "(no interval); each row from its own interval, not adjusted for multiplicity"),
           ("n_refits", I, "number of seeds"), ("n_pairs", I, "ordered seed pairs where the item is defined"),
           ("n_pairs_undefined", I, "ordered seed pairs left out: no sink head in either seed (Jaccard) or in the "
                                    "first seed (share)"),
           ("sink_bar", F, "sink rate at or above which a head is a sink head"),
           ("matching", S, "how heads were matched across seeds"), ("estimand", S, "what the interval covers")),
)
