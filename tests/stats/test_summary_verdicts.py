"""Summary lines never print [nan, nan] or call a degenerate estimate "supported" (issue 23 item 4)."""

from __future__ import annotations

import math

import numpy as np

from circuitstat.stats.study_claims import ClaimRows

NAN = math.nan


def test_a_degenerate_claim_is_negligible_however_small_its_p_value():
    """`study heads --quick` printed '0.0000 [0.0000, 0.0000] supported': 2.8e-5 [2.4e-5, 3.5e-5], p 5e-17."""
    rows = ClaimRows()
    rows.add("excess gap of untrained models", 2.756e-05, 2.384e-05, 3.463e-05, 5.5e-17, +1, "jackknife")
    rows.add("a real effect", 0.15, 0.10, 0.20, 1e-6, +1, "jackknife")
    rows.add("a real effect the other way", -0.15, -0.20, -0.10, 1e-6, +1, "jackknife")
    rows.add("a tiny estimate with a wide interval", 2e-5, -0.3, 0.3, 0.9, +1, "jackknife")
    t = rows.table()
    assert list(t["verdict"]) == ["negligible", "supported", "contradicted", "inconclusive"]


def test_interval_verdict_calls_an_interval_inside_the_resolution_negligible():
    from circuitstat.stats.intervals import RESOLUTION, interval_verdict

    assert interval_verdict(2e-5, 3e-5, "stable", "unstable", resolution=RESOLUTION) == "negligible"
    assert interval_verdict(2e-5, 3e-5, "stable", "unstable") == "stable"  # no resolution: as before
    assert interval_verdict(0.2, 0.3, "stable", "unstable", resolution=RESOLUTION) == "stable"
    assert interval_verdict(-0.3, -0.2, "stable", "unstable", resolution=RESOLUTION) == "unstable"
    assert interval_verdict(NAN, 0.3, "stable", "unstable", "undefined", resolution=RESOLUTION) == "undefined"


def test_an_interval_that_needs_more_seeds_says_so():
    from circuitstat.stats.intervals import interval_text, needs_more

    assert interval_text(0.0417, NAN, NAN, missing=needs_more("seeds", 3, 2)) == \
        "0.0417 (no interval: needs >= 3 seeds, have 2)"
    assert interval_text(NAN, NAN, NAN) == "undefined (no interval)"
    assert interval_text(0.5, 0.25, 0.75) == "0.5 [0.25, 0.75]"


def test_two_seeds_print_what_the_across_seed_interval_needs():
    """Today: `tokens --model A --model B` printed every across-seed interval as [nan, nan]."""
    from circuitstat.stats.token_importance import token_stability

    rng = np.random.default_rng(0)
    orders = {"attention": np.stack([np.argsort(rng.random((6, 8)), axis=1) for _ in range(2)])}
    res = token_stability(orders, np.ones((6, 8), dtype=bool), [1, 3])
    text = res.summary()
    assert "nan" not in text and text.count("needs >= 3 seeds, have 2") == 2
    three = token_stability({"attention": np.concatenate([orders["attention"], orders["attention"][:1]])},
                            np.ones((6, 8), dtype=bool), [1])
    assert "needs" not in three.summary() and "[" in three.summary()
