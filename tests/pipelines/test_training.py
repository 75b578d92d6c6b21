import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from circuitstat.circuits import load_model
from circuitstat.circuits.corpus import Corpus
from circuitstat.core.errors import InputError
from circuitstat.circuits.model import CircuitModel, ModelConfig
from circuitstat.pipelines.training import (
    CHECKPOINT,
    LOG_TABLE,
    TrainRecipe,
    is_complete,
    parse_seeds,
    prepare_data,
    train_model,
    train_models,
)

ROOT = Path(__file__).resolve().parents[2]


def _corpus():
    items = [(f"m{i}.py", f"def f{i}(x):\n    return x + {i} * y_{i % 7}\n" * (1 + i % 5)) for i in range(300)]
    return Corpus.from_texts(items, name="tiny")


TINY = TrainRecipe(n_layers=1, n_heads=2, d_model=32, n_ctx=16, vocab_size=300, batch_size=4, steps=12,
                   eval_every=4, eval_batches=2, checkpoint_every=4, warmup_steps=2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare_data(TINY, corpus=_corpus(), cache=tmp_path_factory.mktemp("cache"))


def _hash(d):
    return load_model(d).weight_hash()


def test_bitwise_reproducible_and_seeds_differ(tmp_path, data):
    a = train_model(TINY, 0, tmp_path / "a", data=data, progress=False)
    b = train_model(TINY, 0, tmp_path / "b", data=data, progress=False)
    c = train_model(TINY, 1, tmp_path / "c", data=data, progress=False)
    assert _hash(a) == _hash(b) != _hash(c)
    m = load_model(a)
    doc = json.loads((a / "config.json").read_text())
    assert doc["weight_hash"] == m.weight_hash()
    t = m.meta["training"]
    assert t["seed"] == 0 and t["complete"] and t["optimizer"]["name"] == "adamw"
    assert t["recipe"]["d_model"] == 32 and t["corpus_hash"] == data.corpus_hash
    assert m.tokenizer is not None and m.tokenizer.content_hash == data.tokenizer_hash
    assert m.cfg.n_layers == 1 and m.cfg.has_mlp and not m.training
    assert not (a / CHECKPOINT).exists()
    counts = __import__("numpy").load(a / "token_counts.npy")
    assert counts.shape == (m.cfg.vocab_size,) and counts.sum() == data.n_train_tokens
    assert is_complete(a, TINY, 0, data.content_hash) and not is_complete(a, TINY, 1)
    log = pq.read_table(a / LOG_TABLE)
    assert log.column("step").to_pylist() == [4, 8, 12]
    assert all(v > 0 for v in log.column("val_loss").to_pylist())
    assert b"circuitstat.provenance" in log.schema.metadata
    # a finished model is not retrained
    mtime = (a / "model.safetensors").stat().st_mtime_ns
    train_model(TINY, 0, a, data=data, progress=False)
    assert (a / "model.safetensors").stat().st_mtime_ns == mtime


def test_resume_matches_uninterrupted(tmp_path, data):
    full = train_model(TINY, 3, tmp_path / "full", data=data, progress=False)
    part = train_model(TINY, 3, tmp_path / "part", data=data, progress=False, stop_after=6)
    assert (part / CHECKPOINT).exists() and not (part / "model.safetensors").exists()
    train_model(TINY, 3, part, data=data, progress=False)
    assert _hash(part) == _hash(full)
    assert pq.read_table(part / LOG_TABLE).column("val_loss").to_pylist() == \
        pq.read_table(full / LOG_TABLE).column("val_loss").to_pylist()


def test_kill_and_resume(tmp_path, data):
    """SIGKILL a training process after its first checkpoint; the resumed run ends bitwise equal."""
    recipe = TINY.replace(steps=200, checkpoint_every=10, eval_every=100, repeat_fraction=0.5)
    ref = train_model(recipe, 5, tmp_path / "ref", data=data, progress=False)
    out = tmp_path / "killed"
    code = (
        "import json, sys; from circuitstat.pipelines.training import TrainRecipe, DataSpec, train_model; "
        f"r = TrainRecipe.from_dict(json.loads({json.dumps(json.dumps(recipe.to_dict()))})); "
        f"d = DataSpec(**json.loads({json.dumps(json.dumps(data.__dict__))})); "
        f"train_model(r, 5, {str(out)!r}, data=d, progress=False)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    deadline = time.time() + 60
    while not (out / CHECKPOINT).exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    killed = proc.poll() is None
    if killed:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    if killed:
        assert not (out / "model.safetensors").exists()
        step = torch.load(out / CHECKPOINT, weights_only=False)["step"]
        assert 0 < step < recipe.steps
    train_model(recipe, 5, out, data=data, progress=False)
    assert _hash(out) == _hash(ref)


def test_train_models_parallel_equals_sequential(tmp_path, data):
    recipe = TINY.replace(optimizer="adam", weight_decay=0.1, steps=6)
    par = train_models(recipe, [0, 1], tmp_path / "par", n_jobs=2, corpus=_corpus(),
                       cache=Path(data.tokenizer_dir).parents[1], progress=False)
    seq = [train_model(recipe, s, tmp_path / "seq" / f"s{s}", data=data, progress=False) for s in (0, 1)]
    assert [p.name for p in par] == ["seed-0", "seed-1"]
    assert [_hash(p) for p in par] == [_hash(p) for p in seq]
    assert load_model(par[0]).meta["training"]["optimizer"]["name"] == "adam"
    assert _hash(train_model(TINY.replace(steps=6), 0, tmp_path / "w", data=data, progress=False)) != _hash(seq[0])


def test_attention_only(tmp_path, data):
    d = train_model(TINY.replace(attn_only=True, steps=4), 0, tmp_path / "ao", data=data, progress=False)
    m = load_model(d)
    assert not m.cfg.has_mlp
    ids = torch.tensor([m.tokenizer.encode("def f(x):")])
    assert m(ids).shape == (1, ids.shape[1], m.cfg.vocab_size)


def test_parse_seeds_and_recipe_errors():
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("0-2,10") == [0, 1, 2, 10]
    assert parse_seeds("7") == [7]
    for bad in ("a-b", "4-1", "", "1,1"):
        with pytest.raises(InputError):
            parse_seeds(bad)
    with pytest.raises(InputError, match="optimizer"):
        TrainRecipe(optimizer="sgd")
    with pytest.raises(InputError, match="divisible"):
        TrainRecipe(d_model=30, n_heads=4)
    with pytest.raises(InputError, match="unknown training recipe keys"):
        TrainRecipe.from_dict({"layers": 2})
    assert TrainRecipe.from_dict(TINY.to_dict()) == TINY


def test_train_command_cli(tmp_path, monkeypatch):
    import typer
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli.studies import train_command

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(200):
        (docs / f"{i}.txt").write_text(f"line {i} of the text; the value is {i * 7}\n" * 20)
    monkeypatch.setenv("CIRCUITSTAT_CACHE", str(tmp_path / "cache"))
    app = typer.Typer()
    app.command()(train_command)
    res = CliRunner().invoke(app, [
        "--layers", "1", "--heads", "2", "--d-model", "16", "--attn-only", "--optimizer", "adamw",
        "--weight-decay", "0.0", "--steps", "3", "--seeds", "0-1", "--out", str(tmp_path / "zoo"),
        "--n-ctx", "16", "--vocab-size", "280", "--corpus", str(docs), "--batch-size", "2",
    ])
    assert res.exit_code == 0, res.output
    for s in (0, 1):
        m = load_model(tmp_path / "zoo" / f"seed-{s}")
        assert not m.cfg.has_mlp and m.cfg.d_model == 16 and m.meta["training"]["seed"] == s


@pytest.mark.parametrize("positional", ["learned", "rotary"])
@pytest.mark.parametrize("mlp", ["none", "standard"])
@pytest.mark.parametrize("norm", ["layernorm", "none"])
def test_fused_logits_equal_model_logits(positional, mlp, norm):
    cfg = ModelConfig(n_layers=2, n_heads=4, d_model=32, d_head=8, d_mlp=0 if mlp == "none" else 64,
                      vocab_size=50, n_ctx=24, mlp=mlp, positional=positional, norm=norm)
    m = CircuitModel(cfg).init_weights(1)
    ids = torch.randint(0, 50, (3, 24), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(m.fused_logits(ids), m(ids), atol=1e-5, rtol=1e-5)


def test_zoo_cache_and_induction_metrics(tmp_path):
    from circuitstat.pipelines.zoo import default_zoo, induction_metrics, recipe_key

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(200):
        (docs / f"{i}.txt").write_text(f"item_{i} = compute(item_{i}, {i})\n" * 10)
    recipes = {"t": TINY.replace(corpus=str(docs), steps=3, attn_only=True, n_layers=2)}
    paths = default_zoo(n_jobs=1, cache=tmp_path / "cache", recipes=recipes, seeds=(0, 1), progress=False)
    assert [p.name for p in paths] == ["seed-0", "seed-1"] and paths[0].parent.name.startswith("t-")
    mtime = (paths[0] / "model.safetensors").stat().st_mtime_ns
    again = default_zoo(n_jobs=1, cache=tmp_path / "cache", recipes=recipes, seeds=(0, 1), progress=False)
    assert again == paths and (paths[0] / "model.safetensors").stat().st_mtime_ns == mtime
    assert recipe_key(recipes["t"]) != recipe_key(recipes["t"].replace(steps=4))
    assert recipe_key(recipes["t"]) != recipe_key(recipes["t"], corpus_hash="other")
    r = induction_metrics(load_model(paths[0]), n=4, seq_len=6)
    assert r["induction_scores"].shape == (2, 2) and r["prev_token_scores"].shape == (2, 2)
    assert 0 <= r["induction_scores"].min() and r["induction_scores"].max() <= 1
    assert r["loss_first"] > 0 and r["loss_second"] > 0


def test_repeat_spans_copy_corpus_text():
    import numpy as np

    from circuitstat.pipelines.training.data import _repeat_spans

    x = np.arange(4 * 64).reshape(4, 64)
    y = x.copy()
    _repeat_spans(y, 1.0, np.random.default_rng(0))
    for row, orig in zip(y, x):
        changed = np.flatnonzero(row != orig)
        assert 8 <= len(changed) <= 32  # one span of P/8..P/2 tokens, copied from earlier in the row
        src = row[changed[0]] - orig[0]
        assert src < changed[0] and np.array_equal(row[changed], orig[src:src + len(changed)])
    z = x.copy()
    _repeat_spans(z, 0.0, np.random.default_rng(0))
    assert np.array_equal(z, x)


def test_init_std_rescales_weight_matrices():
    from circuitstat.pipelines.training.loop import _init

    cfg = TINY.model_config(300)
    a, b = CircuitModel(cfg), CircuitModel(cfg)
    _init(a, 0, None)
    _init(b, 0, 0.1)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        factor = 5.0 if name.rsplit(".", 1)[-1].startswith("W_") else 1.0
        torch.testing.assert_close(pb, pa * factor)
    with pytest.raises(InputError, match="init_std"):
        TrainRecipe(init_std=0.0)


def test_zoo_sources_resolve_to_the_recipe_cache(tmp_path, monkeypatch):
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.sources import LOCAL
    from circuitstat.pipelines.zoo import ZOO_RECIPES, recipe_dir

    def resolve_source(source):
        return LOCAL.resolve(source).location

    monkeypatch.setenv("CIRCUITSTAT_CACHE", str(tmp_path))
    assert resolve_source("random:gpt2") == "random:gpt2"
    with pytest.raises(InputError, match="recipes: attn-only-2l, mlp-2l"):
        resolve_source("zoo:nope/seed-0")
    with pytest.raises(InputError, match="zoo sources look like zoo:RECIPE/seed-S"):
        resolve_source("zoo:attn-only-2l")
    with pytest.raises(InputError, match="python -m circuitstat.pipelines.zoo"):
        resolve_source("zoo:attn-only-2l/seed-0")
    d = recipe_dir("attn-only-2l")
    assert d.parent == tmp_path / "zoo" and d.name.startswith("attn-only-2l-")
    assert recipe_dir("mlp-2l") != d and recipe_dir("attn-only-2l", ZOO_RECIPES["attn-only-2l"].replace(steps=1)) != d
    (d / "seed-3").mkdir(parents=True)
    (d / "seed-3" / "model.safetensors").write_bytes(b"")
    assert resolve_source("zoo:attn-only-2l/seed-3") == str(d / "seed-3")


def test_induction_task_draws_tokens_the_model_was_trained_on(tmp_path, data):
    import numpy as np

    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.build import build_task
    from circuitstat.pipelines.zoo import frequent_tokens

    m = load_model(train_model(TINY, 0, tmp_path / "m", data=data, progress=False))
    counts = np.load(tmp_path / "m" / "token_counts.npy").astype(np.int64)
    counts[[m.tokenizer.bos_id, m.tokenizer.eos_id]] = -1
    order = np.argsort(-counts, kind="stable")
    thr = int(counts[order[11]])  # a bar that 12 or more tokens pass in this small corpus
    seen = set(np.flatnonzero(counts >= thr).tolist())
    assert set(frequent_tokens(m, thr).tolist()) == seen and 12 <= len(seen) < 100
    used = lambda t: set(t.clean[:, 1:].unique().tolist()) | set(t.corrupted[:, 1:].unique().tolist())
    assert used(build_task(m, "induction", n=16, seq_len=3, token_ids=f"frequent:{thr}")) <= seen
    # default: the tokens seen >= 1000 times, or (fewer here) the 2 seq_len most frequent ones
    assert used(build_task(m, "induction", n=32, seq_len=3)) == set(order[:6].tolist())
    assert used(build_task(m, "induction", n=32, seq_len=3, corrupt="answer")) == set(order[:4].tolist())
    assert used(build_task(m, "induction", n=8, seq_len=2, token_ids=[40, 41, 42, 43])) <= {40, 41, 42, 43}
    with pytest.raises(InputError, match="not a list of ids or 'frequent"):
        build_task(m, "induction", n=4, seq_len=2, token_ids="rare")
    rnd = load_model("random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=32")
    with pytest.raises(InputError, match="needs a model trained by circuitstat"):
        build_task(rnd, "induction", n=4, seq_len=2, token_ids="frequent")
    # any other model: the whole vocabulary
    assert len(used(build_task(rnd, "induction", n=64, seq_len=8))) > 40


def test_use_deterministic_fixes_the_cublas_workspace_and_keeps_a_users_choice(monkeypatch):
    """cuBLAS is deterministic only with a fixed workspace, read when it initialises: the runs set it."""
    import os

    import torch

    from circuitstat.pipelines.training import use_deterministic
    from circuitstat.pipelines.training.determinism import _set_deterministic

    prev = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
        use_deterministic()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        use_deterministic()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        _set_deterministic(*prev)
