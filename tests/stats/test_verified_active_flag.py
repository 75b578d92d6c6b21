"""The active design's tail flag (circuitstat.stats.verified.active_flag) and cross-fitted λ (active.active_crossfit).

Coverage is simulated with circuitstat.stats.verified.coverage.simulate_active: datasets of N = 512 prompts drawn with
replacement from a paired population (the estimand is its exact mean), each with the active design's cells. The flag's
guarantees (docs/verified.md, "Active verification") are checked from both sides, per edge, with negative controls:
the flag without its cells rule passes edges that undercover, and without its width rule an interval that says
nothing. The cross-fitted estimate is checked for unbiasedness by Monte Carlo on one dataset (the estimand is the mean
of its N exact scores), with the in-sample λ as the negative control (biased there).
"""

from __future__ import annotations

import numpy as np
import pytest

from fixture_populations import load_planted_pair, load_zoo_pair
from circuitstat.core.errors import InputError
from circuitstat.stats.reliability import tail_share
from circuitstat.stats.verified.active import (active_crossfit, active_means, active_probabilities, active_sample,
                                               ht_weights)
from circuitstat.stats.verified.active_flag import (ACTIVE_FLAG_RULES, active_flag, active_reliability,
                                                    masked_tail_share)
from circuitstat.stats.verified.coverage import simulate_active
from circuitstat.stats.verified.reliability import verified_reliability
from circuitstat.stats.verified.ppi import ppi_fit, ppi_intervals

N = 512


def _without(a: dict, drop: str | None) -> np.ndarray:
    return active_flag(a, tuple(k for k in ACTIVE_FLAG_RULES if k != drop))


def _edge_failures(r: dict, rel: np.ndarray, k_se: float = 2.0, names: list[str] | None = None) -> list:
    """Edges exact on all N covers >= 0.93 (>= 30 flagged cells) whose flagged cells cover < 0.90 by > k_se MC SE
    (their names where ``names`` is given, else their indices)."""
    c, ref = r["active"]["covered"], r["exact_all"]["covered"].mean(0)
    hits, cnt = (c & rel).sum(0), rel.sum(0)
    cov = hits / np.maximum(cnt, 1)
    assess = (cnt >= 30) & (ref >= 0.93)
    bad = np.flatnonzero(assess & (cov < 0.90 - k_se * np.sqrt(0.09 / np.maximum(cnt, 1))))
    return [names[i] for i in bad] if names is not None else bad.tolist()


#: the zoo's worst assessable flagged edge must reach this: the 0.90 floor is NOT met on the zoo at B = 16 and 32
#: (docs/verified.md: 1-2 of its `input->a0.*` edges, which edges depending on the draw, cover 0.82-0.87 in their
#: flagged cells), so the zoo case bounds that gap instead of asserting the floor
ZOO_WORST_FLAGGED_EDGE = 0.80


def _worst_flagged_edge(r: dict, rel: np.ndarray) -> float:
    c, ref = r["active"]["covered"], r["exact_all"]["covered"].mean(0)
    cnt = rel.sum(0)
    cov = (c & rel).sum(0) / np.maximum(cnt, 1)
    return float(cov[(cnt >= 30) & (ref >= 0.93)].min())


def _ratio(r: dict) -> tuple[np.ndarray, np.ndarray]:
    """(width over exact on all N, non-constant edges) per (dataset, edge)."""
    wa = r["exact_all"]["width"]
    ok = wa.mean(0) > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        return r["active"]["width"] / np.where(wa > 0, wa, np.nan), ok


@pytest.fixture(scope="module")
def zoo16():
    X, A, _ = load_zoo_pair()
    return simulate_active(X, A, N, 16, 200, seed=48)


@pytest.mark.parametrize("pop, budget", [("zoo", 32), ("planted", 16), ("planted", 32)])
def test_flag_holds_pooled_and_per_edge(pop, budget):
    X, A, names = load_zoo_pair() if pop == "zoo" else load_planted_pair()
    r = simulate_active(X, A, N, budget, 200, seed=48)
    c, rel = r["active"]["covered"], r["active"]["reliable"]
    per = c.mean(1)
    mc = per.std(ddof=1) / np.sqrt(per.size)
    # pooled 0.93-0.98 (the issue's), less 3 MC SE below: measured 0.932 ± 0.001 on the zoo (docs/verified.md)
    assert 0.93 - 3 * mc <= c.mean() <= 0.98
    assert 0.3 < rel.mean() < 1.0  # the flag passes some cells and refuses some
    flagged = (c & rel).sum() / rel.sum()
    assert 0.925 <= flagged <= 0.985
    if pop == "zoo":
        assert _worst_flagged_edge(r, rel) >= ZOO_WORST_FLAGGED_EDGE
    else:
        assert _edge_failures(r, rel, names=names) == []
    ratio, ok = _ratio(r)
    assert np.nanmax(ratio[:, ok][rel[:, ok]]) <= 20  # no flagged interval wider than 20× exact on all N
    assert np.mean(ratio[:, ok] > 100) <= 0.005


def test_flag_without_its_cells_rule_fails_per_edge(zoo16):
    """Negative control: at 16 expected cells per edge, the flag without ">= 16 cells" passes cells that undercover
    on some zoo edge (exact on all N >= 0.93), and every other rule left out does not rescue that."""
    a = zoo16["active"]
    assert len(_edge_failures(zoo16, _without(a, "cells"))) > len(_edge_failures(zoo16, a["reliable"]))
    assert _worst_flagged_edge(zoo16, _without(a, "cells")) < _worst_flagged_edge(zoo16, a["reliable"]) - 0.03
    flagged = lambda rel: (a["covered"] & rel).sum() / rel.sum()  # noqa: E731
    assert flagged(_without(a, "cells")) < flagged(a["reliable"]) - 0.01
    # no flag at all: every cell counts, and the per-edge check fails on an edge the flag keeps above the floor
    assert set(_edge_failures(zoo16, active_flag(a, ()))) - set(_edge_failures(zoo16, a["reliable"]))


def test_width_rule_refuses_an_interval_that_says_nothing():
    """An edge with a large mean and an approximation that tracks none of it (λ ≈ 0): the Horvitz–Thompson summands
    ξY/π are not centred, so the interval is many times exact on as many prompts as cells; the width rule refuses
    it, and without that rule the flag passes intervals > 20× exact on all N (the negative control)."""
    rng = np.random.default_rng(3)
    P, E = 4000, 4
    X = 10.0 + rng.normal(size=(P, E))
    A = rng.normal(size=(P, E))
    r = simulate_active(X, A, N, 32, 100, seed=5)
    ratio, ok = _ratio(r)
    a = r["active"]
    assert (a["width_ratio"] > 2).mean() > 0.99 and not a["reliable"].any()
    loose = _without(a, "width")
    assert loose.mean() > 0.5 and np.nanmax(ratio[loose]) > 20


def test_flag_inputs_equal_the_uniform_design_under_uniform_probabilities():
    """With π = n/N on a fixed set of n prompts for every edge, the weighted residual share is the uniform design's
    rectifier share and the approximation's tail share is its unlabelled tail share (reliability.py), computed
    independently; the width yardstick is reliability.py's (ppi.yardstick_sd), and so are both width rules."""
    rng = np.random.default_rng(0)
    n, E = 40, 5
    Y = rng.standard_t(3, (N, E))
    A = 0.8 * Y + rng.normal(size=(N, E))
    S = np.zeros((N, E), bool)
    S[rng.choice(N, n, replace=False)] = True
    p = np.full((N, E), n / N)
    lab = S[:, 0]
    fit = ppi_fit(Y[lab], A[lab], A[~lab])
    width = ppi_intervals(fit, "tkb")["high"] - ppi_intervals(fit, "tkb")["low"]
    got = active_reliability(A, Y, S, p, fit.lam, width)
    want = verified_reliability(fit, width)
    np.testing.assert_allclose(got["residual_share"], tail_share(Y[lab] - fit.lam * A[lab], k=1), rtol=1e-12)
    np.testing.assert_allclose(got["approx_tail_share"], want["approx_tail_share"], rtol=1e-12)
    # Hájek moments with equal weights are the plain ones: the yardstick (trimmed SD and two-phase regression SD) and
    # both width rules are reliability.py's
    np.testing.assert_allclose(got["width_ratio"], want["width_ratio"], rtol=1e-9)
    np.testing.assert_allclose(got["width_vs_exact_all"], want["width_vs_exact_all"], rtol=1e-9)
    np.testing.assert_array_equal(got["reliable"], want["reliable"])
    assert (got["cells"] == n).all()


def test_masked_tail_share_is_tail_share_on_each_column_cells():
    rng = np.random.default_rng(1)
    X = rng.standard_t(2, (60, 7))
    M = rng.random((60, 7)) < 0.6
    got = masked_tail_share(X, M)
    for e in range(7):
        assert got[e] == pytest.approx(tail_share(X[M[:, e], e][:, None])[0], rel=1e-12)
    assert masked_tail_share(X, np.zeros_like(M)).tolist() == [0.0] * 7  # no cell: share 0, no warning
    with pytest.raises(InputError, match="unknown flag rules"):
        active_flag({"cells": np.ones(2)}, ("size",))


#: zoo edges whose in-sample estimate was biased beyond 4 MC SE on this dataset, chosen with other draws (seeds
#: 100-107, 4000 draws, every non-constant edge); the test below draws with seeds 1000 on
BIASED = ["a0.h0->a1.h0<q>", "a0.h0->a1.h2<q>", "a0.h1->a1.h3<q>", "a0.h3->a1.h3<q>", "input->a1.h0<k>",
          "a0.h0->a1.h1<k>", "a0.h1->a1.h3<k>", "a0.h2->a1.h3<k>", "a0.h0->a1.h3<v>", "a0.h1->a1.h3<v>", "a0.h3->logits"]


def test_crossfit_is_unbiased_where_the_in_sample_fit_is_not():
    """Given one dataset's N prompts, the only randomness is the draw of cells, and the estimand is the mean of the
    N exact scores. Cross-fitted λ (each fold's from the other fold's cells) gives an estimate unbiased within 4 MC
    SE on each edge; the in-sample λ is biased beyond 4 MC SE on several (the negative control)."""
    X, A, names = load_zoo_pair()
    cols = [names.index(e) for e in BIASED]
    rows = np.random.default_rng(0).integers(0, X.shape[0], N)
    Xs, As = X[rows][:, cols], A[rows][:, cols]
    E, R, chunk = len(cols), 6000, 1500
    p = active_probabilities(As, 16)
    At, Xt, pt = np.tile(As, chunk), np.tile(Xs, chunk), np.tile(p, chunk)
    est, cf = [], []
    for c in range(R // chunk):
        S = active_sample(pt, 1000 + c)
        est.append(active_means(At, Xt, S, pt)["estimate"].reshape(chunk, E))
        cf.append(active_crossfit(At, Xt, S, pt)["estimate"].reshape(chunk, E))
    truth = Xs.mean(0)
    z = {k: (v.mean(0) - truth) / (v.std(0, ddof=1) / np.sqrt(R))
         for k, v in (("in", np.concatenate(est)), ("cf", np.concatenate(cf)))}
    assert np.abs(z["cf"]).max() <= 4, z["cf"]
    assert (np.abs(z["in"]) > 4).sum() >= 3, z["in"]


def test_crossfit_uses_the_other_fold_only():
    """A cell's λ is fitted without its own fold: changing an exact score in fold 0 changes fold 1's λ only."""
    rng = np.random.default_rng(2)
    A = rng.normal(size=(200, 3))
    Y = A + rng.normal(size=(200, 3))
    p = active_probabilities(A, 40)
    S = active_sample(p, 9)
    base = active_crossfit(A, Y, S, p)["lam"]
    i = int(np.flatnonzero(S[:, 0] & (np.arange(200) % 2 == 0))[0])
    Y2 = Y.copy()
    Y2[i, 0] += 5.0
    moved = active_crossfit(A, Y2, S, p)["lam"]
    assert moved[0, 0] == base[0, 0] and moved[1, 0] != base[1, 0]
    assert np.array_equal(moved[:, 1:], base[:, 1:])
    # weights: 1/π on the sampled cells only
    w = ht_weights(S, p)
    assert np.array_equal(w > 0, S) and np.allclose(w[S], 1 / p[S])
