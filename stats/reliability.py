"""Per-edge reliability of a mean's interval: is the mean carried by a few examples?

Per-example attribution scores are heavy-tailed: on many edges a handful of prompts carry most
of the mean. The diagnostic here is the *tail share*: the share of sum |x - median| carried by
the k = ceil(sqrt(N)) examples farthest from the median. Gaussian samples give about 0.42 /
0.31 / 0.25 at N = 32 / 64 / 128 (99.9th percentile 0.57 / 0.40 / 0.30); a sample whose mean
rests on one spike gives nearly 1.

`no_tail_seen` (the edge tables' column; before issue 34 it was called ``interval_reliable``) is tail
share <= `RELIABLE_MAX_TAIL_SHARE` = 0.6: above it, a few prompts carry the estimate, and Gaussian-like
data essentially never get there at N >= 32. The name says what it can say: no tail was *seen* in this
sample, not that the interval covers.

What was measured (symmetric studentized bootstrap, 95%, 400 datasets, table in docs/calibration.md): the
threshold was checked on a spike-free lognormal / Student-t(2.5) population (flagged-reliable
coverage 0.948 / 0.949 at N = 64 / 128) and verified, unchanged, on real exact scores of a zoo
model (0.948 / 0.949) and on the spiky synthetic population (0.900 / 0.926: short of 0.93). Two
findings shape how to read the flag:

* Intervals of edges flagged *unreliable* over-cover (a visible spike widens the interval):
  the flag says the estimate and its sign rest on a few prompts, not that the interval is
  too narrow.
* What makes intervals undercover is a spike that is *absent* from the sample (events rarer
  than 1/N that carry the mean): such a sample looks Gaussian and no per-edge sample
  diagnostic can see it. Only more prompts, or a calibration study on a larger population of
  the same task, can show it. "No tail seen" therefore lowers, but cannot remove, that risk.

Per edge it does not hold at all (issue 34, bench/tail_coverage.py, docs/calibration.md): among cells flagged
reliable the worst edge covered 0.34-0.89 on the spiky, smooth, zoo and two trained 3-4-layer MLP populations and 0.00 on one
where one prompt in 2,048 carries most of an edge's mean (98% of those cells flagged reliable); tail share <=
0.4, excess kurtosis <= 3 and max |z| <= 3.5 did no better. No sample statistic can: a sample that missed the
spike is a sample of the spike-free population. The median and trimmed mean (circuitstat.stats.robust) are the
estimands a few prompts cannot move.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["RELIABLE_MAX_TAIL_SHARE", "tail_count", "tail_share", "no_tail_seen", "interval_reliable"]

#: largest tail share (k = ceil(sqrt(N)) examples' share of sum |x - median|) with no_tail_seen true
RELIABLE_MAX_TAIL_SHARE = 0.6


def tail_count(n_obs: int) -> int:
    """Return k = ceil(sqrt(N)), the number of extreme examples the tail share looks at."""
    return max(1, math.ceil(math.sqrt(n_obs)))


def tail_share(S: np.ndarray, k: int | None = None, axis: int = 0) -> np.ndarray:
    """Return per edge the share of sum |x - median| carried by the k examples farthest from it.

    `S` holds examples along `axis` (default [N, E]). k defaults to ceil(sqrt(N)). A constant
    edge (sum |x - median| = 0) has share 0: its interval is a point and is exact.
    """
    x = np.moveaxis(np.asarray(S, dtype=np.float64), axis, -1)
    n = x.shape[-1]
    k = tail_count(n) if k is None else int(k)
    if not 1 <= k <= n:
        raise ValueError(f"k must lie in [1, N={n}], got {k}")
    # centred at the median, so a lone spike counts fully (about the mean, Σ|x - mean| is split
    # evenly between the spike and the rest, capping the share near 1/2)
    u = np.abs(x - np.median(x, axis=-1, keepdims=True))
    total = u.sum(axis=-1)
    top = -np.partition(-u, k - 1, axis=-1)[..., :k]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, top.sum(axis=-1) / np.where(total > 0, total, 1.0), 0.0)


def no_tail_seen(S: np.ndarray, threshold: float = RELIABLE_MAX_TAIL_SHARE, axis: int = 0) -> np.ndarray:
    """Return True per edge where the tail share is at most `threshold`: no few examples visibly carry the mean.

    True does not mean the interval covers: a spike absent from the sample is invisible (module docstring).
    """
    return tail_share(S, axis=axis) <= threshold


#: the old name of :func:`no_tail_seen` (kept so imports of it still work)
interval_reliable = no_tail_seen
