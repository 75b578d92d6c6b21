"""The first hour's frictions of issue 43 item 3 that live in the command line: warnings, progress bars, wording.
Each test fails on the code before its fix, and where a check could pass vacuously a negative control shows it bites."""

from __future__ import annotations

import sys
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


@pytest.mark.parametrize("args", [["--help"], ["check", "--help"]])
def test_a_closed_pipe_ends_quietly_with_141(args):
    """Before: `circuitstat --help | head` ended with 'error: Broken pipe; check the path, its permissions and the
    free space'. The reader is gone before the first write here (its end closed), so every write fails."""
    import os
    import subprocess

    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "circuitstat.pipelines.cli", *args], stdout=w,
                           stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(w)
    assert p.stderr.decode() == "" and p.returncode == 141, p.stderr.decode()


def test_verify_errors_name_the_flag_on_the_command_line_and_the_key_in_a_spec():
    """Before: `attribute --verify 60` said 'verify.n=60', the spec's key, not the flag the user typed."""
    r = invoke("attribute", "--model", "random:gpt2?n_layer=1&n_head=2&n_embd=16", "--n", "50", "--verify", "60",
               "--method", "eap", "--out", "never-written")
    assert r.exit_code == 2, r.output
    assert "--verify 60 leaves fewer than 2 of the task's 50 prompts unverified; use --verify <= 48" in r.output
    assert "verify.n" not in r.output
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.spec import VerifySpec, check_verify

    with pytest.raises(InputError, match=r"verify\.n=60 leaves .* \(task\.n\)"):  # a spec's words stay its keys
        check_verify(VerifySpec(n=60), methods=["eap"], n_prompts=50, level="edge")


def test_an_unknown_claim_kind_or_key_gets_a_did_you_mean():
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.claims import parse_claims

    with pytest.raises(InputError, match=r"unknown kind 'edge_efect'; did you mean 'edge_effect'\? kinds: "):
        parse_claims({"claims": [{"kind": "edge_efect"}]}, "c.yaml")
    with pytest.raises(InputError, match=r"edgee: unknown key; did you mean 'edge'\?"):
        parse_claims({"claims": [{"kind": "edge_effect", "edgee": "x"}]}, "c.yaml")
    with pytest.raises(InputError) as e:  # nothing near: no guess
        parse_claims({"claims": [{"kind": "zzz"}]}, "c.yaml")
    assert "did you mean" not in str(e.value)


def test_check_circuit_names_a_relative_file_as_given(tmp_path, monkeypatch):
    """Before: the error printed the file's absolute path for a relative argument."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.txt").write_text("input->nope\n")
    r = invoke("check-circuit", "c.txt", "--model", "random:gpt2?n_layer=1&n_head=2&n_embd=16", "--task",
               "induction", "--n", "8", "--out", "run")
    assert r.exit_code == 2, r.output
    assert "c.txt" in r.output and str(tmp_path) not in r.output
    from pathlib import Path

    from circuitstat.pipelines.cli.published import as_given

    gone = as_given(f"circuit file {tmp_path / 'd.txt'} not found; check circuit.file (relative to the spec)",
                    Path("d.txt"))
    assert gone == "circuit file d.txt not found; check the CIRCUIT argument"


def test_counted_nouns_are_singular_for_one():
    from circuitstat.core.words import counted

    assert counted(1, "edge") == "1 edge" and counted(2, "edge") == "2 edges" and counted(0, "edge") == "0 edges"
    assert counted(1234, "edge", thousands=True) == "1,234 edges" and counted(1, "index", "indices") == "1 index"
    from circuitstat.pipelines.circuit_choice import empty_explanation
    import numpy as np

    text = empty_explanation(np.array([3.0, -1.0, 0.5]), np.array([True, False, False]), 1, "absolute", True)
    assert "1 edges" not in text
