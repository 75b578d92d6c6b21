"""The attribution methods, one record each: every entry point (attribution, plan, options, CLI, spec) reads them here.

Torch-free (and pydantic-free): the command line builds its choices from this module without loading either.
A record says what a method is (its family, the levels and ablations it accepts, whether it takes IG steps),
where its algorithm lives (a dotted path, imported only when the method runs) and what passes it makes per
example (per step for the mask fits), from which circuitstat.circuits.plan prices its FLOPs and
circuitstat.pipelines.plan its time.

Adding a method: its algorithm file (a batch scorer ``score(model, data, batch, cf, job) -> [B, columns]``,
see circuitstat.circuits.attribution.BatchJob), one ``Method`` entry below, and an options class where it has
options of its own (docs/design.md, "Adding a method").
"""

from __future__ import annotations

import importlib

from circuitstat.core.errors import InputError
from dataclasses import dataclass, field

__all__ = ["Method", "Passes", "METHOD_RECORDS", "ABLATIONS", "METHODS", "MASK_METHODS", "ATP_METHODS",
           "ENSEMBLE_MEMBERS", "LEVELS", "method", "methods_for", "not_effects", "count", "runner"]

LEVELS = ("edge", "node")
ABLATIONS = ("counterfactual", "mean", "mean-positional", "zero", "resample")  # circuitstat.circuits.ablation computes them
SYMBOLS = ("steps", "groups", "layers", "runs", "backwards", "draws")


def count(expr: str, **symbols: int) -> int:
    """The integer a pass count means: a product of integers and SYMBOLS ("steps*groups"), given their values."""
    total = 1
    for factor in expr.split("*"):
        factor = factor.strip()
        total *= int(factor) if factor.isdigit() else int(symbols[factor])
    return total


@dataclass(frozen=True)
class Passes:
    """What a method runs per example (mask methods: per step of a fit), as counts over SYMBOLS.

    ``steps``: its IG steps; ``groups``: EAP-IG-activations' sender groups (the input, each layer's heads, each
    MLP); ``layers``: the model's layers; ``runs``: its gradient runs; ``backwards``: its backwards;
    ``draws``: UGS's masks per prompt and step."""

    forwards: int = 1  # plain forwards, the counterfactual's included (mask fits: per fit, before the steps)
    runs: str = "1"  # gradient runs (forward with receiver probes + backward); mask fits: masked runs per step
    backwards: str = "runs"  # AtP*'s GradDrop: one backward per dropped layer through one forward
    contractions: str = "1"  # edge contractions Σ_pos Δz_u · g_v (additive writes)
    contractions_post_norm: str = "1"  # on post-norm models (each gradient run with its own linearised writes)
    intervened: bool = False  # gradient runs with a sender intervention (IG's interpolated runs)
    grad_buffers: int = 2  # receiver-gradient buffers held at the peak: 1, or 2 with a running sum
    qk_fix: bool = False  # AtP*'s QK fix (circuitstat.circuits.plan.qk_fix_flops)
    suffix: bool = False  # exact patching: suffix rows per (example, upstream sender), priced by its own rule


@dataclass(frozen=True)
class Method:
    """One attribution method: what it is, what it accepts, where its algorithm lives and what it costs."""

    name: str
    family: str  # "score": per-example scores [N, E]; "mask": one learned mask logit per edge per fit
    runner: str  # "module:function": the batch scorer, or for a mask method its fit and gates ("module:fit,gates")
    passes: Passes = field(default_factory=Passes)
    levels: tuple[str, ...] = ("edge", "node")
    ablations: tuple[str, ...] = ABLATIONS
    ig_steps: bool = False  # its scores depend on ig_steps
    members: tuple[str, ...] = ()  # an ensemble: the methods whose per-example scores it averages
    counterfactual: bool = True  # it reads the ablation's sender outputs (False: its scorer gets cf=None, none computed)
    # its scores estimate each edge's effect on the metric (False: a score of another kind, which the audit's and the
    # studies' intervals, labelled as covering an edge's mean effect, would mislabel)
    effect: bool = True
    additive_only: bool = False  # defined only where every sender's write is additive (not on post-norm models)
    draws_option: str = ""  # a mask method: the option giving its masks per prompt and step (its Passes' "draws")
    summary: str = ""
    reference: str = ""

    def __post_init__(self) -> None:
        if self.family not in ("score", "mask"):
            raise ValueError(f"method {self.name!r}: family must be 'score' or 'mask', got {self.family!r}")
        for expr in (self.passes.runs, self.passes.backwards, self.passes.contractions,
                     self.passes.contractions_post_norm):
            bad = [f for f in expr.split("*") if not f.strip().isdigit() and f.strip() not in SYMBOLS]
            if bad:
                raise ValueError(f"method {self.name!r}: unknown pass count factor(s) {bad}; use integers and {SYMBOLS}")


_GRADIENT = "circuitstat.circuits.attribution:score_gradient"
_ATP = "circuitstat.circuits.atpstar:score_atp"
_ATP_NOTE = "edge level only: GradDrop sums absolute values per edge, so a node's score is not its out-edges' sum"

# Every number in a Passes entry is asserted against the real run's counted passes and torch's FlopCounter
# (tests/circuits/test_plan_measured.py) for every registered score method.
METHOD_RECORDS: tuple[Method, ...] = (
    Method("exact", "score", "circuitstat.circuits.attribution:score_exact", Passes(forwards=2, runs="0", suffix=True),
           summary="exact activation patching (CMA): one suffix forward per (example, edge)"),
    Method("eap", "score", _GRADIENT, Passes(forwards=1, runs="1", grad_buffers=1),
           summary="edge attribution patching: Σ_pos Δz_u · ∂m/∂in_v at the clean input", reference="Syed et al. 2023"),
    Method("eap-ig-inputs", "score", _GRADIENT,
           Passes(forwards=2, runs="steps", contractions_post_norm="runs", intervened=True), ig_steps=True,
           summary="EAP with integrated gradients along the input embeddings", reference="Hanna et al. 2024"),
    Method("eap-ig-activations", "score", _GRADIENT,
           Passes(forwards=2, runs="steps*groups", contractions="groups", contractions_post_norm="runs",
                  intervened=True), ig_steps=True,
           summary="EAP with integrated gradients along each sender group's outputs", reference="Hanna et al. 2024"),
    Method("clean-corrupted", "score", _GRADIENT, Passes(forwards=1, runs="2", contractions_post_norm="runs"),
           ablations=("counterfactual",),
           summary="EAP with the mean of the gradients at the clean and the corrupted input",
           reference="Hanna et al. 2024 (EAP-IG library)"),
    Method("atp-qkfix", "score", _ATP, Passes(forwards=1, runs="1", contractions="backwards",
                                               contractions_post_norm="backwards", qk_fix=True),
           levels=("edge",), summary="AtP with the QK fix; " + _ATP_NOTE, reference="Kramár et al. 2024"),
    Method("atp-graddrop", "score", _ATP, Passes(forwards=1, runs="1", backwards="layers", contractions="backwards",
                                                  contractions_post_norm="backwards"),
           levels=("edge",), summary="AtP with GradDrop; " + _ATP_NOTE, reference="Kramár et al. 2024"),
    Method("atpstar", "score", _ATP, Passes(forwards=1, runs="1", backwards="layers", contractions="backwards",
                                             contractions_post_norm="backwards", qk_fix=True),
           levels=("edge",), summary="AtP* (QK fix and GradDrop); " + _ATP_NOTE, reference="Kramár et al. 2024"),
    # The ensemble's per-example score is its members' plain mean (the parallel ensemble of Mondorf et al. 2025). No
    # rescaling before averaging: all three are first-order estimates of one quantity, the change of the same metric
    # when the edge is patched, in the metric's units, so a per-method normalisation (z-score, min-max) would only
    # reweight them by their spread on this dataset (and make a row's score depend on the other rows).
    Method("ensemble", "score", "circuitstat.circuits.attribution:score_ensemble",
           members=("eap", "eap-ig-inputs", "eap-ig-activations"), ig_steps=True,
           summary="the plain mean of its members' per-example scores",
           reference="Mondorf et al. 2025, arXiv:2510.06811"),
    Method("information-flow-routes", "score", "circuitstat.circuits.flow_routes:score_flow_routes",
           Passes(forwards=1, runs="0", contractions="0", contractions_post_norm="0", grad_buffers=1),
           levels=("edge",), ablations=("counterfactual",), counterfactual=False, additive_only=True, effect=False,
           summary="each sender's share of its receiver's input by L1 proximity, averaged over positions (one clean "
                   "forward; no metric, gradient or counterfactual)",
           reference="Ferrando & Voita 2024, arXiv:2403.00824; EAP-IG library's get_scores_information_flow_routes"),
    Method("edge-pruning", "mask", "circuitstat.circuits.edge_pruning:fit_edge_pruning,gates",
           Passes(forwards=3, runs="draws", grad_buffers=1), levels=("edge",),
           summary="a learned hard-concrete edge mask", reference="Bhaskar et al. 2024"),
    Method("ugs", "mask", "circuitstat.circuits.ugs:fit_ugs,ugs_gates",
           Passes(forwards=3, runs="draws", grad_buffers=1), levels=("edge",), draws_option="n_samples",
           summary="uniform gradient sampling of an edge mask", reference="circuitstat.circuits.ugs"),
)

_BY_NAME = {m.name: m for m in METHOD_RECORDS}
METHODS = tuple(m.name for m in METHOD_RECORDS if m.family == "score")  # attribute()'s methods (per-example scores)
MASK_METHODS = tuple(m.name for m in METHOD_RECORDS if m.family == "mask")
ATP_METHODS = tuple(m.name for m in METHOD_RECORDS if m.runner == _ATP)
ENSEMBLE_MEMBERS = _BY_NAME["ensemble"].members


def method(name: str) -> Method:
    """The record of method ``name``; InputError naming the known methods when there is none."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise InputError(f"unknown method {name!r}; use one of {', '.join(_BY_NAME)}") from None


def not_effects(names) -> str:
    """An error message when some of ``names`` score something other than an edge's effect, else ''."""
    bad = [n for n in names if n in _BY_NAME and not _BY_NAME[n].effect]
    if not bad:
        return ""
    what = "; ".join(f"{n}: {_BY_NAME[n].summary}" for n in bad)
    return (f"{', '.join(bad)} do not estimate edges' effects ({what}), and this run's intervals, q-values and verdict "
            "are about effects; score them with `circuitstat attribute --method NAME`")


def methods_for(cfg) -> tuple[str, ...]:
    """The score methods defined on a model of config ``cfg`` (one defined on additive writes only is left out of a
    post-norm model's)."""
    return tuple(m for m in METHODS if cfg.additive_writes or not _BY_NAME[m].additive_only)


def runner(name: str, which: int = 0):
    """The callable that runs method ``name`` (for a mask method: ``which`` 0 its fit, 1 its gates), imported now."""
    module, functions = method(name).runner.split(":")
    return getattr(importlib.import_module(module), functions.split(",")[which])
