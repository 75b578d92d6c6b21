"""Conversion of the dense families with parallel blocks, LayerNorms and their own layouts: Phi (Phi-1/1.5/2),
GPT-J, Cohere (Command R), StableLM and Falcon, into the uniform per-layer weight form.

Each function follows its family's modeling file in transformers 5 (``models/<family>/modeling_*.py``):

* Phi (``PhiDecoderLayer``): attention and MLP read one ``input_layernorm`` of the layer input (a parallel
  block); partial rotary (``partial_rotary_factor``, rotate_half); q/k/v and ``dense`` biases; optional
  ``qk_layernorm`` (one LayerNorm over d_head shared by the heads); ``final_layernorm``; ``lm_head`` bias.
* GPT-J (``GPTJBlock``): parallel from one ``ln_1``; rotary over the first ``rotary_dim`` features with
  pairs (2i, 2i+1) rotated together (``rotate_every_two``); no q/k/v/out biases; ``lm_head`` bias.
* Cohere (``CohereDecoderLayer``): parallel from one bias-free ``CohereLayerNorm``; interleaved rotary;
  logits times ``logit_scale``; optional ``use_qk_norm`` (a bias-free LayerNorm over d_head with each
  head's own weights); gated MLP.
* StableLM (``StableLmDecoderLayer``): LayerNorms with bias; partial rotary; ``use_qkv_bias``; optional
  ``qk_layernorm`` (one LayerNorm per head, ``StableLmLayerNormPerHead``); ``use_parallel_residual``
  (attention and MLP both read ``input_layernorm``) or sequential with ``post_attention_layernorm``.
* Falcon (``FalconDecoderLayer``): fused ``query_key_value`` in three layouts (multi-query: [H q | k | v];
  ``new_decoder_architecture``: per K/V group [q_1 .. q_g | k | v]; otherwise per head [q | k | v]);
  ``parallel_attn`` from one ``input_layernorm`` or from ``ln_attn`` / ``ln_mlp``; ``bias``.  ALiBi is refused.

Where a family's attention and MLP read one shared norm, circuitstat's MLP receiver gets its own copy of
that norm (``ln2`` = ``ln1``): the MLP's input is the layer's input stream, normalised by the same weights,
so the MLP receiver differs from the attention receivers only where an edge patch makes it differ.
"""

from __future__ import annotations

import torch

from .config_fields import check_unread_fields, refuse as _refuse
from .model import ModelConfig
from .rope_config import rope_fields

# config fields each converter reads (directly or through rope_fields and the module tree); the
# rest of the family's config class is irrelevant to an eval-mode forward or refused (check_fields)
_COMMON = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
           "vocab_size", "max_position_embeddings", "hidden_act", "layer_norm_eps", "rope_parameters"}
READ = {
    "phi": _COMMON | {"qk_layernorm"},
    "gptj": {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "rotary_dim", "n_inner",
             "activation_function", "layer_norm_epsilon"},
    "cohere": _COMMON | {"logit_scale", "attention_bias", "use_qk_norm"},
    "stablelm": _COMMON | {"use_qkv_bias", "qk_layernorm", "use_parallel_residual"},
    "falcon": {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_ln_in_parallel_attn",
               "layer_norm_epsilon", "num_kv_heads", "alibi", "new_decoder_architecture", "multi_query",
               "parallel_attn", "bias", "max_position_embeddings", "rope_parameters", "ffn_hidden_size",
               "activation",
               # transformers >= 5.25 derives it in FalconConfig.__post_init__ from num_kv_heads, multi_query and
               # new_decoder_architecture (overwriting any stored value), all read by _falcon_layout
               "num_key_value_heads"},
}
IRRELEVANT = {"resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout", "attention_dropout"}
# as circuitstat.circuits.convert.IRRELEVANT: initialisation, cache, special tokens, tying (read from the modules)
_ALWAYS_IRRELEVANT = {"initializer_range", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id",
                      "tie_word_embeddings"}


def _tied(c) -> bool:
    return bool(getattr(c, "tie_word_embeddings", False))


def _zeros(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape)


def _heads(w: torch.Tensor, b: torch.Tensor | None, n: int, H: int, E: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(W [H, D, E], b [H, E]) from a projection's rows [n E, D] (y = x Wᵀ + b) of ``n`` heads, K/V heads
    ungrouped (query head h reads group h // (H / n))."""
    D = w.shape[-1]
    w = w.reshape(n, E, D).transpose(1, 2)
    b = b.reshape(n, E) if b is not None else _zeros(n, E)
    if n != H:
        w, b = w.repeat_interleave(H // n, 0), b.repeat_interleave(H // n, 0)
    return w, b


def _full_rotary(c) -> None:
    """Refuse partial_rotary_factor where the family's rotary embedding rotates every feature (Cohere, Falcon:
    their default schedule ignores it, and the scaled ones would build tables of another width)."""
    prf = (getattr(c, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)
    if prf not in (None, 1.0):
        raise _refuse(c.model_type, "rope_parameters.partial_rotary_factor", prf,
                      f"transformers' {c.model_type} rotates every feature of a head; set it to 1.0")


def _check(c) -> None:
    """The family's fields (check_fields with its own read set), before anything is converted."""
    check_unread_fields(c, READ[c.model_type] | IRRELEVANT | _ALWAYS_IRRELEVANT)


def _config(c, *, D: int, H: int, Hkv: int, E: int, rot: int, d_mlp: int, eps: float, act: str, parallel: bool,
            mlp: str, rope: dict, **extra) -> ModelConfig:
    """The ModelConfig of a config with Llama-like field names (LayerNorm, rotary), K/V heads checked."""
    if H % Hkv:  # each query head reads K/V group h // (H / Hkv)
        field = "num_kv_heads" if c.model_type == "falcon" else "num_key_value_heads"
        raise _refuse(c.model_type, field, Hkv, f"use a divisor of num_attention_heads={H}")
    return ModelConfig(
        n_layers=c.num_hidden_layers, n_heads=H, d_model=D, d_head=E, d_mlp=d_mlp, vocab_size=c.vocab_size,
        n_ctx=c.max_position_embeddings, n_kv_heads=Hkv, norm="layernorm", norm_eps=eps, positional="rotary",
        rotary_dim=rot, mlp=mlp, act=act, parallel=parallel, arch=c.model_type, tied_embeddings=_tied(c),
        **rope, **extra)


def _attention(sd: dict, p: str, cfg: ModelConfig, q, k, v, out) -> None:
    """W_Q/K/V, b_Q/K/V (ungrouped), W_O and b_O of one layer into ``sd`` (q, k, v: (weight, bias); out: Linear)."""
    H, Hkv, E = cfg.n_heads, cfg.kv_heads, cfg.d_head
    for name, (w, b), n in zip("QKV", (q, k, v), (H, Hkv, Hkv)):
        sd[p + f"W_{name}"], sd[p + f"b_{name}"] = _heads(w, b, n, H, E)
    sd[p + "W_O"] = out.weight.T.reshape(H, E, cfg.d_model)
    sd[p + "b_O"] = out.bias if out.bias is not None else _zeros(cfg.d_model)


def _norms(sd: dict, p: str, cfg: ModelConfig, ln1, ln2) -> None:
    """The attention's (ln1) and the MLP's (ln2) input LayerNorms (the same module where both read one)."""
    for name, ln in (("ln1", ln1), ("ln2", ln2)):
        sd[p + f"{name}_w"] = ln.weight
        sd[p + f"{name}_b"] = ln.bias if getattr(ln, "bias", None) is not None else _zeros(cfg.d_model)


def _standard_mlp(sd: dict, p: str, fc_in, fc_out) -> None:
    """act(x W_in + b_in) W_out + b_out (zero biases where the Linear has none: Falcon with bias=False)."""
    sd.update({p + "W_in": fc_in.weight.T, p + "W_out": fc_out.weight.T,
               p + "b_in": fc_in.bias if fc_in.bias is not None else _zeros(fc_in.weight.shape[0]),
               p + "b_out": fc_out.bias if fc_out.bias is not None else _zeros(fc_out.weight.shape[0])})


def _gated_mlp(sd: dict, p: str, cfg: ModelConfig, mlp) -> None:
    """A bias-free gated MLP (Cohere, StableLM): act(x W_gate) * (x W_in) W_out."""
    sd.update({p + "W_gate": mlp.gate_proj.weight.T, p + "W_in": mlp.up_proj.weight.T, p + "b_in": _zeros(cfg.d_mlp),
               p + "W_out": mlp.down_proj.weight.T, p + "b_out": _zeros(cfg.d_model)})


def _ends(hf, cfg: ModelConfig, embed, final, sd: dict) -> dict:
    """Embedding, final norm, unembedding and its bias (zeros where lm_head has none)."""
    head = hf.get_output_embeddings()
    sd.update({"W_E": embed.weight, "lnf_w": final.weight,
               "lnf_b": final.bias if getattr(final, "bias", None) is not None else _zeros(cfg.d_model),
               "b_U": head.bias if head.bias is not None else _zeros(cfg.vocab_size)})
    if not cfg.tied_embeddings:
        sd["W_U"] = head.weight.T
    return sd


def _qk_norms(sd: dict, p: str, cfg: ModelConfig, qn, kn) -> None:
    """q/k LayerNorm weights and biases: one shared module (Phi), [H, E] weights (Cohere) or one module per
    head (StableLM); K norms ungrouped per query head."""
    H, E, group = cfg.n_heads, cfg.d_head, cfg.n_heads // cfg.kv_heads

    def stack(norm, n):
        if hasattr(norm, "norms"):  # StableLmLayerNormPerHead: a LayerNorm per head
            w = torch.stack([m.weight for m in norm.norms])
            b = torch.stack([m.bias if m.bias is not None else _zeros(E) for m in norm.norms])
        else:
            w = norm.weight
            b = norm.bias if getattr(norm, "bias", None) is not None else torch.zeros_like(w)
        if cfg.qk_norm == "each_head" and n != H:
            w, b = w.repeat_interleave(group, 0), b.repeat_interleave(group, 0)
        return w, b

    (sd[p + "lnq_w"], sd[p + "lnq_b"]), (sd[p + "lnk_w"], sd[p + "lnk_b"]) = stack(qn, H), stack(kn, cfg.kv_heads)


def _phi(hf) -> tuple[ModelConfig, dict]:
    c = hf.config
    D, H = c.hidden_size, c.num_attention_heads
    E = D // H
    _check(c)
    prf = (c.rope_parameters or {}).get("partial_rotary_factor", 1.0)
    cfg = _config(c, D=D, H=H, Hkv=c.num_key_value_heads or H, E=E, rot=int(E * prf), d_mlp=c.intermediate_size,
                  eps=c.layer_norm_eps, act=c.hidden_act, parallel=True, mlp="standard", rope=rope_fields(c),
                  qk_norm="head" if c.qk_layernorm else "none")
    m, sd = hf.model, {}
    for i, b in enumerate(m.layers):
        a, p = b.self_attn, f"blocks.{i}."
        _attention(sd, p, cfg, *((x.weight, x.bias) for x in (a.q_proj, a.k_proj, a.v_proj)), a.dense)
        _norms(sd, p, cfg, b.input_layernorm, b.input_layernorm)  # PhiDecoderLayer: one norm, both branches
        _standard_mlp(sd, p, b.mlp.fc1, b.mlp.fc2)
        if c.qk_layernorm:
            _qk_norms(sd, p, cfg, a.q_layernorm, a.k_layernorm)
    return cfg, _ends(hf, cfg, m.embed_tokens, m.final_layernorm, sd)


def _gptj(hf) -> tuple[ModelConfig, dict]:
    c = hf.config
    D, H = c.n_embd, c.n_head
    E = D // H
    _check(c)
    if not 0 < c.rotary_dim <= E or c.rotary_dim % 2:  # HF's tables would not match the rotated features
        raise _refuse("gptj", "rotary_dim", c.rotary_dim, f"use an even rotary_dim of at most the head width {E}")
    cfg = ModelConfig(
        n_layers=c.n_layer, n_heads=H, d_model=D, d_head=E, d_mlp=c.n_inner or 4 * D, vocab_size=c.vocab_size,
        n_ctx=c.n_positions, norm="layernorm", norm_eps=c.layer_norm_epsilon, positional="rotary",
        rotary_dim=int(c.rotary_dim), rotary_interleaved=True, mlp="standard", act=c.activation_function,
        parallel=True, arch="gptj", tied_embeddings=_tied(c))  # create_sinusoidal_positions: base 10000
    t, sd = hf.transformer, {}
    for i, b in enumerate(t.h):
        a, p = b.attn, f"blocks.{i}."
        _attention(sd, p, cfg, *((x.weight, None) for x in (a.q_proj, a.k_proj, a.v_proj)), a.out_proj)
        _norms(sd, p, cfg, b.ln_1, b.ln_1)  # GPTJBlock: attention and MLP read ln_1
        _standard_mlp(sd, p, b.mlp.fc_in, b.mlp.fc_out)
    return cfg, _ends(hf, cfg, t.wte, t.ln_f, sd)


def _cohere(hf) -> tuple[ModelConfig, dict]:
    c = hf.config
    D, H = c.hidden_size, c.num_attention_heads
    E = getattr(c, "head_dim", None) or D // H
    _check(c)
    _full_rotary(c)
    if c.logit_scale is None:
        raise _refuse("cohere", "logit_scale", None, "CohereForCausalLM multiplies the logits by it; set a number")
    cfg = _config(c, D=D, H=H, Hkv=c.num_key_value_heads or H, E=E, rot=E, d_mlp=c.intermediate_size,
                  eps=c.layer_norm_eps, act=c.hidden_act, parallel=True, mlp="gated", rope=rope_fields(c),
                  rotary_interleaved=True, logit_scale=float(c.logit_scale),
                  qk_norm="each_head" if c.use_qk_norm else "none")
    m, sd = hf.model, {}
    for i, b in enumerate(m.layers):
        a, p = b.self_attn, f"blocks.{i}."
        _attention(sd, p, cfg, *((x.weight, x.bias) for x in (a.q_proj, a.k_proj, a.v_proj)), a.o_proj)
        _norms(sd, p, cfg, b.input_layernorm, b.input_layernorm)  # CohereDecoderLayer: one bias-free norm
        _gated_mlp(sd, p, cfg, b.mlp)
        if c.use_qk_norm:
            _qk_norms(sd, p, cfg, a.q_norm, a.k_norm)
    return cfg, _ends(hf, cfg, m.embed_tokens, m.norm, sd)


def _stablelm(hf) -> tuple[ModelConfig, dict]:
    c = hf.config
    D, H = c.hidden_size, c.num_attention_heads
    E = D // H
    _check(c)
    prf = (c.rope_parameters or {}).get("partial_rotary_factor", 1.0)
    parallel = bool(c.use_parallel_residual)
    cfg = _config(c, D=D, H=H, Hkv=c.num_key_value_heads or H, E=E, rot=int(E * prf), d_mlp=c.intermediate_size,
                  eps=c.layer_norm_eps, act=c.hidden_act, parallel=parallel, mlp="gated", rope=rope_fields(c),
                  qk_norm="each_head" if c.qk_layernorm else "none")
    m, sd = hf.model, {}
    for i, b in enumerate(m.layers):
        a, p = b.self_attn, f"blocks.{i}."
        _attention(sd, p, cfg, *((x.weight, x.bias) for x in (a.q_proj, a.k_proj, a.v_proj)), a.o_proj)
        _norms(sd, p, cfg, b.input_layernorm, b.input_layernorm if parallel else b.post_attention_layernorm)
        _gated_mlp(sd, p, cfg, b.mlp)
        if c.qk_layernorm:
            _qk_norms(sd, p, cfg, a.q_layernorm, a.k_layernorm)
    return cfg, _ends(hf, cfg, m.embed_tokens, m.norm, sd)


def _falcon_layout(c) -> str:
    """Falcon's fused qkv layout ("grouped", "multi_query" or "per_head"), refusing configs HF cannot run."""
    if c.alibi:
        raise _refuse("falcon", "alibi", True, "ALiBi position biases are not reproduced; use a rotary Falcon")
    if c.new_decoder_architecture:
        if not c.parallel_attn:  # FalconDecoderLayer then reads norms it never built
            raise _refuse("falcon", "parallel_attn", False, "new_decoder_architecture needs parallel_attn=True")
        return "grouped"
    if c.num_ln_in_parallel_attn == 2:  # built ln_attn/ln_mlp, then reads input_layernorm
        raise _refuse("falcon", "num_ln_in_parallel_attn", 2, "it needs new_decoder_architecture=True")
    if c.multi_query:
        return "multi_query"
    if c.num_kv_heads != c.num_attention_heads:
        raise _refuse("falcon", "num_kv_heads", c.num_kv_heads,
                      "without multi_query or new_decoder_architecture it must equal num_attention_heads")
    return "per_head"


def _falcon_qkv(w: torch.Tensor, b: torch.Tensor | None, layout: str, H: int, Hkv: int, E: int) -> list:
    """[(weight [n E, D], bias or None)] for q, k, v from ``query_key_value`` (FalconAttention._split_heads)."""
    D = w.shape[-1]
    if layout == "grouped":  # view [Hkv, H / Hkv + 2, E]: each group's queries, then its key and value
        g = H // Hkv
        wv, bv = w.reshape(Hkv, g + 2, E, D), None if b is None else b.reshape(Hkv, g + 2, E)
        parts = (slice(0, g), slice(g, g + 1), slice(g + 1, g + 2))
    elif layout == "multi_query":  # view [H + 2, E]: H queries, one key, one value
        wv, bv = w.reshape(1, H + 2, E, D), None if b is None else b.reshape(1, H + 2, E)
        parts = (slice(0, H), slice(H, H + 1), slice(H + 1, H + 2))
    else:  # view [H, 3, E]: per head q, k, v (as GPT-NeoX)
        wv, bv = w.reshape(H, 3, E, D), None if b is None else b.reshape(H, 3, E)
        parts = (slice(0, 1), slice(1, 2), slice(2, 3))
    return [(wv[:, s].reshape(-1, D), None if bv is None else bv[:, s].reshape(-1)) for s in parts]


def _falcon(hf) -> tuple[ModelConfig, dict]:
    c = hf.config
    D, H = c.hidden_size, c.num_attention_heads
    E = D // H
    _check(c)
    _full_rotary(c)
    layout = _falcon_layout(c)
    Hkv = {"grouped": c.num_kv_heads, "multi_query": 1, "per_head": H}[layout]
    parallel = bool(c.parallel_attn or c.new_decoder_architecture)
    cfg = _config(c, D=D, H=H, Hkv=Hkv, E=E, rot=E, d_mlp=c.ffn_hidden_size, eps=c.layer_norm_epsilon,
                  act=c.activation, parallel=parallel, mlp="standard", rope=rope_fields(c))
    t, sd = hf.transformer, {}
    for i, b in enumerate(t.h):
        a, p = b.self_attention, f"blocks.{i}."
        qkv = _falcon_qkv(a.query_key_value.weight, a.query_key_value.bias, layout, H, Hkv, E)
        _attention(sd, p, cfg, *qkv, a.dense)
        if hasattr(b, "ln_attn"):  # two norms in parallel (new_decoder_architecture)
            _norms(sd, p, cfg, b.ln_attn, b.ln_mlp)
        else:
            _norms(sd, p, cfg, b.input_layernorm, b.input_layernorm if parallel else b.post_attention_layernorm)
        _standard_mlp(sd, p, b.mlp.dense_h_to_4h, b.mlp.dense_4h_to_h)
    return cfg, _ends(hf, cfg, t.word_embeddings, t.ln_f, sd)


CONVERTERS = {"phi": _phi, "gptj": _gptj, "cohere": _cohere, "stablelm": _stablelm, "falcon": _falcon}
