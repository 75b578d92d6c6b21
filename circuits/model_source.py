"""A model source is a value: :func:`parse_source` reads the one grammar of the strings that name a model.

=====================================  ==========================================================================
``random:ARCH?key=value&...``          :class:`Random`: a random-weight model of family ARCH (circuitstat.circuits.families)
``zoo:RECIPE/seed-S``                  :class:`Zoo`: model S of a zoo recipe (S a seed number, no leading zero)
``served:NAME``                        :class:`Served`: the operator's model NAME, inside a circuitstat server's job
``memory:...``                         :class:`Memory`: the recorded source of a model passed in memory (not loadable)
``hf:org/name[@rev]``, ``org/name``    :class:`Hub`: a hub id, read from the local Hugging Face cache only
anything else                          :class:`Dir`: a model directory
=====================================  ==========================================================================

A bare ``org/name`` is a directory when ``base`` holds one by that name (a path the user can see wins), else a
hub id. Torch-free: the service, pricing, spec confinement and the loader all parse here, so one string gets one
verdict everywhere (tests/pipelines/test_source_grammar.py feeds the same strings to every entry point).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl

from circuitstat.core.errors import InputError, UnsupportedArchitectureError

from .families import POINTERS, SMALL

__all__ = ["HUB_ID", "MAX_SOURCE_CHARS", "NESTED", "SERVED_NAME", "SHAPES", "Dir", "Hub", "Memory", "Random",
           "Served", "Source", "Zoo", "parse_random_spec", "parse_source"]

MAX_SOURCE_CHARS = 4096
HUB_ID = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)(?:@([A-Za-z0-9][A-Za-z0-9._/-]*))?")
"""A Hugging Face hub id ``org/name[@revision]``."""
ZOO = re.compile(r"zoo:([a-z0-9][a-z0-9-]{0,63})/seed-(0|[1-9][0-9]{0,8})")
SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""An operator's model name (``served:NAME``)."""
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")
SHAPES = ("random:ARCH?key=value&...", "zoo:RECIPE/seed-S", "a model directory", "a hub id org/name[@revision]")
SIZE_KEYS = {"n_layer", "n_head", "n_embd", "vocab_size", "n_positions", "num_hidden_layers", "num_attention_heads",
             "hidden_size", "max_position_embeddings"}
"""The sizes every family's model needs as positive integers (layers, heads, width, vocabulary, context)."""
NESTED = {"rope_parameters", "rope_scaling"}
"""Config fields a ``random:`` spec may set key by key, as ``rope_parameters.factor=2`` (``rope_scaling``
is transformers' old name for ``rope_parameters``; a second dot reaches a layer type's schedule,
``rope_parameters.full_attention.factor=2``)."""


@dataclass(frozen=True)
class Random:
    """``random:ARCH?key=value&...``: family ``arch``, config overrides ``values`` and weight ``seed``."""

    text: str
    arch: str
    values: dict = field(hash=False, compare=False)
    seed: int = 0


@dataclass(frozen=True)
class Hub:
    """A hub id ``repo`` at ``revision`` (None: the cached default), read from the local Hugging Face cache."""

    text: str
    repo: str
    revision: str | None = None


@dataclass(frozen=True)
class Dir:
    """A model directory ``path`` (relative ones are read against the caller's base directory)."""

    text: str
    path: str


@dataclass(frozen=True)
class Zoo:
    """Model ``seed`` of zoo recipe ``recipe`` (circuitstat.pipelines.zoo resolves it)."""

    text: str
    recipe: str
    seed: int


@dataclass(frozen=True)
class Served:
    """The operator's model ``name`` on a circuitstat server (circuitstat.pipelines.sources resolves it)."""

    text: str
    name: str


@dataclass(frozen=True)
class Memory:
    """The recorded source of a model passed in memory (circuitstat.circuits.inmemory): names it, cannot load it."""

    text: str
    label: str


Source = Random | Hub | Dir | Zoo | Served | Memory


def _refuse(why: str) -> InputError:
    """The grammar's refusal: what is wrong and the accepted shapes, never the text itself (it may come from a
    file or a request that someone else wrote)."""
    return InputError(f"not a model source: {why}; give {', '.join(SHAPES)}")


def parse_source(text: object, *, base: "str | Path | None" = None) -> Source:
    """The Source ``text`` names (InputError, naming the problem and the accepted shapes, when it names none).
    ``base``: the directory a bare ``org/name`` is looked for in first (None: it is a hub id)."""
    if not isinstance(text, str) or not text:
        raise _refuse("a model source is a non-empty string")
    if len(text) > MAX_SOURCE_CHARS:
        raise _refuse(f"longer than {MAX_SOURCE_CHARS} characters")
    if text != text.strip():
        raise _refuse("it starts or ends with white space; remove it")
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise _refuse("it holds control characters")
    scheme = _SCHEME.match(text)
    kind = scheme.group(1) if scheme else None
    if kind == "random":
        return parse_random_spec(text)
    if kind == "zoo":
        m = ZOO.fullmatch(text)
        if m is None:
            raise _refuse("zoo sources look like zoo:RECIPE/seed-S (RECIPE lower-case letters, digits and '-'; "
                                "S a seed number without leading zeros; nothing may follow)")
        return Zoo(text, m.group(1), int(m.group(2)))
    if kind == "served":
        name = text[len("served:"):]
        if not SERVED_NAME.fullmatch(name):
            raise _refuse("served:NAME names an operator's model by letters, digits, '.', '_' and '-'")
        return Served(text, name)
    if kind == "memory":
        return Memory(text, text[len("memory:"):])
    if kind == "hf":
        m = HUB_ID.fullmatch(text[len("hf:"):]) if ".." not in text else None
        if m is None:
            raise _refuse("hf: sources look like hf:org/name or hf:org/name@revision")
        return Hub(text, m.group(1), m.group(2))
    if kind is not None:
        raise _refuse("its prefix before ':' is not a kind of model source (write ./NAME for a directory named so)")
    m = HUB_ID.fullmatch(text) if ".." not in text else None  # a hub id has no '..' (a path with one stays a path)
    if m is not None and (base is None or not (Path(base) / text).expanduser().exists()):
        return Hub(text, m.group(1), m.group(2))
    return Dir(text, text)


def _parse_value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _nest(values: dict, source: str) -> dict:
    """``values`` with every ``FIELD.key=value`` gathered into a dict under FIELD (InputError for a field
    that is not in :data:`NESTED`, or one set both whole and key by key)."""
    out: dict = {}
    for key, value in values.items():
        if "." not in key:
            if key in out:
                raise InputError(f"random: spec {source!r} sets {key} both whole and key by key; give one")
            out[key] = value
            continue
        head, *path = key.split(".")
        if head not in NESTED or not all(path):
            raise InputError(f"random: spec {source!r}: {key!r} is not a nested config field; only "
                             f"{', '.join(sorted(NESTED))} take FIELD.key=value")
        node = out.setdefault(head, {})
        if not isinstance(node, dict):
            raise InputError(f"random: spec {source!r} sets {head} both whole and key by key; give one")
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise InputError(f"random: spec {source!r} sets {key} both as a value and as a mapping")
        node[path[-1]] = value
    if "rope_scaling" in out:  # transformers 5 reads the old name into rope_parameters
        if "rope_parameters" in out:
            raise InputError(f"random: spec {source!r} sets both rope_scaling and rope_parameters; give one")
        out["rope_parameters"] = out.pop("rope_scaling")
    return out


def parse_random_spec(source: str) -> Random:
    """The Random of ``random:ARCH?key=value&...``; ``FIELD.key=value`` sets one key of a nested field
    (:data:`NESTED`), e.g. ``rope_parameters.rope_type=linear&rope_parameters.factor=2``."""
    arch, _, query = source[len("random:"):].partition("?")
    arch = arch.strip().lower()
    if arch not in SMALL:
        raise UnsupportedArchitectureError(
            f"unknown architecture {arch!r} in {source!r}; use random:ARCH with ARCH one of {', '.join(SMALL)}"
            + (f"; {POINTERS[arch]}" if arch in POINTERS else ""))
    values: dict = {}
    if query:
        for item in query.split("&"):
            if "=" not in item or not item.split("=", 1)[0]:
                raise InputError(f"malformed random: spec {source!r}: expected key=value pairs joined by '&', got {item!r}")
        pairs = parse_qsl(query, keep_blank_values=True)
        repeated = sorted({k for k, _ in pairs if [q for q, _ in pairs].count(k) > 1})
        if repeated:  # the last value would silently win
            raise InputError(f"random: spec {source!r} sets {repeated[0]} more than once; give it once")
        values = _nest({k: _parse_value(v) for k, v in pairs}, source)
    seed = values.pop("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise InputError(f"seed in {source!r} must be an integer, got {seed!r}")
    for key in SIZE_KEYS & set(values):  # what the loader's size check (check_hf_config) requires, read here first
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            shown = repr(value) if isinstance(value, (int, float)) else f"a {type(value).__name__}"
            raise InputError(f"random: spec {source!r}: {key} must be a positive integer, got {shown}; fix {key}")
    return Random(source, arch, values, seed)
