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
