"""The active design's per-edge tail flag: the uniform design's rules (circuitstat.stats.verified.reliability) carried
over to a Horvitz–Thompson sample of (prompt, edge) cells.

Under the uniform design every edge's rectifier Y − λŶ is read on n uniformly drawn prompts, each weighted N/n.
Under the active design (circuitstat.stats.verified.active) an edge's estimate is (1/N) Σ [λŶ + ξ/π (Y − λŶ)]: the
rectifier enters through the sampled cells only, each weighted 1/π. What carries over, rule by rule:

* **enough cells**: the sampled cells on the edge play the labelled prompts; below
  ``RELIABLE_MIN_LABELLED`` (16) no edge is flagged, as in the uniform design (measured there: fewer cells seldom
  contain a rare, large error, so no rule can see it).
* **the weighted residual share**: the HT residual terms t = (Y − λŶ)/π over the sampled cells are what the SE
  reads beyond the approximation; when the most extreme one carries more than ``RELIABLE_MAX_RECTIFIER_SHARE`` of
  Σ |t − median t|, the SE and the t quantile rest on one cell. With π = B/N this is the uniform design's rectifier
  share exactly (a constant weight cancels). A small π on a large residual, the failure HT weighting invites, is
  what it sees.
* **the approximation's tail on the unsampled prompts**: λŶ is imputed on the cells nobody patched; when the
  approx_tail_count(N_u) unsampled cells farthest from their median (reliability.py: ceil(sqrt(N_u)), never fewer
  than 4.5% of them) carry more than circuitstat.stats.reliability's 0.6 of Σ |Ŷ − median|, the imputed mean rests on
  a few cells whose exact effect nobody computed. With uniform π the unsampled cells are the uniform design's
  unlabelled prompts, and with N_u <= 511 the count is ceil(sqrt(N_u)) exactly, so nothing changed at N = 512.
* **an interval that says nothing**: wider than ``RELIABLE_MAX_WIDTH_RATIO`` times the t interval of exact on as
  many uniformly drawn prompts as the edge has cells, or than ``RELIABLE_MAX_EXACT_ALL_RATIO`` times the estimated
  z interval of exact on all N prompts (2 z SD / sqrt(N)): reliability.py's two width rules. The SD is
  reliability.py's yardstick with π-weighted (Hájek) moments over the sampled cells, estimates of population moments
  whatever the design: the smaller of the weighted SD without the cell farthest from the sampled cells' median (so
  one large cell cannot widen the yardstick with the interval) and the weighted two-phase regression SD (slope of Y
  on Ŷ over the same cells, Ŷ's variance over all N prompts). With uniform π both are reliability.py's exactly. With
  at least 16 cells the first rule implies the second up to N ≈ 85 × cells (12× at N = 512).

The constants are the uniform design's; docs/verified.md ("Active verification") measures the rule on the
populations it was chosen on and on held-out ones (docs/make_verified_active_flag.py), at N = 512 and at N = 2048
with B = 16 and 32 ("The active design's flag at N = 2048": pooled coverage holds; flagged cells up to 36× exact on
all N, since the width rule no longer implies the cap; per edge it fails on the zoo's `input->a0.h2<q>` and synthetic
seed 11's `e48`, as at N = 512). Beyond N / B = 128 nothing was measured (the verified verdict says so:
circuitstat.reports.verdicts.verified.flag_range_note).
"""

from __future__ import annotations

import warnings

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.stats.reliability import RELIABLE_MAX_TAIL_SHARE

from .active import check_active_inputs, ht_weights
from .reliability import (RELIABLE_MAX_EXACT_ALL_RATIO, RELIABLE_MAX_RECTIFIER_SHARE, RELIABLE_MAX_WIDTH_RATIO,
                          RELIABLE_MIN_LABELLED, approx_tail_count, exact_on_all_width,
                          exact_on_all_width_floor, exact_on_labelled_width, width_over)

__all__ = ["masked_tail_share", "active_reliability", "active_flag", "ACTIVE_FLAG_RULES"]

#: the flag's rules, by name (a rule left out of ``rules`` is not applied: the negative controls)
ACTIVE_FLAG_RULES = ("cells", "residual", "approx_tail", "width")


def masked_tail_share(X: np.ndarray, mask: np.ndarray, k: np.ndarray | None = None) -> np.ndarray:
    """Return per column the share of Σ |x − median| over the cells in ``mask`` carried by its k farthest (0 if none).

    k defaults per column to ceil(sqrt(cells in mask)): circuitstat.stats.reliability.tail_share on each column's
    masked cells (the columns hold different numbers of cells).
    """
    M = np.asarray(mask, bool)
    cnt = M.sum(0)
    kk = np.maximum(1, np.ceil(np.sqrt(cnt))).astype(np.int64) if k is None else np.broadcast_to(k, cnt.shape)
    Xm = np.where(M, np.asarray(X, np.float64), np.nan)
    with warnings.catch_warnings():  # a column with no cell in the mask: median NaN, share 0 below
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(Xm, 0)
    u = np.where(M, np.abs(Xm - med), 0.0)  # off-mask cells sort to the bottom and add nothing
    top = np.cumsum(-np.sort(-u, axis=0), axis=0)
    total = u.sum(0)
    pick = top[np.minimum(kk, u.shape[0]) - 1, np.arange(u.shape[1])]
    return np.where(total > 0, pick / np.where(total > 0, total, 1.0), 0.0)


def _weighted_yardstick_sd(Y: np.ndarray, A: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per column the yardstick SD of reliability.py (ppi.yardstick_sd) over the cells with w > 0, π-weighted (Hájek):
    min(weighted SD without the cell farthest from their median, the weighted two-phase regression SD with A's
    variance over all N prompts). With equal weights both are ppi.py's (the same cell is dropped, the same slope)."""
    S = w > 0
    with warnings.catch_warnings():  # a column with no sampled cell: its SD is 0 and its width ratio inf below
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(np.where(S, Y, np.nan), 0)
    # the plain median of the sampled cells, as reliability.py's yardstick: with equal weights the same cell is dropped
    far = np.where(S, np.abs(Y - med), -np.inf).argmax(0)
    w2 = w.copy()
    w2[far, np.arange(Y.shape[1])] = 0.0
    W2 = np.maximum(w2.sum(0), 1e-300)
    yc, ac = Y - (w2 * Y).sum(0) / W2, A - (w2 * A).sum(0) / W2
    vy, va, cya = ((w2 * yc * yc).sum(0) / W2, (w2 * ac * ac).sum(0) / W2, (w2 * yc * ac).sum(0) / W2)
    c = np.maximum((w2 > 0).sum(0), 2)
    beta = np.where(va > 0, cya / np.where(va > 0, va, 1.0), 0.0)
    resid = np.maximum(vy - beta * cya, 0.0)  # the weighted OLS residual variance
    # the usual c/(c−1) small-sample factor, c the cells kept (ppi.py's divisor c − 1 with equal weights)
    sd_trim, resid = np.sqrt(vy * c / (c - 1)), resid * c / (c - 1)
    return np.minimum(sd_trim, np.sqrt(resid + beta**2 * A.var(0, ddof=1)))


def active_reliability(approx: np.ndarray, exact: np.ndarray, sampled: np.ndarray, probs: np.ndarray,
                       lam: np.ndarray, width: np.ndarray, confidence_level: float = 0.95,
                       rules: tuple[str, ...] = ACTIVE_FLAG_RULES) -> dict[str, np.ndarray]:
    """Return {residual_share, approx_tail_share, width_ratio, width_vs_exact_all, width_vs_exact_all_max, cells,
    reliable} per edge of an active-design interval."""
    A, Y, S, P = check_active_inputs(approx, exact, sampled, probs)
    w = ht_weights(S, P)
    cells = S.sum(0)
    r_share = masked_tail_share(w * (Y - np.asarray(lam) * A), S, k=np.ones_like(cells))
    a_share = masked_tail_share(A, ~S, k=approx_tail_count((~S).sum(0)))  # the uniform design's count
    sd = _weighted_yardstick_sd(Y, A, w)
    ratio = width_over(width, exact_on_labelled_width(sd, cells, confidence_level))
    vs_all = width_over(width, exact_on_all_width(sd, A.shape[0], confidence_level))
    # the certain bound reads the plain SD of the edge's sampled cells: distinct prompts among the N (reliability.py)
    Ys = np.where(S, Y, 0.0)
    dev = np.where(S, Ys - Ys.sum(0) / np.maximum(cells, 1), 0.0)
    sd_cells = np.sqrt((dev * dev).sum(0) / np.maximum(cells - 1, 1))
    vs_all_max = width_over(width, exact_on_all_width_floor(sd_cells, cells, A.shape[0], confidence_level))
    out = {"residual_share": r_share, "approx_tail_share": a_share, "width_ratio": ratio,
           "width_vs_exact_all": vs_all, "width_vs_exact_all_max": vs_all_max, "cells": cells}
    return {**out, "reliable": active_flag(out, rules)}


def active_flag(inputs: dict[str, np.ndarray], rules: tuple[str, ...] = ACTIVE_FLAG_RULES) -> np.ndarray:
    """Return the flag (bool per edge) from active_reliability's inputs, applying only the named ``rules``."""
    unknown = set(rules) - set(ACTIVE_FLAG_RULES)
    if unknown:
        raise InputError(f"unknown flag rules {sorted(unknown)}; use some of {ACTIVE_FLAG_RULES}")
    checks = {"cells": lambda: inputs["cells"] >= RELIABLE_MIN_LABELLED,
              "residual": lambda: inputs["residual_share"] <= RELIABLE_MAX_RECTIFIER_SHARE,
              "approx_tail": lambda: inputs["approx_tail_share"] <= RELIABLE_MAX_TAIL_SHARE,
              "width": lambda: ((inputs["width_ratio"] <= RELIABLE_MAX_WIDTH_RATIO)
                                & (inputs["width_vs_exact_all"] <= RELIABLE_MAX_EXACT_ALL_RATIO))}
    reliable = np.ones(np.shape(inputs["cells"]), bool)
    for name in rules:
        reliable &= checks[name]()
    return reliable
