"""Training state read back (issue 28 items 5 and 14a): checkpoints carry digests of their values and of
their header; the tokenizer and token caches are sealed; a failed ``train`` leaves nothing behind and
prints its error on a line of its own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from typer.testing import CliRunner

from circuitstat.circuits.corpus import Corpus
from circuitstat.core.errors import InputError
from circuitstat.pipelines.cli import app
from circuitstat.pipelines.training import CHECKPOINT, TrainRecipe, prepare_data, train_model

TINY = TrainRecipe(n_layers=1, n_heads=2, d_model=16, n_ctx=16, vocab_size=280, batch_size=4, steps=8,
                   eval_every=4, eval_batches=1, checkpoint_every=4, warmup_steps=2)


def _corpus() -> Corpus:
    items = [(f"m{i}.py", f"def g{i}(x):\n    return x * {i} - z_{i % 5}\n" * (1 + i % 4)) for i in range(200)]
    return Corpus.from_texts(items, name="tiny-integrity")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def data(cache):
    return prepare_data(TINY, corpus=_corpus(), cache=cache)


def _partial(tmp_path: Path, data, name: str = "part") -> Path:
    out = tmp_path / name
    train_model(TINY, 0, out, data=data, progress=False, stop_after=4)
    return out


def _scale_value(ck: Path) -> None:
    """Item 5's edit: W_E x 10, the JSON header (metadata) kept byte for byte."""
    with safe_open(str(ck), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors["model/W_E"] = tensors["model/W_E"] * 10
    save_file(tensors, str(ck), metadata=meta)


@pytest.mark.parametrize("how", ["value-edited", "truncated", "symlinked", "fifo"])
def test_a_tampered_training_checkpoint_is_refused_naming_it(tmp_path, data, how):
    import os

    out = _partial(tmp_path, data)
    ck = out / CHECKPOINT
    if how == "value-edited":
        _scale_value(ck)
    elif how == "truncated":
        ck.write_bytes(ck.read_bytes()[:-64])
    elif how == "symlinked":
        shutil.move(ck, tmp_path / "elsewhere.safetensors")
        ck.symlink_to(tmp_path / "elsewhere.safetensors")
    elif how == "fifo":
        ck.unlink()
        os.mkfifo(ck)
    with pytest.raises(InputError) as e:
        train_model(TINY, 0, out, data=data, progress=False)
    assert str(ck) in str(e.value) and "\n" not in str(e.value)
    assert not (out / "model.safetensors").exists()  # never trained on from the damaged state


def test_an_untouched_checkpoint_still_resumes_exactly(tmp_path, data):
    from circuitstat.circuits import load_model

    resumed = _partial(tmp_path, data)
    train_model(TINY, 0, resumed, data=data, progress=False)
    whole = train_model(TINY, 0, tmp_path / "whole", data=data, progress=False)
    assert load_model(resumed).weight_hash() == load_model(whole).weight_hash()


@pytest.mark.parametrize("how", ["edited", "symlinked", "unsealed"])
def test_a_tampered_token_cache_is_rebuilt(tmp_path, cache, data, how):
    p = Path(data.train_tokens)
    good = np.load(p).copy()
    if how == "edited":  # still valid token ids: only the seal can tell
        arr = good.copy()
        arr[:100] = arr[100:200]
        np.save(p, arr)
    elif how == "symlinked":
        other = tmp_path / "other.npy"
        np.save(other, np.zeros_like(good))
        p.unlink()
        p.symlink_to(other)
    elif how == "unsealed":
        p.with_name(p.name + ".seal").unlink()
    again = prepare_data(TINY, corpus=_corpus(), cache=cache)
    assert again.train_tokens == data.train_tokens and not p.is_symlink()
    assert np.array_equal(np.load(p), good)


def test_a_tampered_tokenizer_cache_is_rebuilt(cache, data):
    tdir = Path(data.tokenizer_dir)
    doc = json.loads((tdir / "tokenizer.json").read_text())
    doc["added_tokens"] = doc.get("added_tokens", []) + [{"id": 0, "content": "X"}]
    (tdir / "tokenizer.json").write_text(json.dumps(doc))
    again = prepare_data(TINY, corpus=_corpus(), cache=cache)
    assert again.tokenizer_hash == data.tokenizer_hash  # retrained: the same tokenizer, not the edited one


def test_a_failed_train_leaves_nothing_and_prints_its_error_on_its_own_line(tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(200):
        (docs / f"{i}.txt").write_text(f"value_{i} = f(value_{i}, {i})\n" * 8)
    monkeypatch.setenv("CIRCUITSTAT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "models"
    res = CliRunner().invoke(app, ["train", "--layers", "1", "--heads", "2", "--d-model", "16", "--n-ctx", "16",
                                   "--vocab-size", "280", "--batch-size", "4", "--steps", "20", "--seeds", "0",
                                   "--corpus", str(docs), "--lr", "1e30", "--out", str(out)])
    assert res.exit_code == 2, res.output + res.stderr
    line = next(x for x in res.stderr.split("\n") if "error:" in x)
    assert line.rsplit("\r", 1)[-1].startswith("error: training diverged")  # the bar was cleared first
    assert not out.exists()  # no recipe.json, no empty seed-0/
