"""Per-edge reliability of a verified run's interval: does the estimate rest on a few prompts, and does it say anything?

Two places can carry an edge's estimate on a few prompts, and a verified run sees both:

* the labelled rectifier Y − λ Yhat (n prompts): when its single most extreme prompt carries more than
  half of sum |r − median(r)|, the SE and the t quantile rest on that one prompt;
* the approximation on the unlabelled prompts (N_u of them): its tail share (circuitstat.stats.reliability, the
  k = ceil(sqrt(N_u)) prompts farthest from the median) above circuitstat.stats.reliability's 0.6 says the imputed
  mean rests on a few prompts whose exact effect nobody computed.

* too few labelled prompts: below 16, no edge is flagged reliable. Measured (docs/verified.md): at n = 8 the
  flag passed cells covering 0.82-0.86 on 4 zoo edges and 2 synthetic ones, whose EAP errors are rare and
  large (excess kurtosis 8-67): 8 prompts seldom contain one, so neither rule above can see them.
* an interval that says nothing (issue 48): wider than ``RELIABLE_MAX_WIDTH_RATIO`` times the t interval of
  exact patching on the n labelled prompts alone (its SD taken without the most extreme labelled prompt, so
  that one large prompt in the sample cannot widen the yardstick with the interval). Exact on n prompts is
  what phase 2 computed anyway; a verified interval much wider than it adds nothing, and exact on all N
  prompts is about sqrt(N / n) times narrower still. Measured (docs/verified.md): with this rule no flagged
  interval was more than 20 times as wide as exact on all N on any population.

What no flag can see is a heavy tail absent from the data: an edge whose mean rests on prompts rarer
than 1/N (or, for the rectifier, rarer than 1/n) looks well-behaved in every dataset that lacks them,
and undercovers there; exact patching on all N prompts fails on those edges the same way
(docs/verified.md lists them).
"""

from __future__ import annotations

import numpy as np
from scipy import special

from circuitstat.stats.reliability import RELIABLE_MAX_TAIL_SHARE, tail_share

__all__ = ["RELIABLE_MAX_RECTIFIER_SHARE", "RELIABLE_MIN_LABELLED", "RELIABLE_MAX_WIDTH_RATIO",
           "exact_on_labelled_width", "verified_reliability"]

#: largest share of sum |r − median(r)| the most extreme labelled prompt may carry for "reliable"
RELIABLE_MAX_RECTIFIER_SHARE = 0.5
#: fewest labelled prompts for any edge to be flagged reliable (below it the flag failed where measured)
RELIABLE_MIN_LABELLED = 16
#: widest a flagged interval may be, as a multiple of exact on the labelled prompts (``exact_on_labelled_width``)
RELIABLE_MAX_WIDTH_RATIO = 2.0


def exact_on_labelled_width(fit, confidence_level: float = 0.95) -> np.ndarray:
    """Return per edge the t interval width of exact on the n labelled prompts, SD without the most extreme one."""
    q = special.stdtrit(fit.n - 1, 0.5 + confidence_level / 2)
    return 2.0 * q * fit.exact_ref_sd / np.sqrt(fit.n)


def verified_reliability(fit, width: np.ndarray | None = None, confidence_level: float = 0.95
                         ) -> dict[str, np.ndarray]:
    """Return {rectifier_share, approx_tail_share, width_ratio, reliable} per edge of a PPIFit and its interval width."""
    r_share = tail_share(fit.rectifier, k=1)
    a_share = fit.approx_tail_share
    enough = fit.n >= RELIABLE_MIN_LABELLED
    reliable = (r_share <= RELIABLE_MAX_RECTIFIER_SHARE) & (a_share <= RELIABLE_MAX_TAIL_SHARE) & enough
    out = {"rectifier_share": r_share, "approx_tail_share": a_share}
    if width is not None:
        ref = exact_on_labelled_width(fit, confidence_level)
        with np.errstate(divide="ignore", invalid="ignore"):
            out["width_ratio"] = np.where(ref > 0, np.asarray(width) / np.where(ref > 0, ref, 1.0),
                                          np.where(np.asarray(width) > 0, np.inf, 0.0))
        reliable = reliable & (out["width_ratio"] <= RELIABLE_MAX_WIDTH_RATIO)
    out["reliable"] = reliable
    return out
