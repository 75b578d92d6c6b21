"""A user's task file is checked before any model is built, every bad row and column named at once, and a
missing tokenizer gets the fix that applies to the kind of model (issue 38, "the first hour")."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

SMALL_VOCAB = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=512&n_positions=64&seed=1"
GPT2_VOCAB = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=50257&n_positions=64&seed=1"
ROWS = [
    {"clean": "When Mary and John went to the store, John gave a drink to",
     "corrupted": "When Mary and John went to the store, Alice gave a drink to",
     "answer": " Mary", "wrong_answer": " John", "group": "store"},
    {"clean": "After Sarah and James met at the park, James handed a book to",
     "corrupted": "After Sarah and James met at the park, Alice handed a book to",
     "answer": " Sarah", "wrong_answer": " James", "group": "park"},
] * 3


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


@pytest.fixture
def no_model_built(monkeypatch):
    """Counts the random: models built (HF weights made); the checks below must need none."""
    import circuitstat.circuits.loading as loading

    built = []
    real = loading.random_hf_model
    monkeypatch.setattr(loading, "random_hf_model", lambda *a, **k: built.append(a) or real(*a, **k))
    return built


def invoke(*args):
    from circuitstat.pipelines.cli import app

    return CliRunner().invoke(app, list(args))


def test_text_task_on_a_small_vocabulary_is_refused_before_the_model_with_the_fix(tmp_path, no_model_built):
    """Before: the model was built first (76 s on a loaded machine), then 'needs a tokenizer ... a model directory'."""
    task = _write(tmp_path / "t.jsonl", ROWS)
    r = invoke("attribute", "--model", SMALL_VOCAB, "--task", str(task), "--n", "6", "--out", str(tmp_path / "out"))
    assert r.exit_code == 2, r.output
    assert "vocab_size=50257" in r.output and "GPT-2 tokenizer" in r.output
    assert no_model_built == [] and not (tmp_path / "out").exists()


def test_audit_refuses_a_bad_task_file_before_the_model(tmp_path, no_model_built):
    rows = [dict(r) for r in ROWS]
    rows[1]["answer"] = " Sarah Connor"
    rows[4]["wrong_answer"] = "Johnathanson"
    rows[3]["corrupted"] += " again"
    _write(tmp_path / "t.jsonl", rows)
    (tmp_path / "spec.yaml").write_text(
        f"models: ['{GPT2_VOCAB}']\ntask: {{name: t.jsonl, n: 6}}\nmethods: [eap]\nk: [2]\n"
        "bootstrap: {n_resamples: 50}\n")
    r = invoke("audit", str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "run"))
    assert r.exit_code == 2, r.output
    msg = " ".join(r.output.split())
    # every bad row and column in one message, not the first one only
    assert "3 problems" in msg and "answer values are not single tokens" in msg and "(rows 2 (counting from 1);" in msg
    assert "wrong_answer values are not single tokens" in msg and "(rows 5 (counting from 1);" in msg
    assert "different token lengths (rows 4 (counting from 1); row 4:" in msg
    assert no_model_built == [] and not (tmp_path / "run").exists()


def test_empty_values_are_named_per_column_even_without_a_tokenizer(tmp_path, no_model_built):
    rows = [dict(r) for r in ROWS]
    rows[2]["wrong_answer"] = None
    rows[5]["clean"] = ""
    rows[0]["group"] = None
    task = _write(tmp_path / "t.jsonl", rows)
    r = invoke("attribute", "--model", SMALL_VOCAB, "--task", str(task), "--n", "6", "--out", str(tmp_path / "out"))
    assert r.exit_code == 2, r.output
    msg = " ".join(r.output.split())
    assert "rows 3 (counting from 1) have empty values in column 'wrong_answer'" in msg
    assert "rows 6 (counting from 1) have an empty prompt in column 'clean'" in msg
    assert "rows 1 (counting from 1) have empty values in column 'group'" in msg
    assert no_model_built == []


def test_a_model_in_memory_is_told_to_pass_tokenizer(tmp_path):
    """Before: the message suggested 'a model directory with a tokenizer' for load_model(hf_model)."""
    from circuitstat.circuits import load_hf, load_model
    from circuitstat.pipelines.build import build_task
    from circuitstat.core.errors import InputError

    model = load_model(load_hf(SMALL_VOCAB))
    with pytest.raises(InputError) as e:
        build_task(model, str(_write(tmp_path / "t.jsonl", ROWS)), n=6)
    msg = str(e.value)
    assert "tokenizer=" in msg and "model directory" not in msg


def test_the_precheck_sees_the_tokenizer_load_model_attaches():
    """The one rule for a random: spec's tokenizer: vocab_size 50257 (or the family default) attaches GPT-2's."""
    from circuitstat.circuits import load_model
    from circuitstat.circuits.loading import source_tokenizer

    for source in (SMALL_VOCAB, GPT2_VOCAB, "random:gpt2?n_layer=1&n_head=2&n_embd=16&n_positions=32",
                   "random:gpt_neox?num_hidden_layers=1&hidden_size=32&num_attention_heads=2&intermediate_size=64"):
        tok, model = source_tokenizer(source), load_model(source)
        assert (tok is None) == (model.tokenizer is None), source
        if tok is not None:
            assert tok.content_hash == model.tokenizer.content_hash


def test_help_and_usage_say_how_to_get_a_tokenizer_on_a_random_model():
    from pathlib import Path

    r = invoke("attribute", "--help")
    assert "vocab_size=50257" in " ".join(r.output.split())
    usage = (Path(__file__).resolve().parents[2] / "docs" / "usage.md").read_text()
    assert "vocab_size=50257" in usage and "GPT-2 tokenizer" in usage
