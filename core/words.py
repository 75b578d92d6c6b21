"""Counted nouns in user-facing text: "1 edge", "2 edges" (never "1 edges")."""

from __future__ import annotations

__all__ = ["counted"]


def counted(n: int, noun: str, plural: str | None = None, *, thousands: bool = False) -> str:
    """Return "n noun" with the noun in the plural unless n is 1 (``plural``: an irregular plural; ``thousands``:
    n with thousands separators)."""
    word = noun if n == 1 else (plural or noun + "s")
    return f"{n:,} {word}" if thousands else f"{n} {word}"
