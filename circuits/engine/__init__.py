"""The engine behind :class:`circuitstat.circuits.model.CircuitModel`: one functional forward pass, in parts.

Each module holds one idea; the public class is assembled in :mod:`circuitstat.circuits.model`.

* :mod:`.config` -- ``ModelConfig`` and the allowed norms, positional schemes, MLPs, activations;
* :mod:`.weights` -- the uniform per-layer weights (``Block``), construction, state dict,
  weight hash, identity and ``save``;
* :mod:`.norms` -- every normalisation (forward) and its vector-Jacobian product;
* :mod:`.rotary` -- rotary inverse frequencies, cos/sin tables and their application;
* :mod:`.masks` -- which keys each query may attend to (causal, padding);
* :mod:`.attention` -- q/k/v projections, attention scores and mixing, one layer's attention;
* :mod:`.mlp` -- the MLP sender;
* :mod:`.run` -- ``CircuitModel.run`` and its stages (embed, attention, MLP, logits input);
* :mod:`.fused` -- the fused scaled-dot-product forward used in training;
* :mod:`.patching` -- edge and sender patches inside a run, and receivers patched with suffix
  recomputation (``patched_receiver_logits``, ``patched_layer_logits``);
* :mod:`.gradients` -- gradient probes and per-head receiver-input gradients.

A feature that changes how scores, masks, norms or rotary embeddings are computed changes the one
function that computes them here (:func:`.attention.attend`, :func:`.masks.allowed_keys`,
:func:`.norms.apply_norm` with :func:`.norms.norm_vjp_heads`, :mod:`.rotary`); every forward path
(full run, patched suffix, gradients) calls it.  Queries, keys and values are projected in three
forms, each followed by :func:`.rotary.apply_rotary`: :func:`.attention.attention_block` (full
runs), ``Patching._patched_layer`` / ``Patching._suffix_layer`` (patched suffixes) and
``FusedForward.fused_logits``; a transform of queries or keys sits beside each of those calls.  The
fused training forward uses torch's own attention, so ``has_fused_forward`` must exclude every
configuration it does not reproduce.

Where the families of circuitstat.circuits.convert put their features: soft-capping and query_pre_attn_scalar in
:func:`.attention.attend`; sliding windows per layer in :func:`.masks.allowed_keys` /
:func:`.masks.layer_masks`; Gemma's (1 + w) and OLMo 2's float32-weighted RMSNorms in
:func:`.norms.apply_norm` (VJPs :func:`.norms.norm_vjp_heads`, :func:`.norms.norm_vjp`; the post-norm
JVP :func:`.norms.norm_jvp`); rope scaling and Gemma 3's local schedule in :mod:`.rotary`; q/k norms
(per head, or over the whole projection) in :func:`.attention.qk_normalize`,
:func:`.attention.project_heads` and :func:`.attention.project_rows`, before rotary; norms on the
attention output before the residual add, and the edge definition they require, in :mod:`.run`
(module docstring), :func:`.patching.edge_delta` and ``Patching.sender_write_deltas``.

Granite's attention multiplier is in :func:`.attention.attention_pattern`, its embedding multiplier and
logits_scaling in ``Forward.token_embedding`` and ``Forward._unembed`` (its residual_multiplier is folded into the
weights at conversion); OLMo 1's clip_qkv clamp in :func:`.attention.qk_normalize` and
:func:`.attention.project_rows`, before q/k norms; SmolLM3's NoPE layers in :func:`.rotary.rotary_of_layer`, which
every caller of :func:`.rotary.apply_rotary` asks.
"""
