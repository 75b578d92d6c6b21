"""Untrusted model directories, checkpoints and sources: nothing runs code, every bad input is one line.

Model directories, hub caches, training output folders and the shared cache may hold files written
by someone else. Loading them must never unpickle or import anything, and every bad file must give
one InputError line that names the problem without quoting the file.
"""

import io
import json
import os
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from circuitstat.circuits import limits
from circuitstat.circuits.corpus import Corpus
from circuitstat.core.errors import InputError
from circuitstat.circuits.loading import load_hf, load_model
from circuitstat.circuits.tokenizers import load_tokenizer
from circuitstat.pipelines import training
from circuitstat.pipelines.training import checkpoint as training_checkpoint
from circuitstat.pipelines.training import loop as training_loop
from circuitstat.pipelines.training import (
    CHECKPOINT,
    LEGACY_CHECKPOINT,
    TrainRecipe,
    parse_seeds,
    prepare_data,
    read_checkpoint_info,
    train_model,
)

SECRET = "SECRET-CONTENT-7f3a"  # planted in bad files: must never appear in an error message
TINY_SRC = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=32&seed=3"


class _WritesMarker:
    """Unpickling this object creates the marker file: proof that a pickle ran code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "code ran"))


def _plant_pickle(path: Path, marker: Path) -> None:
    """A torch checkpoint (pickle inside torch's zip format) that writes ``marker`` when loaded."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": _WritesMarker(marker), "step": 1, "note": SECRET}, path)


def test_planted_pickle_runs_code_when_unpickled(tmp_path):
    """The adversary of these tests is real: loading its file the old way runs its code."""
    marker = tmp_path / "MARKER"
    _plant_pickle(tmp_path / "checkpoint.pt", marker)
    torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert marker.read_text() == "code ran"
    marker.unlink()
    (tmp_path / "raw.pkl").write_bytes(pickle.dumps(_WritesMarker(marker)))
    pickle.loads((tmp_path / "raw.pkl").read_bytes())
    assert marker.exists()


def _one_line(exc) -> str:
    """The message of an InputError (or pytest's ExceptionInfo of one), checked to be one line
    that quotes nothing planted in a file."""
    msg = str(getattr(exc, "value", exc))
    assert "\n" not in msg and SECRET not in msg and msg
    return msg


# ---------------------------------------------------------------------------------------------
# Model directories
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("models") / "good"
    load_hf(TINY_SRC).save_pretrained(d)
    assert (d / "model.safetensors").exists()
    return d


def _copy(good: Path, tmp_path: Path, name: str = "m") -> Path:
    d = tmp_path / name
    shutil.copytree(good, d)
    return d


def _edit_config(d: Path, **changes) -> None:
    doc = json.loads((d / "config.json").read_text())
    doc.update(changes)
    (d / "config.json").write_text(json.dumps(doc))


def _logits(model) -> torch.Tensor:
    return model(torch.tensor([[1, 5, 9, 2, 7]]))


def test_good_directory_loads_with_the_weights_it_holds(good_dir):
    hf = load_hf(str(good_dir))
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    torch.testing.assert_close(_logits(load_model(good_dir)), hf(ids).logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(_logits(load_model(good_dir)), _logits(load_model(TINY_SRC)))


def test_auto_map_is_refused_and_its_code_never_runs(good_dir, tmp_path, monkeypatch):
    d = _copy(good_dir, tmp_path)
    marker = tmp_path / "MARKER"
    (d / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('code ran')\n")
    (d / "configuration_evil.py").write_text(f"open({str(marker)!r}, 'w').write('code ran')\n")
    _edit_config(d, auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                              "AutoModelForCausalLM": "modeling_evil.EvilModel"})
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 20))  # as `yes | circuitstat model DIR`
    for load in (load_model, load_hf):
        with pytest.raises(InputError) as e:
            load(str(d))
        assert "auto_map" in _one_line(e)
    assert not marker.exists()


def test_tokenizer_with_auto_map_is_refused(good_dir, tmp_path):
    d = tmp_path / "tok"
    d.mkdir()
    marker = tmp_path / "MARKER"
    (d / "tokenization_evil.py").write_text(f"open({str(marker)!r}, 'w').write('code ran')\n")
    (d / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_evil.T", None]}}))
    with pytest.raises(InputError) as e:
        load_tokenizer(d)
    assert "auto_map" in _one_line(e) and not marker.exists()
    m = _copy(good_dir, tmp_path)  # the same file in a model directory refuses the model
    shutil.copy(d / "tokenizer_config.json", m / "tokenizer_config.json")
    with pytest.raises(InputError, match="auto_map"):
        load_model(m)


def _truncate(d):
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])


def _garbage_weights(d):
    (d / "model.safetensors").write_bytes((SECRET * 100).encode())


def _garbage_config(d):
    (d / "config.json").write_text("{" + SECRET)


def _config_list(d):
    (d / "config.json").write_text(json.dumps([SECRET]))


def _wrong_type(d):
    _edit_config(d, n_embd=SECRET)


def _float_size(d):
    _edit_config(d, n_head=2.0)


def _shape_mismatch(d):
    _edit_config(d, n_embd=32)


def _no_weights(d):
    (d / "model.safetensors").unlink()


def _missing_tensor(d):
    sd = load_file(d / "model.safetensors")
    del sd["transformer.h.0.attn.c_proj.weight"]
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})


def _unknown_arch(d):
    _edit_config(d, model_type="bert")


def _no_model_type(d):
    doc = json.loads((d / "config.json").read_text())
    del doc["model_type"]
    (d / "config.json").write_text(json.dumps(doc))


def _huge(d):
    _edit_config(d, n_embd=2**20, n_head=2**10, n_layer=2**10)


def _index_escape(d):
    (d / "model.safetensors").rename(d / "model-00001.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"wte.weight": "../../etc/passwd"}}))


@pytest.mark.parametrize("damage, fragment", [
    (_truncate, "not a valid safetensors file"),
    (_garbage_weights, "not a valid safetensors file"),
    (_garbage_config, "not valid JSON"),
    (_config_list, "JSON object"),
    (_wrong_type, "n_embd must be a positive integer"),
    (_float_size, "n_head must be a positive integer, got 2.0"),
    (_shape_mismatch, "implies"),
    (_no_weights, "no weights"),
    (_missing_tensor, "missing"),
    (_unknown_arch, "not supported"),
    (_no_model_type, "model_type"),
    (_huge, "--allow-large"),
    (_index_escape, "plain file names"),
])
def test_bad_model_directory_is_one_line_input_error(good_dir, tmp_path, damage, fragment):
    d = _copy(good_dir, tmp_path)
    damage(d)
    with pytest.raises(InputError) as e:
        load_model(d)
    assert fragment in _one_line(e)


def test_own_model_directory_with_bad_config_or_weights(tmp_path):
    model = load_model(TINY_SRC)
    d = model.save(tmp_path / "own")
    torch.testing.assert_close(_logits(load_model(d)), _logits(model))
    doc = json.loads((d / "config.json").read_text())
    for key, value, fragment in (("n_heads", "abc", "n_heads must be a positive integer"),
                                 ("d_model", 2**40, "--allow-large"),
                                 ("d_model", 32, "do not match")):
        bad = _copy(d, tmp_path, f"own-{key}-{value}")
        (bad / "config.json").write_text(json.dumps({**doc, "config": {**doc["config"], key: value}}))
        with pytest.raises(InputError) as e:
            load_model(bad)
        assert fragment in _one_line(e)


def _pickled_dir(good: Path, tmp_path: Path) -> Path:
    d = _copy(good, tmp_path, "bin")
    torch.save(load_file(d / "model.safetensors"), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    return d


def test_pickled_weights_need_allow_pickle_and_then_load_weights_only(good_dir, tmp_path):
    d = _pickled_dir(good_dir, tmp_path)
    with pytest.raises(InputError) as e:
        load_model(d)
    assert "--allow-pickle" in _one_line(e)
    torch.testing.assert_close(_logits(load_model(d, allow_pickle=True)), _logits(load_model(good_dir)))
    # even allowed, a pickle that would run code is refused by weights_only loading
    marker = tmp_path / "MARKER"
    _plant_pickle(d / "pytorch_model.bin", marker)
    with pytest.raises(InputError) as e:
        load_model(d, allow_pickle=True)
    _one_line(e)
    assert not marker.exists()


@pytest.mark.parametrize("name", ["weights.pt", "model.ckpt", "model.pth"])
def test_other_pickle_files_are_refused(good_dir, tmp_path, name):
    d = _copy(good_dir, tmp_path)
    (d / "model.safetensors").unlink()
    marker = tmp_path / "MARKER"
    _plant_pickle(d / name, marker)
    with pytest.raises(InputError, match="--allow-pickle"):
        load_model(d)
    with pytest.raises(InputError):  # allowed, but not a file transformers loads: still no code runs
        load_model(d, allow_pickle=True)
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# random: sources and the memory limit
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("query, fragment", [
    ("n_head=0", "n_head must be a positive integer, got 0"),
    ("n_layer=abc", "n_layer must be a positive integer"),
    ("vocab_size=1e12", "vocab_size must be a positive integer, got 1000000000000.0"),
    ("n_embd=30&n_head=4", "not divisible"),
    ("n_embd=1000000&n_layer=100000&n_head=1000", "PiB"),
    ("vocab_size=1000000000000", "--allow-large"),
    ("n_inner=-5", "n_inner must be a positive integer"),
    ("layer_norm_epsilon=abc", "layer_norm_epsilon"),
])
def test_bad_random_sources_fail_before_allocation(query, fragment):
    with pytest.raises(InputError) as e:
        load_model(f"random:gpt2?{query}")
    assert fragment in _one_line(e)


def test_random_gqa_heads_must_divide():
    with pytest.raises(InputError, match="not a multiple of num_key_value_heads=3"):
        load_model("random:llama?hidden_size=32&num_hidden_layers=1&num_attention_heads=4&num_key_value_heads=3"
                   "&intermediate_size=64&vocab_size=97")


def test_allow_large_lifts_the_memory_limit(monkeypatch, good_dir):
    monkeypatch.setattr(limits, "MAX_BYTES", 1000.0)
    for src in (TINY_SRC, str(good_dir)):
        with pytest.raises(InputError, match="--allow-large"):
            load_model(src)
        assert load_model(src, allow_large=True).cfg.d_model == 16


# ---------------------------------------------------------------------------------------------
# Cached hub ids at a revision (no network)
# ---------------------------------------------------------------------------------------------


def test_hub_id_at_revision_resolves_from_the_local_cache_only(good_dir, tmp_path, monkeypatch):
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = tmp_path / "hub" / "models--org--tiny"
    commit = "a" * 40
    shutil.copytree(good_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    ref = _logits(load_model(good_dir))
    for src in ("org/tiny", f"org/tiny@{commit}", "org/tiny@main"):
        m = load_model(src)
        assert m.source == src
        torch.testing.assert_close(_logits(m), ref)
    for src in ("org/tiny@v9", "org/absent", "org/absent@main"):
        with pytest.raises(InputError, match="not in the local Hugging Face cache"):
            load_model(src)
    _edit_config(repo / "snapshots" / commit, auto_map={"AutoModelForCausalLM": "x.Y"})
    with pytest.raises(InputError, match="auto_map"):
        load_model(f"org/tiny@{commit}")


# ---------------------------------------------------------------------------------------------
# Training checkpoints
# ---------------------------------------------------------------------------------------------

TINY = TrainRecipe(n_layers=1, n_heads=2, d_model=16, n_ctx=16, vocab_size=280, batch_size=4, steps=8,
                   eval_every=4, eval_batches=1, checkpoint_every=4, warmup_steps=2)


def _corpus():
    items = [(f"m{i}.py", f"def g{i}(x):\n    return x * {i} - z_{i % 5}\n" * (1 + i % 4)) for i in range(200)]
    return Corpus.from_texts(items, name="tiny-untrusted")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare_data(TINY, corpus=_corpus(), cache=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data):
    """Weight hash of an uninterrupted run of TINY, seed 0."""
    d = train_model(TINY, 0, tmp_path_factory.mktemp("ref") / "seed-0", data=data, progress=False)
    return load_model(d).weight_hash()


def test_planted_pickles_never_run_and_training_still_matches(tmp_path, data, reference):
    marker = tmp_path / "MARKER"
    out = tmp_path / "seed-0"
    _plant_pickle(out / LEGACY_CHECKPOINT, marker)
    with pytest.warns(UserWarning, match="never loaded"):
        train_model(TINY, 0, out, data=data, progress=False)
    assert not marker.exists()
    assert load_model(out).weight_hash() == reference


def test_pickle_under_the_checkpoint_name_is_refused(tmp_path, data):
    marker = tmp_path / "MARKER"
    out = tmp_path / "seed-0"
    _plant_pickle(out / CHECKPOINT, marker)
    with pytest.raises(InputError) as e:
        train_model(TINY, 0, out, data=data, progress=False)
    assert "not a circuitstat training checkpoint" in _one_line(e)
    assert not marker.exists() and not (out / "model.safetensors").exists()


def test_refused_checkpoint_in_train_models_writes_nothing(tmp_path, data):
    marker = tmp_path / "MARKER"
    out = tmp_path / "runs"
    _plant_pickle(out / "seed-1" / CHECKPOINT, marker)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(InputError, match="seed-1"):
        training.train_models(TINY, [0, 1], out, corpus=_corpus(), cache=Path(data.tokenizer_dir).parents[1],
                              progress=False)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before and not marker.exists()


def test_planted_pickles_in_the_zoo_cache_never_run(tmp_path, data):
    from circuitstat.pipelines.zoo import default_zoo, recipe_dir

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(120):
        (docs / f"{i}.txt").write_text(f"value_{i} = f(value_{i}, {i})\n" * 8)
    recipe = TINY.replace(corpus=str(docs), steps=4)
    cache = tmp_path / "cache"
    root = recipe_dir("t", recipe, cache)
    marker = tmp_path / "MARKER"
    _plant_pickle(root / "seed-0" / LEGACY_CHECKPOINT, marker)
    _plant_pickle(root / "seed-1" / CHECKPOINT, marker)
    with pytest.raises(InputError, match="seed-1"):
        with pytest.warns(UserWarning, match="never loaded"):
            default_zoo(n_jobs=1, cache=cache, recipes={"t": recipe}, seeds=(0, 1), progress=False)
    assert not marker.exists()
    assert load_model(root / "seed-0").meta["training"]["complete"]


def _partial(tmp_path, data, name="part", seed=0) -> Path:
    out = tmp_path / name
    train_model(TINY, seed, out, data=data, progress=False, stop_after=4)
    assert (out / CHECKPOINT).exists() and read_checkpoint_info(out / CHECKPOINT)["step"] == 4
    return out


def test_checkpoint_resume_is_exact_and_foreign_checkpoints_restart(tmp_path, data, reference):
    out = _partial(tmp_path, data)
    train_model(TINY, 0, out, data=data, progress=False)
    assert load_model(out).weight_hash() == reference
    # a checkpoint of another seed: ignored with a warning, training from step 0 gives seed 0's model
    other = _partial(tmp_path, data, "other", seed=1)
    with pytest.warns(UserWarning, match="another recipe, seed or data"):
        train_model(TINY, 0, other, data=data, progress=False)
    assert load_model(other).weight_hash() == reference


def _rewrite(ck: Path, tensors=None, meta=None) -> None:
    from safetensors import safe_open

    with safe_open(str(ck), framework="pt") as f:
        doc = json.loads(f.metadata()["circuitstat"])
        ts = {k: f.get_tensor(k) for k in f.keys()}
    ts.update(tensors or {})
    doc.update(meta or {})
    save_file(ts, ck, metadata={"circuitstat": json.dumps(doc)})


@pytest.mark.parametrize("edit, fragment", [
    (lambda ck: ck.write_bytes(os.urandom(64) + SECRET.encode()), "not a circuitstat training checkpoint"),
    (lambda ck: ck.write_bytes(ck.read_bytes()[:200]), "not a circuitstat training checkpoint"),
    (lambda ck: save_file({"x": torch.zeros(2)}, ck), "not a circuitstat training checkpoint"),
    (lambda ck: _rewrite(ck, meta={"format_version": 99}), "format version 99"),
    (lambda ck: _rewrite(ck, tensors={"model/W_E": torch.zeros(3, 3)}), "do not fit"),
    (lambda ck: _rewrite(ck, tensors={"optim/0/exp_avg": torch.zeros(1)}), "do not fit"),
    # issue 28: every other edit is caught by the digests recorded when the checkpoint was written
    (lambda ck: _rewrite(ck, tensors={"rng/torch": torch.zeros(3, dtype=torch.uint8)}), "do not match the digest"),
    (lambda ck: _rewrite(ck, meta={"step": 10**6}), "header does not match the digest"),
    (lambda ck: _rewrite(ck, meta={"log": SECRET}), "header does not match the digest"),
])
def test_corrupt_or_edited_checkpoint_is_refused(tmp_path, data, edit, fragment):
    out = _partial(tmp_path, data)
    edit(out / CHECKPOINT)
    with pytest.raises(InputError) as e:
        train_model(TINY, 0, out, data=data, progress=False)
    assert fragment in _one_line(e)
    assert not (out / "model.safetensors").exists()


def test_rng_states_round_trip_exactly(tmp_path):
    """torch, numpy (with a cached Gaussian) and Python RNGs continue exactly after a restore."""
    from circuitstat.circuits.model import CircuitModel

    model = CircuitModel(TINY.model_config(50)).init_weights(0)
    opt = training_loop._make_optimizer(TINY, model)
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    opt.step()
    torch.manual_seed(11), np.random.seed(12), random.seed(13)
    np.random.standard_normal(1)  # leaves a cached Gaussian in the legacy numpy state
    ck = tmp_path / CHECKPOINT
    training_checkpoint.save_checkpoint(ck, model, opt, {"step": 1, "log": [], "elapsed_s": 0.0, "run_loss": 0.1,
                                                          "run_n": 1, "cpu_s": 0.0, "recipe_hash": "r", "seed": 0,
                                                          "data_hash": "d"})
    expected = (torch.rand(5), np.random.standard_normal(3), [random.random() for _ in range(3)])
    state = {k: v.clone() for k, v in opt.state_dict()["state"][0].items()}
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    fresh = CircuitModel(TINY.model_config(50))
    fresh_opt = training_loop._make_optimizer(TINY, fresh)
    counters = training_checkpoint.restore_checkpoint(ck, read_checkpoint_info(ck), fresh, fresh_opt, TINY, "cpu")
    assert counters["step"] == 1 and counters["run_loss"] == 0.1
    got = (torch.rand(5), np.random.standard_normal(3), [random.random() for _ in range(3)])
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]) and got[2] == expected[2]
    assert fresh.weight_hash() == model.weight_hash()
    for k, v in fresh_opt.state_dict()["state"][0].items():
        assert torch.equal(v, state[k])
    assert fresh_opt.param_groups[0]["betas"] == opt.param_groups[0]["betas"] == (0.9, 0.99)


def test_divergence_is_an_input_error(tmp_path, data):
    with pytest.raises(InputError) as e:
        train_model(TINY.replace(lr=1e30), 0, tmp_path / "div", data=data, progress=False)
    assert "training diverged at step" in _one_line(e) and "lower --lr" in str(e.value)


def test_planted_token_cache_is_refused(tmp_path, data):
    bad = tmp_path / "train.npy"
    np.save(bad, np.array([0, 1, data.vocab_size + 5], dtype=np.int32))
    spec = training.DataSpec(**{**data.__dict__, "train_tokens": str(bad)})
    with pytest.raises(InputError, match="not token ids"):
        train_model(TINY, 0, tmp_path / "x", data=spec, progress=False)
    np.save(bad, np.array([{"a": SECRET}], dtype=object))  # an object array needs a pickle to load
    with pytest.raises(InputError) as e:
        train_model(TINY, 0, tmp_path / "x", data=spec, progress=False)
    _one_line(e)


# ---------------------------------------------------------------------------------------------
# `circuitstat train`: every option checked before anything is written
# ---------------------------------------------------------------------------------------------


def _invoke(args, tmp_path, monkeypatch):
    """`circuitstat train ARGS` through the real CLI (its error boundary: exit 2 and one line for bad input)."""
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    monkeypatch.setenv("CIRCUITSTAT_CACHE", str(tmp_path / "cache"))
    return CliRunner().invoke(app, ["train", *args])


@pytest.mark.parametrize("args, fragment", [
    (["--norm", "bogus"], "'bogus' is not one of 'layernorm', 'rmsnorm', 'none'"),
    (["--positional", "bogus"], "'bogus' is not one of 'learned', 'rotary'"),
    (["--seeds", "0-100000000"], "--allow-large"),
    (["--lr", "inf"], "lr must be a positive finite number"),
    (["--device", "bogus"], "unknown device"),
    (["--n-jobs", "0"], "--n-jobs"),
    (["--n-jobs", "99999"], "--n-jobs"),
    (["--layers", "0"], "--layers"),
    (["--d-model", "4096", "--layers", "200", "--vocab-size", "50000"], "--allow-large"),
])
def test_train_command_validates_before_writing(tmp_path, monkeypatch, args, fragment):
    out = tmp_path / "out"
    res = _invoke(["--out", str(out), *args], tmp_path, monkeypatch)
    assert res.exit_code == 2 and res.output.startswith("error: ") and res.output.count("\n") == 1, res.output
    assert fragment in res.output
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_train_command_refuses_out_naming_a_file(tmp_path, monkeypatch):
    f = tmp_path / "file"
    f.write_text("keep")
    for out in (f, f / "sub"):
        res = _invoke(["--out", str(out)], tmp_path, monkeypatch)
        assert res.exit_code == 2 and "is not a directory" in res.output, res.output
    assert f.read_text() == "keep" and not (tmp_path / "cache").exists()


def test_seed_limit_and_allow_large():
    with pytest.raises(InputError, match="above the limit of 1,000"):
        parse_seeds("0-1000")
    assert parse_seeds("0-999") == list(range(1000))
    assert len(parse_seeds("0-1000", allow_large=True)) == 1001


def test_study_variance_refuses_pickled_weights_unless_allowed(good_dir, tmp_path):
    """`study variance` loads its models like every other command: pickles need --allow-pickle."""
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    d = _pickled_dir(good_dir, tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model: {d.name}\ntask: {{name: induction, n: 40, options: {{seq_len: 4}}}}\n"
                    "estimators: {methods: [exact, eap]}\nbootstrap: {n_resamples: 100}\nk: [3]\n"
                    "dataset: {n_fresh: 0}\ncounterfactual: {n_draws: 1}\n")
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["study", "variance", str(spec), "--out", str(out), "--no-report"])
    assert r.exit_code == 2 and "--allow-pickle" in r.output, r.output
    assert not out.exists()
    # allowed, the model loads and the study goes on to its own checks (here: k above the edge count, exit 2)
    spec.write_text(spec.read_text().replace("k: [3]", "k: [99999]"))
    r = CliRunner().invoke(app, ["study", "variance", str(spec), "--out", str(out), "--no-report", "--allow-pickle"])
    assert r.exit_code == 2 and "k=99999 is not below" in r.output and "--allow-pickle" not in r.output, r.output
    assert not out.exists()
