"""The zoo's cache key covers everything that decides a model's weights (issue 38: an mlp-2l seed built on two days
gave different effect distributions under one key), and `zoo list` shows each model's weight hash."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import torch

import circuitstat.pipelines.zoo as zoo
from circuitstat.circuits.corpus import Corpus
from circuitstat.pipelines.training import TrainRecipe, prepare_data, train_model

RECIPE = zoo.ZOO_RECIPES["mlp-2l"]

FINGERPRINT = Path(__file__).parents[1] / "fixtures" / "zoo-training-fingerprint.json"
TINY = dict(n_layers=2, n_heads=2, d_model=32, n_ctx=16, vocab_size=300, batch_size=4, steps=12, eval_every=6,
            eval_batches=2, checkpoint_every=6, warmup_steps=2, attn_only=False, d_mlp=64, act="relu",
            repeat_fraction=1.0, init_std=0.125)
# Each tensor's fingerprint is (sum, L2 norm, dot with a fixed Gaussian vector). Across torch's CPU kernel levels
# (ATEN_CPU_CAPABILITY default, avx2, avx512 on one machine) the entries differ by at most 2.1e-5 after these 12 steps;
# a 0.8% change of init_std moves them by up to 0.099 (median tensor 1.8e-3) and one more step by up to 0.20. The
# tolerance sits between: 50x the kernel spread, 100x below the smallest change tried. Key biases are left out: softmax
# is invariant to them, so their gradient is rounding noise that Adam turns into lr-sized steps (they differ by 8e-4
# across kernels and carry nothing of the training path).
TOLERANCE = 1e-3


def weight_fingerprint(directory: Path) -> dict[str, list[float]]:
    """Per tensor of a trained model: its sum, L2 norm and dot with a Gaussian vector seeded by the tensor's name."""
    from safetensors.numpy import load_file

    out = {}
    for name, w in sorted(load_file(str(directory / "model.safetensors")).items()):
        a = w.astype(np.float64).ravel()
        r = np.random.default_rng(zlib.crc32(name.encode())).standard_normal(a.size)
        out[name] = [float(a.sum()), float(np.linalg.norm(a)), float(a @ r)]
    return out


def fingerprint_gap(a: dict, b: dict) -> tuple[str, float]:
    """The tensor (key biases left out) whose fingerprints differ most, and by how much."""
    assert sorted(a) == sorted(b)
    gaps = {k: max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a if not k.endswith("b_K")}
    worst = max(gaps, key=gaps.get)
    return worst, gaps[worst]


def train_tiny(tmp_path: Path, **change) -> Path:
    """Train the tiny recipe (with ``change`` applied) for 12 steps on a fixed synthetic corpus."""
    items = [(f"m{i}.py", f"def f{i}(x):\n    return x + {i} * y_{i % 7}\n" * (1 + i % 5)) for i in range(300)]
    recipe = TrainRecipe(**{**TINY, **change})
    data = prepare_data(recipe, corpus=Corpus.from_texts(items, name="tiny"), cache=tmp_path / "cache")
    return train_model(recipe, 1, tmp_path / "m", data=data, progress=False)


def test_the_key_changes_with_each_thing_that_changes_weights(monkeypatch):
    base = zoo.recipe_key(RECIPE, corpus_hash="c")
    real_capability = torch.backends.cpu.get_cpu_capability()  # another level than this machine's, whichever it is
    assert zoo.recipe_key(RECIPE, corpus_hash="c") == base  # a key, not a random name
    assert zoo.recipe_key(RECIPE, corpus_hash="c", device="cuda:1") != base  # a GPU build is another model
    assert zoo.recipe_key(RECIPE, corpus_hash="c", device="cuda:0") == zoo.recipe_key(RECIPE, corpus_hash="c",
                                                                                      device="cuda")
    changes = [(zoo, "TRAINING_PATH_VERSION", zoo.TRAINING_PATH_VERSION + 1), (torch, "__version__", "9.9.9"),
               (torch.backends.cpu, "get_cpu_capability", lambda: "not-" + real_capability), (zoo.np, "__version__", "0.0")]
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
    """Fails when the training path's numerics change without a bump of TRAINING_PATH_VERSION, on any CPU: the
    weights' fingerprint is compared within a tolerance that CPU kernel levels stay inside (module comment)."""
    recorded = json.loads(FINGERPRINT.read_text())
    assert recorded["training_path"] == zoo.TRAINING_PATH_VERSION, "record a new fingerprint with the bump"
    out = train_tiny(tmp_path)
    assert fingerprint_gap(weight_fingerprint(out), recorded["fingerprint"])[1] <= TOLERANCE
    assert zoo.model_weight_hash(tmp_path / "missing") is None


def test_the_fingerprint_sees_a_small_change_of_the_training_path(tmp_path):
    """Negative control: a 0.8% change of the initial scale is far outside the tolerance."""
    recorded = json.loads(FINGERPRINT.read_text())["fingerprint"]
    worst, gap = fingerprint_gap(weight_fingerprint(train_tiny(tmp_path, init_std=0.126)), recorded)
    assert gap > 20 * TOLERANCE, (worst, gap)


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
