"""Parity of a converted model with its Hugging Face original, as ``circuitstat model`` prints it.

* ``logits``: max |logit difference| on random (partly right-padded) inputs, real positions only.
* ``gradients``: the receiver-input gradients circuitstat's EAP contracts, summed over each
  receiver group (a layer's q/k/v receivers, its MLP input, the logits input), against autograd on
  the HF model at the same point (a copy of the branch's input inserted by a forward pre-hook on the
  module that reads it, so only that branch's gradient flows into it); relative to the largest gradient.
* ``hf_node_eap``: node-level EAP computed on the HF model alone (its own runs and autograd at each
  sender's output: embeddings, o_proj input slices per head, MLP writes), the oracle of EAP.
* ``exact``: exact per-edge effects by suffix recomputation against one full forward per edge with
  that edge patched (brute force), on a sample of edges into every receiver kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .ablation import last_index
from .interventions import Intervention


@dataclass(frozen=True)
class Parity:
    """Max differences of one parity check (see the module docstring)."""

    logits: float
    gradients: float | None
    exact: float | None
    exact_edges: int


def _decoder(hf):
    for attr in ("model", "transformer", "gpt_neox"):
        if hasattr(hf, attr):
            return getattr(hf, attr)
    raise ValueError("not a supported Hugging Face causal LM")


def branch_modules(hf) -> list:
    """The HF modules reading each receiver group's input, in circuitstat's receiver-group order."""
    kind, base = hf.config.model_type, _decoder(hf)
    layers = base.h if kind == "gpt2" else base.layers
    out = []
    for layer in layers:
        if kind == "gpt2":
            out += [layer.ln_1, layer.ln_2]
        elif kind == "olmo2":  # no pre-norms: attention and MLP read the residual itself
            out += [layer.self_attn, layer.mlp]
        elif hasattr(layer, "pre_feedforward_layernorm"):  # Gemma's sandwich
            out += [layer.input_layernorm, layer.pre_feedforward_layernorm]
        else:
            out += [layer.input_layernorm, layer.post_attention_layernorm]
    final = base.ln_f if kind == "gpt2" else (base.final_layer_norm if kind == "gpt_neox" else base.norm)
    return out + [final]


def hf_branch_gradients(hf, ids: torch.Tensor, mask: torch.Tensor, metric) -> list[torch.Tensor]:
    """∂metric/∂(input of each branch module) by autograd on ``hf`` (``metric``: logits [B, P, V] -> scalar)."""
    captured: list[torch.Tensor] = []

    def hook(module, args, kwargs):
        if args:
            x = args[0] * 1.0
            x.retain_grad()
            captured.append(x)
            return (x, *args[1:]), kwargs
        x = kwargs["hidden_states"] * 1.0
        x.retain_grad()
        captured.append(x)
        return args, {**kwargs, "hidden_states": x}

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in branch_modules(hf)]
    try:
        with torch.enable_grad():
            metric(hf(ids, attention_mask=mask).logits).backward()
    finally:
        for h in handles:
            h.remove()
    return [x.grad for x in captured]


def model_branch_gradients(model, ids: torch.Tensor, mask: torch.Tensor, metric) -> list[torch.Tensor]:
    """circuitstat's receiver-input gradients, summed over each receiver group (same order as branch_modules)."""
    with torch.enable_grad():
        out = model.run(ids, mask, receiver_grads=True)
        grads = torch.autograd.grad(metric(out.logits), out.grad_inputs)
    return [g.sum((1, 2)) if g.dim() == 5 else g for g in grads]


def hf_sender_modules(hf) -> list:
    """(module, "out" | "in") whose output or input is each sender of a decoder-family HF model: the
    embeddings, each layer's o_proj input (the heads), its MLP write (after any post-feedforward norm)."""
    base = hf.model
    out = [(base.embed_tokens, "out")]
    for layer in base.layers:
        out.append((layer.self_attn.o_proj, "in"))
        post = getattr(layer, "post_feedforward_layernorm", None)
        out.append((post if post is not None else layer.mlp, "out"))
    return out


def hf_node_eap(hf, task) -> np.ndarray:
    """[N, U] node-level EAP by autograd on HF alone, Σ_pos Δz_u · ∂m/∂z_u (heads: the o_proj input slices, whose
    contraction equals that of the heads' outputs since o_proj is linear)."""
    mods = hf_sender_modules(hf)
    heads = hf.config.num_attention_heads

    def capture(store, grad: bool):
        def make(kind):
            def hook(module, args, output=None):
                # GptOssMLP returns (hidden_states, router_scores): the sender is the first
                rest = output[1:] if isinstance(output, tuple) else None
                x = (args[0] if kind == "in" else (output[0] if rest is not None else output)) * 1.0
                if grad:
                    x.retain_grad()
                store.append(x)
                return (x,) if kind == "in" else (x if rest is None else (x, *rest))
            return hook
        return [m.register_forward_pre_hook(make("in")) if k == "in" else m.register_forward_hook(make("out"))
                for m, k in mods]

    cf, clean = [], []
    last = last_index(task.attention_mask)
    ar = torch.arange(task.clean.shape[0])
    handles = capture(cf, False)
    with torch.no_grad():
        hf(task.corrupted, attention_mask=task.attention_mask)
    for h in handles:
        h.remove()
    handles = capture(clean, True)
    logits = hf(task.clean, attention_mask=task.attention_mask).logits[ar, last]
    task.score(logits, indices=ar, clean_logits=logits.detach()).sum().backward()
    for h in handles:
        h.remove()
    cols = []
    for (_, kind), x, y in zip(mods, clean, cf):
        prod = ((y - x.detach()) * x.grad)  # [N, P, width]
        if kind == "in":  # per head: the o_proj input's head slices
            cols.append(prod.view(*prod.shape[:2], heads, -1).sum((1, 3)))
        else:
            cols.append(prod.sum((1, 2))[:, None])
    return torch.cat(cols, 1).detach().numpy()


def _metric(ids: torch.Tensor, mask: torch.Tensor):
    last = mask.long().sum(-1) - 1
    ar = torch.arange(ids.shape[0])
    good, bad = ids[:, 0], ids[:, -1]
    return lambda logits: (logits[ar, last, good] - logits[ar, last, bad]).float().sum()


def _inputs(vocab: int, n: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, length), generator=gen)
    mask = torch.ones_like(ids)
    if n > 1:
        mask[-1, max(1, length // 2) :] = 0  # one right-padded input
    return ids, mask


def brute_force_edge_effects(model, task, cf: torch.Tensor, edges=None) -> np.ndarray:
    """Return [N, len(edges)] effects of patching each edge alone (counterfactual sender outputs ``cf``), one
    full forward per edge: the definition of the exact effect, which suffix recomputation must equal."""
    from .ablation import last_index

    g = model.graph
    edges = np.arange(g.n_edges) if edges is None else np.asarray(edges)
    idx = torch.arange(task.clean.shape[0])
    last = last_index(task.attention_mask)
    with torch.no_grad():
        base = model.run(task.clean, task.attention_mask, logits_at=last).logits
        m0 = task.score(base, indices=idx, clean_logits=base)
        out = torch.zeros(len(idx), len(edges), dtype=torch.float64)
        for j, e in enumerate(edges):
            mask = torch.zeros(g.n_edges)
            mask[int(e)] = 1
            lo = model.run(task.clean, task.attention_mask, intervention=Intervention.edges(mask, cf),
                           logits_at=last).logits
            out[:, j] = (task.score(lo, indices=idx, clean_logits=base) - m0).double()
    return out.numpy()


def exact_vs_brute_force(model, ids: torch.Tensor, corrupted: torch.Tensor, mask: torch.Tensor,
                         n_edges: int, seed: int) -> tuple[float, int]:
    """(max |Δlogits| between suffix recomputation and a full run with the edge patched, edges checked)."""
    g = model.graph
    last = mask.long().sum(-1) - 1
    rows = torch.arange(ids.shape[0])
    rng = np.random.default_rng(seed)
    edges = rng.choice(g.n_edges, size=min(n_edges, g.n_edges), replace=False)
    worst = 0.0
    with torch.no_grad():
        clean = model.run(ids, mask, keep_senders=True, keep_resid=True, keep_qkv=True)
        cf = model.run(corrupted, mask, keep_senders=True, compute_logits=False).senders
        writes = model.sender_write_deltas(clean, cf - clean.senders)
        for e in edges:
            u, r = int(g.edge_sender[e]), int(g.edge_receiver[e])
            fast = model.patched_receiver_logits(clean, ids, mask, r, rows, writes[:, u], last)
            em = torch.zeros(g.n_edges)
            em[e] = 1
            full = model.run(ids, mask, intervention=Intervention.edges(em, cf), logits_at=last).logits
            worst = max(worst, float((fast - full).abs().max()))
    return worst, len(edges)


def check_parity(hf, model, *, n_inputs: int = 4, length: int = 16, seed: int = 0, n_edges: int = 24,
                 gradients: bool = True) -> Parity:
    """Parity of ``model`` (converted from ``hf``) on random inputs of ``length`` tokens."""
    cfg = model.cfg
    length = min(length, cfg.n_ctx, cfg.rope_max_positions or cfg.n_ctx)
    ids, mask = _inputs(cfg.vocab_size, n_inputs, length, seed)
    with torch.no_grad():
        diff = (hf(ids, attention_mask=mask).logits - model(ids, mask)).abs()[mask.bool()].max().item()
    if not gradients:
        return Parity(diff, None, None, 0)
    metric = _metric(ids, mask)
    ref = hf_branch_gradients(hf, ids, mask, metric)
    ours = model_branch_gradients(model, ids, mask, metric)
    real = mask.bool()
    scale = max(float(r[real].abs().max()) for r in ref) or 1.0
    grad = max(float((a - b)[real].abs().max()) for a, b in zip(ref, ours)) / scale
    corrupted, _ = _inputs(cfg.vocab_size, n_inputs, length, seed + 1)
    exact, checked = exact_vs_brute_force(model, ids, corrupted, mask, n_edges, seed)
    return Parity(diff, grad, exact, checked)
