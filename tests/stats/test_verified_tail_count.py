"""Issue 48 item 2: the verified flag's approximation tail share looks at max(ceil(sqrt(N_u)), 4.5% of N_u) prompts,
so its sensitivity to a fixed rate of rare spikes does not fall as N grows (stats/verified/reliability.py).

* ``approx_tail_count`` against an integer oracle (math.isqrt and integer division, every N_u up to 5,000): the
  smallest k with k² >= N_u and 200 k >= 9 N_u, so it is ceil(sqrt(N_u)) exactly up to N_u = 511 (N = 512 unchanged).
* a population with a fixed spike rate, built so the shares have a closed form: at N_u = 496 and 1,984 (4×) the new
  count's share is the same to 0.01 and above 0.6, while the old ceil(sqrt(N_u)) share falls below 0.6 at 1,984 (the
  negative control: the old rule's verdict on one population flips with N).
* the flag end to end (ppi_fit, verified_reliability) at N = 2048, n = 16: every other rule passes; the old tail
  count passes the spiky approximation and the new one refuses it; a Gaussian-shaped approximation passes.
* the active design reads the same count on each edge's unsampled cells.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from circuitstat.stats.reliability import RELIABLE_MAX_TAIL_SHARE, tail_share
from circuitstat.stats.verified.active_flag import active_reliability
from circuitstat.stats.verified.ppi import ppi_fit, ppi_intervals
from circuitstat.stats.verified.reliability import approx_tail_count, approx_tail_share, verified_reliability


def test_count_is_the_smallest_k_covering_sqrt_and_the_fraction():
    for n_u in range(1, 5001):
        k = approx_tail_count(n_u)
        ok = lambda j: j * j >= n_u and 200 * j >= 9 * n_u  # noqa: E731 (integer arithmetic: an exact oracle)
        assert ok(k) and not ok(k - 1), n_u
        if n_u <= 511:
            assert k == math.isqrt(n_u - 1) + 1, n_u  # ceil(sqrt(N_u)): nothing changes up to N = 512
    assert approx_tail_count(512) == 24 and approx_tail_count(2032) == 92  # the fraction binds from 512 on
    np.testing.assert_array_equal(approx_tail_count(np.array([480, 496, 600, 2032])), [22, 23, 27, 92])


def _spiky(n_u: int, spikes: int, size: float) -> np.ndarray:
    """n_u values with median 0: n_u / 2 at −1, n_u / 2 − spikes at +1, ``spikes`` at ``size`` (|x − median| 1 or size)."""
    return np.concatenate([-np.ones(n_u // 2), np.ones(n_u // 2 - spikes), np.full(spikes, size)])[:, None]


def _closed_form(n_u: int, spikes: int, size: float, k: int) -> float:
    """The share of Σ |x − median| carried by the k largest of ``_spiky``."""
    return (min(k, spikes) * size + max(k - spikes, 0)) / (spikes * size + n_u - spikes)


def test_share_of_a_fixed_spike_rate_does_not_fall_with_n():
    size = 80.0
    shares = {}
    for n_u in (496, 1984):  # about one spike in 32 prompts at both sizes (15 and 62 spikes)
        x, m = _spiky(n_u, n_u // 32, size), n_u // 32
        assert np.median(x) == 0.0
        new, old = approx_tail_count(n_u), math.isqrt(n_u - 1) + 1
        got_new, got_old = approx_tail_share(x)[0], tail_share(x)[0]
        assert got_new == pytest.approx(_closed_form(n_u, m, size, new), rel=1e-12)
        assert got_old == pytest.approx(_closed_form(n_u, m, size, old), rel=1e-12)
        shares[n_u] = (got_new, got_old)
    assert shares[496][0] == shares[496][1] > RELIABLE_MAX_TAIL_SHARE  # the same k at N_u = 496
    assert shares[1984][0] > RELIABLE_MAX_TAIL_SHARE and abs(shares[1984][0] - shares[496][0]) < 0.01
    assert shares[1984][1] < RELIABLE_MAX_TAIL_SHARE - 0.05  # negative control: the sqrt count stops seeing the same tail


def _flag_case(approx_u: np.ndarray) -> tuple[dict, bool]:
    """verified_reliability at N = 2048, n = 16 on a labelled sample that tracks exact, and the flag with the old count."""
    n = 16
    yhat = np.tile([-1.0, 1.0], n // 2)
    noise = 0.05 * special.ndtri((np.arange(n) + 0.5) / n)[np.argsort(np.arange(n) * 7 % n)]
    Y = (yhat + noise)[:, None]
    fit = ppi_fit(Y, yhat[:, None], approx_u)
    r = ppi_intervals(fit, "tkb")
    out = verified_reliability(fit, r["high"] - r["low"])
    others = (out["rectifier_share"] <= 0.5) & (out["width_ratio"] <= 2.0) & (out["width_vs_exact_all"] <= 20.0)
    assert others.all()  # only the tail rule is under test
    return out, bool((others & (tail_share(approx_u) <= RELIABLE_MAX_TAIL_SHARE))[0])


def test_flag_refuses_a_spike_rate_the_sqrt_count_passes_at_n_2048():
    spiky = _spiky(2032, 2032 // 32, 80.0)
    out, old_flag = _flag_case(spiky)
    assert old_flag  # negative control: the count the flag was chosen with passes this approximation at N = 2048
    assert out["approx_tail_share"][0] > RELIABLE_MAX_TAIL_SHARE and not out["reliable"][0]


def test_flag_passes_a_gaussian_shaped_approximation_at_n_2048():
    gauss = special.ndtri((np.arange(2032) + 0.5) / 2032)[:, None]
    out, old_flag = _flag_case(gauss)
    # the top 4.5% of |z| carry φ(2.0) / φ(0) ≈ 0.135 of Σ |z|: far below 0.6
    assert out["approx_tail_share"][0] == pytest.approx(0.135, abs=0.01)
    assert out["reliable"][0] and old_flag


def test_active_design_reads_the_same_count_on_each_edges_unsampled_cells():
    rng = np.random.default_rng(3)
    N, E = 2048, 4
    Y = rng.standard_t(3, (N, E))
    A = 0.8 * Y + rng.normal(size=(N, E))
    S = rng.random((N, E)) < np.array([0.01, 0.02, 0.2, 0.5])
    p = np.full((N, E), 0.1)
    got = active_reliability(A, Y, S, p, np.full(E, 0.8), np.ones(E))["approx_tail_share"]
    for e in range(E):
        u = A[~S[:, e], e][:, None]
        assert got[e] == pytest.approx(tail_share(u, k=approx_tail_count(u.shape[0]))[0], rel=1e-12)
