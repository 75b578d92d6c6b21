"""Variance study: where the uncertainty of a circuit comes from.

After Méloux, Portet and Peyrard (ICML 2026, "Mechanistic Interpretability as Statistical
Estimation: A Variance Analysis"). One spec names a model (or several training seeds of it), a
task and the factors to vary; ``run_variance_study`` writes a resumable run directory with:

* ``intrinsic``: per-input variation of exact scores per edge: mean, SD, coefficient of variation,
  sign consistency, SNR (|mean| / SD), excess kurtosis and the share of the sum of squared
  deviations carried by the top 5 % of inputs, with its 99th percentile for Gaussian scores of the
  same N (``heavy_tailed`` = above it: a 1 %-level test of tail concentration).
* ``edge_stats`` / ``stability_vs_k`` / ``inclusion``: the audit's per-edge CIs and bootstrap
  circuit stability for every estimator (the *dataset sampling* factor, resampling examples).
* ``approximation`` / ``approximation_summary``: per-input error of each estimator against exact
  (bias, error SD, slope, R², rank agreement), as the audit writes them.
* ``variance_components``: per edge, the crossed random-effects decomposition
  examples × counterfactual draw × estimator (× training seed) from ``stats.variance_components``,
  with Satterthwaite CIs (normal theory, labelled so in ``interval``); ``variance_shares``: the
  shares pooled over the top edges
  (``circuitstat.stats.variance.pooled_shares``): a basic bootstrap over prompts for the terms with examples
  (robust to heavy-tailed effects), a normal-theory pivot for the terms without them
  (``interval_reliable`` False: they rest on the few levels of their factors).
* ``variance_stability``: for every factor and level, the Jaccard of that level's top-k circuit to
  the reference circuit (exact scores, mean aggregation, the full dataset, the task's own
  counterfactual, the first seed) as a function of k, with a data-level interval whose estimand
  is written in the ``estimand`` column (see below), and the old resampling spread of one dataset
  (``spread_low`` / ``spread_high``, labelled; never used for a verdict).
* ``faithfulness_vs_k`` / ``selection``: faithfulness of each estimator's circuits on a grid of k and
  the smallest k reaching the target faithfulness (selection at fixed faithfulness).
* ``variance_summary``: per factor, how much it moves the circuit at ``summary_k``, its interval,
  the spec's ``bar`` (a column) and the verdict drawn from the interval (``met`` when the interval
  lies above the bar, ``not met`` below, ``inconclusive`` across; ``meets_bar`` = met);
  ``summary``: the headline numbers with intervals and verdicts.

Factors
-------
* **dataset sampling**: bootstrap resamples of the examples (B >= 100) and ``dataset.n_fresh``
  fresh draws of the task (task seed + 1, + 2, ...: new random tokens or template fillings).
* **counterfactual choice**: ``counterfactual.n_draws`` corrupted inputs per clean input. Draw 0 is
  the task's own; for induction the others re-draw the corrupted tokens of the same clean prompts
  (``redraw``); for other tasks each clean prompt takes the corrupted prompt of another example of
  the same length and group (``shuffle``). The metric (answer vs the task's wrong answer) is held
  fixed, so only the patched-in activations change. Each draw is a copy of the task with its
  corrupted prompts replaced (``with_counterfactual``; the draws are made in ``circuitstat.circuits.counterfactuals``). With independent draws per example the
  counterfactual *main* effect (draw index) is near zero by design: the variance from the choice
  of counterfactual shows up in the examples:counterfactual interaction.
* **estimator**: exact patching, EAP, EAP-IG (inputs / activations, on a grid of steps),
  clean-corrupted.
* **aggregation**: mean (the reference), median, trimmed mean, mean |s| of the exact scores.
* **selection**: the k grid (the x axis of every stability table) and selection at fixed
  faithfulness.
* **training seed**: when the spec lists several ``models``. Edges are compared by name: heads are
  not matched across seeds (head stability across seeds is the heads audit's job), so this factor
  includes relabelling of equivalent heads.

Jaccard and intervals (computed in ``circuitstat.stats.factor_stability`` and ``circuitstat.stats.stability_data``):

* paired factors (counterfactual draw, estimator, aggregation, seed, selection): the same prompts
  scored two ways. Estimand: E over datasets of N prompts of J(level's top-k, reference's top-k),
  the level held fixed (for seeds: these trained models, not the distribution of seeds). Value:
  its bootstrap plug-in (mean over resamples); interval: double bootstrap + split extrapolation,
  bracketed (``circuitstat.stats.factor_stability.paired_jaccard``). ``jaccard_full_data`` is the full-data
  Jaccard (one draw of the quantity averaged).
* dataset, fresh draws: independent datasets. Estimand: E[J(top-k of D1, top-k of D2)] for two
  independent datasets of N prompts; interval: the data-level interval of the reference's
  ``stability_vs_k`` (``jaccard_data_ci``); the value of a draw is its observed Jaccard.
* dataset, bootstrap: E[J(top-k of a dataset of N prompts, top-k of the population)]
  (``jaccard_pop_ci``).

Below 32 examples (or with the clusters scheme) the values are computed but the intervals are
NaN with the reason in ``interval``; verdicts are then empty.

Modules: :mod:`.spec` (the spec), :mod:`.scorer` (score matrices: Key, ModelScorer), :mod:`.study`
(``run_variance_study`` and the stages), :mod:`.factors` (per-factor Jaccard, selection) and
:mod:`.summary` (the summary tables and ``summary_lines``).
"""

from circuitstat.circuits.counterfactuals import counterfactual_corruptions, with_counterfactual

from circuitstat.pipelines.runs.variance.scorer import Key, ModelScorer, Scorer
from circuitstat.pipelines.runs.variance.spec import (AGGREGATIONS, CounterfactualSpec, DatasetSpec, EstimatorsSpec, SelectionSpec, VarianceSpec,
                   load_variance_spec, parse_variance_spec)
from circuitstat.pipelines.runs.variance.study import PER_EDGE_COMPONENT_INTERVAL, check_study, run_variance_study
from circuitstat.pipelines.runs.variance.summary import MULTIPLICITY, summary_lines

__all__ = [
    "AGGREGATIONS", "with_counterfactual", "VarianceSpec", "ModelScorer", "counterfactual_corruptions",
    "load_variance_spec", "parse_variance_spec",
    "run_variance_study",
    # also public before the split (imported by name elsewhere)
    "CounterfactualSpec", "DatasetSpec", "EstimatorsSpec", "Key", "MULTIPLICITY", "PER_EDGE_COMPONENT_INTERVAL",
    "Scorer", "SelectionSpec", "check_study", "summary_lines",
]
