"""The attribute kind's spec (what the service's attribute jobs and recorded runs are read with) takes every
request option the `attribute` command takes: a job could not ask for --input-node or --task-option before."""

from __future__ import annotations

import inspect
import subprocess
import sys

import numpy as np
import pytest

from circuitstat.circuits.scores import ScoreMatrix
from circuitstat.core.errors import InputError
from circuitstat.pipelines.runs.attribute.run import AttributeSpec
from circuitstat.pipelines.cli.analyse import attribute_command
from circuitstat.pipelines.kinds import kind

MODEL = "random:gpt2?n_layer=1&n_head=2&n_embd=16&n_positions=64&vocab_size=97"
# the command's options that belong to the machine running it (the server's, not the request's)
MACHINE = {"n_jobs", "scheduler", "device", "out", "force", "resume", "plan", "ranking", "allow_pickle",
           "allow_large", "verify_share"}
# options the spec groups under one key (as the audit spec does)
GROUPED = {"verify": "verify", "verify_edges": "verify", "verify_tau": "verify", "verify_seed": "verify",
           "verify_design": "verify", "verify_budget": "verify", "verify_correction": "verify",
           "steps": "edge_pruning", "lr": "edge_pruning", "sparsity": "edge_pruning", "objective": "edge_pruning",
           "n_samples": "ugs", "mask_ablation": "edge_pruning", "lr_constants": "edge_pruning", "target": "edge_pruning",
           "warmup": "edge_pruning", "node_masks": "edge_pruning", "node_sparsity": "edge_pruning",
           "node_target": "edge_pruning",
           "task_option": "task_options"}


def test_every_request_option_of_the_command_is_a_spec_key():
    fields = set(AttributeSpec.model_fields)
    for name in inspect.signature(attribute_command).parameters:
        if name not in MACHINE:
            assert GROUPED.get(name, name) in fields, f"attribute's --{name.replace('_', '-')} has no spec key"


def _cli(out, *extra) -> np.ndarray:
    cmd = [sys.executable, "-m", "circuitstat.pipelines.cli", "attribute", "--model", MODEL, "--task", "induction",
           "--n", "4", "--method", "eap", "--ablation", "zero", "--out", str(out), *extra]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return ScoreMatrix.read(out).scores


def test_a_spec_with_input_node_and_task_options_runs_as_the_command_does(tmp_path):
    k = kind("attribute")
    spec = k.parse({"model": MODEL, "task": "induction", "n": 4, "method": "eap", "ablation": "zero",
                    "input_node": "tokens", "task_options": {"seq_len": 6}}, "job")
    k.run(spec, tmp_path / "job")
    job = ScoreMatrix.read(tmp_path / "job").scores
    cli = _cli(tmp_path / "cli", "--input-node", "tokens", "--task-option", "seq_len=6")
    default = _cli(tmp_path / "default")
    assert np.array_equal(job, cli)
    assert not np.allclose(job, default)  # the options did reach the run


def test_task_options_are_checked_like_the_commands():
    k = kind("attribute")
    with pytest.raises(InputError, match="cannot be an option"):
        k.parse({"model": MODEL, "task_options": {"n": 3}}, "job")
    spec = k.parse({"model": MODEL, "n": 4, "task_options": {"no_such_option": 3}}, "job")
    with pytest.raises(InputError, match="no_such_option"):
        k.run(spec, "unused-out")
