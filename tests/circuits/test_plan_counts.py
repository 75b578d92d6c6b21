"""circuitstat.circuits.plan: passes, FLOPs and memory against counts made by hand for a tiny model."""

from __future__ import annotations

import pytest

from circuitstat.core.errors import InputError
from circuitstat.circuits.model import CircuitModel, ModelConfig
from circuitstat.circuits.plan import (exact_example_bytes, exact_row_bytes, fit_memory, forward_flops, graph_of, method_cost, parse_bytes,
                           weight_bytes)

# one layer, one head of d_head 2, d_model 4, MLP 8, vocabulary 10; prompts of 3 tokens
CFG = ModelConfig(n_layers=1, n_heads=1, d_model=4, d_head=2, d_mlp=8, vocab_size=10, n_ctx=16)
P = 3


def mm(m: int, k: int, n: int) -> int:
    """FLOPs of an [m, k] x [k, n] matrix product."""
    return 2 * m * k * n


# By hand, one example. A full layer at 3 positions: W_Q, W_K, W_V [3x4]x[4x2]; scores [3x2]x[2x3];
# mixing [3x3]x[3x2]; W_O [3x2]x[2x4]; MLP [3x4]x[4x8] and [3x8]x[8x4]. Unembedding at the read-out
# token only: [1x4]x[4x10].
LAYER = 3 * mm(3, 4, 2) + mm(3, 2, 3) + mm(3, 3, 2) + mm(3, 2, 4) + mm(3, 4, 8) + mm(3, 8, 4)
UNEMBED = mm(1, 4, 10)
FORWARD = LAYER + UNEMBED  # 728
# backward with frozen weights: one product per linear map, two per attention product
BACKWARD = 3 * mm(3, 4, 2) + mm(3, 2, 4) + mm(3, 4, 8) + mm(3, 8, 4) + 2 * (mm(3, 2, 3) + mm(3, 3, 2)) + UNEMBED
# Edges: input -> a0.h0 <q>, <k>, <v>; input, a0.h0 -> m0; input, a0.h0, m0 -> logits.
EDGES = 3 + 2 + 3
CONTRACTION = EDGES * mm(1, 3 * 4, 1)  # Σ over 3 positions x 4 features per edge
# Exact, per edge row (the layer is the last one, so after the patch only the read-out token runs):
# a q/k/v edge recomputes that projection at 3 positions, the head's attention for the read-out
# query, W_O and the MLP at that token, then unembeds; an MLP edge runs the MLP at the token; a
# logits edge only unembeds.
QKV_ROW = mm(3, 4, 2) + mm(1, 2, 3) + mm(1, 3, 2) + mm(1, 2, 4) + mm(1, 4, 8) + mm(1, 8, 4) + UNEMBED
MLP_ROW = mm(1, 4, 8) + mm(1, 8, 4) + UNEMBED
# the counterfactual forward only keeps sender outputs (no unembedding); the clean one reads logits
EXACT = LAYER + FORWARD + 3 * QKV_ROW + 2 * MLP_ROW + 3 * UNEMBED


def test_forward_flops_match_the_hand_count():
    assert FORWARD == 728 and forward_flops(CFG, P) == FORWARD


@pytest.mark.parametrize("method, forwards, backwards, flops", [
    ("eap", 2, 1, LAYER + FORWARD + BACKWARD + CONTRACTION),
    ("clean-corrupted", 3, 2, LAYER + 2 * FORWARD + 2 * BACKWARD + CONTRACTION),
    ("eap-ig-inputs", 2 + 5, 5, LAYER + (1 + 5) * FORWARD + 5 * BACKWARD + CONTRACTION),
    # sender groups: the input, layer 0's heads, its MLP
    ("eap-ig-activations", 2 + 15, 15, LAYER + (1 + 15) * FORWARD + 15 * BACKWARD + 3 * CONTRACTION),
])
def test_gradient_methods_count_passes_and_flops_by_hand(method, forwards, backwards, flops):
    c = method_cost(CFG, method, n=2, positions=P, batch_size=2, ig_steps=5)
    assert c.columns == EDGES and c.suffix_rows == 0
    assert (c.forwards, c.backwards, c.flops) == (2 * forwards, 2 * backwards, 2 * flops)


def test_exact_counts_one_suffix_row_per_example_and_edge():
    assert EXACT == 3000 - UNEMBED
    c = method_cost(CFG, "exact", n=2, positions=P, batch_size=2)
    assert (c.columns, c.forwards, c.backwards, c.suffix_rows, c.flops) == (EDGES, 4, 0, 2 * EDGES, 2 * EXACT)
    node = method_cost(CFG, "exact", n=2, positions=P, level="node", batch_size=2)
    # nodes: input (a full forward), a0.h0 and m0 (from layer 0 on: the layer and the unembedding)
    assert node.columns == 3 and node.suffix_rows == 2 * 3 and node.flops == 2 * (LAYER + FORWARD + 3 * FORWARD)


def test_gpt2_small_shape_has_32491_edges():
    gpt2 = ModelConfig(n_layers=12, n_heads=12, d_model=768, d_head=64, d_mlp=3072, vocab_size=50257)
    assert method_cost(gpt2, "eap", n=1, positions=20).columns == 32491


@pytest.mark.parametrize("cfg", [CFG, ModelConfig(n_layers=2, n_heads=4, d_model=32, d_head=8, d_mlp=64, vocab_size=97,
                                                  norm="rmsnorm", positional="rotary", mlp="gated", act="silu")])
def test_weight_bytes_equal_the_models_tensors(cfg):
    model = CircuitModel(cfg)
    assert weight_bytes(cfg) == sum(t.numel() * 4 for t in model.state_dict().values())


def test_fit_memory_refuses_below_one_example_naming_the_minimum_and_fits_above():
    minimum = weight_bytes(CFG) + exact_example_bytes(CFG, graph_of(CFG), P) + exact_row_bytes(CFG, P)
    with pytest.raises(InputError, match="give at least"):
        fit_memory(CFG, "exact", minimum - 1, positions=P)
    assert fit_memory(CFG, "exact", minimum, positions=P) == (1, 1)
    ex, row, fixed = exact_example_bytes(CFG, graph_of(CFG), P), exact_row_bytes(CFG, P), weight_bytes(CFG)
    # room for 256 rows is kept first, then the batch, then more rows
    assert fit_memory(CFG, "exact", fixed + 4 * ex + 256 * row, positions=P, batch_size=4, max_rows=1000) == (4, 256)
    assert fit_memory(CFG, "exact", fixed + 4 * ex + 300 * row, positions=P, batch_size=4, max_rows=1000) == (4, 300)
    assert fit_memory(CFG, "exact", fixed + 2 * ex + 256 * row, positions=P, batch_size=4, max_rows=1000) == (2, 256)
    assert fit_memory(CFG, "exact", fixed + ex + 100 * row, positions=P, batch_size=4, max_rows=1000) == (1, 100)
    budget = fixed + 3 * ex + 270 * row
    b, rows = fit_memory(CFG, "exact", budget, positions=P, batch_size=4, max_rows=1000)
    assert method_cost(CFG, "exact", n=8, positions=P, batch_size=b, max_rows=rows).memory_peak <= budget
    gb, _ = fit_memory(CFG, "eap", 10 * minimum, positions=P, batch_size=64)
    assert 1 <= gb < 64 and method_cost(CFG, "eap", n=64, positions=P, batch_size=gb).memory_peak <= 10 * minimum


@pytest.mark.parametrize("text, value", [("2GiB", 2 * 2**30), ("512MB", 512 * 10**6), ("1.5g", 1_500_000_000),
                                         ("1000", 1000), (" 3 kib ", 3072)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "2 GiBs", "-1GB", "0"])
def test_parse_bytes_refuses_non_sizes(text):
    with pytest.raises(InputError, match="2GiB"):
        parse_bytes(text)


@pytest.mark.parametrize("max_rows, calls", [
    # per batch of 2 examples: layer 0's q/k/v rows (3 receivers x 1 sender x 2 = 6) share calls, its
    # MLP's rows (2 senders x 2 = 4) share others, and the logits' (3 x 2 = 6) run the unembedding only
    (256, {"qkv": 1, "mlp": 1, "logits": 1}),
    (4, {"qkv": 2, "mlp": 1, "logits": 2}),
    (1, {"qkv": 6, "mlp": 4, "logits": 6}),
])
def test_exact_layer_passes_count_the_engines_shared_calls(max_rows, calls):
    c = method_cost(CFG, "exact", n=2, positions=P, batch_size=2, max_rows=max_rows)
    clean_and_counterfactual = 2 * 1  # two runs of the one layer
    # a call from layer 0 runs layer 0 and the unembedding (2 passes); the logits' calls 1
    assert c.layer_passes == clean_and_counterfactual + 2 * calls["qkv"] + 2 * calls["mlp"] + calls["logits"]
