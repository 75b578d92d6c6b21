"""AtP* on the edge graph: the QK fix and GradDrop of Kramár, Lieberum, Shah & Nanda (2024),
"AtP*: An efficient and scalable method for localizing LLM behaviour to components", arXiv:2403.00745.

AtP (attribution patching, Nanda 2022) is what this package calls EAP at edge level: the score of edge
u → v on example n is Σ_pos Δz_u · ∂m/∂in_v, the first-order Taylor term of the exact effect.  AtP*
fixes its two failure modes (section 3.1 of the paper):

* **QK fix** (section 3.1.1, "attention saturation").  The paper recomputes a head's attention
  softmax exactly when a query or key node is patched, and linearises only what comes after the
  attention probabilities:  Î(n) = Σ_{t,t'} (A^{patched}_{t,t'} − A_{t,t'}) ∂m/∂A_{t,t'}.  Here, for an
  edge into a head's ``<q>`` (``<k>``) receiver, the receiver's input gains the sender's write at every
  position (exactly as exact patching adds it, through the pre-attention norm, the projection, q/k
  norms and rotary embeddings), the head's pattern is recomputed from the patched queries (keys) and
  the clean keys (queries), and the change of the pattern is contracted with ∂m/∂A of the clean run.
  ∂m/∂A_h[t, t'] = (W_O[h] ∂m/∂z_h[t]) · v_h[t'], from the gradient of the head's output z_h (its
  sender output), so no extra backward is needed.  The value path stays linear (EAP), as do MLP and
  logits receivers.  The score equals the exact effect of patching the edge when the network
  downstream of the head's pattern is linearised at the clean run, and equals EAP in the limit of a
  small Δz (tests/circuits/test_atpstar.py checks both against a brute-force autograd oracle).
* **GradDrop** (section 3.1.2, "cancellation").  For each layer ℓ = 1..L, the AtP estimate is
  recomputed with the gradient through layer ℓ's contribution to the residual stream dropped (its
  attention and MLP writes pass their values forward but no gradient back; the skip connection still
  carries it), and the estimates are combined as the paper's (eq. 11)
  ĉ_{AtP+GD}(n) = 1/(L−1) Σ_{ℓ=1}^{L} |Î_{AtP+GD_ℓ}(n)|  (per example here; the study takes the mean).
  The 1/(L−1): for a node in layer ℓ, the term that drops its own layer is zero.  For an edge the
  receiver's layer plays that role (its gradient passes through that layer's writes only), except for
  the logits receiver, which no drop reaches (its edges get L/(L−1) |EAP|).  A one-layer model has one
  term, divided by 1 (the paper's normaliser is undefined there).  GradDrop scores are non-negative.

Methods: ``atp-qkfix`` (QK fix alone), ``atp-graddrop`` (GradDrop alone) and ``atpstar`` (both: the QK
fix contracted with each dropped-layer gradient).  Cost per batch: the counterfactual forward (the
ablation's), one clean forward with receiver probes, and one backward (``atp-qkfix``) or L backwards
through the same forward (GradDrop), plus the QK fix's pattern recomputation: per layer, every
upstream sender's patched q and k projections and two patterns per head (circuitstat.circuits.plan prices it).
Edge level only: a node's AtP* is not the sum of its edges' (the absolute values).
"""

from __future__ import annotations

import torch

from .engine.attention import attention_pattern, head_sinks, project_shared, qk_normalize
from .engine.gradients import GradientGates
from .engine.masks import layer_masks
from .engine.norms import attn_input_norm
from .engine.rotary import apply_rotary, layer_rotary, rotary_of_layer

def variant(method: str) -> tuple[bool, bool]:
    """(qk_fix, graddrop) of AtP* ``method``, as its record (circuitstat.circuits.methods) declares them."""
    from .methods import method as method_record

    passes = method_record(method).passes
    return passes.qk_fix, passes.backwards == "layers"  # GradDrop: one backward per dropped layer

PATTERN_CHUNK = 1 << 24
"""Pattern elements the QK fix holds at once (senders are chunked to stay below it)."""


def graddrop_terms(n_layers: int) -> int:
    """The normaliser of GradDrop's sum over dropped layers: L − 1 (1 for a one-layer model)."""
    return max(n_layers - 1, 1)


def head_block(model, layer: int) -> int:
    """Index of layer ``layer``'s per-head outputs in a run's ``blocks`` (input, then per layer heads (, MLP))."""
    return 1 + layer * (2 if model.cfg.has_mlp else 1)


def score_atp(model, data, batch, cf: torch.Tensor, job) -> torch.Tensor:
    """[B, E] AtP* scores of one batch (``job``: circuitstat.circuits.attribution.BatchJob; edge level only)."""
    return atp_edges(model, data, batch, cf, job.method)


def atp_edges(model, data, batch, cf: torch.Tensor, method: str) -> torch.Tensor:
    """[B, E] AtP* scores (``method`` one of circuitstat.circuits.methods.ATP_METHODS) of one batch (circuitstat.circuits.attribution._Batch)."""
    from .contraction import check_metric, edge_scores_from_grads

    qk_fix, graddrop = variant(method)
    L = model.cfg.n_layers
    gates = GradientGates() if graddrop else None
    with torch.enable_grad():
        out = model.run(batch.clean, batch.mask, receiver_grads="projected", logits_at=batch.last,
                        keep_senders=True, keep_resid=qk_fix, keep_qkv=qk_fix, grad_gates=gates)
        batch.set_clean(out)
        metric = data.score(out.logits.float(), indices=batch.index, clean_logits=batch.clean_last)
        check_metric(metric.detach(), batch.index, "gradient run")
        probes = list(out.grad_inputs)
        heads = [out.blocks[head_block(model, layer)] for layer in range(L)] if qk_fix else []
        dz = (cf - out.senders).detach()
        linear = model.sender_write_deltas(out, dz.clone(), linear=True)
        # the QK fix adds what exact patching adds (post-norm models: N(S + Δz) − N(S), not its linearisation)
        writes = model.sender_write_deltas(out, dz.clone()) if qk_fix else None
        drops = list(range(L)) if graddrop else [None]
        total = None
        for i, dropped in enumerate(drops):
            if gates is not None:
                gates.dropped = dropped
            grads = torch.autograd.grad(metric.sum(), probes + heads, retain_graph=i < len(drops) - 1,
                                        allow_unused=True)
            rec = model.iter_receiver_input_grads(out, grads[: len(probes)])
            s = edge_scores_from_grads(model, linear, rec)
            if qk_fix:
                qk_fix_columns(model, out, batch.mask, writes, grads[len(probes):], s)
            s = s.abs() if graddrop else s
            total = s if total is None else total + s
    return total / graddrop_terms(L) if graddrop else total


def _patched_qk(model, layer: int, x: torch.Tensor, rot) -> tuple[torch.Tensor, torch.Tensor]:
    """(queries, keys) [R, H, P, E] of every head of ``layer`` read from one shared (patched) residual
    x [R, P, D]: the pre-attention norm, the projections, q/k norms and rotary embeddings, as the
    forward pass computes them (a shared input: circuitstat.circuits.engine.attention.project_shared)."""
    cfg, blk = model.cfg, model.blocks[layer]
    q, k, _ = project_shared(cfg, blk, attn_input_norm(cfg, blk, x))
    q, k = qk_normalize(cfg, blk, q, 0), qk_normalize(cfg, blk, k, 1)
    rot = rotary_of_layer(cfg, rot, layer)
    if rot is not None:
        cos, sin = rot
        q, k = apply_rotary(cfg, q, cos, sin), apply_rotary(cfg, k, cos, sin)
    return q, k


def pattern_grad(model, layer: int, gz: torch.Tensor | None, v: torch.Tensor) -> torch.Tensor | None:
    """∂m/∂A [B, H, P, P] of layer ``layer``'s patterns from ∂m/∂z_h (``gz`` [B, H, P, D]) and values
    v [B, H, P, E]: z_h = (A_h v_h) W_O[h], so ∂m/∂A_h[t, t'] = (W_O[h] ∂m/∂z_h[t]) · v_h[t']."""
    if gz is None:
        return None
    W_O = model.blocks[layer].W_O.float()  # [H, E, D]
    gzc = torch.einsum("bhpd,hed->bhpe", gz.float(), W_O)
    return gzc @ v.float().transpose(-1, -2)


def qk_fix_columns(model, out, mask: torch.Tensor, writes: torch.Tensor, head_grads, scores: torch.Tensor) -> None:
    """Overwrite the q and k edge columns of ``scores`` [B, E] with their QK-fixed scores (in place).

    ``out``: the clean run (kept senders, residuals, rotated q/k/v); ``writes`` [B, U, P, D]: what each
    sender's patch adds to a receiver's input; ``head_grads``: ∂m/∂z_h per layer ([B, H, P, D] or None).
    """
    cfg, g = model.cfg, model.graph
    B, _, P, D = writes.shape
    H = cfg.n_heads
    allowed = layer_masks(cfg, mask)
    rot = layer_rotary(model, model.positions(mask))
    for layer in range(cfg.n_layers):
        U = g.upstream_of_attention(layer)
        q0, k0, v0 = (t.detach() for t in out.qkv[layer])
        GA = pattern_grad(model, layer, head_grads[layer], v0)
        cols = {kind: torch.as_tensor([int(g.edge_offset[g.attention_receiver(layer, kind, h)]) for h in range(H)],
                                      device=scores.device) for kind in ("q", "k")}
        if GA is None:  # no gradient reaches this layer's patterns (e.g. its writes are dropped)
            for c in cols.values():
                scores[:, (c[:, None] + torch.arange(U, device=c.device)).flatten()] = 0.0
            continue
        ok = allowed[cfg.is_sliding(layer)]
        sinks = head_sinks(model.blocks[layer])  # GPT-OSS: the sink column of every pattern
        A0 = attention_pattern(cfg, q0, k0, ok, sinks)  # [B, H, P, P]
        x = out.resid_pre[layer].detach()
        live = (writes[:, :U] != 0).flatten(2).any(-1)  # [B, U]: a zero write changes nothing, exactly
        step = max(1, PATTERN_CHUNK // max(1, B * H * P * P))
        for s0 in range(0, U, step):
            us = slice(s0, min(U, s0 + step))
            u = us.stop - us.start
            xs = (x[:, None] + writes[:, us]).reshape(B * u, P, D)
            rows = None if rot is None else {k_: tuple(t.repeat_interleave(u, 0) for t in v_) for k_, v_ in rot.items()}
            qn, kn = _patched_qk(model, layer, xs, rows)  # [B*u, H, P, E]
            qn, kn = (t.reshape(B, u * H, P, -1) for t in (qn, kn))
            rep = lambda t: t[:, None].expand(B, u, H, *t.shape[2:]).reshape(B, u * H, *t.shape[2:])  # noqa: E731
            su = None if sinks is None else sinks.repeat(1, u, 1, 1)  # [1, u H, 1, 1], as the heads' order
            for kind, A in (("q", attention_pattern(cfg, qn, rep(k0), ok, su)),
                            ("k", attention_pattern(cfg, rep(q0), kn, ok, su))):
                d = ((A.view(B, u, H, P, P) - A0[:, None]) * GA[:, None]).sum((-1, -2))  # [B, u, H]
                d = d * live[:, us, None]
                idx = (cols[kind][None, :] + torch.arange(us.start, us.stop, device=scores.device)[:, None]).flatten()
                scores[:, idx] = d.reshape(B, u * H).to(scores.dtype)
