"""The zoo's cache key covers everything that decides a model's weights (issue 38: an mlp-2l seed built on two days
gave different effect distributions under one key), and `zoo list` shows each model's weight hash."""

from __future__ import annotations

import pytest
import torch

import circuitstat.pipelines.zoo as zoo
from circuitstat.circuits.corpus import Corpus
from circuitstat.pipelines.training import TrainRecipe, prepare_data, train_model

RECIPE = zoo.ZOO_RECIPES["mlp-2l"]

# The weights' sha256 after 12 steps of a tiny MLP recipe, per training-path version and platform (torch version,
# CPU kernel level). A change of the training path that changes this hash must bump zoo.TRAINING_PATH_VERSION
# (and record the new hash here): that is what makes a change of weights change the zoo's cache key.
GOLDEN = {(1, "2.13.0+cpu", "AVX2"): "c712fd3e72755e49b2f33076f1c8b61efd43ec3e7f8584bca89490b65d48406b"}


def test_the_key_changes_with_each_thing_that_changes_weights(monkeypatch):
    base = zoo.recipe_key(RECIPE, corpus_hash="c")
    assert zoo.recipe_key(RECIPE, corpus_hash="c") == base  # a key, not a random name
    assert zoo.recipe_key(RECIPE, corpus_hash="c", device="cuda:1") != base  # a GPU build is another model
    assert zoo.recipe_key(RECIPE, corpus_hash="c", device="cuda:0") == zoo.recipe_key(RECIPE, corpus_hash="c",
                                                                                      device="cuda")
    changes = [(zoo, "TRAINING_PATH_VERSION", zoo.TRAINING_PATH_VERSION + 1), (torch, "__version__", "9.9.9"),
               (torch.backends.cpu, "get_cpu_capability", lambda: "AVX512"), (zoo.np, "__version__", "0.0")]
    import tokenizers

    changes.append((tokenizers, "__version__", "0.0.1"))
    for obj, attr, value in changes:
        with monkeypatch.context() as m:
            m.setattr(obj, attr, value)
            assert zoo.recipe_key(RECIPE, corpus_hash="c") != base, attr
    assert zoo.recipe_key(RECIPE, corpus_hash="c") == base
    env = zoo.weight_environment()
    assert env["training_path"] == zoo.TRAINING_PATH_VERSION and env["device"] == "cpu" and env["cpu_capability"]


def test_training_path_version_pins_the_weights(tmp_path):
    """Fails when the training path's numerics change without a bump of TRAINING_PATH_VERSION."""
    platform = (zoo.TRAINING_PATH_VERSION, torch.__version__, torch.backends.cpu.get_cpu_capability())
    if platform not in GOLDEN:
        pytest.skip(f"no recorded weights for {platform}; record them on a machine with this platform")
    items = [(f"m{i}.py", f"def f{i}(x):\n    return x + {i} * y_{i % 7}\n" * (1 + i % 5)) for i in range(300)]
    tiny = TrainRecipe(n_layers=2, n_heads=2, d_model=32, n_ctx=16, vocab_size=300, batch_size=4, steps=12,
                       eval_every=6, eval_batches=2, checkpoint_every=6, warmup_steps=2, attn_only=False, d_mlp=64,
                       act="relu", repeat_fraction=1.0, init_std=0.125)
    data = prepare_data(tiny, corpus=Corpus.from_texts(items, name="tiny"), cache=tmp_path / "cache")
    out = train_model(tiny, 1, tmp_path / "m", data=data, progress=False)
    assert zoo.model_weight_hash(out) == GOLDEN[platform]
    assert zoo.model_weight_hash(tmp_path / "missing") is None


def test_zoo_list_shows_each_models_weight_hash(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from circuitstat.circuits import load_model
    from circuitstat.pipelines.cli import app

    monkeypatch.setenv("CIRCUITSTAT_CACHE", str(tmp_path))
    d = zoo.recipe_dir("attn-only-2l") / "seed-2"
    model = load_model("random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=16")
    d.mkdir(parents=True)
    model.save(d)
    res = CliRunner().invoke(app, ["zoo", "list"])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if ln.startswith("zoo:attn-only-2l/seed-2"))
    assert f"weights sha256:{load_model(d).weight_hash()}" in line
    assert "zoo:attn-only-2l/seed-0  not trained" in res.output and "cpu_capability" in res.output
