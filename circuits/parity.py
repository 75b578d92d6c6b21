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


# (layers, attention module, its output projection, token embedding, final norm) where they are not
# (layers, self_attn, o_proj, embed_tokens, norm): the dense families of circuitstat.circuits.convert_dense
_LAYOUT = {"phi": ("layers", "self_attn", "dense", "embed_tokens", "final_layernorm"),
           "gptj": ("h", "attn", "out_proj", "wte", "ln_f"),
           "falcon": ("h", "self_attention", "dense", "word_embeddings", "ln_f")}
_DEFAULT_LAYOUT = ("layers", "self_attn", "o_proj", "embed_tokens", "norm")


@dataclass(frozen=True)
class SharedNorm:
    """A branch whose module (attention or MLP) reads ``norm`` of its ``layer``'s input, a norm both branches
    share (Phi, GPT-J, Cohere, parallel StableLM and Falcon): the hook feeds ``module`` norm(copy of the
    layer input), so the copy's gradient is that branch's alone."""

    layer: object
    module: object
    norm: object


def _shared_norm(hf, layer):
    """The norm a layer's attention and MLP both read, or None where each has its own."""
    kind = hf.config.model_type
    if kind == "gptj":
        return layer.ln_1
    if kind in ("phi", "cohere") or (kind == "stablelm" and layer.use_parallel_residual):
        return layer.input_layernorm
    if kind == "falcon" and not hasattr(layer, "ln_attn") and hf.config.parallel_attn:
        return layer.input_layernorm
    return None


def _dense_branches(hf, layer) -> list:
    """The two branch readers of one layer of a family in circuitstat.circuits.convert_dense."""
    _, attn, *_ = _LAYOUT.get(hf.config.model_type, _DEFAULT_LAYOUT)
    shared = _shared_norm(hf, layer)
    if shared is not None:
        return [SharedNorm(layer, getattr(layer, attn), shared), SharedNorm(layer, layer.mlp, shared)]
    if hasattr(layer, "ln_attn"):  # Falcon's new_decoder_architecture
        return [layer.ln_attn, layer.ln_mlp]
    return [layer.input_layernorm, layer.post_attention_layernorm]  # sequential StableLM / Falcon


def branch_modules(hf) -> list:
    """The HF modules reading each receiver group's input, in circuitstat's receiver-group order
    (:class:`SharedNorm` where a layer's two branches read one norm)."""
    kind, base = hf.config.model_type, _decoder(hf)
    if kind in ("phi", "gptj", "cohere", "stablelm", "falcon"):
        names = _LAYOUT.get(kind, _DEFAULT_LAYOUT)
        out = [m for layer in getattr(base, names[0]) for m in _dense_branches(hf, layer)]
        return out + [getattr(base, names[4])]
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


def _first_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """A module call's hidden states (its first positional argument, or ``hidden_states=``)."""
    return args[0] if args else kwargs["hidden_states"]


def _with_first_input(args: tuple, kwargs: dict, x: torch.Tensor) -> tuple[tuple, dict]:
    """The call's (args, kwargs) with its hidden states replaced by ``x``."""
    return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})


def hf_branch_gradients(hf, ids: torch.Tensor, mask: torch.Tensor, metric) -> list[torch.Tensor]:
    """∂metric/∂(input of each branch module) by autograd on ``hf`` (``metric``: logits [B, P, V] -> scalar)."""
    captured: list[torch.Tensor] = []
    inputs: dict = {}  # layer id -> its input (shared-norm branches)

    def leaf(x: torch.Tensor) -> torch.Tensor:
        x = x * 1.0
        x.retain_grad()
        captured.append(x)
        return x

    def hook(module, args, kwargs):
        return _with_first_input(args, kwargs, leaf(_first_input(args, kwargs)))

    def layer_input(module, args, kwargs):
        inputs[id(module)] = _first_input(args, kwargs)

    def shared(branch: SharedNorm):
        def hook(module, args, kwargs):
            return _with_first_input(args, kwargs, branch.norm(leaf(inputs[id(branch.layer)])))
        return hook

    handles, hooked = [], set()
    for m in branch_modules(hf):
        if isinstance(m, SharedNorm):
            if id(m.layer) not in hooked:
                hooked.add(id(m.layer))
                handles.append(m.layer.register_forward_pre_hook(layer_input, with_kwargs=True))
            handles.append(m.module.register_forward_pre_hook(shared(m), with_kwargs=True))
        else:
            handles.append(m.register_forward_pre_hook(hook, with_kwargs=True))
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
    base = _decoder(hf)
    layers, attn, proj, embed, _ = _LAYOUT.get(hf.config.model_type, _DEFAULT_LAYOUT)
    out = [(getattr(base, embed), "out")]
    for layer in getattr(base, layers):
        out.append((getattr(getattr(layer, attn), proj), "in"))
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
                # a copy goes on: Falcon adds the attention output into the MLP's output in place; GPT-OSS's MLP
                # returns a tuple (its router scores ride along)
                return (x,) if kind == "in" else (x * 1.0 if rest is None else (x * 1.0, *rest))
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
