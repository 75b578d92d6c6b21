"""``attribute --plan`` on a directory holding only config.json (issue 36, item 2): planning reads no weights,
so a model is planned before its weights are downloaded. Edge counts are checked by the EAP-IG graph's formula;
the memory a plan of Llama-3.1-8B's real dimensions takes is the child process's own peak RSS (os.wait4), far
below the 16 GB of its weights. Families the converter does not have are refused by name (exit 2)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from circuitstat.circuits.convert import SUPPORTED
from circuitstat.pipelines.cli import app

# published config.json dimensions (meta-llama/Llama-3.1-8B, mistralai/Mixtral-8x7B-v0.1)
LLAMA_31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
               "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
               "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
               "torch_dtype": "bfloat16"}
MIXTRAL_8X7B = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
                "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
                "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def graph_edges(n_layers: int, n_heads: int) -> int:
    """Edges of the EAP-IG graph: senders input, heads a{l}.h{h}, MLPs m{l}; receivers each head's q, k, v
    (fed by senders of earlier layers), each MLP (also by its own layer's heads) and logits (by every sender)."""
    total = 1 + n_layers * (n_heads + 1)  # logits
    for layer in range(n_layers):
        upstream = 1 + layer * (n_heads + 1)
        total += 3 * n_heads * upstream + upstream + n_heads
    return total


def config_dir(tmp_path, name: str, config: dict):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def planned_edges(output: str) -> int:
    m = re.search(r"^plan: .*?, ([\d,]+) edges,", output, re.M)
    assert m, output
    return int(m.group(1).replace(",", ""))


def test_the_formula_gives_the_issues_llama_count_and_a_tiny_graphs():
    assert graph_edges(32, 32) == 1_592_881  # Llama-3.1-8B, as issue 36 counts it
    assert graph_edges(2, 4) == 110  # enumerated by hand: 17 + 82 + 11


@pytest.mark.slow  # a fresh interpreter (torch, transformers) and an 8B skeleton: about 8 s of CPU
def test_plan_of_llama_31_8b_from_its_config_alone_allocates_no_weights(tmp_path):
    """Before: "no weights (model.safetensors) found". The plan runs in a child whose peak RSS its parent reads
    from the kernel's accounting (os.wait4): imports and a meta skeleton, never the 16 GB of bf16 weights."""
    d = config_dir(tmp_path, "llama-3.1-8b", LLAMA_31_8B)
    code, out, peak = plan_in_child(d)
    assert code == 0, out
    assert planned_edges(out) == graph_edges(32, 32)
    assert "no weights yet (config.json only)" in out and "counts from shapes only" in out
    assert peak < 1.5 * 2**30, peak  # bf16 weights alone are 14.96 GiB


def plan_in_child(d) -> tuple[int, str, int]:
    """(exit code, output, peak RSS in bytes) of ``attribute --plan`` on directory ``d`` in a fresh process, its
    peak resident memory read by the parent from the kernel's accounting (os.wait4)."""
    cmd = [sys.executable, "-m", "circuitstat", "attribute", "--model", str(d), "--plan", "--allow-large",
           "--n", "16", "--dtype", "bfloat16"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True) as p:
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, out, usage.ru_maxrss * 1024  # KiB on Linux


@pytest.mark.slow  # a fresh interpreter and a 47B-parameter skeleton: about 8 s of CPU
def test_plan_of_mixtral_8x7b_from_its_config_alone_allocates_no_weights(tmp_path):
    """The MoE block is one MLP node: Mixtral-8x7B has Llama-3.1-8B's graph (32 layers x 32 heads), planned from
    config.json alone; its 87 GiB of bf16 weights (every expert) are never allocated (peak RSS via os.wait4)."""
    d = config_dir(tmp_path, "mixtral-8x7b", MIXTRAL_8X7B)
    code, out, peak = plan_in_child(d)
    assert code == 0, out
    assert planned_edges(out) == graph_edges(32, 32)
    assert "no weights yet (config.json only)" in out and "counts from shapes only" in out
    assert peak < 1.5 * 2**30, peak


def test_plan_of_a_small_config_only_directory_is_priced_by_flops(tmp_path):
    """A config small enough to be timed has no weights to time: the plan says so instead of loading them."""
    cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 256}
    d = config_dir(tmp_path, "tiny", cfg)
    res = CliRunner().invoke(app, ["attribute", "--model", str(d), "--plan", "--n", "8"])
    assert res.exit_code == 0, res.output
    assert planned_edges(res.output) == graph_edges(2, 4)
    assert "no weights yet (config.json only)" in res.output
    assert sorted(p.name for p in d.iterdir()) == ["config.json"]  # nothing written beside it
    run = CliRunner().invoke(app, ["attribute", "--model", str(d), "--out", str(tmp_path / "run")])
    assert run.exit_code == 2 and "no weights" in run.output  # running it still needs the weights


def test_plan_of_mixtral_from_its_config_plans_it_with_the_moe_block_as_one_node(tmp_path):
    """Mixtral-8x7B: planned with the MoE block as one MLP node (before the family was converted: refused with
    exit 2 naming it); its weights, every expert held, are priced in the plan's memory."""
    assert "mixtral" in SUPPORTED
    d = config_dir(tmp_path, "mixtral-8x7b", MIXTRAL_8X7B)
    res = CliRunner().invoke(app, ["attribute", "--model", str(d), "--plan", "--allow-large", "--n", "16",
                                   "--dtype", "bfloat16"])
    assert res.exit_code == 0, res.output
    assert planned_edges(res.output) == graph_edges(32, 32)
    rows = [line.split() for line in res.output.splitlines() if line.startswith(("exact ", "eap "))]
    assert len(rows) == 2
    for r in rows:  # every expert held: 46.7 B parameters + K/V ungrouped are 88.5 GiB in bf16
        assert r[7] == "GiB" and float(r[6]) > 88.5, r


def test_gemma3_is_refused_pointing_to_gemma3_text(tmp_path):
    """gemma3 is the vision-language wrapper; the refusal names the text family it holds (exit 2)."""
    cfg = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
           "text_config": {"model_type": "gemma3_text", "hidden_size": 256}}
    d = config_dir(tmp_path, "gemma-3", cfg)
    for source in (str(d), "random:gemma3"):
        res = CliRunner().invoke(app, ["attribute", "--model", source, "--plan"])
        assert res.exit_code == 2, res.output
        assert "'gemma3'" in res.output and "use a gemma3_text checkpoint" in res.output
