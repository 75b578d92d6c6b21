"""Claims checks: published findings stated as testable bounds, checked against an audit's run.

A claims file (YAML)::

    run: runs/zoo              # optional: a finished audit's run directory (relative to this file)
    spec: audit-zoo.yaml       # optional: the audit spec; used to run the audit when the run is missing
    claims:
      - kind: circuit_stability
        name: stable-top-20
        description: mean pairwise Jaccard of the top-20 circuit under resampling is at least 0.8
        method: exact
        k: 20
        statistic: jaccard_mean
        min: 0.8

Claim kinds (every one takes an optional ``name`` and ``description``; bounds are ``min`` and/or
``max``, both inclusive). The statistics a kind accepts are the columns its table marks claimable
in core/schema.py, the one schema of run tables (each kind names its tables once, as its model's ``TABLES``;
the registry is :mod:`circuitstat.pipelines.claims.kinds`):

* ``edge_in_circuit``: ``edge``, ``method``, ``k``, ``min_inclusion`` — the edge's inclusion
  frequency in the top-k circuit over resamples (0 when it never entered it).
* ``circuit_stability``: ``method``, ``k``, ``statistic`` (jaccard_mean, jaccard_corrected, phi,
  consensus_jaccard_mean, or the data-level jaccard_data[_ci_low/_ci_high], jaccard_pop[_ci_low/_ci_high],
  phi_data[_ci_low/_ci_high]), bounds. The Monte Carlo jaccard_ci_low / phi_ci_low are not claimable.
* ``faithfulness``: ``method``, ``k``, ``statistic`` (f_ratio, f_mean, f_ci_low, f_ci_high of the
  fixed circuit; f_selected[_ci_low/_ci_high] with selection included (cross-fitted: the procedure at N,
  averaged over refits); f_conditional[_ci_low/_ci_high] of a mask-learned method's reported circuit (fitted on
  half the prompts, Fieller on the other half); or cpr, cmd, which need no ``k``), bounds.
* ``edge_effect``: ``edge``, ``method``, ``sign`` (positive, negative, nonzero), ``max_q``
  (Benjamini-Hochberg q-value of the edge's effect), ``estimand`` (mean, the default; median or
  trimmed_mean: the effect on a typical prompt, from edge_stats' median* / trimmed_mean* columns, which a
  few prompts cannot move, so they are not refused where the mean's interval is flagged unreliable); optional
  ``min_abs``, an effect size: the interval's end nearer 0, in the claimed direction, must be at least
  ``min_abs`` in size (``min_abs_of: estimate`` reads |estimate| instead). Sign and q alone let a claim pass on
  random weights (issue 47: estimate -4.6e-7, q = 0.013).
* ``head_stability``: ``layer`` and ``head`` (or ``head: "1.5"``), ``statistic`` (stability,
  ci_low, ci_high, distinctness, excess[_ci_low/_ci_high] over the null, refit_ci_low/high), bounds;
  optional ``match``/``pairs`` when the run has several.
* ``layer_stability``: ``layer``, ``statistic`` (stability, ci_low, ci_high, stability_all_anchors,
  excess[_ci_low/_ci_high], refit_ci_low/high), bounds.
* ``approximation``: ``method`` (an approximation of exact), ``statistic`` (spearman, kendall,
  r2, slope, top_k_overlap, bias_mean), bounds; optional ``k`` (the top-k of top_k_overlap).
* ``verified_edge`` (a verified run, spec key ``verify``): ``edge``, ``method`` (the approximation verified, or
  several verified together by ``verify.combine``, joined by "+": ``eap+atp-qkfix``), ``statistic`` (estimate,
  ci_low, ci_high of the mean exact effect, or qvalue), bounds.
* ``missed_edges`` (a verified run with ``verify.edges``): ``method``, ``statistic`` (default
  ``missed_high``: the bound on unverified edges whose mean exact effect exceeds ``verify.tau``; or ``mass_high``,
  the approximate bound on their summed |mean exact effect|), bounds.
* ``published_circuit`` (an audit with spec key ``circuit``; docs/mib.md): ``method``, ``statistic`` (f_ratio,
  f_ci_low/high -- Fieller's set, with -inf/inf ends and the reason quoted when the full model's effect over the
  empty circuit is not distinguishable from 0 --, cpr, cmd and their intervals, n_unsupported, share_unsupported, inclusion_mean, inclusion_min,
  topk_jaccard), bounds.
* ``published_edge`` (the same audit): ``edge`` (an edge of the published circuit), ``method``, ``statistic`` (q, the
  edge's BH q-value; ci_low, ci_high of its mean effect -- edge_stats' own, refused where no_tail_seen is false --;
  or inclusion, how often it enters the top-k circuits of the circuit's size over resamples), bounds.

Kinds answered by a ``circuitstat tokens`` run (token contributions and attention sinks); in a
cross-seed run (several ``--model``) each model's tables sit under ``model-<i>/`` and the claim
names it with ``model: i``:

* ``sink``: ``head`` (``a1.h3``, ``"1.3"`` or ``layer`` and ``head``), ``statistic`` (default
  ``ci_low``: "a sink with rate >= min" holds only when the interval's lower end does; or sink_rate,
  ci_high, output_norm, norm_ci_low/high), bounds.
* ``token_importance``: ``measure_a``, ``measure_b``, ``k`` — holds when the Holm verdict of the
  paired drop difference says ``measure_a > measure_b`` (read from either orientation of the pair).
* ``token_drop``: ``measure``, ``k``, ``statistic`` (default ``ci_low``; mean_drop, ci_high), bounds.
* ``sink_stability`` (cross-seed run, no ``model``): ``layer`` (-1: the whole model), ``item`` as
  the table names it (e.g. ``rank 1 sink rate``, ``heads with sink rate >= 0.3``), ``statistic``
  (default ``ci_low``; value, ci_high), bounds. Intervals cover the mean over training seeds. An item
  of ``sink_matching`` (sink heads matched across seeds by attention pattern, e.g. ``sink-head
  Jaccard``; layer -1: all layers pooled) is claimed the same way, also on ``excess`` and
  ``excess_ci_low/high`` (above a random matching: a stability claim is about excess).
* ``token_stability`` (cross-seed run): ``measure``, ``k``, ``statistic`` (default
  ``excess_ci_low``, agreement above chance; jaccard[_ci_low/_ci_high], excess[_ci_high]), bounds.

A bound on an interval (``ci_low``/``ci_high``), or a verdict, whose row shows a few prompts carrying the
estimate is refused with an error: the interval cannot back the claim. The flag is ``no_tail_seen = false``
in the per-edge mean tables (edge_stats, verified; runs written before it was renamed call it
``interval_reliable`` and are read the same) and ``interval_reliable = false`` in the sink and token tables.
``no_tail_seen = true`` lets a claim through but does not mean the interval covers: a spike absent from the
sample is invisible (docs/calibration.md). The check is :func:`~circuitstat.pipelines.claims.reader.require_no_tail_seen`
(its old name ``require_reliable`` still imports).

A claims file is bound to its run: the audit records the spec it was asked to run (portable: local files by
name and sha256; :mod:`~circuitstat.pipelines.claims.binding`) in the manifest's provenance, and when the file
names a ``spec:`` that did not make the run, ``check`` is exit 2 naming both and each key that differs. A run
that records no binding (older, or synthetic) and a claims file without ``spec:`` are checked with a note.

:func:`check` evaluates every claim against the run (running the audit via
:func:`circuitstat.pipelines.runs.audit.run.run_audit` when the run is missing or lacks what the claims need and a spec
is given) and returns a :class:`CheckReport`: per claim a status (pass, fail, error), the observed
value(s), the bound and a reason. Exit codes of ``circuitstat check``: 0 all hold, 1 any fails,
2 an error (bad file, no run, a claim the run cannot answer: the reason names what the audit must
include).

Modules: ``kinds`` (the registry: one :class:`~circuitstat.pipelines.claims.kinds.ClaimKind` entry per kind,
carrying its model, evaluator, ``requires(claim, spec)`` and hint), ``models`` (one pydantic model per kind, each
naming its tables once), ``claimsfile`` (the ``Claim`` union and ``ClaimsFile``, built from the registry),
``requirements`` (what an audit must compute for each kind: the preflight), ``parsing`` (reading and validating a
file), ``reader`` (a run's tables), ``bounds``, ``evaluators`` (one function per kind), ``evaluation``
(ClaimResult, evaluate_claims), ``checking`` (check, spec_problem) and ``output`` (text table, JUnit XML). A new
kind is one module (its model and evaluator) and one entry in the registry.
"""

from __future__ import annotations

from ..yamlio import read_yaml_strict
from .checking import CheckReport, check, claim_sizes, default_run_dir, preflight, spec_problem
from .claimsfile import Claim, ClaimsFile
from .evaluation import ClaimResult, evaluate_claims
from .kinds import CLAIM_KINDS, KINDS, TOKEN_KINDS, ClaimKind
from .models import (
    ApproximationClaim,
    CircuitStabilityClaim,
    EdgeEffectClaim,
    EdgeInCircuitClaim,
    FaithfulnessClaim,
    HeadStabilityClaim,
    LayerStabilityClaim,
    SinkClaim,
    SinkStabilityClaim,
    TokenDropClaim,
    TokenImportanceClaim,
    TokenStabilityClaim,
)
from .output import format_results, junit_xml, record_check, write_claims_table, write_junit
from .parsing import load_claims, parse_claims

__all__ = [
    "CLAIM_KINDS",
    "KINDS",
    "TOKEN_KINDS",
    "ApproximationClaim",
    "CheckReport",
    "CircuitStabilityClaim",
    "Claim",
    "ClaimKind",
    "ClaimResult",
    "ClaimsFile",
    "EdgeEffectClaim",
    "EdgeInCircuitClaim",
    "FaithfulnessClaim",
    "HeadStabilityClaim",
    "LayerStabilityClaim",
    "SinkClaim",
    "SinkStabilityClaim",
    "TokenDropClaim",
    "TokenImportanceClaim",
    "TokenStabilityClaim",
    "check",
    "claim_sizes",
    "default_run_dir",
    "evaluate_claims",
    "format_results",
    "junit_xml",
    "load_claims",
    "parse_claims",
    "preflight",
    "read_yaml_strict",
    "record_check",
    "spec_problem",
    "write_claims_table",
    "write_junit",
]
