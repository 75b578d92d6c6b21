"""Which options belong to which mask-learned method: the one guard that the command line, the attribute spec and
the library (``run_attribute``) all run, so "UGS options only with ugs" (and "edge-pruning options only with
edge-pruning") is decided, and worded, in one place.

What a method takes is derived, never listed here: the mask-learned methods are the records of family ``mask``
(circuitstat.circuits.methods), and the options each takes are the fields of its options class
(MASK_SECTIONS below: EdgePruningOptions, UGSOptions); ``n_refits`` refits any of them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterable, Literal, Mapping, Sequence

from pydantic import Field, model_validator

from circuitstat.core.errors import InputError
from circuitstat.core.params import (LR_CONSTANTS, N_REFITS, PRUNING_INIT, PRUNING_LR, PRUNING_LR_LAMBDA,
                                     PRUNING_SPARSITY, PRUNING_STEPS, PRUNING_TARGET, PRUNING_WARMUP, UGS_SAMPLES,
                                     NODE_TARGET)
from circuitstat.pipelines.options import MASK_METHODS, OBJECTIVE
from circuitstat.pipelines.strict import StrictSpec

__all__ = ["EdgePruningOptions", "EdgePruningSpec", "UGSOptions", "UGSSpec", "MASK_SECTIONS", "mask_spec", "mask_draws",
           "REFITS", "NO_FLAG", "owners", "flag", "named", "check_mask_options", "place_mask_options", "section_of"]


class _MaskOptions(StrictSpec):
    """The options every mask-learned fit shares; ``ablation``: ``run`` (the run's ablation, e.g. counterfactual) or
    ``optimal`` (learned constants, Li & Janson 2024: circuitstat.circuits.optimal_ablation)."""

    steps: int = PRUNING_STEPS.pydantic()
    lr: float = PRUNING_LR.pydantic()
    sparsity: float = PRUNING_SPARSITY.pydantic()
    init: float = PRUNING_INIT.pydantic()
    objective: OBJECTIVE = "mean_metric"
    ablation: Literal["run", "optimal"] = "run"
    lr_constants: float = LR_CONSTANTS.pydantic()

    def fit_options(self) -> dict:
        """The keyword arguments of every fit (steps, lr, sparsity, init, objective, ...; ``ablation`` only when
        optimal: otherwise the caller passes the run's)."""
        out = self.model_dump(exclude={"n_refits"})
        if out["ablation"] == "run":
            del out["ablation"]
        return out


class EdgePruningOptions(_MaskOptions):
    """The options of each edge-pruning fit (circuitstat.circuits.edge_pruning.fit_edge_pruning); bounds from
    circuitstat.core.params.  With ``target`` the sparsity is driven to it by Bhaskar et al.'s Lagrangian
    (``sparsity`` unset: no fixed penalty beside it)."""

    _section: ClassVar[str] = "edge_pruning."
    sparsity: float | None = PRUNING_SPARSITY.pydantic(default=None)
    target: float | None = PRUNING_TARGET.pydantic()
    warmup: int | None = PRUNING_WARMUP.pydantic()
    lr_lambda: float | None = PRUNING_LR_LAMBDA.pydantic()
    # Bhaskar et al.'s node masks: a gate per sender on all its outgoing edges, with its own penalty weight
    node_masks: bool = False
    node_sparsity: float | None = Field(None, ge=0, le=1e6)  # unset: 1, or 0 with node_target (the fit's rule)
    node_target: float | None = NODE_TARGET.pydantic()

    def fit_options(self) -> dict:
        """The fit's keyword arguments; the node-mask options only when node masks are on (fits without them are
        the same calls as before they existed)."""
        out = super().fit_options()
        if not out["node_masks"]:
            del out["node_masks"], out["node_sparsity"], out["node_target"]
        return out

    @model_validator(mode="after")
    def _lagrangian(self):
        if self.target is None and (self.warmup is not None or self.lr_lambda is not None):
            raise ValueError("warmup and lr_lambda belong to the target-sparsity Lagrangian: give target too")
        if self.target is not None and self.warmup is not None and self.warmup > self.steps:
            raise ValueError(f"warmup ({self.warmup}) must not exceed steps ({self.steps})")
        if self.node_target is not None and not self.node_masks:
            raise ValueError(f"{named('node_target')} is the node gates' target sparsity: give {named('node_masks')} "
                             "too")
        return self


class EdgePruningSpec(EdgePruningOptions):
    """An audit's edge-pruning options: each fit's, and the refits its stability stage runs (docs/edge-pruning.md)."""

    n_refits: int = N_REFITS.pydantic()


class UGSOptions(_MaskOptions):
    """The options of each UGS fit (circuitstat.circuits.ugs.fit_ugs): edge pruning's, with UGS's learning rate and its
    mask draws per prompt; bounds from circuitstat.core.params."""

    _section: ClassVar[str] = "ugs."
    lr: float = PRUNING_LR.pydantic("ugs")
    n_samples: int = UGS_SAMPLES.pydantic()
    prune_dangling_edges: bool = False  # Li & Janson prune each sampled mask's dangling edges (docs/edge-pruning.md)


class UGSSpec(UGSOptions):
    """An audit's UGS options: each fit's, and the refits its stability stage runs (docs/edge-pruning.md)."""

    n_refits: int = N_REFITS.pydantic()


#: a mask-learned method's options section in a spec, and its options class (fit options, without n_refits)
MASK_SECTIONS = {"edge-pruning": ("edge_pruning", EdgePruningOptions), "ugs": ("ugs", UGSOptions)}


def mask_spec(spec, method: str):
    """``spec``'s options section of mask-learned ``method`` (spec.edge_pruning or spec.ugs)."""
    return getattr(spec, MASK_SECTIONS[method][0])


def mask_draws(method: str, options) -> int:
    """Masks mask-learned ``method`` draws per prompt and step with ``options``: the option its record names
    (UGS's n_samples; circuitstat.circuits.methods.Method.draws_option), else 1. A step costs that many masked runs."""
    from circuitstat.circuits.methods import method as method_record

    name = method_record(method).draws_option
    return int(getattr(options, name)) if name else 1


REFITS = "n_refits"  # bootstrap refits: an option of every mask-learned method, beside its options section
# an option whose command-line flag is not --KEY (the mask fits' ablation would clash with --ablation, the run's)
_FLAGS = {"ablation": "--mask-ablation"}
# options a spec sets but the command line does not (tests/pipelines/test_cli_kinds.py checks both lists against it)
NO_FLAG = ("init", "lr_lambda", "prune_dangling_edges")


def _classes() -> dict[str, Any]:
    return {method: MASK_SECTIONS[method] for method in MASK_METHODS}


def owners(key: str) -> tuple[str, ...]:
    """The mask-learned methods that take option ``key`` (their options class has the field; n_refits: all)."""
    if key == REFITS:
        return MASK_METHODS
    return tuple(m for m, (_, cls) in _classes().items() if key in cls.model_fields)


def flag(key: str) -> str | None:
    """The command-line flag that sets mask option ``key`` (``steps`` -> ``--steps``); None for a spec-only one."""
    return None if key in NO_FLAG else _FLAGS.get(key, "--" + key.replace("_", "-"))


def named(key: str) -> str:
    """``key`` as a message names it: with its flag where the command line has one (``n_samples (--n-samples)``)."""
    return key if flag(key) is None else f"{key} ({flag(key)})"


def check_mask_options(methods: str | Sequence[str], sections: Mapping[str, Iterable[str]],
                       refits: bool = False, *, words: str = "flags") -> None:
    """None; InputError naming the first option that none of ``methods`` (one method, or an audit's list) takes.
    ``sections``: the keys given in each options section (``edge_pruning``, ``ugs``); ``refits``: whether n_refits
    is set. One message from the command line, a spec and the library alike: the option by its key and its flag,
    and the methods that take it; ``words="methods"`` (an audit spec, whose methods are a list) names the section
    whose method the list lacks and says to add it there."""
    chosen = (methods,) if isinstance(methods, str) else tuple(methods)
    name = ", ".join(chosen)
    by_section = {section: m for m, (section, _) in _classes().items()}
    if words == "methods":  # an audit spec: a section is its method's, whichever keys it holds
        for section in sections:
            method = by_section.get(section)
            if method is not None and method not in chosen:
                raise InputError(f"the {section}: section sets {method}'s fits, but methods {list(chosen)} do not "
                                 f"include {method}; add {method} to methods or remove the section")
    given = [(section, key) for section, keys in sections.items() for key in keys]
    for section, key in given + ([(None, REFITS)] if refits else []):
        takes = owners(key)
        if not set(takes) & set(chosen):
            who = " or ".join(takes) if takes else "no method"
            raise InputError(f"{named(key)} sets a mask fit of {who} only: use it with --method {who}, not {name}")
    for section in sections:
        other = by_section.get(section, chosen[0])
        if other not in chosen:  # keys that the methods take, but in another method's section (or an empty section)
            mine = [section_of(m) for m in chosen if m in by_section.values()]
            fix = f"give them as {mine[0]} options" if len(mine) == 1 and len(chosen) == 1 else \
                f"remove the {section} options"
            raise InputError(f"the {section} options set {other}'s fits, and {other} is not among the methods "
                             f"({name}): use method {other}, or {fix}")


def section_of(method: str) -> str:
    """The options section of mask-learned ``method`` in a spec (edge_pruning, ugs)."""
    return _classes()[method][0]


def place_mask_options(method: str, given: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The command line's mask options ``given`` (key -> value; None: not given) sorted into spec sections: under
    ``method``'s own section where it takes them, else under the first method that does (the guard then refuses
    them there, with check_mask_options' message)."""
    sections: dict[str, dict[str, Any]] = {}
    classes = _classes()
    for key, value in given.items():
        if value is None:
            continue
        takes = owners(key)
        home = method if method in takes else (takes[0] if takes else method)
        section = classes[home][0] if home in classes else classes[MASK_METHODS[0]][0]
        sections.setdefault(section, {})[key] = value
    return sections
