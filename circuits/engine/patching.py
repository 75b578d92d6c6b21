"""Patching: edge and sender patches inside a run, and receivers patched by suffix recomputation.

* :func:`edge_delta` and :func:`patch_senders` apply an Intervention's edge and sender masks in
  :meth:`CircuitModel.run <circuits.engine.run.Forward.run>`;
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
from .attention import attend, project_shared
from .config import ModelConfig
from .masks import allowed_keys
from .mlp import mlp
from .norms import apply_norm
from .rotary import apply_rotary, rotary_tables


def edge_delta(graph: ComponentGraph, cfg: ModelConfig, mask, cf, blocks, layer, n_up, attention: bool, live):
    """Sum over patched upstream edges of (counterfactual − current) for one layer's receivers."""
    if attention:
        r0 = graph.attention_receiver(layer, "q", 0)
        off = int(graph.edge_offset[r0])
        width = 3 * cfg.n_heads * n_up
    else:
        r0 = graph.mlp_receiver(layer) if layer < cfg.n_layers else graph.logits_receiver
        off = int(graph.edge_offset[r0])
        width = n_up
    if not live[off : off + width].any():  # host copy of the mask's nonzero columns
        return None
    m = mask[:, off : off + width]
    cur = torch.cat(blocks, dim=1)[:, :n_up]
    diff = cf[:, :n_up].to(cur.dtype) - cur  # broadcasts over mean/zero counterfactuals
    m = m.to(cur.dtype)
    B, _, P, D = diff.shape
    flat = diff.reshape(B, n_up, P * D)
    # one batched matmul [B, R, u] x [B, u, P*D] (an einsum here copied both operands)
    if attention:
        return torch.bmm(m.reshape(B, 3 * cfg.n_heads, n_up), flat).reshape(B, 3, cfg.n_heads, P, D)
    return torch.bmm(m[:, None, :], flat).reshape(B, P, D)


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
    allowed: torch.Tensor  # [R, 1, T, end] attention of window queries over all keys
    rot: tuple[torch.Tensor, torch.Tensor] | None  # rotary cos/sin [R, 1, T, dim] at window positions


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
        allowed = allowed_keys(mask)[:, :, start:]  # [R, 1, T, end]: window queries over all keys
        rot = None
        if cfg.positional == "rotary":
            cos, sin = rotary_tables(self.inv_freq, self.positions(mask)[:, start:])
            rot = (cos, sin)
        window = _Window(rows, start, end, at, allowed, rot)
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
        W = torch.stack((blk.W_Q, blk.W_K, blk.W_V)).flatten(0, 1)[local]  # [R, D, E]: each row's own head
        b = torch.stack((blk.b_Q, blk.b_K, blk.b_V)).flatten(0, 1)[local]
        new = torch.baddbmm(b[:, None], apply_norm(cfg, pre + delta, blk.ln1_w, blk.ln1_b), W)
        if w.rot is not None:
            turned = apply_rotary(cfg, new, w.rot[0][:, 0], w.rot[1][:, 0])
            new = torch.where((kind < 2)[:, None, None], turned, new)
        q, k, v = (t[rows, h, :e] for t in clean.qkv[layer])  # [R, e, E]

        def patched(t: torch.Tensor, i: int) -> torch.Tensor:  # window positions replaced where kind == i
            tail = torch.where((kind == i)[:, None, None], new, t[:, s:])
            return torch.cat((t[:, :s], tail), dim=1) if s else tail

        q, k, v = patched(q, 0)[:, s:], patched(k, 1), patched(v, 2)
        allowed = w.allowed
        if last_layer:
            q, allowed = q[ar, w.at][:, None], allowed[ar, :, w.at][:, :, None]
        _, zc = attend(cfg, q[:, None], k[:, None], v[:, None], allowed)
        out_h = torch.bmm(zc[:, 0], blk.W_O[h])  # [R, Tq, D]
        head_block = 1 + layer * (2 if cfg.has_mlp else 1)  # clean.blocks: input, then per layer heads (, MLP)
        z_clean = at_read(clean.blocks[head_block][rows, h, s:e])
        mid = at_read(mid) + out_h.squeeze(1) - z_clean if last_layer else mid + out_h - z_clean
        if not cfg.has_mlp:
            return mid
        if cfg.parallel:  # the MLP read the layer input, which did not change
            return mid + at_read(clean.blocks[head_block + 1][rows, 0, s:e])
        return mid + mlp(cfg, blk, mid)

    def _suffix_layer(self, clean, layer: int, resid: torch.Tensor, w: _Window) -> torch.Tensor:
        """One unpatched layer on window residuals [R, T, D], reusing clean keys/values before it."""
        cfg, blk = self.cfg, self.blocks[layer]
        R = resid.shape[0]
        norm = apply_norm(cfg, resid, blk.ln1_w, blk.ln1_b)
        q, k, v = project_shared(cfg, blk, norm)  # [R, H, T, E]
        if w.rot is not None:
            q, k = apply_rotary(cfg, q, *w.rot), apply_rotary(cfg, k, *w.rot)
        if w.start:
            ck, cv = clean.qkv[layer][1], clean.qkv[layer][2]
            k = torch.cat((ck[w.rows, :, : w.start], k), dim=2)
            v = torch.cat((cv[w.rows, :, : w.start], v), dim=2)
        allowed = w.allowed
        if layer == cfg.n_layers - 1:  # from here on only the read-out position
            ar = torch.arange(R, device=resid.device)
            q, allowed, resid = q[ar, :, w.at][:, :, None], allowed[ar, :, w.at][:, :, None], resid[ar, w.at][:, None]
        _, zc = attend(cfg, q, k, v, allowed)
        Tq, H, E = zc.shape[2], cfg.n_heads, cfg.d_head
        attn = torch.addmm(blk.b_O, zc.transpose(1, 2).reshape(R * Tq, H * E), blk.W_O.reshape(H * E, -1))
        mid = resid + attn.view(R, Tq, -1)
        if cfg.has_mlp:
            mid = mid + mlp(cfg, blk, resid if cfg.parallel else mid)
        return mid[:, 0] if layer == cfg.n_layers - 1 else mid
