"""Variance components vs statsmodels MixedLM and by simulation; ICC vs pingouin."""

import warnings

import numpy as np
import pandas as pd
import pytest

from circuitstat.stats.variance import icc, variance_components


def _long(Y, names):
    idx = np.indices(Y.shape).reshape(Y.ndim, -1).T
    df = pd.DataFrame(idx, columns=names)
    df["y"] = Y.ravel()
    df["g"] = 1
    return df


def _mixedlm(df, vcs):
    import statsmodels.formula.api as smf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = smf.mixedlm("y ~ 1", df, groups="g", re_formula="0",
                        vc_formula={v: f"0 + C({v})" for v in vcs}).fit(reml=True)
    return dict(zip(m.model.exog_vc.names, m.vcomp)), m.scale


def test_two_factor_matches_mixedlm():
    rng = np.random.default_rng(0)
    a, b = 8, 6
    Y = rng.normal(size=(a, 1)) * 1.5 + rng.normal(size=(1, b)) + rng.normal(size=(a, b)) * 0.7
    res = variance_components(Y, ["examples", "seed"])
    vc, scale = _mixedlm(_long(Y, ["examples", "seed"]), ["examples", "seed"])
    assert all(v[0] > 0 for v in res.components.values())  # REML = ANOVA only if all positive
    assert res.components["examples"][0] == pytest.approx(vc["examples"], rel=1e-3)
    assert res.components["seed"][0] == pytest.approx(vc["seed"], rel=1e-3)
    assert res.components["residual"][0] == pytest.approx(scale, rel=1e-3)


def test_three_factor_with_interactions_matches_mixedlm():
    rng = np.random.default_rng(3)
    a, b, c = 6, 5, 4
    sd = dict(a=1.5, b=1.0, c=1.2, ab=0.7, ac=0.6, bc=0.5, e=0.4)
    Y = (rng.normal(size=(a, 1, 1)) * sd["a"] + rng.normal(size=(1, b, 1)) * sd["b"]
         + rng.normal(size=(1, 1, c)) * sd["c"] + rng.normal(size=(a, b, 1)) * sd["ab"]
         + rng.normal(size=(a, 1, c)) * sd["ac"] + rng.normal(size=(1, b, c)) * sd["bc"]
         + rng.normal(size=(a, b, c)) * sd["e"])
    res = variance_components(Y, ["a", "b", "c"])
    assert all(v[0] > 0 for v in res.components.values())
    df = _long(Y, ["a", "b", "c"])
    for x, y in [("a", "b"), ("a", "c"), ("b", "c")]:
        df[x + y] = df[x].astype(str) + "_" + df[y].astype(str)
    vc, scale = _mixedlm(df, ["a", "b", "c", "ab", "ac", "bc"])
    for name, key in [("a", "a"), ("b", "b"), ("c", "c"), ("a:b", "ab"), ("a:c", "ac"),
                      ("b:c", "bc")]:
        assert res.components[name][0] == pytest.approx(vc[key], rel=2e-3), name
    assert res.components["residual"][0] == pytest.approx(scale, rel=2e-3)


def test_unbiased_by_simulation_vectorised_over_edges():
    # 4 factors as in the study (examples x counterfactual x estimator x seed); edges = replicates
    rng = np.random.default_rng(1)
    n = (6, 3, 2, 3)
    E = 3000
    true = {"ex": 2.0, "cf": 0.5, "est": 0.3, "seed": 0.8, "ex:seed": 0.4, "residual": 1.0}
    Y = (rng.normal(size=(n[0], 1, 1, 1, E)) * np.sqrt(true["ex"])
         + rng.normal(size=(1, n[1], 1, 1, E)) * np.sqrt(true["cf"])
         + rng.normal(size=(1, 1, n[2], 1, E)) * np.sqrt(true["est"])
         + rng.normal(size=(1, 1, 1, n[3], E)) * np.sqrt(true["seed"])
         + rng.normal(size=(n[0], 1, 1, n[3], E)) * np.sqrt(true["ex:seed"])
         + rng.normal(size=(*n, E)) * np.sqrt(true["residual"]))
    res = variance_components(Y, ["ex", "cf", "est", "seed"], max_order=2)
    for name, v in res.components.items():
        expect = true.get(name, 0.0)
        se = v.std() / np.sqrt(E)
        assert abs(v.mean() - expect) < 4 * se + 1e-12, (name, v.mean(), expect)
    # zero components come out negative about half the time and are reported, not hidden
    assert 0.2 < res.negative["cf:est"].mean() < 0.8
    # the plug-in SE tracks the spread of the estimates
    assert np.median(res.standard_error["ex"]) == pytest.approx(res.components["ex"].std(), rel=0.35)
    # a single edge gives the same numbers as the vectorised call
    one = variance_components(Y[..., 7], ["ex", "cf", "est", "seed"], max_order=2)
    for name in res.names:
        assert one.components[name][0] == pytest.approx(res.components[name][7], rel=1e-12)


def test_negative_estimates_truncated_only_on_request():
    rng = np.random.default_rng(5)
    Y = rng.normal(size=(5, 4, 200))  # no factor effects: half the estimates negative
    raw = variance_components(Y, ["a", "b"])
    assert (raw.components["a"] < 0).any()
    tr = variance_components(Y, ["a", "b"], truncate_negative=True)
    assert (tr.components["a"] >= 0).all()
    np.testing.assert_array_equal(tr.negative["a"], raw.components["a"] < 0)
    np.testing.assert_allclose(sum(tr.shares.values()), 1.0)
    assert np.isnan(raw.confidence_interval["a"].low[raw.components["a"] < 0]).all()
    t = raw.to_table()
    assert t.num_rows == 3 * 200 and {"share", "negative_estimate", "ci_low"} <= set(t.column_names)
    assert raw.to_table("variance_anova").num_rows == 600 and raw.to_table("variance_ems").num_rows > 0


def test_bad_designs_refused():
    with pytest.raises(ValueError, match="confounded"):
        variance_components(np.ones((3, 3, 2)), ["a", "b"], max_order=2)
    with pytest.raises(ValueError, match="balanced"):
        Y = np.ones((3, 3, 2))
        Y[0, 0, 0] = np.nan
        variance_components(Y, ["a", "b"])
    with pytest.raises(ValueError, match="2 crossed factors"):
        variance_components(np.ones((3, 2)), ["a"])


def test_icc_matches_pingouin():
    import pingouin as pg

    rng = np.random.default_rng(0)
    n, k, E = 12, 4, 3
    Y = rng.normal(size=(n, 1, E)) * 2 + rng.normal(size=(1, k, E)) + rng.normal(size=(n, k, E))
    res = icc(Y)
    types = ["ICC1", "ICC2", "ICC3", "ICC1k", "ICC2k", "ICC3k"]
    for e in range(E):
        df = _long(Y[..., e], ["t", "r"])
        ref = pg.intraclass_corr(df, "t", "r", "y").set_index("Type")
        for t, label in zip(types, ref.index):
            assert res.icc[t][e] == pytest.approx(ref.loc[label, "ICC"], abs=1e-10)
            assert res.F[t][e] == pytest.approx(ref.loc[label, "F"], rel=1e-10)
            assert res.pvalue[t][e] == pytest.approx(ref.loc[label, "pval"], rel=1e-8, abs=1e-300)
            assert res.df2[t] == ref.loc[label, "df2"]
            lo, hi = ref.loc[label, "CI95"]  # pingouin rounds its CIs to 2 decimals
            assert res.confidence_interval[t].low[e] == pytest.approx(lo, abs=0.005 + 1e-9)
            assert res.confidence_interval[t].high[e] == pytest.approx(hi, abs=0.005 + 1e-9)
    assert res.to_table().num_rows == 6 * E
