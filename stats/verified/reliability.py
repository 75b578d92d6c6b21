"""Per-edge reliability of a verified run's interval: does the estimate rest on a few prompts?

Two places can carry an edge's estimate on a few prompts, and a verified run sees both:

* the labelled rectifier Y − λ Yhat (n prompts): when its single most extreme prompt carries more than
  half of sum |r − median(r)|, the SE and the t quantile rest on that one prompt;
* the approximation on the unlabelled prompts (N_u of them): its tail share (circuitstat.stats.reliability, the
  k = ceil(sqrt(N_u)) prompts farthest from the median) above circuitstat.stats.reliability's 0.6 says the imputed
  mean rests on a few prompts whose exact effect nobody computed.

What no flag can see is a heavy tail absent from the data: an edge whose mean rests on prompts rarer
than 1/N (or, for the rectifier, rarer than 1/n) looks well-behaved in every dataset that lacks them,
and undercovers there; exact patching on all N prompts fails on those edges the same way
(docs/verified.md lists them).
"""

from __future__ import annotations

import numpy as np

from circuitstat.stats.reliability import RELIABLE_MAX_TAIL_SHARE, tail_share

__all__ = ["RELIABLE_MAX_RECTIFIER_SHARE", "verified_reliability"]

#: largest share of sum |r − median(r)| the most extreme labelled prompt may carry for "reliable"
RELIABLE_MAX_RECTIFIER_SHARE = 0.5


def verified_reliability(fit) -> dict[str, np.ndarray]:
    """Return {rectifier_share, approx_tail_share, reliable} per edge of a circuitstat.stats.verified.ppi.PPIFit."""
    r_share = tail_share(fit.rectifier, k=1)
    a_share = fit.approx_tail_share
    return {"rectifier_share": r_share, "approx_tail_share": a_share,
            "reliable": (r_share <= RELIABLE_MAX_RECTIFIER_SHARE) & (a_share <= RELIABLE_MAX_TAIL_SHARE)}
