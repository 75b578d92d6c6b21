"""stats.calibration: the coverage engine measured against analytic coverage."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from stats.calibration import IntervalKind, coverage_study


def _t_interval(X: np.ndarray, seed) -> dict:
    lo, hi = sps.t.interval(0.95, X.shape[0] - 1, loc=X.mean(0), scale=sps.sem(X, axis=0))
    return {"low": lo, "high": hi}


def _population(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    pop = rng.normal(0.0, 1.0, (20000, 6)) + np.array([0, 0, 0, 0.5, 1.0, -1.0])
    pop[:, :3] -= pop[:, :3].mean(0)  # three null units, population mean exactly 0
    return pop, np.array([True, True, True, False, False, False])


def test_t_interval_on_normal_population_covers_at_nominal() -> None:
    pop, null = _population()
    kind = IntervalKind("t", "mean", _t_interval, truth=lambda n: pop.mean(0), null=null)
    res = coverage_study(pop, [30], [kind], n_datasets=400, seed=1)
    row = res.rows[0]
    # analytic: 0.95 (normal data, t interval); 2400 cells -> MC SE ~0.0045
    assert 0.93 <= row["coverage"] <= 0.97
    assert 0.03 <= row["null_rejection_rate"] <= 0.07
    expected_width = 2 * sps.t.ppf(0.975, 29) * 1.0 / np.sqrt(30) * np.sqrt(29 / 30) * 1.0
    assert row["mean_width"] == pytest.approx(expected_width, rel=0.05)


def test_degenerate_intervals_are_caught_from_both_sides() -> None:
    pop, null = _population()
    wide = IntervalKind("wide", "mean", lambda X, s: {"low": np.full(6, -1e9), "high": np.full(6, 1e9)},
                        truth=lambda n: pop.mean(0), null=null)
    point = IntervalKind("point", "mean", lambda X, s: {"low": X.mean(0), "high": X.mean(0)},
                         truth=lambda n: pop.mean(0), null=null)
    res = coverage_study(pop, [20], [wide, point], n_datasets=50, seed=2)
    by = {r["kind"]: r for r in res.rows}
    assert by["wide"]["coverage"] == 1.0 and by["wide"]["null_rejection_rate"] == 0.0
    assert by["point"]["coverage"] == 0.0 and by["point"]["null_rejection_rate"] == 1.0


def test_reliable_flag_and_tables_and_reproducibility() -> None:
    pop, null = _population()

    def flagged(X, s):
        out = _t_interval(X, s)
        out["reliable"] = np.array([True, False, True, False, True, False])
        return out

    kind = IntervalKind("t", "mean", flagged, truth=lambda n: pop.mean(0), null=null)
    a = coverage_study(pop, [10, 40], [kind], n_datasets=40, seed=3)
    b = coverage_study(pop, [10, 40], [kind], n_datasets=40, seed=3)
    assert a.to_table().equals(b.to_table())
    assert [r["share_reliable"] for r in a.rows] == [0.5, 0.5]
    assert set(a.table_names()) == {"coverage", "coverage_per_unit"}
    assert a.to_table("coverage_per_unit").num_rows == 2 * 6
    assert "coverage" in a.summary()


def test_bad_settings_are_refused() -> None:
    pop, null = _population()
    kind = IntervalKind("t", "mean", _t_interval, truth=lambda n: pop.mean(0), null=null)
    with pytest.raises(ValueError, match="at least 20"):
        coverage_study(pop, [10], [kind], n_datasets=5)
    with pytest.raises(ValueError, match="below 2"):
        coverage_study(pop, [1], [kind], n_datasets=20)
