"""Errors raised for bad user input: each message names the problem and the fix."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from a user (spec, source, data); the CLI prints it as one line and exits 2."""


class UnsupportedArchitectureError(InputError):
    """A model family the functional forward pass does not implement."""


class DeprecatedNameWarning(FutureWarning):
    """An old name (a parameter, spec key or command-line flag) was used; the warning names the new one."""


def warn_renamed(old: str, new: str, where: str, stacklevel: int = 3) -> None:
    """Warn that ``old`` is read as ``new`` in ``where`` (old names keep working; one name per concept)."""
    import warnings

    warnings.warn(f"{where}: {old!r} is renamed {new!r}; it is read as {new!r} now, but write {new!r}",
                  DeprecatedNameWarning, stacklevel=stacklevel)
