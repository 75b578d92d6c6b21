"""Reading YAML spec and claims files strictly: every problem an InputError naming the file.

Duplicate keys, self-referencing aliases, unreadable or non-UTF-8 files, over-deep nesting and
values YAML cannot construct (a date such as 2024-13-01) are errors, never silent defaults.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from circuits.errors import InputError


class _NoDuplicatesLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml: fast, caps nesting depth
    """Safe YAML loading that rejects duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            dup = key in seen
        except TypeError:  # unhashable key: let the base constructor report it
            break
        if dup:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
            )
        seen[key] = None
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_NoDuplicatesLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _check_acyclic(data: Any, source: str) -> None:
    """Reject YAML aliases that make a structure contain itself (it would loop forever later)."""
    stack: set[int] = set()

    def walk(x: Any, depth: int) -> None:
        if depth > 200:
            raise InputError(f"{source} is nested more than 200 levels deep; this is not a claims/spec file")
        if isinstance(x, (dict, list)):
            if id(x) in stack:
                raise InputError(f"{source} has a YAML alias (*name) that refers to itself; write the value out")
            stack.add(id(x))
            for v in (x.values() if isinstance(x, dict) else x):
                walk(v, depth + 1)
            stack.discard(id(x))

    walk(data, 0)


def read_yaml_strict(path: str | os.PathLike[str]) -> Any:
    """Parsed YAML of a file, or InputError: unreadable, invalid, duplicate keys, self-referential."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{path} not found{' (it is a directory)' if p.is_dir() else ''}; pass the path of a YAML file")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path} is not UTF-8 text (byte {e.start}); save it as UTF-8 YAML") from None
    except OSError as e:
        raise InputError(f"{path} cannot be read: {e.strerror or e}") from None
    try:
        data = yaml.load(text, Loader=_NoDuplicatesLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        first = " ".join(str(e).split()).replace(' in "<unicode string>",', " at")
        raise InputError(f"{path} is not valid YAML: {first[:300]}") from None
    except RecursionError:
        raise InputError(f"{path} is nested too deeply to be a claims/spec file") from None
    except (ValueError, TypeError, OverflowError) as e:  # e.g. a date such as 2024-13-01
        raise InputError(f"{path} is not valid YAML: a value cannot be read ({e}); quote it as a string") from None
    _check_acyclic(data, str(path))
    return data
