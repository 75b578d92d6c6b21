"""Conversion of Hugging Face causal LMs into the uniform per-layer weight form.

One function per family reads the HF module tree once; the forward pass never touches HF code.
Per-head layouts follow each family's attention implementation in transformers 5:
GPT-2's Conv1D ``c_attn`` packs [Q | K | V] column blocks; GPT-NeoX's ``query_key_value`` packs
per head [q | k | v] (view ``[H, 3, d_head]``); Llama/Qwen2 have separate projections with
``num_key_value_heads`` K/V heads shared by groups of query heads (ungrouped here).
"""

from __future__ import annotations

import torch

from reports.errors import UnsupportedArchitectureError
from .model import CircuitModel, ModelConfig

SUPPORTED = ("gpt2", "gpt_neox", "llama", "qwen2")


def _rope_base(config) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    kind = rope.get("rope_type", "default")
    if kind not in ("default", None):
        raise UnsupportedArchitectureError(
            f"rope_type={kind!r} is not supported (only default rotary embeddings); "
            "use a model with rope_type 'default'"
        )
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def _gpt2(hf) -> tuple[ModelConfig, dict]:
    c = hf.config
    if getattr(c, "scale_attn_by_inverse_layer_idx", False) or getattr(c, "reorder_and_upcast_attn", False):
        raise UnsupportedArchitectureError(
            "GPT-2 configs with scale_attn_by_inverse_layer_idx or reorder_and_upcast_attn are not supported; "
            "set both to False"
        )
    if not getattr(c, "scale_attn_weights", True):
        raise UnsupportedArchitectureError("GPT-2 with scale_attn_weights=False is not supported")
    D, H = c.n_embd, c.n_head
    E = D // H
    cfg = ModelConfig(
        n_layers=c.n_layer, n_heads=H, d_model=D, d_head=E, d_mlp=c.n_inner or 4 * D,
        vocab_size=c.vocab_size, n_ctx=c.n_positions, norm="layernorm", norm_eps=c.layer_norm_epsilon,
        positional="learned", mlp="standard", act=c.activation_function, arch="gpt2",
    )
    t = hf.transformer
    sd = {"W_E": t.wte.weight, "W_pos": t.wpe.weight, "lnf_w": t.ln_f.weight, "lnf_b": t.ln_f.bias,
          "W_U": hf.get_output_embeddings().weight.T, "b_U": torch.zeros(c.vocab_size)}
    for i, b in enumerate(t.h):
        w, bias = b.attn.c_attn.weight, b.attn.c_attn.bias  # [D, 3D], y = x W + b
        for j, name in enumerate("QKV"):
            sd[f"blocks.{i}.W_{name}"] = w[:, j * D : (j + 1) * D].reshape(D, H, E).permute(1, 0, 2)
            sd[f"blocks.{i}.b_{name}"] = bias[j * D : (j + 1) * D].reshape(H, E)
        sd[f"blocks.{i}.W_O"] = b.attn.c_proj.weight.reshape(H, E, D)
        sd[f"blocks.{i}.b_O"] = b.attn.c_proj.bias
        sd.update({f"blocks.{i}.ln1_w": b.ln_1.weight, f"blocks.{i}.ln1_b": b.ln_1.bias,
                   f"blocks.{i}.ln2_w": b.ln_2.weight, f"blocks.{i}.ln2_b": b.ln_2.bias,
                   f"blocks.{i}.W_in": b.mlp.c_fc.weight, f"blocks.{i}.b_in": b.mlp.c_fc.bias,
                   f"blocks.{i}.W_out": b.mlp.c_proj.weight, f"blocks.{i}.b_out": b.mlp.c_proj.bias})
    return cfg, sd


def _gpt_neox(hf) -> tuple[ModelConfig, dict]:
    c = hf.config
    D, H = c.hidden_size, c.num_attention_heads
    E = D // H
    rope = getattr(c, "rope_parameters", None) or {}
    rot = int(E * rope.get("partial_rotary_factor", getattr(c, "rotary_pct", 1.0)))
    cfg = ModelConfig(
        n_layers=c.num_hidden_layers, n_heads=H, d_model=D, d_head=E, d_mlp=c.intermediate_size,
        vocab_size=c.vocab_size, n_ctx=c.max_position_embeddings, norm="layernorm", norm_eps=c.layer_norm_eps,
        positional="rotary", rotary_dim=rot, rotary_base=_rope_base(c), mlp="standard", act=c.hidden_act,
        parallel=bool(c.use_parallel_residual), arch="gpt_neox",
    )
    m = hf.gpt_neox
    zeros = lambda *s: torch.zeros(*s)  # noqa: E731
    sd = {"W_E": m.embed_in.weight, "lnf_w": m.final_layer_norm.weight, "lnf_b": m.final_layer_norm.bias,
          "W_U": hf.get_output_embeddings().weight.T, "b_U": zeros(c.vocab_size)}
    for i, b in enumerate(m.layers):
        a = b.attention
        w = a.query_key_value.weight.reshape(H, 3, E, D)  # y = x W^T: rows are outputs
        bias = a.query_key_value.bias.reshape(H, 3, E) if a.query_key_value.bias is not None else zeros(H, 3, E)
        for j, name in enumerate("QKV"):
            sd[f"blocks.{i}.W_{name}"] = w[:, j].transpose(1, 2)
            sd[f"blocks.{i}.b_{name}"] = bias[:, j]
        sd[f"blocks.{i}.W_O"] = a.dense.weight.T.reshape(H, E, D)
        sd[f"blocks.{i}.b_O"] = a.dense.bias if a.dense.bias is not None else zeros(D)
        sd.update({f"blocks.{i}.ln1_w": b.input_layernorm.weight, f"blocks.{i}.ln1_b": b.input_layernorm.bias,
                   f"blocks.{i}.ln2_w": b.post_attention_layernorm.weight,
                   f"blocks.{i}.ln2_b": b.post_attention_layernorm.bias,
                   f"blocks.{i}.W_in": b.mlp.dense_h_to_4h.weight.T, f"blocks.{i}.b_in": b.mlp.dense_h_to_4h.bias,
                   f"blocks.{i}.W_out": b.mlp.dense_4h_to_h.weight.T, f"blocks.{i}.b_out": b.mlp.dense_4h_to_h.bias})
    return cfg, sd


def _llama(hf) -> tuple[ModelConfig, dict]:
    c = hf.config
    D, H = c.hidden_size, c.num_attention_heads
    Hkv = getattr(c, "num_key_value_heads", None) or H
    E = getattr(c, "head_dim", None) or D // H
    if getattr(c, "use_sliding_window", False):
        raise UnsupportedArchitectureError("sliding-window attention is not supported; set use_sliding_window=False")
    cfg = ModelConfig(
        n_layers=c.num_hidden_layers, n_heads=H, d_model=D, d_head=E, d_mlp=c.intermediate_size,
        vocab_size=c.vocab_size, n_ctx=c.max_position_embeddings, n_kv_heads=Hkv, norm="rmsnorm",
        norm_eps=c.rms_norm_eps, positional="rotary", rotary_dim=E, rotary_base=_rope_base(c), mlp="gated",
        act=c.hidden_act, arch=c.model_type,
    )
    m = hf.model
    zeros = lambda *s: torch.zeros(*s)  # noqa: E731
    sd = {"W_E": m.embed_tokens.weight, "lnf_w": m.norm.weight, "lnf_b": zeros(D),
          "W_U": hf.get_output_embeddings().weight.T, "b_U": zeros(c.vocab_size)}
    group = H // Hkv
    for i, b in enumerate(m.layers):
        a = b.self_attn
        for name, proj, n in (("Q", a.q_proj, H), ("K", a.k_proj, Hkv), ("V", a.v_proj, Hkv)):
            w = proj.weight.reshape(n, E, D).transpose(1, 2)
            bias = proj.bias.reshape(n, E) if proj.bias is not None else zeros(n, E)
            if n != H:  # ungroup: query head h reads K/V group h // group
                w, bias = w.repeat_interleave(group, 0), bias.repeat_interleave(group, 0)
            sd[f"blocks.{i}.W_{name}"], sd[f"blocks.{i}.b_{name}"] = w, bias
        sd[f"blocks.{i}.W_O"] = a.o_proj.weight.T.reshape(H, E, D)
        sd[f"blocks.{i}.b_O"] = a.o_proj.bias if a.o_proj.bias is not None else zeros(D)
        mlp = b.mlp
        sd.update({f"blocks.{i}.ln1_w": b.input_layernorm.weight, f"blocks.{i}.ln1_b": zeros(D),
                   f"blocks.{i}.ln2_w": b.post_attention_layernorm.weight, f"blocks.{i}.ln2_b": zeros(D),
                   f"blocks.{i}.W_gate": mlp.gate_proj.weight.T, f"blocks.{i}.W_in": mlp.up_proj.weight.T,
                   f"blocks.{i}.b_in": mlp.up_proj.bias if mlp.up_proj.bias is not None else zeros(c.intermediate_size),
                   f"blocks.{i}.W_out": mlp.down_proj.weight.T,
                   f"blocks.{i}.b_out": mlp.down_proj.bias if mlp.down_proj.bias is not None else zeros(D)})
        if getattr(mlp, "gate_proj", None) is not None and mlp.gate_proj.bias is not None:
            raise UnsupportedArchitectureError("a bias on gate_proj is not supported (mlp_bias=True); use mlp_bias=False")
    return cfg, sd


_CONVERTERS = {"gpt2": _gpt2, "gpt_neox": _gpt_neox, "llama": _llama, "qwen2": _llama}


def from_hf(hf_model, dtype: torch.dtype | None = None, device: str | torch.device = "cpu") -> CircuitModel:
    """A CircuitModel holding a copy of ``hf_model``'s weights in the uniform form."""
    kind = hf_model.config.model_type
    if kind not in _CONVERTERS:
        raise UnsupportedArchitectureError(
            f"architecture {kind!r} is not supported; supported: {', '.join(SUPPORTED)}"
        )
    with torch.no_grad():
        cfg, sd = _CONVERTERS[kind](hf_model)
        target = dtype or next(hf_model.parameters()).dtype
        state = {k: v.detach().to(torch.float32).clone().contiguous() for k, v in sd.items()}
        with torch.device("meta"):
            names = set(CircuitModel(cfg).state_dict())
        if names != set(state):
            raise RuntimeError(f"conversion of {kind} left missing={sorted(names - set(state))} "
                               f"unexpected={sorted(set(state) - names)}")
        model = CircuitModel.from_state_dict(cfg, state)  # holds the converted tensors, no second copy
    # Analysis needs gradients of activations, never of weights.
    return model.to(device=device, dtype=target).eval().requires_grad_(False)
