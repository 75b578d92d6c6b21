"""Errors raised for bad user input: each message names the problem and the fix."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from a user (spec, source, data); the CLI prints it as one line and exits 2."""


class UnsupportedArchitectureError(InputError):
    """A model family the functional forward pass does not implement."""
