"""Lazy public names of a package (PEP 562): a name's module is imported on its first use, so importing a
package (or one of its light modules) does not import its heavy ones (torch, scipy, pyarrow)."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

__all__ = ["lazy_names"]


def lazy_names(package: str, modules: dict[str, list[str]]) -> tuple[list[str], Callable[[str], Any]]:
    """Return (``__all__``, ``__getattr__``) for ``package`` from {relative module: [public names]}."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        """The lazily imported public name ``name`` (its module is imported on first use)."""
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        setattr(sys.modules[package], name, value)  # later lookups skip __getattr__
        return value

    return sorted(where), __getattr__
