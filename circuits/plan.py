"""What an attribution run will cost, from the model's shape alone: passes, FLOPs and peak memory.

Counts follow ``circuitstat.circuits.attribution`` (per batch of B examples padded to P positions):

* every method first runs the counterfactual forward (the ablation's sender outputs, no logits);
* ``eap``: one clean forward with receiver gradients and one backward, then the edge contraction
  Σ_pos Δz_u · ∂m/∂in_v (2·P·D multiply-adds per edge and example);
* ``clean-corrupted``: gradient runs at the clean and the corrupted input, one contraction;
* ``eap-ig-inputs``: the clean forward (sender outputs) and ``steps`` gradient runs;
* ``eap-ig-activations``: the clean forward and ``steps`` gradient runs per sender group (the
  input, each layer's heads, each MLP), one contraction per group;
* AtP* (``atp-qkfix``, ``atp-graddrop``, ``atpstar``; circuitstat.circuits.atpstar): one clean forward with receiver
  probes, then one backward (QK fix alone) or L backwards through it (GradDrop: one per dropped
  layer), one edge contraction per backward; the QK fix adds, per layer and upstream sender, the
  patched q and k projections of every head and two patterns per head, contracted with ∂m/∂A
  once per backward (:func:`qk_fix_flops`);
* ``exact``: the clean forward keeping every residual, then one *suffix* forward per
  (example, upstream sender) row of every receiver, from the receiver's layer on; the rows of a
  layer's q/k/v receivers share calls (as do an MLP's), at most ``max_rows`` rows per call; the
  last layer and the unembedding run at the read-out position only. (Rows whose Δz cannot reach
  the read-out, and positions before the first corrupted token, are skipped by the engine but
  depend on the data: the estimate counts every row at every position.)
  At node level: one run per sender from the sender's layer on.

Family features (circuitstat.circuits.engine): a q/k norm over the whole projection (OLMo 2) makes each q/k
suffix row project every head (H d_head or H_kv d_head wide, not d_head) and adds two projections
per kind to each gradient run's backward (the norm's coupling term); post-norms on the attention
output (Gemma 2/3, OLMo 2) keep each layer's summed attention output S_l in the kept runs, and make
clean-corrupted and EAP-IG contract every gradient run with its own linearised writes (one
contraction per gradient run instead of one per batch or sender group).  Soft-caps, sliding windows
(the scores are computed in full and masked), embedding scales and per-head q/k norms are
elementwise, as are Granite's multipliers (its residual_multiplier is folded into the weights), OLMo 1's
clip_qkv clamp and SmolLM3's NoPE layers (no rotation).  Tied embeddings hold one [V, D] matrix; an ungated MLP
(GPT-2, NeoX, StarCoder2) has two matrices, a gated one three.  A mixture-of-experts MLP node
(circuitstat.circuits.engine.moe) costs per token its router, its top-k active experts and any shared
expert (dense layers of the same model their gated MLP; the per-layer mean where the two mix), while
its memory holds every expert; activations are as wide as the active experts.

FLOPs count matrix multiplications (2 per multiply-add); elementwise work is left out. The backward
of a run whose weights are frozen costs one matmul per linear map and two per attention product.
Memory counts the tensors the implementation holds at its peak (weights, the batch's kept runs,
the rows of one suffix chunk or the autograd graph of one gradient run); it is an estimate, used to
choose batch sizes under ``--max-memory``, not a measurement. ``layer_passes`` counts layer
computations (each a fixed number of kernel launches): the per-call overhead that dominates small
models, which the time estimate prices separately from FLOPs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.params import BATCH_SIZE, IG_STEPS
from .graph import ComponentGraph
from .engine.config import ModelConfig
from .engine.moe import active_width, mlp_flops_per_token as moe_flops_per_token, mlp_params as moe_params
from .moe_nodes import graph_of  # noqa: F401 - the graph a config's costs count (moe_nodes kept)
from .limits import parse_bytes  # noqa: F401 - re-exported: sizes such as --max-memory 2GiB

from .methods import METHODS, Method, count, method as method_record  # noqa: F401 - METHODS re-exported


# ---- FLOPs of the pieces (per example) -----------------------------------------------------------
def _mlp_flops(cfg: ModelConfig, q: int) -> int:
    """The MLP at ``q`` positions."""
    if not cfg.has_mlp:
        return 0
    if cfg.moe is not None:  # per token: router, the top-k active experts, the shared expert; mean over layers
        return round(q * sum(moe_flops_per_token(cfg, layer) for layer in range(cfg.n_layers)) / cfg.n_layers)
    return 2 * q * cfg.d_model * cfg.d_mlp * (3 if cfg.mlp == "gated" else 2)


def _attention_flops(cfg: ModelConfig, P: int, q: int, heads: int) -> tuple[int, int]:
    """(linear, attention-product) FLOPs of ``heads`` heads with ``q`` query positions over ``P`` keys."""
    D, dh = cfg.d_model, cfg.d_head
    linear = 2 * heads * dh * D * (q + 2 * P + q)  # W_Q at q, W_K and W_V at P, W_O at q
    products = 2 * 2 * heads * q * P * dh  # scores and mixing
    return linear, products


def layer_flops(cfg: ModelConfig, P: int, q: int | None = None) -> tuple[int, int]:
    """(linear, attention-product) FLOPs of one layer for one example; queries and MLP at ``q`` positions."""
    q = P if q is None else q
    linear, products = _attention_flops(cfg, P, q, cfg.n_heads)
    return linear + _mlp_flops(cfg, q), products


def unembed_flops(cfg: ModelConfig) -> int:
    """The unembedding at one read-out position."""
    return 2 * cfg.d_model * cfg.vocab_size


def forward_flops(cfg: ModelConfig, P: int, *, fast_last: bool = False) -> int:
    """One forward of one example; ``fast_last``: the last layer's attention, W_O and MLP at the read-out position
    only (its fused q/k/v projection still at every position, as a suffix's last layer)."""
    total = unembed_flops(cfg)
    for layer in range(cfg.n_layers):
        last = layer == cfg.n_layers - 1
        total += _suffix_layer_flops(cfg, P, True) if fast_last and last else sum(layer_flops(cfg, P))
    return total


def _qk_width(cfg: ModelConfig, kind: int) -> int:
    """Columns a q (kind 0) or k (1) receiver projects: d_head, or the whole projection under a full q/k norm."""
    if cfg.qk_norm != "full":
        return cfg.d_head
    return (cfg.n_heads if kind == 0 else cfg.kv_heads) * cfg.d_head


def backward_flops(cfg: ModelConfig, P: int) -> int:
    """The backward (activation gradients only; weights are frozen) of a gradient run, with the mapping
    of its q/k/v probes' gradients back to the receiver inputs (circuitstat.circuits.engine.gradients)."""
    linear, products = layer_flops(cfg, P)
    D, H, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    coupling = 0
    if cfg.qk_norm == "full":  # the pre-norm projection recomputed and W pᵀ, per kind (circuitstat.circuits.engine.gradients)
        coupling = sum(2 * 2 * P * cfg.d_model * _qk_width(cfg, kind) for kind in (0, 1))
    # nothing below layer 0 needs a gradient: its q/k/v projections are not mapped back through by autograd
    first_inputs = 3 * 2 * P * D * H * dh
    # per layer, every head's q/k/v gradient mapped back: gp Wᵀ [3H, P, dh] x [dh, D], and under a norm
    # the row means of the norm's VJP from W xᵀ (another such product; layernorm adds gp's mean of W)
    kind = cfg.norm if cfg.pre_norm else "none"
    mapping = 2 * 3 * H * P * dh * D * (1 if kind == "none" else 2) + (2 * 3 * H * P * dh if kind == "layernorm" else 0)
    return cfg.n_layers * (linear + 2 * products + coupling + mapping) - first_inputs + unembed_flops(cfg)


def suffix_flops(cfg: ModelConfig, graph: ComponentGraph, receiver: int, P: int) -> int:
    """One exact-patching row of ``receiver``: its patched part, the later layers and the unembedding."""
    L = cfg.n_layers
    layer = int(graph.receiver_layer[receiver])
    if layer == L:
        return unembed_flops(cfg)
    last = layer == L - 1
    q = 1 if last else P
    if receiver != graph.mlp_receiver_safe(layer):  # one head's q, k or v recomputed, then its output
        D, dh = cfg.d_model, cfg.d_head
        kind = (receiver - layer * graph.receivers_per_layer) // cfg.n_heads
        width = dh if kind == 2 else _qk_width(cfg, kind)
        if cfg.qk_norm == "full" and kind < 2:  # the row's own head is projected first, then the whole projection
            width += dh
        own = 2 * P * D * width + 2 * 2 * q * P * dh + 2 * q * dh * D
        own += 0 if cfg.parallel else _mlp_flops(cfg, q)
    else:
        own = _mlp_flops(cfg, q)
    later = sum(_suffix_layer_flops(cfg, P, k == L - 1) for k in range(layer + 1, L))
    return own + later + unembed_flops(cfg)


def _suffix_layer_flops(cfg: ModelConfig, P: int, last: bool) -> int:
    """One unpatched layer of a suffix run: in full, or as the last layer, where the shared q/k/v projection
    still runs at every position but attention, W_O and the MLP run at the read-out only."""
    if not last:
        return sum(layer_flops(cfg, P))
    return sum(layer_flops(cfg, P, 1)) + 2 * (P - 1) * cfg.d_model * cfg.n_heads * cfg.d_head


def _exact_row_groups(graph: ComponentGraph) -> list[tuple[int, list[int]]]:
    """(layer, receivers) whose rows exact patching batches into one suffix: each layer's q/k/v
    receivers together, its MLP input alone, and the logits."""
    groups = []
    for layer in range(graph.n_layers + 1):
        members = [int(r) for r in range(graph.n_receivers) if int(graph.receiver_layer[r]) == layer]
        mlp = graph.mlp_receiver_safe(layer) if layer < graph.n_layers else graph.logits_receiver
        heads = [r for r in members if r != mlp]
        groups += [(layer, part) for part in (heads, [mlp] if mlp in members else []) if part]
    return groups


def contraction_flops(graph: ComponentGraph, cfg: ModelConfig, P: int) -> int:
    """Σ_pos Δz_u · g_v for every edge of one example."""
    return 2 * P * cfg.d_model * graph.n_edges


def sender_groups(cfg: ModelConfig) -> int:
    """Sender groups EAP-IG-activations integrates separately: the input, each layer's heads, each MLP."""
    return 1 + cfg.n_layers * (2 if cfg.has_mlp else 1)


def pass_counts(cfg: ModelConfig, method: str, steps: int) -> dict[str, int]:
    """{forwards, runs, backwards, contractions} per example of score ``method``, from its record's Passes
    (circuitstat.circuits.methods): plain forwards, gradient runs, backwards and edge contractions."""
    p = method_record(method).passes
    sym = {"steps": steps, "groups": sender_groups(cfg), "layers": cfg.n_layers}
    sym["runs"] = count(p.runs, **sym)
    sym["backwards"] = count(p.backwards, **sym)
    # post-norm models contract every gradient run with its own linearised writes (module docstring)
    contracted = count(p.contractions if cfg.additive_writes else p.contractions_post_norm, **sym)
    return {"forwards": p.forwards, "runs": sym["runs"], "backwards": sym["backwards"], "contractions": contracted}


def atp_backwards(cfg: ModelConfig, method: str) -> int:
    """Backward passes of a method's gradient run per example: L with AtP*'s GradDrop (one per dropped layer), else its runs."""
    return pass_counts(cfg, method, 1)["backwards"]


def qk_fix_flops(cfg: ModelConfig, graph: ComponentGraph, P: int, backwards: int) -> int:
    """The QK fix for one example, once per backward (circuitstat.circuits.atpstar.qk_fix_columns runs after each of
    GradDrop's backwards): per layer, ∂m/∂A of every head and, per upstream sender, its patched q and k for every
    head, two patterns per head and their contraction with ∂m/∂A."""
    H, dh, D = cfg.n_heads, cfg.d_head, cfg.d_model
    pattern_grad = 2 * H * P * D * dh + 2 * H * P * P * dh
    # the shared fused projection (q, k and v of every head; a whole-projection q/k norm is elementwise on it)
    per_sender = 2 * P * D * 3 * H * dh + 2 * 2 * H * P * P * dh + 2 * 2 * H * P * P
    return backwards * sum(pattern_grad + graph.upstream_of_attention(layer) * per_sender
                           for layer in range(cfg.n_layers))


def contractions(cfg: ModelConfig, method: str, steps: int) -> int:
    """Edge contractions per example: one per batch (EAP, pooled gradients) or sender group (EAP-IG-
    activations); on post-norm models one per gradient run (each with its own linearised writes);
    AtP* one per backward (the method's record says which: circuitstat.circuits.methods.Passes)."""
    return pass_counts(cfg, method, steps)["contractions"]


# ---- memory (bytes) ------------------------------------------------------------------------------
def weight_bytes(cfg: ModelConfig, itemsize: int = 4) -> int:
    """The model's weights as CircuitModel holds them (per-head K/V copies after ungrouping, separate
    embedding and unembedding, biases and norms)."""
    D, H, dh, L, V = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.n_layers, cfg.vocab_size
    norms = (2 if cfg.has_mlp else 1) * ((2 * D if cfg.pre_norm else 0) + (D if cfg.post_norm else 0))
    mlp = (cfg.d_mlp * D * (3 if cfg.mlp == "gated" else 2) + cfg.d_mlp + D) if cfg.has_mlp else 0
    qk = {"none": 0, "head": 2 * dh, "full": (H + cfg.kv_heads) * dh, "each_head": 2 * H * dh}[cfg.qk_norm]
    qk *= 2 if cfg.norm == "layernorm" else 1  # LayerNorm q/k norms: weights and biases
    per_layer = 4 * H * dh * D + 3 * H * dh + D + norms + qk + mlp  # W_QKVO, b_QKV, b_O, norms, q/k norms, MLP
    per_layer += H if cfg.attn_sinks else 0  # GPT-OSS's sink logits
    pos = cfg.n_ctx * D if cfg.positional == "learned" else 0
    embeddings = (1 if cfg.tied_embeddings else 2) * V * D
    layers = L * per_layer
    if cfg.moe is not None:  # every expert is held, whichever a token uses: the MLP node per layer
        layers += sum(moe_params(cfg, layer) for layer in range(L)) - L * mlp
    return itemsize * (layers + embeddings + V + 2 * D + pos)


def exact_example_bytes(cfg: ModelConfig, graph: ComponentGraph, P: int, itemsize: int = 4) -> int:
    """One example's kept clean run for exact patching: sender outputs, counterfactual and Δz,
    residuals before and after attention, per-head q/k/v."""
    D, L, U = cfg.d_model, cfg.n_layers, graph.n_senders
    kept = 2 * L + 1 + (L if cfg.post_norm else 0)  # residuals before/after attention, final; post-norm S_l
    return itemsize * P * ((3 * U + kept) * D + 3 * L * cfg.n_heads * cfg.d_head)


def exact_row_bytes(cfg: ModelConfig, P: int, itemsize: int = 4) -> int:
    """One suffix-forward row at its peak: gathered residuals and Δz, one layer's activations, logits."""
    D, H, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    mlp = 3 * P * active_width(cfg) if cfg.has_mlp else 0
    full = 2 * P * _qk_width(cfg, 0) if cfg.qk_norm == "full" else 0  # a row's whole normalised projection
    return itemsize * (8 * P * D + 4 * H * P * dh + 2 * H * P * P + mlp + full) + 4 * cfg.vocab_size


def gradient_example_bytes(cfg: ModelConfig, graph: ComponentGraph, P: int, method: str, itemsize: int = 4) -> int:
    """One example of a gradient method at its peak: the autograd graph of one run with per-head
    receiver inputs, the receiver gradients (and their running sum for IG), sender outputs and Δz (a method
    without gradient runs: its kept forward, the senders in float32 and one sender-sized difference)."""
    D, H, dh, L, U = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.n_layers, graph.n_senders
    passes = method_record(method).passes
    if count(passes.runs, steps=1, groups=1, layers=1, draws=1) == 0:  # no gradient run: no autograd graph held
        # the kept run (sender outputs, every residual), a float32 copy of the senders and one [U, P, D] difference
        return itemsize * P * D * (U + 2 * L + 1) + 4 * 2 * U * P * D + 4 * graph.n_edges
    mlp = 2 * P * active_width(cfg) if cfg.has_mlp else 0
    saved = L * (12 * H * P * D + 3 * H * P * dh + 2 * H * P * P + H * P * D + 4 * P * D + mlp)
    if cfg.post_norm:
        saved += L * 3 * P * D  # S_l kept, and the post-norm's saved input and output
    if cfg.qk_norm == "full":
        saved += L * 2 * H * P * D  # the coupling term of q and k, [2H, P, D] while a layer maps back
    grads = (L * (3 * H + 1) + 1) * P * D * passes.grad_buffers
    qk = 0
    if passes.qk_fix:  # the QK fix: patterns, their change and ∂m/∂A per sender (float32)
        qk = 4 * 4 * H * P * P * U + 4 * 2 * U * P * D  # and the exact writes, the patched q/k inputs
    return itemsize * (saved + grads + 3 * U * P * D) + 4 * graph.n_edges + qk


@dataclass(frozen=True)
class Cost:
    """The cost of one method on N examples (see the module docstring for what is counted)."""

    method: str
    columns: int  # edges (or nodes at node level)
    forwards: int  # full forwards, counterfactual and clean
    backwards: int
    suffix_rows: int  # exact patching: (example, sender) rows of suffix forwards
    flops: float
    layer_passes: int  # layer computations, forward and backward (per-call overhead)
    memory_peak: int  # bytes
    batch_size: int
    max_rows: int
    optimizer_steps: int = 0  # mask methods: Adam steps over every fit


def method_cost(cfg: ModelConfig, method: str, *, n: int, positions: int, level: str = "edge",
                batch_size: int = BATCH_SIZE.default, ig_steps: int = IG_STEPS.default, max_rows: int = 256,
                itemsize: int = 4) -> Cost:
    """The Cost of ``method`` at ``level`` on ``n`` examples of ``positions`` tokens (priced from its record)."""
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")
    rec = method_record(method)
    options = dict(n=n, positions=positions, level=level, batch_size=batch_size, ig_steps=ig_steps,
                   max_rows=max_rows, itemsize=itemsize)
    if rec.members:
        return _ensemble_cost(cfg, rec, **options)
    return (_exact_cost if rec.passes.suffix else _gradient_cost)(cfg, rec, **options)


def _gradient_cost(cfg: ModelConfig, rec: Method, *, n: int, positions: int, level: str, batch_size: int,
                   ig_steps: int, max_rows: int, itemsize: int) -> Cost:
    """The Cost of a gradient method: its plain forwards, gradient runs, backwards and contractions (its record's
    Passes), plus AtP*'s QK fix."""
    g, P, L = graph_of(cfg), positions, cfg.n_layers
    cols = g.n_edges if level == "edge" else g.n_senders
    batches = [min(batch_size, n - s) for s in range(0, n, batch_size)]
    fwd = forward_flops(cfg, P)
    counterfactual = fwd - unembed_flops(cfg)  # the ablation's forward keeps sender outputs, needs no logits
    k = pass_counts(cfg, rec.name, ig_steps)
    plain, runs, backs = k["forwards"], k["runs"], k["backwards"]
    flops = n * (counterfactual + (plain - 1) * fwd + runs * fwd + backs * backward_flops(cfg, P)
                 + k["contractions"] * contraction_flops(g, cfg, P))
    if rec.passes.qk_fix:
        flops += n * qk_fix_flops(cfg, g, P, backs)
    memory = weight_bytes(cfg, itemsize) + max(batches) * gradient_example_bytes(cfg, g, P, rec.name, itemsize)
    return Cost(rec.name, cols, n * (plain + runs), n * backs, 0, float(flops),
                len(batches) * (plain * L + runs * L + backs * L), memory, batch_size, max_rows)


def _exact_cost(cfg: ModelConfig, rec: Method, *, n: int, positions: int, level: str, batch_size: int,
                ig_steps: int, max_rows: int, itemsize: int) -> Cost:
    """The Cost of exact patching: the counterfactual and clean forwards, then its suffix rows (module docstring)."""
    g, P, L = graph_of(cfg), positions, cfg.n_layers
    cols = g.n_edges if level == "edge" else g.n_senders
    batches = [min(batch_size, n - s) for s in range(0, n, batch_size)]
    B = max(batches)
    fwd = forward_flops(cfg, P)
    counterfactual = fwd - unembed_flops(cfg)
    flops, rows, passes = n * (counterfactual + fwd), 0, 2 * L * len(batches)
    if level == "edge":
        for layer, group in _exact_row_groups(g):
            U = sum(int(g.n_upstream[r]) for r in group)
            rows += n * U
            flops += n * sum(int(g.n_upstream[r]) * suffix_flops(cfg, g, r, P) for r in group)
            # a group's rows share each suffix call, max_rows at a time (circuitstat.circuits.attribution._layer_rows)
            passes += sum(math.ceil(b * U / max_rows) for b in batches) * (L - layer + 1)
        row_peak = min(max_rows, B * int(g.n_upstream.max()))
    else:
        for u in range(g.n_senders):
            start = max(0, int(g.sender_layer[u]))
            rows += n
            flops += n * (sum(sum(layer_flops(cfg, P)) for _ in range(start, L)) + unembed_flops(cfg))
            passes += len(batches) * (L - start + 1)
        row_peak = B
    memory = (weight_bytes(cfg, itemsize) + B * exact_example_bytes(cfg, g, P, itemsize)
              + row_peak * exact_row_bytes(cfg, P, itemsize))
    return Cost(rec.name, cols, rec.passes.forwards * n, 0, rows, float(flops), passes, memory, batch_size, max_rows)


def _ensemble_cost(cfg: ModelConfig, rec: Method, **options) -> Cost:
    """The ensemble's Cost: its three members run one after another on each batch (the sum of their work, less
    what they share: one counterfactual forward instead of three, and EAP's gradient run's clean sender outputs
    instead of each EAP-IG member's clean forward (circuitstat.circuits.attribution.score_ensemble); the peak memory
    of the largest, as each member's graph is freed before the next)."""
    parts = [method_cost(cfg, m, **options) for m in rec.members]
    n, P, L = options["n"], options["positions"], cfg.n_layers
    fwd = forward_flops(cfg, P)
    shared = 2 * (fwd - unembed_flops(cfg)) + 2 * fwd  # two counterfactual and two clean forwards not run again
    batches = -(-n // options.get("batch_size", BATCH_SIZE.default))
    return Cost(rec.name, parts[0].columns, sum(c.forwards for c in parts) - 4 * n, sum(c.backwards for c in parts),
                0, float(sum(c.flops for c in parts) - n * shared), sum(c.layer_passes for c in parts) - 4 * L * batches,
                max(c.memory_peak for c in parts), parts[0].batch_size, parts[0].max_rows)


def masked_flops(cfg: ModelConfig, graph: ComponentGraph, P: int) -> tuple[int, int]:
    """(forward, backward) FLOPs of one example's masked run (circuitstat.circuits.engine.patching.edge_delta) and
    the backward of its loss to the mask. Forward: a forward plus, per receiver, its upstream Δz mixed by the mask
    (one edge contraction); on post-norm models each upstream layer's heads are mixed again on their own, inside
    the norm; under a whole-projection q/k norm each head's q/k input projects every head (and back).
    Backward: every linear map's input gradient and two per attention product (the per-head receiver inputs all
    depend on the mask), the unembedding, the mask's gradient (a contraction) and Δz's gradient for every
    receiver but layer 0's q/k/v (mixed while only the input, which does not depend on the mask, is upstream)."""
    linear, products = layer_flops(cfg, P)
    D, mix = cfg.d_model, contraction_flops(graph, cfg, P)
    first = [r for r in range(graph.n_receivers)
             if int(graph.receiver_layer[r]) == 0 and r != graph.mlp_receiver_safe(0)]
    diff = 2 * P * D * (graph.n_edges - int(graph.n_upstream[first].sum()))
    extra = 0  # work of the masked run beyond a forward and the mixing, done again in its backward
    if cfg.qk_norm == "full":
        extra += cfg.n_layers * cfg.n_heads * 2 * P * D * (_qk_width(cfg, 0) + _qk_width(cfg, 1) - 2 * cfg.d_head)
    post = 0
    if not cfg.additive_writes:  # each upstream layer's heads, mixed again inside its post-norm
        is_head = np.zeros(graph.n_senders, dtype=bool)
        for layer in range(cfg.n_layers):
            is_head[graph.head_sender(layer, 0):graph.head_sender(layer, 0) + cfg.n_heads] = True
        post = 2 * P * D * int(is_head[graph.edge_sender].sum())
    forward = forward_flops(cfg, P) + mix + extra + post
    backward = cfg.n_layers * (linear + 2 * products) + unembed_flops(cfg) + mix + diff + extra + 2 * post
    return forward, backward


def pruning_cost(cfg: ModelConfig, *, n: int, positions: int, steps: int, fits: int = 1,
                 batch_size: int = BATCH_SIZE.default, itemsize: int = 4, method: str = "edge-pruning", draws: int = 1) -> Cost:
    """The Cost of ``fits`` mask fits (circuitstat.circuits.edge_pruning; ``method="ugs"``: circuitstat.circuits.ugs,
    ``draws`` masks per prompt and step) of ``steps`` full-batch Adam steps on ``n`` examples: per fit and example
    the counterfactual, clean and fully patched forwards once, then per step and draw one masked run and its
    backward (:func:`masked_flops`), one optimiser step per fit and step (``optimizer_steps``). Every batch's
    autograd graph is kept until the step's one backward, so the peak holds all ``n`` examples' (every draw's)."""
    rec = method_record(method)
    if rec.family != "mask":
        raise InputError(f"pruning_cost prices mask-learned methods; {method!r} is a {rec.family} method (method_cost)")
    g, P, L = graph_of(cfg), positions, cfg.n_layers
    fwd = forward_flops(cfg, P)
    # the counterfactual's senders, the clean logits (last layer at the read-out only), the empty circuit's logits
    setup = (fwd - unembed_flops(cfg)) + forward_flops(cfg, P, fast_last=True) + fwd
    plain = rec.passes.forwards  # those three, per fit
    runs = steps * count(rec.passes.runs, draws=draws)  # masked runs per example and fit
    per_run = sum(masked_flops(cfg, g, P))
    batches = -(-n // batch_size)
    memory = weight_bytes(cfg, itemsize) + draws * n * gradient_example_bytes(cfg, g, P, method, itemsize)
    return Cost(method, g.n_edges, fits * n * (plain + runs), fits * n * runs, 0,
                float(fits * n * (setup + runs * per_run)), fits * batches * L * (plain + 2 * runs), memory,
                batch_size, 0, optimizer_steps=fits * steps)


ROWS_FIRST = 256
"""Suffix rows per call that ``fit_memory`` keeps room for before it keeps the batch size (exact)."""


def fit_memory(cfg: ModelConfig, method: str, budget: int, *, positions: int, level: str = "edge",
               batch_size: int = BATCH_SIZE.default, max_rows: int = 256, itemsize: int = 4) -> tuple[int, int]:
    """(batch_size, max_rows) no larger than asked whose estimated peak fits ``budget`` bytes;
    InputError naming the minimum budget when not even one example (and one row) fits."""
    g, P = graph_of(cfg), positions
    fixed = weight_bytes(cfg, itemsize)
    if method == "exact":
        per_example = exact_example_bytes(cfg, g, P, itemsize)
        per_row = exact_row_bytes(cfg, P, itemsize)
    else:
        per_example, per_row = gradient_example_bytes(cfg, g, P, method, itemsize), 0
    minimum = fixed + per_example + per_row
    if budget < minimum:
        from .limits import format_bytes

        raise InputError(f"--max-memory {format_bytes(budget)} is below the {format_bytes(minimum)} that {method} needs "
                         f"for one example of {P} tokens on this model; give at least {format_bytes(minimum)}")
    if method != "exact":
        return min(batch_size, (budget - fixed) // per_example), max_rows
    # exact: room for ROWS_FIRST suffix rows first (a handful of rows per call makes every matmul tiny and
    # the run slow), then the batch's kept runs, then as many suffix rows as the rest allows
    reserve = min(max_rows, ROWS_FIRST) * per_row
    batch = max(1, min(batch_size, (budget - fixed - reserve) // per_example))
    rows = min(max_rows, (budget - fixed - batch * per_example) // per_row)
    return int(batch), int(rows)


def exact_subset_cost(cfg: ModelConfig, edges, *, n: int, positions: int, batch_examples: int | None = None,
                      batch_size: int = BATCH_SIZE.default, max_rows: int = 256, itemsize: int = 4) -> Cost:
    """The Cost of exact patching on ``n`` examples and the edge indices ``edges`` (circuitstat.circuits.verify): one
    suffix row per (example, edge) from the edge's receiver layer on, and the clean and counterfactual
    forwards of ``batch_examples`` examples (the whole batches that hold them; default ``n``)."""
    g = graph_of(cfg)
    idx = np.unique(np.asarray(edges, dtype=np.int64))
    if idx.size == 0 or idx.min() < 0 or idx.max() >= g.n_edges:
        raise InputError(f"edges must be indices in [0, {g.n_edges})")
    cells = np.zeros(g.n_edges, dtype=np.int64)
    cells[idx] = n
    cost = exact_cells_cost(cfg, cells, positions=positions, batch_examples=n if batch_examples is None else
                            int(batch_examples), batch_size=batch_size, max_rows=max_rows, itemsize=itemsize)
    return replace(cost, method="exact-subset", columns=int(idx.size))


def exact_cells_cost(cfg: ModelConfig, cells_per_edge, *, positions: int, batch_examples: int,
                     batch_size: int = BATCH_SIZE.default, max_rows: int = 256, itemsize: int = 4) -> Cost:
    """The Cost of exact patching on chosen (example, edge) cells (circuitstat.circuits.verify.exact_cells):
    ``cells_per_edge`` [E] suffix rows per edge, each from the edge's receiver layer on, and the clean and
    counterfactual forwards of ``batch_examples`` examples (the whole batches holding a cell)."""
    g, P, L = graph_of(cfg), positions, cfg.n_layers
    c = np.asarray(cells_per_edge)
    if c.shape != (g.n_edges,) or (c < 0).any():
        raise InputError(f"cells_per_edge must be [{g.n_edges}] non-negative counts (one per edge)")
    per_receiver = np.bincount(g.edge_receiver, weights=c, minlength=g.n_receivers)
    if np.issubdtype(c.dtype, np.integer):  # whole counts: whole FLOPs (Python ints), as a rectangle's
        per_receiver = per_receiver.round().astype(np.int64)
    live = np.flatnonzero(per_receiver)
    suffix = sum(per_receiver[r].item() * suffix_flops(cfg, g, int(r), P) for r in live)
    fwd_n = batch_examples
    flops = fwd_n * (2 * forward_flops(cfg, P) - unembed_flops(cfg)) + suffix
    rows = int(round(float(c.sum())))
    B = min(batch_size, max(math.ceil(fwd_n), 1))
    passes = 2 * L * math.ceil(fwd_n / batch_size) + sum(
        math.ceil(per_receiver[r] / max_rows) * (L - int(g.receiver_layer[r]) + 1) for r in live)
    memory = (weight_bytes(cfg, itemsize) + B * exact_example_bytes(cfg, g, P, itemsize)
              + min(max_rows, rows) * exact_row_bytes(cfg, P, itemsize))
    return Cost("exact-cells", int((c > 0).sum()), int(round(2 * fwd_n)), 0, rows, float(flops), int(passes), memory,
                batch_size, max_rows)


def active_batch_examples(N: int, escape: float, batch_size: int, cells: float) -> tuple[float, float]:
    """Return (a lower, an upper bound) on the expected examples in the whole batches (of ``batch_size``, in order)
    that hold a sampled cell, from shapes only: ``escape`` bounds from above each prompt's chance of holding no cell
    (cells drawn independently), so a batch of s prompts holds one with probability at least 1 - escape^s; and a
    batch holding a cell holds at least one of the ``cells`` expected, so at most batch_size * cells examples."""
    low = sum(min(batch_size, N - s) * (1.0 - escape ** min(batch_size, N - s)) for s in range(0, N, batch_size))
    return low, float(min(N, batch_size * cells))


def active_verify_cost(cfg: ModelConfig, *, budget: float, N: int, positions: int, mix: float, streams: int = 1,
                       batch_size: int = BATCH_SIZE.default, max_rows: int = 256, itemsize: int = 4
                       ) -> tuple[Cost, tuple[float, float]]:
    """Return (the expected Cost of the active design's phase 2, priced at the upper bound of its forwards; the
    (lower, upper) bounds on the examples forwarded): ``budget`` expected cells per edge and approximate method
    (``streams`` methods, each its own draw; their union costs at most the sum), and the forwards of the whole
    batches holding a sampled prompt. Every cell's probability is at least (1 - ``mix``) budget / N (the
    defensive mixture, circuitstat.stats.verified.active), so a prompt escapes every draw with probability at most
    (1 - that)^(E streams)."""
    g = graph_of(cfg)
    E = g.n_edges
    escape = (1.0 - (1.0 - mix) * budget / N) ** (E * streams)
    low, high = active_batch_examples(N, escape, batch_size, streams * E * budget)
    cost = exact_cells_cost(cfg, np.full(E, streams * float(budget)), positions=positions, batch_examples=high,
                            batch_size=batch_size, max_rows=max_rows, itemsize=itemsize)
    return replace(cost, method="exact-verify"), (low, high)


def expected_batch_examples(N: int, n: int, batch_size: int) -> float:
    """The expected examples in the whole batches (of ``batch_size``, in order) that hold ``n`` of ``N`` examples
    drawn uniformly without replacement: what exact_subset runs forwards on."""
    total = 0.0
    for start in range(0, N, batch_size):
        size = min(batch_size, N - start)
        missed = 1.0  # P(no drawn example in this batch) = C(N - size, n) / C(N, n)
        for i in range(n):
            missed *= max(N - size - i, 0) / (N - i)
            if missed == 0.0:
                break
        total += size * (1.0 - missed)
    return total


def verify_cost(cfg: ModelConfig, *, n: int, N: int, positions: int, n_edges: int | None = None,
                batch_size: int = BATCH_SIZE.default, max_rows: int = 256, itemsize: int = 4) -> Cost:
    """The expected Cost of a verified run's phase 2: exact patching on ``n`` of ``N`` random examples, on every edge
    or (``n_edges``) on that many edges priced at the average edge's suffix (which edges phase 1 ranks on top is
    not known before it runs)."""
    g = graph_of(cfg)
    be = expected_batch_examples(N, n, batch_size)
    full = exact_subset_cost(cfg, np.arange(g.n_edges), n=n, positions=positions, batch_examples=math.ceil(be),
                             batch_size=batch_size, max_rows=max_rows, itemsize=itemsize)
    k = g.n_edges if n_edges is None else min(int(n_edges), g.n_edges)
    fwd = be * (2 * forward_flops(cfg, positions) - unembed_flops(cfg))
    suffix = full.flops - math.ceil(be) * (2 * forward_flops(cfg, positions) - unembed_flops(cfg))
    share = k / g.n_edges
    return Cost("exact-verify", k, int(round(2 * be)), 0, n * k, float(fwd + suffix * share),
                int(round(full.layer_passes * share)), full.memory_peak, batch_size, max_rows)
