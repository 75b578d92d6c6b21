"""Conversion of the mixture-of-experts families' MoE blocks (circuitstat.circuits.engine.moe).

The attention, norms and rotary schedules of these families are the decoder layout of
:mod:`circuitstat.circuits.convert`; this module reads what the MoE block adds, per transformers 5:

* ``mixtral`` (models/mixtral/modeling_mixtral.py): MixtralTopKRouter (softmax, top-k, always
  renormalised), MixtralExperts (``gate_up_proj`` [X, 2F, D] = [gate | up] rows, ``down_proj`` [X, D, F]);
  sliding window on every layer when set;
* ``qwen2_moe`` (models/qwen2_moe/modeling_qwen2_moe.py): ``norm_topk_prob``, a shared expert
  (``shared_expert_intermediate_size``) gated by sigmoid(``shared_expert_gate``), dense layers where
  ``mlp_only_layers`` or ``decoder_sparse_step`` say, q/k/v biases (``qkv_bias``);
* ``qwen3_moe`` (models/qwen3_moe/modeling_qwen3_moe.py): per-head q/k RMSNorm, ``norm_topk_prob``,
  ``mlp_only_layers`` / ``decoder_sparse_step``, no shared expert;
* ``olmoe`` (models/olmoe/modeling_olmoe.py): q/k RMSNorm over the whole projection (as OLMo 2) but
  Llama's pre-norms (input_layernorm, post_attention_layernorm) and no post-norms; ``norm_topk_prob``;
  ``clip_qkv`` is refused (check_fields: not read, refused when set);
* ``gpt_oss`` (models/gpt_oss/modeling_gpt_oss.py): GptOssTopKRouter (a router bias; top-k of the logits,
  then a softmax over those k), GptOssExperts (biases; ``gate_up_proj`` [X, D, 2F] with gate and up
  *interleaved* in its columns, ``down_proj`` [X, F, D]; the clamped SwiGLU with ``swiglu_alpha`` and
  ``swiglu_limit``), attention sinks (``self_attn.sinks``, one logit per head), sliding and full layers
  alternating (``layer_types``), yarn rope, RMSNorm weight applied in float32, biases on q/k/v/o.
"""

from __future__ import annotations

import torch

from circuitstat.core.errors import UnsupportedArchitectureError

MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss")

#: config fields the MoE conversion reads (in addition to circuitstat.circuits.convert.READ)
MOE_READ = {"num_local_experts", "num_experts", "num_experts_per_tok", "norm_topk_prob", "moe_intermediate_size",
            "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers", "qkv_bias", "swiglu_alpha",
            "swiglu_limit"}
#: training-only fields: the load-balancing loss, router logits returned for it, jitter noise (applied only in
#: training mode: MixtralSparseMoeBlock.forward checks self.training)
MOE_IRRELEVANT = {"router_aux_loss_coef", "output_router_logits", "router_jitter_noise"}


def _n_experts(c) -> int:
    n = getattr(c, "num_local_experts", None)
    return int(n if n is not None else c.num_experts)


def sparse_layers(c) -> list[int]:
    """The layers whose MLP is the MoE block (Qwen2/3-MoE: not in mlp_only_layers, and every decoder_sparse_step-th)."""
    L = c.num_hidden_layers
    if c.model_type not in ("qwen2_moe", "qwen3_moe"):
        return list(range(L))
    only = set(getattr(c, "mlp_only_layers", None) or [])
    step = int(getattr(c, "decoder_sparse_step", 1) or 1)
    if _n_experts(c) <= 0:
        return []
    return [i for i in range(L) if i not in only and (i + 1) % step == 0]


def moe_config(c) -> dict | None:
    """ModelConfig.moe of HF config ``c`` (None for a dense family)."""
    kind = c.model_type
    if kind not in MOE_TYPES:
        return None
    layers = sparse_layers(c)
    if not layers:
        return None
    X, k = _n_experts(c), int(c.num_experts_per_tok)
    if not 1 <= k <= X:
        raise UnsupportedArchitectureError(f"{kind} config num_experts_per_tok={k} must be in [1, {X}] experts")
    d_expert = getattr(c, "moe_intermediate_size", None) or c.intermediate_size
    if kind == "gpt_oss":
        return {"experts": X, "top_k": k, "d_expert": int(d_expert), "d_shared": 0, "norm_topk": False,
                "routing": "topk_softmax", "router_bias": True, "expert_bias": True, "act": "swiglu_clamp",
                "swiglu_alpha": float(c.swiglu_alpha), "swiglu_limit": float(c.swiglu_limit), "sparse_layers": layers}
    return {"experts": X, "top_k": k, "d_expert": int(d_expert),
            "d_shared": int(getattr(c, "shared_expert_intermediate_size", 0) or 0) if kind == "qwen2_moe" else 0,
            "norm_topk": True if kind == "mixtral" else bool(c.norm_topk_prob),
            "routing": "softmax_topk", "router_bias": False, "expert_bias": False, "act": "gated",
            "swiglu_alpha": 0.0, "swiglu_limit": 0.0, "sparse_layers": layers}


def moe_weights(cfg, block, p: str) -> dict:
    """The MoE weights of one HF sparse block (``layer.mlp``) under prefix ``p``, in the x W convention."""
    m, F_, D = cfg.moe, cfg.moe["d_expert"], cfg.d_model
    X = m["experts"]
    ex = block.experts
    if not isinstance(getattr(ex, "gate_up_proj", None), torch.Tensor) or not ex.gate_up_proj.is_floating_point():
        # e.g. gpt-oss checkpoints' MXFP4 experts, replaced by a quantized module when loaded as stored
        raise UnsupportedArchitectureError(
            f"{cfg.arch}: the experts are quantized (quantization_config); circuitstat converts float weights only: "
            "dequantize the checkpoint to bfloat16 or float32 first")
    if hasattr(block, "router"):  # GptOssMLP: gate and up interleaved in gate_up_proj's columns, biases
        gu, gub = ex.gate_up_proj, ex.gate_up_proj_bias  # [X, D, 2F], [X, 2F]
        return {p + "W_router": block.router.weight.T, p + "b_router": block.router.bias,
                p + "We_gate": gu[..., ::2], p + "We_in": gu[..., 1::2], p + "be_gate": gub[..., ::2],
                p + "be_in": gub[..., 1::2], p + "We_out": ex.down_proj, p + "be_out": ex.down_proj_bias}
    gate_up, down = ex.gate_up_proj, ex.down_proj  # [X, 2F, D] ([gate | up] rows), [X, D, F]
    zeros = lambda *s: torch.zeros(*s, dtype=gate_up.dtype, device=gate_up.device)  # noqa: E731
    sd = {p + "W_router": block.gate.weight.T, p + "b_router": zeros(X),
          p + "We_gate": gate_up[:, :F_].transpose(1, 2), p + "We_in": gate_up[:, F_:].transpose(1, 2),
          p + "We_out": down.transpose(1, 2), p + "be_gate": zeros(X, F_), p + "be_in": zeros(X, F_),
          p + "be_out": zeros(X, D)}
    if m["d_shared"]:
        s = block.shared_expert
        sd.update({p + "Ws_gate": s.gate_proj.weight.T, p + "Ws_in": s.up_proj.weight.T,
                   p + "Ws_out": s.down_proj.weight.T, p + "w_shared": block.shared_expert_gate.weight[0]})
    return sd


def attention_extras(c) -> dict:
    """ModelConfig fields of a family's attention beyond the decoder layout: GPT-OSS's sinks."""
    return {"attn_sinks": True} if c.model_type == "gpt_oss" else {}


def attention_weights(cfg, attn, p: str) -> dict:
    """The attention weights beyond the decoder layout under prefix ``p``: GPT-OSS's sink logits [H]."""
    return {p + "sinks": attn.sinks} if cfg.attn_sinks else {}


# small shapes for random: specs: circuitstat.circuits.families.MOE_SMALL (torch-free, read by pricing too)


def moe_parameter_bound(model_type: str, values: dict) -> int:
    """Parameters an MoE config adds beyond one dense gated MLP per layer (every expert held, router, shared expert,
    expert biases), as an upper bound (every layer counted sparse) for the memory check before allocation."""
    if model_type not in MOE_TYPES:
        return 0
    X = values.get("num_local_experts") or values.get("num_experts") or 0
    D, L = values.get("hidden_size") or 0, values.get("num_hidden_layers") or 0
    F_ = values.get("moe_intermediate_size") or values.get("intermediate_size") or 0
    S = values.get("shared_expert_intermediate_size") or 0 if model_type == "qwen2_moe" else 0
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (X, D, L, F_, S)):
        return 0  # the shape checks name the bad key
    return L * (X * (3 * D * F_ + 2 * F_ + D) + X * (D + 1) + 3 * D * S + D)
