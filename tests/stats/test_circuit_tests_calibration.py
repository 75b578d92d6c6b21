"""Calibration of the circuit hypothesis tests on a planted model's cached per-prompt evaluations.

The pool (tests/fixtures/make_circuit_tests_pool.py) is the population: datasets are resamples of it, so the
truth of every null, and for three tests the exact size of the test, are known. Rejection rates are bounded
from both sides (within 3 Monte Carlo SE of the exact size) with R small enough to take seconds; the full
R = 200 study over N is in docs/hypothesis-tests.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from circuitstat.stats import circuit_tests_calibration as C

POOL = Path(__file__).parents[1] / "fixtures" / "circuit-tests-pool-planted03.npz"
ALPHA = 0.1


@pytest.fixture(scope="module")
def pool() -> dict:
    with np.load(POOL) as z:
        arrays = {k: z[k].astype(np.float64) if z[k].dtype.kind == "f" else z[k] for k in z.files}
    out: dict = {"full": arrays["full"]}
    for label in ("truth", "plus_inert", "plus_null"):
        out[label] = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith(label + ".")}
    return out


def _within(hits: np.ndarray, exact: float, n_se: float = 3.0) -> None:
    rate, _ = C.rejection_rate(hits)
    se = math.sqrt(exact * (1 - exact) / hits.size)
    assert abs(rate - exact) <= n_se * se + 1e-12, (rate, exact, se)


def test_equivalence_size_at_the_pools_boundary(pool):
    full, circuit = pool["full"], pool["truth"]["circuit"]
    q, margin = C.boundary_margin(full, circuit)
    assert 0.4 < q < 0.6  # the true circuit scores above the model on about half the prompts
    exact = C.equivalence_size(24, q, margin, ALPHA)
    assert 0.03 < exact <= ALPHA  # the least favourable null: the test holds its level, and not trivially
    _within(C.simulate_equivalence(full, circuit, 24, 400, margin=margin, alpha=ALPHA, seed=1), exact)


def test_rank_tests_are_exact_under_exchangeability(pool):
    t = pool["truth"]
    exact = C.rank_size(19, ALPHA)
    assert exact == pytest.approx(0.1)
    for test, cand, rand in (("sufficiency", t["circuit"], t["random"]),
                             ("partial_necessity", t["complement"], t["random_complement"])):
        _within(C.simulate_random_rank(pool["full"], cand, rand, 16, 400, n_random=19, alpha=ALPHA, seed=2,
                                       test=test, exchangeable=True), exact)


def test_hsic_size_when_the_complement_comes_from_another_prompt(pool):
    hits = C.simulate_independence(pool["full"], pool["truth"]["complement"], 20, 200, n_permutations=19,
                                   alpha=ALPHA, seed=3, independent=True)
    _within(hits, 0.1)


def test_true_circuit_passes_and_broken_circuits_fail(pool):
    full, t = pool["full"], pool["truth"]
    # the true circuit: sufficient, equivalent (margin 0.1: rejection within its exact size, far below alpha)
    assert C.rejection_rate(C.simulate_random_rank(full, t["circuit"], t["random"], 32, 60, n_random=19,
                                                   alpha=0.05, seed=4))[0] >= 0.95
    q, _ = C.boundary_margin(full, t["circuit"])
    eq = C.simulate_equivalence(full, t["circuit"], 32, 200, margin=0.1, alpha=0.05, seed=5)
    _within(eq, C.equivalence_size(32, q, 0.1, 0.05))
    assert C.rejection_rate(C.simulate_minimality(t["circuit"], t["minus"], t["plus"], 32, 60, n_random=30,
                                                  quantile=0.9, alpha=0.05, correction="holm", seed=6))[0] == 0.0
    # minus the induction head's value edge: not equivalent at N = 32 (its q is far below 1/2 - 0.1)
    j = list(t["edges"]).index("input->a1.h0<v>")
    assert C.rejection_rate(C.simulate_equivalence(full, t["minus"][:, j], 32, 60, margin=0.1, alpha=0.05,
                                                   seed=7))[0] >= 0.9
    # plus an inert null edge (no effect on any prompt): not minimal, in every dataset
    p = pool["plus_inert"]
    assert C.rejection_rate(C.simulate_minimality(p["circuit"], p["minus"], p["plus"], 32, 60, n_random=30,
                                                  quantile=0.9, alpha=0.05, correction="holm", seed=8))[0] == 1.0
