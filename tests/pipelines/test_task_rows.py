"""An ``n`` larger than the task file is refused, naming both numbers, before anything is written
(issue 38: `attribute --task F --n 64` on 16 rows crashed with IndexError and left a half-written run; an
audit spec silently used 16 rows while recording 64)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app

ROOT = Path(__file__).resolve().parents[2]
GPT2_VOCAB = "random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=50257&n_positions=64&seed=0"
runner = CliRunner()


def _task_file(path: Path, rows: int) -> Path:
    names = [" Mary", " John", " Tom", " James", " Anna", " Paul", " Kate", " Mark"]
    lines = []
    for i in range(rows):
        a, b, c, d = (names[(i + j) % 8] for j in range(4))
        lines.append({"clean": f"When{a} and{b} went to the store,{b} gave a drink to",
                      "corrupted": f"When{c} and{d} went to the store,{d} gave a drink to",
                      "answer": a, "wrong_answer": b})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def test_attribute_with_n_over_the_rows_is_exit_2_and_writes_nothing(tmp_path):
    task = _task_file(tmp_path / "ioi6.jsonl", 6)
    out = tmp_path / "runs" / "attr"
    res = runner.invoke(app, ["attribute", "--model", GPT2_VOCAB, "--task", str(task), "--n", "64",
                              "--method", "eap", "--out", str(out)])
    assert res.exit_code == 2, res.output + res.stderr
    assert "has 6 rows but n=64" in res.stderr and "at most 6" in res.stderr
    assert not (tmp_path / "runs").exists()
    ok = runner.invoke(app, ["attribute", "--model", GPT2_VOCAB, "--task", str(task), "--n", "6",
                             "--method", "eap", "--out", str(out)])
    assert ok.exit_code == 0, ok.output + ok.stderr


def test_an_audit_spec_with_n_over_the_rows_is_exit_2_and_writes_nothing(tmp_path):
    _task_file(tmp_path / "ioi6.jsonl", 6)
    spec = tmp_path / "audit.yaml"
    spec.write_text(yaml.safe_dump({"model": GPT2_VOCAB, "task": {"name": "ioi6.jsonl", "n": 64}, "methods": ["eap"],
                                    "k": [2], "faithfulness": False, "bootstrap": {"n_resamples": 20}}))
    out = tmp_path / "runs" / "audit"
    res = runner.invoke(app, ["audit", str(spec), "--out", str(out)])
    assert res.exit_code == 2, res.output + res.stderr
    assert "has 6 rows but n=64" in res.stderr
    assert not (tmp_path / "runs").exists()


def test_the_readme_spec_example_asks_for_no_more_rows_than_its_file_holds():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```jsonl\n(.*?)```", text, flags=re.S).group(1)
    rows = len(block.strip().splitlines())
    asked = [int(n) for n in re.findall(r"my-task\.jsonl,\s*n:\s*(\d+)", text)]
    asked += [int(n) for n in re.findall(r"--task my-task\.jsonl --n (\d+)", text)]
    assert asked and all(n <= rows for n in asked), (rows, asked)
