"""The task registry: built-in and user-registered task builders, and make_task by name or file."""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from .files import file_task
from .greater_than import greater_than_task
from .induction import induction_task
from .ioi import ioi_task
from .task import Task
from .validation import TaskValidationError, check_int

TASKS: dict[str, Callable[..., Task]] = {}


def register_task(name: str, *aliases: str):
    """Decorator: make a task builder ``fn(tokenizer, n, seed, **kw) -> Task`` available to make_task."""
    def deco(fn):
        for k in (name, *aliases):
            TASKS[k] = fn
        return fn
    return deco


register_task("induction")(induction_task)
register_task("ioi")(ioi_task)
register_task("greater-than", "greater_than", "gt")(greater_than_task)


def _file_builder(tokenizer=None, n=None, seed=0, path=None, prepend_bos: bool = True,
                  metric: "str | Callable" = "logit_diff", name: str | None = None,
                  metric_kwargs: dict | None = None) -> Task:
    if path is None:
        raise TaskValidationError("the file task needs path=... (a .jsonl, .csv or .parquet file)")
    return file_task(path, tokenizer, n=n, seed=seed, prepend_bos=prepend_bos, metric=metric, name=name,
                     metric_kwargs=metric_kwargs)


register_task("file")(_file_builder)
_FILE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet")


def task_builder(name: str) -> tuple[Callable[..., Task], tuple[str, ...]]:
    """(builder, option names it takes that are not options) of the task ``name`` or task file path."""
    key = str(name)
    if key.lower().endswith(_FILE_SUFFIXES) and key not in TASKS:
        return file_task, ("path",)
    builder = TASKS.get(key) or TASKS.get(key.lower().replace("_", "-")) or TASKS.get(key.lower())
    if builder is None:
        raise TaskValidationError(
            f"unknown task {name!r}; choose one of {sorted(set(TASKS))} or give a .jsonl/.csv/.parquet file"
        )
    return builder, ()


def make_task(name: str, tokenizer=None, n: int | None = None, seed: int = 0, **kw) -> Task:
    """Build a task by name: ``induction``, ``ioi``, ``greater-than``, ``file`` (``path=...``), a
    registered custom name, or a path to a task file. ``tokenizer`` may be a tokenizer or anything
    :func:`circuitstat.circuits.tokenizers.load_tokenizer` accepts (e.g. ``"gpt2"``). Options are checked by name
    and by the type the builder declares before anything is built."""
    from circuitstat.circuits.tokenizers import load_tokenizer

    if tokenizer is not None and isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(tokenizer)
    key = str(name)
    if n is not None:
        n = check_int(f"task {key!r}: n", n, minimum=1)
    seed = check_int(f"task {key!r}: seed", seed, minimum=0)
    builder, exclude = task_builder(key)
    _check_options(builder, kw, key, exclude=exclude)
    if builder is file_task:
        return file_task(key, tokenizer, n=n, seed=seed, **kw)
    if n is None and key != "file":
        n = 100
    return builder(tokenizer=tokenizer, n=n, seed=seed, **kw)


def task_options(builder: Callable, exclude: Sequence[str] = ()) -> list[str] | None:
    """The option names a task builder accepts besides tokenizer, n, seed and ``exclude`` (None: any, ``**kw``)."""
    import inspect

    params = inspect.signature(builder).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return None
    return sorted(k for k in params if k not in {"tokenizer", "n", "seed", *exclude})


def task_option_types(builder: Callable, exclude: Sequence[str] = ()) -> dict[str, Any]:
    """{option: the type its builder declares} (``Any`` where it declares none)."""
    import typing

    try:
        hints = typing.get_type_hints(builder)
    except Exception:  # noqa: BLE001 - a user builder's unresolvable annotation: its options go unchecked
        hints = {}
    return {k: hints.get(k, Any) for k in task_options(builder, exclude) or []}


def option_matches(value: Any, hint: Any) -> bool:
    """True when ``value`` has the type ``hint`` (ints, floats, bools, strings, None, sequences, dicts, unions)."""
    import collections.abc
    import numbers
    import types
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or origin is collections.abc.Callable or hint is collections.abc.Callable:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(option_matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float):  # an int is a float too; a bool is neither (numpy scalars count)
        kind = numbers.Real if hint is float else numbers.Integral
        return isinstance(value, kind) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is dict or origin is dict:
        return isinstance(value, dict)
    if origin in (collections.abc.Sequence, list, tuple):  # any sequence but a string: range, numpy arrays too
        seq = isinstance(value, collections.abc.Sequence) or type(value).__name__ == "ndarray"
        return (seq and not isinstance(value, (str, bytes))
                and all(option_matches(v, args[0] if args else Any) for v in value))
    return True  # a type this check does not know: the builder checks it


def _type_name(hint: Any) -> str:
    """``int``, ``Sequence[str] | None``, ...: the hint as it is written in the builder."""
    return getattr(hint, "__name__", None) if isinstance(hint, type) else str(hint).replace("typing.", "").replace(
        "collections.abc.", "")


def _check_options(builder: Callable, kw: dict, name: str, exclude: Sequence[str] = ()) -> None:
    """TaskValidationError naming options ``builder`` does not take (never swallowed as metric options),
    or whose value is not of the type the builder declares."""
    allowed = task_options(builder, exclude)
    unknown = [] if allowed is None else sorted(set(kw) - set(allowed))
    if unknown:
        raise TaskValidationError(f"task {name!r}: unknown option(s) {', '.join(map(repr, unknown))}; "
                                  f"the options are {', '.join(allowed)}")
    types = task_option_types(builder, exclude) if allowed is not None else {}
    for key, value in kw.items():
        hint = types.get(key, Any)
        if not option_matches(value, hint):
            raise TaskValidationError(f"task {name!r}: option {key}={value!r} is not {_type_name(hint)}; "
                                      f"give a value of that type")
