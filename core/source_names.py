"""The name a loaded model records as its source: its path, unless a caller hides paths.

A circuitstat server runs jobs on models it names for its users (``served:NAME``, ``zoo:RECIPE/seed-S``);
the paths those names resolve to are the server's own and must not reach a job's manifest, tables or
report. Inside :func:`public_source_names`, a model loaded from a registered path records the public name
instead (circuitstat.circuits.loading and circuitstat.circuits.skeleton ask :func:`recorded_source`); outside it, nothing changes.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from pathlib import Path
from typing import Iterator

__all__ = ["public_source_names", "register_source_name", "recorded_source", "hiding_paths"]

_NAMES: ContextVar[dict[str, str] | None] = ContextVar("circuitstat_public_source_names", default=None)


@contextlib.contextmanager
def public_source_names() -> Iterator[dict[str, str]]:
    """Within: paths hidden; :func:`register_source_name` maps a path to the name a model loaded from it records."""
    names: dict[str, str] = {}
    token = _NAMES.set(names)
    try:
        yield names
    finally:
        _NAMES.reset(token)


def hiding_paths() -> bool:
    """True inside :func:`public_source_names`: errors and records name no server path."""
    return _NAMES.get() is not None


def register_source_name(path: str | Path, name: str) -> None:
    """None; inside :func:`public_source_names`, a model loaded from ``path`` records ``name`` as its source."""
    names = _NAMES.get()
    if names is not None:
        names[str(path)] = name
        names[str(Path(path).resolve())] = name


def recorded_source(source: str | Path) -> str:
    """The source a model loaded from ``source`` records: its public name where one is registered."""
    names = _NAMES.get()
    source = str(source)
    if names is None:
        return source
    return names.get(source, names.get(str(Path(source).resolve()), source))
