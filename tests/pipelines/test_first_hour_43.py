"""The first hour's frictions of issue 43 item 3 that live in the command line: warnings, progress bars, wording.
Each test fails on the code before its fix, and where a check could pass vacuously a negative control shows it bites."""

from __future__ import annotations

import warnings

import pytest
from typer.testing import CliRunner

from circuitstat.pipelines.cli import app


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _warn_from_two_places(msg: str) -> None:
    warnings.warn(msg, RuntimeWarning, stacklevel=1)
    warnings.warn(msg, RuntimeWarning, stacklevel=1)  # another line: Python's default shows it again


def test_a_warning_prints_once_as_one_line_without_source(capsys):
    """Before: 'faithfulness.py:419: RuntimeWarning: faithfulness is undefined ...' then the code line, twice."""
    from circuitstat.pipelines import cli

    msg = "faithfulness is undefined for 1 of 32 examples"
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        python_format = warnings.formatwarning(msg, RuntimeWarning, __file__, 1)  # negative control: Python's own
        assert __file__ in python_format and "RuntimeWarning" in python_format
        cli._old_names_as_one_line()  # what main() installs
        _warn_from_two_places(msg)
        warnings.warn("something else", UserWarning)
        warnings.warn("deprecated thing", FutureWarning)
    err = capsys.readouterr().err.splitlines()
    assert err == [f"warning: {msg}", "warning: something else", "warning (FutureWarning): deprecated thing"]


def test_loading_a_model_directory_prints_no_progress_bar(tmp_path, capfd):
    """Before: transformers' 'Loading weights' bar went to stderr for each model directory loaded."""
    import transformers
    from transformers.utils import logging as hf_logging

    from circuitstat.circuits import load_model

    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32, bos_token_id=0,
                                  eos_token_id=0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "m")
    capfd.readouterr()
    assert hf_logging.is_progress_bar_enabled()
    transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"))  # negative control: the bar exists
    assert "Loading weights" in capfd.readouterr().err
    load_model(str(tmp_path / "m"))
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # the user's setting is restored


TINY_MOE = ("random:qwen2_moe?hidden_size=16&num_hidden_layers=2&num_attention_heads=2&num_key_value_heads=1"
            "&intermediate_size=16&moe_intermediate_size=8&shared_expert_intermediate_size=8&num_experts=3"
            "&num_experts_per_tok=2&vocab_size=64&seed=1")


def test_model_shows_the_expert_graphs_size_before_attribute():
    """Before: `circuitstat model` had no --moe-nodes, so the expert graph's size was unseen until attribute."""
    import re

    from circuitstat.circuits import load_model
    from circuitstat.circuits.moe_nodes import set_moe_nodes

    block = load_model(TINY_MOE).graph
    experts = set_moe_nodes(load_model(TINY_MOE), "experts").graph
    assert experts.n_edges != block.n_edges
    counts = {}
    for choice in ("block", "experts"):
        r = invoke("model", TINY_MOE, "--moe-nodes", choice)
        assert r.exit_code == 0, r.output
        counts[choice] = int(re.search(r"^edges\s+(\d+)", r.output, flags=re.M).group(1))
        assert "exact check" in r.output and "FAILED" not in r.output  # the checks ran on that graph
    assert counts == {"block": block.n_edges, "experts": experts.n_edges}
    r = invoke("model", TINY_MOE, "--moe-nodes", "experts")
    assert "own sender m{L}.e{J}" in r.output and "is one MLP node" not in r.output
    r = invoke("model", "random:gpt2?n_layer=1&n_head=2&n_embd=16", "--moe-nodes", "experts")
    assert r.exit_code == 2 and "no mixture-of-experts layer" in r.output
