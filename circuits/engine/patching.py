"""Patching: edge and sender patches inside a run, and receivers patched by suffix recomputation.

* :func:`edge_delta` and :func:`patch_senders` apply an Intervention's edge and sender masks in
  :meth:`CircuitModel.run <circuitstat.circuits.engine.run.Forward.run>`;
* :class:`Patching` gives the logits when one receiver's input changes, recomputing only what
  changes: an intervention at a receiver of layer L leaves layers < L and every position before
  the first changed one as they were in the clean run, so only a window of positions of the
  suffix from L is recomputed, many rows (receivers x examples) in one batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..graph import ComponentGraph
from .attention import attend, head_sinks, project_rows, project_shared, qk_normalize
from .config import ModelConfig
from .masks import layer_masks
from .mlp import mlp
from .norms import attn_input_norm, norm_jvp, post_norm
from .rotary import apply_rotary, layer_rotary, rotary_of_layer


def edge_delta(model, mask, cf, blocks, layer, n_up, attention: bool, live, attn_pre=()):
    """Sum over patched upstream edges of (counterfactual − current) for one layer's receivers.

    Post-norm models (see circuitstat.circuits.engine.run): the heads of each upstream layer l contribute
    N_l(S_l + Σ_h m_h Δz_h) − N_l(S_l) per receiver instead of Σ_h m_h Δz_h (``attn_pre``: the run's S_l).
    """
    graph, cfg = model.graph, model.cfg
    if attention:
        r0 = graph.attention_receiver(layer, "q", 0)
        off = int(graph.edge_offset[r0])
        R = 3 * cfg.n_heads
    else:
        r0 = graph.mlp_receiver(layer) if layer < cfg.n_layers else graph.logits_receiver
        off = int(graph.edge_offset[r0])
        R = 1
    width = R * n_up
    if not live[off : off + width].any():  # host copy of the mask's nonzero columns
        return None
    m = mask[:, off : off + width]
    cur = torch.cat(blocks, dim=1)[:, :n_up]
    diff = cf[:, :n_up].to(cur.dtype) - cur  # broadcasts over mean/zero counterfactuals
    m = m.to(cur.dtype).reshape(-1, R, n_up)
    B, _, P, D = diff.shape
    shape = (B, 3, cfg.n_heads, P, D) if attention else (B, P, D)
    if cfg.additive_writes:
        # one batched matmul [B, R, u] x [B, u, P*D] (an einsum here copied both operands)
        return torch.bmm(m.expand(B, -1, -1), diff.reshape(B, n_up, P * D)).reshape(shape)
    heads = torch.zeros(n_up, dtype=torch.bool)
    groups = []
    for l in range(cfg.n_layers):
        first = graph.head_sender(l, 0)
        if first + cfg.n_heads <= n_up:
            heads[first : first + cfg.n_heads] = True
            groups.append((l, first))
    keep = (~heads).to(device=m.device, dtype=m.dtype)
    out = torch.bmm((m * keep).expand(B, -1, -1), diff.reshape(B, n_up, P * D)).view(B, R, P, D)
    cols_live = live[off : off + width].reshape(R, n_up)
    for l, first in groups:
        cols = slice(first, first + cfg.n_heads)
        if not cols_live[:, cols].any():
            continue
        hd = torch.bmm(m[:, :, cols].expand(B, -1, -1), diff[:, cols].reshape(B, cfg.n_heads, P * D)).view(B, R, P, D)
        S = attn_pre[l][:, None]  # [B, 1, P, D]
        w = model.blocks[l].ln1_post_w
        out = out + (post_norm(cfg, w, S + hd) - post_norm(cfg, w, S))
    return out.reshape(shape)


def patch_senders(z, mask, cf, first, live):
    """Replace the masked senders in block ``z`` [B, n, P, D] (senders first..first+n) by cf."""
    n = z.shape[1]
    if not live[first : first + n].any():  # host copy of the mask's nonzero columns
        return z
    m = mask[:, first : first + n].to(z.dtype)
    c = cf[:, first : first + n].to(z.dtype)
    return z + m[:, :, None, None] * (c - z)


@dataclass
class _Window:
    """Rows and positions a patched suffix recomputes (see Patching.patched_layer_logits)."""

    rows: torch.Tensor  # [R] example of the clean run each row patches
    start: int  # first recomputed position; earlier ones keep their clean values
    end: int  # one past the last position any read-out needs
    at: torch.Tensor  # [R] read-out position inside the window
    allowed: dict  # per layer kind (sliding or not): [R, 1, T, end] attention of window queries over all keys
    rot: dict | None  # per layer kind: rotary cos/sin [R, 1, T, dim] at window positions


class Patching:
    """Receivers patched with suffix recomputation (mixed into CircuitModel, which runs the
    clean pass these methods start from)."""

    cfg: ModelConfig
    graph: ComponentGraph
    blocks: nn.ModuleList

    def patched_receiver_logits(self, clean, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                receiver: int, rows: torch.Tensor, delta: torch.Tensor,
                                last: torch.Tensor) -> torch.Tensor:
        """Logits [R, V] at ``last`` when ``delta`` [R, P, D] is added to ``receiver``'s input.

        Row i is example ``rows[i]`` of the clean run ``clean`` (kept with keep_senders,
        keep_resid and keep_qkv); ``input_ids`` is unused (kept for callers).  One receiver's
        case of :meth:`patched_layer_logits`, equal to a full run with Intervention.at_receiver.
        """
        g = self.graph
        layer = int(g.receiver_layer[receiver])
        local = None
        if layer < self.cfg.n_layers and receiver != g.mlp_receiver_safe(layer):
            local = torch.full((rows.shape[0],), receiver - layer * g.receivers_per_layer, device=rows.device)
        return self.patched_layer_logits(clean, attention_mask, layer, local, rows, delta, last)

    def patched_layer_logits(self, clean, attention_mask: torch.Tensor, layer: int,
                             local: torch.Tensor | None, rows: torch.Tensor, delta: torch.Tensor,
                             last: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Logits [R, V] at ``last`` [R] when row i adds ``delta[i]`` to one receiver of ``layer``.

        ``local[i]`` = kind * H + head picks the q (kind 0), k (1) or v (2) input of a head of
        ``layer``; ``local=None`` means the layer's MLP input (or logits when layer = n_layers).
        Row i is example ``rows[i]`` of ``clean`` (a run kept with keep_senders, keep_resid and
        keep_qkv).  ``delta`` [R, T, D] covers positions start .. start+T-1: the caller
        guarantees the delta is zero before ``start`` and that every read-out lies in that
        window, so (attention being causal) every position before ``start`` keeps its clean
        value in every layer: its keys and values are reused from ``clean``, and only the T
        window positions are recomputed, in the last layer only at the read-out.  Rows may mix
        receivers of one layer, so all of a layer's receivers share one batched suffix.
        """
        cfg = self.cfg
        R, T, _ = delta.shape
        end = start + T
        ar = torch.arange(R, device=delta.device)
        at = last - start  # read-out position inside the window
        if layer == cfg.n_layers:
            return self._unembed(clean.final_resid[rows, last] + delta[ar, at])
        mask = attention_mask[rows, :end]
        # [R, 1, T, end] per layer kind: window queries over all keys
        allowed = {k: a[:, :, start:] for k, a in layer_masks(cfg, mask).items()}
        window = _Window(rows, start, end, at, allowed, layer_rotary(self, self.positions(mask)[:, start:]))
        resid = self._patched_layer(clean, layer, local, delta, window)
        for later in range(layer + 1, cfg.n_layers):
            resid = self._suffix_layer(clean, later, resid, window)
        return self._unembed(resid)

    def _patched_layer(self, clean, layer: int, local: torch.Tensor | None, delta: torch.Tensor,
                       w: _Window) -> torch.Tensor:
        """The residual leaving ``layer`` [R, T, D] (the last layer: [R, D] at the read-out)."""
        cfg, blk = self.cfg, self.blocks[layer]
        last_layer = layer == cfg.n_layers - 1
        rows, s, e = w.rows, w.start, w.end
        ar = torch.arange(rows.shape[0], device=delta.device)
        pre = clean.resid_pre[layer][rows, s:e]
        mid = clean.resid_mid[layer][rows, s:e]
        at_read = (lambda t: t[ar, w.at]) if last_layer else (lambda t: t)  # noqa: E731
        if local is None:  # the MLP input
            base = pre if cfg.parallel else mid
            return at_read(mid) + mlp(cfg, blk, at_read(base) + at_read(delta))
        H = cfg.n_heads
        kind, h = local // H, local % H
        sliding = cfg.is_sliding(layer)
        new = project_rows(cfg, blk, attn_input_norm(cfg, blk, pre + delta), local)  # [R, T, E]
        rot = rotary_of_layer(cfg, w.rot, layer)
        if rot is not None:
            cos, sin = rot
            turned = apply_rotary(cfg, new, cos[:, 0], sin[:, 0])
            new = torch.where((kind < 2)[:, None, None], turned, new)
        q, k, v = (t[rows, h, :e] for t in clean.qkv[layer])  # [R, e, E]

        def patched(t: torch.Tensor, i: int) -> torch.Tensor:  # window positions replaced where kind == i
            tail = torch.where((kind == i)[:, None, None], new, t[:, s:])
            return torch.cat((t[:, :s], tail), dim=1) if s else tail

        q, k, v = patched(q, 0)[:, s:], patched(k, 1), patched(v, 2)
        allowed = w.allowed[sliding]
        if last_layer:
            q, allowed = q[ar, w.at][:, None], allowed[ar, :, w.at][:, :, None]
        _, zc = attend(cfg, q[:, None], k[:, None], v[:, None], allowed, head_sinks(blk, h))
        out_h = torch.bmm(zc[:, 0], blk.W_O[h])  # [R, Tq, D]
        head_block = 1 + layer * (2 if cfg.has_mlp else 1)  # clean.blocks: input, then per layer heads (, MLP)
        z_clean = at_read(clean.blocks[head_block][rows, h, s:e])
        out_h = out_h.squeeze(1) if last_layer else out_h
        if cfg.post_norm:  # the layer's write N(S) recomputed on S with this head's output replaced
            S = at_read(clean.attn_pre[layer][rows, s:e])
            mid = at_read(pre) + post_norm(cfg, blk.ln1_post_w, S - z_clean + out_h)
        else:
            mid = at_read(mid) + out_h - z_clean
        if not cfg.has_mlp:
            return mid
        if cfg.parallel:  # the MLP read the layer input, which did not change
            if self.graph.mlp_count(layer) > 1:  # experts as nodes: the block's write, as the clean run's
                return mid + mlp(cfg, blk, at_read(pre))
            return mid + at_read(clean.blocks[head_block + 1][rows, 0, s:e])
        return mid + mlp(cfg, blk, mid)

    def _suffix_layer(self, clean, layer: int, resid: torch.Tensor, w: _Window) -> torch.Tensor:
        """One unpatched layer on window residuals [R, T, D], reusing clean keys/values before it."""
        cfg, blk = self.cfg, self.blocks[layer]
        R = resid.shape[0]
        sliding = cfg.is_sliding(layer)
        q, k, v = project_shared(cfg, blk, attn_input_norm(cfg, blk, resid))  # [R, H, T, E]
        q, k, v = qk_normalize(cfg, blk, q, 0), qk_normalize(cfg, blk, k, 1), qk_normalize(cfg, blk, v, 2)
        rot = rotary_of_layer(cfg, w.rot, layer)
        if rot is not None:
            q, k = apply_rotary(cfg, q, *rot), apply_rotary(cfg, k, *rot)
        if w.start:
            ck, cv = clean.qkv[layer][1], clean.qkv[layer][2]
            k = torch.cat((ck[w.rows, :, : w.start], k), dim=2)
            v = torch.cat((cv[w.rows, :, : w.start], v), dim=2)
        allowed = w.allowed[sliding]
        if layer == cfg.n_layers - 1:  # from here on only the read-out position
            ar = torch.arange(R, device=resid.device)
            q, allowed, resid = q[ar, :, w.at][:, :, None], allowed[ar, :, w.at][:, :, None], resid[ar, w.at][:, None]
        _, zc = attend(cfg, q, k, v, allowed, head_sinks(blk))
        Tq, H, E = zc.shape[2], cfg.n_heads, cfg.d_head
        attn = torch.addmm(blk.b_O, zc.transpose(1, 2).reshape(R * Tq, H * E), blk.W_O.reshape(H * E, -1))
        attn = attn.view(R, Tq, -1)
        mid = resid + (post_norm(cfg, blk.ln1_post_w, attn) if cfg.post_norm else attn)
        if cfg.has_mlp:
            mid = mid + mlp(cfg, blk, resid if cfg.parallel else mid)
        return mid[:, 0] if layer == cfg.n_layers - 1 else mid

    def sender_write_deltas(self, run, dz: torch.Tensor, linear: bool = False) -> torch.Tensor:
        """What each sender's Δz changes in the residual of every receiver it feeds, [B, U, P, D].

        ``dz`` = z(counterfactual) − z(clean) [B, U, P, D] of the run ``run`` (kept with keep_senders
        and, on post-norm models, its attn_pre); returned as it is for additive models.  On post-norm
        models (circuitstat.circuits.engine.run) head h of layer l writes N_l(S_l + Δz_h) − N_l(S_l) (exact patching),
        or with ``linear`` its first-order term J_N(S_l) Δz_h (the gradient methods: the Taylor term of
        that exact effect).  ``dz`` is overwritten with the result when its dtype allows.
        """
        cfg, g = self.cfg, self.graph
        if cfg.additive_writes:
            return dz
        P = dz.shape[2]
        out = dz if (not linear or dz.dtype == torch.promote_types(dz.dtype, torch.float32)) else dz.float()
        for layer in range(cfg.n_layers):
            cols = slice(g.head_sender(layer, 0), g.head_sender(layer, 0) + cfg.n_heads)
            S = run.attn_pre[layer][:, None, :P].detach()
            w = self.blocks[layer].ln1_post_w
            d = dz[:, cols]
            if linear:
                new = norm_jvp(cfg, S, w, d)
            else:
                new = post_norm(cfg, w, S + d) - post_norm(cfg, w, S)
            out[:, cols] = new.to(out.dtype)
        return out
