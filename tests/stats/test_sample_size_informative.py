"""width_upper_below_pilot (issue 49 item 3 follow-up): a planning bound above the width the pilot already shows
plans nothing, and predict_widths says so per (edge, N)."""

from __future__ import annotations

import numpy as np

from circuitstat.stats.sample_size import predict_widths


def spiky_pilot(n0: int = 32, edges: int = 6, seed: int = 0) -> np.ndarray:
    """Return n0 standard-normal rows with one 30-SD spike per edge (each edge's on its own row)."""
    S = np.random.default_rng(seed).standard_normal((n0, edges))
    S[np.arange(edges), np.arange(edges)] += 30.0
    return S


def normal_pilot(n0: int = 32, edges: int = 6, seed: int = 0) -> np.ndarray:
    """Return n0 standard-normal rows: the F law of the bound is exact, and nothing is beyond the pilot's view."""
    return np.random.default_rng(seed).standard_normal((n0, edges))


def test_a_spiky_pilots_bounds_are_flagged_uninformative_at_every_n():
    """One 30-SD spike per edge in 32 rows: the bound is still an upper bound, but at least 1000 times the pilot's
    own width at every N (the halves with and without the spike disagree wildly), so no edge's bound is informative."""
    w = predict_widths(spiky_pilot(), [64, 128, 512], n_resamples=199, seed=0)
    assert w["width_upper_below_pilot"].dtype == bool
    assert not w["width_upper_below_pilot"].any()
    assert np.all(w["width_upper"] > 1e3 * w["pilot_width"])


def test_a_normal_pilots_bounds_are_informative_well_above_the_pilots_size():
    """The control: on normal rows the bound at N = 4 n0 and 16 n0 is well below the pilot's width (about 0.7 and
    0.35 of it), so every edge's is informative; at N = 16 < n0 no bound is (a smaller run does not narrow)."""
    w = predict_widths(normal_pilot(), [16, 128, 512], n_resamples=199, seed=0)
    big = w["n"] >= 128
    assert w["width_upper_below_pilot"][big].all()
    assert not w["width_upper_below_pilot"][~big].any()
    # the flag is the strict comparison with the pilot's own width, nothing else (an inverted rule fails here)
    np.testing.assert_array_equal(w["width_upper_below_pilot"], w["width_upper"] < w["pilot_width"])
    assert np.all(w["width_upper"][big] < 0.8 * w["pilot_width"][big])


def test_an_edge_constant_in_the_pilot_is_not_informative():
    """A constant edge has pilot width 0 and bound 0: the pilot saw no spread, so its 0 promises nothing."""
    S = normal_pilot()
    S[:, 2] = 1.5
    w = predict_widths(S, [512], n_resamples=199, seed=0)
    assert w["pilot_width"][2] == 0.0 and w["width_upper"][2] == 0.0
    assert not w["width_upper_below_pilot"][2] and w["width_upper_below_pilot"][[0, 1, 3, 4, 5]].all()


def test_the_point_width_raises_the_heavy_tail_factor_to_the_median_self_calibration_and_never_tops_the_bound(
        monkeypatch):
    """The point width's heavy-tail factor is median_sd_growth ** c, c the pilot's self-calibration at the median
    (its halves as truth): c = 1 on normal rows, so the width is the factor's own; c > 1 on Student-t(2) rows, and
    the width is exactly the c = 1 width times growth ** (c - 1) (recomputed here); on the spiky pilot the point is
    capped at the one-sided bound, which it never exceeds anywhere."""
    from circuitstat.core.seeds import spawn_seeds
    from circuitstat.stats import sample_size
    from circuitstat.stats.sample_size import edge_kurtosis, kurtosis_growth, median_sd_growth, self_calibration

    orig = sample_size.self_calibration

    def at_one(S, level, quantile=None, **kw):
        return 1.0 if quantile == 0.5 else orig(S, level, quantile=quantile, **kw)

    heavy = np.random.default_rng(3).standard_t(2, (32, 6))
    for S, heavy_tailed in ((normal_pilot(), False), (heavy, True)):
        w = predict_widths(S, [128, 512], n_resamples=199, seed=4)
        c_cal, c_growth = spawn_seeds(spawn_seeds(4, 2)[1], 2)
        c = self_calibration(S, 0.9, quantile=0.5, seed=c_cal)
        assert (c > 1.0) is heavy_tailed and c >= 1.0
        with monkeypatch.context() as m:
            m.setattr(sample_size, "self_calibration", at_one)
            w1 = predict_widths(S, [128, 512], n_resamples=199, seed=4)
        kappa = edge_kurtosis(S)[1] * kurtosis_growth(S, seed=c_growth)
        for n in (128, 512):
            sel = w["n"] == n
            want = np.minimum(w1["width"][sel] * median_sd_growth(32, n, kappa) ** (c - 1.0), w["width_upper"][sel])
            np.testing.assert_allclose(w["width"][sel], want, rtol=1e-12)
        assert np.all(w["width"] <= w["width_upper"])
    w = predict_widths(spiky_pilot(), [64, 512], n_resamples=199, seed=0)
    assert np.all(w["width"] <= w["width_upper"]) and np.any(w["width"] == w["width_upper"])
    # the negative control: without the cap the spiky pilot's point would top its bound (the factor is huge there)
    c_cal, c_growth = spawn_seeds(spawn_seeds(0, 2)[1], 2)
    c = self_calibration(spiky_pilot(), 0.9, quantile=0.5, seed=c_cal)
    kappa = edge_kurtosis(spiky_pilot())[1] * kurtosis_growth(spiky_pilot(), seed=c_growth)
    with monkeypatch.context() as m:
        m.setattr(sample_size, "self_calibration", at_one)
        w1 = predict_widths(spiky_pilot(), [64, 512], n_resamples=199, seed=0)
    sel = w1["n"] == 512
    assert np.any(w1["width"][sel] * median_sd_growth(32, 512, kappa) ** (c - 1.0) > w["width_upper"][sel])
