"""circuitstat.stats.calibration: the coverage engine measured against analytic coverage."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from circuitstat.core.errors import InputError
from circuitstat.stats.calibration import IntervalKind, clustered_rate, coverage_study
from circuitstat.stats.calibration_kinds import (PopulationEvaluations, edge_interval_kinds, faithfulness_interval_kinds,
                                    stability_interval_kinds, stability_truth)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fixture_populations import load_zoo_fixture  # noqa: E402


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
    # analytic: 0.95 (normal data, t interval); 400 datasets of 6 independent units -> MC SE ~0.0045
    assert 0.93 <= row["coverage"] <= 0.97
    assert 0.03 <= row["null_rejection_rate"] <= 0.07
    # independent units: the dataset-level SEs are near the binomial ones over all cells (their SD ~5%)
    assert row["coverage_mc_se"] == pytest.approx(np.sqrt(0.95 * 0.05 / 2400), rel=0.2)
    assert row["null_rejection_mc_se"] == pytest.approx(np.sqrt(0.05 * 0.95 / 1200), rel=0.2)
    assert np.isnan(row["coverage_reliable"]) and np.isnan(row["share_reliable"])  # the t interval flags nothing
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
    assert a.to_pandas().equals(b.to_pandas())  # NaN where a kind describes no unit: equal in the same places
    assert [r["share_reliable"] for r in a.rows] == [0.5, 0.5]
    assert set(a.table_names()) == {"coverage", "coverage_per_unit", "coverage_by_kurtosis"}
    assert a.to_table("coverage_by_kurtosis").num_rows == 0  # the kind gives no kurtosis: no deciles
    assert a.to_table("coverage_per_unit").num_rows == 2 * 6
    np.testing.assert_allclose([u["truth"] for u in a.per_unit if u["n"] == 10], pop.mean(0))
    assert [u["unit_label"] for u in a.per_unit[:6]] == [str(i) for i in range(6)]
    assert "coverage" in a.summary()


def test_bad_settings_are_refused() -> None:
    pop, null = _population()
    kind = IntervalKind("t", "mean", _t_interval, truth=lambda n: pop.mean(0), null=null)
    with pytest.raises(ValueError, match="at least 20"):
        coverage_study(pop, [10], [kind], n_datasets=5)
    with pytest.raises(ValueError, match="below 2"):
        coverage_study(pop, [1], [kind], n_datasets=20)


# --- Monte Carlo error: the dataset is the unit ------------------------------------------------
def test_clustered_rate_equals_statsmodels_cluster_robust_se() -> None:
    """Oracle: the cluster-robust SE (datasets as clusters) of an intercept-only OLS on the 0/1 cells."""
    import statsmodels.api as sm

    rng = np.random.default_rng(7)
    sizes = rng.integers(1, 9, 30)  # unequal denominators, as the reliable units of each dataset
    cells = [rng.random(m) < rng.uniform(0.5, 1.0) for m in sizes]  # a per-dataset rate: correlated cells
    y = np.concatenate(cells).astype(float)
    groups = np.repeat(np.arange(sizes.size), sizes)
    fit = sm.OLS(y, np.ones_like(y)).fit(cov_type="cluster", cov_kwds={"groups": groups})
    rate, se = clustered_rate([c.sum() for c in cells], sizes)
    assert rate == pytest.approx(fit.params[0], rel=1e-12) and se == pytest.approx(fit.bse[0], rel=1e-10)
    # equal denominators: the SD over datasets of each one's rate / sqrt(D)
    hits = rng.random((25, 7)) < 0.8
    rate, se = clustered_rate(hits.sum(1), np.full(25, 7))
    assert se == pytest.approx(hits.mean(1).std(ddof=1) / 5, rel=1e-12)
    assert np.isnan(clustered_rate([1.0], [2.0])[1]) and np.isnan(clustered_rate([0.0, 0.0], [0, 0])[0])


def test_reported_mc_se_matches_the_spread_of_coverage_over_repeated_studies() -> None:
    """The acceptance test of issue 23 item 5: run the study R times with independent seeds on the zoo
    fixture (real, heavy-tailed, correlated edges) and compare the SD of coverage across the R studies
    with the SE each study reports. The per-edge kinds are those `study calibration` runs.

    Bounds: under a correct SE, s_obs² / mean(SE²) is about F(R − 1, df), df = R (D − 1) shrunk for the
    per-dataset covered share's excess kurtosis (an allowance of 6: df = R (D − 1) / (1 + (D − 1) 6 / 2D));
    0.0005 / 0.9995 quantiles per kind (six kinds, one family of about 0.006). The former SE, which
    counted every (dataset, edge) cell and each edge's null copy as independent, is about half the
    spread (ratio 1.8-2.5 here) and fails the upper bound.
    """
    pop = np.asarray(load_zoo_fixture()[0], dtype=np.float64)
    kinds = edge_interval_kinds(pop, n_resamples=100, confidence_level=0.95)
    R, D = 40, 20
    cov, se = np.empty((R, len(kinds))), np.empty((R, len(kinds)))
    for r, ss in enumerate(np.random.SeedSequence(2023).spawn(R)):
        rows = coverage_study(pop, [32], kinds, n_datasets=D, seed=ss).rows
        cov[r], se[r] = [x["coverage"] for x in rows], [x["coverage_mc_se"] for x in rows]
    df = R * (D - 1) / (1 + (D - 1) * 6 / (2 * D))
    lo, hi = np.sqrt(sps.f.ppf([0.0005, 0.9995], R - 1, df))
    ratio = cov.std(0, ddof=1) / np.sqrt((se ** 2).mean(0))
    assert np.all((lo <= ratio) & (ratio <= hi)), (lo, hi, dict(zip([k.name for k in kinds], ratio.round(2))))
    assert np.all(cov.mean(0) > 0.8)  # the kinds work (coverage 0.84-0.94 here), so the SE is of a real rate


def test_edge_intervals_are_translation_equivariant_so_a_null_copy_adds_nothing() -> None:
    """Why the edge kinds have no null copies: every method gives X − c the interval of X shifted by c (and
    the same reliability flags), so a copy centred at 0 rejects 0 exactly when the edge misses its mean."""
    from circuitstat.stats.intervals import METHODS, bootstrap_edges

    X = np.asarray(load_zoo_fixture()[0], dtype=np.float64)[np.random.default_rng(3).integers(0, 1024, 48)]
    # the one constant edge (a structural zero) has no spread to shift: X - 0.37 carries rounding noise,
    # which the studentized intervals divide by; every other edge is checked
    X = X[:, X.std(0) > 0]
    shift = X.mean(0) + 0.37
    a = bootstrap_edges(X, n_resamples=300, seed=5, methods=list(METHODS))
    b = bootstrap_edges(X - shift, n_resamples=300, seed=5, methods=list(METHODS))
    scale = np.abs(X).max()
    for m in METHODS:
        np.testing.assert_allclose(b.conf_int(which=m).to_array() + shift[:, None], a.conf_int(which=m).to_array(), rtol=0, atol=1e-9 * scale,
                                   err_msg=m)
    np.testing.assert_array_equal(a.reliable, b.reliable)


def test_edge_kinds_have_one_unit_per_edge_and_no_null_units() -> None:
    pop = np.asarray(load_zoo_fixture()[0], dtype=np.float64)
    kinds = edge_interval_kinds(pop, n_resamples=60, confidence_level=0.95)
    row = coverage_study(pop, [16], kinds[:1], n_datasets=20, seed=0).rows[0]
    assert row["n_units"] == pop.shape[1] and np.isnan(row["null_rejection_rate"])
    np.testing.assert_array_equal(kinds[0].truth(16), pop.mean(0))


# --- stability kinds: the Monte Carlo truth against exact enumeration -------------------------
def _exact_stability(pop: np.ndarray, n: int, k: int, ranking: str) -> tuple[float, float, float]:
    """Exact E[J(D1, D2)], E[J(D, pop)] and E[Kuncheva(D1, D2)] by enumerating every ordered dataset
    of n rows and every tie-breaking order of the edges (each equally likely)."""
    P, E = pop.shape
    orders = list(itertools.permutations(range(E)))
    key_of = abs if ranking == "absolute" else float

    def set_law(mean: np.ndarray) -> dict[frozenset, float]:
        law: dict[frozenset, float] = {}
        for order in orders:  # order[e] = e's tie priority: among equal keys, lower priority first
            ranked = sorted(range(E), key=lambda e: (-key_of(mean[e]), order[e]))
            key = frozenset(ranked[:k])
            law[key] = law.get(key, 0.0) + 1.0 / len(orders)
        return law

    data_law: dict[frozenset, float] = {}
    datasets = list(itertools.product(range(P), repeat=n))
    for rows in datasets:
        for s, p in set_law(pop[list(rows)].mean(0)).items():
            data_law[s] = data_law.get(s, 0.0) + p / len(datasets)
    pop_law = set_law(pop.mean(0))

    def expect(law_a, law_b, f) -> float:
        return sum(pa * pb * f(len(a & b)) for a, pa in law_a.items() for b, pb in law_b.items())

    jac = lambda i: i / (2 * k - i)  # noqa: E731
    kun = lambda i: (i * E - k * k) / (k * (E - k))  # noqa: E731
    return expect(data_law, data_law, jac), expect(data_law, pop_law, jac), expect(data_law, data_law, kun)


@pytest.mark.parametrize("ranking", ["absolute", "signed"])
def test_stability_truth_matches_exact_enumeration(ranking: str) -> None:
    # small integers: dataset means tie exactly (two all-zero edges, and |2| = |-2| across rows),
    # so the random tie-breaking of the truth is checked too
    pop = np.array([[3.0, -2.0, 0.0, 0.0, 1.0], [0.0, 2.0, 0.0, 0.0, -1.0], [1.0, 1.0, 0.0, 0.0, 2.0]])
    truth = stability_truth(pop, 3, [1, 2, 3], ranking=ranking, n_pairs=40000, seed=5)
    for i, k in enumerate(truth.ks):
        want = _exact_stability(pop, 3, int(k), ranking)
        for name, value in zip(("jaccard_data", "jaccard_pop", "phi_data"), want):
            got, se = getattr(truth, name)[i], getattr(truth, f"{name}_mc_se")[i]
            assert abs(got - value) <= 4 * se + 1e-12, (ranking, k, name, got, value, se)
    assert truth.n_pairs == 40000 and np.all(truth.jaccard_data_mc_se < 0.01)


def test_stability_truth_does_not_depend_on_chunking_and_refuses_bad_ks() -> None:
    pop = np.random.default_rng(0).standard_t(3, (200, 12))
    a = stability_truth(pop, 16, [2, 4], ranking="absolute", n_pairs=300, seed=1, chunk=300)
    b = stability_truth(pop, 16, [4, 2, 4], ranking="absolute", n_pairs=300, seed=1, chunk=300)
    assert np.array_equal(a.jaccard_data, b.jaccard_data) and a.ks.tolist() == [2, 4]
    with pytest.raises(InputError, match="below the 12 edges"):
        stability_truth(pop, 16, [2, 12], ranking="absolute", n_pairs=300)
    with pytest.raises(InputError, match=r"\[1, 11\]"):
        stability_interval_kinds(pop, [0, 3], ranking="absolute", n_resamples=100)


# --- faithfulness kinds: an additive model, where f_pop(C) is exact --------------------------------
def _additive(pop: np.ndarray, base: np.ndarray, calls: list):
    """evaluate() of an additive model: m(C)(n) = m0(n) + sum of C's scores of prompt n; records calls."""

    def evaluate(masks: np.ndarray, rows: np.ndarray):
        calls.append((masks.shape[0], rows.size))
        m0 = base[rows]
        return m0[:, None] + pop[rows] @ masks.T.astype(float), m0 + pop[rows].sum(1), m0

    return evaluate


def test_faithfulness_kinds_truth_is_population_faithfulness_of_the_selected_circuit() -> None:
    rng = np.random.default_rng(4)
    pop = rng.gamma(0.5, 1.0, (400, 15)) * rng.choice([-1.0, 1.0, 2.0], 15)
    base = rng.normal(0, 1, 400)
    calls: list = []
    ev = PopulationEvaluations(_additive(pop, base, calls), 400, 15)
    kinds = faithfulness_interval_kinds(ev, [3, 6], ranking="absolute", n_resamples=100)
    assert [k.name for k in kinds] == ["faithfulness/selected", "faithfulness/fixed", "faithfulness/fixed_bca"]
    rows = rng.integers(0, 400, 40)
    X = pop[rows]
    out = {k.name: k.compute(X, np.random.SeedSequence(1), rows) for k in kinds}
    # oracle: the top-k of the dataset's mean |scores| (continuous: no ties), its exact population faithfulness
    order = np.argsort(-np.abs(X.mean(0)))
    want = [pop.mean(0)[order[:k]].sum() / pop.mean(0).sum() for k in (3, 6)]
    for name in out:
        np.testing.assert_allclose(out[name]["truth"], want, rtol=1e-12)
        assert np.all(out[name]["low"] < out[name]["high"])
    # the fixed-circuit interval is centred near the in-sample faithfulness of the selected circuit
    in_sample = [X.mean(0)[order[:k]].sum() / X.mean(0).sum() for k in (3, 6)]
    for name in ("faithfulness/fixed", "faithfulness/fixed_bca"):
        assert np.all((out[name]["low"] <= in_sample) & (in_sample <= out[name]["high"]))
    # the fixed kind is the audit's Fieller set of the selected circuits on the dataset's prompts (oracle: the
    # set computed directly), flagged reliable where bounded, covering by membership
    from circuitstat.stats.fieller import fieller_faithfulness

    masks = np.stack([np.isin(np.arange(15), order[:k]) for k in (3, 6)])
    ref = fieller_faithfulness(X @ masks.T.astype(float) + base[rows, None], X.sum(1) + base[rows], base[rows])
    fixed = out["faithfulness/fixed"]
    np.testing.assert_allclose(fixed["low"], ref.low, rtol=1e-9)
    np.testing.assert_allclose(fixed["high"], ref.high, rtol=1e-9)
    assert np.array_equal(fixed["reliable"], ref.shape == "bounded")
    assert np.array_equal(fixed["covers"](fixed["truth"]), ref.covers(fixed["truth"]))
    # each (circuit, prompt) pair runs through evaluate at most once, however often it is asked for
    before = ev.circuit_rows
    again = ev.get(np.vstack([np.arange(15) < 3, np.arange(15) < 3]), rows)[0]
    assert ev.circuit_rows - before <= np.unique(rows).size and np.array_equal(again[:, 0], again[:, 1])
    ev.get(np.arange(15)[None] < 3, rows)
    assert sum(c * r for c, r in calls[1:]) == ev.circuit_rows <= len(ev.values) * 400


def test_stability_kinds_read_the_right_interval_and_truth() -> None:
    from circuitstat.stats.populations import smooth_tail_population
    from circuitstat.stats.stability import circuit_stability

    pop = smooth_tail_population(400, 12, seed=3)
    kinds = {k.name: k for k in stability_interval_kinds(pop, [2, 4], ranking="absolute", n_resamples=100,
                                                         n_truth_pairs=3000, seed=1)}
    X = pop[np.random.default_rng(0).integers(0, 400, 40)]
    seed = np.random.SeedSequence(9)
    ref = circuit_stability(X, None, [2, 4], ranking="absolute", n_resamples=100, seed=seed,
                            n_rank_resamples=0, data_level=True)
    other = stability_truth(pop, 40, [2, 4], ranking="absolute", n_pairs=3000, seed=77)  # independent draw
    for name, interval, truth in (("jaccard_data", "jaccard_data_ci", "jaccard_data"),
                                  ("jaccard_pop", "jaccard_pop_ci", "jaccard_pop"),
                                  ("phi_data", "phi_data_ci", "phi_data"), ("jaccard_mc", "jaccard_ci", "jaccard_data")):
        out = kinds[f"stability/{name}"].compute(X, seed)
        np.testing.assert_array_equal(out["low"], ref.conf_int(which=interval).low)
        np.testing.assert_array_equal(out["high"], ref.conf_int(which=interval).high)
        se = np.hypot(getattr(other, f"{truth}_mc_se"), getattr(other, f"{truth}_mc_se"))
        assert np.all(np.abs(kinds[f"stability/{name}"].truth(40) - getattr(other, truth)) <= 5 * se + 1e-12)


def test_faithfulness_kinds_coverage_in_an_additive_model_on_real_zoo_scores() -> None:
    """End to end through coverage_study: in an additive model (f exact) on the zoo score fixture the
    selection-aware interval covers f_pop(C(D)) near nominal and the fixed-circuit one less often.
    Not a blind check: circuitstat.stats.faithfulness chose its method on this fixture (0.938-0.978 there); this
    tests that the kinds hand the engine the right intervals and truths."""
    pop = np.asarray(load_zoo_fixture()[0], dtype=np.float64)
    ev = PopulationEvaluations(_additive(pop, np.zeros(pop.shape[0]), []), *pop.shape)
    kinds = faithfulness_interval_kinds(ev, [5, 10, 20], ranking="absolute", n_resamples=200)
    by = {r["kind"]: r for r in coverage_study(pop, [64], kinds, n_datasets=150, seed=11).rows}
    sel, fixed = by["faithfulness/selected"], by["faithfulness/fixed"]
    assert 0.90 <= sel["coverage"] <= 0.995, sel["coverage"]  # 450 cells: MC SE ~0.01
    assert fixed["coverage"] < sel["coverage"]  # the fixed circuit's interval ignores the selection
    assert sel["mean_width"] < 3 * fixed["mean_width"]  # not bought by a uselessly wide interval


def test_a_set_that_is_not_an_interval_covers_by_membership_not_by_its_hull() -> None:
    """A kind returning ``covers`` (Fieller's union of two rays) is counted by it: truth in the gap between the rays
    is a miss although the hull (−inf, inf) holds it (negative control: the same kind without ``covers`` counts the
    hull and reports coverage 1), and null rejection reads the same membership."""
    pop = np.random.default_rng(0).normal(size=(50, 2))
    gap = lambda v: (np.asarray(v) <= -1.0) | (np.asarray(v) >= 1.0)  # noqa: E731  (−inf, −1] ∪ [1, inf)

    def union(X, seed):
        return {"low": np.full(2, -np.inf), "high": np.full(2, np.inf), "truth": np.array([0.5, 2.0]), "covers": gap}

    def hull(X, seed):
        return {k: v for k, v in union(X, seed).items() if k != "covers"}

    kinds = [IntervalKind("union", "test", union, null=np.array([True, True])),
             IntervalKind("hull", "test", hull, null=np.array([True, True]))]
    by = {r["kind"]: r for r in coverage_study(pop, [10], kinds, n_datasets=20, seed=0).rows}
    assert by["union"]["coverage"] == 0.5 and by["hull"]["coverage"] == 1.0  # 0.5 is in the gap, 2.0 on a ray
    assert by["union"]["null_rejection_rate"] == 1.0 and by["hull"]["null_rejection_rate"] == 0.0  # 0 in the gap
    assert by["union"]["share_infinite"] == 1.0
