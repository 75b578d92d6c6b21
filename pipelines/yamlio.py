"""Reading YAML spec and claims files strictly: every problem an InputError naming the file.

Duplicate keys, self-referencing aliases, unreadable or non-UTF-8 files, over-deep nesting and
values YAML cannot construct (a date such as 2024-13-01) are errors, never silent defaults.

Alias bombs ("billion laughs": a few aliases that each repeat the previous one twice) are
refused while loading, from the composed node graph, before any Python object is built: the
size of the document with every alias written out is counted with one visit per distinct node,
so a 1 KB bomb that would expand to 10^9 values is refused at once and without memory growth.

Paths read from a file (a claims file's ``run:`` and ``spec:``, a spec's model, ...) are confined to
that file's directory tree by :func:`circuitstat.core.confine.resolve_inside` unless the command line allows
otherwise.

The echo rule for files reached through another file's path (a ``spec:`` named by a claims file
that may come from someone else, and may name /etc/shadow): errors about such a file never
include its text, keys or values, only where the problem is (line and column, or the schema
path with unknown keys given by their position) and what kind of problem it is. A file the user
named on the command line is their own, and its errors quote keys and values as usual.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from circuitstat.core.confine import resolve_inside  # noqa: F401 - the one resolver; re-exported for the claims and specs
from circuitstat.core.errors import InputError

# The most values (scalars, lists, mappings) the aliases of a document may add once every alias is
# written out. A document without aliases adds none, however large it is (its size is bounded by
# MAX_FILE_BYTES instead); the consumers (pydantic, JSON dumps of the spec, task options) do work in
# proportion to the expanded size.
MAX_EXPANDED_NODES = 100_000
# The largest spec or claims file read: 60,000 claims of six keys take 6 MB.
MAX_FILE_BYTES = 32 * 2**20
# The deepest nesting accepted (counted through aliases too).
MAX_DEPTH = 200


class _NoDuplicatesLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml: fast, caps nesting depth
    """Safe YAML loading that rejects duplicate keys and alias bombs before constructing anything."""

    def get_single_data(self) -> Any:
        """The document's data, after checking its node graph (size with aliases expanded, cycles, depth)."""
        node = self.get_single_node()
        if node is None:
            return None
        _check_node_graph(node)
        return self.construct_document(node)


class _GraphError(Exception):
    """A problem of the composed node graph; `what` is one of 'cycle', 'depth', 'size'."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def _check_node_graph(root: yaml.Node) -> None:
    """Raise _GraphError when the document, aliases expanded, is cyclic, too deep, or its aliases add
    more than MAX_EXPANDED_NODES values to it.

    Expanded sizes are memoised per node, so a shared (aliased) subtree costs one visit however
    often it is repeated: linear in the distinct nodes, never in the expanded tree.
    """
    size: dict[int, int] = {}
    on_path: set[int] = set()
    distinct = [0]

    def visit(node: yaml.Node, depth: int) -> int:
        key = id(node)
        if key in size:
            return size[key]
        if key in on_path:
            raise _GraphError("cycle")
        if depth > MAX_DEPTH:
            raise _GraphError("depth")
        total = 1
        distinct[0] += 1
        if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)):
            on_path.add(key)
            children = node.value if isinstance(node, yaml.SequenceNode) else [n for kv in node.value for n in kv]
            for child in children:
                total += visit(child, depth + 1)
                if total - distinct[0] > MAX_EXPANDED_NODES:  # stop early: the count itself must stay small
                    raise _GraphError("size")
            on_path.discard(key)
        size[key] = total
        return total

    visit(root, 0)


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


def _graph_message(what: str, path: str) -> str:
    if what == "cycle":
        return f"{path} has a YAML alias (*name) that refers to itself; write the value out"
    if what == "depth":
        return f"{path} is nested more than {MAX_DEPTH} levels deep; this is not a claims/spec file"
    return (f"{path} holds more than {MAX_EXPANDED_NODES:,} values once its YAML aliases (*name) are expanded, "
            "beyond those written out (an alias bomb?); write the values out or remove the aliases")


def _yaml_error_message(e: yaml.YAMLError, path: str, quote: bool) -> str:
    """One line about a YAML syntax error; without `quote`, only where it is (no text of the file)."""
    if quote:
        first = " ".join(str(e).split()).replace(' in "<unicode string>",', " at")
        return f"{path} is not valid YAML: {first[:300]}"
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{path} is not valid YAML{where}"


def read_yaml_strict(path: str | os.PathLike[str], *, quote: bool = True) -> Any:
    """Parsed YAML of a file, or InputError: unreadable, invalid, duplicate keys, self-referential, alias bomb.

    `quote=False` is for files reached through another file's path: the errors then never
    contain text from the file (see the module docstring).
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{path} not found{' (it is a directory)' if p.is_dir() else ''}; pass the path of a YAML file")
    try:
        with open(p, "rb") as f:  # a regular file (is_file): bounded read, never a device without end
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise InputError(f"{path} is larger than {MAX_FILE_BYTES // 2**20} MiB; this is not a claims/spec file")
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path} is not UTF-8 text (byte {e.start}); save it as UTF-8 YAML") from None
    except OSError as e:
        raise InputError(f"{path} cannot be read: {e.strerror or e}") from None
    try:
        loader = _NoDuplicatesLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except _GraphError as e:
        raise InputError(_graph_message(e.what, str(path))) from None
    except yaml.YAMLError as e:
        raise InputError(_yaml_error_message(e, str(path), quote)) from None
    except RecursionError:
        raise InputError(f"{path} is nested too deeply to be a claims/spec file") from None
    except (ValueError, TypeError, OverflowError) as e:  # e.g. a date such as 2024-13-01
        detail = f" ({e})" if quote else ""
        raise InputError(f"{path} is not valid YAML: a value cannot be read{detail}; quote it as a string") from None


def _schema_names(model: Any) -> set[str]:
    """Every field name of a pydantic model and of the models nested in it (names we wrote, not the file)."""
    import typing

    from pydantic import BaseModel

    names: set[str] = set()
    todo, done = [model], set()
    while todo:
        m = todo.pop()
        if m in done:
            continue
        done.add(m)
        for name, f in m.model_fields.items():
            names.add(name)
            stack = [f.annotation]
            while stack:
                t = stack.pop()
                if isinstance(t, type) and issubclass(t, BaseModel):
                    todo.append(t)
                stack.extend(typing.get_args(t))
    return names


# Error types whose pydantic message names only the schema (never the input); every other
# message is replaced by a generic description when the file is not the user's own.
_SAFE_MESSAGE_TYPES = {
    "missing", "literal_error", "int_type", "float_type", "string_type", "bool_type", "list_type", "dict_type",
    "model_type", "model_attributes_type", "int_parsing", "float_parsing", "int_from_float", "finite_number",
    "greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_short", "too_long",
    "string_too_short", "string_too_long", "union_tag_not_found",
}


def redacted_validation_message(exc: Any, data: Any, model: Any, source: str, limit: int = 5) -> str:
    """A one-line message for a pydantic ValidationError that contains no key or value of `data`.

    Locations are schema paths (field names of `model`, list indices); a key the schema does not
    know is given by its position in its mapping ("key #3"). For files reached through another
    file's path (see the module docstring).
    """
    known = _schema_names(model)
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    parts = []
    for err in errors[:limit]:
        where, node = [], data
        for p in err["loc"]:
            if isinstance(p, int):
                where.append(f".{p}" if where else str(p))
                node = node[p] if isinstance(node, list) and 0 <= p < len(node) else None
            elif isinstance(p, str) and p in known:
                where.append(("." if where else "") + p)
                node = node.get(p) if isinstance(node, dict) else None
            else:
                pos = list(node).index(p) + 1 if isinstance(node, dict) and p in node else "?"
                where.append(("." if where else "") + f"key #{pos}")
                node = None
        loc = "".join(where) or "(top level)"
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] in _SAFE_MESSAGE_TYPES:
            msg = err["msg"].replace("Input should be", "must be")
        else:
            msg = "invalid value"
        parts.append(f"{loc}: {msg}")
    more = f" (and {len(errors) - limit} more)" if len(errors) > limit else ""
    return f"{source}: " + "; ".join(parts) + more


def redacted_failure(exc: BaseException, file: str, command: str) -> str | None:
    """A one-line message for a user-caused failure ``exc`` while running what ``file`` (reached through
    another file) describes, quoting nothing of ``file``; None when ``exc`` is an internal error.

    Errors raised while building a model or a task quote the values they refuse (``random:SECRET...``,
    ``unknown option(s) 'SECRET...'``), and those values come from ``file``: under the echo rule (see the
    module docstring) only the kind of failure is shown, with the ``command`` that shows the rest.
    """
    from pydantic import ValidationError

    from circuitstat.core.lock import RunLockedError
    from circuitstat.core.rundir import RunDirError, StageSpecChangedError

    if isinstance(exc, StageSpecChangedError) and hasattr(exc, "stage"):  # names only what circuitstat wrote
        return (f"running {file}: stage {exc.stage!r} in {exc.run_dir} already finished with a different spec "
                f"(what differs is not shown: it may quote the file); run `{command}` to see it, or use a new run")

    kinds = ((InputError, "bad input"), (ValidationError, "an invalid value"), (RunDirError, "a run-directory refusal"),
             (RunLockedError, "a locked run directory"), (OSError, "a file-system error"),
             (UnicodeDecodeError, "an unreadable file"))
    what = next((text for cls, text in kinds if isinstance(exc, cls)), None)
    if what is None:
        return None
    return (f"running {file} failed with {what} ({type(exc).__name__}); the message is not shown because it may "
            f"quote the file, which may not be yours: run `{command}` to see it")
