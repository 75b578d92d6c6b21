"""What a sample-size run's Jaccard predictions were simulated from, as a reader sees it: the terminal of
``circuitstat sample-size`` and its figure both read it from the stability table's columns, so they cannot disagree.

Under ``--means tested`` (the default) a pilot that a chi-square test cannot tell from "every edge's mean is 0"
(``pilot_homogeneity_p`` above 5%) is simulated with every mean tied (``means_tied``): its J_N is then what noise
alone gives, and the reader must know that the prediction says "the pilot shows no circuit", not "circuits will be
unstable at N" (docs/sample-size.md, "Tied when the pilot tells no edge apart").
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

__all__ = ["tied_note"]


def tied_note(stability: Mapping[str, Any]) -> str:
    """Return the line saying the means were tied and why ('' when they were not, or the run predates the test)."""
    tied = stability.get("means_tied")
    if tied is None or not np.asarray(tied, dtype=bool).any():
        return ""
    p = float(np.asarray(stability["pilot_homogeneity_p"], dtype=float)[0])
    return (f"the pilot tells no edge's mean from 0 (homogeneity p = {p:.2g} > 0.05), so every simulated mean is "
            "tied and J is what noise alone gives: the pilot shows no circuit yet; a larger pilot says whether one "
            "stands out")
