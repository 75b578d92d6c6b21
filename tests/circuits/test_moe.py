"""Mixture-of-experts families (circuitstat.circuits.engine.moe): the routing is HF's, clean and corrupted prompts
route differently (so exact patching through the router is not vacuous), and an edge into a sparse MLP node
scores what HF gives when only that MLP's input gains the sender's write -- with the router re-run on the
patched input, which changes the experts some tokens use. The generic parity tests (logits, gradients and
node EAP against HF autograd, exact against brute force) run on these fixtures in test_families.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from families import VOCAB, batch, hf_model, hooked_last_logits

from circuitstat.circuits.attribution import attribute
from circuitstat.circuits.convert import from_hf
from circuitstat.circuits.engine.moe import is_sparse, route
from circuitstat.circuits.engine.norms import mlp_input_norm
from circuitstat.circuits.tasks import make_task

MOE = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss"]


def _router(block):
    """The router module of an HF sparse block (GPT-OSS: ``router``, the others: ``gate``), or None (dense MLP)."""
    if not hasattr(block, "experts"):
        return None
    return getattr(block, "router", None) or getattr(block, "gate", None)


def _task(n: int = 3):
    return make_task("induction", vocab_size=VOCAB, n=n, seed=0, seq_len=4)


def _hf_routes(hf, ids, mask) -> dict[int, torch.Tensor]:
    """Per sparse layer, the experts HF's router selects [B, P, k] (sorted), from a hook on the router."""
    got, handles = {}, []
    for i, layer in enumerate(hf.model.layers):
        gate = _router(layer.mlp)
        if gate is None:
            continue

        def hook(module, args, output, i=i):
            got[i] = output[2].reshape(*ids.shape, -1).sort(-1).values
        handles.append(gate.register_forward_hook(hook))
    try:
        with torch.no_grad():
            hf(ids, attention_mask=mask)
    finally:
        for h in handles:
            h.remove()
    return got


def _our_routes(m, ids, mask) -> dict[int, torch.Tensor]:
    with torch.no_grad():
        out = m.run(ids, mask, keep_resid=True)
        routes = {}
        for layer in range(m.cfg.n_layers):
            if is_sparse(m.cfg, layer):
                h = mlp_input_norm(m.cfg, m.blocks[layer], out.resid_mid[layer])
                idx, _ = route(m.cfg, m.blocks[layer], h.reshape(-1, m.cfg.d_model))
                routes[layer] = idx.reshape(*ids.shape, -1).sort(-1).values
    return routes


@pytest.mark.parametrize("family", MOE)
def test_routing_is_hfs_and_differs_between_clean_and_corrupted(family):
    hf = hf_model(family, seed=2)
    m = from_hf(hf)
    task = _task()
    mask = task.attention_mask.bool()
    clean, corrupted = _hf_routes(hf, task.clean, task.attention_mask), _hf_routes(hf, task.corrupted, mask.long())
    ours = _our_routes(m, task.clean, task.attention_mask)
    assert sorted(ours) == sorted(clean) == [i for i in range(m.cfg.n_layers) if is_sparse(m.cfg, i)]
    assert m.cfg.moe["top_k"] >= 2 and m.cfg.moe["experts"] >= 4
    for layer in clean:
        assert torch.equal(ours[layer][mask], clean[layer][mask]), (family, layer)
    moved = sum(int((clean[i] != corrupted[i]).any(-1)[mask].sum()) for i in clean)
    assert moved >= 1, family  # at least one token's selected experts differ between the clean and corrupted runs


def _hf_edge_into_mlp(hf, task, sender: str, layer: int, frozen: bool = False) -> tuple[np.ndarray, int]:
    """(effect of the edge ``sender`` (input or a0.h*) -> m{layer} built in HF alone, tokens whose experts the patch changed): the
    MLP's input (its post_attention_layernorm's input) gains the sender's write difference, nothing else.
    ``frozen``: the router's output (selection and weights) is kept from the clean run instead of re-run."""
    base, cfg = hf.model, hf.config
    E = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    ar = torch.arange(task.clean.shape[0])
    grabbed = {}

    def run(ids, hooks):
        return hooked_last_logits(hf, task, ids, hooks)

    def grab(key, kind):
        def hook(module, args, *rest):
            grabbed[key] = (args[0] if kind == "in" else rest[-1]).detach()
        return hook

    src = base.layers[0]
    if sender.startswith("a0.h"):  # a head of layer 0: its slice of o_proj's input
        mod, kind = src.self_attn.o_proj, "in"
    else:  # the input sender: the token embeddings
        mod, kind = base.embed_tokens, "out"
    pre = kind == "in"
    run(task.corrupted, [(mod, grab("cf", kind), pre)])
    clean = run(task.clean, [(mod, grab("clean", kind), pre)])
    if kind == "in":
        h = int(sender[4:])
        mixed = grabbed["clean"].clone()
        mixed[..., h * E:(h + 1) * E] = grabbed["cf"][..., h * E:(h + 1) * E]
        with torch.no_grad():
            dw = src.self_attn.o_proj(mixed) - src.self_attn.o_proj(grabbed["clean"])
    else:
        dw = grabbed["cf"] - grabbed["clean"]

    def add(module, args, kwargs):
        if args:
            return (args[0] + dw, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + dw}

    target = base.layers[layer]
    routes = {}
    gate_hook = (_router(target.mlp), lambda mod, a, out: routes.__setitem__("r", out[2].reshape(*task.clean.shape, -1)
                                                                          .sort(-1).values), False)
    kept = {}
    keep_hook = (_router(target.mlp), lambda mod, a, out: kept.setdefault("out", out), False)
    run(task.clean, [gate_hook, keep_hook])
    before = routes["r"]
    hooks = [(target.post_attention_layernorm, add, True), gate_hook]
    if frozen:  # the clean run's router output replaces the patched one
        hooks.append((_router(target.mlp), lambda mod, a, out: kept["out"], False))
    patched = run(task.clean, hooks)
    changed = int((routes["r"] != before).any(-1)[task.attention_mask.bool()].sum())
    effect = task.score(patched, indices=ar, clean_logits=clean) - task.score(clean, indices=ar, clean_logits=clean)
    return effect.numpy(), changed


@pytest.mark.parametrize("family", MOE)
def test_exact_edge_into_a_sparse_mlp_goes_through_the_router_as_in_hf(family):
    """Edges input -> m0 and a0.h* -> m0 (m0 an MoE block) against HF patched by hand; the patches change some
    tokens' selected experts, so the agreement covers re-routing (its effect reaches the read-out through layer 1)."""
    hf = hf_model(family, seed=2)
    m = from_hf(hf)
    assert is_sparse(m.cfg, 0)
    task = _task()
    scores = attribute(m, task, "exact", progress=False).scores
    g, rerouted, seen = m.graph, 0, 0.0
    for sender in ["input"] + [f"a0.h{h}" for h in range(m.cfg.n_heads)]:
        ref, changed = _hf_edge_into_mlp(hf, task, sender, 0)
        got = scores[:, g.edge_index(f"{sender}->m0")]
        assert np.abs(got - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max()), (family, sender, got, ref)
        rerouted += changed
        seen = max(seen, np.abs(ref).max())
    assert rerouted >= 1, family
    assert seen > 1e-2, family
    # the router matters to these effects: with HF's routing frozen at the clean run's, some edge's effect moves
    # by far more than the tolerance above, so an engine that did not re-route would fail this test
    moved = max(np.abs(_hf_edge_into_mlp(hf, task, s, 0, frozen=True)[0] - _hf_edge_into_mlp(hf, task, s, 0)[0]).max()
                for s in ["input"] + [f"a0.h{h}" for h in range(m.cfg.n_heads)])
    assert moved > 100 * 1e-5 * max(1.0, seen), (family, moved)


@pytest.mark.parametrize("family", MOE)
def test_training_only_router_fields_are_irrelevant_in_eval(family):
    """router_aux_loss_coef, output_router_logits and router_jitter_noise change training only: read as
    irrelevant (not refused), and the eval-mode logits still equal HF's."""
    hf = hf_model(family, seed=5, router_aux_loss_coef=0.5, output_router_logits=True, router_jitter_noise=0.3)
    m = from_hf(hf)
    ids, mask = batch()
    with torch.no_grad():
        diff = (hf(ids, attention_mask=mask).logits - m(ids, mask)).abs()[mask.bool()].max()
    assert diff <= 1e-5, family


def test_gpt_oss_sinks_and_clamp_change_the_model_and_are_reproduced():
    """GPT-OSS's attention sinks and the SwiGLU clamp are in their active range in the fixture: without them
    (sinks at -1e4, a clamp above every activation) HF gives other logits, and circuitstat follows both."""
    hf = hf_model("gpt_oss", seed=3)
    no_sinks = hf_model("gpt_oss", seed=3)
    no_clamp = hf_model("gpt_oss", seed=3, swiglu_limit=1e4)
    no_clamp.load_state_dict(hf.state_dict())
    with torch.no_grad():
        for layer in no_sinks.model.layers:
            layer.self_attn.sinks.fill_(-1e4)
    ids, mask = batch()
    real = mask.bool()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).logits
        for other in (no_sinks, no_clamp):
            theirs = other(ids, attention_mask=mask).logits
            assert (theirs - ref)[real].abs().max() > 0.1
            tol = 1e-5 * max(1.0, float(theirs[real].abs().max()))  # float32 rounding of logits of size ~5
            assert (from_hf(other)(ids, mask) - theirs)[real].abs().max() <= tol
        assert (from_hf(hf)(ids, mask) - ref)[real].abs().max() <= 1e-5 * max(1.0, float(ref[real].abs().max()))


def test_moe_models_save_and_load_in_the_own_format_bit_identically(tmp_path):
    """The MoE block and GPT-OSS's sinks survive circuitstat's own format (config.json + safetensors)."""
    from circuitstat.circuits import load_model

    m = from_hf(hf_model("gpt_oss", seed=1))
    m.save(tmp_path / "m")
    back = load_model(tmp_path / "m")
    assert back.cfg.moe == m.cfg.moe and back.cfg.attn_sinks
    ids, mask = batch()
    with torch.no_grad():
        assert torch.equal(back(ids, mask), m(ids, mask))


def test_a_malformed_moe_config_is_refused_naming_the_key():
    from dataclasses import asdict

    from circuitstat.circuits.engine.config import ModelConfig
    from circuitstat.core.errors import InputError

    good = asdict(from_hf(hf_model("mixtral")).cfg)
    for change, words in (({"top_k": 5}, "moe.top_k=5 exceeds moe.experts=4"), ({"routing": "sinkhorn"}, "moe.routing"),
                          ({"sparse_layers": [2]}, "moe.sparse_layers"), ({"experts": 0}, "moe.experts")):
        with pytest.raises(InputError, match=words.replace(".", r"\.")):
            ModelConfig.from_dict({**good, "moe": {**good["moe"], **change}})
    missing = {k: v for k, v in good["moe"].items() if k != "d_shared"}
    with pytest.raises(InputError, match="missing \\['d_shared'\\]"):
        ModelConfig.from_dict({**good, "moe": missing})
