"""Audit specs: the one spec loader (YAML validated with pydantic; unknown keys are errors).

A minimal spec::

    model: random:gpt2?n_layer=2&n_head=4&n_embd=64&vocab_size=512
    task: {name: induction, n: 64}
    methods: [exact, eap]

Every other key has a documented default; ``models`` (several seeds of one architecture) adds
head stability across them.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, Field, ValidationError, field_validator, model_serializer, model_validator

from circuitstat.core.errors import InputError
from circuitstat.reports.thresholds import MIN_EXCESS, MIN_EXCESS_BOUNDS

from .options import ABLATION, INPUT_NODE, LEVEL, MASK_METHODS, METHOD, METRIC, MOE_NODES, OBJECTIVE, SCORE_METHOD  # noqa: F401 - defined there once; re-exported
from .options import VERIFY_DESIGN
from circuitstat.core.params import BATCH_SIZE, IG_STEPS, N_JOBS, N_RESAMPLES, SEED, VERIFY_BUDGET, tail_resamples
from .yamlio import read_yaml_strict
from .strict import StrictSpec  # noqa: F401 - the base of every spec section, defined there; re-exported
# the mask-learned methods' options, defined with the guard of which method takes which; re-exported
from .mask_options import (MASK_SECTIONS, EdgePruningOptions, EdgePruningSpec, UGSOptions, UGSSpec,  # noqa: F401
                           mask_draws, mask_spec)

DTYPE = Literal["float32", "bfloat16", "float16"]
DEVICE_PATTERN = re.compile(r"cpu|cuda(:\d+)?|mps")
RESERVED_TASK_OPTIONS = ("n", "seed", "metric", "tokenizer")
"""Task settings with their own spec key (task.n, task.seed, task.metric): never in task.options."""


_M = TypeVar("_M", bound=BaseModel)


def _k_grid(v: list[int]) -> list[int]:
    if any(k < 1 for k in v):
        raise ValueError("every k must be a positive integer")
    return sorted(set(v))


KGrid = Annotated[list[int], AfterValidator(_k_grid)]
"""Circuit sizes: positive, deduplicated and sorted."""


class RunOptions(StrictSpec):
    """How a spec runs, shared by every spec: batch size, seed, workers, device, dtype."""

    batch_size: int = BATCH_SIZE.pydantic()
    seed: int = SEED.pydantic()
    n_jobs: int = N_JOBS.pydantic()
    device: str = "cpu"
    dtype: DTYPE = "float32"

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        # availability (CUDA on this machine) is checked when the run starts, before anything is written
        if not DEVICE_PATTERN.fullmatch(v):
            raise ValueError("must be cpu, cuda, cuda:N or mps")
        return v


def no_reserved_task_options(options: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``options`` unchanged; ValueError when one of them is set by its own key (``prefix`` + key) instead."""
    clash = [k for k in RESERVED_TASK_OPTIONS if k in options]
    if clash:
        raise ValueError(f"{', '.join(clash)} cannot be an option; set {prefix}{clash[0]} instead")
    return options


class TaskSpec(StrictSpec):
    """Which task, how many examples, which metric."""

    name: str = "induction"
    n: int = Field(64, ge=2, le=1_000_000)
    seed: int = SEED.pydantic()
    metric: METRIC | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("options")
    @classmethod
    def _no_reserved(cls, v: dict[str, Any]) -> dict[str, Any]:
        return no_reserved_task_options(v, "task.")


class BootstrapSpec(StrictSpec):
    """Resampling over examples: bootstrap, cluster bootstrap over task groups, or half-splits."""

    n_resamples: int = N_RESAMPLES.pydantic("audit")
    scheme: Literal["examples", "clusters", "half-splits"] = "examples"
    confidence_level: float = Field(0.95, gt=0.5, lt=1.0)
    # None: the library's default, chosen by simulated coverage (symmetric studentized bootstrap; for the cluster
    # scheme, whose templates are not i.i.d. examples, the wild cluster bootstrap-t with CR2 SEs and G - 1 df,
    # which 'wild_cluster_t' and 'cr2_t' need). See circuitstat.stats.intervals.
    ci_method: Literal["percentile", "basic", "bca", "t", "studentized", "studentized_symmetric", "wild_cluster_t",
                       "cr2_t", "wcr"] | None = None


class HeadsSpec(StrictSpec):
    """Head stability across the spec's models (needs two or more)."""

    _renamed = {"n_boot": "n_resamples"}
    _section = "heads."

    match: Literal["max", "hungarian"] = "max"
    pairs: Literal["anchor", "all"] = "anchor"
    drop_bos: bool = False
    n_probe: int = Field(100, ge=4, le=10_000)
    n_resamples: int = N_RESAMPLES.pydantic("heads")
    # the verdict's minimum excess over the shuffled null for a head to count as stable (its interval's lower end
    # must exceed it); read by the verdict only, so changing it recomputes nothing
    min_excess: float = Field(MIN_EXCESS, ge=MIN_EXCESS_BOUNDS[0], le=MIN_EXCESS_BOUNDS[1])


class VerifyEdgesSpec(StrictSpec):
    """Verify some edges only: the top-``top`` candidates by |approximate mean| plus ``random`` of the rest."""

    _section = "verify.edges."

    top: int = Field(ge=0, le=1_000_000)
    random: int = Field(ge=1, le=1_000_000)


class VerifySpec(StrictSpec):
    """A verified run (docs/verified.md): exact patching on ``n`` uniformly random prompts (drawn from ``seed``,
    or from the run's seed and the stage's name) checks each approximate method; PPI++ intervals for the mean
    exact effect. ``edges``: verify only some edges, and bound the unverified ones above ``tau``. ``design``:
    ``uniform`` (the above) or ``active``: exact on a Poisson sample of (prompt, edge) cells, ``budget`` expected
    per edge, with probabilities from the approximation (circuitstat.stats.verified.active; docs/verified.md)."""

    _section = "verify."

    n: int = Field(16, ge=4, le=100_000)
    seed: int | None = SEED.pydantic(default=None)  # numpy's SeedSequence and torch: non-negative 63-bit
    edges: VerifyEdgesSpec | None = None
    tau: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    design: VERIFY_DESIGN = "uniform"
    budget: float | None = VERIFY_BUDGET.pydantic(default=None)
    # the q-values' multiple-testing correction over the edges: bh (Benjamini-Hochberg: FDR under independence or
    # positive dependence; the usual one) or by (Benjamini-Yekutieli: FDR under any dependence; the guaranteed one)
    correction: Literal["bh", "by"] = "bh"
    # several of the audit's approximate methods as control variates together (circuitstat.stats.verified.multi):
    # extra verified rows named "<m1>+<m2>" (pipelines.verify.combined_method); uniform design, every edge
    combine: list[Annotated[str, Field(min_length=1)]] | None = None

    @model_validator(mode="after")
    def _combine_fits(self) -> "VerifySpec":
        c = self.combine
        if c is None:
            return self
        if len(c) < 2:
            raise ValueError(f"verify.combine lists {len(c)} method{'s' if len(c) != 1 else ''}; it combines at "
                             "least 2 approximate methods as control variates (e.g. combine: [eap, atp-qkfix]): add "
                             "one or remove combine")
        if len(set(c)) != len(c):
            raise ValueError(f"verify.combine lists a method more than once ({c}); list each once")
        if self.design != "uniform":
            raise ValueError("verify.combine needs the uniform design: the active design verifies one predictor per "
                             "method (its cells are drawn from that method's scores); remove combine or design: active")
        if self.edges is not None:
            raise ValueError("verify.combine verifies every edge: with verify.edges (the missed-edges mode) each "
                             "method draws its own edges, so no one set of edges has every predictor's exact cells; "
                             "remove edges and tau, or combine")
        # leave-one-out folds fit one coefficient per method and a mean on the other n - 1 prompts (multi.py)
        if self.n < len(c) + 3:
            raise ValueError(f"verify.combine of {len(c)} methods fits {len(c)} coefficients per edge on n - 1 "
                             f"verified prompts: use verify.n >= {len(c) + 3} or combine fewer methods")
        return self

    @model_validator(mode="after")
    def _active_design(self) -> "VerifySpec":
        if self.design == "uniform":
            if self.budget is not None:
                raise ValueError("verify.budget is the active design's expected exact cells per edge; add "
                                 "design: active or remove budget")
            return self
        if self.budget is None:
            raise ValueError("verify.design: active needs verify.budget, the expected exact (prompt, edge) cells per "
                             "edge (e.g. budget: 51 for a tenth of 512 prompts)")
        if "n" in self.model_fields_set:
            raise ValueError("verify.n is the uniform design's prompt count; the active design spends verify.budget "
                             "cells per edge instead: remove n")
        if self.edges is not None:
            raise ValueError("verify.edges (and its missed-edges bound) needs the uniform design: the active design "
                             "samples cells on every edge; remove edges and tau, or use design: uniform")
        return self

    @model_serializer(mode="wrap")
    def _uniform_as_before(self, handler):
        """The record of a uniform design without design and budget (runs recorded before the active design existed
        keep their recorded spec and stage parameters, so they resume); of an active one without the uniform
        design's n, edges and tau (the record reads back as the same spec)."""
        out = handler(self)
        if isinstance(out, dict):
            for key in (("design", "budget") if self.design == "uniform" else ("n", "edges", "tau")):
                out.pop(key, None)
            if self.correction == "bh":  # the default, as recorded before the key existed
                out.pop("correction", None)
            if self.combine is None:  # recorded only when set: runs without it keep their records
                out.pop("combine", None)
        return out

    @model_validator(mode="after")
    def _tau_with_edges(self) -> "VerifySpec":
        if self.edges is not None and self.tau is None:
            raise ValueError("verify.edges needs verify.tau: the threshold on |mean exact effect| the missed-edges "
                             "bound counts")
        if self.edges is None and self.tau is not None:
            raise ValueError("verify.tau bounds unverified edges; without verify.edges every edge is verified: "
                             "remove tau or give edges: {top: m, random: r}")
        return self


#: how check_verify names what the user set: a spec's keys, or the command line's flags (attribute)
VERIFY_WORDS = {"spec": {"verify": "verify", "n": "verify.n", "level": "level: edge", "methods": "to the methods",
                         "prompts": "task.n", "edges": "verify.edges", "budget": "verify.budget"},
                "flags": {"verify": "--verify", "n": "--verify", "level": "--level edge", "methods": "as --method",
                          "prompts": "--n", "edges": "--verify-edges", "budget": "--verify-budget"}}


def check_verify(verify: VerifySpec | None, *, methods, n_prompts: int, level: str, n_edges: int | None = None,
                 words: str = "spec") -> None:
    """None; InputError when a verified run cannot be made of these settings (before any work); ``words``: name
    the settings as a spec's keys ("spec") or as attribute's flags ("flags")."""
    if verify is None:
        return
    w = VERIFY_WORDS[words]
    if verify.design == "active" and words == "flags":  # the flag the user gave (no --verify N with this design)
        w = {**w, "verify": "--verify-design active"}
    if level != "edge":
        raise InputError(f"{w['verify']} needs {w['level']} (verified intervals are per edge)")
    if not any(m != "exact" and m not in MASK_METHODS for m in methods):
        raise InputError(f"{w['verify']} checks an approximate method's per-example scores: add eap, eap-ig-inputs, "
                         f"atpstar, ... {w['methods']} (a mask-learned method such as edge-pruning has none)")
    if verify.combine is not None:
        check_combine(verify.combine, methods)
    if verify.design == "active":
        check_active(verify, n_prompts, w)
    elif verify.n > n_prompts - 2:
        set_to = f"{w['n']} {verify.n}" if words == "flags" else f"{w['n']}={verify.n}"
        raise InputError(f"{set_to} leaves fewer than 2 of the task's {n_prompts} prompts unverified; "
                         f"use {w['n']} <= {n_prompts - 2} or more prompts ({w['prompts']})")
    if n_edges is not None and verify.edges is not None and verify.edges.top + verify.edges.random > n_edges:
        raise InputError(f"{w['edges']} asks for {verify.edges.top} + {verify.edges.random} edges of the "
                         f"model's {n_edges}; lower top or random")


def check_combine(combine: list[str], methods) -> None:
    """None; InputError when a method of ``verify.combine`` is not one of the run's approximate methods."""
    for m in combine:
        if m not in methods:
            raise InputError(f"verify.combine lists {m!r}, which is not among the run's methods {list(methods)}: add "
                             "it to the audit's methods or remove it from combine (attribute computes one method, so "
                             "it has nothing to combine)")
        if m == "exact" or m in MASK_METHODS:
            what = ("exact is what the approximations are checked against" if m == "exact" else
                    f"{m} learns a mask and has no per-example scores")
            raise InputError(f"verify.combine lists {m!r}: {what}; combine approximate methods only (eap, "
                             "atp-qkfix, eap-ig-inputs, ...)")


def check_active(verify: VerifySpec, n_prompts: int, w: dict) -> None:
    """None; InputError when the active design's budget does not fit the task's prompts (``w``: VERIFY_WORDS')."""
    if verify.budget > n_prompts:
        budget = f"{w['budget']} {verify.budget:g}" if w["n"] == "--verify" else f"{w['budget']}={verify.budget:g}"
        raise InputError(f"{budget} asks for more exact cells per edge than the task's {n_prompts} prompts; use "
                         f"{w['budget']} <= {n_prompts} or more prompts ({w['prompts']})")


class CircuitFileSpec(StrictSpec):
    """A published circuit to audit (circuitstat.pipelines.published): its file, format and the q-level its edges
    are checked at."""

    _section: ClassVar[str] = "circuit."
    file: str = Field(min_length=1)
    # eap-ig: EAP-IG / MIB graph JSON (edges with in_graph true); edges: one sender->receiver per line
    format: Literal["eap-ig", "edges"] | None = None  # None: eap-ig for .json, else edges
    q: float = Field(0.05, gt=0, lt=1)  # an edge is supported when its BH q-value is at most this

    @property
    def file_format(self) -> str:
        """The format, from the file's suffix when not given."""
        return self.format or ("eap-ig" if self.file.lower().endswith(".json") else "edges")


class CircuitTestsSpec(StrictSpec):
    """Hypothesis tests of one circuit (circuitstat.pipelines.circuit_tests; Shi et al. 2024): which circuit, and the tests' settings.

    The circuit is either the top-``k`` edges of ``method``'s mean scores on a selection half of the prompts,
    tested on the other half (selection-honest), or the given ``edges`` (a published circuit), tested on
    every prompt."""

    _section: ClassVar[str] = "tests."
    method: SCORE_METHOD | None = None
    k: int | None = Field(None, ge=1, le=100_000)
    edges: list[Annotated[str, Field(min_length=1)]] | None = Field(None, min_length=1)
    margin: float = Field(0.1, ge=0.0, lt=0.5, allow_inf_nan=False)
    # 100 random (and inflated) circuits: the paper's code (blei-lab/circuitry, n_random_circuits = 100 in its
    # sufficiency, partial-necessity and minimality configs). At 50, a circuit must beat 49 of them to pass at q = 0.9
    # and Ĝ's Clopper-Pearson interval there is [0.894, 0.999], across q; at 100 it must beat 96 ([0.901, 0.989]), and
    # a circuit with G = 0.975 passes with probability 0.89 instead of 0.64 (docs/hypothesis-tests.md)
    n_random: int = Field(100, ge=5, le=10_000)
    n_permutations: int = Field(500, ge=19, le=100_000)
    quantile: float = Field(0.9, gt=0.0, lt=1.0, allow_inf_nan=False)
    # the paper's fixed q = 0.9 (Shi et al. 2024); null: the exact rank test under exchangeability instead
    random_quantile: float | None = Field(0.9, gt=0.0, lt=1.0, allow_inf_nan=False)
    correction: Literal["holm", "bh"] = "holm"

    @model_validator(mode="after")
    def _one_circuit(self) -> "CircuitTestsSpec":
        if (self.k is None) == (self.edges is None):
            raise ValueError("give exactly one of tests.k (the top-k circuit, chosen on a selection split) or "
                             "tests.edges (a given circuit's edge names)")
        if self.edges is not None and len(set(self.edges)) != len(self.edges):
            raise ValueError("tests.edges lists an edge more than once")
        q, R = self.random_quantile, self.n_random
        p_min = 1.0 / (R + 1) if q is None else q ** R  # sufficiency's smallest p: beating every random circuit
        if p_min > 0.05:
            need = 19 if q is None else math.ceil(math.log(0.05) / math.log(q))
            raise ValueError(f"tests.n_random={R} random circuits can never show sufficiency or partial necessity at "
                             f"alpha 0.05 (the smallest p-value is {p_min:.3g}); use tests.n_random >= {need}")
        return self


class AuditSpec(RunOptions):
    """Everything one audit runs; see the module docstring."""

    model: str | None = None
    models: list[str] | None = None
    task: TaskSpec = TaskSpec()
    methods: list[METHOD] = Field(default_factory=lambda: ["exact", "eap"], min_length=1)
    level: LEVEL = "edge"
    ablation: ABLATION = "counterfactual"
    input_node: INPUT_NODE = "embeddings"  # "tokens": MIB/EAP-IG's input node (token embedding only)
    # "experts": one sender per expert of a mixture-of-experts layer (circuitstat.circuits.moe_nodes); recorded in the
    # run's spec only when chosen (audit_spec_doc), so the default's records are as before
    moe_nodes: MOE_NODES = "block"
    ig_steps: int = IG_STEPS.pydantic()
    bootstrap: BootstrapSpec = BootstrapSpec()
    k: KGrid = Field(default_factory=lambda: [5, 10, 20, 50], min_length=1)
    ranking: Literal["absolute", "signed"] = "absolute"
    faithfulness: bool = True
    # cross-fitting folds of the selection-aware faithfulness interval; None: up to 5, as many as the
    # examples (and a task's groups, which stay whole) fill with at least 4 examples each
    faithfulness_folds: int | None = Field(None, ge=2, le=20)
    # the circuit choice's fine search (circuitstat.pipelines.k_search): the most extra k values, below the grid's largest,
    # whose faithfulness it may evaluate to find the smallest circuit that meets the bar; 0: the grid only
    k_search: int = Field(64, ge=0, le=1000)
    heads: HeadsSpec = HeadsSpec()
    verify: VerifySpec | None = None
    circuit: CircuitFileSpec | None = None  # a published circuit to audit (docs/mib.md)
    # hypothesis tests of a circuit (equivalence, independence, minimality, sufficiency, partial necessity)
    tests: CircuitTestsSpec | None = None
    # edge pruning's options (when methods include edge-pruning): each fit's, and the stability stage's refits
    edge_pruning: EdgePruningSpec = EdgePruningSpec()
    ugs: UGSSpec = UGSSpec()  # UGS's (when methods include ugs), as edge_pruning's

    @field_validator("methods")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        from circuitstat.circuits.methods import not_effects

        if len(set(v)) != len(v):
            raise ValueError("methods are listed more than once")
        if problem := not_effects(v):
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _one_model_source(self) -> "AuditSpec":
        if (self.model is None) == (self.models is None):
            raise ValueError("give exactly one of 'model' (one source) or 'models' (a list of seeds of one model)")
        if self.models is not None and len(self.models) == 0:
            raise ValueError("'models' is empty; list at least one model")
        return self

    @model_validator(mode="after")
    def _enough_resamples(self) -> "AuditSpec":
        need = tail_resamples(self.bootstrap.confidence_level)  # the faithfulness interval: one beyond each quantile
        if (self.faithfulness or self.circuit is not None) and self.bootstrap.n_resamples < need:
            raise ValueError(f"bootstrap.n_resamples={self.bootstrap.n_resamples} is too few for a "
                             f"{self.bootstrap.confidence_level:.0%} faithfulness interval: use at least {need} "
                             "(or faithfulness: false" + (" and no circuit)" if self.circuit is not None else ")"))
        return self

    @model_validator(mode="after")
    def _verify_fits(self) -> "AuditSpec":
        try:
            check_verify(self.verify, methods=self.methods, n_prompts=self.task.n, level=self.level)
        except InputError as e:
            raise ValueError(str(e)) from None
        return self

    @model_validator(mode="after")
    def _masks_fit(self) -> "AuditSpec":
        masked = [m for m in self.methods if m in MASK_METHODS]
        if not masked:
            return self
        if self.level != "edge":
            raise ValueError(f"{masked[0]} learns a mask over edges: use level: edge (or drop it from methods)")
        if len(masked) == len(self.methods):
            needs = [key for key, on in (("tests", self.tests), ("circuit", self.circuit)) if on is not None]
            if needs:
                raise ValueError(f"{needs[0]} reads per-example scores (q-values, the circuit's selection), which "
                                 f"{masked[0]} does not have: add an attribution method (e.g. eap) to methods")
        return self

    @model_validator(mode="after")
    def _tests_fit(self) -> "AuditSpec":
        t = self.tests
        if t is None:
            return self
        if self.level != "edge":
            raise ValueError("tests need level: edge (the tests knock out edges)")
        if t.method is not None and t.method not in self.methods:
            raise ValueError(f"tests.method {t.method!r} is not in the spec's methods {self.methods}; add it")
        if t.k is not None and self.task.n < 8:
            raise ValueError("tests.k chooses the circuit on half the prompts and tests it on the other half: "
                             "use task.n >= 8")
        return self

    @property
    def sources(self) -> list[str]:
        """Model sources; attribution runs on the first, head stability across all."""
        return list(self.models) if self.models is not None else [self.model]


def _fields_at(model: Any, loc: tuple) -> list[str]:
    """The keys the spec class ``model`` accepts at location ``loc`` (nested specs, lists of them); [] if unknown."""
    import typing

    for part in loc:
        if isinstance(part, int):
            continue  # a list index: the element type was taken with the field below
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return []
        hint, model = fields[part].annotation, None
        todo = [hint]
        while todo and model is None:  # Optional[Spec], list[Spec], Annotated[...]: find the spec class inside
            h = todo.pop()
            if isinstance(h, type) and issubclass(h, BaseModel):
                model = h
            else:
                todo += list(typing.get_args(h))
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


def _unknown_key(loc: tuple, model: Any) -> str:
    """'unknown key', with the nearest allowed key (``method`` -> did you mean 'methods'?) and the allowed keys."""
    import difflib

    allowed = _fields_at(model, tuple(loc[:-1])) if model is not None else []
    if not allowed:
        return "unknown key"
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key; {hint}the keys here are {', '.join(allowed)}"


def format_error(exc: ValidationError, source: str, model: Any = None) -> str:
    """One line naming each of ``exc``'s bad keys (at most 5) of a spec read from ``source``."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = _unknown_key(tuple(err["loc"]), model)
        if err["type"] == "literal_error":
            msg = f"{msg.replace('Input should be', 'must be')}"
        parts.append(f"{where}: {msg}")
    more = f" (and {len(exc.errors()) - 5} more)" if len(exc.errors()) > 5 else ""
    return f"invalid spec {source}: " + "; ".join(parts) + more


def validate_spec(model: type[_M], data: Any, source: str, *, kind: str = "spec", keys: str = "model, task, ...") -> _M:
    """``model`` (a spec class) validated from parsed YAML, or InputError naming each bad key and the
    allowed values: the one way every spec, plan and claims-named spec is read."""
    if not isinstance(data, dict):
        raise InputError(f"invalid {kind} {source}: the top level must be a mapping of keys ({keys})")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputError(format_error(exc, source, model).replace("invalid spec", f"invalid {kind}", 1)) from None


def parse_spec(data: Any, source: str = "<spec>") -> AuditSpec:
    """An AuditSpec from parsed YAML, or InputError naming each bad key and the allowed values (and an options
    section of a mask-learned method the spec does not run: its settings would be ignored without a word)."""
    from circuitstat.pipelines.mask_options import check_mask_options

    spec = validate_spec(AuditSpec, data, source, keys="model, task, methods, ...")
    sections = {section: list(data[section]) for section, _ in MASK_SECTIONS.values()  # a written-out default: no-op
                if isinstance(data.get(section), dict) and getattr(spec, section) != type(getattr(spec, section))()}
    try:
        check_mask_options(spec.methods, sections, words="methods")  # the one guard (attribute's too)
    except InputError as e:
        raise InputError(f"invalid spec {source}: {e}") from None
    return spec


def load_yaml(path: str | Path) -> Any:
    """Parsed YAML of a file, or InputError saying why it could not be read (see circuitstat.pipelines.yamlio)."""
    return read_yaml_strict(path)


def load_spec(path: str | Path, *, allow_outside: bool = False) -> AuditSpec:
    """The validated audit spec in a YAML file, its local paths resolved relative to it (confine_paths)."""
    return confine_paths(parse_spec(load_yaml(path), str(path)), path, allow_outside=allow_outside)


SOURCE_KINDS = ("random:", "zoo:", "hf:", "served:", "memory:")
"""The prefixes of the model sources that are not paths (circuitstat.circuits.model_source)."""
TASK_FILE_SUFFIXES = (".jsonl", ".csv", ".parquet", ".json", ".tsv")


def _local_path(spec_file: str | Path, value: str, key: str, allow_outside: bool) -> str:
    """``value`` resolved against the spec's directory (see confine_paths); a hub id becomes ``hf:ID``."""
    from circuitstat.circuits.model_source import Dir, Hub, parse_source
    from circuitstat.core.confine import looks_like_path, resolve_inside

    if key == "task.name":
        return str(resolve_inside(spec_file, value, key=key, allow_outside=allow_outside))
    try:
        src = parse_source(value, base=Path(spec_file).parent)  # the one source grammar
    except InputError as e:
        if value.startswith(SOURCE_KINDS):
            return value  # refused by the same grammar where the run resolves it, so `check` can withhold it
        raise InputError(f"'{key}:' in {spec_file}: {e}") from None  # the grammar's message quotes no value
    if isinstance(src, Hub):
        # read from the local Hugging Face cache only, never from the current directory
        return src.text if src.text.startswith("hf:") else f"hf:{value}"
    if not isinstance(src, Dir):
        return value  # not paths: zoo:/served: names are checked where they resolve (circuitstat.pipelines.sources)
    if looks_like_path(value) or (Path(spec_file).parent / value).exists():
        return str(resolve_inside(spec_file, value, key=key, allow_outside=allow_outside))
    raise InputError(f"'{key}:' in {spec_file} names nothing in the spec's directory and is not a source "
                     "(random:ARCH?..., zoo:RECIPE/seed-S or a hub id org/name); paths are relative to the spec")


def confine_paths(spec: Any, spec_file: str | Path, *, allow_outside: bool = False) -> Any:
    """``spec`` with its model and task-file paths resolved relative to ``spec_file``.

    Paths in a file written by someone else may not leave that file's directory tree (absolute
    paths, ``~``, ``..`` or symbolic links out are refused) unless the command line passes
    ``--allow-outside`` (circuitstat.core.confine, the one resolver). A model named by a bare name resolves
    against the spec's directory, never the current one; ``org/name`` that is no such path is a hub
    id, kept as ``hf:org/name`` so that it is looked up only in the local Hugging Face cache.
    ``random:``/``zoo:`` sources are not paths.
    """
    update: dict[str, Any] = {}
    if getattr(spec, "model", None) is not None:
        update["model"] = _local_path(spec_file, spec.model, "model", allow_outside)
    if getattr(spec, "models", None) is not None:
        update["models"] = [_local_path(spec_file, m, "models", allow_outside) for m in spec.models]
    task = getattr(spec, "task", None)
    if task is not None and str(task.name).lower().endswith(TASK_FILE_SUFFIXES):
        update["task"] = task.model_copy(update={"name": _local_path(spec_file, task.name, "task.name",
                                                                     allow_outside)})
    circuit = getattr(spec, "circuit", None)
    if circuit is not None:  # a file, never a source: always resolved inside the spec's tree
        from circuitstat.core.confine import resolve_inside

        where = str(resolve_inside(spec_file, circuit.file, key="circuit.file", allow_outside=allow_outside))
        update["circuit"] = circuit.model_copy(update={"file": where})
    return spec.model_copy(update=update) if update else spec
