"""Verified audits (spec key ``verify``): the verified stage's tables against an independent computation from a
full exact run, the recorded seed, the edge subset and its missed-edges bound, resume, and bad specs refused."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from circuitstat.core.errors import InputError
from circuitstat.pipelines.runs.audit.run import audit_stages, run_audit
from circuitstat.pipelines.spec import parse_spec
from verified_oracles import brute_upper, tost_holm_above

MODEL = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3"
BASE = {"model": MODEL, "task": {"name": "induction", "n": 24, "options": {"seq_len": 5}}, "batch_size": 4,
        "bootstrap": {"n_resamples": 40}, "k": [3, 6], "faithfulness": False}


def _read(run, name):
    return pq.read_table(run / f"{name}.parquet").to_pandas()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An audit with exact on every prompt (the oracle) and two verified audits without it."""
    root = tmp_path_factory.mktemp("verify")
    full = root / "full"
    run_audit(parse_spec({**BASE, "methods": ["exact", "eap"]}), full)
    ver = root / "verified"
    run_audit(parse_spec({**BASE, "methods": ["eap", "eap-ig-inputs"], "verify": {"n": 8, "seed": 11}}), ver)
    sub = root / "subset"
    run_audit(parse_spec({**BASE, "methods": ["eap"],
                          "verify": {"n": 8, "seed": 11, "edges": {"top": 6, "random": 12}, "tau": 1e-4}}), sub)
    return full, ver, sub


def test_verified_table_equals_ppi_on_the_full_exact_run(runs):
    """exact_subset's cells are the full exact run's: the stage's table equals verified_means computed from them."""
    from circuitstat.core.tables import table_to_matrix
    from circuitstat.stats.verified import verified_means

    full, ver, _ = runs
    exact = np.asarray(table_to_matrix(pq.read_table(full / "scores_exact.parquet")), np.float64)
    eap = np.asarray(table_to_matrix(pq.read_table(ver / "scores_eap.parquet")), np.float64)
    prompts = _read(ver, "verified_prompts")
    rows = prompts["row"].to_numpy()
    # the rows are the recorded seed's uniform draw, reproducible from the table alone
    assert (prompts["seed"] == 11).all() and (prompts["n_prompts"] == 24).all()
    assert np.array_equal(rows, np.sort(np.random.default_rng(11).choice(24, 8, replace=False)))
    want = verified_means(eap, exact[rows], rows)
    got = _read(ver, "verified")
    assert sorted(set(got["method"])) == ["eap", "eap-ig-inputs"]
    g = got[got["method"] == "eap"]
    assert np.array_equal(g["edge"], np.arange(exact.shape[1]))
    for col, ref in (("estimate", want.estimate), ("ci_low", want.confidence_interval.low),
                     ("ci_high", want.confidence_interval.high), ("qvalue", want.qvalue), ("lam", want.lam)):
        np.testing.assert_allclose(g[col].to_numpy(), ref, rtol=0, atol=1e-12, err_msg=col)
    assert set(g["estimand"]) == {"mean exact effect, verified on 8 of 24 prompts"}


def test_edge_subset_verifies_the_top_and_a_random_sample_and_bounds_the_rest(runs):
    from circuitstat.core.tables import table_to_matrix
    from circuitstat.stats.verified import missed_edges_bound, verified_means
    from circuitstat.stats.verified.missed import possibly_above

    full, _, sub = runs
    exact = np.asarray(table_to_matrix(pq.read_table(full / "scores_exact.parquet")), np.float64)
    eap = np.asarray(table_to_matrix(pq.read_table(sub / "scores_eap.parquet")), np.float64)
    E = eap.shape[1]
    got = _read(sub, "verified")
    edges = got["edge"].to_numpy()
    assert len(edges) == 18 and len(set(edges)) == 18
    top6 = set(np.argsort(-np.abs(eap.mean(0)), kind="stable")[:6])
    assert top6 <= set(edges)  # the top candidates by |EAP mean| are all verified
    rows = _read(sub, "verified_prompts")["row"].to_numpy()
    ref = verified_means(eap[:, edges], exact[np.ix_(rows, edges)], rows)
    np.testing.assert_allclose(got["estimate"], ref.estimate, atol=1e-12)
    # the bound: recomputed from the random part's simultaneous intervals (Bonferroni over r = 12 at 0.025)
    sample = np.array(sorted(set(edges) - top6))
    cls = verified_means(eap[:, sample], exact[np.ix_(rows, sample)], rows, confidence_level=1 - 0.025 / 12)
    above = possibly_above(cls.confidence_interval.low, cls.confidence_interval.high, 1e-4)
    want = missed_edges_bound(above, E - 6, tau=1e-4, n_top=6, confidence_level=0.975, classification_level=0.975)
    m = _read(sub, "missed_edges")
    assert list(m["method"]) == ["eap"] and m["n_remaining"][0] == E - 6 and m["n_sampled"][0] == 12
    assert m["sampled_above"][0] == want.sampled_above and m["missed_high"][0] == want.bound
    assert m["level"][0] == pytest.approx(0.95)
    # the missed mass, recomputed from the sample: |cross-fitted estimates| post-stratified by EAP's rank among the
    # edges outside the top (one block per 10 sampled edges: 1 here)
    from circuitstat.stats.verified.missed_mass import missed_mass_bound, sampled_effects

    rest = np.setdiff1d(np.arange(E), sorted(top6))
    mass = missed_mass_bound(*sampled_effects(eap[:, sample], exact[np.ix_(rows, sample)], rows),
                             np.searchsorted(rest, sample), eap[:, rest].mean(0), confidence_level=0.95)
    assert m["mass_high"][0] == pytest.approx(mass.high, rel=1e-12) and m["mass_strata"][0] == 1
    assert 0 <= m["mass_estimate"][0] <= m["mass_high"][0] and m["mass_level"][0] == pytest.approx(0.95)


def test_missed_edges_row_per_method_from_its_own_scores(runs, tmp_path):
    """An audit with methods [eap, atp-qkfix] and an edge subset: each method's missed_edges row equals the bound
    recomputed from that method's scores and exact effects on its own sample (the full exact run as the oracle; the
    bound by brute force over scipy's hypergeometric CDF, the classification by scipy's t and statsmodels' Holm), so a
    user who wants atp-qkfix's verified intervals behind the bound runs atp-qkfix (docs/verified.md)."""
    from circuitstat.core.tables import table_to_matrix
    from circuitstat.stats.verified import verified_means
    from circuitstat.stats.verified.missed_mass import missed_mass_bound, sampled_effects

    full = runs[0]
    sub = tmp_path / "sub"
    tau = 1e-3  # about the largest |mean| here: the classification is not all one way
    run_audit(parse_spec({**BASE, "methods": ["eap", "atp-qkfix"],
                          "verify": {"n": 8, "seed": 11, "edges": {"top": 6, "random": 12}, "tau": tau}}), sub)
    read = lambda path: np.asarray(table_to_matrix(pq.read_table(path)), np.float64)  # noqa: E731
    exact = read(full / "scores_exact.parquet")
    rows = pq.read_table(sub / "verified_prompts.parquet").column("row").to_numpy()
    got = pq.read_table(sub / "missed_edges.parquet").to_pandas()
    assert list(got["method"]) == ["eap", "atp-qkfix"]
    highs = {}
    for method in ("eap", "atp-qkfix"):
        S = read(sub / f"scores_{method}.parquet")
        top = np.sort(np.argsort(-np.abs(S.mean(0)), kind="stable")[:6])
        ver = pq.read_table(sub / "verified.parquet").to_pandas()
        sample = np.setdiff1d(ver[ver["method"] == method]["edge"].to_numpy(), top)
        fit = verified_means(S[:, sample], exact[np.ix_(rows, sample)], rows)
        x = int(tost_holm_above(fit, tau, 0.025).sum())  # α/2 on the classification (MISSED_SPLIT)
        rest = np.setdiff1d(np.arange(S.shape[1]), top)
        row = got[got["method"] == method].iloc[0]
        assert sample.size == 12 and row["sampled_above"] == x
        assert row["remaining_above_high"] == brute_upper(x, rest.size, 12, 0.975)
        mass = missed_mass_bound(*sampled_effects(S[:, sample], exact[np.ix_(rows, sample)], rows),
                                 np.searchsorted(rest, sample), S[:, rest].mean(0), confidence_level=0.95)
        assert row["mass_high"] == pytest.approx(mass.high, rel=1e-12)
        highs[method] = (mass.high, sample, rest)
    # not interchangeable: EAP's scores on atp-qkfix's sample give another missed-mass bound than atp-qkfix's row
    _, sample, rest = highs["atp-qkfix"]
    eap = read(sub / "scores_eap.parquet")
    wrong = missed_mass_bound(*sampled_effects(eap[:, sample], exact[np.ix_(rows, sample)], rows),
                              np.searchsorted(rest, sample), eap[:, rest].mean(0), confidence_level=0.95).high
    assert wrong != pytest.approx(highs["atp-qkfix"][0], rel=1e-9)


def test_verified_stage_is_listed_resumes_and_records_its_seed(runs, tmp_path):
    _, ver, _ = runs
    spec = parse_spec({**BASE, "methods": ["eap", "eap-ig-inputs"], "verify": {"n": 8, "seed": 11}})
    # right after the scores: the stability and faithfulness stages read its pseudo-scores
    assert audit_stages(spec)[:5] == ["index", "scores_eap", "scores_eap-ig-inputs", "verified", "edge_stats"]
    manifest = json.loads((ver / "manifest.json").read_text())
    assert manifest["stages"]["verified"]["status"] == "done"
    before = (ver / "verified.parquet").read_bytes()
    run_audit(spec, ver)  # resumed: nothing recomputed, same bytes
    assert (ver / "verified.parquet").read_bytes() == before


def test_circuits_selected_from_verified_estimates_get_stability_and_faithfulness(tmp_path):
    """eap+verified rows in stability_vs_k (data level) and faithfulness_vs_k (selection-aware), named by their
    estimand; the pseudo-scores they rank have the verified estimates as column means."""
    from circuitstat.core.tables import table_to_matrix

    out = tmp_path / "vc"
    run_audit(parse_spec({**BASE, "task": {"name": "induction", "n": 40, "options": {"seq_len": 5}},
                          "methods": ["eap"], "k": [3, 6], "faithfulness": True, "verify": {"n": 8, "seed": 2}}), out)
    words = "mean exact effect, verified on 8 of 40 prompts (PPI++ estimates)"
    stab = _read(out, "stability_vs_k")
    v = stab[stab["method"] == "eap+verified"]
    assert list(v["k"]) == [3, 6] and set(v["ranked_by"]) == {words}
    assert set(stab.loc[stab["method"] == "eap", "ranked_by"]) == {"mean eap score"}
    assert np.isfinite(v["jaccard_data_ci_low"]).all() and set(v["data_level_note"]) == {""}
    faith = _read(out, "faithfulness_vs_k")
    f = faith[faith["method"] == "eap+verified"]
    assert set(f["ranked_by"]) == {words} and np.isfinite(f["f_selected_ci_low"]).all()
    assert all("stratified by verified prompts" in note for note in f["f_selected_note"])
    pseudo = pq.read_table(out / "verified_pseudo.parquet")
    C = np.asarray(table_to_matrix(pseudo), np.float64)
    assert int(np.asarray(pseudo.column("labelled")).sum()) == 8
    est = _read(out, "verified")["estimate"].to_numpy()
    np.testing.assert_allclose(C.mean(0), est, rtol=1e-5, atol=1e-6 * np.abs(est).max())
    # claims read the same rows: a bound at the value holds, one just above it fails
    import yaml
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    value = float(v.loc[v["k"] == 3, "jaccard_data"].iloc[0])
    codes = []
    for bound in (value - 1e-9, value + 1e-3):
        f = tmp_path / f"claims{len(codes)}.yaml"
        f.write_text(yaml.safe_dump({"claims": [{"kind": "circuit_stability", "method": "eap+verified", "k": 3,
                                                 "statistic": "jaccard_data", "min": bound}]}))
        r = CliRunner().invoke(app, ["check", str(f), "--run", str(out), "--allow-outside"])
        assert "eap+verified" in r.output, r.output
        codes.append(r.exit_code)
    assert codes[0] == 0 and codes[1] not in (0, 2), codes


def test_default_seed_comes_from_the_run_seed(tmp_path):
    """Without verify.seed the draw comes from the run's seed and the stage name: same run seed, same prompts;
    another run seed, (here) other prompts."""
    spec = {**BASE, "methods": ["eap"], "k": [3], "bootstrap": {"n_resamples": 20}, "verify": {"n": 6}}
    rows = []
    for i, seed in enumerate((0, 0, 5)):
        out = tmp_path / f"r{i}"
        run_audit(parse_spec({**spec, "seed": seed}), out)
        p = _read(out, "verified_prompts")
        assert np.array_equal(p["row"], np.sort(np.random.default_rng(int(p["seed"][0])).choice(24, 6, replace=False)))
        rows.append(tuple(p["row"]))
    assert rows[0] == rows[1] and rows[0] != rows[2]


@pytest.mark.parametrize("verify, methods, words", [
    ({"n": 3}, ["eap"], "greater than or equal to 4"),
    ({"n": 23}, ["eap"], "verify.n <= 22"),
    ({"n": 8}, ["exact"], "add eap"),
    ({"n": 8, "edges": {"top": 2, "random": 3}}, ["eap"], "needs verify.tau"),
    ({"n": 8, "tau": 0.1}, ["eap"], "remove tau"),
    ({"n": 8, "edges": {"top": 2, "random": 0}, "tau": 0.1}, ["eap"], "verify.edges.random"),
    ({"n": 8, "method": "exact"}, ["eap"], "verify.method: unknown key"),
])
def test_bad_verify_specs_are_refused_before_any_work(verify, methods, words):
    with pytest.raises(InputError, match=words.replace(".", r"\.").replace("(", r"\(")):
        parse_spec({**BASE, "methods": methods, "verify": verify})


def test_too_many_edges_refused_before_the_run_directory(tmp_path):
    spec = parse_spec({**BASE, "methods": ["eap"], "verify": {"n": 8, "edges": {"top": 40, "random": 40}, "tau": 0.1}})
    with pytest.raises(InputError, match="lower top or random"):
        run_audit(spec, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_by_correction_is_a_spec_key_and_the_default_record_is_unchanged(runs, tmp_path):
    """verify.correction: by gives Benjamini-Yekutieli q-values (statsmodels as the oracle) over the same p-values
    as the BH run; the default (bh) leaves the recorded spec as before the key existed."""
    from statsmodels.stats.multitest import multipletests

    from circuitstat.pipelines.spec import VerifySpec

    by = tmp_path / "by"
    run_audit(parse_spec({**BASE, "methods": ["eap", "eap-ig-inputs"],
                          "verify": {"n": 8, "seed": 11, "correction": "by"}}), by)
    _, ver, _ = runs
    a, b = _read(ver, "verified"), _read(by, "verified")
    assert np.array_equal(a["pvalue"], b["pvalue"]) and np.array_equal(a["estimate"], b["estimate"])
    for m in ("eap", "eap-ig-inputs"):
        g = b[b["method"] == m]
        want = multipletests(g["pvalue"].to_numpy(), method="fdr_by")[1]
        np.testing.assert_allclose(g["qvalue"].to_numpy(), want, rtol=1e-12, atol=0)
        bh = multipletests(a[a["method"] == m]["pvalue"].to_numpy(), method="fdr_bh")[1]
        np.testing.assert_allclose(a[a["method"] == m]["qvalue"].to_numpy(), bh, rtol=1e-12, atol=0)
    # negative control: BY's q-values are BH's times the harmonic sum, so they differ wherever a q is below 1
    # (BY's q is BH's times the harmonic sum, capped at 1): larger wherever BH's is below 1 / that sum
    qa, qb = a["qvalue"].to_numpy(), b["qvalue"].to_numpy()
    assert (qb >= qa).all() and (qb > qa).sum() >= 3, (qa.min(), qb.min())
    assert "correction" not in VerifySpec(n=8).model_dump()
    assert VerifySpec(n=8, correction="by").model_dump()["correction"] == "by"
    with pytest.raises(InputError, match="correction"):
        parse_spec({**BASE, "methods": ["eap"], "verify": {"n": 8, "correction": "holm"}})
