"""Plans for MIB's larger models from their shapes alone: Gemma-2-2B and Llama-3.1-8B configs (public
hyperparameters) converted on the meta device, no weight allocated; memory estimates that count what the
family features add, and --max-memory fitted within the budget for every method."""

from __future__ import annotations

import pytest
import torch
import transformers
from families import FAMILIES, hf_model

from circuitstat.circuits.convert import from_hf
from circuitstat.core.errors import InputError
from circuitstat.circuits.methods import method as method_record, methods_for
from circuitstat.circuits.plan import METHODS, fit_memory, method_cost, weight_bytes

SHAPES = {
    # google/gemma-2-2b config.json
    "gemma-2-2b": lambda: transformers.Gemma2Config(
        hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
        head_dim=256, vocab_size=256000, max_position_embeddings=8192, query_pre_attn_scalar=256, sliding_window=4096,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
    # meta-llama/Llama-3.1-8B config.json
    "llama-3.1-8b": lambda: transformers.LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}


def meta_model(shape: str, dtype=torch.bfloat16):
    """The CircuitModel of ``shape`` converted from a HF skeleton on the meta device (nothing allocated)."""
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(SHAPES[shape]())
    return from_hf(hf, dtype=dtype, device="meta")


@pytest.fixture(scope="module", params=list(SHAPES))
def shape(request):
    return request.param, meta_model(request.param)


def test_shapes_convert_on_meta_without_allocating(shape):
    name, m = shape
    assert all(t.device.type == "meta" for t in [*m.parameters(), *m.buffers()])
    cfg = m.cfg
    if name == "gemma-2-2b":
        assert cfg.tied_embeddings and cfg.post_norm and cfg.attn_softcap == 50.0 and cfg.sliding_window == 4096
        assert cfg.layer_types[:2] == ["sliding_attention", "full_attention"]
    else:
        assert cfg.rope["rope_type"] == "llama3" and cfg.n_kv_heads == 8
    # the estimate counts exactly the tensors the model holds (K/V ungrouped, tied embeddings once)
    assert weight_bytes(cfg, 2) == sum(t.numel() * 2 for t in m.state_dict().values())


@pytest.mark.parametrize("method", METHODS)
def test_max_memory_is_respected_for_every_method(shape, method):
    name, m = shape
    cfg, P = m.cfg, 32
    for budget in (40 * 2**30, 80 * 2**30):
        b, rows = fit_memory(cfg, method, budget, positions=P, batch_size=64, max_rows=4096, itemsize=2)
        cost = method_cost(cfg, method, n=128, positions=P, batch_size=b, max_rows=rows, itemsize=2)
        assert weight_bytes(cfg, 2) < cost.memory_peak <= budget, (name, method, budget)
        assert b >= 1 and rows >= 1
    with pytest.raises(InputError, match="--max-memory"):
        fit_memory(cfg, method, weight_bytes(cfg, 2), positions=P, itemsize=2)  # weights alone leave no room


@pytest.mark.parametrize("family", list(FAMILIES))
def test_weight_bytes_equal_each_familys_tensors(family):
    m = from_hf(hf_model(family))
    assert weight_bytes(m.cfg) == sum(t.numel() * 4 for t in m.state_dict().values())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_forward_flops_equal_torchs_count_for_each_family(family):
    """The plan's FLOPs of a forward are the matmul FLOPs torch counts in the family's own forward (StarCoder2's
    ungated MLP, explicit head_dims, windows and clamps included): logits at every position, one example."""
    from torch.utils.flop_counter import FlopCounterMode

    from circuitstat.circuits.plan import forward_flops, unembed_flops

    m = from_hf(hf_model(family))
    ids = torch.arange(3, 12)[None]  # 9 tokens, longer than every window
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        m(ids, torch.ones_like(ids))
    P = ids.shape[1]
    assert counter.get_total_flops() == forward_flops(m.cfg, P) + (P - 1) * unembed_flops(m.cfg)


def test_post_norm_methods_contract_once_per_gradient_run():
    """Gemma's gradient methods count one contraction per gradient run (per-point linearised writes)."""
    from circuitstat.circuits.plan import contraction_flops, graph_of

    m = meta_model("gemma-2-2b")
    g, P = graph_of(m.cfg), 16
    eap = method_cost(m.cfg, "eap", n=1, positions=P)
    cc = method_cost(m.cfg, "clean-corrupted", n=1, positions=P)
    from circuitstat.circuits.plan import backward_flops, forward_flops

    assert cc.flops - eap.flops == pytest.approx(forward_flops(m.cfg, P) + backward_flops(m.cfg, P)
                                                 + contraction_flops(g, m.cfg, P))


def test_plan_lines_price_a_meta_model_by_flops(shape):
    """``attribute --plan``'s table for a shape with no weights: every method, memory within the budget,
    time as FLOPs at the given rate (stated, a lower bound)."""
    from circuitstat.circuits.plan import parse_bytes  # (circuitstat.circuits.limits after the ground-floor move)
    from circuitstat.pipelines.build import build_task
    from circuitstat.circuits.limits import MAX_WORK
    from circuitstat.pipelines.plan import flop_rate, plan_lines

    name, m = shape
    task = build_task(m, "induction", n=32, seed=0, metric=None)
    lines = plan_lines(m, task, batch_size=16, budget=parse_bytes("80GiB"), rate=(989.0, "a test peak"))
    assert "counts from shapes only" in lines[1] and "989 TFLOP/s (a test peak)" in lines[1]
    rows = {line.split()[0]: line for line in lines[3:-2]}
    assert set(rows) == set(methods_for(m.cfg))  # every method the model runs (Gemma 2: all but the additive-only)
    for line in rows.values():
        flops, mark = float(line.split()[5]), line.split()[-4]
        assert ">=" in line and "mem" not in mark  # within the 80 GiB budget
        assert (mark == "no:work") == (flops > MAX_WORK), line  # over the work limit (not lifted here): marked
    tflops, how = flop_rate("cpu", torch.float32, size=128)
    assert tflops > 0 and "matmul on cpu" in how


CLI_SHAPES = {  # the same shapes as random: specs (the rope schedule does not change a plan's counts)
    "gemma-2-2b": "random:gemma2?hidden_size=2304&intermediate_size=9216&num_hidden_layers=26&num_attention_heads=8"
                  "&num_key_value_heads=4&head_dim=256&vocab_size=256000&max_position_embeddings=8192"
                  "&query_pre_attn_scalar=256&sliding_window=4096",
    "llama-3.1-8b": "random:llama?hidden_size=4096&intermediate_size=14336&num_hidden_layers=32&num_attention_heads=32"
                    "&num_key_value_heads=8&head_dim=128&vocab_size=128256&max_position_embeddings=131072",
}


@pytest.mark.parametrize("name", list(CLI_SHAPES))
def test_attribute_plan_cli_on_the_shapes_allocates_no_weights(name):
    """``circuitstat attribute --plan`` on the 2B and 8B shapes: the skeleton only (both are over what a
    timing calibration loads), every method with memory within --max-memory and a FLOP-priced time."""
    import resource

    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    res = CliRunner().invoke(app, ["attribute", "--model", CLI_SHAPES[name], "--plan", "--allow-large", "--n", "32",
                                   "--dtype", "bfloat16", "--max-memory", "40GiB"])
    assert res.exit_code == 0, res.output + res.stderr
    assert "no time estimate: the weights" in res.output and "TFLOP/s" in res.output
    rows = [line.split() for line in res.output.splitlines() if line.split()[:1] and line.split()[0] in METHODS]
    expected = [m for m in METHODS if name != "gemma-2-2b" or not method_record(m).additive_only]  # post-norm
    assert sorted(r[0] for r in rows) == sorted(expected)
    for r in rows:
        assert r[-3] == ">=" and r[7] == "GiB" and float(r[6]) <= 40.0, r  # memory within the budget
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    assert grown < 2 * 2**30  # shapes and bookkeeping only: no 5-16 GiB of weights


DENSE_SHAPES = {  # published config.json values of each dense family's best-known checkpoint
    "phi-2": ("phi", dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=32, num_attention_heads=32,
                          vocab_size=51200, max_position_embeddings=2048, rope_parameters={
                              "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.4})),
    "gpt-j-6b": ("gptj", dict(n_embd=4096, n_layer=28, n_head=16, rotary_dim=64, vocab_size=50400, n_positions=2048)),
    "c4ai-command-r-v01": ("cohere", dict(hidden_size=8192, intermediate_size=22528, num_hidden_layers=40,
                                          num_attention_heads=64, num_key_value_heads=64, vocab_size=256000,
                                          max_position_embeddings=8192, logit_scale=0.0625,
                                          rope_parameters={"rope_type": "default", "rope_theta": 8e6})),
    "stablelm-2-1_6b": ("stablelm", dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                                         num_attention_heads=32, num_key_value_heads=32, vocab_size=100352,
                                         max_position_embeddings=4096, use_qkv_bias=True, rope_parameters={
                                             "rope_type": "default", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.25})),
    "falcon-7b": ("falcon", dict(hidden_size=4544, num_hidden_layers=32, num_attention_heads=71, vocab_size=65024,
                                 multi_query=True, parallel_attn=True, new_decoder_architecture=False, bias=False)),
}


@pytest.mark.parametrize("name", list(DENSE_SHAPES))
def test_dense_family_shapes_plan_from_config_alone(name):
    """Phi-2, GPT-J-6B, Command R, StableLM 2 and Falcon-7B converted on the meta device: the edge count by the
    graph's formula (parallel blocks: no edge from a layer's heads into its own MLP), the weights as held, and
    every method priced."""
    family, values = DENSE_SHAPES[name]
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(family, **values))
    m = from_hf(hf, dtype=torch.bfloat16, device="meta")
    cfg, L, H = m.cfg, m.cfg.n_layers, m.cfg.n_heads
    assert all(t.device.type == "meta" for t in m.parameters())
    upstream = [1 + layer * (H + 1) for layer in range(L)]
    edges = sum(3 * H * u + u + (0 if cfg.parallel else H) for u in upstream) + 1 + L * (H + 1)
    assert cfg.parallel == (family != "stablelm") and m.graph.n_edges == edges
    if name == "gpt-j-6b":
        assert edges == 316_723  # docs/families.md
    assert weight_bytes(cfg, 2) == sum(t.numel() * 2 for t in m.state_dict().values())
    for method in METHODS:
        cost = method_cost(cfg, method, n=8, positions=16, batch_size=4, itemsize=2)
        assert cost.flops > 0 and cost.memory_peak > weight_bytes(cfg, 2), (name, method)


def test_gptj_config_alone_plans_through_the_command(tmp_path):
    """``attribute --plan`` on a directory holding only a GPT-J config.json with ``n_inner: null`` (as GPT-J-6B's:
    4 x width, as transformers reads it): a parallel graph, counted by formula."""
    import json

    from typer.testing import CliRunner

    from circuitstat.pipelines.cli import app

    config = {"architectures": ["GPTJForCausalLM"], "model_type": "gptj", "n_embd": 256, "n_layer": 3, "n_head": 8,
              "n_inner": None, "rotary_dim": 16, "n_positions": 2048, "vocab_size": 1000,
              "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    res = CliRunner().invoke(app, ["attribute", "--model", str(tmp_path), "--plan", "--n", "4"])
    assert res.exit_code == 0, res.output + res.stderr
    L, H = 3, 8
    edges = sum(3 * H * (1 + l * (H + 1)) + 1 + l * (H + 1) for l in range(L)) + 1 + L * (H + 1)
    assert f"{edges:,} edges" in res.output and "counts from shapes only" in res.output


# mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts of width 14336, 2 active per token
MIXTRAL_8X7B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                    num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768, rms_norm_eps=1e-5,
                    tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def _meta(config, dtype=torch.bfloat16):
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    return hf, from_hf(hf, dtype=dtype, device="meta")


def test_mixtral_8x7b_plan_holds_every_expert_and_prices_the_active_ones():
    """Memory: every expert's weights (the converted tensors on meta, counted; HF's own parameter count plus the
    K/V copies of ungrouping). FLOPs: a forward equals that of the dense model whose MLP is top_k experts wide,
    plus the router (2 D X per token and layer) -- the top-2 active experts, never all 8."""
    from circuitstat.circuits.plan import forward_flops

    hf, m = _meta(transformers.MixtralConfig(num_local_experts=8, num_experts_per_tok=2, **MIXTRAL_8X7B))
    cfg = m.cfg
    assert all(t.device.type == "meta" for t in m.parameters())
    assert cfg.moe["experts"] == 8 and cfg.moe["top_k"] == 2 and cfg.moe["sparse_layers"] == list(range(32))
    held = sum(t.numel() * 2 for t in m.state_dict().values())
    assert weight_bytes(cfg, 2) == held
    ungrouped = 32 * 2 * (32 - 8) * 128 * 4096  # K and V weights copied per query head
    # zero biases of the uniform form, per layer: b_Q, b_K, b_V, b_O, ln1_b, ln2_b, the router's, the experts'
    biases = 32 * (6 * 4096 + 8 + 8 * (2 * 14336 + 4096)) + 4096 + 32000  # + lnf_b, b_U
    assert held == 2 * (sum(p.numel() for p in hf.parameters()) + ungrouped + biases)
    _, dense = _meta(transformers.LlamaConfig(**{**MIXTRAL_8X7B, "intermediate_size": 2 * 14336}))
    for P in (1, 39):
        assert forward_flops(cfg, P) == forward_flops(dense.cfg, P) + 32 * P * 2 * 4096 * 8
    for method in ("eap", "exact"):
        b, rows = fit_memory(cfg, method, 160 * 2**30, positions=32, batch_size=64, max_rows=4096, itemsize=2)
        cost = method_cost(cfg, method, n=64, positions=32, batch_size=b, max_rows=rows, itemsize=2)
        assert weight_bytes(cfg, 2) < cost.memory_peak <= 160 * 2**30
