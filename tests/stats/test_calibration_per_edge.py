"""Per-edge calibration reporting: the worst edge (name, |mean| rank, kurtosis), coverage among cells flagged
reliable per edge, coverage of unreliable cells, coverage by kurtosis decile (issue 34, part 3)."""

import numpy as np
import pytest
import scipy.stats

from circuitstat.stats.calibration import IntervalKind, coverage_study
from circuitstat.stats.calibration_kinds import edge_interval_kinds
from circuitstat.stats.tails import edge_tails, kurtosis_deciles

P = 2000
SPIKE = 200.0


def _population(seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """9 Gaussian edges, and edge 'spike': one prompt in 2,000 carries its mean (10 edges: one per kurtosis decile)."""
    rng = np.random.default_rng(seed)
    gauss = rng.normal(loc=np.linspace(0.2, 2.0, 9), scale=np.linspace(0.5, 2.0, 9), size=(P, 9))
    spike = rng.normal(0.0, 0.1, P)
    spike -= spike.mean()
    spike[17] = SPIKE  # population mean 0.1, all of it (and more) from prompt 17
    pop = np.column_stack([gauss[:, :5], spike, gauss[:, 5:]])
    return pop, [f"g{i}" for i in range(5)] + ["spike"] + [f"g{i}" for i in range(5, 9)]


def test_edge_tails_match_scipy_and_brute_force():
    pop, _ = _population()
    t = edge_tails(pop)
    np.testing.assert_allclose(t.excess_kurtosis, scipy.stats.kurtosis(pop, axis=0, fisher=True, bias=True),
                               rtol=1e-9)
    totals = pop.sum(0)
    brute = [max(x * np.sign(s) for x in col) / abs(s) for col, s in zip(pop.T, totals)]
    np.testing.assert_allclose(t.top_prompt_share, brute, rtol=1e-12)
    assert t.top_prompt_share[5] == pytest.approx(SPIKE / totals[5]) and t.top_prompt_share[5] > 0.99
    assert sorted(t.abs_mean_rank) == list(range(1, 11)) and t.abs_mean_rank[np.argmax(np.abs(t.mean))] == 1
    assert t.abs_mean_rank[5] == 10  # the spike edge's mean (0.1) is the smallest
    const = edge_tails(np.ones((10, 2)))
    assert np.isnan(const.excess_kurtosis).all()
    bins, edges = kurtosis_deciles(np.arange(20.0))
    assert np.bincount(bins).tolist() == [2] * 10 and edges[0] == 0 and edges[-1] == 19


def test_spike_edge_is_the_worst_and_gaussian_edges_cover_near_nominal():
    pop, names = _population()
    kinds = edge_interval_kinds(pop, n_resamples=100, confidence_level=0.95, edge_names=names,
                                methods=["studentized_symmetric"])
    res = coverage_study(pop, [64], kinds, n_datasets=400, seed=3)
    row = res.to_table("coverage").to_pylist()[0]
    units = {r["unit_label"]: r for r in res.to_table("coverage_per_unit").to_pylist()}
    # one prompt in 2,000: a dataset of 64 holds it about 3% of the time, and misses the mean otherwise
    assert row["worst_unit"] == "spike" and row["worst_unit_coverage"] < 0.2
    assert row["worst_unit_abs_mean_rank"] == 10
    assert row["worst_unit_excess_kurtosis"] == pytest.approx(scipy.stats.kurtosis(pop[:, 5]), rel=1e-9)
    assert row["worst_unit_excess_kurtosis"] > 1000 and row["worst_unit_top_prompt_share"] > 0.99
    gauss = [units[n]["coverage"] for n in names if n != "spike"]
    # bounded from both sides: 400 datasets, binomial SE 0.011 at 0.95
    assert 0.90 <= min(gauss) and max(gauss) <= 0.99
    assert row["n_units_below_floor"] == 1
    # a kurtosis decile holds the spike edge alone, and it is the worst decile
    dec = res.to_table("coverage_by_kurtosis").to_pylist()
    top = dec[-1]
    assert top["decile"] == 10 and top["n_units"] == 1 and top["coverage"] == pytest.approx(units["spike"]["coverage"])
    assert len(dec) == 10 and min(d["coverage"] for d in dec[:-1]) > 0.9


def _flagging_kind(pop: np.ndarray) -> IntervalKind:
    """A t interval that flags reliable exactly the cells whose dataset holds no value above 50 (the spike)."""
    truth = pop.mean(0)

    def compute(X, seed):
        m, se = X.mean(0), X.std(0, ddof=1) / np.sqrt(len(X))
        q = scipy.stats.t.ppf(0.975, len(X) - 1)
        return {"low": m - q * se, "high": m + q * se, "reliable": np.broadcast_to((X < 50).all(0), m.shape)}

    return IntervalKind("edge/t-flagged", "mean", compute, truth=lambda n: truth,
                        unit_labels=[f"e{i}" for i in range(pop.shape[1])], unit_info=edge_tails(pop).unit_info())


def test_reliable_and_unreliable_cells_per_edge_add_up():
    pop, _ = _population(1)
    res = coverage_study(pop, [64], [_flagging_kind(pop)], n_datasets=300, seed=5, min_reliable_cells=20)
    row = res.to_table("coverage").to_pylist()[0]
    units = res.to_table("coverage_per_unit").to_pylist()
    for u in units:
        assert u["n_reliable_cells"] + u["n_unreliable_cells"] == 300
        mixed = (u["coverage_reliable"] * u["n_reliable_cells"]
                 + np.nan_to_num(u["coverage_unreliable"]) * u["n_unreliable_cells"]) / 300
        assert mixed == pytest.approx(u["coverage"])
    spike = units[5]
    # datasets without the spike are flagged reliable on the spike edge, and all of them miss its mean;
    # the few that hold it are flagged unreliable and cover
    assert spike["coverage_reliable"] == 0.0 and spike["n_unreliable_cells"] > 0
    assert spike["coverage_unreliable"] == 1.0
    assert row["worst_reliable_unit"] == "e5" and row["worst_reliable_unit_coverage"] == 0.0
    assert row["worst_reliable_unit_cells"] == spike["n_reliable_cells"]
    assert row["n_units_reliable_below_floor"] == 1
    unrel = sum(u["coverage_unreliable"] * u["n_unreliable_cells"] for u in units if u["n_unreliable_cells"])
    assert row["coverage_unreliable"] == pytest.approx(unrel / sum(u["n_unreliable_cells"] for u in units))
