"""Thresholds the verdicts apply that a spec can set, with their bounds (no imports: the spec reads them cheaply)."""

from __future__ import annotations

__all__ = ["MIN_EXCESS", "MIN_EXCESS_BOUNDS"]

# A head counts as above its shuffled-prompt null only when its interval's lower end exceeds this excess (a cosine
# similarity of attention patterns): layer 0's +0.02 to +0.04 over a null near 0.85 is not a stable head. The audit
# spec's heads.min_excess and --min-excess set it, within MIN_EXCESS_BOUNDS.
MIN_EXCESS = 0.1
MIN_EXCESS_BOUNDS = (0.0, 1.0)
