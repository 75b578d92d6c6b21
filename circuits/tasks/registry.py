"""The task registry: built-in and user-registered task builders, and make_task by name or file."""

from __future__ import annotations

import os
from typing import Callable, Sequence

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


def make_task(name: str, tokenizer=None, n: int | None = None, seed: int = 0, **kw) -> Task:
    """Build a task by name: ``induction``, ``ioi``, ``greater-than``, ``file`` (``path=...``), a
    registered custom name, or a path to a task file. ``tokenizer`` may be a tokenizer or anything
    :func:`circuits.tokenizers.load_tokenizer` accepts (e.g. ``"gpt2"``)."""
    from circuits.tokenizers import load_tokenizer

    if tokenizer is not None and isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(tokenizer)
    key = str(name)
    if n is not None:
        n = check_int(f"task {key!r}: n", n, minimum=1)
    seed = check_int(f"task {key!r}: seed", seed, minimum=0)
    if key.lower().endswith(_FILE_SUFFIXES) and key not in TASKS:
        _check_options(file_task, kw, key, exclude=("path",))
        return file_task(key, tokenizer, n=n, seed=seed, **kw)
    builder = TASKS.get(key) or TASKS.get(key.lower().replace("_", "-")) or TASKS.get(key.lower())
    if builder is None:
        raise TaskValidationError(
            f"unknown task {name!r}; choose one of {sorted(set(TASKS))} or give a .jsonl/.csv/.parquet file"
        )
    _check_options(builder, kw, key)
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


def _check_options(builder: Callable, kw: dict, name: str, exclude: Sequence[str] = ()) -> None:
    """TaskValidationError naming options ``builder`` does not take (never swallowed as metric options)."""
    allowed = task_options(builder, exclude)
    unknown = [] if allowed is None else sorted(set(kw) - set(allowed))
    if unknown:
        raise TaskValidationError(f"task {name!r}: unknown option(s) {', '.join(map(repr, unknown))}; "
                                  f"the options are {', '.join(allowed)}")
