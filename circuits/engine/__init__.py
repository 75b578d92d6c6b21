"""The engine behind :class:`circuits.model.CircuitModel`: one functional forward pass, in parts.

Each module holds one idea; the public class is assembled in :mod:`circuits.model`.

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
function that computes them here; every forward path (full run, patched suffix, gradients) calls
it.  The fused training forward (:mod:`.fused`) uses torch's own attention and says through
``has_fused_forward`` which configurations it covers.
"""
