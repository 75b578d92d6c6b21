"""``attribute --plan`` on a directory holding only config.json (issue 36, item 2): planning reads no weights,
so a model is planned before its weights are downloaded. Edge counts are checked by the EAP-IG graph's formula;
the memory a plan of Llama-3.1-8B's real dimensions takes is the child process's own peak RSS (its VmHWM), far
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


def split_graph_edges(n_heads: int, mlp_senders: list[int]) -> int:
    """Edges when layer l has ``mlp_senders[l]`` MLP senders (experts as nodes: m{l}.e{j} and m{l}.shared) and still
    one MLP receiver: q, k, v read every earlier sender, the MLP input also its layer's heads, logits every sender."""
    total, upstream = 0, 1
    for n_mlp in mlp_senders:
        total += 3 * n_heads * upstream + upstream + n_heads
        upstream += n_heads + n_mlp
    return total + upstream  # logits


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
    """Before: "no weights (model.safetensors) found". The plan runs in a child that reports its own peak RSS
    (VmHWM): imports and a meta skeleton, never the 16 GB of bf16 weights."""
    d = config_dir(tmp_path, "llama-3.1-8b", LLAMA_31_8B)
    code, out, peak = plan_in_child(d)
    assert code == 0, out
    assert planned_edges(out) == graph_edges(32, 32)
    assert "no weights yet (config.json only)" in out and "counts from shapes only" in out
    assert 100 * 2**20 < peak < 1.5 * 2**30, peak  # torch alone is over 100 MiB; bf16 weights alone are 14.96 GiB


# the child reports its own peak: VmHWM of its address space after exec. os.wait4's ru_maxrss is not that: the kernel
# carries the high-water mark of the address space the child replaced at exec, and a child forked (vfork) from a
# pytest worker replaces the worker's, so ru_maxrss read the worker's peak (1.87 GB in a CI run, against 0.44 GB for
# the plan itself)
_REPORT_PEAK = ("import os, runpy\n"
                "try:\n"
                "    runpy.run_module('circuitstat', run_name='__main__', alter_sys=True)\n"
                "finally:\n"
                "    hwm = next(ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:')).split()[1]\n"
                "    open(os.environ['CIRCUITSTAT_TEST_PEAK'], 'w').write(hwm)\n")


def plan_in_child(d) -> tuple[int, str, int]:
    """(exit code, output, peak RSS in bytes) of ``attribute --plan`` on directory ``d`` in a fresh process, its
    peak resident memory its own VmHWM (/proc/self/status, KiB), written at exit to a file the parent reads."""
    peak_file = d / "peak.kib"
    cmd = [sys.executable, "-c", _REPORT_PEAK, "attribute", "--model", str(d), "--plan", "--allow-large",
           "--n", "16", "--dtype", "bfloat16"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CIRCUITSTAT_TEST_PEAK": str(peak_file)}
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    return p.returncode, p.stdout, int(peak_file.read_text()) * 1024


@pytest.mark.slow  # a fresh interpreter and a 47B-parameter skeleton: about 8 s of CPU
def test_plan_of_mixtral_8x7b_from_its_config_alone_allocates_no_weights(tmp_path):
    """The MoE block is one MLP node: Mixtral-8x7B has Llama-3.1-8B's graph (32 layers x 32 heads), planned from
    config.json alone; its 87 GiB of bf16 weights (every expert) are never allocated (the child's own peak RSS)."""
    d = config_dir(tmp_path, "mixtral-8x7b", MIXTRAL_8X7B)
    code, out, peak = plan_in_child(d)
    assert code == 0, out
    assert planned_edges(out) == graph_edges(32, 32)
    assert "no weights yet (config.json only)" in out and "counts from shapes only" in out
    assert 100 * 2**20 < peak < 1.5 * 2**30, peak


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


def test_plan_counts_the_expert_edges_by_formula_and_refuses_experts_on_a_dense_model(tmp_path):
    """``attribute --plan --moe-nodes experts`` from config.json alone: Mixtral-8x7B (32 layers of 32 heads, 8
    experts) and a Qwen2-MoE shape with a shared expert and dense layers; a dense model is refused (exit 2)."""
    run = CliRunner()
    mixtral = config_dir(tmp_path, "mixtral", MIXTRAL_8X7B)
    args = ["attribute", "--model", str(mixtral), "--plan", "--allow-large", "--n", "16", "--dtype", "bfloat16"]
    res = run.invoke(app, args + ["--moe-nodes", "experts"])
    assert res.exit_code == 0, res.output
    assert planned_edges(res.output) == split_graph_edges(32, [8] * 32) == 1_929_889  # block: graph_edges(32, 32)
    assert split_graph_edges(32, [1] * 32) == graph_edges(32, 32)  # one sender per MLP: the block graph's count
    qwen = config_dir(tmp_path, "qwen", {
        "model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48, "num_experts": 6, "num_experts_per_tok": 2, "mlp_only_layers": [1],
        "decoder_sparse_step": 1, "vocab_size": 1000, "max_position_embeddings": 256})
    res = run.invoke(app, ["attribute", "--model", str(qwen), "--plan", "--n", "8", "--moe-nodes", "experts"])
    assert res.exit_code == 0, res.output
    assert planned_edges(res.output) == split_graph_edges(4, [7, 1, 7, 7])  # 6 experts + shared; layer 1 dense
    dense = config_dir(tmp_path, "llama", LLAMA_31_8B)
    res = run.invoke(app, ["attribute", "--model", str(dense), "--plan", "--allow-large", "--moe-nodes", "experts"])
    assert res.exit_code == 2 and "no mixture-of-experts layer" in res.output and "'block'" in res.output
    out = tmp_path / "run"
    res = run.invoke(app, ["attribute", "--model", "random:llama", "--out", str(out), "--moe-nodes", "experts"])
    assert res.exit_code == 2 and "no mixture-of-experts layer" in res.output and not out.exists()


# ---- issue 43, item 2: a plan prices what does not fit, marks it and exits 0 -------------------------------------
GEMMA_2_2B = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 2304,
              "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
              "intermediate_size": 9216, "vocab_size": 256000, "max_position_embeddings": 8192,
              "query_pre_attn_scalar": 256, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
              "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "torch_dtype": "bfloat16"}
PUBLISHED_COUNTS = {"llama-3.1-8b": 8_030_261_248, "mixtral-8x7b": 46_702_792_704, "gemma-2-2b": 2_614_341_888}
CONFIGS = {"llama-3.1-8b": LLAMA_31_8B, "mixtral-8x7b": MIXTRAL_8X7B, "gemma-2-2b": GEMMA_2_2B}


def plan_rows(output: str) -> dict[str, list[str]]:
    """{method: its row's words} of a printed plan."""
    from circuitstat.circuits.plan import METHODS

    return {w[0]: w for w in (line.split() for line in output.splitlines()) if w[:1] and w[0] in METHODS}


def row_bytes(words: list[str]) -> float:
    """The memory column of a plan row (words 6 and 7: value and unit), in bytes."""
    from circuitstat.circuits.limits import parse_bytes

    return parse_bytes(words[6] + words[7])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_plan_without_allow_large_prints_the_full_table_and_marks_what_does_not_fit(tmp_path, name):
    """Before: ``attribute --plan --dtype bf16`` on Llama-3.1-8B's config exited 2 ("needs about 69.8 GiB ... pass
    --allow-large"). Now exit 0, every method priced, each row marked against the memory limit (16 GiB) and the work limit
    by its own numbers; the parameter count is the checkpoint's, its bf16 weights 2 bytes each."""
    from circuitstat.circuits.limits import MAX_WORK, format_bytes
    from circuitstat.circuits.methods import method as method_record
    from circuitstat.circuits.plan import METHODS
    from circuitstat.pipelines.plan_fit import run_limits

    limit = run_limits(None, allow_large=False).memory  # 16 GiB, or this machine's memory where that is less

    d = config_dir(tmp_path, name, CONFIGS[name])
    res = CliRunner().invoke(app, ["attribute", "--model", str(d), "--plan", "--n", "16", "--dtype", "bf16"])
    assert res.exit_code == 0, res.output
    rows = plan_rows(res.output)
    # every method, but one defined on additive writes only on Gemma 2 (post-norm: attribute refuses it)
    post_norm = name.startswith("gemma")
    assert sorted(rows) == sorted(m for m in METHODS if not (post_norm and method_record(m).additive_only))
    assert len(rows) < len(METHODS) if post_norm else len(rows) == len(METHODS)
    assert not post_norm or any(method_record(m).additive_only for m in METHODS)  # the rule is exercised
    marks = set()
    for method, w in rows.items():
        over = [k for k, bad in (("mem", row_bytes(w) > limit), ("work", float(w[5]) > MAX_WORK)) if bad]
        assert w[9] == ("no:" + "+".join(over) if over else "yes"), w
        marks.add(w[9])
    assert any(m.startswith("no:") for m in marks)  # each of these models has rows that do not fit 16 GiB
    n = PUBLISHED_COUNTS[name]
    assert f"model: {n:,} parameters; weights" in res.output
    assert f"{format_bytes(2 * n)} in bfloat16 as stored" in res.output
    assert f"fits: within memory {format_bytes(limit)} per worker" in res.output


def test_memory_follows_the_dtype_and_allow_large_lifts_the_marks_not_the_table(tmp_path):
    """float32 against bfloat16: the weights and every row's memory grow (each peak holds a copy of the weights);
    with --allow-large the memory limit becomes the machine's own memory and the work limit is lifted."""
    from circuitstat.pipelines.plan_fit import device_memory

    d = config_dir(tmp_path, "llama", LLAMA_31_8B)
    run = CliRunner()
    base = ["attribute", "--model", str(d), "--plan", "--n", "16"]
    bf16, fp32 = (run.invoke(app, base + ["--dtype", t]) for t in ("bf16", "float32"))
    assert bf16.exit_code == fp32.exit_code == 0
    assert "29.9 GiB in float32 as stored" in fp32.output and "15.0 GiB in bfloat16 as stored" in bf16.output
    a, b = plan_rows(bf16.output), plan_rows(fp32.output)
    for method in a:  # the weights' part doubles: 16.5 GiB more for the ungrouped 8B weights in float32
        assert row_bytes(b[method]) - row_bytes(a[method]) >= 16 * 2**30, method
    lifted = run.invoke(app, base + ["--dtype", "bf16", "--allow-large"])
    assert lifted.exit_code == 0
    limit = device_memory("cpu")
    for w in plan_rows(lifted.output).values():
        assert w[9] == ("no:mem" if row_bytes(w) > limit else "yes"), w  # no work mark: lifted
    assert "lifted by --allow-large" in lifted.output


def test_running_still_needs_allow_large(tmp_path):
    """Negative control: --allow-large is for running. The same 8B shape as a random: model, run without it, is
    refused before anything is allocated (exit 2, no run directory)."""
    src = ("random:llama?hidden_size=4096&intermediate_size=14336&num_hidden_layers=32&num_attention_heads=32"
           "&num_key_value_heads=8&vocab_size=128256&max_position_embeddings=131072")
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["attribute", "--model", src, "--out", str(out), "--n", "4"])
    assert res.exit_code == 2 and "--allow-large" in res.output and not out.exists()
    plan = CliRunner().invoke(app, ["attribute", "--model", src, "--plan", "--n", "4", "--dtype", "bf16"])
    assert plan.exit_code == 0, plan.output
    assert "model: 8,030,261,248 parameters" in plan.output
