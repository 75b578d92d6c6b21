"""A claim's bound: testing an observed value against it, and the text of values and bounds in results (each kind's
bound text is one of the ``*_bound`` functions, named by its registry entry)."""

from __future__ import annotations

import math
from typing import Any

from .models import BoundedClaim

__all__ = ["bounded", "cmp_text", "effect_bound", "fmt", "inclusion_bound", "statistic_bound", "circuit_test_bound",
           "verdict_bound"]


def fmt(v: Any) -> str:
    """Return ``v`` as results print it: floats to 4 significant digits (``nan`` for NaN), anything else as str."""
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.4g}"
    return str(v)


def cmp_text(value: float, bound: float, op: str) -> str:
    """Return "value op bound", with more digits of ``value`` where 4 would print it equal to the bound."""
    a, b = fmt(value), fmt(bound)
    if a == b:
        a = f"{value:.10g}"
    return f"{a} {op} {b}"


def bounded(value: float, claim: BoundedClaim, label: str) -> tuple[bool, str]:
    """Return (whether ``value`` lies within the claim's min/max, the reason that says so)."""
    if claim.min is not None and value < claim.min:
        return False, f"{label} is {cmp_text(value, claim.min, '<')}"
    if claim.max is not None and value > claim.max:
        return False, f"{label} is {cmp_text(value, claim.max, '>')}"
    parts = []
    if claim.min is not None:
        parts.append(cmp_text(value, claim.min, ">="))
    if claim.max is not None:
        parts.append(f"<= {fmt(claim.max)}" if parts else cmp_text(value, claim.max, "<="))
    return True, f"{label} is {' and '.join(parts)}"


def statistic_bound(claim: Any) -> str:
    """Return a bound on one statistic as the results table prints it ("f_ci_low >= 0.7 and <= 1")."""
    stat = getattr(claim, "statistic", "")
    parts = []
    if claim.min is not None:
        parts.append(f">= {fmt(claim.min)}")
    if claim.max is not None:
        parts.append(f"<= {fmt(claim.max)}")
    return f"{stat} " + " and ".join(parts)


def inclusion_bound(claim: Any) -> str:
    """Return an edge_in_circuit claim's bound as the results table prints it."""
    return f"inclusion >= {fmt(claim.min_inclusion)}"


def effect_bound(claim: Any) -> str:
    """Return an edge_effect claim's bound (sign, q-value and effect size) as the results table prints it."""
    s = {"positive": "estimate > 0", "negative": "estimate < 0", "nonzero": "estimate != 0"}[claim.sign]
    size = "" if claim.min_abs is None else (f", |{'estimate' if claim.min_abs_of == 'estimate' else 'inner end'}|"
                                              f" >= {fmt(claim.min_abs)}")
    return f"{s}, q <= {fmt(claim.max_q)}{size}"


def verdict_bound(claim: Any) -> str:
    """Return a token_importance claim's bound (the Holm verdict it needs) as the results table prints it."""
    return f"Holm verdict {claim.measure_a} > {claim.measure_b}"


def circuit_test_bound(claim: Any) -> str:
    """Return a circuit test claim's bound (its p-value against alpha) as the results table prints it."""
    return f"{claim.TEST} p {'<=' if claim.WANT_REJECT else '>'} {claim.alpha:g}"
