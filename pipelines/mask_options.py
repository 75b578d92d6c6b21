"""Which options belong to which mask-learned method: the one guard that the command line, the attribute spec and
the library (``run_attribute``) all run, so "UGS options only with ugs" (and "edge-pruning options only with
edge-pruning") is decided, and worded, in one place.

What a method takes is derived, never listed here: the mask-learned methods are the records of family ``mask``
(circuitstat.circuits.methods), and the options each takes are the fields of its options class
(circuitstat.pipelines.spec.MASK_SECTIONS: EdgePruningOptions, UGSOptions); ``n_refits`` refits any of them.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from circuitstat.core.errors import InputError
from circuitstat.pipelines.options import MASK_METHODS

__all__ = ["REFITS", "NO_FLAG", "owners", "flag", "named", "check_mask_options", "place_mask_options", "section_of"]

REFITS = "n_refits"  # bootstrap refits: an option of every mask-learned method, beside its options section
# an option whose command-line flag is not --KEY (the mask fits' ablation would clash with --ablation, the run's)
_FLAGS = {"ablation": "--mask-ablation"}
# options a spec sets but the command line does not (tests/pipelines/test_cli_kinds.py checks both lists against it)
NO_FLAG = ("init", "lr_lambda", "prune_dangling_edges")


def _classes() -> dict[str, Any]:
    from circuitstat.pipelines.spec import MASK_SECTIONS

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


def check_mask_options(method: str, sections: Mapping[str, Iterable[str]], refits: bool = False) -> None:
    """None; InputError naming the first option that ``method`` does not take. ``sections``: the keys given in
    each options section (``edge_pruning``, ``ugs``); ``refits``: whether n_refits is set. One message from the
    command line, a spec and the library alike: the option by its key and its flag, and the methods that take it."""
    by_section = {section: m for m, (section, _) in _classes().items()}
    given = [(section, key) for section, keys in sections.items() for key in keys]
    for section, key in given + ([(None, REFITS)] if refits else []):
        takes = owners(key)
        if method not in takes:
            who = " or ".join(takes) if takes else "no method"
            raise InputError(f"{named(key)} sets a mask fit of {who} only: use it with --method {who}, "
                             f"not {method}")
    for section in sections:
        other = by_section.get(section, method)
        if other != method:  # keys that the method takes, but in another method's section (or an empty section)
            instead = f" (or give them as {section_of(method)} options)" if method in by_section.values() else ""
            raise InputError(f"the {section} options set {other}'s fits: use them with --method {other}, not "
                             f"{method}{instead}")


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
