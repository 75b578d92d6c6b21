"""Conversion of Hugging Face causal LMs into the uniform per-layer weight form.

One function per layout reads the HF module tree once; the forward pass never touches HF code.
Per-head layouts follow each family's modeling file in transformers 5 (``models/<family>/modeling_*.py``):
GPT-2's Conv1D ``c_attn`` packs [Q | K | V] column blocks; GPT-NeoX's ``query_key_value`` packs
per head [q | k | v] (view ``[H, 3, d_head]``); the decoder families (Llama, Qwen 2/3, Mistral,
Gemma 1/2/3, Phi-3, OLMo 1/2, Granite, SmolLM3, StarCoder2) have q/k/v projections (Phi-3: one fused
``qkv_proj`` [q | k | v] and a fused ``gate_up_proj`` [gate | up]; StarCoder2 an ungated c_fc/c_proj MLP)
with ``num_key_value_heads`` K/V heads shared by groups of query
heads (ungrouped here).  The family table (:data:`FAMILIES`) says which norms, q/k norms, soft-caps
and scales each one has; :mod:`circuitstat.circuits.rope_config` reads its rotary schedule.

A config field the conversion does not reproduce is refused by name (:func:`check_fields`): every
field of a family's config class is either read here, known not to change the eval-mode forward
(dropout, initialisation, cache and special-token settings), or refused when it differs from the
class default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from circuitstat.core.errors import UnsupportedArchitectureError
from .config_fields import check_unread_fields, refuse
from .convert_dense import CONVERTERS as DENSE_CONVERTERS
from .convert_moe import (MOE_IRRELEVANT, MOE_READ, MOE_TYPES, attention_extras, attention_weights, moe_config,
                          moe_weights)
from .engine.config import compute_dtype
from .engine.moe import is_sparse
from .families import POINTERS, SMALL  # model types that are not a family but hold one: the refusal names it
from .model import CircuitModel, ModelConfig
from .rope_config import rope_fields

SUPPORTED = tuple(SMALL)  # every family random: builds (circuitstat.circuits.families): decoders, dense, MoE
assert set(MOE_TYPES) <= set(SUPPORTED)  # mixture-of-experts families (circuitstat.circuits.convert_moe)

def unsupported(kind: str, where: str = "") -> UnsupportedArchitectureError:
    """The error (exit 2) refusing model type ``kind`` (``where``: the file or spec it came from), naming the
    supported families and, for a type that wraps a supported one (``gemma3``), the one to use."""
    head = f"{where}: " if where else ""
    hint = f"; {POINTERS[kind]}" if kind in POINTERS else ""
    return UnsupportedArchitectureError(
        f"{head}architecture {kind!r} is not supported; supported: {', '.join(SUPPORTED)}{hint}")


@dataclass(frozen=True)
class Family:
    """How one decoder family maps onto ModelConfig (see the transformers 5 modeling file it names)."""

    norm: str = "rmsnorm"  # LlamaRMSNorm; Gemma: rmsnorm_1p; OLMo 2: rmsnorm_f32w
    sandwich: bool = False  # Gemma: pre- and post-norms around attention and MLP
    post_only: bool = False  # OLMo 2: post-norms only
    qk_norm: str = "none"
    gemma: bool = False  # √d embedding scale, query_pre_attn_scalar, soft-caps
    fused: bool = False  # Phi-3's qkv_proj and gate_up_proj
    scaled_embed: bool = False  # Gemma 1: the √d embedding scale alone (no query_pre_attn_scalar or soft-caps)
    granite: bool = False  # embedding, attention and residual multipliers, logits_scaling
    nope: bool = False  # SmolLM3: no_rope_layers (layers without rotary embeddings)
    eps_key: str | None = "rms_norm_eps"  # the config field of the norms' epsilon; None: fixed_eps
    fixed_eps: float = 1e-5  # OLMo 1: OlmoLayerNorm's eps=1e-5, not a config field
    clip_qkv: bool = False  # OLMo 1: q, k and v clamped to ±clip_qkv
    gated: bool = True  # False: StarCoder2's c_fc -> act -> c_proj MLP with biases
    act_key: str = "hidden_act"
    source: str = ""


FAMILIES = {
    "llama": Family(source="models/llama/modeling_llama.py"),
    "qwen2": Family(source="models/qwen2/modeling_qwen2.py (q/k/v biases always on)"),
    "qwen3": Family(qk_norm="head", source="models/qwen3/modeling_qwen3.py (q_norm/k_norm over head_dim)"),
    "mistral": Family(source="models/mistral/modeling_mistral.py (sliding window on every layer)"),
    "gemma2": Family(norm="rmsnorm_1p", sandwich=True, gemma=True, act_key="hidden_activation",
                     source="models/gemma2/modeling_gemma2.py"),
    "gemma3_text": Family(norm="rmsnorm_1p", sandwich=True, gemma=True, qk_norm="head", act_key="hidden_activation",
                          source="models/gemma3/modeling_gemma3.py (Gemma3ForCausalLM)"),
    "phi3": Family(fused=True, source="models/phi3/modeling_phi3.py"),
    "olmo2": Family(norm="rmsnorm_f32w", post_only=True, qk_norm="full",
                    source="models/olmo2/modeling_olmo2.py (q_norm/k_norm over the whole projection)"),
    "gemma": Family(norm="rmsnorm_1p", scaled_embed=True,
                    source="models/gemma/modeling_gemma.py (GemmaTextScaledWordEmbedding, GemmaRMSNorm's 1 + w)"),
    "granite": Family(granite=True, source="models/granite/modeling_granite.py (multipliers; residual_multiplier "
                                           "folded into each sender's output projection: writes stay additive)"),
    "smollm3": Family(nope=True, source="models/smollm3/modeling_smollm3.py (NoPE layers; windows on NoPE layers "
                                        "with use_sliding_window, through layer_types)"),
    "olmo": Family(norm="layernorm", eps_key=None, clip_qkv=True,
                   source="models/olmo/modeling_olmo.py (OlmoLayerNorm: no weight or bias, eps 1e-5; clip_qkv)"),
    "starcoder2": Family(norm="layernorm", eps_key="norm_epsilon", gated=False,
                         source="models/starcoder2/modeling_starcoder2.py (nn.LayerNorm with bias, c_fc/c_proj MLP, "
                                "use_bias on every projection, a window on every layer)"),
}
FAMILIES.update({  # mixture-of-experts: the MoE block is one MLP node (circuitstat.circuits.convert_moe)
    "mixtral": Family(source="models/mixtral/modeling_mixtral.py (sparse MoE block, window on every layer)"),
    "qwen2_moe": Family(source="models/qwen2_moe/modeling_qwen2_moe.py (shared expert, qkv_bias)"),
    "qwen3_moe": Family(qk_norm="head", source="models/qwen3_moe/modeling_qwen3_moe.py (q_norm/k_norm over head_dim)"),
    "olmoe": Family(qk_norm="full", source="models/olmoe/modeling_olmoe.py (q/k norm over the whole projection, "
                                          "pre-norms)"),
    "gpt_oss": Family(norm="rmsnorm_f32w", source="models/gpt_oss/modeling_gpt_oss.py (attention sinks, router "
                                                  "bias, clamped SwiGLU experts with biases)"),
})

# Fields that do not change the eval-mode forward pass of a single sequence without cache.
IRRELEVANT = {"initializer_range", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "attention_dropout",
              "embd_pdrop", "resid_pdrop", "pretraining_tp", "max_window_layers", "_sliding_window_pattern",
              "use_sliding_window", "tie_word_embeddings", "original_max_position_embeddings",
              "residual_dropout", "embedding_dropout"}
# Fields read by the decoder conversion (directly or through the module tree and rope_fields).
READ = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_parameters", "hidden_act",
        "hidden_activation", "attention_bias", "mlp_bias", "sliding_window", "layer_types", "query_pre_attn_scalar",
        "attn_logit_softcapping", "final_logit_softcapping", "use_bidirectional_attention",
        # Granite (Family.granite): read by _decoder_config, residual_multiplier by _fold_residual_multiplier
        "embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling",
        # SmolLM3 (Family.nope): no_rope_layers, which its config builds from no_rope_layer_interval when absent
        "no_rope_layers", "no_rope_layer_interval",
        "clip_qkv",  # OLMo 1 (Family.clip_qkv)
        "norm_epsilon", "use_bias"}  # StarCoder2: the norms' eps; biases read from the module tree


_refuse = refuse

# READ is shared by every decoder family, but these fields are reproduced only for the families named: another
# family's config that sets one (OLMoE's clip_qkv) is refused, never read as if converted
OWNED = {**dict.fromkeys(("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"),
                         ("granite",)),
         **dict.fromkeys(("no_rope_layers", "no_rope_layer_interval"), ("smollm3",)),
         "clip_qkv": ("olmo",), **dict.fromkeys(("norm_epsilon", "use_bias"), ("starcoder2",))}


def _check_owned_fields(c) -> None:
    """UnsupportedArchitectureError naming a field of OWNED that ``c`` sets away from its class default although
    its family does not reproduce it."""
    defaults = type(c)().to_dict()
    values = c.to_dict()
    for field, owners in OWNED.items():
        if c.model_type not in owners and field in values and values[field] != defaults.get(field):
            raise _refuse(c.model_type, field, values[field], f"set it to its default {defaults.get(field)!r} "
                          "or use another model")


def check_fields(c) -> None:
    """UnsupportedArchitectureError naming the first field of ``c`` (an HF config) that the conversion
    would not reproduce: a family field that is neither read nor irrelevant and differs from its default,
    or a value of a read field that is refused."""
    kind = c.model_type
    check_unread_fields(c, READ | IRRELEVANT | MOE_READ | MOE_IRRELEVANT)
    _check_owned_fields(c)
    if getattr(c, "use_bidirectional_attention", False):
        raise _refuse(kind, "use_bidirectional_attention", True, "only causal attention is supported")
    if kind == "gemma3_text" and getattr(c, "attn_logit_softcapping", None) is not None:
        # transformers' Gemma3Attention never passes it to the attention function: refused, not guessed
        raise _refuse(kind, "attn_logit_softcapping", c.attn_logit_softcapping,
                      "transformers' Gemma 3 does not apply it; set it to null")
    if getattr(c, "mlp_bias", False):
        raise _refuse(kind, "mlp_bias", True, "a bias on gate_proj is not supported; use mlp_bias=False")


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
    fields = rope_fields(c)
    cfg = ModelConfig(
        n_layers=c.num_hidden_layers, n_heads=H, d_model=D, d_head=E, d_mlp=c.intermediate_size,
        vocab_size=c.vocab_size, n_ctx=c.max_position_embeddings, norm="layernorm", norm_eps=c.layer_norm_eps,
        positional="rotary", rotary_dim=rot, mlp="standard", act=c.hidden_act,
        parallel=bool(c.use_parallel_residual), arch="gpt_neox", **fields,
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


def _windows(c, n_layers: int) -> dict:
    """sliding_window and layer_types: per layer from the config (Gemma, Qwen), or every layer (Mistral, Phi-3)."""
    window = getattr(c, "sliding_window", None)
    if window is None:
        return {}
    types = getattr(c, "layer_types", None)
    if types is None:  # MistralModel/Phi3Model: create_sliding_window_causal_mask for every layer
        return {"sliding_window": int(window), "layer_types": None}
    types = list(types)
    if "sliding_attention" not in types:
        return {}
    return {"sliding_window": int(window), "layer_types": types}


def _decoder_config(c, fam: Family) -> ModelConfig:
    """The ModelConfig of a decoder-family HF config (Llama-like layout)."""
    D, H = c.hidden_size, c.num_attention_heads
    Hkv = getattr(c, "num_key_value_heads", None) or H
    E = getattr(c, "head_dim", None) or D // H
    rope = dict(getattr(c, "rope_parameters", None) or {})
    nested = isinstance(rope.get("full_attention"), dict)
    prf = (rope["full_attention"] if nested else rope).get("partial_rotary_factor", 1.0)
    rot = int(E * prf)
    return ModelConfig(
        n_layers=c.num_hidden_layers, n_heads=H, d_model=D, d_head=E, d_mlp=c.intermediate_size,
        vocab_size=c.vocab_size, n_ctx=c.max_position_embeddings, n_kv_heads=Hkv, norm=fam.norm,
        norm_eps=fam.fixed_eps if fam.eps_key is None else getattr(c, fam.eps_key), positional="rotary",
        rotary_dim=rot, mlp="gated" if fam.gated else "standard",
        act=getattr(c, fam.act_key), arch=c.model_type, tied_embeddings=_tied(c),
        pre_norm=not fam.post_only, post_norm=fam.sandwich or fam.post_only, qk_norm=fam.qk_norm,
        **_windows(c, c.num_hidden_layers), **rope_fields(c), **_family_extras(c, fam, D), **_nope(c, fam),
        moe=moe_config(c), **attention_extras(c),
    )


def _family_extras(c, fam: Family, D: int) -> dict:
    """The ModelConfig scales and clamps of a family: Gemma's, Granite's multipliers, OLMo 1's clip_qkv."""
    extra = {}
    if fam.gemma:
        extra.update(attn_scalar=float(c.query_pre_attn_scalar), embed_scale=float(D ** 0.5),
                     attn_softcap=getattr(c, "attn_logit_softcapping", None),
                     logit_softcap=getattr(c, "final_logit_softcapping", None))
    elif fam.scaled_embed:  # GemmaModel: embed_scale=hidden_size**0.5, cast to the weights' dtype
        extra.update(embed_scale=float(D ** 0.5))
    if fam.clip_qkv and getattr(c, "clip_qkv", None) is not None:  # OlmoAttention: clamp_ after the projections
        extra.update(clip_qkv=float(c.clip_qkv))
    if fam.granite:  # GraniteModel, GraniteAttention.scaling, GraniteForCausalLM
        extra.update(embed_multiplier=float(c.embedding_multiplier), attn_multiplier=float(c.attention_multiplier),
                     logits_scaling=float(c.logits_scaling))
    return extra


def _nope(c, fam: Family) -> dict:
    """SmolLM3's per-layer rotary switch (``no_rope_layers[i]`` 1: rotary, 0: NoPE), or nothing."""
    if not fam.nope:
        return {}
    flags = [bool(v) for v in list(c.no_rope_layers)[: c.num_hidden_layers]]
    if len(flags) < c.num_hidden_layers:
        raise _refuse(c.model_type, "no_rope_layers", list(c.no_rope_layers),
                      f"give one entry per layer ({c.num_hidden_layers})")
    return {} if all(flags) else {"rope_layers": flags}


def _tied(c) -> bool:
    return bool(getattr(c, "tie_word_embeddings", False))


def _projections(cfg: ModelConfig, a, fused: bool):
    """(q, k, v) as (weight [n E, D], bias [n E] or None) of one attention module."""
    if not fused:
        return [(p.weight, p.bias) for p in (a.q_proj, a.k_proj, a.v_proj)]
    w, b = a.qkv_proj.weight, a.qkv_proj.bias  # Phi3Attention: qkv[..., :q], [q : q + kv], [q + kv :]
    q, kv = cfg.n_heads * cfg.d_head, cfg.kv_heads * cfg.d_head
    cuts = ((0, q), (q, q + kv), (q + kv, q + 2 * kv))
    return [(w[s:e], None if b is None else b[s:e]) for s, e in cuts]


def _decoder(hf) -> tuple[ModelConfig, dict]:
    c = hf.config
    fam = FAMILIES[c.model_type]
    check_fields(c)
    cfg = _decoder_config(c, fam)
    D, H, Hkv, E = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.d_head
    m = hf.model
    zeros = lambda *s: torch.zeros(*s)  # noqa: E731
    sd = {"W_E": m.embed_tokens.weight, "b_U": zeros(c.vocab_size)}
    sd["lnf_w"], sd["lnf_b"] = _norm_params(m.norm, D)
    if not cfg.tied_embeddings:
        sd["W_U"] = hf.get_output_embeddings().weight.T
    group = H // Hkv
    for i, b in enumerate(m.layers):
        a, p = b.self_attn, f"blocks.{i}."
        for name, (w, bias), n in zip("QKV", _projections(cfg, a, fam.fused), (H, Hkv, Hkv)):
            w = w.reshape(n, E, D).transpose(1, 2)
            bias = bias.reshape(n, E) if bias is not None else zeros(n, E)
            if n != H:  # ungroup: query head h reads K/V group h // group
                w, bias = w.repeat_interleave(group, 0), bias.repeat_interleave(group, 0)
            sd[p + f"W_{name}"], sd[p + f"b_{name}"] = w, bias
        sd[p + "W_O"] = a.o_proj.weight.T.reshape(H, E, D)
        sd[p + "b_O"] = a.o_proj.bias if a.o_proj.bias is not None else zeros(D)
        sd.update(attention_weights(cfg, a, p))
        if cfg.qk_norm != "none":
            sd[p + "lnq_w"], sd[p + "lnk_w"] = a.q_norm.weight, a.k_norm.weight
        if fam.sandwich:  # Gemma2DecoderLayer: input, post_attention, pre_feedforward, post_feedforward
            sd.update({p + "ln1_w": b.input_layernorm.weight, p + "ln1_b": zeros(D),
                       p + "ln1_post_w": b.post_attention_layernorm.weight,
                       p + "ln2_w": b.pre_feedforward_layernorm.weight, p + "ln2_b": zeros(D),
                       p + "ln2_post_w": b.post_feedforward_layernorm.weight})
        elif fam.post_only:  # Olmo2DecoderLayer: norms on the outputs only
            sd.update({p + "ln1_post_w": b.post_attention_layernorm.weight,
                       p + "ln2_post_w": b.post_feedforward_layernorm.weight})
        else:  # LlamaDecoderLayer: post_attention_layernorm is the MLP's input norm
            sd[p + "ln1_w"], sd[p + "ln1_b"] = _norm_params(b.input_layernorm, D)
            sd[p + "ln2_w"], sd[p + "ln2_b"] = _norm_params(b.post_attention_layernorm, D)
        if is_sparse(cfg, i):
            sd.update(moe_weights(cfg, b.mlp, p))
        else:
            sd.update(_mlp_weights(cfg, b.mlp, fam.fused, p))
    if fam.granite:
        _fold_residual_multiplier(sd, cfg.n_layers, float(c.residual_multiplier))
    return cfg, sd


def _fold_residual_multiplier(sd: dict, n_layers: int, r: float) -> None:
    """Granite's residual_multiplier folded into each sender's output projection, in place.

    GraniteDecoderLayer adds ``residual + out * r`` for the attention output (Σ_h z_h W_O[h] + b_O) and the MLP
    output, so each head's and MLP's write to the stream is r times its projection: W_O, b_O, W_out and b_out
    scaled by r (in float32, or float64 for a float64 model: one rounding) make the senders' outputs those writes, additive as in Llama.
    """
    for i in range(n_layers):
        for name in ("W_O", "b_O", "W_out", "b_out"):
            t = sd[f"blocks.{i}.{name}"]
            sd[f"blocks.{i}.{name}"] = (t.to(compute_dtype(t.dtype)) * r).to(t.dtype)


def _norm_params(norm, D: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of a pre-norm: RMSNorm's weight and no bias, LayerNorm's weight and bias where it has them
    (OLMo 1's OlmoLayerNorm has neither: a weight of ones and a bias of zeros, exact in any dtype)."""
    w, b = getattr(norm, "weight", None), getattr(norm, "bias", None)
    return (w if w is not None else torch.ones(D)), (b if b is not None else torch.zeros(D))


def _mlp_weights(cfg: ModelConfig, mlp, fused: bool, p: str) -> dict:
    """W_gate, W_in (up), b_in, W_out, b_out of a gated MLP (Phi-3: gate_up_proj = [gate | up]); W_in, b_in, W_out,
    b_out of StarCoder2's ungated one."""
    F_, D = cfg.d_mlp, cfg.d_model
    zeros = torch.zeros
    if cfg.mlp == "standard":  # Starcoder2MLP: c_proj(act(c_fc(x))), biases where use_bias
        fc, proj = mlp.c_fc, mlp.c_proj
        return {p + "W_in": fc.weight.T, p + "b_in": fc.bias if fc.bias is not None else zeros(F_),
                p + "W_out": proj.weight.T, p + "b_out": proj.bias if proj.bias is not None else zeros(D)}
    if fused:  # Phi3MLP: gate, up_states = gate_up_proj(x).chunk(2, dim=-1)
        gate, up, up_b = mlp.gate_up_proj.weight[:F_], mlp.gate_up_proj.weight[F_:], None
    else:
        gate, up, up_b = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.up_proj.bias
    down = mlp.down_proj
    return {p + "W_gate": gate.T, p + "W_in": up.T, p + "b_in": up_b if up_b is not None else torch.zeros(F_),
            p + "W_out": down.weight.T, p + "b_out": down.bias if down.bias is not None else torch.zeros(D)}


_CONVERTERS = {"gpt2": _gpt2, "gpt_neox": _gpt_neox, **{k: _decoder for k in FAMILIES}}
_CONVERTERS.update(DENSE_CONVERTERS)


def from_hf(hf_model, dtype: torch.dtype | None = None, device: str | torch.device = "cpu") -> CircuitModel:
    """A CircuitModel holding a copy of ``hf_model``'s weights in the uniform form."""
    kind = hf_model.config.model_type
    if kind not in _CONVERTERS:
        raise unsupported(kind)
    from .config_values import check_config_values

    # a model in memory was built from a config nobody checked: its scales and rope settings, by name
    check_config_values(vars(hf_model.config), f"{kind} config")
    with torch.no_grad():
        cfg, sd = _CONVERTERS[kind](hf_model)
        target = dtype or next(hf_model.parameters()).dtype
        # in the target dtype at once (reshapes and copies are exact in any dtype; no float32 copy of an 8B model)
        state = {k: v.detach().to(target).clone().contiguous() for k, v in sd.items()}
        with torch.device("meta"):
            names = set(CircuitModel(cfg).state_dict())
        if names != set(state):
            raise RuntimeError(f"conversion of {kind} left missing={sorted(names - set(state))} "
                               f"unexpected={sorted(set(state) - names)}")
        model = CircuitModel.from_state_dict(cfg, state)  # holds the converted tensors, no second copy
    # Analysis needs gradients of activations, never of weights.
    return model.to(device=device, dtype=target).eval().requires_grad_(False)
