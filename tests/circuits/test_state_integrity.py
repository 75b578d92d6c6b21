"""State circuitstat reads back (issue 28, items 1-3 and 12): the conversion cache, the weight-hash memo
and circuitstat model directories. Each tamper (edited, swapped, truncated, linked) ends in a rebuild
or a refusal naming the file, never in the damaged state being used; a full disk skips the cache."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import circuitstat.circuits.loading as loading
from circuitstat.circuits import load_model
from circuitstat.core.errors import InputError
from circuitstat.circuits.loading import random_hf_model
from circuitstat.circuits.model import CircuitModel, ModelConfig

SRC = "random:gpt2?n_layer=2&n_head=2&n_embd=16&vocab_size=64&n_positions=16&seed={}"
IDS = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CIRCUITSTAT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CIRCUITSTAT_CONVERSION_CACHE", "1")
    return tmp_path / "cache"


def _hf(tmp_path: Path, seed: int) -> Path:
    d = tmp_path / f"hf{seed}"
    random_hf_model(SRC.format(seed)).save_pretrained(d)
    return d


def _entry_of(cache: Path, before: set) -> Path:
    (entry,) = set((cache / "converted").iterdir()) - before
    return entry


def _conversions(monkeypatch) -> list:
    calls = []
    real = loading.from_hf
    monkeypatch.setattr(loading, "from_hf", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _scale_tensors(path: Path) -> None:
    """Item 1's edit: every tensor x3 + 0.5, written back as a valid safetensors file."""
    state = load_file(str(path))
    save_file({k: v * 3 + 0.5 for k, v in state.items()}, str(path))


def _fresh_logits(hf_dir: Path) -> torch.Tensor:
    with torch.no_grad():
        return loading.from_hf(loading.load_hf(str(hf_dir)))(IDS)


# ---- item 1: an edited conversion entry is converted again --------------------------------------
def test_an_edited_conversion_entry_is_rebuilt_not_loaded(cache, tmp_path, monkeypatch):
    hf = _hf(tmp_path, 1)
    first = load_model(hf)
    entry = _entry_of(cache, set())
    _scale_tensors(entry / "model.safetensors")
    calls = _conversions(monkeypatch)
    again = load_model(hf)
    assert calls == [1]  # the edited entry was not used
    with torch.no_grad():
        assert torch.equal(again(IDS), _fresh_logits(hf)) and torch.equal(again(IDS), first(IDS))
    assert again.weight_hash() == first.weight_hash()
    calls.clear()
    load_model(hf)
    assert calls == []  # the rebuilt entry is sealed and used again
    # `circuitstat model` checks the logits of the model as commands load it (the cached conversion)
    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    _scale_tensors(entry / "model.safetensors")
    res = CliRunner().invoke(app, ["model", str(hf)])
    assert res.exit_code == 0 and "(ok," in res.output, res.output + res.stderr
    assert calls == [1]  # it read the cache, found the edit and converted again


# ---- item 2: links and swaps in the cache --------------------------------------------------------
@pytest.mark.parametrize("how", ["entry-symlink", "file-symlink", "copied-entry", "truncated", "unsealed",
                                 "fifo", "seal-edited"])
def test_a_swapped_linked_or_truncated_entry_is_rebuilt(cache, tmp_path, monkeypatch, how):
    a, b = _hf(tmp_path, 1), _hf(tmp_path, 2)
    load_model(a)
    entry_a = _entry_of(cache, set())
    load_model(b)
    entry_b = _entry_of(cache, {entry_a})
    if how == "entry-symlink":  # item 2: a's entry replaced by a link to b's
        shutil.rmtree(entry_a)
        entry_a.symlink_to(entry_b, target_is_directory=True)
    elif how == "file-symlink":
        (entry_a / "model.safetensors").unlink()
        (entry_a / "model.safetensors").symlink_to(entry_b / "model.safetensors")
    elif how == "copied-entry":  # b's files and seal copied under a's key
        shutil.rmtree(entry_a)
        shutil.copytree(entry_b, entry_a)
    elif how == "truncated":
        w = entry_a / "model.safetensors"
        w.write_bytes(w.read_bytes()[:-100])
    elif how == "unsealed":
        (entry_a / "SEAL.json").unlink()
    elif how == "fifo":
        (entry_a / "SEAL.json").unlink()
        os.mkfifo(entry_a / "SEAL.json")
    elif how == "seal-edited":
        doc = json.loads((entry_a / "SEAL.json").read_text())
        doc["payload"]["key"] = entry_b.name
        (entry_a / "SEAL.json").write_text(json.dumps(doc))
    b_bytes = (entry_b / "model.safetensors").read_bytes()
    calls = _conversions(monkeypatch)
    done = []
    t = threading.Thread(target=lambda: done.append(load_model(a)), daemon=True)
    t.start()
    t.join(60)
    assert done, "loading blocked on the planted file"
    assert calls == [1]
    with torch.no_grad():
        assert torch.equal(done[0](IDS), _fresh_logits(a)) and not torch.equal(done[0](IDS), _fresh_logits(b))
    assert (entry_b / "model.safetensors").read_bytes() == b_bytes  # a link's target is never touched
    assert not entry_a.is_symlink() and not (entry_a / "model.safetensors").is_symlink()


def test_a_linked_converted_folder_is_neither_read_nor_written(cache, tmp_path, monkeypatch):
    hf = _hf(tmp_path, 1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cache.mkdir()
    (cache / "converted").symlink_to(elsewhere, target_is_directory=True)
    calls = _conversions(monkeypatch)
    load_model(hf)
    load_model(hf)
    assert calls == [1, 1] and list(elsewhere.iterdir()) == []


# ---- item 3: the weight-hash memo ---------------------------------------------------------------
def _memo(cache: Path) -> Path:
    (memo,) = (cache / "weight-hashes").iterdir()
    return memo


@pytest.fixture
def own_dir(tmp_path, cache):
    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_head=8, d_mlp=32, vocab_size=50, n_ctx=16)
    return CircuitModel(cfg).init_weights(3).save(tmp_path / "m")


@pytest.mark.parametrize("how", ["forged-digest", "dev-zero", "swapped", "truncated", "fifo"])
def test_a_bad_memo_is_never_the_weight_hash(own_dir, tmp_path, cache, how):
    first = load_model(own_dir)
    truth = CircuitModel._hash_weights(sorted(first.state_dict().items()))
    assert first.weight_hash() == truth  # computed, and recorded in the memo
    memo = _memo(cache)
    if how == "forged-digest":  # item 3: a memo holding 64 x 'a'
        memo.write_text("a" * 64)
    elif how == "dev-zero":  # item 3: a memo linked to /dev/zero hung
        memo.unlink()
        memo.symlink_to("/dev/zero")
    elif how == "swapped":  # another model's (valid, sealed) memo under this one's name
        other_cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_head=8, d_mlp=32, vocab_size=50, n_ctx=16)
        other = CircuitModel(other_cfg).init_weights(4).save(tmp_path / "other")
        load_model(other).weight_hash()
        other_memo = next(p for p in (cache / "weight-hashes").iterdir() if p != memo)
        shutil.copy(other_memo, memo)
    elif how == "truncated":
        memo.write_bytes(memo.read_bytes()[:-5])
    elif how == "fifo":
        memo.unlink()
        os.mkfifo(memo)
    done = []
    t = threading.Thread(target=lambda: done.append(load_model(own_dir)), daemon=True)
    t.start()
    t.join(60)
    assert done, "loading blocked on the planted memo"
    m = done[0]
    assert m.weight_hash() == truth
    assert m.identity()["weight_hash_from"] == "computed from the weights in this run"
    if how in ("dev-zero", "fifo", "forged-digest", "truncated"):  # rewritten as a regular, sealed memo
        from circuitstat.core.integrity import read_sealed

        assert not memo.is_symlink() and read_sealed(memo)["weight_hash"] == truth


def test_provenance_says_when_the_hash_came_from_a_memo(own_dir, cache, monkeypatch):
    assert load_model(own_dir).identity()["weight_hash_from"] == "computed from the weights in this run"
    monkeypatch.setattr(CircuitModel, "_hash_weights", staticmethod(lambda s: pytest.fail("hashed again")))
    origin = load_model(own_dir).identity()["weight_hash_from"]
    assert origin.startswith("memo ") and "inode" in origin and "ctime" in origin


# ---- circuitstat model directories: the recorded weight hash --------------------------------------
def test_edited_weights_of_a_model_directory_are_refused_naming_the_file(own_dir, cache):
    load_model(own_dir)  # memo written for the original files
    _scale_tensors(own_dir / "model.safetensors")
    with pytest.raises(InputError, match=r"model\.safetensors: the weights do not match the weight hash"):
        load_model(own_dir)
    load_model(own_dir, dtype=torch.float64)  # a cast copy cannot be compared: loads (and hashes its own bytes)


# ---- the primitives -------------------------------------------------------------------------------
def test_seal_detects_any_change_and_open_regular_refuses_links_and_devices(tmp_path):
    from circuitstat.core.integrity import IntegrityError, open_regular, seal, unseal

    record = seal({"a": 1, "b": [1, 2]})
    assert unseal(record) == {"a": 1, "b": [1, 2]}
    assert unseal(record.replace(b'"a":1', b'"a":2')) is None and unseal(record[:-3]) is None
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "g").write_bytes(b"y")
    (tmp_path / "dlink").symlink_to(tmp_path / "d", target_is_directory=True)
    with open_regular(tmp_path / "f") as f:
        assert f.read() == b"x"
    for bad in (tmp_path / "link", Path("/dev/zero"), tmp_path / "d"):
        with pytest.raises(IntegrityError):
            with open_regular(bad):
                pass
    with pytest.raises(IntegrityError, match="symbolic link"):  # a linked directory below the root
        with open_regular(tmp_path / "dlink" / "g", root=tmp_path):
            pass


# ---- item 12: a full disk under the cache is skipped -----------------------------------------------
def test_a_cache_on_a_full_disk_is_skipped(tmp_path, cache):
    """A file-size limit makes every write past 64 KiB fail with an I/O error (EFBIG), as a full disk
    does with ENOSPC: safetensors raises its own SafetensorError (not an OSError), which the cache must
    skip like any other write failure: the model loads, and no entry is left."""
    import resource
    import signal

    d = tmp_path / "hf"
    random_hf_model("random:gpt2?n_layer=1&n_head=2&n_embd=64&vocab_size=2000&n_positions=16&seed=1"
                    ).save_pretrained(d)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, limits[1]))
        m = load_model(d)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    with torch.no_grad():
        assert torch.equal(m(IDS), _fresh_logits(d))
    converted = cache / "converted"
    assert converted.is_dir() and list(converted.iterdir()) == []  # the failed write left nothing behind
    load_model(d)  # with room again, the conversion is cached
    assert len(list(converted.iterdir())) == 1
