"""CircuitModel.run: one forward pass that patches, probes and keeps what it is asked to.

The forward pass keeps the residual stream equal to the sum of all sender outputs plus constant
biases, which is what makes edge interventions exact: a receiver's input is the stream plus the
deltas of the edges patched into it.

Where a family normalises the summed attention output before the residual add (Gemma 2/3's
post_attention_layernorm, OLMo 2; ``ModelConfig.post_norm``), one head's write is not additive.
There the layer's write is w_l = N_l(S_l) with S_l = Σ_h z_h + b_O, the senders stay the heads'
outputs z_h (before the norm), and the norm is part of every receiver's input, computed exactly
on the sum it sees: receiver v reads the stream with each upstream layer's write replaced by
N_l(S_l + Σ_{h patched into v} Δz_h), i.e. its input gains N_l(S_l + Σ Δz_h) - N_l(S_l) for the
heads of l whose edges into v are patched (and Δz_u as usual for the input and MLP senders, whose
post-norms are part of the sender).  Patching every out-edge of a head is patching the head
(its output replaced everywhere), all edges give the counterfactual run and no edge the clean one,
exactly; each edge's effect is computed on this definition by the exact method and is linearised
(J_N Δz_h) by the gradient methods (circuitstat.circuits.engine.patching.sender_write_deltas).  A run goes through its stages in order: set-up
(:meth:`Forward._run_setup`), the input sender or a saved suffix state (``_run_start``), per
layer the attention receivers and head senders (``_run_attention``) and the MLP receiver and
sender (``_run_mlp``), then the logits receiver (``_run_logits_input``) and the unembedding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from circuitstat.core.errors import InputError
from ..graph import ComponentGraph
from ..interventions import Intervention
from .attention import attention_block
from .config import ModelConfig
from .gradients import grad_probe
from .masks import layer_masks
from .mlp import mlp, mlp_parts
from .norms import apply_norm, post_norm
from .patching import edge_delta, patch_senders
from .rotary import layer_rotary, rotary_of_layer


@dataclass
class RunState:
    """Where a suffix run starts: the residual stream entering ``layer`` and the senders so far."""

    layer: int
    resid: torch.Tensor
    blocks: list[torch.Tensor] | None = None
    attn_pre: list[torch.Tensor] | None = None  # post-norm models: each earlier layer's S_l (edge patches)


@dataclass
class RunOutput:
    """Everything a forward pass was asked to keep."""

    logits: torch.Tensor | None
    blocks: list[torch.Tensor] | None = None
    resid_pre: list[torch.Tensor] = field(default_factory=list)
    resid_mid: list[torch.Tensor] = field(default_factory=list)
    patterns: list[torch.Tensor] = field(default_factory=list)
    grad_inputs: list[torch.Tensor] = field(default_factory=list)
    qkv: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    final_resid: torch.Tensor | None = None
    probed: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (layer, attention input)
    attn_pre: list[torch.Tensor] = field(default_factory=list)  # post-norm models: S_l = Σ_h z_h + b_O per layer

    @property
    def senders(self) -> torch.Tensor:
        """All sender outputs stacked, [B, U, P, D]."""
        if self.blocks is None:
            raise RuntimeError("sender outputs were not kept; run with keep_senders=True")
        return torch.cat(self.blocks, dim=1)


@dataclass
class _RunSetup:
    """What one CircuitModel.run patches, keeps and needs (derived once from its arguments)."""

    B: int
    P: int
    iv: Any  # the Intervention, or None
    edge_mask: torch.Tensor | None
    sender_mask: torch.Tensor | None
    cf: torch.Tensor | None
    edge_live: Any
    sender_live: Any
    need_blocks: bool
    per_head: bool
    sv: int | None
    rd: int | None
    rd_layer: int | None
    fast_last: bool
    logits_at: torch.Tensor | None
    keep_resid: bool
    keep_patterns: bool
    keep_qkv: bool
    receiver_grads: bool | str
    positions: torch.Tensor
    allowed: dict  # per layer kind (sliding or not): [B, 1, P, P]
    rot: dict | None  # per layer kind: rotary (cos, sin)
    keep_attn_pre: bool
    grad_gates: Any = None  # circuitstat.circuits.engine.gradients.GradientGates (AtP*'s GradDrop), or None


class Forward:
    """The forward pass of CircuitModel (mixed into it with the weights of :mod:`.weights`)."""

    cfg: ModelConfig
    graph: ComponentGraph
    blocks: nn.ModuleList

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, P, V] of a plain forward pass."""
        return self.run(input_ids, attention_mask).logits

    def token_embedding(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The token part of the ``input`` sender [..., D]: W_E rows (times Gemma's √d scale or Granite's
        embedding_multiplier)."""
        x = self.W_E[input_ids]
        if self.cfg.embed_scale is not None:
            # Gemma: the √d normaliser is a float32 tensor cast to the weights' dtype (HF's
            # Gemma2TextScaledWordEmbedding), so bf16 models scale by the rounded value, as HF does
            x = x * torch.tensor(self.cfg.embed_scale, dtype=torch.float32, device=x.device).to(x.dtype)
        if self.cfg.embed_multiplier is not None:  # GraniteModel: inputs_embeds * embedding_multiplier
            x = x * self.cfg.embed_multiplier
        return x

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The ``input`` sender's output: token (+ learned position) embeddings [B, P, D]."""
        x = self.token_embedding(input_ids)
        if self.cfg.positional == "learned":
            # positions never exceed P - 1: only longer inputs need the (host-synchronising) check
            if positions.shape[-1] > self.cfg.n_ctx and int(positions.max()) >= self.cfg.n_ctx:
                raise InputError(
                    f"sequence of length {int(positions.max()) + 1} exceeds the model's context "
                    f"n_ctx={self.cfg.n_ctx}; use shorter prompts"
                )
            x = x + self.W_pos[positions]
        return x

    def position_embedding(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The learned position part of the ``input`` sender [B, P, D] (zeros without one)."""
        B, P = attention_mask.shape
        if self.cfg.positional != "learned":
            return torch.zeros(B, P, self.cfg.d_model, dtype=self.dtype, device=self.device)
        return self.W_pos[self.positions(attention_mask.to(self.device))]

    @staticmethod
    def positions(attention_mask: torch.Tensor) -> torch.Tensor:
        """Position ids from an attention mask: counting real tokens, so left padding works too."""
        return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)

    def _unembed(self, x: torch.Tensor) -> torch.Tensor:
        """Logits from final residual vectors [..., D] (divided by Granite's logits_scaling, multiplied by Cohere's
        logit_scale; tanh soft-capped where the model does: Gemma)."""
        logits = apply_norm(self.cfg, x, self.lnf_w, self.lnf_b) @ self.unembed + self.b_U
        if self.cfg.logits_scaling is not None:  # GraniteForCausalLM: logits / logits_scaling
            logits = logits / self.cfg.logits_scaling
        if self.cfg.logit_scale is not None:  # Cohere: CohereForCausalLM's logits * logit_scale
            logits = logits * self.cfg.logit_scale
        cap = self.cfg.logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def run(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        intervention: Intervention | None = None,
        state: RunState | None = None,
        keep_senders: bool = False,
        keep_resid: bool = False,
        keep_patterns: bool = False,
        receiver_grads: bool | str = False,
        compute_logits: bool = True,
        logits_at: torch.Tensor | None = None,
        keep_qkv: bool = False,
        positions: torch.Tensor | None = None,
        grad_gates=None,
    ) -> RunOutput:
        """Run the model, optionally from a saved state, with interventions; return what was asked.

        ``receiver_grads=True`` adds zero tensors to every receiver input and returns them in
        ``grad_inputs`` (per layer ``[B, 3, H, P, D]`` for q/k/v and ``[B, P, D]`` for the MLP,
        then ``[B, P, D]`` for logits), so one ``torch.autograd.grad`` gives every receiver's
        gradient.  ``receiver_grads="projected"`` gives the same gradients cheaper: the probes sit on
        the heads' q/k/v (widths d_head, not d_model, and no per-head normalisation in the forward
        or backward pass) and :meth:`receiver_input_grads` maps their gradients back to the
        receiver inputs (edge interventions and receiver patches fall back to input probes).
        ``logits_at`` [B] computes logits only at one position per row ([B, V]),
        which is all a metric read at the last real token needs.
        ``positions`` [B, P]: position ids (learned and rotary embeddings) in place of those counted
        from ``attention_mask``, so a key can be masked without shifting later tokens' positions
        (token mask ablation); a masked position still attends to itself (see
        :func:`circuitstat.circuits.engine.masks.allowed_keys`).
        ``grad_gates`` (a :class:`circuitstat.circuits.engine.gradients.GradientGates`): each layer's residual writes
        pass through its gate, which can drop their gradient in a later backward (AtP*'s GradDrop).
        """
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        attention_mask = attention_mask.to(input_ids.device)
        r = self._run_setup(input_ids, attention_mask, intervention, positions, logits_at=logits_at,
                            keep_senders=keep_senders, keep_resid=keep_resid, keep_patterns=keep_patterns,
                            receiver_grads=receiver_grads, keep_qkv=keep_qkv)
        r.grad_gates = grad_gates
        out = RunOutput(logits=None, blocks=[] if r.need_blocks else None)
        start, resid = self._run_start(input_ids, r, state, out)
        for layer in range(start, self.cfg.n_layers):
            resid, mid = self._run_attention(layer, resid, r, out)
            resid = self._run_mlp(layer, resid, mid, r, out) if self.cfg.has_mlp else mid
        out.final_resid = self._run_logits_input(resid, r, out)
        if compute_logits:
            final = out.final_resid
            if final.shape[1] == 1 and r.fast_last:
                x = final[:, 0]
            else:
                x = final if logits_at is None else final[torch.arange(r.B, device=final.device), logits_at]
            out.logits = self._unembed(x)
        return out

    def _run_setup(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, iv: Intervention | None,
                   positions: torch.Tensor | None, *, logits_at, keep_senders: bool, keep_resid: bool,
                   keep_patterns: bool, receiver_grads: bool | str, keep_qkv: bool) -> _RunSetup:
        """What one run patches, keeps and needs, derived once from its arguments (see :meth:`run`)."""
        cfg, graph = self.cfg, self.graph
        B, P = input_ids.shape
        if iv is not None:
            iv.validate(graph.n_edges, graph.n_senders)
        edge_mask = None if iv is None else iv.edge_mask
        sender_mask = None if iv is None else iv.sender_mask
        if edge_mask is not None and edge_mask.dim() == 1:
            edge_mask = edge_mask[None].expand(B, -1)
        if sender_mask is not None and sender_mask.dim() == 1:
            sender_mask = sender_mask[None].expand(B, -1)
        need_blocks = keep_senders or edge_mask is not None
        sv = None if iv is None else iv.sender
        per_head = need_blocks or sender_mask is not None or sv is not None
        rd = iv.receiver if iv is not None else None
        if positions is None:
            positions = self.positions(attention_mask)
        elif positions.shape != input_ids.shape:
            raise InputError(f"positions must have the shape of input_ids {tuple(input_ids.shape)}, "
                             f"got {tuple(positions.shape)}")
        else:
            positions = positions.to(input_ids.device)
            if cfg.positional == "learned" and not 0 <= int(positions.min()) <= int(positions.max()) < cfg.n_ctx:
                raise InputError(f"positions must lie in [0, n_ctx={cfg.n_ctx}); pass ids counted from 0")
        if cfg.rope_max_positions is not None and P > cfg.rope_max_positions:
            kind = (cfg.rope or {}).get("rope_type", "default")
            raise InputError(
                f"prompts of {P} tokens exceed {cfg.rope_max_positions}, beyond which this model's {kind!r} rotary "
                "frequencies depend on the batch's sequence length in transformers (not reproduced); use prompts of "
                f"at most {cfg.rope_max_positions} tokens")
        return _RunSetup(
            B=B, P=P, iv=iv, edge_mask=edge_mask, sender_mask=sender_mask,
            cf=None if iv is None else iv.counterfactual,
            # which edges/senders any row patches: one host transfer per run, not one per layer
            edge_live=None if edge_mask is None else edge_mask.ne(0).any(0).cpu().numpy(),
            sender_live=None if sender_mask is None else sender_mask.ne(0).any(0).cpu().numpy(),
            need_blocks=need_blocks, per_head=per_head, sv=sv, rd=rd,
            rd_layer=int(graph.receiver_layer[rd]) if rd is not None else None,
            # With nothing kept and no intervention, the last layer only matters at the read-out
            # positions: queries, mixing and the MLP run there alone.
            fast_last=(logits_at is not None and iv is None and not (per_head or receiver_grads or keep_resid
                       or keep_patterns or keep_qkv)),
            logits_at=logits_at, keep_resid=keep_resid, keep_patterns=keep_patterns, keep_qkv=keep_qkv,
            receiver_grads=receiver_grads, positions=positions, allowed=layer_masks(cfg, attention_mask),
            rot=layer_rotary(self, positions),
            keep_attn_pre=cfg.post_norm and (need_blocks or keep_resid or bool(receiver_grads)))

    def _run_start(self, input_ids: torch.Tensor, r: _RunSetup, state: RunState | None,
                   out: RunOutput) -> tuple[int, torch.Tensor]:
        """(first layer, residual entering it): the (patched) input sender, or a saved suffix state."""
        if state is None:
            z_in = self.embed(input_ids, r.positions)
            if r.sender_mask is not None:
                z_in = patch_senders(z_in[:, None], r.sender_mask, r.cf, 0, r.sender_live)[:, 0]
            if r.sv == 0:
                z_in = r.iv.sender_value.to(z_in.dtype)
            if r.need_blocks:
                out.blocks.append(z_in[:, None])
            start, resid = 0, z_in
        else:
            start, resid = state.layer, state.resid
            if r.need_blocks:
                if state.blocks is None and r.edge_mask is not None:
                    raise ValueError("an edge intervention on a suffix run needs the state's sender blocks")
                out.blocks.extend(state.blocks or [])
            if r.keep_attn_pre:
                if state.attn_pre is None and r.edge_mask is not None:
                    raise ValueError("an edge intervention on a suffix run of a post-norm model needs the state's attn_pre")
                out.attn_pre.extend(state.attn_pre or [])
        if r.rd is not None and r.rd_layer < start:
            raise ValueError("a receiver intervention upstream of the run's start layer has no effect")
        return start, resid

    def _run_attention(self, layer: int, resid: torch.Tensor, r: _RunSetup, out: RunOutput
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual entering ``layer``, residual after its attention): the receivers' patches and
        probes, the head senders; in a fast last layer both at the read-out position only."""
        cfg, graph, blk, B, P = self.cfg, self.graph, self.blocks[layer], r.B, r.P
        if r.keep_resid:
            out.resid_pre.append(resid)
        dense = None
        if r.edge_mask is not None:
            dense = edge_delta(self, r.edge_mask, r.cf, out.blocks, layer, graph.upstream_of_attention(layer),
                               True, r.edge_live, out.attn_pre)
        probes = None
        if r.receiver_grads == "projected" and dense is None and r.rd is None:
            probes = tuple(grad_probe((B, cfg.n_heads, P, cfg.d_head), resid) for _ in range(3))
            out.grad_inputs.extend(probes)
            out.probed.append((layer, resid))
        elif r.receiver_grads:
            g = grad_probe((B, 3, cfg.n_heads, P, cfg.d_model), resid)
            out.grad_inputs.append(g)
            dense = g if dense is None else dense + g
        sparse = None
        if r.rd is not None and r.rd_layer == layer and r.rd != graph.mlp_receiver_safe(layer):
            local = r.rd - layer * graph.receivers_per_layer
            sparse = (local // cfg.n_heads, local % cfg.n_heads, r.iv.receiver_delta)
        q_at = r.logits_at if r.fast_last and layer == cfg.n_layers - 1 else None
        sliding = cfg.is_sliding(layer)
        z, attn_out, pattern = attention_block(cfg, blk, resid, dense, sparse, r.allowed[sliding],
                                               rotary_of_layer(cfg, r.rot, layer), r.per_head,
                                               q_at=q_at, keep=out.qkv if r.keep_qkv else None, probes=probes)
        if q_at is not None:  # from here on only the read-out position of each row
            resid = resid[torch.arange(B, device=resid.device), q_at][:, None]
        if r.keep_patterns:
            out.patterns.append(pattern)
        if r.per_head:
            attn_out = self._head_senders(layer, z, r, out) + blk.b_O
        if cfg.post_norm:  # the layer writes N(S), S the summed (patched) head outputs + b_O
            if r.keep_attn_pre:
                out.attn_pre.append(attn_out)
            attn_out = post_norm(cfg, blk.ln1_post_w, attn_out)
        if r.grad_gates is not None:
            attn_out = r.grad_gates.gate(attn_out, layer)
        mid = resid + attn_out
        if r.keep_resid:
            out.resid_mid.append(mid)
        return resid, mid

    def _head_senders(self, layer: int, z: torch.Tensor, r: _RunSetup, out: RunOutput) -> torch.Tensor:
        """The attention output without bias from the per-head outputs ``z`` [B, H, P, D], patched."""
        if r.sender_mask is not None:
            z = patch_senders(z, r.sender_mask, r.cf, self.graph.head_sender(layer, 0), r.sender_live)
        first = self.graph.head_sender(layer, 0)
        if r.sv is not None and first <= r.sv < first + self.cfg.n_heads:
            h = r.sv - first
            z = torch.cat((z[:, :h], r.iv.sender_value[:, None].to(z.dtype), z[:, h + 1 :]), dim=1)
        if r.need_blocks:
            out.blocks.append(z)
        return z.sum(1)

    def _run_mlp(self, layer: int, resid: torch.Tensor, mid: torch.Tensor, r: _RunSetup,
                 out: RunOutput) -> torch.Tensor:
        """The residual leaving ``layer``: its MLP receiver's patches and probe, its MLP sender."""
        cfg, graph, blk = self.cfg, self.graph, self.blocks[layer]
        mlp_in = resid if cfg.parallel else mid
        if r.edge_mask is not None:
            d = edge_delta(self, r.edge_mask, r.cf, out.blocks, layer, graph.upstream_of_mlp(layer), False,
                           r.edge_live, out.attn_pre)
            if d is not None:
                mlp_in = mlp_in + d
        if r.receiver_grads:
            g = grad_probe((r.B, r.P, cfg.d_model), resid)
            out.grad_inputs.append(g)
            mlp_in = mlp_in + g
        if r.rd is not None and r.rd == graph.mlp_receiver_safe(layer):
            mlp_in = mlp_in + r.iv.receiver_delta
        if graph.mlp_count(layer) > 1:  # experts as nodes: one sender per expert
            z_mlp = self._expert_senders(layer, mlp_in, r, out)
        else:
            z_mlp = mlp(cfg, blk, mlp_in)
            if r.sender_mask is not None:
                z_mlp = patch_senders(z_mlp[:, None], r.sender_mask, r.cf, graph.mlp_sender(layer), r.sender_live)[:, 0]
            if r.sv is not None and r.sv == graph.mlp_sender(layer):
                z_mlp = r.iv.sender_value.to(z_mlp.dtype)
            if r.need_blocks:
                out.blocks.append(z_mlp[:, None])
        return mid + (z_mlp if r.grad_gates is None else r.grad_gates.gate(z_mlp, layer))

    def _expert_senders(self, layer: int, mlp_in: torch.Tensor, r: _RunSetup, out: RunOutput) -> torch.Tensor:
        """A split MoE layer's write for input ``mlp_in``, its expert senders patched and kept.

        Unpatched, the write is the block's output as the unsplit layer computes it (bit for bit, so the
        suffix recomputation's :func:`mlp` agrees with it); patched senders add their (new - own) writes."""
        cfg, graph, blk = self.cfg, self.graph, self.blocks[layer]
        if not r.per_head:
            return mlp(cfg, blk, mlp_in)
        write, parts = mlp_parts(cfg, blk, mlp_in)  # [B, P, D], [B, n, P, D]
        first, n = graph.mlp_sender(layer), graph.mlp_count(layer)
        new = parts
        if r.sender_mask is not None:
            new = patch_senders(parts, r.sender_mask, r.cf, first, r.sender_live)
        if r.sv is not None and first <= r.sv < first + n:
            j = r.sv - first
            new = torch.cat((new[:, :j], r.iv.sender_value[:, None].to(new.dtype), new[:, j + 1:]), dim=1)
        if new is not parts:
            write = write + (new - parts).sum(1)
        if r.need_blocks:
            out.blocks.append(new)
        return write

    def _run_logits_input(self, resid: torch.Tensor, r: _RunSetup, out: RunOutput) -> torch.Tensor:
        """The logits receiver's input: the final residual with its edge patches, probe and receiver patch."""
        graph, final = self.graph, resid
        if r.edge_mask is not None:
            d = edge_delta(self, r.edge_mask, r.cf, out.blocks, self.cfg.n_layers, graph.n_senders, False,
                           r.edge_live, out.attn_pre)
            if d is not None:
                final = final + d
        if r.receiver_grads:
            g = grad_probe((r.B, r.P, self.cfg.d_model), resid)
            out.grad_inputs.append(g)
            final = final + g
        if r.rd is not None and r.rd == graph.logits_receiver:
            final = final + r.iv.receiver_delta
        return final
