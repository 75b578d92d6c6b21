"""Tests of the head-stability estimator against constructions with known answers and oracles."""

import copy
import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from circuitstat.circuits.model import CircuitModel, ModelConfig
from circuitstat.pipelines.runs.heads.stability import HeadStability, ProbeSet, build_probe, fisher_interval, permutation_correlation

CFG = ModelConfig(n_layers=2, n_heads=4, d_model=32, d_head=8, d_mlp=64, vocab_size=97, n_ctx=32)
# the original columns first (readers depend on them), then the refit-level and excess columns
HEADS_COLUMNS = ["layer", "head", "stability", "ci_low", "ci_high", "null_mean", "distinctness", "importance",
                 "match", "pairs", "excess", "refit_ci_low", "refit_ci_high", "excess_ci_low", "excess_ci_high",
                 "n_refits"]
LAYERS_COLUMNS = ["layer", "stability", "ci_low", "ci_high", "null_mean", "stability_all_anchors", "refit_ci_low",
                  "refit_ci_high", "excess", "excess_ci_low", "excess_ci_high", "n_refits"]
RESIDUAL_COLUMNS = ["layer", "hook", "kind", "cka", "ci_low", "ci_high", "cka_all_pairs", "refit_ci_low",
                    "refit_ci_high", "n_refits", "interval_reliable"]


def sharp_model(seed, qk_scale=12.0, cfg=CFG):
    """A random model whose heads are sharp and different (default init gives near-uniform heads)."""
    m = CircuitModel(cfg).init_weights(seed)
    with torch.no_grad():
        for blk in m.blocks:
            blk.W_Q.mul_(qk_scale)
            blk.W_K.mul_(qk_scale)
    return m.eval().requires_grad_(False)


def permuted(model, perms):
    """The same model with the heads of layer l reordered: new head g = old head perms[l][g]."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        for blk, p in zip(m.blocks, perms):
            p = torch.as_tensor(p)
            for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "W_O"):
                t = getattr(blk, name)
                t.copy_(t[p].clone())
    return m


@pytest.fixture(scope="module")
def ids():
    return np.random.default_rng(0).integers(0, CFG.vocab_size, (16, 10))


def test_known_head_permutation_gives_stability_one_and_hungarian_recovers_it(ids):
    base = sharp_model(0)
    rng = np.random.default_rng(1)
    perms = [[rng.permutation(CFG.n_heads) for _ in range(CFG.n_layers)] for _ in range(2)]
    models = [base] + [permuted(base, p) for p in perms]
    res = HeadStability(match="hungarian", n_resamples=40, n_null=10, cka=("linear",), hooks=("post",),
                        importance=False, seed=0).fit(models, probe=ids).result_
    heads = res.to_pandas("heads")
    assert list(heads.columns) == HEADS_COLUMNS
    np.testing.assert_allclose(heads["stability"], 1.0, atol=1e-6)
    np.testing.assert_allclose(heads[["ci_low", "ci_high"]].to_numpy(), 1.0, atol=1e-6)
    np.testing.assert_allclose(res.layer_stability, 1.0, atol=1e-6)
    # the heads are really different (otherwise recovering the permutation would be vacuous) ...
    assert heads["distinctness"].min() > 0.05
    # ... and far above the shuffled-prompt null
    assert (heads["null_mean"] < 0.97).all()
    for _, row in heads.iterrows():
        got = dict(tok.split(":") for tok in row["match"].split())
        for r, p in enumerate(perms, start=1):
            inv = np.argsort(p[row["layer"]])  # old head h sits at new index inv[h]
            assert got[f"r{r}"] == f"h{inv[row['head']]}"
    # permuting heads leaves the residual stream unchanged: CKA is 1
    np.testing.assert_allclose(res.residual["cka"], 1.0, atol=1e-6)
    assert res.item("gap (max - min layer stability)")["value"] == pytest.approx(0.0, abs=1e-6)


def test_max_matching_also_gives_one_under_permutation(ids):
    base = sharp_model(3)
    models = [base, permuted(base, [[1, 2, 3, 0], [3, 2, 1, 0]])]
    res = HeadStability(match="max", n_resamples=10, null="none", residual=False, importance=False).fit(models, probe=ids).result_
    np.testing.assert_allclose(res.head_stability, 1.0, atol=1e-6)
    assert res.heads["match"][0] == "r1:h3"  # old head 0 of layer 0 is new head 3


def test_untrained_independent_models_sit_at_the_null(ids):
    # default (GPT-2) init: near-uniform causal attention, stability and both nulls ~ 1
    models = [CircuitModel(CFG).init_weights(s).eval().requires_grad_(False) for s in range(4)]
    for null in ("prompts", "untrained"):
        res = HeadStability(n_resamples=20, null=null, n_null=10, residual=False, importance=False,
                            seed=0).fit(models, probe=ids).result_
        layers = res.to_pandas("layers")
        assert list(layers.columns) == LAYERS_COLUMNS
        assert (layers["stability"] - layers["null_mean"]).abs().max() < 1e-3
    # sharp, content-dependent random heads: independent refits match no better than shuffled prompts
    models = [sharp_model(s) for s in range(4)]
    res = HeadStability(n_resamples=40, n_null=20, residual=False, importance=False, seed=0).fit(models, probe=ids).result_
    layers = res.to_pandas("layers")
    assert (layers["stability"] < 0.8).all()  # far from the permuted-copy case (1.0)
    assert (layers["stability"] - layers["null_mean"]).abs().max() < 0.02
    assert ((layers["ci_low"] <= layers["null_mean"]) & (layers["null_mean"] <= layers["ci_high"])).all()


def _paper_metric(patterns, drop_bos):
    """Bali et al.'s metric with plain loops: patterns[k][l][h][p] is a [T, T] numpy array."""
    K = len(patterns)
    L, H, P = len(patterns[0]), len(patterns[0][0]), len(patterns[0][0][0])
    T = patterns[0][0][0][0].shape[0]

    def vec(a):
        return [a[i][j] for i in range(T) for j in range(i + 1) if not (drop_bos and j == 0)]

    def cos(u, v):
        dot = sum(x * y for x, y in zip(u, v))
        return dot / (math.sqrt(sum(x * x for x in u)) * math.sqrt(sum(y * y for y in v)))

    stab = np.zeros((L, H))
    for l in range(L):
        for h in range(H):
            best = []
            for b in range(1, K):
                sims = []
                for g in range(H):
                    sims.append(sum(cos(vec(patterns[0][l][h][p]), vec(patterns[b][l][g][p])) for p in range(P)) / P)
                best.append(max(sims))
            stab[l, h] = sum(best) / len(best)
    return stab


@pytest.mark.parametrize("drop_bos", [False, True])
def test_paper_metric_matches_an_independent_loop_implementation(drop_bos):
    ids = np.random.default_rng(5).integers(0, CFG.vocab_size, (5, 6))
    models = [sharp_model(s, qk_scale=6.0) for s in (10, 11, 12)]
    pats = []
    with torch.no_grad():
        for m in models:
            out = m.run(torch.tensor(ids), keep_patterns=True)
            pats.append([[[out.patterns[l][p, h].double().numpy() for p in range(ids.shape[0])]
                          for h in range(CFG.n_heads)] for l in range(CFG.n_layers)])
    want = _paper_metric(pats, drop_bos)
    res = HeadStability(match="max", pairs="anchor", drop_bos=drop_bos, n_resamples=10, null="none", residual=False,
                        importance=False).fit(models, probe=ids).result_
    np.testing.assert_allclose(res.head_stability, want, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(res.layer_stability, want.mean(1), rtol=1e-9)
    assert res.gap == pytest.approx(want.mean(1).max() - want.mean(1).min(), abs=1e-9)
    assert not np.allclose(want, 1.0)  # a non-trivial case
    # distinctness agrees with circuitstat.stats.similarity.head_distinctness on the anchor's patterns
    from circuitstat.stats.similarity import head_distinctness

    for l in range(CFG.n_layers):
        A = np.array(pats[0][l])  # [H, P, T, T]
        np.testing.assert_allclose(res.heads["distinctness"][l * CFG.n_heads:(l + 1) * CFG.n_heads],
                                   head_distinctness(A, drop_bos=drop_bos), rtol=1e-9)


def test_importance_equals_direct_zero_ablation(ids):
    m = sharp_model(7, qk_scale=4.0).double()  # float64 so both sides agree to 1e-9
    res = HeadStability(n_resamples=20, null="none", residual=False, corr_refits="anchor",
                        seed=0).fit([m, sharp_model(8, qk_scale=4.0).double()], probe=ids).result_
    x = torch.tensor(ids)

    def ppl(model):
        with torch.no_grad():
            logits = model(x)
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, CFG.vocab_size), x[:, 1:].reshape(-1))
        return math.exp(float(nll))

    clean = ppl(m)
    want = np.zeros((CFG.n_layers, CFG.n_heads))
    for l in range(CFG.n_layers):
        for h in range(CFG.n_heads):
            z = copy.deepcopy(m)
            with torch.no_grad():
                z.blocks[l].W_O[h].zero_()  # the head's output is (pattern @ v) @ W_O[h]
            want[l, h] = ppl(z) - clean
    got = np.asarray(res.heads["importance"]).reshape(CFG.n_layers, CFG.n_heads)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-9)
    assert np.abs(want).max() > 1e-3
    lo = res.head_details["importance_ci_low"]
    hi = res.head_details["importance_ci_high"]
    assert np.all(lo <= got.ravel() + 1e-9) and np.all(got.ravel() <= hi + 1e-9)
    corr = res.to_pandas("correlation")
    assert list(corr["scope"]) == ["layer", "layer", "deep"] and (corr["n"] == CFG.n_heads).all()


def test_correlation_helpers():
    rng = np.random.default_rng(0)
    x = rng.normal(size=5)
    y = x + rng.normal(scale=0.5, size=5)
    r = permutation_correlation(x, y)
    assert r["r"] == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert r["exact"] and r["permutations"] == 120
    # exact permutation p-value by brute force
    import itertools

    rs = [np.corrcoef(x, y[list(p)])[0, 1] for p in itertools.permutations(range(5))]
    assert r["pvalue"] == pytest.approx(np.mean(np.abs(rs) >= abs(r["r"]) - 1e-12))
    lo, hi = fisher_interval(r["r"], 5)
    z = math.atanh(r["r"])
    assert lo == pytest.approx(math.tanh(z - 1.959963984540054 / math.sqrt(2)))
    assert fisher_interval(0.5, 3) == (-1.0, 1.0)
    # within-group centring removes group offsets
    g = np.repeat([0, 1], 6)
    xx = np.r_[rng.normal(size=6), rng.normal(size=6) + 10]
    yy = np.r_[-xx[:6], -xx[6:] + 20 + 20]
    pooled = permutation_correlation(xx, yy, g, n_permutations=99, seed=1)
    assert pooled["r"] == pytest.approx(-1.0) and pooled["n_eff"] == 11 and pooled["pvalue"] <= 0.02


def test_all_pairs_ci_sources_and_write(tmp_path, ids):
    models = [sharp_model(s, qk_scale=6.0) for s in (20, 21, 22)]
    est = HeadStability(pairs="all", match="hungarian", n_resamples=30, n_null=5, cka=("linear", "rbf", "debiased"),
                        seed=3)
    res = est.fit(models, probe=ProbeSet.from_ids(ids, bos=False)).result_
    assert set(res.heads["pairs"]) == {"all"}
    d = res.head_details
    s = res.heads["stability"]
    for src in ("prompts", "refits"):
        assert np.all(d[f"stability_ci_low_{src}"] <= d[f"stability_ci_high_{src}"])
    assert np.all(res.heads["ci_low"] <= s + 1e-12) and np.all(s <= res.heads["ci_high"] + 1e-12)
    r = res.to_pandas("residual")
    assert list(r.columns) == RESIDUAL_COLUMNS
    assert set(r["hook"]) == {"pre", "post"} and set(r["kind"]) == {"linear", "rbf", "debiased"}
    # only the debiased kind's intervals are trusted to cover the population CKA
    assert (r["interval_reliable"] == (r["kind"] == "debiased")).all()
    assert len(r) == CFG.n_layers * 2 * 3 and (r["ci_low"] <= r["ci_high"]).all()
    # same seed -> same numbers; another seed -> other intervals
    again = est.fit(models, probe=ids).result_
    np.testing.assert_array_equal(again.heads["ci_low"], res.heads["ci_low"])
    paths = res.write(tmp_path / "run")
    for name, cols in (("heads", HEADS_COLUMNS), ("layers", LAYERS_COLUMNS), ("residual", RESIDUAL_COLUMNS)):
        t = pq.read_table(paths[name])
        assert t.column_names == cols
        prov = json.loads(t.schema.metadata[b"circuitstat.provenance"])
        assert [m["weight_hash"] for m in prov["models"]] == [m.weight_hash() for m in models]
        assert prov["probe"]["sha256"] == ProbeSet.from_ids(ids).content_hash
    man = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert man["spec"]["result"] == "HeadStabilityResult" and "models" not in man["spec"]["params"]


def test_probe_set_from_corpus_and_file(tmp_path):
    from circuitstat.circuits.corpus import Corpus
    from circuitstat.circuits.tokenizers import train_bpe

    items = [(f"doc{i}.py", "\n".join(f"value_{i}_{j} = compute({j}, {i}) + offset_{j % 5}" for j in range(30)))
             for i in range(60)]
    corpus = Corpus.from_texts(items, name="t")
    tok = train_bpe(corpus.texts("train"), vocab_size=300)
    a = build_probe(tok, n=8, length=12, bos=True, corpus=corpus)
    b = build_probe(tok, n=8, length=12, bos=True, corpus=corpus)
    assert a.ids.shape == (8, 12) and (a.ids[:, 0] == tok.bos_id).all()
    assert a.content_hash == b.content_hash
    c = build_probe(tok, n=8, length=12, bos=False, corpus=corpus)
    assert c.ids.shape == (8, 12) and c.content_hash != a.content_hash
    f = tmp_path / "p.txt"
    f.write_text("short\n" + "\n".join(items[k][1].splitlines()[0] * 3 for k in range(5)))
    p = build_probe(tok, n=10, length=6, bos=False, file=f)
    assert p.n == 5 and p.n_dropped == 1 and p.length == 6


def test_bad_inputs(ids):
    from circuitstat.core.errors import InputError

    m = sharp_model(0)
    with pytest.raises(InputError, match="at least 2 refits"):
        HeadStability().fit([m], probe=ids)
    with pytest.raises(InputError, match="match="):
        HeadStability(match="greedy").fit([m, m], probe=ids)
    other = CircuitModel(ModelConfig(n_layers=3, n_heads=4, d_model=32, d_head=8, d_mlp=64, vocab_size=97,
                                     n_ctx=32)).init_weights(0)
    with pytest.raises(InputError, match="one architecture"):
        HeadStability().fit([m, other], probe=ids)
    with pytest.raises(InputError, match="hook"):
        HeadStability(hooks=("mid",)).fit([m, m], probe=ids)


def test_heads_command_is_typer_compatible(tmp_path):
    import typer
    from typer.testing import CliRunner

    from circuitstat.circuits.corpus import Corpus
    from circuitstat.circuits.tokenizers import train_bpe
    from circuitstat.pipelines.cli.studies import heads_command

    items = [(f"d{i}.py", "\n".join(f"item_{i}_{j} = load({j}) * scale_{j % 3}" for j in range(40))) for i in range(40)]
    corpus = Corpus.from_texts(items, name="cli")
    tok = train_bpe(corpus.texts("train"), vocab_size=280)
    cfg = ModelConfig(n_layers=2, n_heads=2, d_model=16, d_head=8, d_mlp=32, vocab_size=tok.vocab_size, n_ctx=16)
    dirs = []
    for s in range(2):
        m = sharp_model(s, cfg=cfg)
        m.tokenizer = tok
        dirs.append(str(m.save(tmp_path / f"m{s}")))
    probe = tmp_path / "probe.txt"
    probe.write_text("\n".join(t for _, t in items[:12]))
    app = typer.Typer()
    app.command()(heads_command)
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["--models", ",".join(dirs), "--probe-file", str(probe), "--n-probe", "8",
                                 "--n-boot", "10", "--match", "hungarian", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert pq.read_table(out / "heads.parquet").column_names == HEADS_COLUMNS
    man = json.loads((out / "manifest.json").read_text())
    assert man["provenance"]["probe"]["n"] == 8 and man["spec"]["match"] == "hungarian"
    # --n-jobs sets threads: the same tables, and a rerun with other threads resumes the same spec
    assert man["spec"]["n_resamples"] == 10  # the old flag --n-boot above, read as --n-resamples
    args = ["--models", ",".join(dirs), "--probe-file", str(probe), "--n-probe", "8", "--n-resamples", "10",
            "--match", "hungarian"]
    r = CliRunner().invoke(app, args + ["--out", str(tmp_path / "run2"), "--n-jobs", "2"])
    assert r.exit_code == 0, r.output
    for name in ("heads", "layers", "residual"):
        a, b = (pq.read_table(d / f"{name}.parquet").to_pandas() for d in (out, tmp_path / "run2"))
        np.testing.assert_allclose(a.select_dtypes("number").to_numpy(), b.select_dtypes("number").to_numpy(),
                                   rtol=1e-9, atol=1e-12, equal_nan=True)
    assert "n_jobs" not in man["spec"]
    r = CliRunner().invoke(app, args + ["--out", str(tmp_path / "run3"), "--n-jobs", "100000"])
    # this bare app has no error boundary (the real CLI's turns InputError into exit 2)
    assert isinstance(r.exception, ValueError) and "CPU count" in str(r.exception)
    assert not (tmp_path / "run3").exists()


def test_estimator_contract_and_refit_level_columns(ids):
    import inspect

    from circuitstat.core.results import Result

    est = HeadStability(n_resamples=10, n_null=4, residual=False, importance=False, corpus="stdlib")
    names = [p for p in inspect.signature(HeadStability.__init__).parameters if p != "self"]
    params = est.get_params()
    assert list(params) == names and params["corpus"] == "stdlib"
    assert HeadStability(**params).get_params() == params  # a clone from get_params is the same estimator
    assert est.set_params(match="hungarian") is est and est.match == "hungarian"
    models = [sharp_model(s, qk_scale=6.0) for s in (30, 31, 32, 33)]
    assert est.fit(models, probe=ids) is est and isinstance(est.result_, Result)
    res = est.result_
    layers, heads = res.to_pandas("layers"), res.to_pandas("heads")
    assert (layers["n_refits"] == 4).all() and (heads["n_refits"] == 4).all()
    # the refit interval brackets the all-anchors estimate; excess is stability minus the null
    assert ((layers["refit_ci_low"] < layers["stability_all_anchors"])
            & (layers["stability_all_anchors"] < layers["refit_ci_high"])).all()
    np.testing.assert_allclose(heads["excess"], heads["stability"] - heads["null_mean"])
    assert ((heads["refit_ci_low"] <= heads["stability"]) & (heads["stability"] <= heads["refit_ci_high"])).all()
    low, high, *_ = res.conf_int(which="layers.excess_ci")
    np.testing.assert_array_equal(low, layers["excess_ci_low"]) and np.testing.assert_array_equal(high, layers["excess_ci_high"])
    assert "every refit an anchor" in res.params["estimands"]["refit_ci"]
    item = res.item("mean excess stability over the null (every refit an anchor; jackknife over 4 refits)")
    assert item["ci_low"] < item["value"] < item["ci_high"]
    # two refits: no refit-level interval (the jackknife leaves no pair), said by NaN and n_refits = 2
    two = HeadStability(n_resamples=10, null="none", residual=False, importance=False).fit(models[:2], probe=ids).result_
    assert two.to_pandas("layers")["refit_ci_low"].isna().all() and (two.to_pandas("layers")["n_refits"] == 2).all()
