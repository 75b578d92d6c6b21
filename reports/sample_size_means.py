"""What a sample-size run's Jaccard predictions were simulated from, as a reader sees it: the terminal of
``circuitstat sample-size`` and its figure both read it from the stability table's columns, so they cannot disagree
(the figure's legend is the terminal line's first clause).

Under ``--means tested`` (the default) a pilot that a chi-square test cannot tell from "every edge's mean is 0"
(``pilot_homogeneity_p`` above 5%) is simulated with every mean tied (``means_tied``): its J_N is then what noise
alone gives, and the reader must know that the prediction says "the pilot shows no circuit", not "circuits will be
unstable at N" (docs/sample-size.md, "Tied when the pilot tells no edge apart").
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

__all__ = ["tied_label", "tied_note"]


def tied_label(stability: Mapping[str, Any]) -> str:
    """Return the figure's short label when the means were tied ('' when they were not, or the run predates the
    test); the terminal's line (``tied_note``) begins with it."""
    tied = stability.get("means_tied")
    if tied is None or not np.asarray(tied, dtype=bool).any():
        return ""
    p = float(np.asarray(stability["pilot_homogeneity_p"], dtype=float)[0])
    return f"means tied: no edge's mean told apart (homogeneity p = {p:.2g})"


def tied_note(stability: Mapping[str, Any]) -> str:
    """Return the terminal's line saying the means were tied and what that means ('' when they were not)."""
    label = tied_label(stability)
    if not label:
        return ""
    return (f"{label}; every simulated mean is tied, so J is what noise alone gives: the pilot shows no circuit yet, "
            "and a larger pilot says whether one stands out")
