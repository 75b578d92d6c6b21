"""The contributions estimator end to end: tables through the schema, resuming, a planted sink head."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from circuitstat.core.errors import InputError
from circuitstat.circuits.model import CircuitModel, ModelConfig
from circuitstat.circuits.tasks import task_from_token_lists
from circuitstat.pipelines.runs.tokens.run import READOUT_TABLES, STAT_TABLES, TokenContributions
from circuitstat.core.rundir import StageSpecChangedError
from circuitstat.core.schema import schema_for


def _model(seed=0, n_ctx=32):
    cfg = ModelConfig(n_layers=2, n_heads=2, d_model=16, d_head=8, d_mlp=32, vocab_size=50, n_ctx=n_ctx, act="relu")
    m = CircuitModel(cfg).init_weights(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(8.0) if p.ndim > 1 else None  # sharper patterns than GPT-2's 0.02 init
    return m.eval()


EST = dict(n=12, task_options={"seq_len": 5}, ks=(1, 2), n_random=3, n_resamples=999, seed=3)


def test_run_writes_schema_tables_and_resumes(tmp_path, monkeypatch):
    m = _model()
    est = TokenContributions(**EST)
    res = est.run(m, tmp_path / "run", command=["test"])
    for name in (*READOUT_TABLES, *STAT_TABLES):
        table = pq.read_table(tmp_path / "run" / f"{name}.parquet")
        assert schema_for(name).validate(table).num_rows == table.num_rows > 0
    imp = pq.read_table(tmp_path / "run" / "token_importance.parquet").to_pandas()
    drops = pq.read_table(tmp_path / "run" / "token_drops.parquet").to_pandas()
    for row in imp.itertuples():  # the stat table is the mean of the per-prompt table it was read from
        sel = drops[(drops.measure == row.measure) & (drops.k == row.k)]
        assert len(sel) == 12 and row.mean_drop == pytest.approx(sel["drop"].mean())
    assert set(imp.measure) == {"attention", "value_norm", "contribution", "grad_input", "random"}
    assert res.importance.drops.n_obs == 12

    # a rerun finds both stages done and computes nothing
    def boom(*a, **k):
        raise AssertionError("read-outs recomputed")

    monkeypatch.setattr(TokenContributions, "readouts", boom)
    again = TokenContributions(**EST).run(m, tmp_path / "run", command=["test"])
    np.testing.assert_allclose(again.importance.drops.estimate, res.importance.drops.estimate)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["stages"]["token_readouts"]["attempts"] == 1
    # a different spec on the same directory is refused (nothing recomputed silently)
    with pytest.raises(StageSpecChangedError):
        TokenContributions(**{**EST, "ks": (1, 3)}).run(m, tmp_path / "run", command=["test"])


def test_statistics_stage_reads_only_the_per_prompt_tables():
    m = _model(seed=1)
    est = TokenContributions(**EST).fit(m)
    again = TokenContributions(**EST).analyse(est.readouts_.tables())
    np.testing.assert_array_equal(again.importance.differences.estimate, est.result_.importance.differences.estimate)
    # the random null is the mean over the random orders, and k never exceeds a prompt's candidates
    assert est.readouts_.drops.shape == (12, 5, 2)
    assert (est.readouts_.n_ablated <= est.readouts_.candidates.sum(1)[:, None]).all()


def _fill_normal(g: torch.Generator, *params: torch.Tensor) -> None:
    """Overwrite ``params`` in order with standard normal draws from ``g``."""
    for p in params:
        p.copy_(torch.randn(p.shape, generator=g))


def test_a_planted_sink_head_is_reported():
    """Head a0.h0 attends to the first token (whose value vector is zero) from every position."""
    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, d_mlp=0, vocab_size=12, n_ctx=16, norm="none",
                      positional="none", mlp="none")
    m = CircuitModel(cfg).init_weights(0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        blk = m.blocks[0]
        _fill_normal(g, m.W_E, m.W_U, blk.W_Q, blk.W_K, blk.W_V, blk.W_O)
        m.W_E[:, 0] = 1.0
        m.W_E[0] = 0.0
        blk.W_Q[0].zero_()
        blk.b_Q[0, 0] = 30.0
        blk.W_K[0].zero_()
        blk.W_K[0, 0, 0] = -1.0
    rng = np.random.default_rng(0)
    rows = [[0, *rng.choice(np.arange(1, 12), 7, replace=False).tolist()] for _ in range(10)]
    task = task_from_token_lists("sink", rows, rows, [1] * 10, [2] * 10)
    est = TokenContributions(ks=(1,), n_random=2, n_resamples=999).fit(m, task=task)
    heads = est.result_.to_pandas("sink_heads").set_index("node")
    assert heads.loc["a0.h0", "sink_rate"] == pytest.approx(1.0)
    assert heads.loc["a0.h0", "output_norm"] < 1e-3 < heads.loc["a0.h1", "output_norm"]
    assert heads.loc["a0.h1", "sink_rate"] < 1.0
    # attention ranks the sink first; contribution never does (its value vector is zero)
    w = est.readouts_.tables()["token_weights"]
    first = w["position"] == 0
    assert (w["contribution"][first] == pytest.approx(0.0, abs=1e-6))
    assert (w["attention"][first] > 0.45).all()


@pytest.mark.parametrize("params, match", [
    ({"measures": ("attention", "saliency")}, "measures"),
    ({"ks": (0, 1)}, "ks"),
    ({"ablation": "blank"}, "ablation"),
    ({"ablation": "mask"}, "exclude_readout"),  # the read-out is the metric's query: it cannot be hidden
    ({"sink_threshold": 1.0}, "sink_threshold"),
    ({"n_random": 0}, "n_random"),
    ({"pairs": ("contribution-attention",)}, "pair"),
    ({"pairs": ("contribution:saliency",)}, "pair"),
])
def test_bad_parameters_are_refused_before_any_work(params, match):
    with pytest.raises(InputError, match=match):
        TokenContributions(**params).fit(object())


def test_mask_ablation_runs_through_the_estimator_and_differs_from_zero():
    from circuitstat.circuits.contributions import TOKEN_ABLATIONS
    from circuitstat.pipelines.runs.tokens.run import TOKEN_ABLATIONS as MIRRORED

    assert MIRRORED == TOKEN_ABLATIONS  # the torch-free copy the validation uses
    model = _model()
    drops = {}
    for ablation in ("zero", "mask"):
        est = TokenContributions(**{**EST, "ablation": ablation, "exclude_readout": True}).fit(model)
        drops[ablation] = np.asarray(est.result_.importance.drops.estimate, dtype=float)
        assert np.isfinite(drops[ablation]).all()
    assert not np.allclose(drops["zero"], drops["mask"])  # the option reaches the ablation


def _cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", "from circuitstat.pipelines.cli import main; main()", *args],
                          capture_output=True, text=True)


def test_tokens_command_writes_the_run_and_refuses_bad_options(tmp_path):
    out = tmp_path / "run"
    model_dir = str(_model(n_ctx=64).save(tmp_path / "model"))  # a circuitstat model: no transformers import
    p = _cli("tokens", "--model", f"{model_dir},{model_dir}", "--model", model_dir, "--n", "8", "--k", "1,2",
             "--n-random", "2", "--n-resamples", "999", "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "top-1 contribution Jaccard" in p.stdout and "layer 1: rank 1 sink rate" in p.stdout
    for i in range(3):  # three refits (here one model three times), each a full run
        for name in (*READOUT_TABLES, *STAT_TABLES):
            assert (out / f"model-{i}" / f"{name}.parquet").exists(), name
    assert (pq.read_table(out / "token_stability.parquet").to_pandas().jaccard == 1.0).all()
    diffs = pq.read_table(out / "model-0" / "token_importance_diffs.parquet").to_pandas()
    pairs = set(zip(diffs.measure_a, diffs.measure_b))
    assert ("attention", "contribution") in pairs and ("contribution", "attention") not in pairs  # given order
    assert len(diffs) == 10 * 2  # 5 measures (with random) -> 10 pairs, at 2 ks
    for args, words in ((("--k", "1,x"), "--k takes"), (("--measures", "attention,saliency"), "measures")):
        p = _cli("tokens", "--model", model_dir, "--n", "8", *args, "--out", str(tmp_path / "bad"))
        assert p.returncode == 2 and words in p.stderr and len(p.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "bad").exists()


def test_cross_seed_writes_each_model_and_the_comparison(tmp_path):
    models = [_model(seed=s) for s in (0, 1, 2)]
    est = TokenContributions(**EST)
    study = est.cross_seed(models, tmp_path / "study", command=["test"])
    for i in range(3):
        for name in (*READOUT_TABLES, *STAT_TABLES):
            assert (tmp_path / "study" / f"model-{i}" / f"{name}.parquet").exists()
    tokens = pq.read_table(tmp_path / "study" / "token_stability.parquet").to_pandas()
    sinks = pq.read_table(tmp_path / "study" / "sink_stability.parquet").to_pandas()
    assert len(tokens) == 4 * 2 and (tokens.n_refits == 3).all()
    assert ((tokens.jaccard >= 0) & (tokens.jaccard <= 1)).all()
    assert set(sinks.layer) == {-1, 0, 1}
    rates = np.stack([np.asarray(r.sinks.sink_rate.estimate).reshape(2, 2) for r in study.results])
    top = sinks[(sinks.layer == 1) & (sinks["item"] == "rank 1 sink rate")]["value"].iloc[0]
    assert top == pytest.approx(rates[:, 1].max(-1).mean())
    matching = pq.read_table(tmp_path / "study" / "sink_matching.parquet")
    assert schema_for("sink_matching").validate(matching).num_rows == 3 * 3  # layers 0, 1 and pooled, 3 items
    m = matching.to_pandas()
    assert set(m.layer) == {-1, 0, 1} and (m.n_refits == 3).all() and (m.n_pairs + m.n_pairs_undefined == 6).all()
    diff = m[(m["item"] == "mean |sink-rate difference|")].set_index("layer")
    for layer in (0, 1):  # the random-matching null: mean |r_a(h) - r_b(g)| over every head pair, mean over seed pairs
        null = np.mean([np.abs(rates[a, layer][:, None] - rates[b, layer][None]).mean()
                        for a in range(3) for b in range(3) if a != b])
        assert diff.loc[layer, "null"] == pytest.approx(null)
    # the same model three times: every seed picks the same tokens, and matching pairs each head with itself
    same = TokenContributions(**EST).cross_seed([models[0]] * 3, tmp_path / "same", command=["test"])
    assert (same.to_pandas("token_stability").jaccard == 1.0).all()
    assert (same.to_pandas("sink_matching").query("item == 'mean |sink-rate difference|'").value == 0.0).all()
    with pytest.raises(InputError, match="at least 2 models"):
        est.cross_seed(models[:1], tmp_path / "one")


def _first_position_sink_model(sink_head: int, seed: int = 0):
    """Return a 1-layer model whose head ``sink_head`` attends to position 0 (a positional sink), the others avoid it."""
    cfg = ModelConfig(n_layers=1, n_heads=3, d_model=12, d_head=4, d_mlp=0, vocab_size=50, n_ctx=32, norm="none",
                      mlp="none")
    m = CircuitModel(cfg).init_weights(seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        blk = m.blocks[0]
        _fill_normal(g, m.W_E, m.W_pos, blk.W_Q, blk.W_K, blk.W_V, blk.W_O)
        m.W_E[:, 0] = 0.0
        m.W_pos[:, 0] = 0.0
        m.W_pos[0, 0] = 1.0  # dimension 0 marks the first position only
        blk.W_K[:, 0], blk.W_K[:, :, 0] = 0.0, 0.0
        blk.W_K[:, 0, 0] = 1.0  # key dimension 0 reads the first-position mark and nothing else
        blk.W_Q[:, :, 0] = 0.0
        blk.b_Q[:, 0] = -30.0  # ... which every head's query avoids
        blk.W_Q[sink_head].zero_()
        blk.b_Q[sink_head].zero_()
        blk.b_Q[sink_head, 0] = 30.0  # ... but the sink head's seeks
        blk.W_K[sink_head].zero_()
        blk.W_K[sink_head, 0, 0] = 1.0
    return m.eval()


def _heads_permuted(model, order):
    """Return a copy of a 1-layer model whose head j is ``model``'s head order[j] (the same function)."""
    import copy

    out = copy.deepcopy(model)
    with torch.no_grad():
        for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "W_O"):
            getattr(out.blocks[0], name).copy_(getattr(model.blocks[0], name)[list(order)])
    return out


def test_cross_seed_sink_matching_finds_a_planted_sink_under_permuted_heads(tmp_path):
    base = _first_position_sink_model(sink_head=0)
    models = [base, _heads_permuted(base, (1, 2, 0)), _heads_permuted(base, (2, 0, 1))]  # the sink at heads 0, 2, 1
    study = TokenContributions(**EST).cross_seed(models, tmp_path / "planted", command=["test"])
    rates = np.stack([r.sinks.sink_rate.estimate for r in study.results])
    assert (rates >= 0.3).sum(1).tolist() == [1, 1, 1] and np.argmax(rates, 1).tolist() == [0, 2, 1]
    m = study.to_pandas("sink_matching").query("layer == 0").set_index("item")
    for item in ("sink-head Jaccard", "share of sink heads matched to a sink"):
        assert m.loc[item, "value"] == 1.0 and m.loc[item, "null"] == pytest.approx(1 / 3)
        assert m.loc[item, "verdict"] == "stable" and m.loc[item, "n_pairs"] == 6
    assert m.loc["mean |sink-rate difference|", "value"] == pytest.approx(0.0, abs=1e-12)
    # rerunning reads the finished stage back (no attention patterns read again)
    import circuitstat.circuits.readouts

    def boom(*a, **k):
        raise AssertionError("patterns recomputed")

    orig, circuitstat.circuits.readouts.attention_patterns = circuitstat.circuits.readouts.attention_patterns, boom
    try:
        again = TokenContributions(**EST).cross_seed(models, tmp_path / "planted", command=["test"])
    finally:
        circuitstat.circuits.readouts.attention_patterns = orig
    np.testing.assert_array_equal(again.matching["value"], study.matching["value"])


def test_chosen_pairs_are_the_holm_family():
    est = TokenContributions(**{**EST, "pairs": ("contribution:attention", "contribution:random")}).fit(_model(seed=2))
    diffs = est.result_.to_pandas("token_importance_diffs")
    expect = [("contribution", "attention")] * 2 + [("contribution", "random")] * 2
    assert list(zip(diffs.measure_a, diffs.measure_b)) == expect
    from circuitstat.stats.testing import holm_adjust

    np.testing.assert_allclose(diffs.pvalue_holm, holm_adjust(diffs.pvalue.to_numpy()))
    assert "4 paired differences" in diffs.multiplicity.iloc[0]
