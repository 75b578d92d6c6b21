"""The verdict an interval gives about 0, and the one way an interval is printed (on the ground floor:
the statistics, the run tables' summaries and the CLI all print intervals).

Every summary line that prints an estimate with its interval, or a verdict drawn from one, goes
through here, so that two cases read the same everywhere:

* **no interval** (an end is NaN: two seeds where a jackknife over seeds needs three, too few
  prompts): the line says what the interval needs (:func:`needs_more`) instead of ``[nan, nan]``;
* **a degenerate estimate** (the estimate and its whole interval lie within ``resolution`` of 0,
  e.g. a difference of two stabilities of untrained models, 3e-5 [2e-5, 4e-5]): the verdict is
  "negligible", never "supported" or a direction, however narrow the interval.
"""

from __future__ import annotations

import math


__all__ = ["RESOLUTION", "interval_verdict", "is_negligible", "interval_text", "needs_more"]

RESOLUTION = 1e-4
"""The default resolution of statistics bounded by 1 (stabilities, similarities, Jaccards, shares and
their differences): their summaries print four decimals, so an effect whose interval lies within
+-1e-4 prints as 0.0000 and is called negligible, not supported."""

NEGLIGIBLE = "negligible"


def _finite(*xs: float) -> bool:
    return all(x is not None and math.isfinite(float(x)) for x in xs)


def is_negligible(value: float, low: float, high: float, resolution: float) -> bool:
    """Return True when the estimate and both ends of its interval lie within ``resolution`` of 0."""
    if resolution <= 0 or not _finite(value, low, high):
        return False
    return max(abs(float(value)), abs(float(low)), abs(float(high))) <= resolution


def interval_verdict(low: float, high: float, above: str, below: str, undefined: str = "inconclusive", *,
                     value: float | None = None, resolution: float = 0.0) -> str:
    """Return ``above`` when the interval lies above 0, ``below`` when below, ``undefined`` when an end is
    missing (NaN), "negligible" when the estimate (``value``, default the midpoint) and the interval lie
    within ``resolution`` of 0, else "inconclusive"."""
    if not _finite(low, high):
        return undefined
    mid = (float(low) + float(high)) / 2 if value is None else value
    if is_negligible(mid, low, high, resolution):
        return NEGLIGIBLE
    if low > 0:
        return above
    if high < 0:
        return below
    return "inconclusive"


def needs_more(unit: str, need: int, have: int) -> str:
    """Return why there is no interval, e.g. "needs >= 3 seeds, have 2"."""
    return f"needs >= {need} {unit}, have {have}"


def _num(x: float, digits: int) -> str:
    return f"{float(x):.{digits}g}"


def interval_text(value: float, low: float, high: float, *, digits: int = 3, missing: str | None = None) -> str:
    """Return "value [low, high]", or, where an end is NaN, the value and why there is no interval
    (``missing``, e.g. :func:`needs_more`'s text) instead of "[nan, nan]"."""
    v = _num(value, digits) if _finite(value) else "undefined"
    if _finite(low, high):
        return f"{v} [{_num(low, digits)}, {_num(high, digits)}]"
    return f"{v} (no interval{': ' + missing if missing else ''})"
