"""The one resolver for paths that a file names (confinement), used wherever a file names a path.

A file may come from someone else: a claims file's ``run:`` and ``spec:``, a spec's ``model:`` and task
file, a head-study plan's ``recipe.corpus`` and ``recipe.tokenizer``, a ``zoo:`` name, the tables a run
directory holds for ``query``. Whoever wrote the file decides what it may read only within the tree
it was placed in: a path it names is resolved against the file's own directory (never the current
one) and must stay inside that directory's tree -- no absolute path, no ``~``, no ``..`` and no
symbolic link that leads out -- unless the command line (the user, not the file) passes
``--allow-outside``. Refusals name the key and the file, never the value, since the value itself
may be the secret (``spec: /etc/shadow``).
"""

from __future__ import annotations

import os
from pathlib import Path

from circuitstat.core.errors import InputError

__all__ = ["resolve_inside", "resolve_in_dir", "inside", "looks_like_path"]


def inside(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """True when ``path``, every symbolic link followed, lies in ``root``'s tree (root resolved too)."""
    return Path(path).resolve().is_relative_to(Path(root).resolve())


def looks_like_path(value: str) -> bool:
    """True when ``value`` is written as a path: absolute, ``~``, ``.``-relative or with a ``..`` part."""
    raw = Path(value)
    return raw.is_absolute() or value.startswith(("~", ".")) or ".." in raw.parts


def resolve_in_dir(base: str | os.PathLike[str], value: str, *, key: str, where: str,
                   allow_outside: bool = False, flag: str = "--allow-outside") -> Path:
    """The path ``value`` (named under ``key`` by ``where``) resolved against directory ``base``.

    Unless ``allow_outside``, it must stay in ``base``'s tree (InputError naming ``key``, ``where``
    and ``flag``, never ``value``).
    """
    base = Path(base)
    raw = Path(value).expanduser() if allow_outside else Path(value)
    target = base / raw
    if allow_outside:
        return target
    if raw.is_absolute() or value.startswith("~"):
        raise InputError(f"'{key}:' in {where} is an absolute path; paths in the file are relative to it and "
                         f"must stay in its directory (pass {flag} to allow it)")
    if not inside(target, base):
        raise InputError(f"'{key}:' in {where} leads outside the file's directory (through '..' or a "
                         f"symbolic link); move the target under it or pass {flag} to allow it")
    return target


def resolve_inside(base_file: str | os.PathLike[str], value: str, *, key: str, allow_outside: bool = False,
                   flag: str = "--allow-outside") -> Path:
    """The path ``value`` (read from ``base_file`` under ``key``) resolved relative to that file's
    directory and confined to its tree (see :func:`resolve_in_dir`)."""
    return resolve_in_dir(Path(base_file).parent, value, key=key, where=str(base_file), allow_outside=allow_outside,
                          flag=flag)
