"""The command line: exit codes, one-line errors, files written."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

TINY = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=1"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from circuitstat.pipelines.cli import main; main()", *args],
                          capture_output=True, text=True)


def test_model_command_checks_logits_against_hf():
    p = cli("model", "random:llama?hidden_size=32&num_hidden_layers=2&num_attention_heads=4"
                     "&num_key_value_heads=2&intermediate_size=64&vocab_size=97")
    assert p.returncode == 0, p.stderr
    assert "edges         110" in p.stdout and "(ok, tolerance" in p.stdout


@pytest.mark.parametrize("source, words", [
    ("random:t5?d_model=8", "gpt2, gpt_neox, llama, qwen2"), ("random:gpt2?n_layer", "key=value"), ("/does/not/exist", "not found"),
    ("zoo:nope/seed-0", "recipes: attn-only-2l, mlp-2l")])
def test_bad_model_sources_exit_2_with_one_line(source, words):
    p = cli("model", source)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1 and words in p.stderr


def test_attribute_then_circuit(tmp_path):
    out = tmp_path / "run"
    p = cli("attribute", "--model", TINY, "--method", "eap", "--n", "6", "--batch-size", "3", "--out", str(out))
    assert p.returncode == 0, p.stderr
    scores = pq.read_table(out / "scores.parquet")
    assert scores.num_rows == 6 and scores.schema.field("scores").type.list_size == 46
    assert json.loads((out / "manifest.json").read_text())["stages"]["scores"]["status"] == "done"
    p = cli("circuit", str(out), "--k", "5", "--ranking", "absolute", "--no-prune", "--json", str(tmp_path / "c.json"))
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "c.json").read_text())
    assert sum(e["in_graph"] for e in doc["edges"].values()) == 5
    # the old flag still works, and says what replaced it
    p = cli("circuit", str(out), "--k", "5", "--absolute", "--no-prune", "--json", str(tmp_path / "old.json"))
    assert p.returncode == 0 and "'--ranking absolute'" in p.stderr, p.stderr
    assert json.loads((tmp_path / "old.json").read_text())["edges"] == doc["edges"]
    p = cli("circuit", str(out), "--k", "5", "--absolute", "--ranking", "signed")
    assert p.returncode == 2 and "contradicts" in p.stderr
    # a different spec on the same directory is refused, not mixed in
    p = cli("attribute", "--model", TINY, "--method", "eap", "--n", "7", "--out", str(out))
    assert p.returncode == 2 and "different spec" in p.stderr and "Traceback" not in p.stderr


def test_malformed_spec_exits_2_and_creates_nothing(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("model: random:gpt2\nmethods: [exact, telepathy]\nbogus_key: 1\n")
    out = tmp_path / "run"
    p = cli("audit", str(spec), "--out", str(out))
    assert p.returncode == 2 and "methods.1" in p.stderr and "bogus_key" in p.stderr
    assert not out.exists()


def test_the_cli_starts_without_torch_scipy_or_transformers():
    """--help, check, query and report must start fast: importing the CLI loads none of the heavy libraries
    (bench/startup.py measures the time; a test never bounds wall-clock)."""
    code = ("import sys, circuitstat.pipelines.cli; from circuitstat.pipelines.cli import checks; "
            "print(sorted(m for m in ('torch', 'scipy', 'transformers', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out
